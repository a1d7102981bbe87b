"""Helpers for the login and throttle tests: `create_app` served in-process, one kept-alive client.

Each app is what `dispatchq serve` runs (`dispatchq.serve.app.create_app`) over its own
runtime, served by uvicorn on a thread of the test process, so two of them over one Redis are
two servers of the same store, as two processes behind a load balancer would be.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.helpers import counting_check, wait_for
from tests.support.serve import CONFIG, Reply, free_port

__all__ = ["LOGINS_TOKEN", "Client", "app_serving", "cookie_of", "login_body", "write_logins_config"]

LOGINS_TOKEN = "logins-token-0123456789abcdefABCDEF"


def write_logins_config(directory: Path) -> None:
    """The serve tests' config (a kind with a check, a triage section) at `dispatchq.yaml`."""
    check, _ = counting_check(directory, answer="'ok'")
    (directory / "dispatchq.yaml").write_text(CONFIG.format(check=check))


@contextmanager
def app_serving(runtime: Any) -> Iterator[int]:
    """`create_app(runtime)` served by uvicorn on 127.0.0.1; yields its port."""
    import uvicorn

    from dispatchq.serve.app import create_app

    port = free_port()
    app = create_app(runtime)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)

    async def run() -> None:
        try:
            await server.serve()
        finally:  # the app's clients live on this loop: closed here, not by the collector
            await app.state.context.aclose()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    wait_for(lambda: server.started, what="uvicorn to start")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class Client:
    """One kept-alive HTTP connection (a thousand requests without a thousand handshakes)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Reply:
        self._conn.request(method, path, body=body, headers=dict(headers or {}))
        response = self._conn.getresponse()
        headers: dict[str, str] = {}
        for name, value in response.getheaders():  # each Set-Cookie kept, one a line
            name = name.lower()
            headers[name] = f"{headers[name]}\n{value}" if name == "set-cookie" and name in headers else value
        reply = Reply(response.status, headers, response.read())
        if response.will_close:
            self._conn.close()
        return reply


def login_body(token: str) -> bytes:
    return urllib.parse.urlencode({"token": token}).encode()


def cookie_of(reply: Reply, name: str) -> tuple[str, list[str]]:
    """The value a Set-Cookie of `reply` gives `name`, and that cookie's attributes (lower-cased)."""
    for line in reply.headers.get("set-cookie", "").splitlines():
        cookie, _, value = line.split(";", 1)[0].partition("=")
        if cookie.strip() == name:
            return value, [part.strip().lower() for part in line.split(";")[1:]]
    raise AssertionError(f"no Set-Cookie for {name}: {reply.headers.get('set-cookie')}")
