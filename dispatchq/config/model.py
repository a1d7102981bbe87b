"""The config file as a pydantic model: every section, key and value the YAML file may hold.

The model is the one description of the file: it validates a parsed document (unknown
keys are refused by `extra="forbid"`, types, enums and patterns by the field types) and
`config_schema()` hands the same description to editors as a JSON Schema. A section is
one class with one field on `ConfigFile`; the `triage` section's class is the rules
engine's own (`dispatchq.triage.schema`), validated there once, its mistakes in its words.

What needs more than one field (an `answer` naming a question, a kind with no tier) or
the world (a `check` that must import, names reserved by the built-in kinds, passed in
the validation context) is a validator on the class that owns the fields. A validator
names where its problem sits with `dispatchq.core.fields.problem(message, *at)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from dispatchq.config.imports import import_check
from dispatchq.config.messages import PROBLEM, WHOLE
from dispatchq.core import tiers
from dispatchq.core.answers import AnswerType
from dispatchq.core.fields import Matching, NoulCriteria, first_non_json, problem
from dispatchq.core.kinds import Kind, Question, SessionSpec
from dispatchq.core.priority import DEFAULT_PRIORITY, Priority
from dispatchq.core.prompts import PLACEHOLDERS, template_placeholders
from dispatchq.core.tiers import NEEDS_TRIAGE
from dispatchq.launcher.environment import is_secret_name
from dispatchq.pools.credentials import (
    API_KEY_VAR,
    CODEX_API_KEY_VAR,
    CODEX_AUTH_VAR,
    TOKEN_VAR,
    Credential,
    Pool,
    Serves,
    SpendCap,
)
from dispatchq.triage.schema import TriageSection, triage_problems

__all__ = [
    "FILE_KEYS",
    "ChoiceQuestion",
    "ConfigFile",
    "CredentialSection",
    "KindSection",
    "NoulQuestion",
    "QuestionSection",
    "ScoreQuestion",
    "ServesSection",
    "SessionSection",
    "SpendCapSection",
    "TriageSection",
    "config_schema",
    "credentials_pool",
]


class _Section(BaseModel):
    """Every part of the file: unknown keys refused, values taken as written (no coercion)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


# --------------------------------------------------------------------------------- kinds

_KINDNAME = Matching(r"^[A-Za-z0-9_.-]+$", "a kind name (letters, digits, '.', '_' and '-')")
KindName = Annotated[str, _KINDNAME.validator, _KINDNAME.schema]
_QUESTIONID = Matching(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "a question id (letters, digits and _, not starting with a digit)"
)
QuestionId = Annotated[str, _QUESTIONID.validator, _QUESTIONID.schema]
# A variable name, or a glob over names (`CARGO_*`, `GO?ATH`).
_ENVNAME = Matching(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$", "a variable name or glob (letters, digits, _, * and ?)")
EnvName = Annotated[str, _ENVNAME.validator, _ENVNAME.schema]
_BIND_MODES = ("ro", "rw")


def _argv(value: Any) -> Any:
    if not isinstance(value, list) or not value or not all(isinstance(w, str) and w for w in value):
        raise problem('must be a non-empty list of strings, e.g. ["ruff", "format", "."]')
    return tuple(value)


#: One command, as words (no shell).
Argv = Annotated[
    tuple[str, ...],
    BeforeValidator(_argv),
    WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}),
]


def _secret_free(name: str) -> str:
    """An exact name that is secret-shaped is refused: repository commands never receive a
    credential (a glob may match one at run time; that one is withheld there)."""
    if not any(c in name for c in "*?") and is_secret_name(name):
        raise problem(f"{name} looks like a credential; produce/verify commands never receive one")
    return name


def _bind_path(entry: Any) -> Any:
    """`PATH`, `PATH:ro` or `PATH:rw`, absolute, kept as written (the sandbox reads the suffix)."""
    if not isinstance(entry, str) or not entry:
        raise problem("must be an absolute path, optionally ending in :ro or :rw")
    path, sep, mode = entry.rpartition(":")
    if not sep or mode not in _BIND_MODES:
        path = entry
    if not path.startswith("/") or "\0" in path:
        raise problem(f"{entry!r} is not an absolute path (optionally ending in :ro or :rw)")
    if ":" in path:
        raise problem(f"{entry!r}: the only suffixes are :ro and :rw")
    if any(part == ".." for part in path.split("/")):
        raise problem(f"{entry!r}: no '..' in a bind path")
    return entry


BindPath = Annotated[str, BeforeValidator(_bind_path), WithJsonSchema({"type": "string", "pattern": "^/"})]


def _known_placeholders(prompt: str) -> str:
    for name in template_placeholders(prompt):
        if name not in PLACEHOLDERS:
            known = ", ".join(sorted(PLACEHOLDERS))
            raise problem(f"unknown placeholder {{{{ {name} }}}} (known: {known})")
    return prompt


#: The session backends a kind may name (`dispatchq.backends`).
BackendName = Literal["claude", "codex"]
_PromptText = Annotated[str, Field(pattern=r"\S"), AfterValidator(_known_placeholders)]


class SessionSection(_Section):
    """`kinds.<name>.session`: how the session tier answers the kind.

    `backends` names the CLIs that may answer it (default: the pool's first credential's
    only); `prompts` gives a backend its own prompt where the wording differs. `args` and
    `model` are one CLI's words, so a kind answered by several backends gives neither.
    `cost_estimate` schedules and never changes an answer, so the kind's digest leaves it out
    (`dispatchq.config.load`)."""

    prompt: Annotated[str, AfterValidator(_known_placeholders)] = Field(
        pattern=r"\S", description="a text with {{ target }}-style placeholders"
    )
    args: list[str] = Field(default_factory=list, description="a list of strings")
    format: Literal["text", "json"] = "text"
    model: str | None = Field(default=None, description="a model name")
    bind: list[BindPath] = Field(
        default_factory=list,
        description='a list of absolute paths, e.g. ["/opt/tool", "/srv/data:rw"]',
    )
    cost_estimate: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="a number of USD above 0: what one session is expected to cost",
    )
    backends: list[BackendName] | None = Field(
        default=None, min_length=1, description="a non-empty list of session backends: claude, codex"
    )
    prompts: dict[BackendName, _PromptText] | None = Field(
        default=None, description="a mapping of backend (claude, codex) to its own prompt"
    )

    @model_validator(mode="after")
    def _backends_fit(self) -> SessionSection:
        chosen = self.backends or []
        for index, name in enumerate(chosen):
            if name in chosen[:index]:
                raise problem(f"names {name} twice", "backends", index)
        for name in self.prompts or {}:
            if name not in chosen:
                allowed = ", ".join(chosen) if chosen else "none: add session.backends"
                raise problem(f"{name} is not one of session.backends ({allowed})", "prompts", name)
        if len(chosen) > 1 and self.model is not None:
            raise problem(
                f"a model is one CLI's name; a kind answered by {' and '.join(chosen)} gives none", "model"
            )
        if len(chosen) > 1 and self.args:
            raise problem(
                f"args are one CLI's words; a kind answered by {' and '.join(chosen)} gives none", "args"
            )
        return self

    def spec(self) -> SessionSpec:
        args, model = list(self.args), self.model
        if model is None and "--model" in args:
            index = args.index("--model")
            model = args[index + 1] if index + 1 < len(args) else None
        elif model is not None and "--model" not in args:
            args = [*args, "--model", model]
        return SessionSpec(
            self.prompt,
            tuple(args),
            self.format,
            model,
            tuple(self.bind),
            self.cost_estimate,
            backends=tuple(self.backends or ()),
            prompts=tuple(sorted((self.prompts or {}).items())),
        )


class _Question(_Section):
    """What every answer type's question holds; each type narrows `type` and `criteria`."""

    type: AnswerType
    instructions: Any = None
    criteria: Any = None

    def question(self, qid: str) -> Question:
        return Question(qid, self.type, self.instructions, self.criteria, None)


class NoulQuestion(_Question):
    """`kinds.<name>.questions.<id>` of type noul: a yes/no the typed tier asks."""

    type: Literal["noul"]
    criteria: NoulCriteria | None = Field(default=None, description="a mapping with true and/or false")

    @model_validator(mode="after")
    def _described(self) -> NoulQuestion:
        if self.instructions is None and not any(v is not None for v in (self.criteria or {}).values()):
            raise problem("a noul needs instructions or a described outcome", "instructions")
        return self


class ChoiceQuestion(_Question):
    """`kinds.<name>.questions.<id>` of type choice: one of its options, maybe ranked."""

    type: Literal["choice"]
    criteria: dict[str, Any] = Field(
        min_length=1, max_length=255, description="a mapping of 1 to 255 options"
    )
    priority: dict[str, float] | None = Field(default=None, description="a map {label: number}")

    @model_validator(mode="after")
    def _ranks_options(self) -> ChoiceQuestion:
        for label in self.priority or ():
            if label not in self.criteria:
                raise problem("not one of the choice's options", "priority", label)
        return self

    def question(self, qid: str) -> Question:
        return Question(qid, self.type, self.instructions, self.criteria, self.priority)


class ScoreQuestion(_Question):
    """`kinds.<name>.questions.<id>` of type score: a level on its scale."""

    type: Literal["score"]
    criteria: list[Any] = Field(min_length=2, max_length=10, description="a list of 2 to 10 levels")


QuestionSection = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class KindSection(_Section):
    """`kinds.<name>`: one kind of judgement and how each tier answers it.

    `priority` is the class its judgements get when their producer names none; it orders
    work and never changes an answer, so the kind's digest leaves it out."""

    check: str | None = Field(default=None, description="'module:function'")
    produce: list[Argv] | None = Field(
        default=None, min_length=1, description="a list of commands, each a list of words (no shell)"
    )
    verify: list[Argv] | None = Field(
        default=None, min_length=1, description="a list of commands, each a list of words (no shell)"
    )
    effect: Literal["local", "external"] = "local"
    questions: dict[QuestionId, QuestionSection] | None = Field(
        default=None, description="a mapping of question id to question"
    )
    answer: str | None = Field(default=None, description="the id of the question that answers")
    gate_on: list[str] | None = Field(
        default=None, alias="gateOn", min_length=1, description="a non-empty list of question ids"
    )
    order: str | None = Field(default=None, description="a question id")
    escalate: Literal["session", "needs-triage"] | None = None
    session: SessionSection | None = None
    env: list[Annotated[EnvName, AfterValidator(_secret_free)]] = Field(
        default_factory=list, description="a list of variable names or globs, e.g. [GOPATH, CARGO_*]"
    )
    priority: Priority = DEFAULT_PRIORITY

    _check_fn: Callable[..., Any] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _plain_json(cls, data: Any) -> Any:
        """The kind's digest hashes the definition as JSON: a YAML date or .nan cannot be."""
        found = first_non_json(data) if isinstance(data, dict) else None
        if found is not None:
            at, value = found
            raise problem(
                f"{type(value).__name__} {value!r} is not plain JSON data "
                "(text, finite number, true/false, list or mapping); quote it",
                *at,
            )
        return data

    @model_validator(mode="after")
    def _tiers_fit_together(self, info: ValidationInfo) -> KindSection:
        self._code_tier(info.context or {})
        self._typed_tier()
        if self.escalate == "session" and self.session is None:
            raise problem("'session' needs a session block with a prompt", "escalate")
        return self

    def _code_tier(self, context: Mapping[str, Any]) -> None:
        if (self.produce is None) != (self.verify is None):
            missing = "verify" if self.produce else "produce"
            raise problem("produce and verify go together (the verifier judges what was produced)", missing)
        if self.check is not None and self.produce:
            raise problem("a kind has either a check or produce/verify, not both", "produce")
        if self.check is not None and context.get("import_checks", True):
            try:
                self._check_fn = import_check(self.check, Path(context.get("base_dir", ".")))
            except ValueError as error:
                raise problem(str(error), "check") from None

    def _typed_tier(self) -> None:
        questions = self.questions or {}
        if self.answer is not None and self.answer not in questions:
            raise problem(f"names no question (questions: {', '.join(questions) or 'none'})", "answer")
        for qid in self.gate_on or ():
            if qid not in questions:
                raise problem(f"{qid!r} names no question", "gateOn")
        if self.order is not None:
            question = questions.get(self.order)
            if question is None:
                raise problem(f"{self.order!r} names no question", "order")
            if not isinstance(question, ScoreQuestion | ChoiceQuestion) or (
                isinstance(question, ChoiceQuestion) and not question.priority
            ):
                raise problem("must name a score question, or a choice question with a priority map", "order")
        if questions and self.answer is None and self.order is None:
            raise problem(
                "required when questions are given (which question answers the judgement?)", "answer"
            )

    def kind(self, name: str, digest: str = "") -> Kind:
        """The `Kind` the tiers read, named `name`, its definition hashed as `digest`."""
        return Kind(
            name=name,
            effect=self.effect,
            check=self.check,
            check_fn=self._check_fn,
            produce=tuple(self.produce or ()),
            verify=tuple(self.verify or ()),
            questions={qid: q.question(qid) for qid, q in (self.questions or {}).items()},
            answer=self.answer,
            gate_on=tuple(self.gate_on or ()),
            order=self.order,
            escalate=self.escalate or ("session" if self.session else NEEDS_TRIAGE),
            session=self.session.spec() if self.session else None,
            env=tuple(self.env),
            digest=digest,
            priority=self.priority,
        )


# --------------------------------------------------------------------------- credentials

_CREDENTIALNAME = Matching(
    r"^[a-z0-9][a-z0-9_-]{0,39}$",
    "a credential name (up to 40 lower-case letters, digits, '_' and '-', starting with a letter or digit)",
)
#: Never holds `/`: a credential's marker scopes are `<name>/<scope>` (`dispatchq.pools`).
CredentialName = Annotated[str, _CREDENTIALNAME.validator, _CREDENTIALNAME.schema]
#: The key that names a credential's file, by the variable its sessions see it under.
FILE_KEYS: dict[str, str] = {
    TOKEN_VAR: "token_file",
    API_KEY_VAR: "api_key_file",
    CODEX_API_KEY_VAR: "api_key_file",
    CODEX_AUTH_VAR: "auth_file",
}
#: The keys that name a credential's file, by backend.
_BACKEND_FILES: dict[str, tuple[str, str]] = {
    "claude": ("token_file", "api_key_file"),
    "codex": ("auth_file", "api_key_file"),
}
_FILE = "a file path (absolute, or relative to the config file's folder)"
_USD = "a number of USD above 0"


class SpendCapSection(_Section):
    """`credentials.<name>.spend_cap`: USD the credential may spend per calendar day and/or month."""

    day: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_USD)
    month: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_USD)

    @model_validator(mode="after")
    def _some_cap(self) -> SpendCapSection:
        if self.day is None and self.month is None:
            raise problem("give day and/or month (USD)")
        return self

    def cap(self) -> SpendCap:
        return SpendCap(day=self.day, month=self.month)


class ServesSection(_Section):
    """`credentials.<name>.serves`: who may use the credential, a priority floor and/or kinds."""

    priority: Priority | None = None
    kinds: list[KindName] | None = Field(
        default=None, min_length=1, description="a non-empty list of kind names"
    )

    def serves(self) -> Serves:
        return Serves(priority=self.priority, kinds=tuple(self.kinds) if self.kinds is not None else None)


class CredentialSection(_Section):
    """`credentials.<name>`: one credential a session may run under, and how it may be spent.

    Exactly one file: for `backend: claude`, `token_file` (a subscription's long-lived token,
    seen by its sessions as `CLAUDE_CODE_OAUTH_TOKEN`) or `api_key_file` (an API key, seen as
    `ANTHROPIC_API_KEY`); for `backend: codex`, `auth_file` (a ChatGPT plan's `auth.json`,
    written into the session's `CODEX_HOME`) or `api_key_file` (seen as `CODEX_API_KEY`).
    `billing` defaults by the file: an API key is billed per use, so it is `metered` unless
    written otherwise, and a metered credential must name a `spend_cap`: no credential spends
    money without a bound. A subscription takes no cap (its windows bound it; a cap that
    stopped nothing would only mislead). `pacing` defaults to on for a subscription and off
    for a metered credential. The file's path is kept as written, made absolute against the
    config file's folder, never resolved through symlinks: a rotated secret mount that swaps
    its link is read afresh.
    """

    token_file: str | None = Field(default=None, min_length=1, description=_FILE)
    api_key_file: str | None = Field(default=None, min_length=1, description=_FILE)
    auth_file: str | None = Field(default=None, min_length=1, description=_FILE)
    backend: BackendName = "claude"
    billing: Literal["subscription", "metered"] | None = None
    spend_cap: SpendCapSection | None = None
    serves: ServesSection | None = None
    concurrency: int = Field(default=1, ge=1, description="a whole number of sessions at once, at least 1")
    order: int = Field(default=0, description="a whole number, the lower preferred among equals")
    pacing: bool | None = None
    reserve_urgent: bool = False

    _path: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _one_file_and_a_bound(self, info: ValidationInfo) -> CredentialSection:
        own = _BACKEND_FILES[self.backend]
        for key in ("token_file", "api_key_file", "auth_file"):
            if getattr(self, key) is not None and key not in own:
                theirs = ", ".join(b for b, keys in _BACKEND_FILES.items() if key in keys)
                raise problem(
                    f"{key} is for backend {theirs}; backend {self.backend} takes {' or '.join(own)}", key
                )
        if sum(getattr(self, key) is not None for key in own) != 1:
            if self.backend == "codex":
                raise problem(
                    "give exactly one of auth_file (a ChatGPT plan's auth.json)"
                    " or api_key_file (an OpenAI API key)"
                )
            raise problem(
                "give exactly one of token_file (a subscription's token) or api_key_file (an API key)"
            )
        if self.billed == "metered" and self.spend_cap is None:
            raise problem("a metered credential needs spend_cap (USD per day and/or month)")
        if self.billed == "subscription" and self.spend_cap is not None:
            raise problem(
                "spend_cap bounds a metered credential (billing: metered); a subscription's windows bound it"
            )
        base = Path((info.context or {}).get("base_dir", "."))
        self._path = os.path.normpath(base / self.written)
        return self

    @property
    def written(self) -> str:
        """The file as the operator wrote it."""
        return str(getattr(self, self.file_key))

    @property
    def file_key(self) -> str:
        return next(k for k in ("token_file", "auth_file", "api_key_file") if getattr(self, k) is not None)

    @property
    def variable(self) -> str:
        """The name its sessions see the credential under (the Codex login: a file, never a variable)."""
        if self.backend == "codex":
            return CODEX_AUTH_VAR if self.auth_file is not None else CODEX_API_KEY_VAR
        return TOKEN_VAR if self.token_file is not None else API_KEY_VAR

    @property
    def path(self) -> str:
        """The file, absolute (relative paths are the config file's folder's)."""
        return self._path

    @property
    def billed(self) -> Literal["subscription", "metered"]:
        if self.billing is not None:
            return self.billing
        return "metered" if self.api_key_file is not None else "subscription"

    def credential(self, name: str) -> Credential:
        """The pool's `Credential` named `name`."""
        billing = self.billed
        return Credential(
            name=name,
            variable=self.variable,
            file=self.path,
            backend=self.backend,
            billing=billing,
            concurrency=self.concurrency,
            order=self.order,
            spend_cap=self.spend_cap.cap() if self.spend_cap is not None else None,
            serves=self.serves.serves() if self.serves is not None else Serves(),
            pacing=self.pacing if self.pacing is not None else billing == "subscription",
            reserve_urgent=self.reserve_urgent,
        )


def credentials_pool(sections: Mapping[str, CredentialSection] | None) -> Pool | None:
    """The pool the section describes, in the order written (None: no section)."""
    if not sections:
        return None
    return Pool(tuple(section.credential(str(name)) for name, section in sections.items()))


# ---------------------------------------------------------------------------------- file


class ConfigFile(_Section):
    """The whole file. A new section is one class above and one field here."""

    kinds: dict[KindName, KindSection] | None = Field(
        default=None, description="a mapping of kind name to definition"
    )
    credentials: dict[CredentialName, CredentialSection] | None = Field(
        default=None, min_length=1, description="a mapping of credential name to credential"
    )
    triage: TriageSection | None = None

    @field_validator("triage", mode="wrap")
    @classmethod
    def _the_engine_loads_it(
        cls, data: Any, handler: Callable[[Any], TriageSection], info: ValidationInfo
    ) -> Any:
        """The section is the rules engine's: its mistakes read as `load_triage` words them,
        and the engine's config is built from the validated section (`section.engine`)."""
        from dispatchq.triage.rules import triage_config  # noqa: PLC0415 (lazy: the CEL parser)

        try:
            section = handler(data)
        except ValidationError as error:
            lines = [
                InitErrorDetails(
                    type=PydanticCustomError(PROBLEM, "{message}", {"message": line, WHOLE: True}),
                    loc=(),
                    input=data,
                )
                for line in triage_problems(error, data)
            ]
            raise ValidationError.from_exception_data(cls.__name__, lines) from None
        section.engine = triage_config(section, (info.context or {}).get("base_dir", "."))
        return section

    @field_validator("kinds")
    @classmethod
    def _each_kind_has_a_tier(cls, kinds: dict[str, KindSection] | None) -> Any:
        """Which tiers serve a kind is the tier table's answer (a row may read the name)."""
        untiered = [
            InitErrorDetails(
                type=problem("declares no tier (give a check, produce/verify, questions or a session)"),
                loc=(name,),
                input=name,
            )
            for name, section in (kinds or {}).items()
            if not any(row.serves(section.kind(name)) for row in tiers.TABLE)
        ]
        if untiered:
            raise ValidationError.from_exception_data(cls.__name__, untiered)
        return kinds

    @field_validator("kinds", mode="before")
    @classmethod
    def _no_builtin_names(cls, value: Any, info: ValidationInfo) -> Any:
        builtin = (info.context or {}).get("builtin") or {}
        for name in value if isinstance(value, dict) else ():
            if str(name) in builtin:
                raise problem(
                    "the name is reserved for dispatchq's built-in decision-gate kind; choose another name",
                    str(name),
                )
        return value

    @field_validator("credentials")
    @classmethod
    def _credentials_fit_the_file(
        cls, credentials: dict[str, CredentialSection] | None, info: ValidationInfo
    ) -> Any:
        """One file is one credential's (compared through symlinks), and `serves.kinds`
        names kinds that exist: the file's and the built-in ones. When the kinds themselves
        are wrong, their lines come first and the names are checked once they load."""
        errors: list[InitErrorDetails] = []
        owner: dict[str, str] = {}
        for name, section in (credentials or {}).items():
            real = os.path.realpath(section.path)
            if real in owner:
                message = f"{section.file_key} {section.path} is credential {owner[real]}'s file too"
                errors.append(
                    InitErrorDetails(
                        type=problem(f"{message} (one file, one credential)"), loc=(name,), input=name
                    )
                )
            owner.setdefault(real, name)
        if "kinds" in info.data:
            declared = sorted(info.data["kinds"] or {})
            known = set(declared) | set((info.context or {}).get("builtin") or {})
            for name, section in (credentials or {}).items():
                for index, kind in enumerate(section.serves.kinds or () if section.serves else ()):
                    if kind not in known:
                        errors.append(
                            InitErrorDetails(
                                type=problem(
                                    f"{kind!r} names no kind (kinds: {', '.join(declared) or 'none'})"
                                ),
                                loc=(name, "serves", "kinds", index),
                                input=kind,
                            )
                        )
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return credentials

    @model_validator(mode="after")
    def _kinds_backends_have_credentials(self) -> ConfigFile:
        """A backend a kind names must be some credential's (without `credentials:`, the
        environment's one credential, `default`, is Claude Code's)."""
        pool = {name: section.backend for name, section in (self.credentials or {}).items()} or {
            "default": "claude"
        }
        errors: list[InitErrorDetails] = []
        for kind, section in (self.kinds or {}).items():
            session = section.session
            for index, backend in enumerate(session.backends or () if session else ()):
                if backend not in pool.values():
                    held = ", ".join(f"{name} ({b})" for name, b in pool.items())
                    errors.append(
                        InitErrorDetails(
                            type=problem(f"no credential runs {backend} (credentials: {held})"),
                            loc=("kinds", kind, "session", "backends", index),
                            input=backend,
                        )
                    )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the file, for editors (`dispatchq config schema`)."""
    schema = ConfigFile.model_json_schema(by_alias=True)
    _closed_mappings(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dispatchq config file"
    return schema


def _closed_mappings(node: Any) -> None:
    """A mapping whose keys have a pattern (kind names, question ids) takes no other key."""
    if isinstance(node, dict):
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _closed_mappings(value)
    elif isinstance(node, list):
        for value in node:
            _closed_mappings(value)
