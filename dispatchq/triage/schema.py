"""The `triage` section as a pydantic model: the one validation of the rules engine's config.

`validate_triage` checks a section once, here: unknown keys (`extra="forbid"`), types,
enums, patterns and ranges by the field declarations; an `if` that does not parse, a
name that is no question, a duplicate rule id and an op's parameters by small validators.
`dispatchq.triage.rules.load_triage` builds its rule objects from the validated model,
and the config file's model (`dispatchq.config.model`) holds this class as its `triage`
field, so the same classes give editors the JSON Schema.

A mistake reads in the engine's words, `triage.rules[<id>].events[0]: 'x' is not an
'<event>.<action>' name`: a rule is named by its id, and a type mistake says what the
field takes (its `description`). The CEL parser is imported only when a rule has an `if`
or a question an id, so reading a config without a `triage` section never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath, PureWindowsPath
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dispatchq.core.answers import AnswerType
from dispatchq.core.fields import PROBLEM, Matching, NoulCriteria, field_at, first_non_json, problem, untagged
from dispatchq.core.judgement import canonical_json
from dispatchq.errors import ConfigError

__all__ = [
    "CLOSE_REASONS",
    "DEFAULT_BUDGET_WINDOW",
    "EVENT_NAME",
    "EXECUTORS",
    "GITHUB_LOGIN",
    "KNOWN_OPS",
    "MODES",
    "QUESTION_ID",
    "REPOSITORY",
    "RULE_ID",
    "STATE_PATH",
    "ActionSection",
    "BudgetSection",
    "GateSection",
    "Mode",
    "Op",
    "RuleSection",
    "TriageChoice",
    "TriageNoul",
    "TriageQuestionSection",
    "TriageScore",
    "TriageSection",
    "triage_problems",
    "validate_triage",
]

Mode = Literal["shadow", "suggest", "auto"]
MODES: tuple[Mode, ...] = get_args(Mode)
#: Every op a rule may plan. An executor supports a subset (row 7 covers the rest).
Op = Literal["label.add", "label.remove", "comment", "close", "reopen", "assign", "lock", "delete-branch"]
KNOWN_OPS: tuple[str, ...] = get_args(Op)
EXECUTORS: tuple[str, ...] = ("recording", "github")
CLOSE_REASONS = ("completed", "not_planned")
#: `triage.budget.window` when unset: the per-config budget counts over a rolling hour.
DEFAULT_BUDGET_WINDOW = 3600

#: `<event>.<action>` (`issues.opened`), or `<event>` alone: for events with no action (`push`),
#: and in a rule or question, every action of that event.
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)?$")
#: A rule's `state:` entry: a dotted path into the event's state (`issue.title`).
STATE_PATH = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")
QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
GITHUB_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


def _matching(regex: re.Pattern[str], what: str) -> Matching:
    return Matching(regex.pattern, what, got=True)


_RULEID = _matching(RULE_ID, "a rule id (letters, digits, . _ -)")
RuleId = Annotated[str, _RULEID.validator, _RULEID.schema]
_EVENTNAME = _matching(EVENT_NAME, "an '<event>.<action>' name")
EventName = Annotated[str, _EVENTNAME.validator, _EVENTNAME.schema]
_STATEPATH = _matching(STATE_PATH, "a dotted path")
StatePath = Annotated[str, _STATEPATH.validator, _STATEPATH.schema]
_REPOSITORY = _matching(REPOSITORY, "owner/name")
Repository = Annotated[str, _REPOSITORY.validator, _REPOSITORY.schema]
_GITHUBLOGIN = _matching(GITHUB_LOGIN, "a GitHub login")
GithubLogin = Annotated[str, _GITHUBLOGIN.validator, _GITHUBLOGIN.schema]
_QUESTIONID = _matching(QUESTION_ID, "a CEL identifier (letters, digits, _)")


def _not_reserved(qid: str) -> str:
    from dispatchq.triage.cel import BINDINGS, RESERVED_WORDS  # noqa: PLC0415 (lazy: the CEL parser)

    if qid in RESERVED_WORDS or qid in BINDINGS:
        raise problem(f"{qid!r} is reserved in rule expressions")
    return qid


def _inside(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or PureWindowsPath(path).is_absolute() or ".." in pure.parts:
        raise problem(f"{path!r} must stay inside the config file's directory")
    return path


def _given(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("null_given", "null")  # worded by the field's description
    return value


#: An optional key that, when written, holds a value: `if: null` is a mistake, not "no if".
Given = BeforeValidator(_given)
QuestionId = Annotated[str, _QUESTIONID.validator, _QUESTIONID.schema, AfterValidator(_not_reserved)]
#: Text with something besides blanks in it.
Text = Annotated[str, Field(pattern=r"\S")]
#: A label: at most 50 printable characters.
Label = Annotated[str, Field(pattern=r"^[^\x00-\x1f]*[^\x00-\x1f\s][^\x00-\x1f]*$", max_length=50)]
TemplatePath = Annotated[Text, AfterValidator(_inside)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, description="a number between 0 and 1")]


class _Section(BaseModel):
    """Every part of the section: unknown keys refused, values taken as written (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class GateSection(_Section):
    suggest: Fraction = 0.6
    auto: Fraction = 0.85

    @model_validator(mode="after")
    def _suggest_below_auto(self) -> GateSection:
        if self.suggest > self.auto:
            raise problem(f"suggest ({self.suggest:g}) is above auto ({self.auto:g})")
        return self


class BudgetSection(_Section):
    requests: int | None = Field(default=None, ge=0, description="a whole number >= 0")
    window: int = Field(default=DEFAULT_BUDGET_WINDOW, ge=1, description="a whole number of seconds >= 1")


class _Question(_Section):
    """A triage question as the file writes it; each answer type narrows `type` and `criteria`."""

    type: AnswerType
    instructions: Any = None
    criteria: Any = None
    events: list[EventName] | None = Field(
        default=None, min_length=1, description="a non-empty list of '<event>.<action>' names"
    )


class TriageNoul(_Question):
    type: Literal["noul"]
    criteria: NoulCriteria | None = Field(default=None, description="a mapping with true and/or false")

    @model_validator(mode="after")
    def _described(self) -> TriageNoul:
        if self.instructions is None and not self.criteria:
            raise problem("a noul needs instructions or criteria")
        return self


class TriageChoice(_Question):
    type: Literal["choice"]
    criteria: dict[str, Any] = Field(min_length=1, description="a non-empty mapping of labels")


class TriageScore(_Question):
    type: Literal["score"]
    criteria: list[Any] = Field(min_length=1, description="a non-empty list, one entry per level")


TriageQuestionSection = Annotated[TriageNoul | TriageChoice | TriageScore, Field(discriminator="type")]


#: op: (the parameters it needs, the ones it may take).
_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "label.add": (("label",), ()),
    "label.remove": (("label",), ()),
    "comment": (("template",), ()),
    "close": ((), ("reason",)),
    "reopen": ((), ()),
    "assign": (("assignees",), ()),
    "lock": ((), ("reason",)),
    "delete-branch": ((), ()),
}


class ActionSection(_Section):
    """One planned action: `op` and the parameters that op takes."""

    op: Op
    label: Annotated[Label | None, Given] = Field(
        default=None, description="a label name (at most 50 printable characters)"
    )
    template: Annotated[Text | None, Given] = Field(default=None, description="a template name")
    reason: Annotated[Text | None, Given] = Field(default=None, description="a reason")
    assignees: Annotated[list[GithubLogin] | None, Given] = Field(
        default=None, min_length=1, description="a non-empty list of logins"
    )

    @model_validator(mode="after")
    def _params_fit_the_op(self) -> ActionSection:
        required, optional = _PARAMS[self.op]
        given = self.model_fields_set - {"op"}
        extra = sorted(given - {*required, *optional})
        if extra:
            takes = ", ".join((*required, *optional)) or "nothing"
            raise problem(f"{self.op} takes no {extra[0]!r} (it takes: {takes})")
        for key in required:
            if key not in given:
                raise problem(f"{self.op} needs {key!r}")
        if self.op == "close" and self.reason is not None and self.reason not in CLOSE_REASONS:
            raise problem(f"expected one of {', '.join(CLOSE_REASONS)}", "reason")
        return self

    def params(self) -> dict[str, Any]:
        """The parameters exactly as the config wrote them."""
        return self.model_dump(include=self.model_fields_set - {"op"})


class RuleSection(_Section):
    id: RuleId
    events: list[EventName] = Field(min_length=1, description="a non-empty list of '<event>.<action>' names")
    if_: Annotated[Text | None, Given] = Field(
        default=None, alias="if", description="a CEL expression over the answers"
    )
    gate_on: Annotated[list[str] | None, Given] = Field(
        default=None,
        alias="gateOn",
        min_length=1,
        description="a non-empty list of question ids (omit it to gate on the if)",
    )
    actions: list[ActionSection] = Field(min_length=1, description="a non-empty list of actions")
    enabled: bool = True
    description: str | None = Field(default=None, description="a string")
    state: Annotated[list[StatePath] | None, Given] = Field(
        default=None, min_length=1, description="a non-empty list of dotted paths such as issue.title"
    )

    _condition: Any = PrivateAttr(default=None)

    @property
    def condition(self) -> Any:
        """The parsed `if` (a `dispatchq.triage.cel.Condition`), or None."""
        return self._condition

    @model_validator(mode="after")
    def _if_parses(self) -> RuleSection:
        if self.if_ is not None:
            from dispatchq.triage.cel import Condition  # noqa: PLC0415 (lazy: the CEL parser)

            try:
                self._condition = Condition.compile(self.if_)
            except ValueError as error:
                raise problem(str(error), "if") from None
        return self


class TriageSection(_Section):
    """`triage`: the rules engine (docs/triage.md)."""

    mode: Mode = "shadow"
    gate: GateSection | None = None
    budget: BudgetSection | None = None
    allow_destructive: list[Op] | None = Field(default=None, alias="allowDestructive")
    executor: Literal["recording", "github"] = "recording"
    escalate: Text | None = Field(default=None, description="a label name")
    templates: dict[str, TemplatePath] | None = Field(
        default=None, description="a mapping of name to a path relative to the config file"
    )
    questions: dict[QuestionId, TriageQuestionSection] | None = Field(
        default=None, description="a mapping of question id to question"
    )
    rules: list[RuleSection] | None = Field(default=None, description="a list of rules")
    repositories: list[Repository] | None = Field(default=None, description="a list of owner/name")

    _section: dict[str, Any] = PrivateAttr(default_factory=dict)
    _engine: Any = PrivateAttr(default=None)

    @property
    def section(self) -> dict[str, Any]:
        """The section as plain JSON data, exactly as written (what the config hash covers)."""
        return self._section

    @property
    def engine(self) -> Any:
        """The rules engine's `TriageConfig` built from this section by the config file's
        model (`dispatchq.config.model`); None for a section validated alone."""
        return self._engine

    @engine.setter
    def engine(self, engine: Any) -> None:
        self._engine = engine

    @model_validator(mode="wrap")
    @classmethod
    def _plain_json(cls, data: Any, handler: Any) -> Any:
        """The config hash needs one canonical spelling: a YAML date, .nan or a huge number has none."""
        section = handler(data)  # a mapping, once it validates
        found = first_non_json(dict(data))
        if found is not None:
            at, value = found
            raise problem(f"not plain JSON data ({type(value).__name__} {value!r})", *at)
        try:
            section._section = orjson.loads(canonical_json(data))
        except (TypeError, ValueError) as error:  # orjson.JSONEncodeError is a TypeError
            raise problem(f"not plain JSON data ({error})") from None
        return section

    @model_validator(mode="after")
    def _names_are_questions(self) -> TriageSection:
        questions = set(self.questions or {})
        seen: set[str] = set()
        for index, rule in enumerate(self.rules or ()):
            if rule.id in seen:
                raise problem(f"duplicate rule id {rule.id!r}", "rules", index, "id")
            seen.add(rule.id)
            condition, at = rule.condition, ("rules", index, "if")
            if condition is not None:
                from dispatchq.triage.cel import BINDINGS  # noqa: PLC0415 (lazy: the CEL parser)

                unknown = sorted(condition.names - questions - BINDINGS)
                if unknown:
                    raise problem(f"{unknown[0]!r} is neither a question nor event/confidence", *at)
                unknown = sorted(condition.confidence_refs - questions)
                if unknown:
                    raise problem(f"confidence of {unknown[0]!r}, which is not a question", *at)
            for position, qid in enumerate(rule.gate_on or ()):
                if qid not in questions:
                    raise problem(f"{qid!r} is not a question", "rules", index, "gateOn", position)
        return self


def validate_triage(section: Any) -> TriageSection:
    """The section validated once; ConfigError names every mistake, one line each."""
    try:
        return TriageSection.model_validate(section)
    except ValidationError as error:
        raise ConfigError("\n".join(triage_problems(error, section))) from None


_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def triage_problems(error: ValidationError, section: Any) -> list[str]:
    """One line per mistake in the engine's words, each starting with its full path."""
    lines: list[str] = []
    for item in error.errors():
        loc, ctx, kind, value = tuple(item["loc"]), item.get("ctx") or {}, item["type"], item.get("input")
        if kind in ("union_tag_invalid", "union_tag_not_found"):  # named as the tag's own key
            loc = (*loc, str(ctx["discriminator"]).strip("'"))
            kind = "literal_error" if kind == "union_tag_invalid" else "missing"
            value, ctx = ctx.get("tag"), {"expected": ctx.get("expected_tags", "")}
        if kind == PROBLEM:
            line = f"{_where(section, (*loc, *ctx.get('at', ())))}: {ctx['message']}"
        elif kind in ("extra_forbidden", "invalid_key"):
            key = loc[-1] if kind == "extra_forbidden" else value
            owner, _ = field_at(TriageSection, loc[:-1])
            allowed = [f.alias or n for n, f in owner.model_fields.items()] if owner else []
            hint = " (name events with 'events', not 'on')" if key in ("on", True) else ""
            line = f"{_where(section, loc[:-1])}: unknown key {key!r}{hint}; allowed: {', '.join(allowed)}"
        elif kind == "literal_error":
            expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
            line = f"{_where(section, loc)}: expected one of {expected}, got {value!r}"
        else:
            _, field = field_at(TriageSection, loc)
            what = (field.description if field is not None else None) or _TYPE_WORDS.get(kind)
            if kind == "missing":
                line = f"{_where(section, loc)}: required" + (f", {what}" if what else "")
            elif what:
                line = f"{_where(section, loc)}: expected {what}, got {value!r}"
            else:
                line = f"{_where(section, loc)}: {item['msg'][:1].lower()}{item['msg'][1:]} (got {value!r})"
        if line not in lines:
            lines.append(line)
    return lines


def _where(section: Any, loc: tuple[Any, ...]) -> str:
    """`triage.rules[<id>].actions[0]`: the path, a rule named by its id where it has one."""
    out, node = "triage", section
    for part in untagged(TriageSection, loc):
        if part == "[key]":
            continue
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
            named = node.get("id") if isinstance(node, Mapping) else None
            out += f"[{named if isinstance(named, str) else part}]"
        else:
            node = node.get(part) if isinstance(node, Mapping) else None
            out += f".{part}"
    return out
