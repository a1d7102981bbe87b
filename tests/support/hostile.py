"""What the hostile-input tests of `dispatchq serve` share: one table of bodies no route may
answer with a 500, every route the application has (read from its router, so a route added
later is fed the table too), and how a request to each is made (its media type, the
signature a webhook needs, a logged-in client's token).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.testclient import TestClient

from dispatchq.serve.page import SECURITY_HEADERS
from tests.support.serve import SECRET, sign

__all__ = [
    "BOOM",
    "HOSTILE",
    "HOSTILE_TOKEN",
    "PARAMS",
    "Call",
    "InProcess",
    "boom",
    "calls",
    "missing_security_headers",
    "nested",
]

HOSTILE_TOKEN = "hostile-input-token-0123456789abcdefXYZ"


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


_DIGITS = b"7" * 5000

#: Every body each route is fed: deep nesting (past Python's recursion and orjson's limit,
#: and the issue's 950), numbers Python's parser refuses or cannot represent, durations and
#: dates past what datetime holds, bytes that are not UTF-8, NUL raw and escaped, lone
#: surrogates, every field of every route with the wrong type, nothing, and top levels
#: that are not an object.
HOSTILE: dict[str, bytes] = {
    "deep-6000": nested(6000),
    "deep-950-object": b'{"zen": ' + nested(950) + b', "hook_id": ' + nested(950) + b"}",
    "deep-200-field": b'{"until": ' + nested(200, b'"1h"') + b', "kind": "echo", "target": "a/b#1"}',
    "deep-unclosed": b"[" * 6000,
    "digits-5000": (
        b'{"until": ' + _DIGITS + b', "host": ' + _DIGITS + b', "kind": "echo", "target": "a/b#1", '
        b'"state": {"n": ' + _DIGITS + b'}, "zen": ' + _DIGITS + b"}"
    ),
    "digits-5000-string": b'{"until": "' + _DIGITS + b'd", "host": "' + _DIGITS + b'"}',
    "float-overflow": b'{"until": 1e400, "state": {"n": -1e99999}, "kind": "echo", "target": "a/b#1"}',
    "nan": b'{"until": NaN, "state": {"n": Infinity}, "kind": "echo", "target": "a/b#1"}',
    "duration-huge": b'{"until": "99999999d", "reason": "x", "force": true}',
    "duration-parts": b'{"until": "999999999d999999999h999999999m999999999s"}',
    "date-far": b'{"until": "9999-12-31T23:59:59-05:00"}',
    "date-early": b'{"until": "0001-01-01T00:00:00+01:00"}',
    "invalid-utf8": b'{"until": "\xff\xfe", "host": "\xc3\x28", "kind": "\xed\xa0\x80", "target": "a"}',
    "nul-raw": b'{"until": "1h\x00", "host": "a\x00b", "kind": "echo", "target": "a/b#1\x00"}',
    "nul-escaped": b'{"until": "1h\\u0000", "host": "a\\u0000b", "reason": "\\u0000", '
    b'"kind": "echo\\u0000", "target": "a/b#1\\u0000"}',
    "lone-surrogate": b'[{"kind": "echo", "target": "a/b#\\ud800", "\\udc00": 1, "reason": "\\ud800"}]',
    "wrong-types": json.dumps(
        {
            "until": 5,
            "reason": ["x"],
            "force": "yes",
            "host": {"a": 1},
            "kind": 5,
            "target": [],
            "state": "x",
            "priority": {},
            "zen": {"a": [1]},
            "hook_id": [1],
            "action": 7,
            "issue": 7,
            "repository": "x",
        }
    ).encode(),
    "empty": b"",
    "whitespace": b" \n\t ",
    "top-array": b"[1, 2, 3]",
    "top-string": b'"until"',
    "top-number": _DIGITS,
    "top-null": b"null",
    "json-lines-junk": b'{"kind": "echo", "target": "a/b#1"}\n' + nested(5000) + b"\n\xff\n" + _DIGITS,
    "unknown-kinds": b"\n".join(
        json.dumps({"kind": f"nope{n}", "target": f"a/b#{n}"}).encode() for n in range(300)
    ),
}

#: The values each path parameter is given: a plausible id, NUL, digits, bytes not UTF-8.
PARAMS: dict[str, tuple[str, ...]] = {
    "jid": ("abcdefgh12", "%00%00%00%00%00%00%00%00", "7" * 300, "%FF%FE" * 5)
}


@dataclass(frozen=True)
class Call:
    """One request the table makes: method, path, headers (the body is the table's)."""

    method: str
    path: str
    headers: Mapping[str, str]

    def signed(self, body: bytes) -> Mapping[str, str]:
        """The headers with this body's signature, when the route is the webhook's."""
        if self.path != "/webhooks/github":
            return self.headers
        return {**self.headers, "X-Hub-Signature-256": sign(body, SECRET)}


def _headers(path: str, event: str = "issues") -> dict[str, str]:
    headers = {"Authorization": f"Bearer {HOSTILE_TOKEN}", "Content-Type": "application/json"}
    if path == "/login":
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if path == "/webhooks/github":
        headers.update({"X-GitHub-Event": event, "X-GitHub-Delivery": f"d-hostile-{event}"})
    return headers


def _paths(template: str) -> Iterator[str]:
    if "{" not in template:
        yield template
        return
    name = template.split("{", 1)[1].split("}", 1)[0].split(":")[0]
    for value in PARAMS[name]:
        yield from _paths(template.replace(f"{{{name}}}", value, 1))


def calls(routes: list[BaseRoute]) -> list[Call]:
    """Every (method, path) of the application's routes; a webhook once as each event kind
    the mapping treats apart (a ping is answered from the payload itself)."""
    found: list[Call] = []
    for route in routes:
        if isinstance(route, Mount):
            found += [
                Call("GET", f"{route.path}/{name}", _headers(route.path)) for name in ("x", "%00", "%FF")
            ]
            continue
        assert isinstance(route, Route), route
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            for path in _paths(route.path):
                events = ("ping", "issues", "push", "check_run") if path == "/webhooks/github" else ("",)
                found += [Call(method, path, _headers(path, event)) for event in events]
    return found


def missing_security_headers(headers: Mapping[str, Any]) -> list[str]:
    """The security headers an answer lacks (a route may set its own value; it must set one)."""
    lowered = {str(name).lower() for name in headers}
    return [name for name in SECURITY_HEADERS if name.lower() not in lowered]


#: A route only the in-process application has: it raises, as a bug would.
BOOM = "/hostile-boom"


async def boom(request: Request) -> Response:
    raise RuntimeError("a bug: an exception no layer expects")


@dataclass
class InProcess:
    """The application in a TestClient (one event loop for every request), and its own routes."""

    client: TestClient
    routes: list[BaseRoute]
