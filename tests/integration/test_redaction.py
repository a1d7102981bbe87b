"""Every place a Redis URL is shown hides its secrets: `?password=`, the userinfo, the sentinels'.

Real processes throughout: a running `dispatchq serve` read over HTTP (`/status`, which
the page's header prints, and the page itself), `dispatchq settings` and `dispatchq
status` (text and JSON), and the outage lines and waiting note of a worker that cannot
reach its sentinels.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import counting_check, run_cli, wait_for
from tests.support.serve import Server, free_port, module_env, request

SENTINEL_PASSWORD = "sentinel-pw-5d1e0c"
PRIMARY_PASSWORD = "primary-pw-9a7b3f"


def _query_url(redis_server: Any) -> tuple[str, str]:
    """The test server as `unix:///socket?password=…` (redis-py reads the query), and its password."""
    redis_server.url()  # makes the password if no start did yet
    password = redis_server.password()
    assert password
    return f"unix://{redis_server.socket_path}?password={password}&db=0", password


def _sentinel_url() -> str:
    """Two sentinels nobody runs (free ports): every command meets an outage, never a login."""
    return f"redis+sentinel://dq:{PRIMARY_PASSWORD}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/svc"


def test_status_and_the_page_of_a_running_serve_never_show_the_password(
    redis_server: Any, redis_client: Any, tmp_path: Path
) -> None:
    url, password = _query_url(redis_server)
    check, _ = counting_check(tmp_path, answer="'ok'")
    env = module_env(redis_server, tmp_path, check, DISPATCHQ_REDIS_URL=url)
    with Server(env, tmp_path) as server:
        status = request(server.port, "GET", "/status")
        page = request(server.port, "GET", "/")
        script = request(server.port, "GET", "/static/page.js")
        output = server.output
    assert status.status == 200, status.body
    assert status.json["redis"] == f"unix://{redis_server.socket_path}?password=***&db=0"
    assert password.encode() not in status.body
    assert page.status == 200 and password.encode() not in page.body
    # The page's header is `/status`'s own `redis` field, printed as it came.
    assert script.status == 200 and b"data.redis" in script.body
    assert password not in output and "Traceback" not in output


def test_settings_and_status_redact_a_query_password(redis_server: Any, dq_env: dict[str, str]) -> None:
    url, password = _query_url(redis_server)
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url, "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD}
    shown = f"unix://{redis_server.socket_path}?password=***&db=0"
    for args in (["settings"], ["settings", "--json"], ["status"], ["status", "--json"], ["redis", "status"]):
        done = run_cli(args, env)
        assert done.returncode == 0, (args, done.stderr)
        both = done.stdout + done.stderr
        assert password not in both and SENTINEL_PASSWORD not in both, args
        # The settings table wraps long values across lines; the others print the URL whole.
        assert ("***" if args == ["settings"] else shown) in both, (args, both[:3000])
    listing = json.loads(run_cli(["settings", "--json"], env).stdout)
    assert listing["DISPATCHQ_REDIS_SENTINEL_PASSWORD"]["value"] == "**********"


def test_a_sentinel_url_is_redacted_in_settings_and_in_status_s_refusal(dq_env: dict[str, str]) -> None:
    url = _sentinel_url()
    env = {**dq_env, "DISPATCHQ_REDIS_URL": url, "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD}
    shown = url.replace(PRIMARY_PASSWORD, "***")
    listing = run_cli(["settings", "--json"], env)
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout)["DISPATCHQ_REDIS_URL"]["value"] == shown
    refused = run_cli(["status"], env)
    assert refused.returncode != 0
    (line,) = refused.stderr.strip().splitlines()
    assert line == f"error: cannot reach Redis at {shown}: no sentinel answers"
    for done in (listing, refused):
        both = done.stdout + done.stderr
        assert PRIMARY_PASSWORD not in both and SENTINEL_PASSWORD not in both


@pytest.mark.parametrize("form", ["sentinel", "query"])
def test_a_waiting_worker_s_outage_lines_and_note_are_redacted(
    dq_env: dict[str, str], tmp_path: Path, form: str
) -> None:
    if form == "sentinel":
        url = _sentinel_url()
        shown = url.replace(PRIMARY_PASSWORD, "***")
    else:
        url = f"redis://127.0.0.1:{free_port()}/0?password={PRIMARY_PASSWORD}"
        shown = url.replace(PRIMARY_PASSWORD, "***")
    (tmp_path / "dispatchq.yaml").write_text("kinds: {}\n")
    env = {
        **dq_env,
        "DISPATCHQ_REDIS_URL": url,
        "DISPATCHQ_REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "DISPATCHQ_DATA_DIR": str(tmp_path / "data"),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as handle:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dispatchq.cli", "worker", "code"],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "retrying in" in log.read_text(), timeout=60, what="the worker's outage line")
        status = wait_for(
            lambda: (done := run_cli(["status"], env)).stderr.startswith("waiting for Redis here") and done,
            timeout=30,
            what="status naming the waiting worker",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    lines = log.read_text()
    assert f"at {shown}" in lines, lines
    assert f"Redis unreachable at {shown}" in status.stderr, status.stderr
    for text in (lines, status.stdout + status.stderr):
        assert PRIMARY_PASSWORD not in text and SENTINEL_PASSWORD not in text
        assert "Traceback" not in text
    notes = list((tmp_path / "data").rglob("*.json"))
    for note in notes:
        assert PRIMARY_PASSWORD not in note.read_text()
