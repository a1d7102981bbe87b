"""A loopback fake of the slice of GitHub's REST API the GitHub executor uses.

A real `http.server` on 127.0.0.1 in a thread, so the executor's real HTTP client,
headers and error handling are exercised. It keeps issues in memory, records every
request it saw (tests count writes), and can be told to fail the next matching
request or to answer it as a rate limit (`Retry-After`). Lists are paged with GitHub's
`Link: rel="next"` header. Error responses echo the Authorization header on purpose, so a test can
prove the executor redacts the token from whatever a server says.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Issue:
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    assignees: list[str] = field(default_factory=list)
    comments: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    body: Any
    authorization: str | None

    @property
    def is_write(self) -> bool:
        return self.method != "GET"


_ISSUE = re.compile(r"^/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/issues/(?P<number>\d+)(?P<rest>/.*)?$")
_COMMENT = re.compile(r"^/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/issues/comments/(?P<id>\d+)$")


class FakeGitHub:
    def __init__(self, token: str = "ghp_fake-token-0123456789") -> None:
        self.token = token
        self.issues: dict[str, Issue] = {}
        self.seen: list[Seen] = []
        self._failures: list[tuple[str, str, int]] = []
        self._limits: list[tuple[str, str, int, dict[str, str], str]] = []
        self._reply_headers: dict[int, dict[str, str]] = {}
        self._next_comment_id = 1000
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                status, payload = fake._dispatch(
                    self.command, self.path, body, self.headers.get("Authorization")
                )
                extra = fake._reply_headers.pop(threading.get_ident(), {})
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeGitHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- test controls ----------------------------------------------------------------------
    def issue(self, target: str, **state: Any) -> Issue:
        """The issue for `owner/repo#n`, created (with `state`) if it does not exist."""
        with self._lock:
            issue = self.issues.setdefault(target, Issue())
            for key, value in state.items():
                setattr(issue, key, value)
            return issue

    def fail_next(self, method: str, path_suffix: str, status: int = 500) -> None:
        with self._lock:
            self._failures.append((method, path_suffix, status))

    def rate_limit_next(
        self, method: str, path_suffix: str, *, retry_after: int = 1, status: int = 403, primary: bool = False
    ) -> None:
        """Answer the next matching request as GitHub's secondary (or primary) rate limit does."""
        if primary:
            headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + retry_after)}
            message = "API rate limit exceeded"
        else:
            headers = {"Retry-After": str(retry_after)}
            message = (
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
            )
        with self._lock:
            self._limits.append((method, path_suffix, status, headers, message))

    @property
    def writes(self) -> list[Seen]:
        return [s for s in self.seen if s.is_write]

    # -- the API ----------------------------------------------------------------------------
    def _dispatch(self, method: str, raw_path: str, body: Any, auth: str | None) -> tuple[int, Any]:
        split = urlsplit(raw_path)
        path, query = split.path, parse_qs(split.query)
        with self._lock:
            self.seen.append(Seen(method, path, body, auth))
            if auth not in (f"Bearer {self.token}", f"token {self.token}"):
                return 401, {"message": f"Bad credentials: {auth}"}
            for i, (m, suffix, status, headers, message) in enumerate(self._limits):
                if m == method and path.endswith(suffix):
                    del self._limits[i]
                    self._reply_headers[threading.get_ident()] = headers
                    return status, {"message": message}
            for i, (m, suffix, status) in enumerate(self._failures):
                if m == method and path.endswith(suffix):
                    del self._failures[i]
                    return status, {"message": f"injected failure for {auth}"}
            match = _COMMENT.match(path)
            if match and method == "PATCH":
                for issue in self.issues.values():
                    for comment in issue.comments:
                        if comment["id"] == int(match["id"]):
                            comment["body"] = body["body"]
                            return 200, dict(comment)
                return 404, {"message": "Not Found"}
            match = _ISSUE.match(path)
            if not match:
                return 404, {"message": "Not Found"}
            target = f"{match['owner']}/{match['repo']}#{match['number']}"
            issue = self.issues.get(target)
            if issue is None:
                return 404, {"message": "Not Found"}
            return self._issue_call(issue, method, match["rest"] or "", body, query, path)

    def _page(self, items: list[Any], query: dict[str, list[str]], path: str) -> list[Any]:
        """One page of a list, with GitHub's `Link: <...>; rel="next"` header when more follow."""
        per_page = int(query.get("per_page", ["30"])[0])
        page = int(query.get("page", ["1"])[0])
        start = (page - 1) * per_page
        if start + per_page < len(items):
            link = f'<{self.url}{path}?per_page={per_page}&page={page + 1}>; rel="next"'
            self._reply_headers[threading.get_ident()] = {"Link": link}
        return items[start : start + per_page]

    def _issue_call(
        self, issue: Issue, method: str, rest: str, body: Any, query: dict[str, list[str]], path: str
    ) -> tuple[int, Any]:
        if rest == "" and method == "GET":
            return 200, {
                "state": issue.state,
                "assignees": [{"login": a} for a in issue.assignees],
                "labels": [{"name": n} for n in issue.labels],
            }
        if rest == "" and method == "PATCH":
            issue.state = body.get("state", issue.state)
            return 200, {"state": issue.state}
        if rest == "/labels" and method == "GET":
            return 200, self._page([{"name": n} for n in issue.labels], query, path)
        if rest == "/labels" and method == "POST":
            for name in body["labels"]:
                if name not in issue.labels:
                    issue.labels.append(name)
            return 200, [{"name": n} for n in issue.labels]
        if rest.startswith("/labels/") and method == "DELETE":
            name = unquote(rest[len("/labels/") :])
            if name not in issue.labels:
                return 404, {"message": "Label does not exist"}
            issue.labels.remove(name)
            return 200, [{"name": n} for n in issue.labels]
        if rest == "/comments" and method == "GET":
            return 200, self._page([dict(c) for c in issue.comments], query, path)
        if rest == "/comments" and method == "POST":
            self._next_comment_id += 1
            comment = {"id": self._next_comment_id, "body": body["body"]}
            issue.comments.append(comment)
            return 201, dict(comment)
        if rest == "/assignees" and method == "POST":
            for login in body["assignees"]:
                if login not in issue.assignees:
                    issue.assignees.append(login)
            return 201, {"assignees": [{"login": a} for a in issue.assignees]}
        return 404, {"message": "Not Found"}
