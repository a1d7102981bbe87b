"""The bounds of `dispatchq serve` and its answers to bad input, over real HTTP against a real
`dispatchq serve` process: slow headers and bodies cut off, every cap a 413 naming its
setting, a replayed body recognised, input that used to be a 500 now a 4xx naming what was
wrong, the refusals counted in /metrics, and a serve log with no traceback in it."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

import pytest

from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.upgrade import migrate_directory
from dispatchq.storage import directory, keys
from dispatchq.storage.serve import BODY_KEYS
from tests.support.serve import Server, deliver, payload, request
from tests.support.slots import closed_by_server

NDJSON = {"Content-Type": "application/x-ndjson"}


def raw_exchange(port: int, *parts: bytes, pause: float = 0.0, timeout: float = 30) -> tuple[bytes, bool]:
    """Send `parts` (with `pause` after each), then read until the server closes or `timeout`.

    (what came back, whether the server closed the connection). The timeout is far above
    every bound the module sets, so a bound that does not hold shows as (b"", False).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        for part in parts:
            sock.sendall(part)
            time.sleep(pause)
        return closed_by_server(sock)


def refused_count(server: Server, reason: str) -> float:
    text = request(server.port, "GET", "/metrics").body.decode()
    found = re.search(rf'^dispatchq_serve_refused_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    assert found, text[-2000:]
    return float(found.group(1))


def ids(redis_client: Any) -> list[str]:
    return directory.all_ids(redis_client)


# -- time ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/webhooks/github", "/judgements"])
def test_a_slow_body_is_answered_408_and_the_connection_closed(bounds_server: Server, path: str) -> None:
    before = refused_count(bounds_server, "body_timeout")
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
    head += b"X-Hub-Signature-256: sha256=00\r\nContent-Length: 1000\r\n\r\n"
    answer, closed = raw_exchange(bounds_server.port, head, b'{"a": "', pause=0.2)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"DISPATCHQ_SERVE_BODY_TIMEOUT" in answer and closed
    assert refused_count(bounds_server, "body_timeout") == before + 1


def test_slow_headers_and_a_silent_connection_are_answered_408_and_closed(bounds_server: Server) -> None:
    before = refused_count(bounds_server, "header_timeout")
    answer, closed = raw_exchange(
        bounds_server.port, b"POST /webhooks/github HTTP/1.1\r\n", b"Host: 1", pause=0.5
    )
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"DISPATCHQ_SERVE_HEADER_TIMEOUT" in answer and closed
    silent, closed = raw_exchange(bounds_server.port)
    assert silent.startswith(b"HTTP/1.1 408") and closed
    assert refused_count(bounds_server, "header_timeout") == before + 2


def test_a_kept_alive_connection_still_serves_its_next_request(bounds_server: Server) -> None:
    """The header deadline is per request: a second request on one connection is answered."""
    get = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(("127.0.0.1", bounds_server.port), timeout=30) as sock:
        for _ in range(2):
            sock.sendall(get)
            data = b""
            while b'"ok":true' not in data.replace(b" ", b""):
                got = sock.recv(4096)
                assert got, data
                data += got
            assert data.startswith(b"HTTP/1.1 200")


# -- size ------------------------------------------------------------------------------------


def test_a_body_over_the_configured_cap_is_413_naming_it(bounds_server: Server, redis_client: Any) -> None:
    before = refused_count(bounds_server, "body_too_large")
    big = b"[" + b" " * (1024 * 1024 + 10) + b"]"
    for path in ("/judgements", "/webhooks/github"):
        reply = request(bounds_server.port, "POST", path, big, {"Content-Type": "application/json"})
        assert reply.status == 413, (path, reply.body)
        assert "1 MB" in reply.json["error"] and "DISPATCHQ_SERVE_MAX_BODY" in reply.json["error"]
    mb = b" " * (512 * 1024)
    chunk = b"%x\r\n%s\r\n" % (len(mb), mb)
    head = b"POST /judgements HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer, _ = raw_exchange(bounds_server.port, head, chunk, chunk, chunk, b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and b"DISPATCHQ_SERVE_MAX_BODY" in answer, answer[:300]
    assert ids(redis_client) == []
    assert refused_count(bounds_server, "body_too_large") == before + 3


def test_more_lines_than_the_cap_is_413_and_nothing_is_enqueued(
    bounds_server: Server, redis_client: Any
) -> None:
    lines = [json.dumps({"kind": "echo", "target": f"acme/app#{n}"}) for n in range(21)]
    for body, headers in (
        ("\n".join(lines).encode(), NDJSON),
        (f"[{','.join(lines)}]".encode(), {"Content-Type": "application/json"}),
    ):
        reply = request(bounds_server.port, "POST", "/judgements", body, headers)
        assert reply.status == 413, reply.body
        assert (
            "21 judgements" in reply.json["error"] and "DISPATCHQ_SERVE_MAX_LINES (20)" in reply.json["error"]
        )
    assert ids(redis_client) == []
    ok = request(bounds_server.port, "POST", "/judgements", "\n".join(lines[:20]).encode(), NDJSON)
    assert ok.status == 200 and len(ids(redis_client)) == 20


def test_a_state_over_the_cap_is_413_naming_its_line(bounds_server: Server, redis_client: Any) -> None:
    good = json.dumps({"kind": "echo", "target": "acme/app#1"})
    fat = json.dumps({"kind": "echo", "target": "acme/app#2", "state": {"body": "x" * 3000}})
    reply = request(bounds_server.port, "POST", "/judgements", f"{good}\n{fat}".encode(), NDJSON)
    assert reply.status == 413, reply.body
    assert "line 2" in reply.json["error"] and "DISPATCHQ_SERVE_MAX_STATE (2048)" in reply.json["error"]
    assert ids(redis_client) == []


def test_more_bad_lines_than_the_cap_is_413_and_few_are_answered_per_line(
    bounds_server: Server, redis_client: Any
) -> None:
    good = json.dumps({"kind": "echo", "target": "acme/app#1"})
    as_json = {"Content-Type": "application/json"}
    reply = request(bounds_server.port, "POST", "/judgements", json.dumps([{}] * 4).encode(), as_json)
    assert reply.status == 413 and "DISPATCHQ_SERVE_MAX_ERRORS (3)" in reply.json["error"], reply.body
    mixed = "\n".join([good, "{}", "{not json", "7"]).encode()
    reply = request(bounds_server.port, "POST", "/judgements", mixed, NDJSON)
    assert reply.status == 207, reply.body
    assert [("id" in entry, entry["line"]) for entry in reply.json] == [
        (True, 1),
        (False, 2),
        (False, 3),
        (False, 4),
    ]
    assert len(ids(redis_client)) == 1


# -- bad input: a 4xx naming it, never a 500 ----------------------------------------------------


def test_a_non_ascii_signature_is_400_without_any_credential(
    bounds_server: Server, redis_client: Any
) -> None:
    body = payload("issues", "opened.payload.json")
    head = (
        b"POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"X-GitHub-Event: issues\r\nX-GitHub-Delivery: d-utf8\r\n"
        + "X-Hub-Signature-256: sha256=é\r\n".encode()
        + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    )
    answer, _ = raw_exchange(bounds_server.port, head + body)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"X-Hub-Signature-256 is not ASCII" in answer
    assert list(redis_client.scan_iter(match=keys.webhook_delivery("*"))) == []


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [65, 950, 1100])
@pytest.mark.parametrize("where", ["issue.body", "repository.description"])
def test_a_signed_payload_nested_deep_is_a_4xx_naming_it(
    bounds_server: Server, redis_client: Any, depth: int, where: str
) -> None:
    """Measured on its bytes before it is parsed: a part the triage keeps (`issue.body`, the
    needs-repro rule's state) or one it drops, within orjson's own limit (1,024) or past it."""
    issue = json.loads(payload("issues", "opened.payload.json"))
    part, field = where.split(".")
    issue[part][field] = "DEEP"
    body = json.dumps(issue).encode().replace(b'"DEEP"', b"[" * depth + b"]" * depth)
    reply = deliver(bounds_server.port, "issues", body, delivery=f"d-deep-{depth}")
    assert reply.status == 422 and "nests more than 64 deep" in reply.json["error"], reply.body
    assert reply.headers["x-frame-options"] == "DENY"
    assert list(redis_client.scan_iter(match=keys.webhook_delivery("*"))) == []


def test_judgements_nested_5000_deep_or_with_a_huge_integer_fail_only_their_line(
    bounds_server: Server, redis_client: Any
) -> None:
    deep = "[" * 5000 + "]" * 5000
    lines = [
        json.dumps({"kind": "echo", "target": "acme/app#1"}),
        '{"kind": "echo", "target": "acme/app#2", "state": {"n": ' + deep + "}}",
        json.dumps({"kind": "echo", "target": "acme/app#3", "state": {"n": 2**70}}),
        json.dumps({"kind": "echo", "target": "acme/app#4", "state": {"n": _nested(100)}}),
        json.dumps({"kind": "echo", "target": "acme/app#5", "state": {"n": 2**63}}),
    ]
    reply = request(bounds_server.port, "POST", "/judgements", "\n".join(lines).encode(), NDJSON)
    assert reply.status == 207, reply.body
    answer = {entry["line"]: entry for entry in reply.json}
    assert answer[1]["id"] and answer[5]["id"]  # 2**63 still fits the records' encoder
    assert "nests too deep" in answer[2]["error"]
    assert "integer past 64 bits" in answer[3]["error"]
    assert "nests more than 64 deep" in answer[4]["error"]
    assert len(ids(redis_client)) == 2
    whole = request(
        bounds_server.port, "POST", "/judgements", deep.encode(), {"Content-Type": "application/json"}
    )
    assert whole.status == 422 and "nests too deep" in whole.json[0]["error"], whole.body


def test_a_client_gone_mid_body_leaves_no_traceback(bounds_server: Server) -> None:
    noted = bounds_server.log.read_text().count("the client went away")
    for path in ("/judgements", "/webhooks/github"):
        with socket.create_connection(("127.0.0.1", bounds_server.port), timeout=10) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Hub-Signature-256: sha256=00\r\n".encode()
                + b"Content-Length: 5000\r\n\r\n{"
            )
            time.sleep(0.3)
    time.sleep(0.5)
    assert request(bounds_server.port, "GET", "/healthz").status == 200
    assert "Traceback" not in bounds_server.output
    assert bounds_server.log.read_text().count("the client went away") == noted + 2  # one line each


# -- replays and the prefix index ---------------------------------------------------------------


def test_a_body_replayed_under_a_new_delivery_id_is_a_redelivery_until_its_record_expires(
    bounds_server: Server, redis_client: Any
) -> None:
    body = payload("issues", "opened.payload.json")
    first = deliver(bounds_server.port, "issues", body, delivery="d-orig")
    assert first.status == 202, first.body
    replay = deliver(bounds_server.port, "issues", body, delivery="d-replay")
    assert replay.status == 200 and replay.json["redelivery"] is True and replay.json["replay_of"] == "d-orig"
    assert replay.json["decision_id"] == first.json["decision_id"]
    queue = DispatchqQueue(keys.queue_name("typed"), connection=redis_client)
    assert [job.args[0] for job in queue.get_jobs()] == [["d-orig"]]
    (body_key,) = redis_client.scan_iter(match=f"{BODY_KEYS}*")
    record_ttl = redis_client.ttl(keys.webhook_delivery("d-orig"))
    assert 0 < redis_client.ttl(body_key) <= record_ttl + 1  # they expire together
    # The record's TTL passes (both keys go): a replay after it is triaged again.
    redis_client.delete(body_key, keys.webhook_delivery("d-orig"))
    again = deliver(bounds_server.port, "issues", body, delivery="d-replay-later")
    assert again.status == 202, again.body
    assert len(queue.get_jobs()) == 2
    # A changed body with a fresh id is a new delivery, as ever.
    changed = body.replace(b'"opened"', b'"opened" ', 1)
    assert deliver(bounds_server.port, "issues", changed, delivery="d-other").status == 202


def test_prefix_lookup_reads_the_directory_and_an_old_store_is_migrated(
    bounds_server: Server, redis_client: Any
) -> None:
    lines = [json.dumps({"kind": "echo", "target": f"acme/app#{n}"}) for n in range(3)]
    posted = request(bounds_server.port, "POST", "/judgements", "\n".join(lines).encode(), NDJSON)
    made = [entry["id"] for entry in posted.json]
    assert sorted(directory.all_ids(redis_client)) == sorted(made)  # written by ENQUEUE
    # A store from before the directory: ids in the two sorted sets only.
    for jid in made:
        redis_client.hdel(*keys.directory(jid))
    redis_client.zadd(keys.ALL_IDS, {jid: n for n, jid in enumerate(made)})
    redis_client.zadd(f"{keys.ALL_IDS}:lex", dict.fromkeys(made, 0))
    old = made[0]
    assert request(bounds_server.port, "GET", f"/judgements/{old[:8]}").status == 200  # until migrated
    assert migrate_directory(redis_client) == 3
    assert migrate_directory(redis_client) is None  # once per store: the old sets are gone
    assert not redis_client.exists(keys.ALL_IDS, f"{keys.ALL_IDS}:lex")
    assert sorted(directory.all_ids(redis_client)) == sorted(made)
    assert request(bounds_server.port, "GET", f"/judgements/{old[:10]}").json["id"] == old
    twin = old[:8] + "0" * (len(old) - 8)
    redis_client.hset(*keys.directory(twin), "1")
    ambiguous = request(bounds_server.port, "GET", f"/judgements/{old[:8]}")
    assert ambiguous.status == 409 and sorted(ambiguous.json["ids"]) == sorted([old, twin])
    assert request(bounds_server.port, "GET", "/judgements/zzzzzzzz").status == 404
