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
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dispatchq.core.status import AuditEntry, MarkerView, RunningSession, SessionsPart, WindowPart
from dispatchq.errors import UserError
from dispatchq.window import marker as markers_
from dispatchq.window.limits import GENERAL_SCOPE, LimitSignal, SessionOutcome, reprobe_backoff
from dispatchq.window.marker import Marker, applies, blocking, probing, waiting_reason
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
    """One judgement may spawn now, holding `slot` (and probing `probes`)."""

    jid: str
    slot: str
    probes: list[str] = field(default_factory=list)


@dataclass
class Wait:
    """Nothing may spawn now, and why."""

    why: str
    until: float | None = None  # wake at this instant (a lift), else on a wake message or a poll


def _no_reschedule(scope: str) -> None:
    """Used where no scheduler is wired (the workers time the lift themselves)."""


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
    ) -> None:
        self.store = store
        self.records = records
        self.settings = settings
        self._kinds = kinds
        self._reschedule = reschedule

    # --- reading ------------------------------------------------------------------------
    def get(self, scope: str) -> Marker | None:
        return markers_.get(self.store, scope)

    def markers(self) -> list[Marker]:
        return markers_.all_markers(self.store)

    def closed_for(self, model: str | None) -> list[Marker]:
        """The markers that forbid a spawn for `model` right now (re-checked before a spawn)."""
        return blocking(self.markers(), model)

    def audit_log(self, limit: int = 10) -> list[dict[str, Any]]:
        return self.store.audit_log(limit)

    def status(self) -> WindowPart:
        """The markers, the reported use, the sessions and the recent audit, as `status` shows them."""
        tz = self.settings.timezone
        public = [m.public(tz) for m in self.markers()]
        general = next((m for m in public if m.scope == GENERAL_SCOPE), None)
        now = time.time()
        spawned, refused = self.store.session_counts()
        no_marker = MarkerView(scope=GENERAL_SCOPE, up=False, lifts_at=None, kind=None, message=None)
        return WindowPart(
            marker=general or no_marker,
            markers=public,
            window_usage=usage_rows(self.store.usage.read(), now),
            credentials=credential_rows(self.store.usage.credentials(), now),
            sessions=SessionsPart(
                running={jid: RunningSession.model_validate(e) for jid, e in self.store.running().items()},
                spawned=spawned,
                refused_at_spawn=refused,
                blocked=self.store.blocked(),
            ),
            window_audit=[AuditEntry.model_validate(entry) for entry in self.store.audit_log(5)],
        )

    @property
    def probe_lease(self) -> int:
        return self.settings.probe_grace * 2 + 30

    # --- may this spawn now? ------------------------------------------------------------
    def admit(
        self, holder: str, entries: Sequence[LineEntry], model_of: Callable[[str], str | None]
    ) -> Admission | Wait:
        """Take a slot and pick the first waiting judgement no marker pauses; claim it.

        `entries` are the heads of the lines, best first; a judgement backing off after a
        transient throttle, or paused by a closed marker of its model, is skipped (the next
        kind may run on another model). After a lift exactly one probe is elected per scope.
        """
        markers = self.markers()
        slot = f"{holder}:{uuid.uuid4().hex[:8]}"
        if not self.store.acquire_slot(slot, SLOT_LEASE, self.settings.session_concurrency):
            return Wait(f"all {self.settings.session_concurrency} session slot(s) busy")
        now = time.time()
        earliest: float | None = None
        why = "waiting for the probe session to show the window open"
        self.store.describe(entries)
        for entry in entries:
            if entry.not_before > now:  # backing off after a transient throttle
                earliest = entry.not_before if earliest is None else min(earliest, entry.not_before)
                why = "backing off after a transient throttle"
                continue
            model = model_of(entry.kind)
            closed = blocking(markers, model, now)
            if closed:
                lift = max(m.lifts_at for m in closed)
                earliest = lift if earliest is None else min(earliest, lift)
                why = closed[0].message or f"usage window closed ({closed[0].kind})"
                if entry.status == "queued":
                    self.hold(entry.jid, closed)
                continue
            probes = self._elect(markers, model, now, slot)
            if probes is None:
                continue
            if self.records.claim_from_line(entry.line, entry.member, entry.jid):
                return Admission(entry.jid, slot, probes)
            self._end_probes(probes, slot)
        self.store.release_slot(slot)
        return Wait(why, earliest)

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

    def renew(self, slot: str, probes: Iterable[str]) -> None:
        """Keep a running session's slot and probe leases alive."""
        self.store.acquire_slot(slot, SLOT_LEASE, self.settings.session_concurrency)
        for scope in probes:
            self.store.renew_probe(scope, self.probe_lease)

    def release(self, slot: str, probes: Iterable[str]) -> None:
        """The session is over (or never started): its slot and probes go back."""
        self.store.release_slot(slot)
        self._end_probes(probes, slot)

    def hold(self, jid: str, closed: Sequence[Marker]) -> None:
        """Show why a judgement that joined the line while the window was closed is held back."""
        reason = waiting_reason(max(closed, key=lambda m: m.lifts_at))
        self.records.transition(jid, "waiting", expect=["queued"], fields={"reason": reason})

    def hold_paused(
        self, records: Callable[[], Iterable[Record]], model_of: Callable[[str], str | None]
    ) -> None:
        """Every queued judgement among `records()` that a closed marker holds back shows `waiting`.

        `records` is only called when some marker is closed, so an open window costs one read.
        """
        closed_markers = [m for m in self.markers() if m.closed()]
        if not closed_markers:
            return
        for record in records():
            if record.status == "queued":
                closed = blocking(closed_markers, model_of(record.kind))
                if closed:
                    self.hold(record.id, closed)

    # --- this is what the session reported ----------------------------------------------
    def report_usage(self, outcome: SessionOutcome) -> None:
        """Keep what the session said of each window's use and of its login's end, for people."""
        now = time.time()
        reports = [
            {"window": r.window, "utilization": r.utilization, "resets_at": r.resets_at, "status": r.status}
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
        self, signals: Iterable[LimitSignal], *, session: str | None, asked_at: float | None = None
    ) -> str:
        """The session hit a limit: raise every marker it names; the reason the judgement shows.

        `asked_at`: when that session started (a probe refused a moment after the stated reset
        is clock skew, however long the session took to report it).
        """
        raised = [self.raise_marker(signal, session=session, asked_at=asked_at) for signal in signals]
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
    ) -> Marker:
        """Record that the window is closed until `signal.lifts_at`; keep the later time.

        A refusal seen while the window was being probed with the same stated time as
        before is pushed out by `DISPATCHQ_REPROBE_MIN`, doubling, so a stale "resets 3am"
        message cannot make a spawn loop.
        """
        scope = signal.scope or GENERAL_SCOPE
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
    def close(self, until: datetime, *, reason: str, who: str | None = None) -> Marker:
        """An operator reserves the window (e.g. for their own sessions) until `until`."""
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
        self.store.delete_marker(GENERAL_SCOPE)
        return self.raise_marker(signal, session=f"operator {who}", source="operator", reason=reason)

    def open(self, *, who: str | None = None, scope: str | None = None) -> list[str]:
        """An operator opens the window now: markers removed, waiting sessions released."""
        who = who or getpass.getuser()
        opened = []
        for marker in self.markers():
            if scope is None or marker.scope == scope:
                self.window_open(marker.scope, why=f"opened by operator {who}", who=f"operator {who}")
                opened.append(marker.scope)
        return opened

    # --- the judgements a marker holds back ---------------------------------------------
    def _line_records(self) -> list[Record]:
        ids: list[str] = []
        for line in self.store.all_lines():
            ids += self.records.line_ids(line)
        return [r for r in self.records.get_many(ids) if r is not None]

    def _mark_waiting(self, marker: Marker) -> None:
        """Make the pause visible on every judgement it holds back (status `waiting`, with why)."""
        reason = waiting_reason(marker)
        try:
            kinds = self._kinds()
        except UserError:  # no readable config here (an operator's shell): treat every kind as default-model
            kinds = {}
        for record in self._line_records():
            kind = kinds.get(record.kind)
            model = kind.session.model if kind and kind.session else None
            if record.status in ("queued", "waiting") and applies(marker.scope, model):
                self.records.transition(
                    record.id, "waiting", expect=["queued", "waiting"], fields={"reason": reason}
                )

    def _release_waiting(self) -> None:
        for record in self._line_records():
            if record.status == "waiting" and (record.reason or "").startswith("usage window"):
                self.records.transition(record.id, "queued", expect=["waiting"], delete=["reason"])
