"""What the page tests share: the browser's flags and finder, the page's token, a hostile string."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.helpers import wait_for
from tests.support.serve import free_port

__all__ = ["CHROMIUM_ARGS", "EVIL", "PAGE_TOKEN", "WAITING", "chromium_or_skip", "free_port", "serving"]


EVIL = "<script>alert(1)</script>"


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


WAITING = 25


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None:
        reason = (
            "SKIPPED LOUDLY: the status page test needs Debian's `chromium` and Playwright for Python "
            "(`apt-get install -y --no-install-recommends chromium`; `python3 ops/dev.py test` installs it)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason.replace("SKIPPED LOUDLY", "CI=true"))
        pytest.skip(reason)
    return chromium


PAGE_TOKEN = "page-actions-token-0123456789abcdefXYZ"


@contextmanager
def serving(runtime: Any) -> Iterator[str]:
    """`/status`, `/metrics` and the page for `runtime`, served by uvicorn on 127.0.0.1."""
    import uvicorn
    from starlette.applications import Starlette

    from dispatchq.serve import metrics, page, status

    def get_runtime() -> Any:
        return runtime

    app = Starlette(
        routes=[*status.routes(get_runtime), *metrics.routes(get_runtime), *page.routes(get_runtime)]
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
