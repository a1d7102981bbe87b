"""A user project with its own `jobs` package, and a loopback URL that records every call,
for the entry-point tests."""

from __future__ import annotations

import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.helpers import write_config

__all__ = ["HookCatcher", "user_project"]


class HookCatcher:
    """A loopback HTTP server that answers 200 and keeps `(method, path)` of every request:
    a webhook URL a refused job carries, so a test can see that nothing called it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                seen.append((self.command, self.path))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="hook-catcher", daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> HookCatcher:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def user_project(root: Path, mark: Path) -> None:
    """A project with its own `jobs/` package beside its config: checks in `jobs.mychecks`,
    and a `jobs/tiers.py` that marks and raises when imported."""
    package = root / "jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tiers.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('imported')\n"
        'raise RuntimeError("the user\'s own jobs.tiers was imported")\n'
    )
    (package / "mychecks.py").write_text(
        textwrap.dedent(
            """
            def is_lockfile(judgement):
                files = (judgement.state or {}).get("conflicts", [])
                if files and all(f.endswith(".lock") for f in files):
                    return {"value": "user-says-rebuild", "reason": "the user's own check"}
                return None
            """
        )
    )
    write_config(
        root / "dispatchq.yaml",
        """
        kinds:
          lock:
            check: jobs.mychecks:is_lockfile
            escalate: needs-triage
        """,
    )
