"""`dispatchq serve revoke-logins`: every page login ends at once, on a server that keeps running.

The server is `create_app` served in-process over the test's Redis (`tests.support.logins`);
the command is the real CLI in a subprocess, as an operator runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.helpers import run_cli
from tests.support.logins import LOGINS_TOKEN, Client, app_serving, cookie_of, login_body, write_logins_config

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_revoke_logins_ends_every_login_and_says_how_many(
    make_runtime: Any, dq_env: dict[str, str], tmp_path: Path
) -> None:
    write_logins_config(tmp_path)
    rt = make_runtime(DISPATCHQ_API_TOKEN=LOGINS_TOKEN)
    with app_serving(rt) as port, Client(port) as client:
        cookies = []
        for _ in range(2):
            reply = client.request("POST", "/login", login_body(LOGINS_TOKEN), FORM)
            assert reply.status == 303, reply.body
            cookies.append(cookie_of(reply, "dispatchq_token")[0])
        for value in cookies:
            assert (
                client.request("GET", "/status", headers={"Cookie": f"dispatchq_token={value}"}).status == 200
            )

        done = run_cli(["serve", "revoke-logins", "--json"], dq_env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"revoked": 2}
        for value in cookies:
            assert (
                client.request("GET", "/status", headers={"Cookie": f"dispatchq_token={value}"}).status == 401
            )
        # The token itself is untouched, and a new login works at once.
        auth = {"Authorization": f"Bearer {LOGINS_TOKEN}"}
        assert client.request("GET", "/status", headers=auth).status == 200
        again = client.request("POST", "/login", login_body(LOGINS_TOKEN), FORM)
        fresh = cookie_of(again, "dispatchq_token")[0]
        assert client.request("GET", "/status", headers={"Cookie": f"dispatchq_token={fresh}"}).status == 200

    said = run_cli(["serve", "revoke-logins"], dq_env)
    assert said.returncode == 0 and said.stdout.startswith("1 page login(s) ended"), said.stdout
    assert json.loads(run_cli(["serve", "revoke-logins", "--json"], dq_env).stdout) == {"revoked": 0}
