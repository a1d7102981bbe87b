"""Signed GitHub deliveries per second through `dispatchq serve`, against a bare endpoint.

    python3 ops/dev.py bench webhooks              # 7 rounds of 1,000 deliveries per side
    python3 ops/dev.py bench webhooks -n 500 --rounds 11

- dispatchq: a real `dispatchq serve` process (uvicorn, its own embedded Redis) takes N
  distinct signed `issues.opened` deliveries, each verified, mapped, recorded in Redis and
  queued for a typed worker: counted only once it answered 202 and, at the end, the
  typed queue's jobs name every delivery (end to end, to an enqueued judgement).
- bare: a Starlette app under the same uvicorn that only checks X-Hub-Signature-256
  (hmac, constant time) and answers 202: the floor of any webhook receiver in Python.
- bursts: 50, 100 and 200 deliveries at once, each on a new connection, against the
  default `DISPATCHQ_SERVE_CONCURRENCY`: the peak of connections open together and how
  many were refused 503 (the limit must sit above the peak).

dispatchq's side runs with every bound of issue 22 on its hot path (the body's deadline
and size, the header deadline, the body hash de-duplication, the depth walk).

Both sides get the same bodies from the same client (CLIENTS keep-alive connections in
threads), on loopback, taking turns round by round. The ratio is the median of the
rounds' paired ratios (dispatchq's round over the bare round just before it): on a shared
2-core machine the bare side alone moved 1,700-2,800/s between rounds, and pairing
keeps such a drift out of the comparison. The medians of each side are shown too.
Target: dispatchq >= 0.5x the bare endpoint. Timing lives here.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port, github_signature, stop_server, timed_clients  # noqa: E402
from dispatchq.queue.entrypoints import DispatchqQueue  # noqa: E402
from dispatchq.storage import keys  # noqa: E402
from dispatchq.storage.connection import EmbeddedRedis  # noqa: E402

__all__ = ["run_webhooks"]

PY = sys.executable
SECRET = "bench-webhook-secret-0123456789abcdef"  # serve refuses one under 32 characters
CLIENTS = 8
#: Bursts of simultaneous deliveries, each on a new connection, against the default limit.
BURSTS = (50, 100, 200)
EXAMPLE = ROOT.parent / "shared" / "github-webhooks" / "issues" / "opened.payload.json"

BARE = r"""
import hashlib, hmac, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

SECRET = sys.argv[2].encode()

async def hook(request):
    body = await request.body()
    wanted = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(wanted, request.headers.get("x-hub-signature-256", "")):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    return JSONResponse({"delivery": request.headers.get("x-github-delivery")}, status_code=202)

app = Starlette(routes=[Route("/webhooks/github", hook, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
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
      state: [issue.title, issue.body, issue.labels]
      actions:
        - {op: label.add, label: needs-repro}
"""


def _bodies(n: int, first: int = 1) -> list[tuple[str, bytes, str]]:
    """N distinct deliveries (issue numbers from `first`) of GitHub's example, or a stand-in.

    Distinct bodies, not only distinct ids: a body seen before is a replay (answered 200).
    """
    if EXAMPLE.is_file():
        base: dict[str, Any] = json.loads(EXAMPLE.read_text())
    else:
        base = {
            "action": "opened",
            "issue": {"number": 1, "title": "t", "body": "b" * 2000, "labels": []},
            "repository": {"full_name": "acme/app", "default_branch": "main"},
            "sender": {"login": "octo"},
        }
    out = []
    for i in range(n):
        payload = {**base, "issue": {**base["issue"], "number": first + i}}
        body = json.dumps(payload).encode()
        signature = github_signature(SECRET, body)
        out.append((f"bench-{i}", body, signature))
    return out


def _wait_up(port: int, proc: subprocess.Popen[bytes], path: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode} before answering")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not answer within 60 s")


def _load(port: int, deliveries: list[tuple[str, bytes, str]]) -> tuple[float, int]:
    """Post every delivery from CLIENTS threads; (seconds, how many answered 202)."""
    accepted = [0] * CLIENTS
    errors: list[str] = []

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for delivery, body, signature in deliveries[k::CLIENTS]:
            headers = {
                "Content-Type": "application/json",
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": signature,
            }
            conn.request("POST", "/webhooks/github", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status == 202:
                accepted[k] += 1
            elif len(errors) < 3:
                errors.append(f"HTTP {response.status}")
        conn.close()

    elapsed = timed_clients(client, CLIENTS)
    if errors:
        print(f"  some deliveries were not accepted: {errors}", file=sys.stderr)
    return elapsed, sum(accepted)


def _burst(port: int, deliveries: list[tuple[str, bytes, str]]) -> dict[str, Any]:
    """Every delivery at once, each on its own new connection (as a bulk edit's burst arrives).

    What `DISPATCHQ_SERVE_CONCURRENCY` must stay above: how many connections the burst
    holds open at the server at once (the peak overlap of the clients' connect-to-answer
    spans), and how many were refused 503 at the default limit.
    """
    statuses: dict[int, int] = {}
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(deliveries))

    def one(delivery: str, body: bytes, signature: str) -> None:
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "issues",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature,
        }
        gate.wait()
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", "/webhooks/github", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except OSError:
            status = 0
        finally:
            conn.close()
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            spans.append((started, time.perf_counter()))

    threads = [threading.Thread(target=one, args=d) for d in deliveries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return {"size": len(deliveries), "statuses": statuses, "peak_open_connections": peak}


def run_webhooks(n: int, rounds: int = 7) -> dict[str, Any]:
    """Both servers up at once, taking turns (bare, dispatchq, bare, ...): medians of `rounds`.

    Taking turns keeps a load change on a shared machine from landing on one side only.
    """
    workdir = Path(tempfile.mkdtemp(prefix="dq-bench-webhooks-"))
    server = EmbeddedRedis(workdir / "redis")
    server.ensure_running()
    redis = server.client()
    (workdir / "dispatchq.yaml").write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCHQ_", "TYPESAFE_"))}
    env.update(
        DISPATCHQ_DATA_DIR=str(server.data_dir),
        DISPATCHQ_CONFIG=str(workdir / "dispatchq.yaml"),
        DISPATCHQ_CHECKOUT_ROOTS=str(workdir),
        DISPATCHQ_GITHUB_WEBHOOK_SECRET=SECRET,
        # One loopback client stands in for GitHub's many addresses: the per-client caps
        # (32 by default) would refuse its bursts, which measure the server-wide limit.
        DISPATCHQ_SERVE_PEER_CONNECTIONS="1000",
        DISPATCHQ_SERVE_PEER_REQUESTS="1000",
        PYTHONPATH=str(ROOT),
    )
    deliveries = _bodies(n * rounds)
    warm = [(f"warm-{d}", b, s) for d, b, s in _bodies(50, first=10_000_000)]
    queue = f"rq:queue:{keys.queue_name('typed')}"
    bare_rates: list[float] = []
    serve_rates: list[float] = []
    bare_ok = serve_ok = 0
    bare_port, serve_port = free_port(), free_port()
    bare = subprocess.Popen([PY, "-c", BARE, str(bare_port), SECRET], env=env, cwd=ROOT)
    serve = subprocess.Popen(
        [PY, "-m", "dispatchq.cli", "serve", "--port", str(serve_port)],
        env=env,
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_up(bare_port, bare, "/")
        _wait_up(serve_port, serve, "/healthz")
        _load(bare_port, warm)
        _load(serve_port, warm)
        redis.delete(queue)
        for r in range(rounds):
            chunk = deliveries[r * n : (r + 1) * n]
            seconds, ok = _load(bare_port, chunk)
            bare_rates.append(ok / seconds)
            bare_ok += ok
            seconds, ok = _load(serve_port, chunk)
            serve_rates.append(ok / seconds)
            serve_ok += ok
        jobs = DispatchqQueue(keys.queue_name("typed"), connection=redis).get_jobs()
        enqueued = len({delivery for job in jobs for delivery in job.args[0]})
        # How many deliveries each accept call carried: what group commit bought.
        accept_calls = int(redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        bursts = [
            _burst(
                serve_port,
                [(f"burst{size}-{d}", b, sig) for d, b, sig in _bodies(size, first=20_000_000 + 1000 * size)],
            )
            for size in BURSTS
        ]
    finally:
        stop_server(bare)
        stop_server(serve)
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    bare_rate = statistics.median(bare_rates)
    serve_rate = statistics.median(serve_rates)
    return {
        "deliveries_per_round": n,
        "rounds": rounds,
        "payload_bytes": len(deliveries[0][1]),
        "clients": CLIENTS,
        "bare_accepted": bare_ok,
        "bare_per_second_median": round(bare_rate, 1),
        "bare_per_second_rounds": [round(x, 1) for x in bare_rates],
        "dispatchq_accepted": serve_ok,
        "dispatchq_deliveries_queued": enqueued,
        "dispatchq_jobs": len(jobs),
        "dispatchq_accept_calls": accept_calls,
        "dispatchq_deliveries_per_call": round((serve_ok + len(warm)) / accept_calls, 2)
        if accept_calls
        else None,
        "dispatchq_per_second_median": round(serve_rate, 1),
        "dispatchq_per_second_rounds": [round(x, 1) for x in serve_rates],
        "ratio": round(statistics.median(d / b for d, b in zip(serve_rates, bare_rates, strict=True)), 3),
        "ratio_of_medians": round(serve_rate / bare_rate, 3),
        "target_ratio": 0.5,
        "bursts_at_default_limit_concurrency": bursts,
    }


if __name__ == "__main__":
    print(json.dumps(run_webhooks(int(sys.argv[1]) if len(sys.argv) > 1 else 1000), indent=2))
