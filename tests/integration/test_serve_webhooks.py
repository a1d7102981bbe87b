"""`POST /webhooks/github` over real HTTP: a real `dispatchq serve` process, a real Redis.

GitHub's own example payloads (read from shared/github-webhooks at test time) are posted
with correct and wrong signatures; what was recorded is read back from Redis and RQ.
"""

from __future__ import annotations

import json
import socket
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.storage import keys
from dispatchq.storage.serve import ServeStorage
from dispatchq.storage.triage import TriageStorage
from tests.support.helpers import run_cli
from tests.support.serve import Server, deliver, payload, request, sign


def typed_jobs(redis_client: Any) -> list[Any]:
    return DispatchqQueue(keys.queue_name("typed"), connection=redis_client).get_jobs()


def queued_envelope(redis_client: Any) -> dict[str, Any]:
    """The one triage event queued: one job, naming one delivery, whose record holds it."""
    (job,) = typed_jobs(redis_client)
    assert job.func_name == "jobs.tiers.triage_deliveries"
    ((delivery_id,),) = job.args
    record = ServeStorage(redis_client).delivery(delivery_id)
    assert record is not None and record["job"] == job.id
    envelope: dict[str, Any] = record["envelope"]
    return envelope


def deliveries(redis_client: Any) -> list[bytes]:
    return list(redis_client.scan_iter(match=keys.webhook_delivery("*")))


def test_an_issue_opened_is_accepted_once_and_triaged_by_a_typed_worker(
    webhooks_server: Server, webhooks_env: dict[str, str], redis_client: Any
) -> None:
    body = payload("issues", "opened.payload.json")
    first = deliver(webhooks_server.port, "issues", body, delivery="d-issue-1")
    assert first.status == 202, first.body
    assert first.json["delivery"] == "d-issue-1"
    decision = first.json["decision_id"]
    assert len(decision) == 64

    again = deliver(webhooks_server.port, "issues", body, delivery="d-issue-1")
    assert again.status == 200
    assert again.json["decision_id"] == decision and again.json["delivery"] == "d-issue-1"
    envelope = queued_envelope(redis_client)  # one enqueue, not two
    assert envelope["event"] == "issues.opened"
    assert envelope["target"] == "Codertocat/Hello-World#1"
    assert envelope["context"] == {
        "repository": "Codertocat/Hello-World",
        "default_branch": "master",
        "sender": "Codertocat",
        "installation": None,
    }
    # The rule's `state:` list narrowed the payload to what it asks about.
    assert envelope["state"] == {
        "issue": {
            "title": "Spelling error in the README file",
            "body": "It looks like you accidently spelled 'commit' with two 't's.",
        }
    }

    done = run_cli(["worker", "typed", "--burst"], webhooks_env, timeout=120)
    assert done.returncode == 0, done.stderr
    stored = TriageStorage(redis_client).decision(decision)
    assert stored is not None and stored["event"]["target"] == "Codertocat/Hello-World#1"

    third = deliver(webhooks_server.port, "issues", body, delivery="d-issue-1")
    assert third.status == 200 and third.json["decision_id"] == decision
    assert typed_jobs(redis_client) == []  # the worker took the one job; no second was made


def test_a_burst_of_deliveries_and_their_redeliveries_is_each_triaged_once(
    webhooks_server: Server, webhooks_env: dict[str, str], redis_client: Any
) -> None:
    """Twelve issues, each delivered twice, from eight connections at once: the accept calls
    batch them however they arrive; each still gets one 202, one 200 and one decision."""
    base = json.loads(payload("issues", "opened.payload.json"))
    bodies = {
        f"d-burst-{n}": json.dumps(
            {**base, "issue": {**base["issue"], "number": n, "title": f"issue {n}"}}
        ).encode()
        for n in range(1, 13)
    }
    work = list(bodies.items()) * 2
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(
                lambda item: (item[0], deliver(webhooks_server.port, "issues", item[1], delivery=item[0])),
                work,
            )
        )
    answers: dict[str, list[Any]] = defaultdict(list)
    for delivery, reply in replies:
        answers[delivery].append(reply)
    decisions: dict[str, str] = {}
    for delivery, got in answers.items():
        assert sorted(r.status for r in got) == [200, 202], (delivery, [r.body for r in got])
        (decisions[delivery],) = {r.json["decision_id"] for r in got}
    assert len(set(decisions.values())) == 12

    # Each delivery's record names a queued job, and that job names the delivery.
    jobs = {job.id: job for job in typed_jobs(redis_client)}
    storage = ServeStorage(redis_client)
    for delivery in bodies:
        record = storage.delivery(delivery)
        assert record is not None and delivery in jobs[record["job"]].args[0]

    done = run_cli(["worker", "typed", "--burst"], webhooks_env, timeout=180)
    assert done.returncode == 0, done.stderr
    triage = TriageStorage(redis_client)
    assert all(triage.decision(decision) is not None for decision in decisions.values())
    queue = DispatchqQueue(keys.queue_name("typed"), connection=redis_client)
    assert typed_jobs(redis_client) == [] and queue.failed_job_registry.count == 0


def test_an_integer_past_64_bits_is_refused_where_kept_and_harmless_where_dropped(
    webhooks_server: Server, redis_client: Any
) -> None:
    """orjson would read it as a float; the state must never hold a silently rounded number."""
    big = 123456789012345678901234567890
    push = json.loads(payload("push"))
    push["repository"]["stargazers_count"] = big  # `any-push` keeps the whole payload
    kept = deliver(webhooks_server.port, "push", json.dumps(push).encode(), delivery="d-big-kept")
    assert kept.status == 422 and "not plain JSON data" in kept.json["error"], kept.body

    issue = json.loads(payload("issues", "opened.payload.json"))
    issue["repository"]["stargazers_count"] = big  # `needs-repro` keeps only the title and body
    dropped = deliver(webhooks_server.port, "issues", json.dumps(issue).encode(), delivery="d-big-dropped")
    assert dropped.status == 202, dropped.body
    assert "repository" not in queued_envelope(redis_client)["state"]


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, "sha1=abc", sign(b"other body")])
def test_a_bad_or_missing_signature_is_401_and_nothing_is_recorded(
    webhooks_server: Server, redis_client: Any, signature: str | None
) -> None:
    body = payload("issues", "opened.payload.json")
    reply = deliver(webhooks_server.port, "issues", body, delivery="d-bad", signature=signature)
    assert reply.status == 401
    assert "X-Hub-Signature-256" in reply.json["error"]
    assert typed_jobs(redis_client) == []
    assert deliveries(redis_client) == []


#: Bodies no parser should ever see unsigned: not JSON, not UTF-8, and a JSON object 950 deep.
UNPARSED = {
    "not-json": b'{"action": "opened", "issue": ',
    "not-utf8": b'{"action": "\xff\xfe"}',
    "nested-950": b'{"a":' * 950 + b"{}" + b"}" * 950,
}


@pytest.mark.parametrize("body", list(UNPARSED.values()), ids=list(UNPARSED))
def test_a_bad_signature_is_401_before_the_body_is_read_as_json(
    webhooks_server: Server, redis_client: Any, body: bytes
) -> None:
    """Verified first, parsed after: an unsigned body is refused as unsigned, whatever it holds
    (a parser reached first would answer 400, 422 or 500, and would have read it)."""
    logged = len(webhooks_server.log.read_bytes())
    unsigned = sign(body, "not-the-secret")
    reply = deliver(webhooks_server.port, "issues", body, delivery="d-unparsed", signature=unsigned)
    assert reply.status == 401, reply.body
    assert "X-Hub-Signature-256" in reply.json["error"]
    assert typed_jobs(redis_client) == []
    assert deliveries(redis_client) == []
    assert b"Traceback" not in webhooks_server.log.read_bytes()[logged:]


def test_a_push_is_named_without_an_action_and_targets_the_new_head(
    webhooks_server: Server, redis_client: Any
) -> None:
    body = payload("push")
    after = json.loads(body)["after"]
    reply = deliver(webhooks_server.port, "push", body, delivery="d-push")
    assert reply.status == 202, reply.body
    envelope = queued_envelope(redis_client)
    assert envelope["event"] == "push"
    assert envelope["target"] == f"Codertocat/Hello-World@{after}"
    assert envelope["item"] == "ref:refs/tags/simple-tag"


def test_a_check_run_targets_its_first_pull_request_and_its_state_is_trimmed(
    webhooks_server: Server, redis_client: Any
) -> None:
    body = payload("check_run", "completed.payload.json")
    reply = deliver(webhooks_server.port, "check_run", body, delivery="d-check")
    assert reply.status == 202, reply.body
    envelope = queued_envelope(redis_client)
    assert envelope["event"] == "check_run.completed"  # a rule naming `check_run` took it
    assert envelope["target"] == "Codertocat/Hello-World#2"
    text = json.dumps(envelope["state"])
    assert len(text) < len(body)
    for dropped in ('_url"', '"node_id"', '"gravatar_id"', '"_links"'):
        assert dropped not in text
    assert envelope["state"]["check_run"]["conclusion"] == "success"


def test_ping_is_answered_and_nothing_is_enqueued(webhooks_server: Server, redis_client: Any) -> None:
    body = payload("ping")
    reply = deliver(webhooks_server.port, "ping", body, delivery="d-ping")
    assert reply.status == 200
    assert reply.json["ping"] == "pong" and reply.json["zen"] == json.loads(body)["zen"]
    assert typed_jobs(redis_client) == [] and deliveries(redis_client) == []


def _raw(port: int, head: bytes, chunks: Iterator[bytes]) -> bytes:
    """Send a request by hand (a lying or chunked body), then read whatever the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except OSError:
            pass  # the server answered and closed before the body was all sent: the point
        data = b""
        try:
            while True:
                got = sock.recv(65536)
                if not got:
                    break
                data += got
                if b"\r\n\r\n" in data and b"}" in data:
                    break
        except OSError:
            pass
        return data


def test_a_body_over_25_mb_is_refused_413_without_being_read(
    webhooks_server: Server, redis_client: Any
) -> None:
    head = (
        b"POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"X-GitHub-Event: issues\r\nX-GitHub-Delivery: d-big\r\nX-Hub-Signature-256: sha256=00\r\n"
        b"Content-Length: 30000000\r\n\r\n"
    )
    answer = _raw(webhooks_server.port, head, iter([b"{" + b" " * 1000]))  # 1 KB of a declared 30 MB
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert deliveries(redis_client) == []


def test_a_chunked_body_is_counted_while_it_streams_and_refused_past_25_mb(webhooks_server: Server) -> None:
    head = (
        b"POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"X-GitHub-Event: issues\r\nX-GitHub-Delivery: d-chunked\r\nX-Hub-Signature-256: sha256=00\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    mb = b" " * (1024 * 1024)
    chunk = b"%x\r\n%s\r\n" % (len(mb), mb)
    answer = _raw(webhooks_server.port, head, iter([chunk] * 27 + [b"0\r\n\r\n"]))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_without_a_secret_serve_says_so_and_refuses_every_delivery(
    webhooks_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    without = {k: v for k, v in webhooks_env.items() if k != "DISPATCHQ_GITHUB_WEBHOOK_SECRET"}
    with Server(without, tmp_path) as server:
        body = payload("issues", "opened.payload.json")
        reply = deliver(server.port, "issues", body, delivery="d-nosecret")
        assert reply.status == 503
        assert "DISPATCHQ_GITHUB_WEBHOOK_SECRET" in reply.json["error"]
        assert "DISPATCHQ_GITHUB_WEBHOOK_SECRET is not set" in server.output
    assert typed_jobs(redis_client) == [] and deliveries(redis_client) == []


def test_the_webhook_route_needs_no_bearer_token_but_the_others_do(webhooks_server: Server) -> None:
    body = payload("issues", "opened.payload.json")
    assert deliver(webhooks_server.port, "issues", body, delivery="d-open").status == 202
    assert request(webhooks_server.port, "GET", "/healthz").status == 200
    refused = request(
        webhooks_server.port, "POST", "/judgements", b"{}", {"Content-Type": "application/json"}
    )
    assert refused.status == 401 and refused.headers["www-authenticate"].startswith("Bearer")


def test_a_signed_delivery_without_its_headers_or_as_a_form_is_refused_and_not_recorded(
    webhooks_server: Server, redis_client: Any
) -> None:
    body = payload("issues", "opened.payload.json")
    signed = {"X-Hub-Signature-256": sign(body), "Content-Type": "application/json"}
    no_id = request(
        webhooks_server.port, "POST", "/webhooks/github", body, {**signed, "X-GitHub-Event": "issues"}
    )
    assert no_id.status == 400 and "X-GitHub-Delivery" in no_id.json["error"]
    no_event = request(
        webhooks_server.port, "POST", "/webhooks/github", body, {**signed, "X-GitHub-Delivery": "d-x"}
    )
    assert no_event.status == 400 and "X-GitHub-Event" in no_event.json["error"]
    form = {**signed, "Content-Type": "application/x-www-form-urlencoded"}
    as_form = request(
        webhooks_server.port,
        "POST",
        "/webhooks/github",
        body,
        {**form, "X-GitHub-Event": "issues", "X-GitHub-Delivery": "d-f"},
    )
    assert as_form.status == 415 and "application/json" in as_form.json["error"]
    assert typed_jobs(redis_client) == [] and deliveries(redis_client) == []
