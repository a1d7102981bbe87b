"""A loopback HTTP handler that echoes the path and `Connection` header, for the sandbox tests."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

__all__ = ["Echo"]


class Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "connection": self.headers.get("Connection")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return
