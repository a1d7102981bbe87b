"""The triage engine: one entry point that the CLI and the typed worker both call.

`triage()` asks only what it does not already know, stores the answers under the
decision key, resolves the table (`dispatchq.triage.rules`), performs what resolved to
`apply`, and records the run. Where the answers come from is the caller's business:
the `ask` callable is the provider (the typed tier), an answers file, or a keyless
stand-in, so everything here runs in tests without a network.

Why the pieces sit where they do:

- Answers are stored before anything is performed, so a crash mid-run never costs a
  second provider request. Errors, keyless runs and missing answers are not stored:
  the next delivery asks again.
- The mode is not in the decision key, so shadow → suggest → auto reuses every answer
  and only the outcome is recomputed.
- Nothing is performed in shadow mode, by construction (`apply` cannot resolve there)
  and by a guard in `_perform`, so shadow writes nothing outside dispatchq's store.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from dispatchq.core.answers import Answer, outside_question
from dispatchq.errors import AnswerError, ExecutorError, UserError
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.budget import HOUR, Budget, BudgetLimit, RollingBudget, RunBudget, budget_for
from dispatchq.triage.executors import Command, Executor, Ledger, comment_marker
from dispatchq.triage.rules import ActionSpec, Event, Mode, TriageConfig, decision_key
from dispatchq.triage.status import outcome_counts, status_section
from dispatchq.triage.table import Entry, Knowledge, RuleError, questions_to_ask, resolve

__all__ = [
    "FAILED",
    "HOUR",
    "NOT_EXECUTED",
    "REFUSED",
    "RUNS_KEPT",
    "AnswersFrom",
    "Ask",
    "AskResult",
    "Budget",
    "BudgetLimit",
    "ReplayChange",
    "ReplayReport",
    "RollingBudget",
    "RunBudget",
    "StoredDecision",
    "TriageResult",
    "TriageStore",
    "answers_file_ask",
    "apply_suggested",
    "budget_for",
    "keyless_ask",
    "outcome_counts",
    "replay",
    "status_section",
    "triage",
]

log = logging.getLogger(__name__)

AnswersFrom = Literal["provider", "file"]
RUNS_KEPT = 200

# ------------------------------------------------------------------------------------ asking


@dataclass(frozen=True)
class AskResult:
    """What the provider said about the questions it was handed.

    - `answers`: question id → Answer, for the questions it answered.
    - `unanswered`: asked but nothing came back, id → why (`keyless`, `provider error
      (TypeSafeRateLimitError)`, `dropped`...). Row 4, `no_answers`.
    - `over_budget`: not asked because a budget of the caller's own (the hourly one of
      enqueued triage) was spent. Row 3, `budget_exhausted`.
    - `requests`: provider requests made (a batched request counts 1, a cache hit 0);
      the engine charges them to its budget.

    A question handed over but absent from all three counts as asked and dropped.
    """

    answers: Mapping[str, Answer] = field(default_factory=dict)
    unanswered: Mapping[str, str] = field(default_factory=dict)
    over_budget: frozenset[str] = frozenset()
    requests: int = 0


#: `ask(state, questions) -> AskResult`: `state` is the event's `state` (what the
#: provider judges), `questions` maps question ids to SDK question dicts
#: (`{"type": "noul", "instructions": ...}`), ready for `TypeSafeClient.system_one`.
#: Called at most once per `triage()` call, only with questions not already stored,
#: and never when the budget is spent.
Ask = Callable[[Any, Mapping[str, dict[str, Any]]], AskResult]


def keyless_ask(state: Any, questions: Mapping[str, dict[str, Any]]) -> AskResult:
    """No key, no request: every question is asked and comes back empty."""
    return AskResult(unanswered=dict.fromkeys(questions, "keyless"))


def answers_file_ask(wire: Any, *, source: str = "answers file") -> Ask:
    """An `ask` that reads the SDK's wire answers from a mapping (the `--answers` file).

    Malformed answers are the person's mistake: UserError, before anything runs.
    """
    if not isinstance(wire, Mapping):
        raise UserError(f"{source}: expected an object mapping question ids to answers")
    parsed: dict[str, Answer] = {}
    for qid, raw in wire.items():
        try:
            parsed[str(qid)] = Answer.from_wire(str(qid), raw)
        except AnswerError as error:
            raise UserError(f"{source}: {error}") from None

    def ask(state: Any, questions: Mapping[str, dict[str, Any]]) -> AskResult:
        found = {q: parsed[q] for q in questions if q in parsed}
        missing = {q: f"not in the {source}" for q in questions if q not in parsed}
        return AskResult(answers=found, unanswered=missing, requests=0)

    return ask


# ------------------------------------------------------------------------------------- store


@dataclass(frozen=True)
class StoredDecision:
    """Everything needed to serve, replay or apply a decision without the provider."""

    decision_id: str
    event: Event
    config_hash: str
    answers: Mapping[str, Answer]
    unanswered: Mapping[str, str]
    over_budget: frozenset[str]
    answers_from: AnswersFrom
    result: Mapping[str, Any] | None
    created: float
    updated: float

    def knowledge(self) -> Knowledge:
        return Knowledge(dict(self.answers), dict(self.unanswered), self.over_budget)


class TriageStore:
    """Triage decisions in dispatchq's Redis: answers, last resolution, run counts.

    The domain side of `TriageStorage`: it turns stored JSON into events, answers and
    decisions and back. One stored decision per decision key, indexed by time for
    replay; recent runs' counts in a capped list for `dispatchq status`.
    """

    def __init__(self, storage: TriageStorage) -> None:
        self.storage = storage
        self.ledger = Ledger(storage)

    def load(self, decision_id: str) -> StoredDecision | None:
        data = self.storage.decision(decision_id)
        if data is None:
            return None
        return StoredDecision(
            decision_id=decision_id,
            event=Event.from_json(data["event"]),
            config_hash=data["config_hash"],
            answers={q: Answer.from_json(a) for q, a in data["answers"].items()},
            unanswered=data["unanswered"],
            over_budget=frozenset(data["over_budget"]),
            answers_from=cast(AnswersFrom, data["answers_from"]),
            result=data["result"],
            created=data["created"],
            updated=data["updated"],
        )

    def save_answers(
        self,
        decision_id: str,
        event: Event,
        config_hash: str,
        knowledge: Knowledge,
        answers_from: AnswersFrom,
    ) -> None:
        self.storage.save_decision(
            decision_id,
            event=event.to_json(),
            config_hash=config_hash,
            answers={q: a.to_json() for q, a in knowledge.answers.items()},
            unanswered=dict(knowledge.unanswered),
            over_budget=sorted(knowledge.over_budget),
            answers_from=answers_from,
            now=time.time(),
        )

    def save_result(self, decision_id: str, result: Mapping[str, Any]) -> None:
        self.storage.save_decision_result(decision_id, result)

    def since(self, since: float | None = None) -> list[StoredDecision]:
        records = [self.load(i) for i in self.storage.decision_ids(since)]
        return [r for r in records if r is not None]

    def find(self, decision_id: str) -> StoredDecision:
        """A decision by id or by an unambiguous prefix of at least 8 characters."""
        wanted = decision_id.strip().lower()
        record = self.load(wanted)
        if record is not None:
            return record
        if len(wanted) >= 8:
            matches = [i for i in self.storage.decision_ids() if i.startswith(wanted)]
            if len(matches) == 1:
                found = self.load(matches[0])
                if found is not None:
                    return found
            if len(matches) > 1:
                raise UserError(f"decision id {decision_id!r} is ambiguous ({len(matches)} decisions match)")
        raise UserError(f"no triage decision {decision_id!r}")

    def mark_needs_triage(self, decision_id: str, event: Event, label: str, mode: Mode) -> None:
        record = {
            "target": event.target,
            "event": event.event,
            "label": label,
            "mode": mode,
            "time": time.time(),
        }
        self.storage.mark_needs_triage(decision_id, record)

    def needs_triage(self) -> dict[str, dict[str, Any]]:
        return self.storage.needs_triage()

    def record_run(self, result: TriageResult) -> None:
        line = {
            "time": time.time(),
            "decision_id": result.decision_id,
            "event": result.event.event,
            "target": result.event.target,
            "mode": result.mode,
            "requests": result.requests,
            "counts": result.counts(),
        }
        self.storage.push_run(line, RUNS_KEPT)

    def recent_runs(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.storage.recent_runs(limit)


# ------------------------------------------------------------------------------------ result

#: Reasons an entry resolved to apply ends with when the executor did not carry it out:
#: counted under these in `status`, listed as Failed, never as Applied.
FAILED = "failed"
REFUSED = "refused"
NOT_EXECUTED = frozenset({FAILED, REFUSED})


@dataclass(frozen=True)
class TriageResult:
    decision_id: str
    event: Event
    mode: Mode
    entries: tuple[Entry, ...]
    errors: tuple[RuleError, ...] = ()
    escalated: Mapping[str, Any] | None = None
    requests: int = 0
    asked: tuple[str, ...] = ()
    reused: tuple[str, ...] = ()
    escalation_cleared: str | None = None

    @property
    def applied(self) -> list[Entry]:
        """Actions the executor carried out (or found done): not those it failed or refused."""
        return [e for e in self.entries if e.outcome == "apply" and e.reason not in NOT_EXECUTED]

    @property
    def failed(self) -> list[Entry]:
        """Actions resolved to apply whose write failed or was refused: reported, never counted applied."""
        return [e for e in self.entries if e.outcome == "apply" and e.reason in NOT_EXECUTED]

    @property
    def suggested(self) -> list[Entry]:
        return [e for e in self.entries if e.outcome == "suggest"]

    @property
    def suppressed(self) -> list[Entry]:
        return [e for e in self.entries if e.outcome == "suppress"]

    def counts(self) -> dict[str, int]:
        counts = Counter(e.reason for e in self.entries)
        if self.errors:
            counts["if_error"] = len(self.errors)
        if self.escalated:
            counts["escalated"] = 1
        return dict(counts)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "event": self.event.event,
            "target": self.event.target,
            "mode": self.mode,
            "applied": [e.to_json() for e in self.applied],
            "failed": [e.to_json() for e in self.failed],
            "suggested": [e.to_json() for e in self.suggested],
            "suppressed": [e.to_json() for e in self.suppressed],
            "errors": [e.to_json() for e in self.errors],
            "escalated": dict(self.escalated) if self.escalated else None,
            "requests": self.requests,
            "asked": list(self.asked),
            "reused": list(self.reused),
            "escalation_cleared": self.escalation_cleared,
        }

    def render(self, config: TriageConfig | None = None) -> str:
        """The person's view: suppressed is the product in shadow mode, so it is never hidden."""

        def qtype(entry: Entry) -> str | None:
            if config is None or entry.question is None or entry.question not in config.questions:
                return None
            return config.questions[entry.question].type

        lines = [
            f"triage {self.event.event} {self.event.target}  mode {self.mode}"
            f"  decision {self.decision_id[:16]}",
            f"  provider requests: {self.requests}"
            + (f"  asked: {', '.join(self.asked)}" if self.asked else "")
            + (f"  answers reused: {', '.join(self.reused)}" if self.reused else ""),
        ]
        for title, entries in (
            ("Applied", self.applied),
            ("Failed", self.failed),
            ("Suggested", self.suggested),
            ("Suppressed", self.suppressed),
        ):
            if title == "Failed" and not entries:
                continue
            lines.append(f"{title} ({len(entries)})")
            lines.extend("  " + e.render(qtype(e)).replace("\n", "\n  ") for e in entries)
        if self.errors:
            lines.append(f"Errors ({len(self.errors)})")
            lines.extend(f"  ! [{e.rule}] if: {e.message}" for e in self.errors)
        if self.escalated:
            lines.append(f"Escalated: {self.escalated.get('label')} ({self.escalated.get('executed')})")
        if self.escalation_cleared:
            lines.append(f"Escalation cleared: {self.escalation_cleared}")
        if not self.entries and not self.errors:
            lines.append("no rule planned an action for this event")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------ engine


def triage(
    event: Event,
    config: TriageConfig,
    *,
    ask: Ask,
    store: TriageStore,
    executor: Executor,
    budget: Budget,
    mode_override: Mode | None = None,
    answers_from: AnswersFrom = "provider",
) -> TriageResult:
    """Triage one event: reuse stored answers, ask for the rest, resolve, act, record.

    `answers_from="file"` is for `--answers`: the file is authoritative, so stored
    answers are not reused, and what it says is stored marked as such so that a later
    provider run asks the provider instead of trusting a what-if.
    """
    mode: Mode = mode_override or config.mode
    needed = config.questions_for(event.event)
    decision_id = decision_key(event, config)

    stored = store.load(decision_id)
    answers: dict[str, Answer] = {}
    if stored is not None and answers_from == "provider" and stored.answers_from == "provider":
        answers = {q: a for q, a in stored.answers.items() if q in needed}
    reused = tuple(sorted(answers))

    # Only what a rule that can still fire depends on: `if`s that need only the event (or
    # the answers already known) are evaluated first, so an excluded event costs nothing.
    missing = sorted(questions_to_ask(config, event, answers))
    unanswered: dict[str, str] = {}
    over_budget: set[str] = set()
    requests = 0
    asked: tuple[str, ...] = ()
    refused = budget.reserve() if missing else None
    if refused is not None:
        over_budget = set(missing)
        unanswered = dict.fromkeys(missing, refused)  # row 3 says why: spent of what, refills when
    elif missing:
        asked = tuple(missing)
        said = _ask(ask, event, config, missing)
        requests = max(0, int(said.requests))
        budget.settle(requests)
        for qid in missing:
            answer = said.answers.get(qid)
            expected = config.questions[qid].type
            outside = outside_question(answer, config.questions[qid].wire()) if answer is not None else None
            if answer is not None and answer.type != expected:
                unanswered[qid] = f"answer is a {answer.type}, the question is a {expected}"
            elif answer is not None and outside is not None:
                # Never act on an answer outside the question, whoever gave it.
                unanswered[qid] = f"outside the question: {outside}"
            elif answer is not None:
                answers[qid] = answer if answer.question == qid else replace(answer, question=qid)
            elif qid in said.over_budget:
                over_budget.add(qid)
            else:
                unanswered[qid] = said.unanswered.get(qid, "dropped")

    knowledge = Knowledge(answers, unanswered, frozenset(over_budget))
    store.save_answers(decision_id, event, config.hash, knowledge, answers_from)

    resolution = resolve(config, event, knowledge, executor=executor, mode=mode)
    entries = tuple(
        _perform(
            e, decision_id=decision_id, event=event, config=config, store=store, executor=executor, mode=mode
        )
        if e.outcome == "apply"
        else e
        for e in resolution.entries
    )

    escalated: dict[str, Any] | None = None
    cleared: str | None = None
    if config.escalate and not resolution.undecided and mode != "shadow" and resolution.entries:
        cleared = _clear_escalation(store, executor, event.target, config.escalate)
    if config.escalate and resolution.undecided:
        store.mark_needs_triage(decision_id, event, config.escalate, mode)
        escalated = {"label": config.escalate, "executed": "recorded in dispatchq's store"}
        if mode != "shadow" and executor.supports("label.add"):
            marker = Entry("(escalate)", ActionSpec("label.add", {"label": config.escalate}), "apply", "", "")
            done = _perform(
                marker,
                decision_id=decision_id,
                event=event,
                config=config,
                store=store,
                executor=executor,
                mode=mode,
            )
            escalated["executed"] = done.executed

    result = TriageResult(
        decision_id=decision_id,
        event=event,
        mode=mode,
        entries=entries,
        errors=resolution.errors,
        escalated=escalated,
        requests=requests,
        asked=asked,
        reused=reused,
        escalation_cleared=cleared,
    )
    store.save_result(decision_id, result.to_json())
    store.record_run(result)
    return result


def _clear_escalation(store: TriageStore, executor: Executor, target: str, label: str) -> str | None:
    """A rule decided a target an earlier delivery escalated: drop our own escalation label.

    Only a label dispatchq added (the ledger knows) is removed; what was recorded in
    dispatchq's store for the target goes too. None when there was nothing to clear.
    """
    recorded = store.storage.clear_needs_triage(target)
    if not store.ledger.added_label(target, label) or not executor.supports("label.remove"):
        return f"{recorded} escalation(s) cleared in dispatchq's store" if recorded else None
    try:
        outcome = executor.remove_label(target, label)
    except (ExecutorError, OSError) as error:
        log.warning("triage %s: removing %s failed: %s", target, label, error)
        return f"removing {label} failed: {error}"
    return f"{label}: {outcome.status} {outcome.detail}".strip()


def _ask(ask: Ask, event: Event, config: TriageConfig, missing: list[str]) -> AskResult:
    """Call the provider; a failure of any kind costs nothing but the answers (invariant 2)."""
    questions = {q: config.questions[q].wire() for q in missing}
    try:
        return ask(event.state, questions)
    except Exception as error:
        # The type only: a provider's message could quote the request, or worse.
        log.warning(
            "triage %s: provider failed (%s); its questions count as unanswered",
            event.target,
            type(error).__name__,
        )
        return AskResult(unanswered=dict.fromkeys(missing, f"provider error ({type(error).__name__})"))


def _command(entry: Entry, config: TriageConfig) -> Command:
    action = entry.action
    if action.op != "comment":
        return Command.from_action(action)
    template = action.template or ""
    path = config.template_path(template)
    if path is None or not path.is_file():
        raise ExecutorError(f"template {template!r} does not exist")
    body = path.read_text(encoding="utf-8")
    return Command.from_action(action, body=body, marker=comment_marker(entry.rule, template))


def _perform(
    entry: Entry,
    *,
    decision_id: str,
    event: Event,
    config: TriageConfig,
    store: TriageStore,
    executor: Executor,
    mode: Mode,
) -> Entry:
    """Perform one action unless the ledger says it was; ledger it only on success."""
    if mode == "shadow":  # unreachable through the table; a guard so it stays that way
        raise RuntimeError("shadow mode never performs an action")
    fingerprint = Ledger.fingerprint(decision_id, entry.rule, entry.action, event.target)
    done = store.ledger.get(fingerprint)
    if done is not None:
        return replace(entry, executed=f"already {done.get('status')} (ledger)")
    try:
        outcome = executor.perform(_command(entry, config), event.target)
    except (ExecutorError, UserError, OSError) as error:
        log.warning("triage %s [%s] %s failed: %s", event.target, entry.rule, entry.action.text(), error)
        return replace(entry, reason=FAILED, executed=f"failed: {error}")
    if outcome.status == "refused":
        return replace(entry, reason=REFUSED, executed=f"refused: {outcome.detail}")
    store.ledger.record(
        fingerprint,
        {
            "decision_id": decision_id,
            "rule": entry.rule,
            "target": event.target,
            "action": entry.action.to_json(),
            "executor": executor.name,
            **outcome.to_json(),
        },
    )
    return replace(entry, executed=f"{outcome.status}: {outcome.detail}")


# -------------------------------------------------------------------------------- apply, replay


def apply_suggested(
    decision_id: str,
    config: TriageConfig,
    *,
    store: TriageStore,
    executor: Executor,
    rules: Iterable[str] | None = None,
) -> list[Entry]:
    """Perform the suggested actions of a stored decision that a person accepted."""
    if config.mode == "shadow":
        raise UserError("triage.mode is shadow: nothing is written outside dispatchq's store")
    record = store.find(decision_id)
    if not record.result:
        raise UserError(f"decision {record.decision_id[:16]} has not been resolved yet")
    entries = [Entry.from_json(e) for e in record.result.get("suggested", [])]
    wanted = set(rules or ())
    if wanted:
        entries = [e for e in entries if e.rule in wanted]
    if not entries:
        raise UserError(f"decision {record.decision_id[:16]} has no suggested action to apply")
    done = [
        _perform(
            e,
            decision_id=record.decision_id,
            event=record.event,
            config=config,
            store=store,
            executor=executor,
            mode=config.mode,
        )
        for e in entries
    ]
    accepted = [*record.result.get("accepted", []), *(e.to_json() for e in done)]
    store.save_result(record.decision_id, {**record.result, "accepted": accepted})
    return done


@dataclass(frozen=True)
class ReplayChange:
    """One action whose outcome would differ: before is what was stored, after the what-if."""

    decision_id: str
    event: Event
    rule: str
    action: ActionSpec
    before: tuple[str, str] | None  # (outcome, reason); None: not planned then
    after: tuple[str, str] | None  # None: not planned now

    def to_json(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "event": self.event.event,
            "target": self.event.target,
            "rule": self.rule,
            "action": self.action.to_json(),
            "before": list(self.before) if self.before else None,
            "after": list(self.after) if self.after else None,
        }

    def render(self) -> str:
        def show(side: tuple[str, str] | None) -> str:
            return "—" if side is None else f"{side[0]} ({side[1]})"

        return (
            f"{self.event.target} {self.event.event} [{self.rule}] {self.action.text()}: "
            f"{show(self.before)} -> {show(self.after)}"
        )


@dataclass(frozen=True)
class ReplayReport:
    decisions: int
    changes: tuple[ReplayChange, ...]
    answers_from: Mapping[str, int] = field(default_factory=dict)  # replayed decisions by source
    skipped_file_answers: int = 0  # decided over --answers files, left out (a what-if's answers)
    earlier_config: int = 0  # replayed decisions stored under another config than the current one

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": self.decisions,
            "answers_from": dict(self.answers_from),
            "skipped_file_answers": self.skipped_file_answers,
            "earlier_config": self.earlier_config,
            "changes": [c.to_json() for c in self.changes],
        }

    def summary(self) -> str:
        used = ", ".join(f"{n} from {source}" for source, n in sorted(self.answers_from.items()))
        line = f"replayed {self.decisions} event(s) over stored answers ({used or 'none'})"
        if self.earlier_config:
            line += f", {self.earlier_config} decided under an earlier config"
        if self.skipped_file_answers:
            line += (
                f"; left out {self.skipped_file_answers} decided over --answers files"
                " (--include-file-answers to add them)"
            )
        return f"{line}; {len(self.changes)} outcome(s) would change"


def replay(
    store: TriageStore,
    config: TriageConfig,
    *,
    executor: Executor,
    since: float | None = None,
    mode: Mode | None = None,
    gate_auto: float | None = None,
    include_file_answers: bool = False,
) -> ReplayReport:
    """Re-resolve stored events over stored answers under a what-if; no provider call.

    Each event is taken once (its latest decision, across config edits). Only answers the
    provider gave are replayed unless `include_file_answers`: an `--answers` file is a
    person's what-if, not history. A question the config now needs but nobody asked
    then resolves as `no_answers`. The report says which answers were used.
    """
    what_if = config.with_overrides(mode=mode, gate_auto=gate_auto) if gate_auto is not None else config
    use_mode: Mode = mode or what_if.mode
    latest: dict[str, StoredDecision] = {}
    skipped: set[str] = set()
    for record in store.since(since):
        identity = record.event.identity
        if record.answers_from == "file" and not include_file_answers:
            skipped.add(identity)
            continue
        if identity not in latest or record.updated >= latest[identity].updated:
            latest[identity] = record

    changes: list[ReplayChange] = []
    for record in sorted(latest.values(), key=lambda r: r.updated):
        knowledge = record.knowledge()
        answers = {
            q: a
            for q, a in knowledge.answers.items()
            if q in what_if.questions and what_if.questions[q].type == a.type
        }
        knowledge = replace(knowledge, answers=answers)
        after = resolve(what_if, record.event, knowledge, executor=executor, mode=use_mode)
        before_entries = [
            Entry.from_json(e)
            for part in ("applied", "failed", "suggested", "suppressed")
            for e in (record.result or {}).get(part, [])
        ]
        before = {(e.rule, e.action.key()): e for e in before_entries}
        now = {(e.rule, e.action.key()): e for e in after.entries}
        for key in sorted(set(before) | set(now)):
            old, new = before.get(key), now.get(key)
            old_side = (old.outcome, old.reason) if old else None
            new_side = (new.outcome, new.reason) if new else None
            if old_side != new_side:
                action = (new or old).action  # type: ignore[union-attr]
                changes.append(
                    ReplayChange(record.decision_id, record.event, key[0], action, old_side, new_side)
                )
    sources: Counter[str] = Counter(r.answers_from for r in latest.values())
    earlier = sum(1 for r in latest.values() if r.config_hash != config.hash)
    return ReplayReport(len(latest), tuple(changes), dict(sources), len(skipped - latest.keys()), earlier)
