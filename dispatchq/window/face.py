"""The window's one face: what the session tier asks before a spawn and tells after one.

A session's run used to reach into the marker five times (the slot, the blocking check,
opening the window, raising the marker, the audit), each time with the whole runtime.
`Window` gathers that behind two kinds of call:

- *may this spawn now?* — `admit` checks the markers that apply to each waiting
  judgement's model, takes a shared slot, elects the one probe after a lift, and claims
  the judgement, answering `Admission` or `Wait`; `closed_for` re-checks just before
  the spawn;
- *this is what the session reported* — `report_limit` raises the markers a limit names
  (and holds back every judgement they pause), `opened` takes the probed scopes down
  and releases everyone, `release` gives the slot and probes back.

Operators use the same object (`close`, `open`), and so does the scheduled retrigger
(`lift`). Everything it stores goes through `WindowStore`; the one thing it cannot do
itself, scheduling the retrigger with rq-scheduler, is handed in as `reschedule` by the
runtime that builds it once (`runtime.window`), so the window never imports the queue.
"""

from __future__ import annotations

import getpass
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dispatchq.core.status import (
    AuditEntry,
    BacklogPart,
    MarkerView,
    PoolCredential,
    PoolPart,
    RunningSession,
    SessionsPart,
    WindowPart,
)
from dispatchq.errors import UserError
from dispatchq.pools.credentials import DEFAULT_CREDENTIAL, Credential, Pool, qualify
from dispatchq.pools.routing import Route, route
from dispatchq.pools.routing import waiting_reason as pool_waiting_reason
from dispatchq.pools.spend import estimate_for, spend_periods
from dispatchq.window import marker as markers_
from dispatchq.window.limits import GENERAL_SCOPE, WEEKLY_SCOPE, LimitSignal, SessionOutcome, reprobe_backoff
from dispatchq.window.marker import Marker, applies, blocking, probing, waiting_reason
from dispatchq.window.pooling import credential_markers, slot_credential, slot_name, states_for
from dispatchq.window.poolstatus import credential_rows as pool_rows
from dispatchq.window.poolstatus import drain_estimate, drain_start, measured_rate, minutes_of
from dispatchq.window.usage import credential_rows, usage_rows

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.core.kinds import Kind
    from dispatchq.settings import Settings
    from dispatchq.storage.store import Store
    from dispatchq.storage.window import LineEntry, WindowStore

__all__ = ["SLOT_LEASE", "Admission", "Wait", "Window"]

SLOT_LEASE = 30.0  # seconds a session slot is held without renewal (a dead worker frees it)


@dataclass
class Admission:
    """One judgement may spawn now on `credential`, holding `slot` (and probing `probes`)."""

    jid: str
    slot: str
    probes: list[str] = field(default_factory=list)
    credential: str = DEFAULT_CREDENTIAL


@dataclass
class Wait:
    """Nothing may spawn now, and why."""

    why: str
    until: float | None = None  # wake at this instant (a lift), else on a wake message or a poll


def _no_reschedule(scope: str) -> None:
    """Used where no scheduler is wired (the workers time the lift themselves)."""


class _Pass:
    """One admission's reads, made once however many judgements it looks at."""

    def __init__(
        self,
        window: Window,
        pool: Pool,
        markers: list[Marker],
        now: float,
        unrunnable: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        self.window = window
        self.pool = pool
        self.markers = markers
        self.now = now
        self.unrunnable = unrunnable
        self.periods = spend_periods(now, window.settings.timezone)
        self.full: dict[str, str] = {}  # credential -> why it takes no more now (slots, a cap)
        self._stored: dict[str, Any] | None = None
        self._usage: dict[str, dict[str, Any]] | None = None

    def _read(self) -> None:
        """The pool's stored state, read only when routing needs more than the markers.

        One subscription credential (the pool before pools) routes on its markers alone: its
        slots are checked by the admission script, so an admission costs what it did.
        """
        if self._stored is not None:
            return
        pool = self.pool
        plain = pool.single and not any(c.metered for c in pool)
        store = self.window.store
        if plain:
            self._stored, self._usage = {}, {}
            return
        metered = [c.name for c in pool if c.metered]
        stored, usage = store.pool.snapshot(pool.names, self.periods, metered=metered, usage=not pool.single)
        self._stored, self._usage = dict(stored), usage

    def stored(self, credential: str) -> Any:
        """The stored state of one credential (None: not read, an idle `default`)."""
        self._read()
        assert self._stored is not None
        return self._stored.get(credential)

    def route(
        self,
        model: str | None,
        kind: str,
        urgency: str | None,
        kind_estimate: float | None,
        backends: Sequence[str] = (),
    ) -> Route:
        self._read()
        assert self._stored is not None and self._usage is not None
        states = states_for(
            self.pool,
            self.markers,
            model,
            stored=self._stored,
            usage=self._usage,
            kind_estimate=kind_estimate,
            now=self.now,
        )
        return route(
            states,
            priority=urgency,
            kind=kind,
            now=self.now,
            timezone=self.window.settings.timezone,
            backends=backends,
            unrunnable=self.unrunnable,
        )


class Window:
    """The usage window as the session tier, the operator and the retrigger see it."""

    def __init__(
        self,
        store: WindowStore,
        records: Store,
        settings: Settings,
        *,
        kinds: Callable[[], Mapping[str, Kind]] = dict,
        reschedule: Callable[[str], object] = _no_reschedule,
        pool: Callable[[], Pool] | None = None,
    ) -> None:
        self.store = store
        self.records = records
        self.settings = settings
        self._kinds = kinds
        self._reschedule = reschedule
        self._pool = pool

    def pool(self) -> Pool:
        """The credentials sessions may use (the environment's one, `default`, when none are configured)."""
        if self._pool is not None:
            return self._pool()
        return Pool.of_one(self.settings.session_credential_var, self.settings.session_concurrency)

    def credential(self, name: str) -> Credential | None:
        return self.pool().get(name)

    def _kind_parts(self, kind_name: str) -> tuple[str | None, float | None]:
        """A kind's session model and cost estimate (none when no config is readable here)."""
        try:
            kind = self._kinds().get(kind_name)
        except UserError:
            return None, None
        if kind is None or kind.session is None:
            return None, None
        return kind.session.model, getattr(kind.session, "cost_estimate", None)

    def _kind_backends(self, kind_name: str) -> tuple[str, ...]:
        """The backends a kind allows (none named, or no config readable here: the pool's first)."""
        try:
            kind = self._kinds().get(kind_name)
        except UserError:
            return ()
        return tuple(getattr(kind.session, "backends", ())) if kind is not None and kind.session else ()

    # --- reading ------------------------------------------------------------------------
    def get(self, scope: str) -> Marker | None:
        return markers_.get(self.store, scope)

    def markers(self) -> list[Marker]:
        return markers_.all_markers(self.store)

    def closed_for(self, model: str | None, credential: str = DEFAULT_CREDENTIAL) -> list[Marker]:
        """The markers of `credential` that forbid a spawn for `model` right now (re-checked
        before a spawn)."""
        return blocking(credential_markers(self.markers(), credential, model), model)

    def closed_everywhere(self, model: str | None) -> list[Marker]:
        """The closed markers when every credential of the pool is closed for `model`, else none."""
        markers = self.markers()
        found: list[Marker] = []
        for credential in self.pool():
            closed = blocking(credential_markers(markers, credential.name, model), model)
            if not closed:
                return []
            found += closed
        return found

    def audit_log(self, limit: int = 10) -> list[dict[str, Any]]:
        return self.store.audit_log(limit)

    def status(self) -> WindowPart:
        """The markers, the reported use, the sessions and the recent audit, as `status` shows them."""
        tz = self.settings.timezone
        markers = self.markers()
        public = [m.public(tz) for m in markers]
        # The headline: the plan's own window, 5-hour or weekly, whichever keeps it closed longer.
        plan = [m for m in public if m.scope in (GENERAL_SCOPE, WEEKLY_SCOPE)]
        up = [m for m in plan if m.up]
        general = max(up, key=lambda m: m.lifts_at_epoch or 0) if up else (plan[0] if plan else None)
        now = time.time()
        spawned, refused = self.store.session_counts()
        no_marker = MarkerView(scope=GENERAL_SCOPE, up=False, lifts_at=None, kind=None, message=None)
        usage = self.store.usage.read()
        running = {jid: RunningSession.model_validate(e) for jid, e in self.store.running().items()}
        pool = self.pool()
        return WindowPart(
            marker=general or no_marker,
            markers=public,
            window_usage=usage_rows(usage, now),
            credentials=credential_rows(self.store.usage.credentials(), now),
            sessions=SessionsPart(
                running=running,
                spawned=spawned,
                refused_at_spawn=refused,
                blocked=self.store.blocked(),
            ),
            window_audit=[AuditEntry.model_validate(entry) for entry in self.store.audit_log(5)],
            pool=PoolPart(
                credentials=pool_rows(
                    pool,
                    markers,
                    stored=self.store.pool.states(pool.names, spend_periods(now, tz)),
                    usage=usage,
                    running=[r.credential for r in running.values()],
                    now=now,
                    timezone=tz,
                )
            ),
        )

    def backlog(
        self, waiting: int, history: Iterable[Mapping[str, Any]], credentials: Sequence[PoolCredential]
    ) -> BacklogPart:
        """When the `waiting` session judgements (queued or waiting, not started) are estimated
        to be answered.

        `history` is the scheduler's per-minute deltas (`storage.history.series`): the rate is
        measured there; `credentials` (from `status`) say when the drain can start.
        """
        now = time.time()
        rate, hours = measured_rate(minutes_of(history))
        return drain_estimate(
            waiting,
            rate,
            drain_start(credentials, now),
            now=now,
            timezone=self.settings.timezone,
            rate_hours=hours,
        )

    @property
    def probe_lease(self) -> float:
        """How long a probe stays elected unrenewed: its session's lease (`DISPATCHQ_SESSION_LEASE`).

        The probe's holder renews it with its claim's lease (`tiers.lease.Holding`), so a probe
        session keeps the election however long it runs, and a dead holder's lapses with its claim.
        """
        return float(self.settings.session_lease)

    # --- may this spawn now? ------------------------------------------------------------
    def admit(
        self,
        holder: str,
        entries: Sequence[LineEntry],
        model_of: Callable[[str], str | None],
        unrunnable: Mapping[str, str] = MappingProxyType({}),
    ) -> Admission | Wait:
        """Pick the first waiting judgement some credential may run now; take its slot; claim it.

        `entries` are the heads of the lines, best first (urgent before normal before
        background, FIFO within). A judgement backing off after a transient throttle is
        skipped. For each other one the pool is routed (`dispatchq.pools.routing`): its usable
        credentials, best first, are tried in turn with the one admission script (markers,
        slot, spend cap, atomically); after a lift exactly one probe is elected per scope of a
        credential. A judgement no credential may take shows `waiting`, naming each one.
        `unrunnable` names the backends this host cannot run (backend -> why): their
        credentials are refused here, and another backend's, or another host, takes the work.
        """
        pool = self.pool()
        run = _Pass(self, pool, self.markers(), time.time(), unrunnable)
        now = run.now
        earliest: float | None = None
        why = "no session judgements waiting"
        self.store.describe(entries)
        for entry in entries:
            if len(run.full) == len(pool):
                break
            if entry.not_before > now:  # backing off after a transient throttle
                earliest = entry.not_before if earliest is None else min(earliest, entry.not_before)
                why = "backing off after a transient throttle"
                continue
            model = model_of(entry.kind)
            urgency = getattr(entry, "urgency", None) or None
            plan = run.route(
                model, entry.kind, urgency, self._kind_parts(entry.kind)[1], self._kind_backends(entry.kind)
            )
            if plan.waits:
                lift = plan.opens_at
                if lift is not None:
                    earliest = lift if earliest is None else min(earliest, lift)
                why = pool_waiting_reason(plan, single=pool.single, timezone=self.settings.timezone)
                if entry.status == "queued" and plan.waiting:
                    self.records.transition(entry.jid, "waiting", expect=["queued"], fields={"reason": why})
                continue
            admitted = self._try(run, entry, plan.usable, model, holder, urgency)
            if isinstance(admitted, Admission):
                return admitted
            if admitted:
                why = admitted
        if run.full and len(run.full) == len(pool):
            why = "; ".join(run.full.values()) if not pool.single else next(iter(run.full.values()))
        return Wait(why, earliest)

    def _try(
        self,
        run: _Pass,
        entry: LineEntry,
        usable: Sequence[Credential],
        model: str | None,
        holder: str,
        urgency: str | None,
    ) -> Admission | str:
        """Try `entry` on each usable credential in turn; the admission, or why none took it."""
        why = ""
        for credential in usable:
            if credential.name in run.full:
                continue
            slot = slot_name(holder, uuid.uuid4().hex[:8], credential.name)
            mine = credential_markers(run.markers, credential.name, model)
            estimate = self._estimate(run, credential, entry.kind)
            cap = credential.spend_cap if credential.metered else None
            verdict = self.store.pool.admit(
                credential.name,
                slot,
                lease=SLOT_LEASE,
                limit=credential.concurrency,
                markers=[m.scope for m in mine],
                estimate=estimate,
                caps=(cap.day, cap.month) if cap is not None else (None, None),
                periods=run.periods,
                reserve_open=credential.reserve_urgent and urgency == "urgent",
            )
            if verdict == "slots":
                run.full[credential.name] = (
                    f"all {credential.concurrency} session slot(s) busy"
                    if run.pool.single
                    else f"{credential.name}: all {credential.concurrency} session slot(s) busy"
                )
                continue
            if verdict != "ok":  # a marker or a cap moved since the markers were read
                why = f"{credential.name}: {verdict} refused"
                continue
            probes = self._elect(mine, model, run.now, slot)
            if probes is None:
                self._give_back(slot, [])
                why = "waiting for the probe session to show the window open"
                continue
            if self.records.claim_from_line(entry.line, entry.member, entry.jid):
                return Admission(entry.jid, slot, probes, credential.name)
            self._give_back(slot, probes)
            return why  # claimed elsewhere meanwhile: the next judgement
        return why

    def _estimate(self, run: _Pass, credential: Credential, kind: str) -> float:
        """What `credential` reserves for one session of `kind`: a metered one its expected cost."""
        if not credential.metered:
            return 0.0
        held = run.stored(credential.name)
        return estimate_for(self._kind_parts(kind)[1], held.recent if held is not None else ())

    def _give_back(self, slot: str, probes: Iterable[str]) -> None:
        """An admission that did not go through: slot, probes and reservation back, nothing charged."""
        self.release(slot, probes)
        self.store.pool.settle(slot, None, ran=False)

    def _elect(self, markers: Iterable[Marker], model: str | None, now: float, slot: str) -> list[str] | None:
        """The lifted scopes this slot probes, or None when another holder probes one of them."""
        probes: list[str] = []
        for m in probing(markers, model, now):
            if self.store.try_probe(m.scope, slot, self.probe_lease):
                probes.append(m.scope)
            else:
                self._end_probes(probes, slot)
                return None
        return probes

    def _end_probes(self, probes: Iterable[str], slot: str) -> None:
        for scope in probes:
            self.store.end_probe(scope, slot)

    def renew_slot(self, slot: str, lease: float = SLOT_LEASE) -> None:
        """Keep a running session's slot on its credential for `lease` more seconds."""
        name = slot_credential(slot)
        credential = self.credential(name)
        limit = credential.concurrency if credential is not None else self.settings.session_concurrency
        self.store.acquire_slot(slot, lease, limit, credential=name)

    def renew(self, slot: str, probes: Iterable[str]) -> None:
        """Keep a running session's slot and probe leases alive."""
        self.renew_slot(slot)
        for scope in probes:
            self.store.renew_probe(scope, self.probe_lease, holder=slot)

    def release(self, slot: str, probes: Iterable[str]) -> None:
        """The session is over (or never started): its slot and probes go back."""
        self.store.release_slot(slot, credential=slot_credential(slot))
        self._end_probes(probes, slot)

    def settle(self, slot: str, cost: float | None, *, ran: bool = True) -> None:
        """Charge the session its reported cost (None: the estimate reserved stays charged);
        `ran=False`: nothing was spawned, the reservation is given back."""
        self.store.pool.settle(slot, cost, ran=ran)

    def hold_paused(
        self, records: Callable[[], Iterable[Record]], model_of: Callable[[str], str | None]
    ) -> None:
        """Every queued judgement among `records()` that no credential may take shows `waiting`.

        `records` is only called when some marker is closed or a credential blocked, so an
        open window costs one read.
        """
        markers = self.markers()
        pool = self.pool()
        if not any(m.closed() for m in markers) and (pool.single or not self.store.pool.blocked()):
            return
        run = _Pass(self, pool, markers, time.time())
        for record in records():
            if record.status != "queued":
                continue
            plan = run.route(
                model_of(record.kind),
                record.kind,
                getattr(record, "urgency", None),
                self._kind_parts(record.kind)[1],
                self._kind_backends(record.kind),
            )
            if plan.waiting:
                why = pool_waiting_reason(plan, single=pool.single, timezone=self.settings.timezone)
                self.records.transition(record.id, "waiting", expect=["queued"], fields={"reason": why})

    # --- this is what the session reported ----------------------------------------------
    def report_usage(self, outcome: SessionOutcome, credential: str = DEFAULT_CREDENTIAL) -> None:
        """Keep what the session said of each of its credential's windows, and of its login's end."""
        now = time.time()
        reports = [
            {
                "window": qualify(credential, r.window),
                "utilization": r.utilization,
                "resets_at": r.resets_at,
                "status": r.status,
            }
            for r in outcome.usage
        ]
        if reports:
            self.store.usage.record(
                reports,
                reported_at=now,
                session=outcome.session_id,
                host=self.settings.host,
            )
        if outcome.credential_expires_at is not None:
            self.store.usage.record_credential(
                self.settings.host,
                outcome.credential_expires_at.timestamp(),
                reported_at=now,
            )

    def report_limit(
        self,
        signals: Iterable[LimitSignal],
        *,
        session: str | None,
        asked_at: float | None = None,
        credential: str = DEFAULT_CREDENTIAL,
    ) -> str:
        """The session hit a limit on `credential`: raise every marker it names there; the
        reason the judgement shows.

        `asked_at`: when that session started (a probe refused a moment after the stated reset
        is clock skew, however long the session took to report it).
        """
        raised = [
            self.raise_marker(signal, session=session, asked_at=asked_at, credential=credential)
            for signal in signals
        ]
        return waiting_reason(max(raised, key=lambda m: m.lifts_at))

    def opened(self, scopes: Iterable[str], why: str) -> None:
        """A probe showed the window open: take each probed scope down."""
        for scope in scopes:
            self.window_open(scope, why=why)

    def raise_marker(
        self,
        signal: LimitSignal,
        *,
        session: str | None,
        source: str = "session",
        reason: str = "",
        utilization: float | None = None,
        asked_at: float | None = None,
        credential: str = DEFAULT_CREDENTIAL,
    ) -> Marker:
        """Record that the window is closed until `signal.lifts_at`; keep the later time.

        A refusal seen while the window was being probed with the same stated time as
        before is pushed out by `DISPATCHQ_REPROBE_MIN`, doubling, so a stale "resets 3am"
        message cannot make a spawn loop.
        """
        scope = qualify(credential, signal.scope or GENERAL_SCOPE)
        current = self.get(scope)
        refusals = 1
        if current is not None and not current.closed() and source == "session":
            signal, refusals = reprobe_backoff(
                signal,
                previous_stated=current.stated,
                previous_refusals=current.refusals,
                now=datetime.now(UTC),
                reprobe_min=self.settings.reprobe_min,
                asked_at=datetime.fromtimestamp(asked_at, UTC) if asked_at is not None else None,
                previous_stated_at=(
                    datetime.fromtimestamp(current.stated_at, UTC) if current.stated_at is not None else None
                ),
            )
        fields = {
            "kind": signal.kind,
            "message": signal.message[:1000],
            "session": session or "",
            "set_at": repr(time.time()),
            "stated": signal.stated,
            "refusals": str(refusals),
            "source": source,
            "reason": reason,
        }
        if utilization is not None:
            fields["utilization"] = repr(utilization)
        # Always written: an earlier marker's instant must not speak for this statement.
        fields["stated_at"] = repr(signal.stated_at.timestamp()) if signal.stated_at is not None else ""
        moved = self.store.raise_marker(scope, signal.lifts_at.timestamp(), fields)
        marker = self.get(scope)
        assert marker is not None
        if moved:
            markers_.audit(
                self.store, scope, "closed", marker, who=session or source, reason=reason or signal.message
            )
            self._reschedule(scope)
            self._mark_waiting(marker)
        return marker

    def window_open(self, scope: str, *, why: str, who: str = "probe") -> bool:
        """A probe (or an operator) showed the window open: remove the marker, release everyone."""
        marker = self.get(scope)
        deleted = self.store.remove_marker(scope)
        if marker is not None:
            markers_.audit(self.store, scope, "opened", marker, who=who, reason=why)
            self._release_waiting()
        if marker is not None and marker.retrigger:
            self._reschedule(scope)  # cancels the now-pointless job
        return deleted

    def lift(self, scope: str) -> str:
        """The scheduled retrigger: at the lift instant, take the marker down to probing."""
        marker = self.get(scope)
        if marker is None:
            return "no marker"
        if marker.closed():
            return (
                f"marker now says {datetime.fromtimestamp(marker.lifts_at, UTC).isoformat()}: nothing to do"
            )
        self.store.lift_to_probing(scope)
        return "lifted: one probe goes first"

    # --- operators ----------------------------------------------------------------------
    def close(
        self, until: datetime, *, reason: str, who: str | None = None, credential: str = DEFAULT_CREDENTIAL
    ) -> Marker:
        """An operator reserves a credential's window (e.g. for their own sessions) until `until`."""
        signal = LimitSignal(
            lifts_at=until.astimezone(UTC),
            kind="operator",
            scope=GENERAL_SCOPE,
            message=reason or "closed by an operator",
            stated=f"operator:{until.isoformat()}",
            source="status",
        )
        who = who or getpass.getuser()
        # An operator's close replaces any earlier time (it may shorten a reservation too).
        self.store.delete_marker(qualify(credential, GENERAL_SCOPE))
        return self.raise_marker(
            signal, session=f"operator {who}", source="operator", reason=reason, credential=credential
        )

    def open(
        self, *, who: str | None = None, scope: str | None = None, credential: str | None = None
    ) -> list[str]:
        """An operator opens the window now (of one credential, or all): markers removed, its
        block (an authentication failure) cleared, waiting sessions released."""
        who = who or getpass.getuser()
        opened = []
        if credential is not None and self.store.pool.unblock(credential):
            self._release_waiting()
        for marker in self.markers():
            if credential is not None and marker.credential != credential:
                continue
            if scope is None or marker.scope == scope:
                self.window_open(marker.scope, why=f"opened by operator {who}", who=f"operator {who}")
                opened.append(marker.scope)
        return opened

    # --- the judgements a marker holds back ---------------------------------------------
    def _line_records(self) -> list[Record]:
        return [r for r in self.records.get_many(self._line_ids()) if r is not None]

    def _line_ids(self) -> list[str]:
        ids: list[str] = []
        for line in self.store.all_lines():
            ids += self.records.line_ids(line)
        return ids

    def _mark_waiting(self, marker: Marker) -> None:
        """Make the pause visible on every judgement it holds back (status `waiting`, with why).

        With several credentials a judgement is held back only when no other one may take it:
        routing decides that (`hold_paused`), the rest stay queued for the open peers. With one,
        the line moves in chunks of one script call each, reading no record whole: a weekly
        limit over a backlog of a million takes under a minute (bench/backlog.py), not an hour.
        """
        if not self.pool().single:
            self.hold_paused(self._line_records, lambda name: self._kind_parts(name)[0])
            return
        ids = self._line_ids()
        try:
            kinds = self._kinds()
        except UserError:  # no readable config here (an operator's shell): treat every kind as default-model
            kinds = {}
        models = {name: kind.session.model if kind.session else None for name, kind in kinds.items()}
        paused = {name for name, model in models.items() if applies(marker.scope, model)}
        if len(paused) < len(models) or not applies(marker.scope, None):  # a model's own limit
            ids = [
                jid
                for jid, kind in zip(ids, self._kinds_of(ids), strict=True)
                if kind in paused or (kind is not None and kind not in models and applies(marker.scope, None))
            ]
        self.records.transition_many(
            ids, "waiting", expect=["queued", "waiting"], fields={"reason": waiting_reason(marker)}
        )

    def _kinds_of(self, ids: list[str]) -> list[str | None]:
        """Each judgement's kind from its input alone (None: its record is gone)."""
        return [json.loads(raw).get("kind") if raw else None for raw in self.records.inputs(ids)]

    def _release_waiting(self) -> None:
        ids = self._line_ids()
        held = [
            jid
            for jid, (status, reason) in zip(
                ids, self.records.fields_of(ids, "status", "reason"), strict=True
            )
            if status == "waiting" and (reason or "").startswith("usage window")
        ]
        self.records.transition_many(held, "queued", expect=["waiting"], delete=["reason"])
