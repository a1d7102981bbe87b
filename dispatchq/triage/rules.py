"""The rules engine's config: the `triage` section's vocabulary, loading, and the decision key.

`load_triage` turns the section the YAML loader handed over into a `TriageConfig`
(questions, rules with their parsed CEL `if`, planned actions), refusing at load
time what can never work; `decision_key` names one event under one config. The
resolution table is `dispatchq.triage.table`, the CEL conditions
`dispatchq.triage.cel`.

Nothing here talks to Redis, GitHub or a provider: `replay` re-runs history as a
what-if, and the tests reach every path without a network.

Every hash here is `dispatchq.core.judgement.canonical_json` (orjson, NaN refused),
the one canonical spelling dispatchq hashes; so what reaches a hash must be plain
JSON data, refused with the field named (`UserError` for an event, `ConfigError` for
the config) rather than silently stringified.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dispatchq.core.answers import AnswerType, wire_question
from dispatchq.core.judgement import canonical_json, is_plain_json, sha256_hex
from dispatchq.errors import UserError
from dispatchq.triage.cel import Condition
from dispatchq.triage.schema import (
    DEFAULT_BUDGET_WINDOW,
    EVENT_NAME,
    EXECUTORS,
    GITHUB_LOGIN,
    KNOWN_OPS,
    MODES,
    QUESTION_ID,
    RULE_ID,
    STATE_PATH,
    BudgetSection,
    GateSection,
    Mode,
    TriageSection,
    validate_triage,
)

__all__ = [
    "DEFAULT_BUDGET_WINDOW",
    "DESTRUCTIVE_OPS",
    "EVENT_NAME",
    "EXECUTORS",
    "GITHUB_LOGIN",
    "KNOWN_OPS",
    "MODES",
    "QUESTION_ID",
    "RULE_ID",
    "STATE_PATH",
    "ActionSpec",
    "Event",
    "Mode",
    "Rule",
    "TriageConfig",
    "TriageQuestion",
    "config_hash",
    "decision_key",
    "event_matches",
    "load_triage",
    "triage_config",
]

#: Ops that destroy something a person may want back; each needs `allowDestructive` (row 6).
DESTRUCTIVE_OPS = frozenset({"close", "lock", "delete-branch"})

# ----------------------------------------------------------------------------------- JSON


def _plain(value: Any) -> Any:
    """YAML loaders hand back their own mapping/sequence types; hashing needs plain JSON."""
    kind = type(value)
    if kind is str or kind is int or value is None:  # the common leaves, before the ABC check
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json_data(where: str, value: Any, error: type[UserError]) -> Any:
    """`value` as plain JSON data, or `error` naming the field.

    What is hashed must have one canonical spelling: a NaN, an infinity, an integer
    beyond 64 bits, or a Python object (a `datetime` handed to the Python API, a date
    the YAML loader read from an unquoted `2024-01-01`) has none, and is refused here
    instead of being hashed as whatever `str()` makes of it.
    """
    return _canonical_data(where, value, error)[0]


def _canonical_data(where: str, value: Any, error: type[UserError]) -> tuple[Any, str]:
    """`_json_data`, with the canonical spelling it checked (so a caller need not make it again)."""
    if is_plain_json(value):  # the common case (parsed JSON): no copy, no second walk
        try:
            return value, canonical_json(value, plain=True)
        except TypeError:  # a lone surrogate or a huge integer: the slow path below says which
            pass
    plain = _plain(value)
    try:
        canonical = canonical_json(plain)  # orjson refuses a lone surrogate too: the walk runs only then
    except (TypeError, ValueError) as problem:  # orjson.JSONEncodeError is a TypeError
        _refuse_surrogates(where, plain, error)  # the exact place, when that was the reason
        raise error(f"{where}: not plain JSON data ({problem})") from None
    return plain, canonical


def _refuse_surrogates(where: str, value: Any, error: type[UserError]) -> None:
    """A lone surrogate (JSON `"\\ud800"`) is no Unicode text: refuse it, naming where it sits."""
    kind = type(value)
    if kind is int or kind is bool or value is None:
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as bad:
            code = ord(value[bad.start])
            raise error(
                f"{where}: a lone surrogate \\u{code:04x} at character {bad.start} is not text"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_surrogates(f"{where}.{key}", key, error)
            _refuse_surrogates(f"{where}.{key}", item, error)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_surrogates(f"{where}[{index}]", item, error)


# ---------------------------------------------------------------------------------- event


@dataclass(frozen=True)
class Event:
    """What triggered triage: `{"event", "target", "item", "context", "state"}`.

    `state` is untrusted text from the outside world (an issue body); it only ever
    reaches CEL as data and the provider as state, never a shell.
    """

    event: str
    target: str
    item: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    state: Any = None

    @classmethod
    def from_json(cls, data: Any) -> Event:
        if not isinstance(data, Mapping):
            raise UserError("event: expected a JSON object")
        unknown = sorted(set(data) - {"event", "target", "item", "context", "state"})
        if unknown:
            raise UserError(f"event: unknown key {unknown[0]!r}")
        for key in ("event", "target", "item"):
            _refuse_surrogates(f"event.{key}", data.get(key), UserError)
        name = data.get("event")
        if not isinstance(name, str) or not EVENT_NAME.match(name):
            raise UserError(f"event.event: expected '<event>.<action>' such as 'issues.opened', got {name!r}")
        target = data.get("target")
        if not isinstance(target, str) or not target.strip() or len(target) > 4000:
            raise UserError("event.target: expected a non-empty string such as 'acme/app#12'")
        item = data.get("item")
        if item is not None and (not isinstance(item, str) or len(item) > 4000):
            raise UserError("event.item: expected a string such as 'issue:12'")
        context = data.get("context", {})
        if context is None:
            context = {}
        if not isinstance(context, Mapping):
            raise UserError("event.context: expected an object")
        state, canonical_state = _canonical_data("event.state", data.get("state"), UserError)
        event = cls(name, target, item, _json_data("event.context", context, UserError), state)
        event.__dict__["_state_sha"] = sha256_hex(canonical_state)  # seeds the cached_property
        return event

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "target": self.target,
            "item": self.item,
            "context": dict(self.context),
            "state": self.state,
        }

    @property
    def identity(self) -> str:
        """Which event this is, across config edits: the decision key minus the config."""
        return sha256_hex(canonical_json([self.target, self._item_digest(), self.context]))

    def _item_digest(self) -> dict[str, Any]:
        # The event name and a digest of its state: an edited issue re-triages, a
        # redelivered identical event does not.
        return {"event": self.event, "item": self.item, "state": self._state_sha}

    @cached_property
    def _state_sha(self) -> str:
        # Hashed once per event: the decision key, the identity and the store all ask.
        return sha256_hex(canonical_json(self.state))


# --------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TriageQuestion:
    """A triage question as the provider sees it, plus the events it is asked for.

    Not `dispatchq.core.kinds.Question` (a kind's typed-tier question): this one belongs to
    the rules engine's config and knows which events it is asked for."""

    id: str
    type: AnswerType
    instructions: Any = None
    criteria: Any = None
    events: frozenset[str] | None = None

    def asked_for(self, event_name: str) -> bool:
        return self.events is None or event_matches(event_name, self.events)

    def wire(self) -> dict[str, Any]:
        """The SDK's question dictionary (`typesafe_sdk` QuestionModel), dispatchq keys removed."""
        return wire_question(self.type, self.instructions, self.criteria)


@dataclass(frozen=True)
class ActionSpec:
    """A planned action: an op and its parameters, exactly as the config wrote it."""

    op: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str | None:
        return self.params.get("label")

    @property
    def template(self) -> str | None:
        return self.params.get("template")

    @property
    def assignees(self) -> tuple[str, ...]:
        return tuple(self.params.get("assignees", ()))

    @property
    def reason(self) -> str | None:
        return self.params.get("reason")

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, **dict(self.params)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionSpec:
        params = {k: v for k, v in data.items() if k != "op"}
        return cls(str(data["op"]), params)

    def key(self) -> str:
        return canonical_json(self.to_json())

    def text(self) -> str:
        """How a person reads it: `label: add needs-repro`, `comment: repro`, `close`."""
        if self.op in ("label.add", "label.remove"):
            return f"label: {self.op.split('.', 1)[1]} {self.label}"
        if self.op == "comment":
            return f"comment: {self.template}"
        if self.op == "assign":
            return f"assign: {', '.join(self.assignees)}"
        if self.reason:
            return f"{self.op}: {self.reason}"
        return self.op


@dataclass(frozen=True)
class Rule:
    id: str
    events: tuple[str, ...]
    condition: Condition | None
    refs: frozenset[str]
    gate_on: tuple[str, ...] | None
    actions: tuple[ActionSpec, ...]
    enabled: bool = True
    description: str | None = None
    #: Dotted paths of the event state this rule needs (`state:`); None: the whole state.
    state: tuple[str, ...] | None = None

    @property
    def dependencies(self) -> frozenset[str]:
        """The ids the `if` references plus `gateOn`: all must be answered to decide."""
        return self.refs | frozenset(self.gate_on or ())

    @property
    def confidence_ids(self) -> tuple[str, ...]:
        """What the rule's confidence is the minimum over: `gateOn`, else the `if` references."""
        return self.gate_on if self.gate_on is not None else tuple(sorted(self.refs))

    def triggered_by(self, event_name: str) -> bool:
        return self.enabled and event_matches(event_name, self.events)


@dataclass(frozen=True)
class TriageConfig:
    """The validated `triage` section. `hash` covers everything but `mode`."""

    mode: Mode
    gate_suggest: float
    gate_auto: float
    budget_requests: int | None
    allow_destructive: frozenset[str]
    executor: str
    escalate: str | None
    templates: Mapping[str, str]
    questions: Mapping[str, TriageQuestion]
    rules: tuple[Rule, ...]
    base_dir: Path
    section: Mapping[str, Any] = field(repr=False)
    hash: str = ""
    budget_window: int = 3600
    """`triage.budget.window`: the rolling window `budget_requests` counts over, in seconds."""
    repositories: frozenset[str] | None = None
    """`triage.repositories`: the `owner/name`s (lower case) the executor may act on; None: any."""
    #: Answers of `triggered` and `questions_for` by event name: the config never changes,
    #: and `dispatchq serve` asks both for every delivery.
    _by_event: dict[tuple[str, str], Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def triggered(self, event_name: str) -> list[Rule]:
        found = self._by_event.get(("triggered", event_name))
        if found is None:
            found = self._by_event[("triggered", event_name)] = tuple(
                rule for rule in self.rules if rule.triggered_by(event_name)
            )
        return list(found)

    def questions_for(self, event_name: str) -> frozenset[str]:
        """What to ask for this event: dependencies of the rules it triggers, in scope."""
        found = self._by_event.get(("questions", event_name))
        if found is None:
            needed: set[str] = set()
            for rule in self.triggered(event_name):
                needed |= {q for q in rule.dependencies if self.questions[q].asked_for(event_name)}
            found = self._by_event[("questions", event_name)] = frozenset(needed)
        return found

    def template_path(self, name: str) -> Path | None:
        relative = self.templates.get(name)
        return None if relative is None else self.base_dir / relative

    def template_exists(self, name: str) -> bool:
        path = self.template_path(name)
        return path is not None and path.is_file()

    def with_overrides(self, *, mode: Mode | None = None, gate_auto: float | None = None) -> TriageConfig:
        """A what-if copy; the hash follows the gate (it is part of the decision)."""
        section = dict(self.section)
        if mode is not None:
            section["mode"] = mode
        if gate_auto is not None:
            section["gate"] = {**dict(section.get("gate") or {}), "auto": gate_auto}
        return load_triage(section, base_dir=self.base_dir)


def config_hash(section: Mapping[str, Any]) -> str:
    """sha256 of the `triage` section without `mode`: promoting a mode keeps every answer."""
    plain = _plain(section)
    plain.pop("mode", None)
    return sha256_hex(canonical_json(plain))


def event_matches(event_name: str, names: Iterable[str]) -> bool:
    """True when `names` has the event's own name or its event without the action (`issues`)."""
    return any(n == event_name or event_name.startswith(n + ".") for n in names)


def load_triage(section: Any, base_dir: Path | str = ".") -> TriageConfig:
    """Validate the `triage` section the YAML loader handed over; ConfigError names the field.

    Refused (`dispatchq.triage.schema`, the file is refused): wrong types, unknown keys, an
    `if` that does not parse, a name that is no question. What can fail only at run time
    (a question not asked for an event, an op the executor lacks, a missing template file)
    is left to `lint` and the resolution table, so a running system degrades visibly instead.
    """
    return triage_config(validate_triage(section), base_dir)


def triage_config(section: TriageSection, base_dir: Path | str = ".") -> TriageConfig:
    """The engine's config from a validated section: nothing is checked again here."""
    gate, budget = section.gate or GateSection(), section.budget or BudgetSection()
    questions = {
        str(qid): TriageQuestion(
            str(qid), q.type, q.instructions, q.criteria, None if q.events is None else frozenset(q.events)
        )
        for qid, q in (section.questions or {}).items()
    }
    rules = tuple(
        Rule(
            rule.id,
            tuple(rule.events),
            rule.condition,
            rule.condition.question_refs(questions) if rule.condition is not None else frozenset(),
            None if rule.gate_on is None else tuple(dict.fromkeys(rule.gate_on)),
            tuple(ActionSpec(action.op, action.params()) for action in rule.actions),
            rule.enabled,
            rule.description,
            None if rule.state is None else tuple(dict.fromkeys(rule.state)),
        )
        for rule in section.rules or ()
    )
    repositories = section.repositories
    return TriageConfig(
        mode=section.mode,
        gate_suggest=float(gate.suggest),
        gate_auto=float(gate.auto),
        budget_requests=budget.requests,
        allow_destructive=frozenset(section.allow_destructive or ()),
        executor=section.executor,
        escalate=section.escalate,
        templates=dict(section.templates or {}),
        questions=questions,
        rules=rules,
        base_dir=Path(base_dir),
        section=section.section,
        hash=config_hash(section.section),
        budget_window=budget.window,
        repositories=None if repositories is None else frozenset(name.lower() for name in repositories),
    )


# ------------------------------------------------------------------------- decision key


def decision_key(event: Event, config: TriageConfig) -> str:
    """sha256 of (target, item, repo context, question ids, config hash).

    `item` is the event name plus a digest of the event's state; the config hash leaves
    out `mode`. Distinct from the judgement key: it decides when stored answers are
    reused (redelivery, a mode change) and when triage starts over (an edit anywhere).
    """
    payload = [
        event.target,
        event._item_digest(),
        event.context,
        sorted(config.questions_for(event.event)),
        config.hash,
    ]
    return sha256_hex(canonical_json(payload))
