"""Session leases: one holder per judgement, across hosts that can lose sight of Redis.

An admitted session judgement carries a **claim token** (written with its claim, in one
script) and a **lease** (a key that lives `DISPATCHQ_SESSION_LEASE` seconds unless renewed).
Its holder renews the lease, its slot and its probe leases on a thread that survives errors,
and writes as the holder through a client of its own with a bounded timeout, so the
session's output is drained and its timeout enforced while Redis is away. Every write it
makes carries the token; a write whose token is no longer the record's is refused.

- **Shared-line work** (any host may run it): a holder that has not renewed for
  lease − margin (monotonic clock, counted from the last renewal *sent*) ends its session
  through the launcher's cancel path before anyone else may take over. Nothing is charged;
  the kind's `not_spawned` hook is not called, so a fixing session's dispatch marker stays
  and its next dispatch verifies first (invariant 7).
- **Host-bound work** (bound to this host's checkout) never ends itself: it cannot run
  anywhere else, so it runs on and spools what it saw (`dispatchq.storage.spool`).
- **Another host** takes a judgement over only once its lease has lapsed (`take_over`):
  the claim becomes a tombstone atomically, the trail says "lost contact", no death is
  counted, and `resume_session` is dropped (the transcript stays on the host that lost
  contact). Host-bound work is never taken over by another host: its own host settles it
  (from its spool, or by its own death count when its worker died).
- **Orphaned spools**: a holder cut off after its session finished keeps the answer in its
  host's spool, and only that host can read it. Another host therefore leaves a lapsed
  judgement whose holder was elsewhere to that holder's own replay for a bounded time more,
  the spool wait (`DISPATCHQ_SESSION_SPOOL_WAIT`, default one lease): the holder renews, with
  its lease, a key that lives lease + wait (`dispatchq.storage.replays`), and the takeover
  waits for it too. A host back within the wait applies its answer under its still-valid
  claim (the session is paid once); one that stays away costs that wait, then the judgement is
  asked again elsewhere (never dropped), and its answer, if it ever comes back, is a late
  answer on the trail. This is chosen over shipping the answer through a second channel: a
  host cut off from Redis is usually cut off from its peers too, a second channel that writes
  answers is one more way in to defend, and a host that died has no channel at all. The
  judgement's own host never waits (its sweep runs right after its own replay).
- **Upgrade**: a judgement claimed before tokens existed has no claim and no lease. Its
  holder (a job without a token) writes with `LEGACY_CLAIM`, accepted once on a record
  without a claim; another host treats it as before (a death counted once RQ abandons it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchq.backends import DEFAULT_BACKEND, SessionBackend, backend_for
from dispatchq.core.judgement import TrailEntry
from dispatchq.pools.credentials import DEFAULT_CREDENTIAL
from dispatchq.storage.connection import process_alive
from dispatchq.storage.outage import is_outage
from dispatchq.storage.replays import HOOKS_DUE, Replays
from dispatchq.storage.spool import Spool, SpoolEntry, SpoolKind, spool_dir
from dispatchq.storage.store import LEGACY_CLAIM
from dispatchq.tiers.after import replayed_hooks
from dispatchq.window.face import SLOT_LEASE
from dispatchq.window.limits import SessionOutcome
from dispatchq.window.marker import scope_pausing

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchq.core.judgement import Record
    from dispatchq.core.kinds import Kind
    from dispatchq.launcher.spawn import LaunchResult
    from dispatchq.runtime import Runtime
    from dispatchq.settings import Settings
    from dispatchq.tiers.hooks import SessionHooks
    from dispatchq.window.face import Window
    from dispatchq.window.messages import LimitSignal

__all__ = [
    "LATE_ANSWER",
    "LEGACY_CLAIM",
    "LOST_CONTACT",
    "MAX_ERRORS",
    "Holding",
    "answer",
    "cleanup_dir",
    "fail",
    "holder_pid",
    "host_bound",
    "kind_model",
    "limit_signals",
    "margin_of",
    "outcome_of",
    "parse_answer",
    "record_resume",
    "replay_answer",
    "replay_limit",
    "replay_spool",
    "requeue_front",
    "retry_or_fail",
    "spool_of",
    "spool_wait_of",
    "sweep_lapsed",
    "take_over",
]

log = logging.getLogger("dispatchq.session")

#: What a takeover after a lapsed lease says on the judgement's trail (and its reason).
LOST_CONTACT = "lost contact"
#: What an answer replayed from a spool after its claim was gone says on the trail.
LATE_ANSWER = "late answer"
#: A session that failed (not throttled) is asked this many times before the judgement fails.
MAX_ERRORS = 2

_SAID: set[str] = set()


def _say_once(level: int, message: str, *args: Any) -> None:
    key = message % args if args else message
    if key not in _SAID:
        _SAID.add(key)
        log.log(level, message, *args)


def host_bound(record: Record) -> bool:
    """Is the judgement bound to one host (its line is that host's, not the shared one)?"""
    return bool(record.host)


def margin_of(lease: float) -> float:
    """How long before its lease lapses a holder of shared-line work gives up (a quarter)."""
    return max(0.5, lease / 4)


def spool_of(data_dir: Path) -> Spool:
    """This host's spool."""
    return Spool(spool_dir(data_dir))


def spool_wait_of(settings: Settings) -> float:
    """How long past a lapsed lease another host leaves a judgement to its holder's own replay."""
    wait = settings.session_spool_wait
    return float(settings.session_lease if wait is None else wait)


class Holding:
    """The holder's side of one admitted session judgement: its claim, its lease, its writes.

    `window` is the caller's window on a bounded client (every write of the run goes through
    it); `cancel` is handed to the launcher and set when the holder fences itself; `fenced`
    says why (None while it holds). Start it before the spawn, `close` it after.
    """

    def __init__(
        self, window: Window, jid: str, slot: str, probes: Iterable[str], claim: str | None, *, bound: bool
    ) -> None:
        settings = window.settings
        self.jid = jid
        self.slot = slot
        self.probes = list(probes)
        self.claim = claim
        #: What every write of this holder carries: its token, or the one legacy pass.
        self.token = claim or LEGACY_CLAIM
        self.bound = bound
        self.lease = float(settings.session_lease)
        self.margin = margin_of(self.lease)
        self.interval = max(0.2, min(SLOT_LEASE / 3, self.lease / 6))
        #: How long past its lease the judgement is kept for this holder's own spool replay.
        self.wait = spool_wait_of(settings)
        timeout = max(0.5, min(5.0, self.lease / 4))
        records = window.records.bounded(timeout)
        self.replays = Replays(records.redis)
        self._own_client = records is not window.records
        self.window = copy.copy(window)
        self.window.records = records
        self.window.store = window.store.on(records)
        self.cancel = threading.Event()
        self.fenced: str | None = None
        self.last_sent = time.monotonic()
        self._stop = threading.Event()
        self._writes: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._renew_loop, name=f"lease-{slot}", daemon=True),
            threading.Thread(target=self._watch_loop, name=f"fence-{slot}", daemon=True),
            threading.Thread(target=self._write_loop, name=f"writes-{slot}", daemon=True),
        ]

    def start(self) -> None:
        try:
            self.hold_for_replay()  # from the first moment: a cut right after admission is covered too
        except Exception as error:  # the first renewal tries again
            why = type(error).__name__
            _say_once(logging.WARNING, "session %s: cannot hold it for its replay (%s)", self.jid, why)
        for thread in self._threads:
            thread.start()

    def hold_for_replay(self) -> None:
        """Keep the judgement from other hosts for lease + spool wait (see the module docstring)."""
        if self.claim is not None and self.wait > 0:
            self.replays.hold_for_replay(self.jid, self.claim, self.lease + self.wait)

    def write(self, call: Callable[[], object]) -> None:
        """A record write from inside the session's output loop: done on the writer thread."""
        self._writes.put(call)

    def close(self) -> None:
        """Stop renewing and writing (pending writes are given a moment), then free the slot."""
        self._stop.set()
        self._writes.put(None)
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(timeout=max(1.0, self.lease / 4))
        try:
            self.window.release(self.slot, self.probes)
            self.window.store.clear_running(self.jid, self.claim)
        except Exception as error:  # the slot's lease frees it by itself
            if not is_outage(error):
                raise
            _say_once(
                logging.WARNING, "session %s: cannot free its slot now (%s)", self.jid, type(error).__name__
            )
        finally:
            if self._own_client:
                self.window.records.disconnect()

    # --- the threads ----------------------------------------------------------------------
    def renew_once(self) -> None:
        """One round: the slot (for as long as the lease), the probes, the claim's lease."""
        sent = time.monotonic()
        self.window.renew_slot(self.slot, max(SLOT_LEASE, self.lease))
        for scope in self.probes:  # the probe follows the claim: elected and renewed for its lease
            self.window.store.renew_probe(scope, self.lease, holder=self.slot)
        if self.claim is not None and not self.window.records.renew_claim(self.jid, self.claim, self.lease):
            self._fence(f"{LOST_CONTACT}: its claim was taken or settled elsewhere", always=False)
            return
        self.last_sent = sent
        self.hold_for_replay()

    def _renew_loop(self) -> None:
        """Renew every `interval`; an error costs a round, never the thread."""
        while not self._stop.wait(self.interval):
            try:
                self.renew_once()
            except Exception as error:
                _say_once(
                    logging.WARNING,
                    "session %s: cannot renew its lease (%s); it keeps trying",
                    self.jid,
                    type(error).__name__,
                )

    def _watch_loop(self) -> None:
        """Watch the lease on a thread of its own: a renewal blocked on a silent link must not
        delay the fence past the lease (another host may take the judgement right after)."""
        step = max(0.05, min(0.25, self.margin / 4))
        while not self._stop.wait(step):
            overdue = time.monotonic() - self.last_sent
            if overdue > self.lease - self.margin:
                self._fence(f"{LOST_CONTACT} with Redis for {overdue:.0f}s (lease {self.lease:.0f}s)")
                if self.fenced is not None or self.bound:
                    return

    def _fence(self, why: str, *, always: bool = True) -> None:
        """Shared-line work ends its session (cancel); host-bound work runs on (and spools)."""
        if self.bound:
            _say_once(logging.WARNING, "session %s: %s; host-bound, it runs on", self.jid, why)
            return
        if self.fenced is None and (always or self.claim is not None):
            self.fenced = why
            log.warning("session %s: %s; ending it so that another host may take it over", self.jid, why)
            self.cancel.set()

    def _write_loop(self) -> None:
        while True:
            call = self._writes.get()
            if call is None:
                return
            try:
                call()
            except Exception as error:
                _say_once(
                    logging.WARNING,
                    "session %s: a record write failed (%s); the run goes on",
                    self.jid,
                    type(error).__name__,
                )

    # --- the spool ----------------------------------------------------------------------
    def spool_name(self) -> str:
        """The spool key of this holder: its claim, or (no token) one derived from the judgement."""
        return self.claim or "legacy-" + hashlib.sha256(self.jid.encode()).hexdigest()[:24]

    def spool(self, kind: SpoolKind, result: LaunchResult, started: float, **body: Any) -> bool:
        """Keep an outcome that cannot be written now; True when kept."""
        data = {
            "token": self.token,
            "stdout": result.stdout,
            "stderr": result.stderr[-4000:],
            "returncode": result.returncode,
            "timed_out": result.timed_out,
            "now": datetime.now(UTC).isoformat(),
            "started": started,
            "host": self.window.settings.host,
            **body,
        }
        entry = SpoolEntry(claim=self.spool_name(), kind=kind, jid=self.jid, body=data)
        path = spool_of(self.window.settings.data_dir).put(entry)
        log.warning(
            "session %s: Redis unreachable; its %s is kept in %s until it is back", self.jid, kind, path
        )
        return True


# --- another host's side: taking over after a lapsed lease ----------------------------------
def _running_info(window: Window, jid: str) -> dict[str, Any]:
    info = window.store.running().get(jid)
    return info if isinstance(info, dict) else {}


def _holder_here(window: Window, info: dict[str, Any]) -> str:
    """Where the holder ran, as this machine can tell: "dead" (here, its process gone), "me"
    (this very process: its job is over, so it left the judgement unsettled), "alive" (here,
    running: maybe on another job by now, so only the lease tells) or "elsewhere"."""
    pid = info.get("pid")
    if info.get("host") != window.settings.host or not isinstance(pid, int):
        return "elsewhere"
    if pid == os.getpid():
        return "me"
    return "alive" if process_alive(pid) else "dead"


def take_over(
    window: Window,
    record: Record,
    claim: str | None,
    slot: str | None,
    probes: list[str],
    *,
    sweeping: bool = False,
) -> str:
    """The lease rule for a running judgement whose holder seems gone.

    Returns "legacy" (no claim: the caller does what it did before tokens), "died" (its
    holder ran here and is gone, or RQ failed its job in this very worker: the caller counts
    a death), "held" (its lease lives, it is host-bound to another host, or its holder was on
    another host and the spool wait since its lease lapsed is not over: left alone),
    "gone" (not running under that claim any more) or "taken" (requeued uncharged, "lost
    contact", without `resume_session` unless host-bound). The sweep
    (`sweeping`) leaves a dead holder to RQ's death count, and takes over what a job of its
    own worker left unsettled (it could not write, and spooled nothing).
    """
    held = getattr(record, "claim", None)
    if not held:
        return "legacy"
    if claim and claim != held:
        return "gone"  # RQ's verdict on a job whose claim was taken over already
    info = _running_info(window, record.id)
    here = _holder_here(window, info) if info.get("claim") in (None, held) else "elsewhere"
    if here == "dead" or (here == "me" and not sweeping):
        return "died"
    if host_bound(record) and record.host != window.settings.host:
        return "held"
    if here == "elsewhere" and Replays(window.records.redis).waiting_for_replay(record.id, held):
        _say_once(
            logging.WARNING,
            "session judgement %s: its holder on %s lost contact; left to that host's own spool replay "
            "until the spool wait its holder set is over, then asked again",
            record.id,
            info.get("host") or "another host",
        )
        return "held"
    done = window.records.take_over(record.id, claim or held)
    if done < 0:
        return "held"
    if done == 0:
        return "gone"
    window.store.clear_running(record.id)
    if slot is not None:
        window.release(slot, probes)
    where = info.get("host") or "another host"
    why = f"{LOST_CONTACT} with {where}: its lease lapsed; asked again (no cost)"
    window.store.requeue_front(
        window.records,
        record.id,
        "queued",
        trail=TrailEntry(tier="session", outcome="requeued", why=why),
        fields={"reason": why, "resume_session": "" if not host_bound(record) else record_resume(record)},
        line=window.records.line_of(record.host),
        priority=record.priority,
        urgency=record.urgency,
    )
    log.warning("session judgement %s: %s", record.id, why)
    return "taken"


def record_resume(record: Record) -> str:
    return str(getattr(record, "resume_session", None) or getattr(record, "session_id", None) or "")


def sweep_lapsed(window: Window) -> int:
    """Take over every running session judgement whose lease lapsed (every host's loop runs it).

    The backstop of RQ's own abandoned-job handling, which may fire before a lease lapses
    (its heartbeat grace is not the lease) and then leaves the judgement to this sweep.
    """
    running = window.store.running()
    if not running:
        return 0
    taken = 0
    for record in window.records.get_many(sorted(running)):
        if record is None or record.status != "running" or not getattr(record, "claim", None):
            continue
        if str(getattr(record, "claim", "")).startswith("-"):
            continue
        if window.records.lease_alive(record.id):
            continue
        if take_over(window, record, None, None, [], sweeping=True) == "taken":
            taken += 1
    return taken


# --- replaying a spool ------------------------------------------------------------------------
def replay_spool(
    window: Window, *, runtime: Runtime | None = None, hooks: Mapping[str, SessionHooks] | None = None
) -> int:
    """Apply what this host kept while Redis was away; returns how many entries were done.

    A limit is raised whatever the claim (later lift wins, as always). An answer is applied
    if its claim is still the record's (`apply_answer`), else put on the trail as a late
    answer, once. An outcome applied under its claim runs the kind's after-session hooks
    (`hooks`, by kind name, as the session job has them; `runtime` is what they are handed),
    as the live run would have, once (`tiers.after`). Each entry's file goes only after it
    was applied: a replay cut off by a crash repeats it harmlessly. Stops at the first
    outage (the next round tries again).
    """
    spool = spool_of(window.settings.data_dir)
    done = 0
    for entry in spool.entries():
        try:
            if entry.kind == "limit":
                replay_limit(window, entry, runtime=runtime, hooks=hooks)
            else:
                _replay_answer(window, entry, runtime, hooks)
        except Exception as error:
            if is_outage(error):
                return done
            log.exception("cannot replay the spooled %s of %s; kept", entry.kind, entry.jid)
            continue
        spool.remove(entry)
        done += 1
    return done


def _replay_answer(
    window: Window, entry: SpoolEntry, runtime: Runtime | None, hooks: Mapping[str, SessionHooks] | None
) -> None:
    record = window.records.get(entry.jid)
    if record is None:
        log.warning("spooled answer of %s: the judgement no longer exists; dropped", entry.jid)
        return
    token = str(entry.body.get("token") or entry.claim)
    if record.status == "running" and replay_answer(window, record, entry):
        log.warning("session judgement %s: its spooled answer applied", entry.jid)
        replayed_hooks(runtime, hooks, window, record, entry, answered=True)
        return
    if getattr(record, "settled_by", None) == token:
        # Its answer landed (the live run's reply was lost, or a replay was cut off): only
        # the hooks may still be due.
        replayed_hooks(runtime, hooks, window, record, entry, answered=True)
        return
    sid = entry.body.get("session_id") or "?"
    where = entry.body.get("host") or "?"
    why = f"{LATE_ANSWER} from session {sid} on {where}: its claim was gone, not applied"
    late = TrailEntry.model_validate(
        {"tier": "session", "outcome": "late", "why": why, "value": entry.body.get("value")}
    )
    if window.records.late_trail(entry.jid, token, late):
        log.warning("session judgement %s: %s", entry.jid, why)


def holder_pid() -> int:
    """The pid a running entry names (so a worker on the same host can tell it died)."""
    return os.getpid()


# --- the holder's record writes (each fenced by its claim) ------------------------------
def requeue_front(
    window: Window,
    record: Record,
    why: str,
    *,
    status: str = "queued",
    trail_why: str | None = None,
    claim: str | None = None,
    **fields: Any,
) -> bool:
    """Back to the front of its line, in order, with nothing charged.

    `claim`: the holder's token when the holder puts it back (refused once the claim is gone).
    """
    values = {"reason": why} if status == "waiting" else {}
    values.update(fields)
    return window.store.requeue_front(
        window.records,
        record.id,
        status,
        trail=TrailEntry(tier="session", outcome="requeued", why=trail_why or why),
        fields=values,
        line=window.records.line_of(record.host),
        priority=record.priority,
        urgency=record.urgency,
        claim=claim,
    )


def parse_answer(kind: Kind, text: str) -> tuple[bool, Any]:
    """The session's answer as the kind's format wants it: (True, value) or (False, why not)."""
    assert kind.session is not None
    if kind.session.format != "json":
        return True, text
    body = text.strip()
    fenced = re.match(r"^```(?:json)?\s*\n(.*)\n```$", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        return True, json.loads(body)
    except json.JSONDecodeError as error:
        return False, f"session answer is not JSON ({error.msg} at line {error.lineno})"


def kind_model(kind: Kind) -> str | None:
    return kind.session.model if kind.session else None


def limit_signals(model: str | None, outcome: SessionOutcome) -> list[LimitSignal]:
    """The markers a limit names, each scoped to what it pauses for the kind's model."""
    assert outcome.limit is not None
    return [replace(s, scope=scope_pausing(s.scope, model)) for s in outcome.limits or (outcome.limit,)]


def answer(
    window: Window,
    record: Record,
    value: Any,
    meta: dict[str, Any],
    claim: str | None,
    *,
    note: str | None = None,
) -> bool:
    """The judgement is answered (`settled_by` names the claim, so a replay knows it landed);
    `note` is said after the session on its trail entry."""
    sid = meta.get("session_id")
    why = "; ".join(filter(None, [f"session {sid or '?'}", note]))
    done = window.records.transition(
        record.id,
        "answered",
        expect=["running"],
        trail=TrailEntry(tier="session", outcome="answered", why=why, **meta),
        fields={
            "tier": "session",
            "value": value,
            "reason": f"answered by session {sid or '?'}",
            "raw": meta,
            **({"settled_by": claim, HOOKS_DUE: claim} if claim else {}),
        },
        delete=["resume_session"],
        claim=claim,
    )
    if done:
        cleanup_dir(window.settings.data_dir, record)
    return bool(done)


def retry_or_fail(
    window: Window, record: Record, why: str, meta: dict[str, Any], *, claim: str | None = None
) -> str:
    """A session that only answers a question is simply asked again, a bounded number of times."""
    attempts = window.records.incr_attempts(record.id)
    if attempts >= MAX_ERRORS:
        return fail(window, record, why, meta, claim=claim)
    requeue_front(window, record, f"{why}; asking again", claim=claim)
    return "retrying"


def fail(window: Window, record: Record, why: str, meta: dict[str, Any], *, claim: str | None = None) -> str:
    window.records.transition(
        record.id,
        "failed",
        expect=["running"],
        trail=TrailEntry(tier="session", outcome="failed", why=why, **meta),
        fields={"tier": "session", "reason": why, **({"settled_by": claim} if claim else {})},
        claim=claim,
    )
    cleanup_dir(window.settings.data_dir, record)
    return "failed"


def cleanup_dir(data_dir: Path, record: Record) -> None:
    if not record.context.get("checkout"):
        shutil.rmtree(data_dir.expanduser() / "sessions" / record.id, ignore_errors=True)


def outcome_of(
    settings: Settings,
    stdout: str,
    returncode: int | None,
    stderr: str,
    now: datetime,
    *,
    backend: SessionBackend,
) -> SessionOutcome:
    """What a run amounted to, read by the backend whose CLI printed it."""
    return backend.read_outcome(
        stdout,
        now=now,
        default_tz=settings.timezone,
        unknown_reset=settings.unknown_reset_probe,
        returncode=returncode,
        stderr=stderr,
    )


def replay_answer(window: Window, record: Record, entry: SpoolEntry) -> bool:
    """A spooled answer applied, if the record still carries the claim that saw it."""
    body = entry.body
    return answer(
        window, record, body.get("value"), dict(body.get("meta") or {}), str(body.get("token") or entry.claim)
    )


def replay_limit(
    window: Window,
    entry: SpoolEntry,
    *,
    runtime: Runtime | None = None,
    hooks: Mapping[str, SessionHooks] | None = None,
) -> None:
    """A spooled usage limit raised whatever the claim (later lift wins); the holder's own
    judgement, if it still holds it, waits to resume as a cut-off one does, and its kind's
    after-session hooks run then (only the replay that puts it back runs them)."""
    body = entry.body
    now = datetime.fromisoformat(str(body.get("now")))
    outcome = outcome_of(
        window.settings,
        str(body.get("stdout") or ""),
        body.get("returncode"),
        str(body.get("stderr") or ""),
        now,
        backend=backend_for(str(body.get("backend") or DEFAULT_BACKEND)),
    )
    if outcome.limit is None:
        return
    started = body.get("started")
    reason = window.report_limit(
        limit_signals(body.get("model"), outcome),
        session=outcome.session_id,
        asked_at=started if isinstance(started, float) else None,
        credential=str(body.get("credential") or DEFAULT_CREDENTIAL),  # a spool from before pools: default
    )
    record = window.records.get(entry.jid)
    if record is None or record.status != "running":
        return
    sid = outcome.session_id
    fields = {"resume_session": sid} if sid else {}
    why = "cut off by the usage limit while Redis was away (replayed); will resume"
    back = requeue_front(
        window,
        record,
        reason,
        status="waiting",
        trail_why=why,
        claim=str(body.get("token") or entry.claim),
        **fields,
    )
    if back:
        replayed_hooks(runtime, hooks, window, record, entry, answered=False)
