"""What the page tests share: the browser's flags and finder, the page's token, a hostile string."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.serve import free_port

__all__ = ["CHROMIUM_ARGS", "EVIL", "PAGE_TOKEN", "WAITING", "chromium_or_skip", "free_port"]


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
