"""Enqueue at Redis speed: `dispatchq enqueue -` and `POST /judgements` against raw pipelined
writes of the same records, and batch enqueue against RQ's `Queue.enqueue`, in one run.

    python3 ops/dev.py bench enqueue                  # N = 20,000, 3 rounds
    python3 ops/dev.py bench enqueue -n 50000 --repeat 5

Four sides on the run's one Redis server, taking turns round by round (the store is emptied
before each side, so every side writes N new judgements into the same empty server):

- raw: a Python process (redis-py and hiredis, nothing of dispatchq imported) writing N
  records by plain pipelines of `WRITE_CHUNK` records each. What it writes is not written out
  here: it is read from the server. One judgement is first enqueued through `dispatchq enqueue
  -` on an empty store; every key that then names its id is found (`store_writes`): its record
  (a hash: HSET of every field), the sets and sorted sets holding it (SADD, ZADD with the same
  score), strings whose name or value holds it (SET, such as the content key's). The raw side
  repeats each of those writes per record with a fresh id and a fresh content key; a key every
  record joins (an index) takes the chunk's members in one command, as the store's script
  does. What names no judgement (counters, the sequence, the RQ job of a batch) is left out:
  the raw side writes a little less than dispatchq does.
- cli: `dispatchq enqueue -` reading the same N judgements as JSON Lines on stdin.
- serve: a real `dispatchq serve` on loopback (started once, before the rounds) taking the
  N judgements as bodies of K JSON Lines (`--body-lines`, DISPATCHQ_SERVE_MAX_LINES' default)
  from CLIENTS keep-alive connections; timed from the first request to the last answer, each
  counted only once answered 200 with every line `created`.
- rq: RQ's `Queue.enqueue` called N times (a no-op job each), what a producer on bare RQ does.

The cli, raw and rq sides are whole processes, start-up included (the figures that gate);
each side's start-up (the same process with nothing to write) is measured in each round too,
and the rates net of it are shown beside. The ratios are the medians of the rounds' paired
ratios. Targets: cli and serve >= 0.5x raw, cli >= 5x rq; a missed target makes the run exit 1.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import PY, Bench, free_port, stop_server, timed_clients, write_jsonl  # noqa: E402

__all__ = ["RAW", "run_enqueue", "store_writes"]

#: Records per pipeline on the raw side: dispatchq's own chunk (`queue.dispatch.WRITE_CHUNK`).
CHUNK = 1000
CLIENTS = 4
TARGETS = {"cli_vs_raw": 0.5, "serve_vs_raw": 0.5, "cli_vs_rq": 5.0}

# The raw side. argv: the plan's file, N. The plan is what one judgement's enqueue wrote
# (`store_writes`); `{id}` and `{ckey}` in it stand for the record's id and content key.
RAW = r"""
import json, os, re, sys
import redis
plan = json.load(open(sys.argv[1]))
n, chunk = int(sys.argv[2]), int(sys.argv[3])
conn = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
PART = re.compile(r"\{(id|ckey):(\d+):(\d*)\}")
def fill(text, jid, ckey):
    text = text.replace("{id}", jid).replace("{ckey}", ckey)
    if "{" not in text:
        return text
    whole = {"id": jid, "ckey": ckey}
    return PART.sub(lambda m: whole[m[1]][int(m[2]) : int(m[3]) if m[3] else None], text)
for start in range(0, n, chunk):
    pipe = conn.pipeline(transaction=False)
    shared = {}  # an index key every record joins: one command per key per chunk, as the store
    for _ in range(min(chunk, n - start)):
        jid, ckey = os.urandom(16).hex(), os.urandom(32).hex()
        for op, key, values in plan:
            own = "{id" in key or "{ckey" in key
            key = fill(key, jid, ckey)
            if op == "hset":
                pipe.hset(key, mapping={f: fill(v, jid, ckey) for f, v in values})
            elif op == "set":
                pipe.set(key, fill(values, jid, ckey))
            elif own and op == "zadd":
                pipe.zadd(key, {fill(m, jid, ckey): s for m, s in values})
            elif own:
                getattr(pipe, op)(key, *(fill(v, jid, ckey) for v in values))
            elif op == "zadd":
                shared.setdefault((op, key), {}).update({fill(m, jid, ckey): s for m, s in values})
            else:
                shared.setdefault((op, key), []).extend(fill(v, jid, ckey) for v in values)
    for (op, key), members in shared.items():
        if op == "zadd":
            pipe.zadd(key, members)
        else:
            getattr(pipe, op)(key, *members)
    pipe.execute()
"""

RQ_ENQUEUE = r"""
import os, sys
import redis
from rq import Queue
from bench.noop import noop
q = Queue("bench-bare", connection=redis.Redis.from_url(os.environ["BENCH_REDIS_URL"]))
for i in range(int(sys.argv[1])):
    q.enqueue(noop, i, result_ttl=0)
"""


def _line(i: int, tag: str) -> dict[str, Any]:
    return {"kind": "noop", "target": f"bench/{tag}/{i}", "state": {"i": i}}


def _part(text: str, jid: str, ckey: str) -> tuple[str, str] | None:
    """A piece of the id or the content key (8+ characters) as `{name:start:end}`."""
    for name, whole in (("id", jid), ("ckey", ckey)):
        at = whole.find(text) if len(text) >= 8 else -1
        if at >= 0:
            end = "" if at + len(text) == len(whole) else str(at + len(text))
            return name, f"{{{name}:{at}:{end}}}"
    return None


def _hash_writes(r: Any, key: str, jid: str, ckey: str) -> list[Any]:
    """The record itself (named by the id), or a small hash shared by the ids (or content keys)
    that start alike: named by their first characters, holding the rest of the id, or a piece
    of the content key whose value is the id."""
    fields = {f.decode(): v.decode(errors="replace") for f, v in r.hgetall(key).items()}

    def mark(text: str) -> str:
        return text.replace(jid, "{id}").replace(ckey, "{ckey}")

    if jid in key:
        return [("hset", mark(key), sorted((f, mark(v)) for f, v in fields.items()))]
    out: list[Any] = []
    for field, value in fields.items():
        found = _part(field, jid, ckey)
        if found and (jid in value or found[0] == "id"):
            whole = jid if found[0] == "id" else ckey
            head, _, tail = key.rpartition(":")
            named = f"{head}:{{{found[0]}:0:{len(tail)}}}" if tail and whole.startswith(tail) else key
            out.append(("hset", named, [(found[1], mark(value))]))
    return out


def store_writes(bench: Bench, sample: Path, env: dict[str, str]) -> list[Any]:
    """What enqueueing one judgement writes, as a plan the raw side repeats per record.

    Enqueues `sample` (JSON Lines) through `dispatchq enqueue -` on an empty store, takes the
    first judgement's id from its output and its content key from its record, then reads back
    every key that names that id (in its name, as a member, or as its value), with the id and
    the content key replaced by `{id}` and `{ckey}`.
    """
    r = bench.redis
    r.flushall()
    done = subprocess.run(
        bench.dispatchq("enqueue", "-"),
        stdin=sample.open("rb"),
        capture_output=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    jid = done.stdout.decode().split()[1]
    record_key = next(k for k in r.scan_iter(count=1000) if k.decode().endswith(jid))
    # The content key: the 64 hex digits the record holds (a hash's field, or inside one value).
    held = r.hgetall(record_key) if r.type(record_key) == b"hash" else {b"": r.get(record_key) or b""}
    found = re.search(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])", b" ".join(held.values()))
    ckey = found.group().decode() if found else "\0no content key\0"

    def mark(text: str) -> str:
        return text.replace(jid, "{id}").replace(ckey, "{ckey}")

    plan: list[Any] = []
    for raw_key in sorted(r.scan_iter(count=1000)):
        key = raw_key.decode()
        kind = r.type(key).decode()
        if kind == "hash":
            plan += _hash_writes(r, key, jid, ckey)
        elif kind == "set":
            members = [m.decode() for m in r.smembers(key) if jid.encode() in m]
            if members:
                plan.append(("sadd", mark(key), [mark(m) for m in members]))
        elif kind == "zset":
            scored = [(m.decode(), s) for m, s in r.zrange(key, 0, -1, withscores=True) if jid.encode() in m]
            if scored:
                plan.append(("zadd", mark(key), [(mark(m), s) for m, s in scored]))
        elif kind == "string":
            value = (r.get(key) or b"").decode(errors="replace")
            if jid in key or jid in value or ckey in key:
                plan.append(("set", mark(key), mark(value)))
        elif kind == "list":
            items = [v.decode(errors="replace") for v in r.lrange(key, 0, -1) if jid.encode() in v]
            if items:
                plan.append(("rpush", mark(key), [mark(v) for v in items]))
    if not any("{id}" in key for _, key, _ in plan):
        raise SystemExit(f"found no record of judgement {jid} to copy")
    return plan


def _post_all(port: int, bodies: list[bytes]) -> tuple[float, int]:
    """POST every body from CLIENTS keep-alive connections; (seconds, judgements created)."""
    created = [0] * CLIENTS
    errors: list[str] = []

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for body in bodies[k::CLIENTS]:
            conn.request("POST", "/judgements", body=body, headers={"Content-Type": "application/x-ndjson"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            if response.status == 200:
                created[k] += sum(1 for entry in answer if entry.get("created"))
            elif len(errors) < 3:
                errors.append(f"HTTP {response.status}: {str(answer)[:200]}")
        conn.close()

    elapsed = timed_clients(client, CLIENTS)
    if errors:
        raise SystemExit(f"POST /judgements refused bodies: {errors}")
    return elapsed, sum(created)


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"dispatchq serve exited {proc.returncode} before answering")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("dispatchq serve did not answer within 60 s")


def _created(bench: Bench, plan: list[Any]) -> int:
    """Records in the store: the keys named like the plan's record key (`{id}` in its name)."""
    pattern = next(key for _, key, _ in plan if "{id}" in key).replace("{id}", "*")
    return sum(1 for _ in bench.redis.scan_iter(match=pattern, count=10_000))


def run_enqueue(bench: Bench, n: int, repeat: int, body_lines: int = 1000) -> dict[str, Any]:
    """Paired rounds of the four sides; `met` is False when a target is missed."""
    import shutil

    shutil.copy(ROOT / "examples" / "checks.py", bench.workdir / "checks.py")  # beside the config
    bench.config("kinds:\n  noop:\n    check: checks:noop\n")
    # Every side starts as an installed program does, from compiled bytecode: with
    # PYTHONDONTWRITEBYTECODE set (as on the development machine) dispatchq's own modules
    # would be compiled again at every start while the raw side's libraries are not. The
    # bytecode goes under the run's folder, not into the checkout; the first run of each
    # side (before the rounds) writes it.
    env = {k: v for k, v in bench.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(bench.workdir / "pycache")
    raw_env = {**env, "BENCH_REDIS_URL": bench.server.url()}
    sample = bench.workdir / "sample.jsonl"
    write_jsonl(sample, [_line(i, "sample") for i in range(3)])
    plan = store_writes(bench, sample, env)
    plan_file = bench.workdir / "plan.json"
    plan_file.write_text(json.dumps(plan))
    empty = bench.workdir / "empty.jsonl"
    empty.write_text("")
    port = free_port()
    serve = subprocess.Popen(
        bench.dispatchq("serve", "--port", str(port)), env=env, cwd=ROOT, stderr=subprocess.DEVNULL
    )
    seconds: dict[str, list[float]] = {
        k: [] for k in ("raw", "cli", "serve", "rq", "raw_start", "cli_start", "rq_start")
    }
    try:
        _wait_up(port, serve)
        for warm in ([PY, "-c", RAW, str(plan_file), "0", str(CHUNK)], [PY, "-c", RQ_ENQUEUE, "0"]):
            bench.timed(warm, env=raw_env)
        for r in range(repeat):
            lines = [_line(i, f"r{r}") for i in range(n)]
            jsonl = bench.workdir / "lines.jsonl"
            write_jsonl(jsonl, lines)
            encoded = [json.dumps(line).encode() for line in lines]
            bodies = [b"\n".join(encoded[i : i + body_lines]) for i in range(0, n, body_lines)]
            raw = [PY, "-c", RAW, str(plan_file)]
            bench.redis.flushall()
            seconds["raw_start"].append(bench.timed([*raw, "0", str(CHUNK)], env=raw_env))
            seconds["raw"].append(bench.timed([*raw, str(n), str(CHUNK)], env=raw_env))
            if _created(bench, plan) != n:
                raise SystemExit(f"the raw side wrote {_created(bench, plan)} records, not {n}")
            bench.redis.flushall()
            seconds["cli_start"].append(bench.timed(bench.dispatchq("enqueue", "-"), stdin=empty, env=env))
            seconds["cli"].append(bench.timed(bench.dispatchq("enqueue", "-"), stdin=jsonl, env=env))
            if _created(bench, plan) != n:
                raise SystemExit(f"dispatchq enqueue - created {_created(bench, plan)} records, not {n}")
            bench.redis.flushall()
            took, created = _post_all(port, bodies)
            seconds["serve"].append(took)
            if created != n or _created(bench, plan) != n:
                raise SystemExit(f"POST /judgements created {created} judgements, not {n}")
            bench.redis.flushall()
            seconds["rq_start"].append(bench.timed([PY, "-c", RQ_ENQUEUE, "0"], env=raw_env))
            seconds["rq"].append(bench.timed([PY, "-c", RQ_ENQUEUE, str(n)], env=raw_env))
    finally:
        stop_server(serve)
    return summarise(n, repeat, body_lines, plan, seconds)


def summarise(
    n: int, repeat: int, body_lines: int, plan: list[Any], seconds: dict[str, list[float]]
) -> dict[str, Any]:
    def paired(a: str, b: str, *, net: bool = False) -> float:
        """Median over rounds of (rate of a) / (rate of b) = b's time / a's time."""

        def t(side: str, i: int) -> float:
            start = seconds.get(f"{side}_start")
            return seconds[side][i] - (start[i] if net and start else 0.0)

        return statistics.median(t(b, i) / t(a, i) for i in range(repeat))

    rates = {side: n / statistics.median(seconds[side]) for side in ("raw", "cli", "serve", "rq")}
    ratios = {
        "cli_vs_raw": paired("cli", "raw"),
        "serve_vs_raw": paired("serve", "raw"),
        "cli_vs_rq": paired("cli", "rq"),
    }
    net = {
        "cli_vs_raw": paired("cli", "raw", net=True),
        "serve_vs_raw": paired("serve", "raw", net=True),
        "cli_vs_rq": paired("cli", "rq", net=True),
    }
    return {
        "n": n,
        "rounds": repeat,
        "body_lines": body_lines,
        "clients": CLIENTS,
        "raw_writes_per_record": [f"{op} {key}" for op, key, _ in plan],
        "per_second_median": {k: round(v, 1) for k, v in rates.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "ratios_net_of_start_up": {k: round(v, 3) for k, v in net.items()},
        "start_up_s_median": {
            k: round(statistics.median(seconds[f"{k}_start"]), 3) for k in ("raw", "cli", "rq")
        },
        "targets": TARGETS,
        "met": all(ratios[k] >= TARGETS[k] for k in TARGETS),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "seconds": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
    }
