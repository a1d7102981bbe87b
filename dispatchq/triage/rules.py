"""The rules engine's pure half: the `triage` config, CEL conditions, and the resolution table.

Nothing here talks to Redis, GitHub or a provider. Given a config, an event and what is
known about the answers (which arrived, which were asked and came back empty, which
the budget kept us from asking), `resolve` decides every planned action by a fixed
first-match table. Keeping it pure is what lets `replay` re-run history as a what-if
and lets the tests reach every row without a network.

CEL comes from `cel-python` (`celpy`): its parse tree is a plain `lark` tree, so the
identifiers an `if` references can be read off the parsed expression (comprehension
variables excluded) instead of guessed from error messages at run time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal, Protocol

import celpy
import lark
from celpy import celtypes

from dispatchq.core.answers import (
    ANSWER_TYPES,
    Answer,
    AnswerType,
    margin,
    meets,
    min_confidence,
    noul_gate_as_probability,
    wire_question,
)
from dispatchq.errors import ConditionError, ConfigError, UserError

log = logging.getLogger(__name__)

Mode = Literal["shadow", "suggest", "auto"]
MODES: tuple[Mode, ...] = ("shadow", "suggest", "auto")
Outcome = Literal["apply", "suggest", "suppress"]

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

# Reason codes, in table order (rows 3-12; rows 1 and 2 are never listed as entries).
BUDGET_EXHAUSTED = "budget_exhausted"
NO_ANSWERS = "no_answers"
UNKNOWN_QUESTION = "unknown_question"
DESTRUCTIVE_NOT_OPTED_IN = "destructive_not_opted_in"
UNSUPPORTED_BY_EXECUTOR = "unsupported_by_executor"
MISSING_TEMPLATE = "missing_template"
BELOW_SUGGEST_THRESHOLD = "below_suggest_threshold"
SHADOW_MODE = "shadow_mode"
SUGGEST = "suggest"
APPLY = "apply"
REASONS: tuple[str, ...] = (
    BUDGET_EXHAUSTED,
    NO_ANSWERS,
    UNKNOWN_QUESTION,
    DESTRUCTIVE_NOT_OPTED_IN,
    UNSUPPORTED_BY_EXECUTOR,
    MISSING_TEMPLATE,
    BELOW_SUGGEST_THRESHOLD,
    SHADOW_MODE,
    SUGGEST,
    APPLY,
)
#: Reasons that mean "nothing could be decided" for the escalation rule: the answers or
#: the config fell short. A shadow-mode suppression is a decision that was not written.
UNDECIDED_REASONS = frozenset(
    {
        BUDGET_EXHAUSTED,
        NO_ANSWERS,
        UNKNOWN_QUESTION,
        DESTRUCTIVE_NOT_OPTED_IN,
        UNSUPPORTED_BY_EXECUTOR,
        MISSING_TEMPLATE,
        BELOW_SUGGEST_THRESHOLD,
    }
)

EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
GITHUB_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
# CEL reserved words and the names CEL gives its types: a question called `in` or `int`
# would be unreadable in an expression.
_CEL_WORDS = (
    "true false null in as break const continue else for function if import let loop package "
    "namespace return var void while bool bytes double duration int list map null_type string "
    "timestamp uint dyn type has"
)
_RESERVED = frozenset(_CEL_WORDS.split())
BINDINGS = frozenset({"event", "confidence"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_CLOSE_REASONS = ("completed", "not_planned")

# ----------------------------------------------------------------------------------- JSON


def canonical_json(value: Any) -> str:
    """One spelling per value, so equal content hashes equally across processes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    """YAML loaders hand back their own mapping/sequence types; hashing needs plain JSON."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


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
        return cls(name, target, item, _plain(context), _plain(data.get("state")))

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
        return {"event": self.event, "item": self.item, "state": sha256_hex(canonical_json(self.state))}


# ------------------------------------------------------------------------------------ CEL


_CEL = celpy.Environment()


@dataclass(frozen=True, eq=False)
class Condition:
    """A parsed `if`: the source, the names it reads, and a program to run it."""

    source: str
    names: frozenset[str]
    confidence_refs: frozenset[str]
    program: Any = field(repr=False)

    @classmethod
    def compile(cls, source: str) -> Condition:
        """Parse now so a broken `if` refuses the file at load time; raise ValueError."""
        try:
            tree = _CEL.compile(source)
        except Exception as error:  # celpy raises CELParseError, lark a few others
            line = getattr(error, "line", None)
            column = getattr(error, "column", None)
            where = f" at line {line}, column {column}" if line is not None else ""
            raise ValueError(f"does not parse as CEL{where}: {source!r}") from None
        names = _free_names(tree, frozenset())
        return cls(source, frozenset(names), frozenset(_confidence_refs(tree)), _CEL.program(tree))

    def question_refs(self, question_ids: Iterable[str]) -> frozenset[str]:
        ids = set(question_ids)
        return frozenset((self.names | self.confidence_refs) & ids)

    def evaluate(self, activation: Mapping[str, Any]) -> bool:
        """True or False, or ConditionError: a non-boolean result is a type error too."""
        try:
            value = self.program.evaluate(dict(activation))
        except Exception as error:
            raise ConditionError(_cel_message(error)) from None
        if isinstance(value, celpy.CELEvalError):
            raise ConditionError(_cel_message(value))
        if not isinstance(value, bool | celtypes.BoolType):
            raise ConditionError(f"evaluates to {type(value).__name__}, not a bool")
        return bool(value)


def _cel_message(error: BaseException) -> str:
    """One readable line: celpy embeds the whole activation in some messages."""
    args = getattr(error, "args", ())
    text = str(args[0]) if args else str(error)
    cause = args[1] if len(args) > 1 and isinstance(args[1], type) else type(error)
    text = text.split(" (in activation", 1)[0].splitlines()[0] if text else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{cause.__name__}: {text}"


def _children(node: lark.Tree) -> list[Any]:
    return [c for c in node.children if c is not None]


def _bare_ident(node: Any) -> str | None:
    """The name when a subtree is nothing but one identifier (a macro's loop variable)."""
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if node.data == "ident":
            return str(kids[0])
        if len(kids) != 1:
            return None
        node = kids[0]
    return None


def _free_names(node: Any, bound: frozenset[str]) -> set[str]:
    """Identifiers the expression reads from its bindings (not macro loop variables)."""
    if not isinstance(node, lark.Tree):
        return set()
    kids = _children(node)
    if node.data in ("ident", "dot_ident"):
        name = str(kids[0])
        return set() if name in bound else {name}
    if node.data == "ident_arg":  # a global function call: the name is not a variable
        return set().union(*(_free_names(k, bound) for k in kids[1:]))
    if node.data == "member_dot_arg":
        target, method, *rest = kids
        names = _free_names(target, bound)
        args = _children(rest[0]) if rest else []
        if str(method) in _MACROS and len(args) >= 2 and (var := _bare_ident(args[0])):
            inner = bound | {var}
            return names.union(*(_free_names(a, inner) for a in args[1:]))
        return names.union(*(_free_names(a, bound) for a in args))
    if node.data == "member_dot":  # `x.field`: the field name is not a variable
        return _free_names(kids[0], bound)
    return set().union(*(_free_names(k, bound) for k in kids))


def _confidence_refs(tree: lark.Tree) -> set[str]:
    """Question ids read as `confidence.q` or `confidence["q"]`: they are dependencies too."""
    refs: set[str] = set()
    for node in tree.iter_subtrees():
        kids = _children(node)
        if node.data == "member_dot" and _bare_ident(kids[0]) == "confidence":
            refs.add(str(kids[1]))
        elif node.data == "member_index" and _bare_ident(kids[0]) == "confidence":
            literal = _string_literal(kids[1])
            if literal is not None:
                refs.add(literal)
    return refs


def _string_literal(node: Any) -> str | None:
    while isinstance(node, lark.Tree):
        kids = _children(node)
        if node.data == "literal":
            text = str(kids[0])
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and "\\" not in text:
                return text[1:-1]
            return None
        if len(kids) != 1:
            return None
        node = kids[0]
    return None


# --------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Question:
    """One question as the provider sees it, plus the events it is asked for."""

    id: str
    type: AnswerType
    instructions: Any = None
    criteria: Any = None
    events: frozenset[str] | None = None

    def asked_for(self, event_name: str) -> bool:
        return self.events is None or event_name in self.events

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

    @property
    def dependencies(self) -> frozenset[str]:
        """The ids the `if` references plus `gateOn`: all must be answered to decide."""
        return self.refs | frozenset(self.gate_on or ())

    @property
    def confidence_ids(self) -> tuple[str, ...]:
        """What the rule's confidence is the minimum over: `gateOn`, else the `if` references."""
        return self.gate_on if self.gate_on is not None else tuple(sorted(self.refs))

    def triggered_by(self, event_name: str) -> bool:
        return self.enabled and event_name in self.events


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
    questions: Mapping[str, Question]
    rules: tuple[Rule, ...]
    base_dir: Path
    section: Mapping[str, Any] = field(repr=False)
    hash: str = ""

    def triggered(self, event_name: str) -> list[Rule]:
        return [rule for rule in self.rules if rule.triggered_by(event_name)]

    def questions_for(self, event_name: str) -> frozenset[str]:
        """What to ask for this event: dependencies of the rules it triggers, in scope."""
        needed: set[str] = set()
        for rule in self.triggered(event_name):
            needed |= {q for q in rule.dependencies if self.questions[q].asked_for(event_name)}
        return frozenset(needed)

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
)
_RULE_KEYS = ("id", "events", "if", "gateOn", "actions", "enabled", "description")
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
    _refuse_unknown("triage.budget", budget, ("requests",))
    requests = budget.get("requests")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int) or requests < 0):
        raise ConfigError(f"triage.budget.requests: expected a whole number >= 0, got {requests!r}")

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

    plain = _plain(top)
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
    )


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


def _questions(value: Any) -> dict[str, Question]:
    questions = _mapping("triage.questions", value)
    out: dict[str, Question] = {}
    for qid, spec in questions.items():
        where = f"triage.questions.{qid}"
        if not isinstance(qid, str) or not QUESTION_ID.match(qid):
            raise ConfigError(f"{where}: a question id must be a CEL identifier (letters, digits, _)")
        if qid in _RESERVED or qid in BINDINGS:
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
        out[qid] = Question(qid, qtype, _plain(spec.get("instructions")), _plain(criteria), scoped)
    return out


def _rules(value: Any, questions: Mapping[str, Question]) -> tuple[Rule, ...]:
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
        rules.append(Rule(rid, events, condition, refs, gate_on, actions, enabled, description))
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


# ------------------------------------------------------------------------------ resolving


@dataclass(frozen=True)
class Knowledge:
    """What is known about the answers an event needs, and why the missing ones are missing."""

    answers: Mapping[str, Answer]
    unanswered: Mapping[str, str] = field(default_factory=dict)  # asked, nothing came back: why
    over_budget: frozenset[str] = frozenset()  # not asked: the budget was spent


@dataclass(frozen=True)
class Entry:
    """One planned action and how it resolved, with the numbers that were compared."""

    rule: str
    action: ActionSpec
    outcome: Outcome
    reason: str
    explanation: str
    confidence: float | None = None
    threshold: float | None = None
    margin: float | None = None
    question: str | None = None  # the least sure question the confidence came from
    executed: str | None = None  # for applied entries: what the executor did

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "action": self.action.to_json(),
            "outcome": self.outcome,
            "reason": self.reason,
            "explanation": self.explanation,
            "confidence": _round(self.confidence),
            "threshold": _round(self.threshold),
            "margin": _round(self.margin),
            "question": self.question,
            "executed": self.executed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            rule=data["rule"],
            action=ActionSpec.from_json(data["action"]),
            outcome=data["outcome"],
            reason=data["reason"],
            explanation=data.get("explanation", ""),
            confidence=data.get("confidence"),
            threshold=data.get("threshold"),
            margin=data.get("margin"),
            question=data.get("question"),
            executed=data.get("executed"),
        )

    def render(self, question_type: str | None = None) -> str:
        """`x label: add needs-repro    [needs-repro] shadow_mode — shadow mode ...`."""
        mark = {"apply": "+", "suggest": "?", "suppress": "x"}[self.outcome]
        line = f"{mark} {self.action.text()}    [{self.rule}] {self.reason} — {self.explanation}"
        numbers = []
        if self.confidence is not None:
            numbers.append(f"confidence {self.confidence:.4g}")
        if self.threshold is not None:
            numbers.append(f"threshold {self.threshold:.4g}")
            if question_type == "noul":
                hi, lo = noul_gate_as_probability(self.threshold)
                numbers[-1] += f" (p >= {hi:g} or p <= {lo:g})"
        if self.margin is not None:
            numbers.append(f"margin {self.margin:+.4g}")
        if self.executed:
            numbers.append(f"executed: {self.executed}")
        return line + ("\n      " + "  ".join(numbers) if numbers else "")


def _round(value: float | None) -> float | None:
    """For output only: 0.8600000000000001 reads as 0.86 (comparisons use answers.meets)."""
    return None if value is None else round(value, 9)


@dataclass(frozen=True)
class RuleError:
    """Row 2: an `if` that threw. Not an entry (nothing was planned), but never silent."""

    rule: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "error": self.message}


@dataclass(frozen=True)
class Resolution:
    entries: tuple[Entry, ...]
    errors: tuple[RuleError, ...]

    @property
    def undecided(self) -> bool:
        """Nothing could be decided: no action decided (even in shadow), something fell short."""
        decided = any(e.outcome != "suppress" or e.reason == SHADOW_MODE for e in self.entries)
        return not decided and (bool(self.errors) or any(e.reason in UNDECIDED_REASONS for e in self.entries))


class SupportsOps(Protocol):
    def supports(self, op: str) -> bool: ...


def bindings(event: Event, answers: Mapping[str, Answer]) -> dict[str, Any]:
    """CEL bindings: each question id → its value, `confidence` → map, `event` → the event."""
    activation: dict[str, Any] = {}
    for qid, answer in answers.items():
        value = answer.expression_value
        activation[qid] = celtypes.StringType(value) if isinstance(value, str) else celtypes.DoubleType(value)
    activation["confidence"] = celtypes.MapType(
        {celtypes.StringType(q): celtypes.DoubleType(a.confidence) for q, a in answers.items()}
    )
    activation["event"] = celpy.json_to_cel(event.to_json())
    return activation


def resolve(
    config: TriageConfig,
    event: Event,
    knowledge: Knowledge,
    *,
    executor: SupportsOps,
    mode: Mode | None = None,
    template_exists: Callable[[str], bool] | None = None,
) -> Resolution:
    """Resolve every planned action of every rule through the first-match table.

    Rows, first match wins: 1 disabled/not triggered/`if` false (silent) · 2 `if` throws
    (logged) · 3 budget_exhausted · 4 no_answers · 5 unknown_question ·
    6 destructive_not_opted_in · 7 unsupported_by_executor · 8 missing_template ·
    9 below_suggest_threshold · 10 shadow_mode · 11 suggest · 12 apply.

    A missing answer is not a throw: when the `if` references one it is undetermined,
    and rows 3-5 say why. So a keyless run lists every rule that needed answers as
    `no_answers` instead of nothing.
    """
    mode = mode or config.mode
    exists = template_exists or config.template_exists
    answers = {q: a for q, a in knowledge.answers.items() if q in config.questions}
    activation: dict[str, Any] | None = None
    entries: list[Entry] = []
    errors: list[RuleError] = []

    for rule in config.rules:
        # Row 1: disabled or not triggered.
        if not rule.triggered_by(event.event):
            continue
        missing = sorted(q for q in rule.dependencies if q not in answers)
        # Row 2 (and the silent half of row 1): an `if` whose answers are all here.
        if rule.condition is not None and rule.refs <= answers.keys():
            if activation is None:
                activation = bindings(event, answers)
            try:
                matched = rule.condition.evaluate(activation)
            except ConditionError as error:
                log.warning("triage rule %s: if failed on %s: %s", rule.id, event.target, error)
                errors.append(RuleError(rule.id, str(error)))
                continue
            if not matched:
                continue
        # Rows 3-5: undetermined, or determined but a gateOn answer is missing.
        if missing:
            reason, explanation = _missing_reason(config, event, knowledge, missing)
            entries.extend(Entry(rule.id, a, "suppress", reason, explanation) for a in rule.actions)
            continue

        confidence, weakest = _rule_confidence(rule, answers)
        for action in rule.actions:
            entries.append(_resolve_action(config, rule, action, confidence, weakest, mode, executor, exists))
    return Resolution(tuple(entries), tuple(errors))


def _missing_reason(
    config: TriageConfig, event: Event, knowledge: Knowledge, missing: list[str]
) -> tuple[str, str]:
    budget = [q for q in missing if q in knowledge.over_budget]
    if budget:
        return BUDGET_EXHAUSTED, f"the request budget was spent before {_names(budget)} could be asked"
    unasked = [q for q in missing if not config.questions[q].asked_for(event.event)]
    empty = [q for q in missing if q not in unasked]
    if empty:
        whys = sorted({knowledge.unanswered.get(q, "no answer recorded") for q in empty})
        return NO_ANSWERS, f"no answer for {_names(empty)} ({'; '.join(whys)})"
    return (
        UNKNOWN_QUESTION,
        f"{_names(unasked)} {'is' if len(unasked) == 1 else 'are'} not asked for {event.event}",
    )


def _names(ids: list[str]) -> str:
    return ", ".join(ids)


def _rule_confidence(rule: Rule, answers: Mapping[str, Answer]) -> tuple[float, str | None]:
    """The minimum over `gateOn` (else the `if` references); 1 when unconditional.

    Never an average: one confident answer must not carry a coin flip.
    """
    ids = list(rule.confidence_ids)
    confidence = min_confidence(dict(answers), ids)
    if confidence is None:  # resolve() only gets here with every dependency answered
        raise AssertionError(f"rule {rule.id}: confidence over missing answers")
    weakest = min(ids, key=lambda q: (answers[q].confidence, q)) if ids else None
    return confidence, weakest


def _resolve_action(
    config: TriageConfig,
    rule: Rule,
    action: ActionSpec,
    confidence: float,
    weakest: str | None,
    mode: Mode,
    executor: SupportsOps,
    template_exists: Callable[[str], bool],
) -> Entry:
    def entry(outcome: Outcome, reason: str, explanation: str, threshold: float | None = None) -> Entry:
        gap = margin(confidence, threshold) if threshold is not None else None
        return Entry(rule.id, action, outcome, reason, explanation, confidence, threshold, gap, weakest)

    # Row 6: destructive ops need an explicit opt-in.
    if action.op in DESTRUCTIVE_OPS and action.op not in config.allow_destructive:
        return entry(
            "suppress",
            DESTRUCTIVE_NOT_OPTED_IN,
            f"{action.op} destroys; list it in triage.allowDestructive to allow it",
        )
    # Row 7: the configured executor (even in shadow mode: shadow previews what it would do).
    if not executor.supports(action.op):
        return entry(
            "suppress", UNSUPPORTED_BY_EXECUTOR, f"the {config.executor} executor cannot {action.op}"
        )
    # Row 8.
    if action.template is not None and not template_exists(action.template):
        path = config.templates.get(action.template)
        where = f" ({path})" if path else " (not in triage.templates)"
        return entry("suppress", MISSING_TEMPLATE, f"template {action.template!r}{where} does not exist")
    # Row 9.
    if not meets(confidence, config.gate_suggest):
        return entry(
            "suppress",
            BELOW_SUGGEST_THRESHOLD,
            f"confidence {confidence:.4g} is below the suggest gate {config.gate_suggest:g}",
            config.gate_suggest,
        )
    # Row 10: the numbers still show whether auto would have applied it.
    if mode == "shadow":
        return entry(
            "suppress", SHADOW_MODE, "shadow mode decides and logs but writes nothing", config.gate_auto
        )
    # Row 11.
    if mode == "suggest":
        return entry(
            "suggest", SUGGEST, "suggest mode: a person accepts it with `triage apply`", config.gate_auto
        )
    if not meets(confidence, config.gate_auto):
        return entry(
            "suggest",
            SUGGEST,
            f"confidence {confidence:.4g} is below the auto gate {config.gate_auto:g}",
            config.gate_auto,
        )
    # Row 12.
    return entry(
        "apply",
        APPLY,
        f"confidence {confidence:.4g} meets the auto gate {config.gate_auto:g}",
        config.gate_auto,
    )


# ------------------------------------------------------------------------------------ lint


@dataclass(frozen=True)
class Problem:
    """A reference that will fail at run time (rows 5, 7, 8), found before it does."""

    where: str
    message: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message, "reason": self.reason}


def lint(config: TriageConfig, executor: SupportsOps, base_dir: Path | None = None) -> list[Problem]:
    """Everything `load_triage` let through that a run would resolve as a suppression.

    For CI: a non-empty list means some rule can never act as written.
    """
    base = Path(base_dir) if base_dir is not None else config.base_dir
    problems: list[Problem] = []
    for rule in config.rules:
        where = f"triage.rules[{rule.id}]"
        for event_name in rule.events:
            for qid in sorted(rule.dependencies):
                if not config.questions[qid].asked_for(event_name):
                    problems.append(
                        Problem(where, f"question {qid!r} is not asked for {event_name}", UNKNOWN_QUESTION)
                    )
        for i, action in enumerate(rule.actions):
            at = f"{where}.actions[{i}]"
            if not executor.supports(action.op):
                problems.append(
                    Problem(at, f"the {config.executor} executor cannot {action.op}", UNSUPPORTED_BY_EXECUTOR)
                )
            if action.template is not None:
                relative = config.templates.get(action.template)
                if relative is None:
                    problems.append(
                        Problem(
                            at, f"template {action.template!r} is not in triage.templates", MISSING_TEMPLATE
                        )
                    )
                elif not (base / relative).is_file():
                    problems.append(
                        Problem(
                            at, f"template {action.template!r}: {relative} does not exist", MISSING_TEMPLATE
                        )
                    )
    return problems
