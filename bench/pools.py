"""Window pools: three credentials whose windows close at set counts, driven through the real admission.

    python3 ops/dev.py bench pools                 # N = 300 judgements, K = 1,000 timed admissions
    python3 ops/dev.py bench pools -n 600 --repeat 5
    python3 ops/dev.py bench pools --quick         # N = 120, K = 200: a smoke run

The pool: `team-a` and `team-b` (subscription, two slots each) and `api-overflow` (metered,
one slot, a day cap, serving `urgent` only). N judgements of one kind (a cost estimate of
$0.30) are enqueued at once, one in five urgent, one in five background. Sessions are not
spawned: each admission (`dispatchq.tiers.session.admit`, the session worker's own dequeue,
on the run's real Redis) is handed to a stand-in provider that counts sessions per credential
and closes a credential's window after a set count of its sessions (`team-a` after its
N/7th and again N/4 sessions later, a five-hour limit lifting a second later; `team-b` after
its N/5th, a weekly limit that outlasts the run). The
outcome is then accounted for the way the session tier does it: a refused spawn reports the
limit (`Window.report_limit`) and goes back to the front `waiting`, uncharged; an answered
session settles its cost (`Window.settle`), shows the window open if it was the probe, is
answered through the record's transition, and gives its slot back. A refused spawn ends at
once, an answer takes longer: refusals are reported before the next session ends, as with
real sessions. When nothing can start, the run sleeps until the earliest lift the admission
names and then lifts it, as the scheduled retrigger does.

Measured (goals from the issue):

- judgements left `waiting` after an admission round while routing (`pools.routing.route`,
  over what the store holds at that moment) says a credential they may use has room and is
  not being probed (goal 0);
- spawns into a closed window per limit hit per credential: the refused spawn that found it
  plus every admission on that credential after the limit was reported and before its lift
  (goal 1), and sessions on it between its lift and the probe showing it open (goal 1);
- metered spend after the run minus the day cap (goal: at most one session's estimate; a run
  whose metered credential never reached its cap tested nothing, and misses it: N below
  about 100 does not reach it), and metered sessions of judgements below `urgent` (goal 0);
- admission cost: `admit` timed around each call that admits one judgement (answered
  untimed before the next), with the three-credential pool against the pool of one
  `default` credential the environment gives when the file names none (today's
  single-credential admission). The two take turns call by call on one line of 2K
  judgements on the same Redis, so both see the same line depth and the same moment's load
  of a shared machine; `--repeat` runs after a warm-up one; the ratio of the medians of the
  runs' means per judgement (goal <= 1.2x).

Exits 1 when a goal is missed (`run.py` does too, for this benchmark).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: `python bench/pools.py`
    sys.path.insert(0, str(ROOT))

from bench.common import Bench  # noqa: E402
from dispatchq.client import Client  # noqa: E402
from dispatchq.pools.credentials import Pool, qualify  # noqa: E402
from dispatchq.pools.routing import route  # noqa: E402
from dispatchq.pools.spend import spend_periods  # noqa: E402
from dispatchq.queue.parts import QUEUE_PARTS  # noqa: E402
from dispatchq.runtime import Runtime  # noqa: E402
from dispatchq.settings import load_settings  # noqa: E402
from dispatchq.tiers.blocks import held  # noqa: E402
from dispatchq.tiers.lease import answer, requeue_front  # noqa: E402
from dispatchq.tiers.session import admit, model_of  # noqa: E402
from dispatchq.window.face import Admission, Wait  # noqa: E402
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal  # noqa: E402
from dispatchq.window.marker import probing  # noqa: E402
from dispatchq.window.messages import WEEKLY_SCOPE  # noqa: E402
from dispatchq.window.pooling import credential_markers, states_for  # noqa: E402

__all__ = ["main", "run_pools"]

KIND = "ask"
ESTIMATE = 0.30
DAY_CAP = 1.30
METERED = "api-overflow"
A, B = "team-a", "team-b"
#: What metered sessions report they cost, in turn: some above the estimate, so the cap is tested.
COSTS = (0.22, 0.41, 0.30, 0.45, 0.18, 0.33)
HOLDER = "bench-pools"

KINDS = f"""kinds:
  {KIND}:
    session:
      prompt: "Answer {{{{ target }}}}"
      cost_estimate: {ESTIMATE}
"""


def pool_config(secrets: Path) -> str:
    """The three-credential pool (token files written under `secrets`)."""
    secrets.mkdir(parents=True, exist_ok=True)
    for name, value in ((A, "tok-A"), (B, "tok-B"), (METERED, "key-M")):
        path = secrets / name
        path.write_text(value + "\n")
        path.chmod(0o600)
    return KINDS + (
        "credentials:\n"
        f"  {A}:\n    token_file: {secrets / A}\n    concurrency: 2\n"
        f"  {B}:\n    token_file: {secrets / B}\n    concurrency: 2\n"
        f"  {METERED}:\n    api_key_file: {secrets / METERED}\n    billing: metered\n"
        f"    spend_cap: {{day: {DAY_CAP}}}\n    serves: {{priority: urgent}}\n    concurrency: 1\n"
    )


def priority_of(i: int) -> str:
    return ("urgent", "normal", "normal", "normal", "background")[i % 5]


def runtime_for(bench: Any, config: str) -> Runtime:
    bench.redis.flushall()
    bench.config(config)
    return Runtime(settings=load_settings(bench.env), redis=bench.redis, queue_parts=QUEUE_PARTS)


def enqueue(rt: Runtime, n: int, tag: str) -> list[str]:
    client = Client(runtime=rt)
    return [client.enqueue(KIND, f"bench/{tag}#{i}", priority=priority_of(i)) for i in range(n)]


# --- the stand-in provider: windows that close at set counts -------------------------------
@dataclass
class Hit:
    """One limit a credential's window reached, and what dispatchq spawned into it."""

    credential: str
    lifts_at: float
    reported_at: float | None = None
    into_closed: int = 0  # spawns while the provider's window was closed (the finder included)
    after_report: int = 0  # of those, admitted after the limit was reported
    after_lift: int = 0  # sessions on the credential between the lift and the window shown open
    opened_at: float | None = None


@dataclass
class Provider:
    """Counts sessions per credential; `closes[c]` lists after which of them its window closes."""

    closes: dict[str, list[int]]
    lift_in: dict[str, float]
    kinds: dict[str, tuple[str, str]]  # credential -> (LimitKind, marker scope)
    sessions: Counter[str] = field(default_factory=Counter)
    hits: list[Hit] = field(default_factory=list)

    def current(self, credential: str) -> Hit | None:
        mine = [h for h in self.hits if h.credential == credential]
        return mine[-1] if mine else None

    def spawn(self, credential: str, now: float) -> Hit | None:
        """A session starts on `credential`: the hit it is refused by, or None (it runs)."""
        hit = self.current(credential)
        if hit is not None and now < hit.lifts_at:
            hit.into_closed += 1
            if hit.reported_at is not None:
                hit.after_report += 1
            return hit
        if hit is not None and hit.opened_at is None:
            hit.after_lift += 1  # a session after the lift, before the window was shown open
        pending = self.closes.get(credential, [])
        if pending and self.sessions[credential] >= pending[0]:
            pending.pop(0)
            hit = Hit(credential, now + self.lift_in[credential], into_closed=1)
            self.hits.append(hit)
            return hit
        self.sessions[credential] += 1
        return None


@dataclass
class Session:
    admission: Admission
    claim: str | None
    started: float


def signal_for(provider: Provider, hit: Hit) -> LimitSignal:
    kind, scope = provider.kinds[hit.credential]
    lifts = datetime.fromtimestamp(hit.lifts_at, UTC)
    return LimitSignal(
        lifts_at=lifts,
        kind=kind,  # type: ignore[arg-type]
        scope=scope,
        message=f"{kind} limit reached, resets {lifts.isoformat()}",
        stated=f"resetsAt={hit.lifts_at!r}",
        source="event",
    )


class Scenario:
    """The run: admission rounds, the provider's answers, and the goals' counters."""

    def __init__(self, rt: Runtime, provider: Provider) -> None:
        self.rt = rt
        self.window = rt.window
        self.provider = provider
        self.pool: Pool = rt.window.pool()
        self.host = rt.settings.host
        self.running: list[Session] = []
        self.metered_costs = 0
        self.metered_by_priority: Counter[str] = Counter()
        self.waited_while_open: set[str] = set()
        self.waited_rounds = 0
        self.rounds = 0
        self.slept = 0.0

    def model(self, kind: str) -> str | None:
        return model_of(self.rt.config.kinds, kind)

    def admission_round(self) -> Wait:
        """Admit until nothing more may start; a refused spawn is accounted for at once."""
        while True:
            decision = admit(self.window, self.host, HOLDER, self.model)
            if isinstance(decision, Wait):
                return decision
            now = time.time()
            claim = self.rt.storage.records.claim_of(decision.jid)
            hit = self.provider.spawn(decision.credential, now)
            if hit is None:
                self.running.append(Session(decision, claim, now))
            else:
                self.refused(Session(decision, claim, now), hit)

    def refused(self, session: Session, hit: Hit) -> None:
        """The session tier's refused-at-spawn path: the limit reported, the judgement back in front."""
        adm, window = session.admission, self.window
        window.settle(adm.slot, 0.0)
        why = window.report_limit(
            [signal_for(self.provider, hit)],
            session=f"refused-{adm.jid}",
            asked_at=session.started,
            credential=adm.credential,
        )
        if hit.reported_at is None:
            hit.reported_at = time.time()
        window.store.count_refused()
        record = window.records.get(adm.jid)
        assert record is not None
        requeue_front(
            window, record, why, status="waiting", trail_why="refused at spawn (no cost)", claim=session.claim
        )
        window.release(adm.slot, adm.probes)

    def finish_oldest(self) -> None:
        """The longest-running session answers: charged, the window shown open if it probed."""
        session = self.running.pop(0)
        adm, window = session.admission, self.window
        record = window.records.get(adm.jid)
        assert record is not None
        cost: float | None = None
        if adm.credential == METERED:
            cost = COSTS[self.metered_costs % len(COSTS)]
            self.metered_costs += 1
            self.metered_by_priority[record.urgency or "normal"] += 1
        window.settle(adm.slot, cost)
        if adm.probes:
            window.opened(adm.probes, "the probe session completed normally")
            hit = self.provider.current(adm.credential)
            if hit is not None and hit.opened_at is None:
                hit.opened_at = time.time()
        sid = f"s-{adm.jid}"
        answered = answer(window, record, "yes", {"session_id": sid, "cost_usd": cost}, session.claim)
        assert answered, f"{adm.jid} was not answered"
        window.release(adm.slot, adm.probes)

    def check_waiting(self) -> None:
        """Goal 0: a judgement still `waiting` while a credential it may use has room (and no probe)."""
        window, now = self.window, time.time()
        waiting = [r for r in held(window, self.host) if r.status == "waiting"]
        if not waiting:
            return
        markers = window.markers()
        periods = spend_periods(now, self.rt.settings.timezone)
        stored = window.store.pool.states(self.pool.names, periods)
        usage = window.store.usage.read()
        model = self.model(KIND)
        probed = {
            c.name for c in self.pool if probing(credential_markers(markers, c.name, model), model, now)
        }
        states = states_for(
            self.pool, markers, model, stored=stored, usage=usage, kind_estimate=ESTIMATE, now=now
        )
        counted = False
        for record in waiting:
            plan = route(
                states,
                priority=record.urgency,
                kind=record.kind,
                now=now,
                timezone=self.rt.settings.timezone,
            )
            if any(c.name not in probed for c in plan.usable):
                self.waited_while_open.add(record.id)
                counted = True
        self.waited_rounds += counted

    def idle_until(self, wait: Wait, deadline: float) -> None:
        """Nothing runs and nothing may start: sleep to the lift, then lift as the retrigger would."""
        if wait.until is None or wait.until > deadline:
            raise SystemExit(f"pools: stuck with nothing running: {wait.why}")
        pause = max(0.0, wait.until - time.time()) + 0.01
        time.sleep(pause)
        self.slept += pause
        for marker in self.window.markers():
            if marker.state == "closed" and not marker.closed():
                self.window.lift(marker.scope)

    def run(self, ids: Sequence[str], timeout: float) -> None:
        deadline = time.time() + timeout
        store = self.rt.storage.records
        while True:
            self.rounds += 1
            for session in self.running:  # the run's lease renewal, as `Holding` does it
                self.window.renew(session.admission.slot, session.admission.probes)
            wait = self.admission_round()
            self.check_waiting()
            if self.running:
                self.finish_oldest()
            elif all(s == "answered" for s in store.statuses(list(ids))):
                return
            else:
                self.idle_until(wait, deadline)
            if time.time() > deadline:
                raise SystemExit("pools: the scenario did not finish in time")


def scenario(bench: Any, n: int) -> dict[str, Any]:
    rt = runtime_for(bench, pool_config(bench.workdir / "secrets"))
    ids = enqueue(rt, n, "scenario")
    second = max(n // 4, 10)
    provider = Provider(
        closes={A: [max(n // 7, 5), max(n // 7, 5) + second], B: [max(n // 5, 5)]},
        lift_in={A: 1.0, B: 7 * 86400.0},
        kinds={A: ("five_hour", GENERAL_SCOPE), B: ("seven_day", WEEKLY_SCOPE)},
    )
    run = Scenario(rt, provider)
    started = time.perf_counter()
    run.run(ids, timeout=120 + n)
    elapsed = time.perf_counter() - started
    spent_day, _ = rt.storage.pool.spent(METERED, spend_periods(time.time(), rt.settings.timezone))
    per_hit = [
        {
            "credential": h.credential,
            "spawns_into_closed": h.into_closed,
            "admitted_after_report": h.after_report,
            "sessions_from_lift_to_open": h.after_lift if h.opened_at is not None else None,
        }
        for h in provider.hits
    ]
    statuses = Counter(s or "?" for s in rt.storage.records.statuses(ids))
    marker_b = rt.window.get(qualify(B, WEEKLY_SCOPE))
    return {
        "judgements": n,
        "answered": statuses.get("answered", 0),
        "sessions_by_credential": dict(provider.sessions),
        "limit_hits": per_hit,
        "waited_while_open": len(run.waited_while_open),
        "rounds_with_such_a_wait": run.waited_rounds,
        "admission_rounds": run.rounds,
        "metered_spent_day": round(spent_day, 6),
        "metered_cap_day": DAY_CAP,
        "cap_overshoot": round(max(0.0, spent_day - DAY_CAP), 6),
        "cap_reached": spent_day + ESTIMATE > DAY_CAP,
        "estimate": ESTIMATE,
        "metered_sessions_by_priority": dict(run.metered_by_priority),
        "team_b_weekly_closed_at_end": bool(marker_b and marker_b.closed()),
        "seconds": round(elapsed, 2),
        "slept_for_lifts_s": round(run.slept, 2),
    }


# --- admission cost -----------------------------------------------------------------------
def runtimes(bench: Any) -> dict[str, Runtime]:
    """Two runtimes on the run's one Redis: one `default` credential (no `credentials:` in its
    file, today's single-credential admission) and the three-credential pool."""
    bench.redis.flushall()
    out = {}
    for name, text in (("single", KINDS), ("pool", pool_config(bench.workdir / "secrets"))):
        path = bench.workdir / f"{name}.yaml"
        path.write_text(text)
        rt = Runtime(
            settings=load_settings({**bench.env, "DISPATCHQ_CONFIG": str(path)}),
            redis=bench.redis,
            queue_parts=QUEUE_PARTS,
        )
        assert (len(rt.window.pool()) == 1) == (name == "single"), rt.window.pool().names
        out[name] = rt
    return out


def admit_one(rt: Runtime) -> float:
    """Seconds of one `admit` call that admitted the line's head; the session answered, untimed."""
    window = rt.window

    def model(kind: str) -> str | None:
        return model_of(rt.config.kinds, kind)

    started = time.perf_counter()
    decision = admit(window, rt.settings.host, HOLDER, model)
    took = time.perf_counter() - started
    if isinstance(decision, Wait):
        raise SystemExit(f"pools: nothing admitted in the cost run: {decision.why}")
    claim = rt.storage.records.claim_of(decision.jid)
    record = window.records.get(decision.jid)
    assert record is not None
    window.settle(decision.slot, ESTIMATE if decision.credential == METERED else None)
    answer(window, record, "yes", {"session_id": "s"}, claim)
    window.release(decision.slot, decision.probes)
    return took


def admission_cost(bench: Any, k: int, repeat: int) -> dict[str, Any]:
    """Both sides take turns call by call on one line of 2k judgements (so each sees the same
    line depth and the same moment's load), `repeat` times; medians of the per-run figures."""
    sides = runtimes(bench)
    means: dict[str, list[float]] = {"single": [], "pool": []}
    medians: dict[str, list[float]] = {"single": [], "pool": []}
    for r in range(repeat + 1):  # the first run warms imports, scripts and connections
        enqueue(sides["single"], 2 * k, f"cost-{r}")
        times: dict[str, list[float]] = {"single": [], "pool": []}
        for i in range(2 * k):
            name = ("single", "pool")[(i + r) % 2]
            times[name].append(admit_one(sides[name]))
        if r:
            for name, values in times.items():
                means[name].append(statistics.fmean(values))
                medians[name].append(statistics.median(values))
    single_us = statistics.median(means["single"]) * 1e6
    pool_us = statistics.median(means["pool"]) * 1e6
    short = short_line(sides, k)
    return {
        "k": k,
        "repeat": repeat,
        "single_us_per_judgement": round(single_us, 1),
        "pool_us_per_judgement": round(pool_us, 1),
        "single_median_admit_us": round(statistics.median(medians["single"]) * 1e6, 1),
        "pool_median_admit_us": round(statistics.median(medians["pool"]) * 1e6, 1),
        "ratio": round(pool_us / single_us, 3),
        "ratio_of_median_admits": round(
            statistics.median(medians["pool"]) / statistics.median(medians["single"]), 3
        ),
        "ratios_per_run": [round(p / q, 3) for p, q in zip(means["pool"], means["single"], strict=True)],
        "target_ratio": 1.2,
        "short_line": short,
    }


def short_line(sides: dict[str, Runtime], k: int) -> dict[str, Any]:
    """The same turns with two judgements in the line (one enqueued before each admission):
    reported beside the target, not held to it. Reading the line's heads is most of an
    admission; with few of them the pool's own reads weigh more."""
    enqueue(sides["single"], 2, "short-pre")
    times: dict[str, list[float]] = {"single": [], "pool": []}
    for i in range(2 * k):
        enqueue(sides["single"], 1, f"short-{i}")
        name = ("single", "pool")[i % 2]
        times[name].append(admit_one(sides[name]))
    single, pool = (statistics.fmean(times[n]) * 1e6 for n in ("single", "pool"))
    return {
        "line_depth": 2,
        "single_us_per_judgement": round(single, 1),
        "pool_us_per_judgement": round(pool, 1),
        "ratio": round(pool / single, 3),
    }


# --- the run -------------------------------------------------------------------------------
def goals(s: dict[str, Any], cost: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(measure, figure, goal, met) for each goal (met None: a figure reported, not a goal)."""
    hits = s["limit_hits"]
    worst = max((h["spawns_into_closed"] for h in hits), default=0)
    after = sum(h["admitted_after_report"] for h in hits)
    probes = [h["sessions_from_lift_to_open"] for h in hits if h["sessions_from_lift_to_open"] is not None]
    below_urgent = sum(v for p, v in s["metered_sessions_by_priority"].items() if p != "urgent")
    per_cred = Counter(h["credential"] for h in hits)
    short = cost["short_line"]
    return [
        (
            "judgements answered",
            f"{s['answered']} of {s['judgements']}",
            "all",
            s["answered"] == s["judgements"],
        ),
        (
            "waited while an allowed credential was open",
            str(s["waited_while_open"]),
            "0",
            s["waited_while_open"] == 0,
        ),
        (
            "spawns into a closed window per limit hit (worst; hits: "
            + ", ".join(f"{c} {n}" for c, n in sorted(per_cred.items()))
            + ")",
            f"{worst} ({after} admitted after the report)",
            "1",
            bool(hits) and worst <= 1 and after == 0,
        ),
        (
            "sessions from a lift to the window shown open (each lifted hit)",
            ", ".join(map(str, probes)) or "none lifted",
            "1",
            bool(probes) and all(p == 1 for p in probes),
        ),
        (
            "cap overshoot (metered spend - day cap)",
            f"${s['cap_overshoot']:.2f} (spent ${s['metered_spent_day']:.2f} of ${s['metered_cap_day']:.2f}"
            + (", cap reached)" if s["cap_reached"] else ", cap NOT reached)"),
            f"<= ${s['estimate']:.2f}",
            s["cap_reached"] and s["cap_overshoot"] <= s["estimate"] + 1e-9,
        ),
        ("metered sessions below urgent", str(below_urgent), "0", below_urgent == 0),
        (
            "admission per judgement, pool of 3 / one default",
            f"{cost['pool_us_per_judgement']:.0f} / {cost['single_us_per_judgement']:.0f} us"
            f" = {cost['ratio']:.2f}x",
            "<= 1.2x",
            cost["ratio"] <= cost["target_ratio"],
        ),
        (
            "  the same with 2 judgements in the line (reported, not held to the goal)",
            f"{short['pool_us_per_judgement']:.0f} / {short['single_us_per_judgement']:.0f} us"
            f" = {short['ratio']:.2f}x",
            "-",
            None,
        ),
    ]


def table(rows: list[tuple[str, str, str, bool | None]]) -> str:
    width = max(len(r[0]) for r in rows)
    fig = max(len(r[1]) for r in rows)
    lines = [f"{'measure':<{width}}  {'figure':<{fig}}  goal      met"]
    lines += [
        f"{m:<{width}}  {f:<{fig}}  {g:<8}  {'-' if ok is None else 'yes' if ok else 'NO'}"
        for m, f, g, ok in rows
    ]
    return "\n".join(lines)


def run_pools(bench: Any, n: int = 300, k: int = 1000, repeat: int = 3) -> dict[str, Any]:
    """The scenario, then the admission cost; the table is printed, `met` says whether every goal was."""
    s = scenario(bench, n)
    cost = admission_cost(bench, k, repeat)
    rows = goals(s, cost)
    print(table(rows))
    return {"scenario": s, "admission_cost": cost, "met": all(ok is not False for *_, ok in rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=300, help="judgements in the scenario")
    parser.add_argument("-k", type=int, default=1000, help="judgements admitted per side in the cost run")
    parser.add_argument("--repeat", type=int, default=3, help="cost runs per side (medians compared)")
    parser.add_argument("--quick", action="store_true", help="N = 120, K = 200, one repeat")
    args = parser.parse_args(argv)
    n, k, repeat = (120, 200, 1) if args.quick else (args.n, args.k, args.repeat)
    with tempfile.TemporaryDirectory(prefix="dispatchq-bench-pools-") as tmp:
        bench = Bench(Path(tmp))
        try:
            data = run_pools(bench, n, k, repeat)
        finally:
            bench.close()
    print(json.dumps(data, indent=2))
    return 0 if data["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
