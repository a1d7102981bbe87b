"""The page's write routes (`serve.actions`) and the write cookie, over real HTTP against a real
`dispatchq serve`, and the scheduler sampling the 24-hour history (a real `dispatchq scheduler`).

One server with a token (the write cookie's mode) and one without (the Host and Origin rules
alone), both on the test process's Redis. Each action is checked in Redis, not only by its
answer: the marker, the audit, the record's status and trail, the host's block.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from dispatchq.storage import keys
from dispatchq.storage.window import WindowStore
from tests.support.helpers import run_cli, wait_for
from tests.support.serve import ACTIONS_TOKEN, Reply, Server, request

AUTH = {"Authorization": f"Bearer {ACTIONS_TOKEN}", "Content-Type": "application/json"}
JSON = {"Content-Type": "application/json"}
WRITE = "X-Dispatchq-Write"


def post(server: Server, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    data = b"" if body is None else json.dumps(body).encode()
    return request(server.port, "POST", path, data, headers if headers is not None else AUTH)


def login_cookies(server: Server) -> dict[str, tuple[str, dict[str, str]]]:
    """`POST /login`'s cookies (every Set-Cookie header): name -> (value, attributes lower-cased)."""
    body = urllib.parse.urlencode({"token": ACTIONS_TOKEN}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(
            "POST", "/login", body=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        response = conn.getresponse()
        response.read()
        assert response.status == 303
        headers = response.msg.get_all("set-cookie") or []
    finally:
        conn.close()
    out = {}
    for cookie in headers:
        name, _, value = cookie.split(";", 1)[0].partition("=")
        attributes = {}
        for part in cookie.split(";")[1:]:
            key, _, val = part.strip().partition("=")
            attributes[key.lower()] = val
        out[name] = (value, attributes)
    return out


def enqueue(server: Server, target: str) -> str:
    reply = post(server, "/judgements", {"kind": "echo", "target": target})
    assert reply.status == 200, reply.body
    return str(reply.json[0]["id"])


def record(redis_client: Any, jid: str) -> dict[str, str]:
    raw = redis_client.hgetall(keys.record(jid))
    return {k.decode(): v.decode() for k, v in raw.items()}


# --- the write cookie ------------------------------------------------------------------------


def test_the_write_cookie_holds_a_write_labelled_hmac_with_a_short_expiry(guarded: Server) -> None:
    before = int(time.time())
    cookies = login_cookies(guarded)
    assert set(cookies) == {"dispatchq_token", "dispatchq_write"}
    value, attributes = cookies["dispatchq_write"]
    assert ACTIONS_TOKEN not in value and ACTIONS_TOKEN[:10] not in value
    expires_text, login_id, mac = value.split(".")
    expires = int(expires_text)
    max_age = int(attributes["max-age"])
    assert max_age == 15 * 60
    assert before + max_age <= expires <= int(time.time()) + max_age
    wanted = hmac.new(
        ACTIONS_TOKEN.encode(),
        f"dispatchq write page cookie v2:{expires}.{login_id}".encode(),
        hashlib.sha256,
    )
    assert hmac.compare_digest(mac, wanted.hexdigest())
    # One login: both cookies carry its id (a logout ends both).
    assert cookies["dispatchq_token"][0].split(".")[1] == login_id
    assert "httponly" in attributes and attributes["samesite"].lower() == "strict"
    # The read cookie is not the write cookie: a label in the MAC tells them apart.
    assert cookies["dispatchq_token"][0] != value
    assert int(cookies["dispatchq_token"][1]["max-age"]) > max_age


def test_the_write_cookie_writes_only_with_this_origin_and_the_header(
    guarded: Server, redis_client: Any
) -> None:
    cookies = login_cookies(guarded)
    jar = {"Cookie": f"dispatchq_write={cookies['dispatchq_write'][0]}", **JSON}
    origin = {"Origin": f"http://127.0.0.1:{guarded.port}"}
    jid = enqueue(guarded, "acme/app#cookie")

    without_header = post(guarded, f"/actions/judgements/{jid}/cancel", {}, {**jar, **origin})
    assert without_header.status == 403 and WRITE in without_header.json["error"]
    without_origin = post(guarded, f"/actions/judgements/{jid}/cancel", {}, {**jar, WRITE: "1"})
    assert without_origin.status == 403 and "Origin" in without_origin.json["error"]
    cross = post(
        guarded,
        f"/actions/judgements/{jid}/cancel",
        {},
        {**jar, WRITE: "1", "Origin": "https://evil.example"},
    )
    assert cross.status == 403 and "evil.example" in cross.json["error"]
    # The read cookie never writes, nor does the write cookie open anything but the actions.
    read_only = {"Cookie": f"dispatchq_token={cookies['dispatchq_token'][0]}", **JSON, **origin, WRITE: "1"}
    assert post(guarded, f"/actions/judgements/{jid}/cancel", {}, read_only).status == 401
    judgement = {"kind": "echo", "target": "acme/app#2"}
    assert post(guarded, "/judgements", judgement, {**jar, **origin, WRITE: "1"}).status == 401
    assert record(redis_client, jid)["status"] == "queued"  # nothing above wrote

    done = post(guarded, f"/actions/judgements/{jid}/cancel", {}, {**jar, **origin, WRITE: "1"})
    assert done.status == 200 and done.json == {"ok": True, "id": jid, "cancelled": True}
    assert record(redis_client, jid)["status"] == "cancelled"
    # A forged expiry with the old MAC, or a read cookie offered as the write one, is refused.
    expires, _, mac = cookies["dispatchq_write"][0].partition(".")
    forged = {"Cookie": f"dispatchq_write={int(expires) + 3600}.{mac}", **JSON, **origin, WRITE: "1"}
    assert post(guarded, f"/actions/judgements/{jid}/retry", {}, forged).status == 401
    swapped = {"Cookie": f"dispatchq_write={cookies['dispatchq_token'][0]}", **JSON, **origin, WRITE: "1"}
    assert post(guarded, f"/actions/judgements/{jid}/retry", {}, swapped).status == 401
    # Bearer auth for writes keeps working, header or not.
    assert post(guarded, f"/actions/judgements/{jid}/retry", {}).status == 200
    assert record(redis_client, jid)["status"] == "queued"


# --- the actions -------------------------------------------------------------------------------


def test_window_close_refuses_to_shorten_then_open_and_both_are_audited(
    guarded: Server, token_env: dict[str, str], redis_client: Any
) -> None:
    assert run_cli(["window", "close", "--until", "3h", "--reason", "a demo"], token_env).returncode == 0
    shorter = post(guarded, "/actions/window/close", {"until": "1h", "reason": "lunch"})
    assert shorter.status == 409 and "already closed until" in shorter.json["error"]
    assert "force" in shorter.json["error"]
    forced = post(guarded, "/actions/window/close", {"until": "1h", "reason": "lunch", "force": True})
    assert forced.status == 200, forced.body
    assert 3500 < forced.json["closed_until_epoch"] - time.time() <= 3600
    status = json.loads(request(guarded.port, "GET", "/status", headers=AUTH).body)
    assert status["marker"]["up"] is True and "lunch" in json.dumps(status["markers"])

    opened = post(guarded, "/actions/window/open", {})
    assert opened.status == 200 and opened.json == {"ok": True, "opened": ["general"]}
    again = post(guarded, "/actions/window/open")
    assert again.status == 200 and again.json["opened"] == []
    status = json.loads(request(guarded.port, "GET", "/status", headers=AUTH).body)
    assert status["marker"]["up"] is False
    audit = status["window_audit"]
    by_serve = [a for a in audit if "serve 127.0.0.1" in str(a.get("who"))]
    assert {a["action"] for a in by_serve} >= {"closed", "opened"}, audit


def test_bad_action_input_is_a_4xx_naming_what_was_wrong(guarded: Server) -> None:
    cases = [
        ("/actions/window/close", {}, 400, '"until" is required'),
        ("/actions/window/close", {"until": "tomorrowish"}, 400, "not a duration"),
        ("/actions/window/close", {"until": "2026-12-02T18:00"}, 400, "no UTC offset"),
        ("/actions/window/close", {"until": "2001-01-01T00:00+00:00"}, 400, "in the past"),
        ("/actions/window/close", {"until": "1h", "reason": 7}, 400, '"reason"'),
        ("/actions/hosts/unblock", {"host": "a b"}, 400, '"host"'),
        ("/actions/judgements/ffffffffffffffff/retry", {}, 404, "no judgement ffffffffffffffff"),
        ("/actions/judgements/x/cancel", {}, 400, "judgement id"),
        ("/actions/window/open", [1], 400, "JSON object"),
    ]
    for path, body, status, text in cases:
        reply = post(guarded, path, body)
        assert reply.status == status and text in reply.json["error"], (path, reply.status, reply.body)
    not_json = request(guarded.port, "POST", "/actions/window/open", b"{", AUTH)
    assert not_json.status == 400 and "not JSON" in not_json.json["error"]
    as_form = request(
        guarded.port, "POST", "/actions/window/open", b"a=1", {**AUTH, "Content-Type": "text/plain"}
    )
    assert as_form.status == 415


def test_retry_cancel_and_unblock_change_redis_as_the_cli_does(guarded: Server, redis_client: Any) -> None:
    jid = enqueue(guarded, "acme/app#actions")
    finished = enqueue(guarded, "acme/app#finished")
    cancelled = post(guarded, f"/actions/judgements/{jid[:10]}/cancel", {})  # a unique prefix, as the CLI
    assert cancelled.status == 200 and cancelled.json["id"] == jid
    assert record(redis_client, jid)["status"] == "cancelled"
    twice = post(guarded, f"/actions/judgements/{jid}/cancel", {})
    assert twice.status == 409 and "already finished" in twice.json["error"]
    retried = post(guarded, f"/actions/judgements/{jid}/retry", {})
    assert retried.status == 200 and retried.json == {"ok": True, "id": jid, "requeued": True}
    after = record(redis_client, jid)
    assert after["status"] == "queued" and "retry requested" in after.get("trail", "")
    busy = post(guarded, f"/actions/judgements/{finished}/retry", {})
    assert busy.status == 409 and "queued" in busy.json["error"]

    WindowStore(redis_client).block("build-09", "claude: command not found")
    unblocked = post(guarded, "/actions/hosts/unblock", {"host": "build-09"})
    assert unblocked.status == 200 and unblocked.json == {"ok": True, "host": "build-09", "was_blocked": True}
    assert not WindowStore(redis_client).blocked_reason("build-09")
    assert post(guarded, "/actions/hosts/unblock", {"host": "build-09"}).json["was_blocked"] is False

    lines = guarded.log.read_text(errors="replace")
    assert re.search(rf"access 127\.0\.0\.1 POST /actions/judgements/{jid}/retry 200", lines)
    assert re.search(r"access 127\.0\.0\.1 POST /actions/hosts/unblock 200", lines)


def test_without_a_token_the_actions_rely_on_host_and_origin(opened: Server, redis_client: Any) -> None:
    jid = enqueue(opened, "acme/app#open")
    evil = post(opened, f"/actions/judgements/{jid}/cancel", {}, {**JSON, "Origin": "https://evil.example"})
    assert evil.status == 403
    rebound = post(opened, f"/actions/judgements/{jid}/cancel", {}, {**JSON, "Host": "evil.example"})
    assert rebound.status == 400
    assert record(redis_client, jid)["status"] == "queued"
    same = {**JSON, "Origin": f"http://127.0.0.1:{opened.port}", WRITE: "1"}
    assert post(opened, f"/actions/judgements/{jid}/cancel", {}, same).status == 200
    assert record(redis_client, jid)["status"] == "cancelled"


def test_history_is_read_scoped(guarded: Server) -> None:
    assert request(guarded.port, "GET", "/history").status == 401
    reply = request(guarded.port, "GET", "/history", headers=AUTH)
    assert reply.status == 200 and set(reply.json) >= {"now", "since", "series", "samples"}


# --- the scheduler samples the history ---------------------------------------------------------


def test_the_scheduler_samples_the_counters_once_a_minute(dq_env: dict[str, str], redis_client: Any) -> None:
    redis_client.set(keys.answered_counter("code"), 7)
    assert run_cli(["window", "close", "--until", "2h"], dq_env).returncode == 0
    with subprocess.Popen(
        [sys.executable, "-m", "dispatchq.cli", "scheduler"],
        env=dq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as scheduler:
        try:
            wait_for(lambda: redis_client.xlen("dispatchq:history"), timeout=60, what="the first sample")
            time.sleep(2.5)  # two more ticks in the same minute (usually): no second sample
        finally:
            scheduler.terminate()
            scheduler.wait(timeout=30)
    entries = redis_client.xrange("dispatchq:history")
    assert 1 <= len(entries) <= 2
    entry_id, fields = entries[0]
    minute_ms, _, seq = entry_id.decode().partition("-")
    assert int(minute_ms) % 60000 == 0 and seq == "0"
    values = {k.decode(): int(v) for k, v in fields.items()}
    assert values["answered:code"] == 7 and values["closed"] == 1
    assert {"spawned", "refused", "answered:typed", "answered:session"} <= set(values)
