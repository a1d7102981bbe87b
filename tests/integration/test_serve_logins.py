"""Secrets and guesses on `dispatchq serve`: the webhook secret's length, the throttle on wrong
signatures, Bearer tokens and logins (which never holds back the right credential), and the
page's logins: a random id per login, kept in Redis, ended by `POST /logout` on every server of
the store, and `Secure` as the settings say.

The apps are `create_app` over their own runtimes, served in-process (`tests.support.logins`);
two of them over the test's Redis are two servers of one store. Peers are told apart through
X-Forwarded-For from the trusted proxy 127.0.0.1, as `test_serve_gate.py` does.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli
from tests.support.logins import LOGINS_TOKEN, Client, app_serving, cookie_of, login_body, write_logins_config
from tests.support.serve import SECRET, free_port, sign

AUTH = {"Authorization": f"Bearer {LOGINS_TOKEN}"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
PING = b'{"zen": "Design for failure.", "hook_id": 7}'
#: The gate's loopback proxy: X-Forwarded-For's last entry is the peer.
BEHIND_PROXY = {"DISPATCHQ_SERVE_TRUSTED_PROXIES": "127.0.0.1"}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    write_logins_config(tmp_path)
    return {"DISPATCHQ_API_TOKEN": LOGINS_TOKEN, "DISPATCHQ_GITHUB_WEBHOOK_SECRET": SECRET, **extra}


def _peer(address: str) -> dict[str, str]:
    return {"X-Forwarded-For": f"203.0.113.9, {address}"}


def _ping(signature: str, **headers: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "d-logins-ping",
        "X-Hub-Signature-256": signature,
        **headers,
    }


def _login(client: Client, token: str = LOGINS_TOKEN, **headers: str) -> Any:
    return client.request("POST", "/login", login_body(token), {**FORM, **headers})


def _jar(read: str, write: str | None = None) -> dict[str, str]:
    cookies = f"dispatchq_token={read}" + (f"; dispatchq_write={write}" if write else "")
    return {"Cookie": cookies}


# --- the webhook secret's length -----------------------------------------------------------


def test_a_five_character_webhook_secret_is_refused_at_start(dq_env: dict[str, str], tmp_path: Path) -> None:
    write_logins_config(tmp_path)
    env = {**dq_env, "DISPATCHQ_API_TOKEN": LOGINS_TOKEN, "DISPATCHQ_GITHUB_WEBHOOK_SECRET": "whsec"}
    done = run_cli(["serve", "--port", str(free_port())], env, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    line = lines[0]
    assert "DISPATCHQ_GITHUB_WEBHOOK_SECRET is 5 characters" in line and "32" in line
    assert "secrets.token_urlsafe(32)" in line and "whsec" not in line.split("is 5")[1]


# --- the throttle: failures only -----------------------------------------------------------


def test_a_thousand_wrong_signatures_are_throttled_and_the_right_one_still_passes(
    make_runtime: Any, tmp_path: Path
) -> None:
    rt = make_runtime(**_env(tmp_path, **BEHIND_PROXY))
    attacker = _peer("192.0.2.60")
    with app_serving(rt) as port, Client(port) as client:
        statuses: Counter[int] = Counter()
        right_during = []
        for guess in range(1000):
            reply = client.request(
                "POST", "/webhooks/github", PING, _ping(f"sha256={guess:064x}", **attacker)
            )
            statuses[reply.status] += 1
            if reply.status == 429:
                assert 1 <= int(reply.headers["retry-after"]) <= 60
            if guess in (10, 500):  # the right signature, from the throttled peer, mid-flood
                right_during.append(
                    client.request("POST", "/webhooks/github", PING, _ping(sign(PING), **attacker))
                )
        assert statuses == {401: 5, 429: 995}, statuses
        assert [reply.status for reply in right_during] == [200, 200]
        assert right_during[0].json["ping"] == "pong"
        after = client.request("POST", "/webhooks/github", PING, _ping(sign(PING), **attacker))
        assert after.status == 200, after.body
        # Another peer is not held back by this one.
        other = client.request(
            "POST", "/webhooks/github", PING, _ping("sha256=" + "0" * 64, **_peer("192.0.2.61"))
        )
        assert other.status == 401


def test_wrong_bearer_tokens_are_throttled_and_the_right_token_still_passes(
    make_runtime: Any, tmp_path: Path
) -> None:
    rt = make_runtime(**_env(tmp_path, **BEHIND_PROXY))
    attacker = _peer("192.0.2.70")
    with app_serving(rt) as port, Client(port) as client:
        statuses: Counter[int] = Counter()
        for guess in range(1000):
            reply = client.request(
                "GET", "/status", headers={"Authorization": f"Bearer guess-{guess}", **attacker}
            )
            statuses[reply.status] += 1
        assert statuses == {401: 5, 429: 995}, statuses
        throttled = client.request("GET", "/status", headers={"Authorization": "Bearer x", **attacker})
        assert throttled.status == 429 and "192.0.2.70" in throttled.json["error"]
        assert 1 <= int(throttled.headers["retry-after"]) <= 60
        assert client.request("GET", "/status", headers={**AUTH, **attacker}).status == 200
        # A request with no credential at all is no guess: it is asked for one, not throttled.
        assert client.request("GET", "/status", headers=_peer("192.0.2.71")).status == 401
        # The login form from the same peer is its own count, and the right token logs in.
        assert _login(client, **attacker).status == 303


def test_the_count_is_shared_by_every_server_of_the_store(make_runtime: Any, tmp_path: Path) -> None:
    env = _env(tmp_path, **BEHIND_PROXY)
    attacker = {"Authorization": "Bearer wrong", **_peer("192.0.2.80")}
    with (
        app_serving(make_runtime(**env)) as one,
        app_serving(make_runtime(**env)) as two,
        Client(one) as first,
        Client(two) as second,
    ):
        # Round robin over two servers: still five, not ten.
        replies = [(first if n % 2 else second).request("GET", "/status", headers=attacker) for n in range(8)]
        assert [reply.status for reply in replies] == [401] * 5 + [429] * 3


def test_failed_logins_are_throttled_but_the_right_token_logs_in(make_runtime: Any, tmp_path: Path) -> None:
    rt = make_runtime(**_env(tmp_path, **BEHIND_PROXY))
    attacker = _peer("192.0.2.90")
    with app_serving(rt) as port, Client(port) as client:
        assert [_login(client, f"guess-{n}", **attacker).status for n in range(7)] == [401] * 5 + [429] * 2
        assert _login(client, **attacker).status == 303


# --- the page's logins ---------------------------------------------------------------------


def test_logout_ends_a_login_on_every_server_of_the_store(make_runtime: Any, tmp_path: Path) -> None:
    env = _env(tmp_path)
    with (
        app_serving(make_runtime(**env)) as one,
        app_serving(make_runtime(**env)) as two,
        Client(one) as first,
        Client(two) as second,
    ):
        reply = _login(first)
        assert reply.status == 303, reply.body
        read, _ = cookie_of(reply, "dispatchq_token")
        write, _ = cookie_of(reply, "dispatchq_write")
        action = {
            **_jar(read, write),
            "Origin": f"http://127.0.0.1:{two}",
            "X-Dispatchq-Write": "1",
            "Content-Type": "application/json",
        }
        # The login opens both servers: reads with the read cookie, the page's actions with both.
        assert second.request("GET", "/status", headers=_jar(read)).status == 200
        unknown = second.request("POST", "/actions/judgements/ffffffffffffffff/retry", b"{}", action)
        assert unknown.status not in (401, 403), unknown.body

        out = first.request("POST", "/logout", headers=_jar(read, write))
        assert out.status == 303 and out.headers["x-dispatchq-logins-ended"] == "1"
        gone, attributes = cookie_of(out, "dispatchq_token")
        assert gone in ("", '""') and "max-age=0" in attributes

        for client in (first, second):
            assert client.request("GET", "/status", headers=_jar(read)).status == 401
        assert (
            second.request("POST", "/actions/judgements/ffffffffffffffff/retry", b"{}", action).status == 401
        )
        # A forged cookie ends nothing; another login is untouched by this one's logout.
        kept, _ = cookie_of(_login(second), "dispatchq_token")
        forged = read.rsplit(".", 1)[0] + "." + "0" * 64
        assert (
            first.request("POST", "/logout", headers=_jar(forged)).headers["x-dispatchq-logins-ended"] == "0"
        )
        assert first.request("GET", "/status", headers=_jar(kept)).status == 200


def test_two_logins_in_one_second_get_different_cookies(make_runtime: Any, tmp_path: Path) -> None:
    rt = make_runtime(**_env(tmp_path))
    with app_serving(rt) as port, Client(port) as client:
        cookies: dict[str, list[str]] = {}
        while not any(len(values) > 1 for values in cookies.values()):  # two in one expiry second
            value, _ = cookie_of(_login(client), "dispatchq_token")
            cookies.setdefault(value.split(".")[0], []).append(value)
        same_second = next(values for values in cookies.values() if len(values) > 1)
        assert same_second[0] != same_second[1]
        assert LOGINS_TOKEN not in "".join(same_second)
        # Each is its own login: ending one leaves the other.
        client.request("POST", "/logout", headers=_jar(same_second[0]))
        assert client.request("GET", "/status", headers=_jar(same_second[0])).status == 401
        assert client.request("GET", "/status", headers=_jar(same_second[1])).status == 200


def test_secure_is_decided_by_the_settings_not_the_host_header(make_runtime: Any, tmp_path: Path) -> None:
    public = "dispatchq.example.test"
    cases = [
        ({}, {}, False),  # loopback only, plain http: this machine's own
        ({}, {"Host": "127.0.0.1"}, False),
        (BEHIND_PROXY, {"Host": "127.0.0.1"}, True),  # a proxy in front: Secure whatever Host it forwards
        ({"DISPATCHQ_SERVE_ALLOWED_HOSTS": public}, {"Host": "127.0.0.1"}, True),
        ({"DISPATCHQ_SERVE_PUBLIC_URL": f"https://{public}"}, {"Host": "127.0.0.1"}, True),
        (
            {"DISPATCHQ_SERVE_PUBLIC_URL": f"http://{public}", "DISPATCHQ_SERVE_ALLOWED_HOSTS": public},
            {"Host": public},
            False,
        ),
    ]
    for settings, headers, secure in cases:
        rt = make_runtime(**_env(tmp_path, **settings))
        with app_serving(rt) as port, Client(port) as client:
            reply = _login(client, **headers)
            assert reply.status == 303, (settings, reply.body)
            for name in ("dispatchq_token", "dispatchq_write"):
                _, attributes = cookie_of(reply, name)
                assert ("secure" in attributes) is secure, (settings, headers, attributes)
                assert "httponly" in attributes and "samesite=strict" in attributes


def test_a_public_url_that_is_not_http_is_refused(dq_env: dict[str, str]) -> None:
    for url in ("ftp://x.example", "dispatchq.example.test"):
        done = run_cli(["serve", "--port", str(free_port())], {**dq_env, "DISPATCHQ_SERVE_PUBLIC_URL": url})
        assert done.returncode == 2 and url in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
