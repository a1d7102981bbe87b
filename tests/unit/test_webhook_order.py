"""`POST /webhooks/github` checks the signature before it reads the body as JSON.

An unsigned body must never reach a parser (a deep nest, bad UTF-8, half a document): it is
refused 401 as unsigned, before anything of the route's context is touched, whatever the
body holds. The route's answer is a pure function of headers and body up to that point.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatchq.serve.webhooks import answer_delivery
from tests.support.serve import SECRET, sign

BODIES = {
    "not-json": b'{"action": "opened", "issue": ',
    "not-utf8": b'{"action": "\xff\xfe"}',
    "nested-950-object": b'{"a":' * 950 + b"{}" + b"}" * 950,
    "nested-950-array": b"[" * 950 + b"]" * 950,
    "a-valid-object": b'{"action": "opened"}',
}


class Untouchable:
    """The route's context and batcher: reading anything of them means the body got past the check."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the route read {name!r} of its context before the signature was checked")


def _answer(body: bytes, signature: str | None) -> tuple[int, dict[str, Any]]:
    headers = {
        "x-github-event": "issues",
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "content-type": "application/json",
    }
    if signature is not None:
        headers["x-hub-signature-256"] = signature
    return asyncio.run(answer_delivery(Untouchable(), Untouchable(), SECRET, headers, body))  # type: ignore[arg-type]


@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
@pytest.mark.parametrize("signed", ["another-secret", "missing", "zeros"])
def test_an_unsigned_body_is_401_whatever_it_holds(body: bytes, signed: str) -> None:
    signature = {
        "another-secret": sign(body, "not-the-secret"),
        "missing": None,
        "zeros": "sha256=" + "0" * 64,
    }[signed]
    status, answer = _answer(body, signature)
    assert status == 401
    assert "X-Hub-Signature-256" in answer["error"]


def test_the_same_bodies_signed_get_past_the_check() -> None:
    """The bodies above are refused for their signature alone: signed, each is read (and refused
    for what it is, or answered), never 401."""
    for name, body in BODIES.items():
        if name == "a-valid-object" or name == "nested-950-object":
            continue  # a JSON object goes on to be mapped with the context: not this layer's
        status, _ = _answer(body, sign(body))
        assert 400 <= status < 500 and status != 401, (name, status)
