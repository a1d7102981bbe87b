"""`python3 ops/dev.py stack` brings the whole Procfile up as pasted, and takes it down again.

A real run: honcho starts a worker per tier, the scheduler and serve on the example config
with the stand-in session and a data dir of the stack's own; a judgement enqueued from
another shell is answered; Ctrl-C (SIGINT to honcho's group) stops every process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dispatchq.settings import parent_environment
from tests.support.helpers import REPO, wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_stack_comes_up_answers_and_goes_down(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "stack-data"
    env = {k: v for k, v in parent_environment().items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env["DISPATCHQ_SERVE_PORT"] = str(port)
    log = (tmp_path / "stack.log").open("wb")
    stack = subprocess.Popen(
        [sys.executable, str(REPO / "ops" / "dev.py"), "stack", "--data", str(data)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group, as a terminal's Ctrl-C reaches it
    )
    try:
        wait_for(lambda: _healthy(port), timeout=90, what="the stack's serve to answer /healthz")
        # What the stack prints for another shell: its data dir and the example config.
        shell = {
            **env,
            "DISPATCHQ_DATA_DIR": str(data.resolve()),
            "DISPATCHQ_CONFIG": str(REPO / "examples" / "dispatchq.yaml"),
        }
        line = json.dumps(
            {"kind": "lockfile-conflict", "target": "acme/app#1", "state": {"conflicts": ["uv.lock"]}}
        )
        enqueue = [sys.executable, "-m", "dispatchq.cli", "enqueue", "-"]
        added = subprocess.run(
            enqueue, env=shell, input=line + "\n", capture_output=True, text=True, timeout=60
        )
        assert added.returncode == 0, added.stderr
        jid = added.stdout.split("\t")[1].strip()

        def answered() -> bool:
            shown = subprocess.run(
                [sys.executable, "-m", "dispatchq.cli", "result", jid, "--json"],
                env=shell,
                capture_output=True,
                text=True,
                timeout=60,
            )
            return shown.returncode == 0 and json.loads(shown.stdout)["status"] == "answered"

        wait_for(answered, timeout=60, what="the stack's code worker to answer")
        status = subprocess.run(
            [sys.executable, "-m", "dispatchq.cli", "status", "--json"],
            env=shell,
            capture_output=True,
            text=True,
            timeout=60,
        )
        workers = json.loads(status.stdout)["workers"]
        assert workers["code"] >= 1 and workers["typed"] >= 1 and workers["session"] >= 1, workers
        children = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-g", str(stack.pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        assert len(children) >= 6, children  # honcho, a worker per tier, the scheduler, serve
    finally:
        os.killpg(stack.pid, signal.SIGINT)
        stack.wait(timeout=60)
        log.close()
    out = (tmp_path / "stack.log").read_text(errors="replace")
    assert "Traceback" not in out, out[-4000:]
    assert "embedded Redis stopped" in out, out[-4000:]
    # Bounded, not timed: on a loaded machine (the whole suite on two cores) a worker's warm
    # shutdown can take most of a minute.
    deadline = time.monotonic() + 90
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in children if _alive(p)], out[-4000:]
    assert not _healthy(port)
