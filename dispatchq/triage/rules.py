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

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal

from dispatchq.core.answers import ANSWER_TYPES, AnswerType, wire_question
from dispatchq.core.judgement import canonical_json, is_plain_json, sha256_hex
from dispatchq.errors import ConfigError, UserError
from dispatchq.triage.cel import BINDINGS, RESERVED_WORDS, Condition

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
]

Mode = Literal["shadow", "suggest", "auto"]
MODES: tuple[Mode, ...] = ("shadow", "suggest", "auto")

#: Every op a rule may plan. An executor supports a subset (row 7 covers the rest).
KNOWN_OPS: tuple[str, ...] = (
    "label.add",
    "label.remove",
    "comment",
    "close",
    "reopen",
    "assign",
    "lock",
    "delete-branch",
)
#: Ops that destroy something a person may want back; each needs `allowDestructive` (row 6).
DESTRUCTIVE_OPS = frozenset({"close", "lock", "delete-branch"})
EXECUTORS: tuple[str, ...] = ("recording", "github")

#: `<event>.<action>` (`issues.opened`), or `<event>` alone: for events with no action (`push`),
#: and in a rule or question, every action of that event.
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)?$")
#: A rule's `state:` entry: a dotted path into the event's state (`issue.title`).
STATE_PATH = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")
QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
GITHUB_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
_CLOSE_REASONS = ("completed", "not_planned")

#: `triage.budget.window` when unset: the per-config budget counts over a rolling hour.
DEFAULT_BUDGET_WINDOW = 3600

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


_TOP_KEYS = (
    "mode",
    "gate",
    "budget",
    "allowDestructive",
    "executor",
    "escalate",
    "templates",
    "questions",
    "rules",
    "repositories",
)
_REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_RULE_KEYS = ("id", "events", "if", "gateOn", "actions", "enabled", "description", "state")
_QUESTION_KEYS = ("type", "instructions", "criteria", "events")
_ACTION_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # op: (required params, optional params)
    "label.add": (("label",), ()),
    "label.remove": (("label",), ()),
    "comment": (("template",), ()),
    "close": ((), ("reason",)),
    "reopen": ((), ()),
    "assign": (("assignees",), ()),
    "lock": ((), ("reason",)),
    "delete-branch": ((), ()),
}


def _refuse_unknown(where: str, data: Mapping[Any, Any], allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    for key in data:
        if key not in allowed:
            hint = ""
            if key in ("on", True):  # YAML 1.1 reads a bare `on` as the boolean true
                hint = " (name events with 'events', not 'on')"
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}")


def _mapping(where: str, value: Any) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _string(where: str, value: Any, *, pattern: re.Pattern[str] | None = None, what: str = "a string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected {what}, got {value!r}")
    if pattern is not None and not pattern.match(value):
        raise ConfigError(f"{where}: {value!r} is not {what}")
    return value


def _fraction(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{where}: expected a number between 0 and 1, got {value!r}")
    return float(value)


def event_matches(event_name: str, names: Iterable[str]) -> bool:
    """True when `names` has the event's own name or its event without the action (`issues`)."""
    return any(n == event_name or event_name.startswith(n + ".") for n in names)


def _state_paths(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of dotted paths such as issue.title")
    out = [_string(f"{where}[{i}]", p, pattern=STATE_PATH, what="a dotted path") for i, p in enumerate(value)]
    return tuple(dict.fromkeys(out))


def _events(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of '<event>.<action>' names")
    out = []
    for i, name in enumerate(value):
        out.append(_string(f"{where}[{i}]", name, pattern=EVENT_NAME, what="an '<event>.<action>' name"))
    return tuple(out)


def load_triage(section: Any, base_dir: Path | str = ".") -> TriageConfig:
    """Validate the `triage` section the YAML loader handed over; ConfigError names the field.

    Refused here (the file is refused): wrong types, unknown keys, an `if` that does not
    parse, a name that is no question. What can fail only at run time (a question not
    asked for an event, an op the executor lacks, a missing template file) is left to
    `lint` and the resolution table, so a running system degrades visibly instead.
    """
    top = _mapping("triage", section)
    _refuse_unknown("triage", top, _TOP_KEYS)
    base = Path(base_dir)

    mode = top.get("mode", "shadow")
    if mode not in MODES:
        raise ConfigError(f"triage.mode: expected one of {', '.join(MODES)}, got {mode!r}")

    gate = _mapping("triage.gate", top.get("gate", {}) or {})
    _refuse_unknown("triage.gate", gate, ("suggest", "auto"))
    gate_suggest = _fraction("triage.gate.suggest", gate.get("suggest", 0.6))
    gate_auto = _fraction("triage.gate.auto", gate.get("auto", 0.85))
    if gate_suggest > gate_auto:
        raise ConfigError(f"triage.gate: suggest ({gate_suggest:g}) is above auto ({gate_auto:g})")

    budget = _mapping("triage.budget", top.get("budget", {}) or {})
    _refuse_unknown("triage.budget", budget, ("requests", "window"))
    requests = budget.get("requests")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int) or requests < 0):
        raise ConfigError(f"triage.budget.requests: expected a whole number >= 0, got {requests!r}")
    window = budget.get("window", DEFAULT_BUDGET_WINDOW)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"triage.budget.window: expected a whole number of seconds >= 1, got {window!r}")

    destructive = top.get("allowDestructive", []) or []
    if not isinstance(destructive, list):
        raise ConfigError("triage.allowDestructive: expected a list of ops")
    for i, op in enumerate(destructive):
        if op not in KNOWN_OPS:
            raise ConfigError(
                f"triage.allowDestructive[{i}]: unknown op {op!r}; known: {', '.join(KNOWN_OPS)}"
            )

    executor = top.get("executor", "recording")
    if executor not in EXECUTORS:
        raise ConfigError(f"triage.executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")

    escalate = top.get("escalate")
    if escalate is not None:
        escalate = _string("triage.escalate", escalate, what="a label name")

    templates = _templates(top.get("templates", {}) or {})
    questions = _questions(top.get("questions", {}) or {})
    rules = _rules(top.get("rules", []) or [], questions)

    plain = _json_data("triage", top, ConfigError)  # what config_hash hashes
    return TriageConfig(
        mode=mode,
        gate_suggest=gate_suggest,
        gate_auto=gate_auto,
        budget_requests=requests,
        allow_destructive=frozenset(destructive),
        executor=executor,
        escalate=escalate,
        templates=templates,
        questions=questions,
        rules=rules,
        base_dir=base,
        section=plain,
        hash=config_hash(plain),
        budget_window=window,
        repositories=_repositories(top.get("repositories")),
    )


def _repositories(value: Any) -> frozenset[str] | None:
    """The executor's allowlist: absent means any repository (serve warns at start)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise ConfigError("triage.repositories: expected a list of owner/name")
    for i, name in enumerate(value):
        _string(f"triage.repositories[{i}]", name, pattern=_REPOSITORY, what="owner/name")
    return frozenset(str(name).lower() for name in value)


def _templates(value: Any) -> dict[str, str]:
    templates = _mapping("triage.templates", value)
    out: dict[str, str] = {}
    for name, path in templates.items():
        where = f"triage.templates.{name}"
        path = _string(where, path, what="a path relative to the config file")
        pure = PurePosixPath(path)
        if pure.is_absolute() or PureWindowsPath(path).is_absolute() or ".." in pure.parts:
            raise ConfigError(f"{where}: {path!r} must stay inside the config file's directory")
        out[str(name)] = path
    return out


def _questions(value: Any) -> dict[str, TriageQuestion]:
    questions = _mapping("triage.questions", value)
    out: dict[str, TriageQuestion] = {}
    for qid, spec in questions.items():
        where = f"triage.questions.{qid}"
        if not isinstance(qid, str) or not QUESTION_ID.match(qid):
            raise ConfigError(f"{where}: a question id must be a CEL identifier (letters, digits, _)")
        if qid in RESERVED_WORDS or qid in BINDINGS:
            raise ConfigError(f"{where}: {qid!r} is reserved in rule expressions")
        spec = _mapping(where, spec)
        _refuse_unknown(where, spec, _QUESTION_KEYS)
        qtype = spec.get("type")
        if qtype not in ANSWER_TYPES:
            raise ConfigError(f"{where}.type: expected one of {', '.join(ANSWER_TYPES)}, got {qtype!r}")
        criteria = spec.get("criteria")
        if qtype == "choice" and (not isinstance(criteria, Mapping) or not criteria):
            raise ConfigError(f"{where}.criteria: a choice needs a non-empty mapping of labels")
        if qtype == "score" and (not isinstance(criteria, list) or not criteria):
            raise ConfigError(f"{where}.criteria: a score needs a non-empty list, one entry per level")
        if qtype == "noul":
            if criteria is not None:
                crit = _mapping(f"{where}.criteria", criteria)
                _refuse_unknown(f"{where}.criteria", crit, ("true", "false"))
            if spec.get("instructions") is None and not criteria:
                raise ConfigError(f"{where}: a noul needs instructions or criteria")
        events = spec.get("events")
        scoped = frozenset(_events(f"{where}.events", events)) if events is not None else None
        instructions = _json_data(f"{where}.instructions", spec.get("instructions"), ConfigError)
        criteria = _json_data(f"{where}.criteria", criteria, ConfigError)
        out[qid] = TriageQuestion(qid, qtype, instructions, criteria, scoped)
    return out


def _rules(value: Any, questions: Mapping[str, TriageQuestion]) -> tuple[Rule, ...]:
    if not isinstance(value, list):
        raise ConfigError("triage.rules: expected a list of rules")
    seen: set[str] = set()
    rules: list[Rule] = []
    for index, spec in enumerate(value):
        label = spec.get("id") if isinstance(spec, Mapping) and isinstance(spec.get("id"), str) else index
        where = f"triage.rules[{label}]"
        spec = _mapping(where, spec)
        _refuse_unknown(where, spec, _RULE_KEYS)
        rid = _string(
            f"{where}.id", spec.get("id"), pattern=RULE_ID, what="a rule id (letters, digits, . _ -)"
        )
        if rid in seen:
            raise ConfigError(f"{where}.id: duplicate rule id {rid!r}")
        seen.add(rid)
        events = _events(f"{where}.events", spec.get("events"))

        condition = None
        refs: frozenset[str] = frozenset()
        if "if" in spec:
            source = _string(f"{where}.if", spec["if"], what="a CEL expression")
            try:
                condition = Condition.compile(source)
            except ValueError as error:
                raise ConfigError(f"{where}.if: {error}") from None
            unknown = sorted(condition.names - set(questions) - BINDINGS)
            if unknown:
                raise ConfigError(f"{where}.if: {unknown[0]!r} is neither a question nor event/confidence")
            unknown = sorted(condition.confidence_refs - set(questions))
            if unknown:
                raise ConfigError(f"{where}.if: confidence of {unknown[0]!r}, which is not a question")
            refs = condition.question_refs(questions)

        gate_on: tuple[str, ...] | None = None
        if "gateOn" in spec:
            gate = spec["gateOn"]
            if not isinstance(gate, list) or not gate:
                raise ConfigError(
                    f"{where}.gateOn: expected a non-empty list of question ids (omit it to gate on the if)"
                )
            for i, qid in enumerate(gate):
                if qid not in questions:
                    raise ConfigError(f"{where}.gateOn[{i}]: {qid!r} is not a question")
            gate_on = tuple(dict.fromkeys(gate))

        actions_spec = spec.get("actions")
        if not isinstance(actions_spec, list) or not actions_spec:
            raise ConfigError(f"{where}.actions: expected a non-empty list of actions")
        actions = tuple(_action(f"{where}.actions[{i}]", a) for i, a in enumerate(actions_spec))

        enabled = spec.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"{where}.enabled: expected true or false")
        description = spec.get("description")
        if description is not None and not isinstance(description, str):
            raise ConfigError(f"{where}.description: expected a string")
        state = _state_paths(f"{where}.state", spec["state"]) if "state" in spec else None
        rules.append(Rule(rid, events, condition, refs, gate_on, actions, enabled, description, state))
    return tuple(rules)


def _action(where: str, value: Any) -> ActionSpec:
    spec = _mapping(where, value)
    op = spec.get("op")
    if op not in _ACTION_KEYS:
        raise ConfigError(f"{where}.op: unknown op {op!r}; known: {', '.join(KNOWN_OPS)}")
    required, optional = _ACTION_KEYS[op]
    _refuse_unknown(where, spec, ("op", *required, *optional))
    params: dict[str, Any] = {}
    for key in required:
        if key not in spec:
            raise ConfigError(f"{where}: {op} needs {key!r}")
    for key in (*required, *optional):
        if key not in spec:
            continue
        item = spec[key]
        if key == "assignees":
            if not isinstance(item, list) or not item:
                raise ConfigError(f"{where}.assignees: expected a non-empty list of logins")
            for i, login in enumerate(item):
                _string(f"{where}.assignees[{i}]", login, pattern=GITHUB_LOGIN, what="a GitHub login")
            params[key] = list(item)
        elif key == "label":
            label = _string(f"{where}.label", item, what="a label name")
            if len(label) > 50 or any(ord(c) < 32 for c in label):
                raise ConfigError(f"{where}.label: labels are at most 50 printable characters")
            params[key] = label
        elif key == "reason" and op == "close":
            if item not in _CLOSE_REASONS:
                raise ConfigError(f"{where}.reason: expected one of {', '.join(_CLOSE_REASONS)}")
            params[key] = item
        else:
            params[key] = _string(f"{where}.{key}", item)
    return ActionSpec(op, params)


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
