"""The gate of `dispatchq serve` (issue 22), over real HTTP against a real `dispatchq serve`:
the Host check (DNS rebinding), cross-site writes, media types, the login cookie and its
throttle, the security headers on every route, the access log and the start-time refusals.

Two servers for the module: one in no-token mode (the default on loopback, where a
developer's browser is: the mode a page on another site attacks) and one with a base64
token behind a "proxy" on 127.0.0.1 (`DISPATCHQ_SERVE_TRUSTED_PROXIES`), so a test can
speak as many peers through `X-Forwarded-For`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
import urllib.parse
from typing import Any

from tests.support.helpers import run_cli
from tests.support.serve import GATE_PUBLIC, GATE_TOKEN, Reply, Server, free_port, request, sign

AUTH = {"Authorization": f"Bearer {GATE_TOKEN}"}
JUDGEMENT = json.dumps({"kind": "echo", "target": "acme/app#1"}).encode()
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
HEADERS = {
    "content-security-policy": "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def from_peer(address: str, **headers: str) -> dict[str, str]:
    """Headers as the trusted proxy on 127.0.0.1 would forward them for `address`."""
    return {"X-Forwarded-For": f"203.0.113.99, {address}", **headers}


def log_lines(server: Server, pattern: str) -> list[str]:
    return [line for line in server.log.read_text(errors="replace").splitlines() if re.search(pattern, line)]


# --- what a page on another site can send -------------------------------------------------


def test_a_cross_site_text_plain_form_cannot_queue_a_judgement(opened: Server, redis_client: Any) -> None:
    """The probe of issue 22: `<form enctype="text/plain" action="http://127.0.0.1:8484/judgements">`."""
    form_body = b'{"kind": "echo", "target": "acme/app#1", "x": "=1"}'
    browser = {
        "Content-Type": "text/plain",
        "Origin": "https://evil.example",
        "Sec-Fetch-Site": "cross-site",
        "Sec-Fetch-Mode": "navigate",
    }
    refused = request(opened.port, "POST", "/judgements", form_body, browser)
    assert refused.status == 403 and "another site" in refused.json["error"]
    # Each of the two signals alone is enough ...
    only_origin = request(
        opened.port,
        "POST",
        "/judgements",
        JUDGEMENT,
        {"Content-Type": "application/json", "Origin": "https://evil.example"},
    )
    assert only_origin.status == 403 and "Origin: https://evil.example" in only_origin.json["error"]
    only_fetch = request(
        opened.port,
        "POST",
        "/judgements",
        JUDGEMENT,
        {"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
    )
    assert only_fetch.status == 403
    # ... and a browser that sends neither still cannot send JSON from a form.
    plain = request(opened.port, "POST", "/judgements", form_body, {"Content-Type": "text/plain"})
    assert plain.status == 415
    assert "application/json" in plain.json["error"] and "application/x-ndjson" in plain.json["error"]
    assert "text/plain" in plain.json["error"]
    for kind in ("application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        assert request(opened.port, "POST", "/judgements", form_body, {"Content-Type": kind}).status == 415
    assert redis_client.dbsize() == 0  # nothing of any of them was written


def test_another_origin_on_this_machine_and_a_null_origin_are_cross_site(opened: Server) -> None:
    """Another local dev server (same site, other port) is another origin; so is `null`."""
    json_type = {"Content-Type": "application/json"}
    for origin in (f"http://127.0.0.1:{free_port()}", "http://localhost", "null", "not a url"):
        reply = request(opened.port, "POST", "/judgements", JUDGEMENT, {**json_type, "Origin": origin})
        assert reply.status == 403, origin
    same = {**json_type, "Origin": f"http://127.0.0.1:{opened.port}", "Sec-Fetch-Site": "same-origin"}
    assert request(opened.port, "POST", "/judgements", JUDGEMENT, same).status == 200
    assert request(opened.port, "POST", "/judgements", JUDGEMENT, json_type).status == 200  # a tool
    ndjson = {"Content-Type": "application/x-ndjson; charset=utf-8"}
    assert request(opened.port, "POST", "/judgements", JUDGEMENT, ndjson).status == 200
    # Reads are not writes: a cross-site GET is answered (the Host check guards what it reads).
    assert request(opened.port, "GET", "/healthz", headers={"Sec-Fetch-Site": "cross-site"}).status == 200


def test_a_forged_host_is_refused_so_dns_rebinding_reads_nothing(
    opened: Server, gate_guarded: Server
) -> None:
    for server in (opened, gate_guarded):
        for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example", "[::2]"):
            for method, path in (("GET", "/status"), ("GET", "/"), ("GET", "/judgements/aaaaaaaa")):
                reply = request(server.port, method, path, headers={**AUTH, "Host": host})
                assert reply.status == 400, (host, path)
                assert b"sessions" not in reply.body
            posted = request(server.port, "POST", "/judgements", JUDGEMENT, {**AUTH, "Host": host})
            assert posted.status == 400
        # A load balancer's probe by address still gets its answer, and tells nothing.
        assert request(server.port, "GET", "/healthz", headers={"Host": "10.0.0.7"}).status == 200
    for host in (f"localhost:{opened.port}", f"127.0.0.1:{opened.port}"):
        assert request(opened.port, "GET", "/status", headers={"Host": host}).status == 200
    for host in (GATE_PUBLIC, f"{GATE_PUBLIC}:443", "a.pages.example.test"):
        assert request(gate_guarded.port, "GET", "/status", headers={**AUTH, "Host": host}).status == 200


# --- the cookie and the login --------------------------------------------------------------


def login(server: Server, token: str = GATE_TOKEN, **headers: str) -> Reply:
    body = urllib.parse.urlencode({"token": token}).encode()
    return request(server.port, "POST", "/login", body, {**FORM, **headers})


def test_the_cookie_holds_an_hmac_with_an_expiry_never_the_token(gate_guarded: Server) -> None:
    before = int(time.time())
    reply = login(gate_guarded)
    assert reply.status == 303, reply.body
    cookie = reply.headers["set-cookie"]
    name, _, value = cookie.split(";", 1)[0].partition("=")
    assert name == "dispatchq_token"
    assert GATE_TOKEN not in cookie and urllib.parse.quote(GATE_TOKEN, safe="") not in cookie
    assert GATE_TOKEN.rstrip("=") not in cookie and "q3+Vx" not in cookie
    expires_text, login_id, mac = value.split(".")
    expires = int(expires_text)
    attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")[1:]}
    max_age = int(attributes["max-age"].split("=")[1])
    assert 3600 <= max_age <= 7 * 86400
    assert before + max_age <= expires <= int(time.time()) + max_age
    wanted = hmac.new(
        GATE_TOKEN.encode(),
        f"dispatchq read-only page cookie v2:{expires}.{login_id}".encode(),
        hashlib.sha256,
    )
    assert hmac.compare_digest(mac, wanted.hexdigest()) and len(login_id) >= 16
    assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
    # Behind the trusted proxy, with public names allowed: Secure even for a loopback Host.
    assert "secure" in attributes

    jar = {"Cookie": f"dispatchq_token={value}"}
    assert request(gate_guarded.port, "GET", "/status", headers=jar).status == 200
    quoted = {"Cookie": f'other=1; dispatchq_token="{value}"'}
    assert request(gate_guarded.port, "GET", "/", headers=quoted).status == 200
    # It reads, never writes; the token itself is no cookie; an expired one (signed right) is refused.
    assert (
        request(
            gate_guarded.port, "POST", "/judgements", JUDGEMENT, {**jar, "Content-Type": "application/json"}
        ).status
        == 401
    )
    assert (
        request(
            gate_guarded.port, "GET", "/status", headers={"Cookie": f"dispatchq_token={GATE_TOKEN}"}
        ).status
        == 401
    )
    past = before - 10
    stale = hmac.new(
        GATE_TOKEN.encode(),
        f"dispatchq read-only page cookie v2:{past}.{login_id}".encode(),
        hashlib.sha256,
    )
    expired = {"Cookie": f"dispatchq_token={past}.{login_id}.{stale.hexdigest()}"}
    assert request(gate_guarded.port, "GET", "/status", headers=expired).status == 401
    forged = {"Cookie": f"dispatchq_token={expires + 3600}.{login_id}.{mac}"}
    assert request(gate_guarded.port, "GET", "/status", headers=forged).status == 401
    # The base64 token works as a Bearer token too.
    assert request(gate_guarded.port, "GET", "/status", headers=AUTH).status == 200


def test_the_cookie_is_secure_when_the_browser_came_by_a_public_name(gate_guarded: Server) -> None:
    reply = login(
        gate_guarded, Host=GATE_PUBLIC, Origin=f"https://{GATE_PUBLIC}", **from_peer("198.51.100.1")
    )
    assert reply.status == 303, reply.body
    attributes = [part.strip().lower() for part in reply.headers["set-cookie"].split(";")]
    assert "secure" in attributes


def test_a_login_from_another_site_or_not_a_form_is_refused(gate_guarded: Server) -> None:
    evil = login(gate_guarded, Origin="https://evil.example", **from_peer("198.51.100.2"))
    assert evil.status == 403 and "set-cookie" not in evil.headers
    as_json = request(
        gate_guarded.port,
        "POST",
        "/login",
        json.dumps({"token": GATE_TOKEN}).encode(),
        {"Content-Type": "application/json", **from_peer("198.51.100.2")},
    )
    assert as_json.status == 415 and "application/x-www-form-urlencoded" in as_json.json["error"]
    crowded = request(gate_guarded.port, "POST", "/login", b"a=1&b=2&c=3&d=4&e=5&token=x", FORM)
    assert crowded.status == 400  # more fields than the form has: said, not a 500


def test_failed_logins_are_throttled_per_peer(gate_guarded: Server) -> None:
    attacker = from_peer("192.0.2.50")
    for attempt in range(5):
        assert login(gate_guarded, f"guess-{attempt}", **attacker).status == 401, attempt
    throttled = login(gate_guarded, "guess-5", **attacker)
    assert throttled.status == 429
    wait = int(throttled.headers["retry-after"])
    assert 1 <= wait <= 60 and "192.0.2.50" in throttled.body.decode()
    # Only failures are throttled: the right token still logs in from the throttled peer.
    assert login(gate_guarded, GATE_TOKEN, **attacker).status == 303
    # Another peer is not held back by this one, and the proxy's own address is not the peer.
    assert login(gate_guarded, "guess", **from_peer("192.0.2.51")).status == 401
    # X-Forwarded-For's first entries are the client's own word: changing them changes nothing.
    spoofed = {"X-Forwarded-For": "192.0.2.77, 192.0.2.50"}
    assert login(gate_guarded, "guess-6", **spoofed).status == 429


# --- headers on every answer ---------------------------------------------------------------


def test_the_security_headers_are_on_every_route(opened: Server, gate_guarded: Server) -> None:
    def check(reply: Reply, what: str) -> None:
        for name, wanted in HEADERS.items():
            assert wanted in reply.headers.get(name, ""), (what, name, reply.status)

    for path in (
        "/",
        "/static/index.html",
        "/static/page.js",
        "/status",
        "/metrics",
        "/healthz",
        "/judgements/ffffffffffffffff",
        "/no-such-route",
    ):
        check(request(opened.port, "GET", path), path)
        check(request(gate_guarded.port, "GET", path), f"{path} without the token")
        check(request(gate_guarded.port, "GET", path, headers=AUTH), f"{path} with the token")
    check(request(opened.port, "GET", "/status", headers={"Host": "evil.example"}), "a forged Host")
    check(request(opened.port, "POST", "/judgements", b"x", {"Content-Type": "text/plain"}), "a 415")
    check(request(opened.port, "POST", "/judgements", b"x", {"Origin": "https://evil.example"}), "a 403")
    check(
        request(opened.port, "POST", "/judgements", JUDGEMENT, {"Content-Type": "application/json"}),
        "a write",
    )
    check(login(gate_guarded, "wrong", **from_peer("198.51.100.3")), "the login form")
    static = request(opened.port, "GET", "/static/index.html")
    assert static.status == 200 and "script-src 'self'" in static.headers["content-security-policy"]


# --- the webhook route keeps its own rule --------------------------------------------------


def test_the_webhook_route_answers_by_its_signature_not_by_origin(opened: Server) -> None:
    body = b'{"zen": "Keep it logically awesome.", "hook_id": 1}'
    headers = {
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "d-gate-ping",
        "X-Hub-Signature-256": sign(body),
        "Origin": "https://evil.example",
        "Sec-Fetch-Site": "cross-site",
        "Content-Type": "application/json",
    }
    assert request(opened.port, "POST", "/webhooks/github", body, headers).status == 200
    unsigned = {**headers, "X-Hub-Signature-256": sign(body, "not the secret")}
    assert request(opened.port, "POST", "/webhooks/github", body, unsigned).status == 401


# --- the access log ------------------------------------------------------------------------


def test_writes_are_logged_with_the_peer_route_status_and_count(opened: Server, gate_guarded: Server) -> None:
    lines = b"\n".join(json.dumps({"kind": "echo", "target": f"acme/log#{i}"}).encode() for i in range(3))
    posted = request(
        opened.port, "POST", "/judgements", lines + b"\n{bad", {"Content-Type": "application/x-ndjson"}
    )
    assert posted.status == 207
    request(opened.port, "GET", "/status?marker=read")
    request(opened.port, "POST", "/judgements", b"x", {"Content-Type": "text/plain"})
    time.sleep(0.5)  # the line is written after the answer is sent
    assert log_lines(opened, r"access 127\.0\.0\.1 POST /judgements 207 judgements=3$")
    assert log_lines(opened, r"access 127\.0\.0\.1 POST /judgements 415$")
    assert not log_lines(opened, r" GET /status")  # reads are off by default

    # Behind the trusted proxy: the address it saw; with DISPATCHQ_SERVE_ACCESS_LOG=all, reads too.
    proxied = from_peer("198.51.100.20", Host=GATE_PUBLIC, **AUTH, **{"Content-Type": "application/json"})
    assert request(gate_guarded.port, "POST", "/judgements", JUDGEMENT, proxied).status == 200
    assert (
        request(gate_guarded.port, "GET", "/status", headers=from_peer("198.51.100.21", **AUTH)).status == 200
    )
    request(gate_guarded.port, "GET", "/status%0a127.0.0.1%20POST%20/judgements%20200", headers=AUTH)
    time.sleep(0.5)
    assert log_lines(gate_guarded, r"access 198\.51\.100\.20 POST /judgements 200 judgements=1$")
    assert log_lines(gate_guarded, r"access 198\.51\.100\.21 GET /status 200$")
    assert not log_lines(gate_guarded, r"203\.0\.113\.99")  # the client's own word is never the peer
    assert log_lines(
        gate_guarded, r"access 127\.0\.0\.1 GET /status\\n127\.0\.0\.1 POST /judgements 200 404$"
    )
    assert not log_lines(gate_guarded, r"^127\.0\.0\.1 POST /judgements 200")  # no forged line from a path


# --- start-time refusals -------------------------------------------------------------------


def refused_at_start(env: dict[str, str], *args: str) -> str:
    done = run_cli(["serve", "--port", str(free_port()), *args], env, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_short_token_is_refused_at_start(open_env: dict[str, str]) -> None:
    line = refused_at_start({**open_env, "DISPATCHQ_API_TOKEN": "x" * 31})
    assert "DISPATCHQ_API_TOKEN is 31 characters" in line and "32" in line and "x" * 31 not in line


def test_a_host_beyond_loopback_needs_allowed_hosts(open_env: dict[str, str]) -> None:
    env = {**open_env, "DISPATCHQ_API_TOKEN": GATE_TOKEN}
    line = refused_at_start(env, "--host", "0.0.0.0")
    assert line.startswith("error: --host 0.0.0.0") and "DISPATCHQ_SERVE_ALLOWED_HOSTS" in line
    for bad in ("*", "evil*.example", "example.com:8484"):
        line = refused_at_start({**env, "DISPATCHQ_SERVE_ALLOWED_HOSTS": bad})
        assert "DISPATCHQ_SERVE_ALLOWED_HOSTS" in line or "serve_allowed_hosts" in line, line
    line = refused_at_start({**env, "DISPATCHQ_SERVE_TRUSTED_PROXIES": "proxy.example"})
    assert "proxy.example" in line


def test_the_serve_logs_hold_no_traceback(open_server: Server, gate_token_server: Server) -> None:
    """Last in the module: every refusal above was an answer, never an exception."""
    for server in (open_server, gate_token_server):
        text = server.log.read_text(errors="replace")
        assert "Traceback" not in text and "Exception in ASGI" not in text, text[-3000:]
        assert " POST /" in text  # the log is the server's, and it was written to
