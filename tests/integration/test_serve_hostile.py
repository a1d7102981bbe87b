"""No input gets a 500 from `dispatchq serve`, and every answer carries the security headers.

Every route the application has (read from its router) is fed one table of hostile bodies
(`tests.support.hostile.HOSTILE`: deep nesting, 5,000-digit numbers, durations and dates
past what datetime holds, bytes that are not UTF-8, NUL, lone surrogates, wrong types,
nothing, top levels that are not objects) as a logged-in client, webhooks signed with the
configured secret. Each answer is below 500, has the security headers, and costs at most one
log line and no traceback. In-process first (every route, one request at a time, the log
records per request), then against a real `dispatchq serve`, where uvicorn, h11 and the
bounds answer too: their 400, 408, 413 and 503 carry the headers, and the access log names
the status that went out.
"""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage import keys
from tests.support.helpers import wait_for
from tests.support.hostile import (
    BOOM,
    HOSTILE,
    HOSTILE_TOKEN,
    InProcess,
    calls,
    missing_security_headers,
    nested,
)
from tests.support.serve import Server, deliver, request
from tests.support.slots import in_flight

#: The loggers a request may write to (the serve's own, uvicorn's, Starlette's).
_SERVE_LOGGERS = ("dispatchq", "uvicorn", "starlette")


def _serve_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith(_SERVE_LOGGERS)]


def test_every_route_answers_every_hostile_body_below_500_with_the_headers_and_one_log_line(
    hostile_app: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    table = calls(hostile_app.routes)
    assert {call.path for call in table} >= {
        "/judgements",
        "/webhooks/github",
        "/actions/window/close",
        "/login",
    }
    wrong: list[str] = []
    for call in table:
        for name, body in HOSTILE.items():
            caplog.clear()
            reply = hostile_app.client.request(
                call.method, call.path, content=body, headers=call.signed(body)
            )
            records = _serve_records(caplog)
            said = f"{call.method} {call.path[:40]} {call.headers.get('X-GitHub-Event', '')} [{name}]"
            if reply.status_code >= 500:
                wrong.append(f"{said}: {reply.status_code} {reply.text[:200]}")
            if missing := missing_security_headers(reply.headers):
                wrong.append(f"{said}: {reply.status_code} without {missing}")
            if len(records) > 1 or any(r.exc_info for r in records):
                wrong.append(f"{said}: {[r.getMessage()[:120] for r in records]}")
    assert wrong == [], "\n".join(wrong[:40])


def test_a_bad_or_missing_signature_is_401_before_the_body_is_read_as_json(hostile_app: InProcess) -> None:
    """Verified first: a hostile body with a wrong signature is refused for the signature, not
    for what a parser found in it (that would be parsing what nobody signed)."""
    hooks = [call for call in calls(hostile_app.routes) if call.path == "/webhooks/github"]
    assert len(hooks) == 4
    for name, body in HOSTILE.items():
        for signature in ("sha256=" + "0" * 64, None):
            headers = dict(hooks[0].headers)
            if signature is not None:
                headers["X-Hub-Signature-256"] = signature
            reply = hostile_app.client.post("/webhooks/github", content=body, headers=headers)
            # 429 once this client has sent a handful: refused for the signature all the same
            assert reply.status_code in (401, 429), (name, reply.text[:300])
            assert "signature" in reply.json()["error"].lower(), (name, reply.text[:300])


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/actions/window/close",
            b'{"until": "99999999d"}',
            "\"until\": '99999999d' is further than 366 days",
        ),
        ("/actions/window/close", b'{"until": "9999-12-31T23:59:59-05:00"}', "is not a duration"),
        ("/actions/window/close", b'{"until": ' + b"7" * 5000 + b"}", "integer of 5000 digits at until"),
        ("/actions/window/close", nested(6000), "the body nests more than 256 deep"),
        ("/actions/window/close", b'{"until": "1h", "reason": "a\\u0000b"}', '"reason" must be one line'),
        ("/actions/hosts/unblock", b'{"host": "build-07\\n"}', '"host" must be a host name'),
        ("/actions/window/open", b'{"x": "\xff"}', "not UTF-8 text (bad byte at offset 7)"),
    ],
)
def test_each_refusal_names_what_was_wrong(hostile_app: InProcess, path: str, body: bytes, said: str) -> None:
    reply = hostile_app.client.post(path, content=body, headers=_bearer())
    assert 400 <= reply.status_code < 500 and said in reply.json()["error"], reply.text


def test_a_6000_deep_judgement_and_a_5000_digit_state_fail_their_own_line(hostile_app: InProcess) -> None:
    good = json.dumps({"kind": "echo", "target": "acme/app#1"}).encode()
    huge = b'{"kind": "echo", "target": "acme/app#2", "state": {"n": ' + b"7" * 5000 + b"}}"
    lines = b"\n".join([good, nested(6000), huge])
    reply = hostile_app.client.post(
        "/judgements", content=lines, headers={**_bearer(), "Content-Type": "application/x-ndjson"}
    )
    assert reply.status_code == 207, reply.text
    answer = {entry["line"]: entry for entry in reply.json()}
    assert "id" in answer[1]
    assert "nests too deep to read" in answer[2]["error"]
    assert answer[3]["error"] == "the judgement holds an integer of 5000 digits at state.n"
    whole = hostile_app.client.post("/judgements", content=nested(6000), headers=_bearer())
    assert whole.status_code == 422 and "nests too deep" in whole.json()[0]["error"], whole.text


def test_every_refused_line_counts_toward_the_error_cap_unknown_kinds_included(
    hostile_app: InProcess, redis_client: Any
) -> None:
    """999 lines of unknown kinds: one 413 naming the cap, not 999 lists of every kind."""
    lines = b"\n".join(
        json.dumps({"kind": f"nope{n}", "target": f"acme/app#{n}"}).encode() for n in range(999)
    )
    good = json.dumps({"kind": "echo", "target": "acme/app#ok"}).encode()
    reply = hostile_app.client.post(
        "/judgements",
        content=good + b"\n" + lines,
        headers={**_bearer(), "Content-Type": "application/x-ndjson"},
    )
    assert reply.status_code == 413, reply.text[:300]
    assert "DISPATCHQ_SERVE_MAX_ERRORS (100)" in reply.json()["error"] and len(reply.content) < 1000
    assert redis_client.zcard(keys.ALL_IDS) == 0  # the good line did not go in either


def test_enqueue_lines_says_what_pythons_parser_refuses_instead_of_raising(
    hostile_app: InProcess, make_runtime: Any
) -> None:
    """The path `enqueue -` and `POST /judgements` share: a line that is not JSON and holds a
    5,000-digit number (Python's own limit) or nests 6,000 deep is that line's error."""
    from dispatchq.client import Client

    lines = [
        b'{"kind": "echo", "target": "acme/app#1", "state": {"n": ' + b"7" * 5000 + b"},}",
        nested(6000) + b"x",
        json.dumps({"kind": "echo", "target": "acme/app#2"}).encode(),
    ]
    results = Client(runtime=make_runtime()).enqueue_lines(lines)
    assert [r.ok for r in results] == [False, False, True]
    assert all("not readable JSON" in (r.error or "") for r in results[:2]), results


def test_an_exception_no_layer_expects_is_a_500_with_the_headers(
    hostile_app: InProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Starlette's own error page sits outside every middleware: the headers reach it too."""
    caplog.set_level(logging.INFO)
    reply = hostile_app.client.get(BOOM, headers=_bearer())
    assert reply.status_code == 500
    assert missing_security_headers(reply.headers) == []
    access = [r.getMessage() for r in caplog.records if r.name == "dispatchq.serve.access"]
    assert access == [f"access testclient GET {BOOM} 500"], access


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {HOSTILE_TOKEN}", "Content-Type": "application/json"}


# -- a real `dispatchq serve`: uvicorn, h11 and the bounds answer too -------------------------------


def _raw(port: int, data: bytes, *, timeout: float = 30) -> bytes:
    """Send `data`, read until the server closes (every answer here closes the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return got


def _head(answer: bytes) -> tuple[int, dict[str, str]]:
    lines = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    return status, {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}


def _log_lines(server: Server, since: int) -> list[str]:
    return server.log.read_text(errors="replace").splitlines()[since:]


def test_a_real_server_answers_the_table_below_500_with_the_headers_and_one_line_each(
    hostile_server: Server, hostile_app: InProcess
) -> None:
    start = len(_log_lines(hostile_server, 0))
    wrong: list[str] = []
    sent = 0
    for call in calls(hostile_app.routes):
        for name, body in HOSTILE.items():
            reply = request(hostile_server.port, call.method, call.path, body, call.signed(body))
            sent += 1
            if reply.status >= 500 or missing_security_headers(reply.headers):
                wrong.append(f"{call.method} {call.path[:40]} [{name}]: {reply.status} {reply.body[:200]!r}")
    assert wrong == [], "\n".join(wrong[:40])
    # One access line a request (the log is written after the answer: wait for the last ones).
    wait_for(
        lambda: sum(" access " in line for line in _log_lines(hostile_server, start)) >= sent,
        timeout=30,
        what="an access line for every request",
    )
    lines = _log_lines(hostile_server, start)
    assert len(lines) == sent, "\n".join(line for line in lines if " access " not in line)[:4000]


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("a request line that is not HTTP", b"GARBAGE\r\n\r\n"),
        ("NUL in a header", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: a\x00b\r\n\r\n"),
        (
            "a Content-Length that is not a number",
            b"POST /judgements HTTP/1.1\r\nHost: x\r\nContent-Length: 7z\r\n\r\n",
        ),
        ("a target that is not ASCII", b"GET /\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        ("headers past h11's buffer", b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"),
    ],
)
def test_what_h11_cannot_read_is_a_400_with_the_headers(
    hostile_server: Server, name: str, data: bytes
) -> None:
    status, headers = _head(_raw(hostile_server.port, data))
    assert status == 400, name
    assert missing_security_headers(headers) == [], (name, headers)


def test_the_bounds_answers_carry_the_headers_and_are_logged_as_sent(hostile_server: Server) -> None:
    start = len(_log_lines(hostile_server, 0))
    big = b"[" + b" " * (1024 * 1024 + 10) + b"]"  # over the module's 1 MB cap
    too_large = request(hostile_server.port, "POST", "/judgements", big, _bearer())
    assert too_large.status == 413 and missing_security_headers(too_large.headers) == []
    streamed = _raw(
        hostile_server.port,
        b"POST /judgements HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + HOSTILE_TOKEN.encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (700 * 1024, b" " * 700 * 1024) * 2,
    )
    assert _head(streamed)[0] == 413 and missing_security_headers(_head(streamed)[1]) == []
    slow_body = _raw(
        hostile_server.port,
        b"POST /judgements HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
        + HOSTILE_TOKEN.encode()
        + b"\r\nContent-Length: 100\r\n\r\n{",
    )
    assert _head(slow_body)[0] == 408 and missing_security_headers(_head(slow_body)[1]) == []
    slow_headers = _raw(hostile_server.port, b"GET /healthz HTTP/1.1\r\n")
    assert _head(slow_headers)[0] == 408 and missing_security_headers(_head(slow_headers)[1]) == []
    wait_for(
        lambda: sum(" access " in line for line in _log_lines(hostile_server, start)) >= 3,
        timeout=30,
        what="the access lines of the three refused bodies",
    )
    access = [
        line.split(" access ", 1)[1] for line in _log_lines(hostile_server, start) if " access " in line
    ]
    assert [entry.split()[-1] for entry in access] == ["413", "413", "408"], access
    assert "Traceback" not in hostile_server.output


def test_past_the_concurrency_limit_the_503_carries_the_headers(
    hostile_env: dict[str, str], tmp_path: Path
) -> None:
    # No token: a request held in its body must reach the route, not be refused by the auth.
    tight = {
        **{name: value for name, value in hostile_env.items() if name != "DISPATCHQ_API_TOKEN"},
        "DISPATCHQ_SERVE_CONCURRENCY": "8",
        "DISPATCHQ_SERVE_PEER_REQUESTS": "100",
        "DISPATCHQ_SERVE_HEADER_TIMEOUT": "60",
        "DISPATCHQ_SERVE_BODY_TIMEOUT": "60",
    }
    with Server(tight, tmp_path) as server:
        with in_flight("127.0.0.1", server.port, 7):  # the general share (one slot is kept)
            wait_for(lambda: request(server.port, "GET", "/status").status == 503, timeout=30, what="a 503")
            refused = request(server.port, "GET", "/status")
            assert refused.status == 503 and missing_security_headers(refused.headers) == [], refused.headers
        assert "Traceback" not in server.output


def test_the_signed_950_deep_payload_is_a_4xx_with_the_headers(
    hostile_server: Server, redis_client: Any
) -> None:
    body = b'{"zen": ' + nested(950) + b', "hook_id": 1}'
    for event in ("ping", "issues"):
        reply = deliver(hostile_server.port, event, body, delivery=f"d-950-{event}")
        assert reply.status == 422 and "nests more than 64 deep" in reply.json["error"], reply.body
        assert missing_security_headers(reply.headers) == []
    assert list(redis_client.scan_iter(match=keys.webhook_delivery("*"))) == []
