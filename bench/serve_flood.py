"""`dispatchq serve` under a flood of idle connections and slow webhook bodies, against a plain server.

    python3 ops/dev.py bench serve-flood
    .venv/bin/python bench/serve_flood.py          # the same, alone

- flood: 1,000 connections opened from 127.0.0.1 and held without a byte sent; then from
  127.0.0.2 `/healthz`, a signed webhook delivery and `GET /status` with the bearer token,
  five times each. Target: every answer 2xx within 1 s.
- slow bodies: 256 webhook deliveries of 5 MB each, sent from 8 loopback addresses (32 each,
  the default per-client cap) and held one byte short of their end. Target: the serve
  process's RSS under 300 MB while they are in flight.

The plain alternative, in the same run: a Starlette app under uvicorn as most webhook
receivers are written (`limit_concurrency` 256, `await request.body()` then the HMAC), with
the same flood and the same slow bodies. A missed target exits 1. Timing lives here.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, github_signature, stop_server  # noqa: E402
from dispatchq.storage.connection import EmbeddedRedis  # noqa: E402

__all__ = ["run_serve_flood"]

PY = sys.executable
SECRET = "bench-flood-webhook-secret-0123456789abcdef"
TOKEN = "bench-flood-api-token-0123456789abcdefABCDEF"
FLOOD = 1000
SLOW = 256
BODY = 5 * 1024 * 1024
SOURCES = [f"127.0.1.{n}" for n in range(1, 9)]  # 8 clients of 32 bodies each
TARGET_SECONDS = 1.0
TARGET_RSS_MB = 300

PLAIN = r"""
import hashlib, hmac, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

SECRET = sys.argv[2].encode()

async def healthz(request):
    return JSONResponse({"ok": True})

async def status(request):
    return JSONResponse({"ok": True})

async def hook(request):
    body = await request.body()
    wanted = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(wanted, request.headers.get("x-hub-signature-256", "")):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    return JSONResponse({"ping": "pong"})

app = Starlette(routes=[
    Route("/healthz", healthz), Route("/status", status),
    Route("/webhooks/github", hook, methods=["POST"]),
])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="critical", access_log=False,
            limit_concurrency=256, timeout_keep_alive=5)
"""

CONFIG = """\
triage:
  mode: shadow
  executor: recording
  questions:
    needs_repro: {type: noul, instructions: "Does the issue lack steps to reproduce?"}
  rules:
    - id: needs-repro
      events: [issues.opened]
      if: 'needs_repro >= 0.8'
      state: [issue.title]
      actions:
        - {op: label.add, label: needs-repro}
"""


def _request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, float]:
    """(status, seconds) of one request from 127.0.0.2 on a new connection; status 0 if it failed."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=("127.0.0.2", 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - started


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server on port {port} exited {proc.returncode}")
        if _request(port, "GET", "/healthz")[0] == 200:
            return
        time.sleep(0.1)
    raise SystemExit(f"the server on port {port} did not come up")


def _rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _flood(port: int) -> dict[str, Any]:
    """1,000 silent connections from 127.0.0.1, then the three probes from 127.0.0.2, five times."""
    held: list[socket.socket] = []
    ping = json.dumps({"zen": "Speak like a human.", "hook_id": 1}).encode()
    hook = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": "flood-ping",
        "X-Hub-Signature-256": github_signature(SECRET, ping),
    }
    probes = {
        "healthz": ("GET", "/healthz", None, {}),
        "webhook": ("POST", "/webhooks/github", ping, hook),
        "status": ("GET", "/status", None, {"Authorization": f"Bearer {TOKEN}"}),
    }
    try:
        for _ in range(FLOOD):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        time.sleep(0.5)
        answers: dict[str, list[tuple[int, float]]] = {name: [] for name in probes}
        for _ in range(5):
            for name, (method, path, body, headers) in probes.items():
                answers[name].append(_request(port, method, path, body, headers))
        closed = 0
        for sock in held:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
    finally:
        for sock in held:
            sock.close()
    return {
        "opened": len(held),
        "closed_by_server_at_once": closed,
        **{
            name: {
                "statuses": sorted({status for status, _ in got}),
                "worst_s": round(max(seconds for _, seconds in got), 3),
            }
            for name, got in answers.items()
        },
    }


def _slow_bodies(port: int, pid: int) -> dict[str, Any]:
    """256 deliveries of 5 MB held one byte short, from 8 addresses: the server's RSS meanwhile."""
    body = json.dumps({"zen": "x", "hook_id": 2, "pad": "p" * (BODY - 40)}).encode()
    head = (
        "POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "X-GitHub-Event: ping\r\nX-GitHub-Delivery: slow\r\n"
        f"X-Hub-Signature-256: {github_signature(SECRET, body)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = _rss_mb(pid)[0]
    held: list[socket.socket] = []
    refused = 0
    started = time.perf_counter()
    try:
        for n in range(SLOW):
            sock = socket.create_connection(
                ("127.0.0.1", port), timeout=60, source_address=(SOURCES[n % len(SOURCES)], 0)
            )
            try:
                sock.sendall(head + body[:-1])
            except OSError:  # refused mid-body (a plain server's limit): not in flight
                refused += 1
                sock.close()
                continue
            held.append(sock)
        time.sleep(2)  # the server takes in what the kernel still holds
        rss, peak = _rss_mb(pid)
        # Still in flight: none answered (a refusal would have been sent and the socket closed).
        answered = 0
        for sock in held:
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)  # an answer, or the end of a closed connection
                answered += 1
            except BlockingIOError:
                pass
            except OSError:
                answered += 1
    finally:
        for sock in held:
            sock.close()
    return {
        "bodies": len(held),
        "refused_while_sent": refused,
        "answered_early": answered,
        "send_s": round(time.perf_counter() - started, 1),
        "rss_before_mb": round(before),
        "rss_in_flight_mb": round(rss),
        "rss_peak_mb": round(peak),
    }


def run_serve_flood() -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    workdir = Path(tempfile.mkdtemp(prefix="dq-bench-flood-"))
    redis = EmbeddedRedis(workdir / "redis")
    redis.ensure_running()
    (workdir / "dispatchq.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_DATA_DIR=str(redis.data_dir),
        DISPATCHQ_CONFIG=str(workdir / "dispatchq.yaml"),
        DISPATCHQ_CHECKOUT_ROOTS=str(workdir),
        DISPATCHQ_GITHUB_WEBHOOK_SECRET=SECRET,
        DISPATCHQ_API_TOKEN=TOKEN,
        DISPATCHQ_SERVE_BODY_TIMEOUT="120",  # 1.3 GB through one loopback client: time to send it all
        PYTHONPATH=str(ROOT),
    )
    result: dict[str, Any] = {}
    try:
        for side in ("dispatchq", "plain"):
            port = free_port()
            command = (
                [PY, "-m", "dispatchq.cli", "serve", "--port", str(port)]
                if side == "dispatchq"
                else [PY, "-c", PLAIN, str(port), SECRET]
            )
            proc = subprocess.Popen(command, env=env, cwd=ROOT, stderr=subprocess.DEVNULL)
            try:
                _wait_up(port, proc)
                print(f"serve-flood: {side}", file=sys.stderr, flush=True)
                flood = _flood(port)
                time.sleep(1)
                result[side] = {"flood": flood, "slow_bodies": _slow_bodies(port, proc.pid)}
            finally:
                stop_server(proc)
    finally:
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    ours = result["dispatchq"]
    probes_ok = all(
        ours["flood"][name]["statuses"] == [200] and ours["flood"][name]["worst_s"] <= TARGET_SECONDS
        for name in ("healthz", "webhook", "status")
    )
    rss_ok = ours["slow_bodies"]["rss_in_flight_mb"] < TARGET_RSS_MB and ours["slow_bodies"]["bodies"] == SLOW
    result["targets"] = {
        f"probes 200 within {TARGET_SECONDS:g} s under {FLOOD} idle connections": probes_ok,
        f"RSS < {TARGET_RSS_MB} MB with {SLOW} x 5 MB bodies in flight": rss_ok,
    }
    result["met"] = probes_ok and rss_ok
    return result


if __name__ == "__main__":
    outcome = run_serve_flood()
    print(json.dumps(outcome, indent=2))
    sys.exit(0 if outcome["met"] else 1)
