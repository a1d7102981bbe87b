"""The YAML config: which kinds of judgement exist and how each tier answers them.

Everything is validated when the file is loaded, never in a worker: an unknown key,
a check that does not import, a question the SDK would reject, an `answer` naming
no question, an unknown prompt placeholder. Each error names the kind and the field.

The file is read with a YAML 1.2 loader (ruamel.yaml), so `on`, `yes` and `no` stay
strings instead of turning into booleans as they do in YAML 1.1.

Which file is read is the settings' choice (`DISPATCHQ_CONFIG`, else a config folder),
never the working directory's: a checkout's own `dispatchq.yaml` names checks to import.
A long-running role says in one line which file it loaded (`config_source`, logged once
Redis answers, so a refusal at start stays one line), and loading warns when a `github`
executor has no `triage.repositories` allowlist.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from dispatchq.core import tiers
from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.core.kinds import Kind, Kinds, Question, SessionSpec
from dispatchq.core.prompts import PLACEHOLDERS, template_placeholders
from dispatchq.core.tiers import NEEDS_TRIAGE
from dispatchq.errors import ConfigError
from dispatchq.launcher.environment import is_secret_name

__all__ = [
    "KIND_KEYS",
    "QUESTION_KEYS",
    "SESSION_KEYS",
    "TOP_KEYS",
    "Config",
    "config_source",
    "import_check",
    "load_config",
    "load_kind",
    "parse_config",
]

KIND_KEYS = {
    "check",
    "produce",
    "verify",
    "effect",
    "questions",
    "answer",
    "gateOn",
    "order",
    "escalate",
    "session",
    "env",
}
QUESTION_KEYS = {"type", "instructions", "criteria", "priority"}
SESSION_KEYS = {"prompt", "args", "format", "model", "bind"}
TOP_KEYS = {"kinds", "triage"}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_QUESTION_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An environment variable name, or a glob over names (`CARGO_*`, `GO?ATH`).
_ENV_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")
_BIND_MODES = ("ro", "rw")
_log = logging.getLogger("dispatchq.config")
#: Config paths this process already warned about (once each, not on every reload).
_WARNED: set[str] = set()


@dataclass(frozen=True)
class Config:
    kinds: dict[str, Kind]
    triage: Any = None  # the rules engine's own config object, when a `triage` section exists
    path: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)

    def kind(self, name: str) -> Kind:
        try:
            return self.kinds[name]
        except KeyError:
            known = ", ".join(sorted(self.kinds)) or "none"
            raise ConfigError(f"unknown kind {name!r} (known: {known})") from None


def _refuse_unknown(where: str, raw: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(
            f"{where}.{sorted(unknown)[0]}: unknown key (allowed: {', '.join(sorted(allowed))})"
        )


@contextmanager
def _on_path(directory: Path) -> Iterator[None]:
    # The directory stays on the path: a check may import its own helpers from there
    # when it runs, long after the config was loaded. Last, not first: a folder of the
    # user's must never shadow an installed package (their own `jobs/` once replaced
    # dispatchq's entry points, and every job failed).
    entry = str(directory)
    if entry not in sys.path:
        sys.path.append(entry)
    yield


def import_check(spec: str, base_dir: Path) -> Callable[..., Any]:
    """Import `module:function` with the config file's directory on the path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not module:function")
    with _on_path(base_dir):
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"cannot import {module_name!r}: {error}") from None
        except Exception as error:  # the module itself raised while importing
            raise ValueError(f"importing {module_name!r} raised {type(error).__name__}: {error}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return fn


def _argv_list(value: Any, where: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a list of commands, each a list of words (no shell)")
    out = []
    for i, argv in enumerate(value):
        if not isinstance(argv, list) or not argv or not all(isinstance(w, str) and w for w in argv):
            raise ConfigError(
                f'{where}[{i}]: must be a non-empty list of strings, e.g. ["ruff", "format", "."]'
            )
        out.append(tuple(argv))
    return tuple(out)


def _check_criteria(where: str, qtype: Any, instructions: Any, criteria: Any) -> str:
    """Each answer type's own shape: a noul's outcomes, a choice's options, a score's levels.
    Returns the type, now known to be one of the three."""
    if qtype == "noul":
        if criteria is not None and (not isinstance(criteria, dict) or set(criteria) - {"true", "false"}):
            raise ConfigError(f"{where}.criteria: a noul's criteria is a mapping with true and/or false")
        if instructions is None and not (
            isinstance(criteria, dict) and any(v is not None for v in criteria.values())
        ):
            raise ConfigError(f"{where}.instructions: a noul needs instructions or a described outcome")
    elif qtype == "choice":
        if not isinstance(criteria, dict) or not criteria:
            raise ConfigError(f"{where}.criteria: a choice needs a mapping of options")
        if len(criteria) > 255:
            raise ConfigError(f"{where}.criteria: at most 255 options (got {len(criteria)})")
    elif qtype == "score":
        if not isinstance(criteria, list) or not 2 <= len(criteria) <= 10:
            count = len(criteria) if isinstance(criteria, list) else "not a list"
            raise ConfigError(f"{where}.criteria: a score needs a list of 2 to 10 levels (got {count})")
    else:
        raise ConfigError(f"{where}.type: must be noul, choice or score (got {qtype!r})")
    return str(qtype)


def _priority(where: str, qtype: Any, criteria: Any, priority: Any) -> dict[str, float] | None:
    """A choice question's ordering map {label: number}: the typed tier's priority for it."""
    if priority is None:
        return None
    if qtype != "choice" or not isinstance(priority, dict) or not isinstance(criteria, dict):
        raise ConfigError(f"{where}.priority: only a choice question takes a priority map {{label: number}}")
    for label, number in priority.items():
        if label not in criteria:
            raise ConfigError(f"{where}.priority.{label}: not one of the choice's options")
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ConfigError(f"{where}.priority.{label}: must be a number")
    return {str(k): float(v) for k, v in priority.items()}


def _question(kind: str, qid: str, raw: Any) -> Question:
    where = f"kinds.{kind}.questions.{qid}"
    if not _QUESTION_ID.match(qid):
        raise ConfigError(f"{where}: question ids are letters, digits and _ (not starting with a digit)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping with a type")
    _refuse_unknown(where, raw, QUESTION_KEYS)
    instructions = raw.get("instructions")
    criteria = raw.get("criteria")
    qtype = _check_criteria(where, raw.get("type"), instructions, criteria)
    priority = _priority(where, qtype, criteria, raw.get("priority"))
    return Question(qid, qtype, instructions, criteria, priority)


def _session(kind: str, raw: Any) -> SessionSpec:
    where = f"kinds.{kind}.session"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping with a prompt")
    _refuse_unknown(where, raw, SESSION_KEYS)
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"{where}.prompt: required, a text with {{{{ target }}}}-style placeholders")
    for name in template_placeholders(prompt):
        if name not in PLACEHOLDERS:
            known = ", ".join(sorted(PLACEHOLDERS))
            raise ConfigError(f"{where}.prompt: unknown placeholder {{{{ {name} }}}} (known: {known})")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}.args: must be a list of strings")
    fmt = raw.get("format", "text")
    if fmt not in ("text", "json"):
        raise ConfigError(f"{where}.format: must be text or json (got {fmt!r})")
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}.model: must be a model name")
    if model is None and "--model" in args:
        index = args.index("--model")
        model = args[index + 1] if index + 1 < len(args) else None
    elif model is not None and "--model" not in args:
        args = [*args, "--model", model]
    bind = _bind(raw.get("bind", []), f"{where}.bind")
    return SessionSpec(prompt, tuple(args), fmt, model, bind)


def _bind(value: Any, where: str) -> tuple[str, ...]:
    """Extra paths a kind's confined session sees: absolute, `PATH`, `PATH:ro` or `PATH:rw`.

    Kept as written (the sandbox reads the suffix; no suffix is read-only). Checked here so
    a typo is a config error at load, not a session that cannot find its tool.
    """
    if not isinstance(value, list):
        raise ConfigError(f'{where}: must be a list of absolute paths, e.g. ["/opt/tool", "/srv/data:rw"]')
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry:
            raise ConfigError(f"{where}[{i}]: must be an absolute path, optionally ending in :ro or :rw")
        path, sep, mode = entry.rpartition(":")
        if not sep or mode not in _BIND_MODES:
            path = entry
        if not path.startswith("/") or "\0" in path:
            raise ConfigError(
                f"{where}[{i}]: {entry!r} is not an absolute path (optionally ending in :ro or :rw)"
            )
        if ":" in path:
            raise ConfigError(f"{where}[{i}]: {entry!r}: the only suffixes are :ro and :rw")
        if any(part == ".." for part in path.split("/")):
            raise ConfigError(f"{where}[{i}]: {entry!r}: no '..' in a bind path")
        out.append(entry)
    return tuple(out)


def _kind_env(value: Any, where: str) -> tuple[str, ...]:
    """The variables a kind's produce/verify commands need (`GOPATH`, `CARGO_*`).

    An exact name that is secret-shaped is refused: repository commands never receive a
    credential, and a name that would be silently withheld at every run is a config mistake.
    A glob may match secret-shaped names at run time; those are withheld there.
    """
    if not isinstance(value, list):
        raise ConfigError(f"{where}: must be a list of variable names or globs, e.g. [GOPATH, CARGO_*]")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not _ENV_PATTERN.match(entry):
            raise ConfigError(
                f"{where}[{i}]: {entry!r} is not a variable name or glob (letters, digits, _, * and ?)"
            )
        if not any(c in entry for c in "*?") and is_secret_name(entry):
            raise ConfigError(
                f"{where}[{i}]: {entry} looks like a credential; produce/verify commands never receive one"
            )
        out.append(entry)
    return tuple(out)


def _first_non_json(value: Any, where: str) -> tuple[str, Any] | None:
    """Where the first value JSON cannot spell sits (a YAML date, .nan, .inf), with the value."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_non_json(item, f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _first_non_json(item, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float) and math.isfinite(value):
        return None
    return where, value


def _refuse_non_json(raw: dict[str, Any], where: str) -> None:
    """The kind's digest (part of every content key) hashes the definition as JSON: a YAML
    date or .nan would crash that hash with a traceback instead of a config error."""
    not_json = _first_non_json(raw, where)
    if not_json is not None:
        raise ConfigError(
            f"{not_json[0]}: {type(not_json[1]).__name__} {not_json[1]!r} is not plain JSON data "
            "(text, finite number, true/false, list or mapping); quote it"
        )


def _code_tier(
    raw: dict[str, Any], where: str, base_dir: Path, import_checks: bool
) -> tuple[str | None, Any, tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """The code tier's part of a kind: a `check`, or `produce` with its `verify`."""
    check = raw.get("check")
    check_fn = None
    if check is not None:
        if not isinstance(check, str):
            raise ConfigError(f"{where}.check: must be 'module:function'")
        if import_checks:
            try:
                check_fn = import_check(check, base_dir)
            except ValueError as error:
                raise ConfigError(f"{where}.check: {error}") from None
    produce = _argv_list(raw["produce"], f"{where}.produce") if "produce" in raw else ()
    verify = _argv_list(raw["verify"], f"{where}.verify") if "verify" in raw else ()
    if bool(produce) != bool(verify):
        missing = "verify" if produce else "produce"
        raise ConfigError(
            f"{where}.{missing}: produce and verify go together (the verifier judges what was produced)"
        )
    if check is not None and produce:
        raise ConfigError(f"{where}.produce: a kind has either a check or produce/verify, not both")
    return check, check_fn, produce, verify


def _typed_tier(name: str, raw: dict[str, Any], where: str) -> tuple[dict[str, Question], Any, Any, Any]:
    """The typed tier's part of a kind: its questions, and which answers, gates and orders."""
    raw_questions = raw.get("questions", {}) or {}
    if not isinstance(raw_questions, dict):
        raise ConfigError(f"{where}.questions: must be a mapping of question id to question")
    questions = {str(qid): _question(name, str(qid), q) for qid, q in raw_questions.items()}
    answer = raw.get("answer")
    if answer is not None and answer not in questions:
        raise ConfigError(f"{where}.answer: names no question (questions: {', '.join(questions) or 'none'})")
    gate_on = raw.get("gateOn")
    if gate_on is not None:
        if not isinstance(gate_on, list) or not gate_on or not all(isinstance(q, str) for q in gate_on):
            raise ConfigError(f"{where}.gateOn: must be a non-empty list of question ids")
        for qid in gate_on:
            if qid not in questions:
                raise ConfigError(f"{where}.gateOn: {qid!r} names no question")
    order = raw.get("order")
    if order is not None:
        question = questions.get(order)
        if question is None:
            raise ConfigError(f"{where}.order: {order!r} names no question")
        if question.type == "noul" or (question.type == "choice" and not question.priority):
            raise ConfigError(
                f"{where}.order: must name a score question, or a choice question with a priority map"
            )
    if questions and answer is None and order is None:
        raise ConfigError(
            f"{where}.answer: required when questions are given (which question answers the judgement?)"
        )
    return questions, answer, gate_on, order


def load_kind(name: str, raw: Any, base_dir: Path, *, import_checks: bool = True) -> Kind:
    where = f"kinds.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: kind names are letters, digits, '.', '_' and '-'")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping")
    _refuse_unknown(where, raw, KIND_KEYS)
    _refuse_non_json(raw, where)
    effect = raw.get("effect", "local")
    if effect not in ("local", "external"):
        raise ConfigError(f"{where}.effect: must be local or external (got {effect!r})")
    check, check_fn, produce, verify = _code_tier(raw, where, base_dir, import_checks)
    questions, answer, gate_on, order = _typed_tier(name, raw, where)
    session = _session(name, raw["session"]) if raw.get("session") is not None else None
    env = _kind_env(raw.get("env", []), f"{where}.env")
    escalate = raw.get("escalate", "session" if session else NEEDS_TRIAGE)
    if escalate not in ("session", NEEDS_TRIAGE):
        raise ConfigError(f"{where}.escalate: must be session or needs-triage (got {escalate!r})")
    if escalate == "session" and session is None:
        raise ConfigError(f"{where}.escalate: 'session' needs a session block with a prompt")
    kind = Kind(
        name=name,
        effect=effect,
        check=check,
        check_fn=check_fn,
        produce=produce,
        verify=verify,
        questions=questions,
        answer=answer,
        gate_on=tuple(gate_on or ()),
        order=order,
        escalate=escalate,
        session=session,
        env=env,
        digest=sha256_hex(canonical_json(raw)),
    )
    if not any(row.serves(kind) for row in tiers.TABLE):
        raise ConfigError(f"{where}: declares no tier (give a check, produce/verify, questions or a session)")
    return kind


def _yaml_error(path: Path, error: YAMLError) -> ConfigError:
    if isinstance(error, MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return ConfigError(f"{path}:{mark.line + 1}:{mark.column + 1}: {error.problem}")
    return ConfigError(f"{path}: {error}")


def parse_config(
    data: Any,
    path: Path | None = None,
    *,
    builtin: Mapping[str, Kind] | None = None,
    import_checks: bool = True,
) -> Config:
    """Validate an already-parsed config document.

    `builtin` are the kinds dispatchq defines in code (the decision gate's, passed in by
    `dispatchq.process.wiring`): found by name, never listed, and their names are reserved.
    """
    base_dir = (path.parent if path else Path.cwd()).resolve()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: the top level must be a mapping with `kinds`")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown top-level key (allowed: kinds, triage)")
    raw_kinds = data.get("kinds") or {}
    if not isinstance(raw_kinds, dict):
        raise ConfigError("kinds: must be a mapping of kind name to definition")
    builtin = dict(builtin or {})
    for name in raw_kinds:
        if str(name) in builtin:
            raise ConfigError(
                f"kinds.{name}: the name is reserved for dispatchq's built-in decision-gate kind; "
                "choose another name"
            )
    kinds = Kinds(
        {
            str(name): load_kind(str(name), raw, base_dir, import_checks=import_checks)
            for name, raw in raw_kinds.items()
        },
        builtin,
    )
    triage = None
    if data.get("triage") is not None:
        # The rules engine's loader (and its CEL parser) only for a config that has rules.
        from dispatchq.triage.rules import load_triage  # noqa: PLC0415 (lazy: the CEL parser)

        triage = load_triage(data["triage"], base_dir)
    return Config(kinds=kinds, triage=triage, path=path, base_dir=base_dir)


def _plain(value: Any) -> Any:
    """ruamel's commented containers -> plain dicts and lists (for hashing and JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def load_config(
    path: Path,
    *,
    builtin: Mapping[str, Kind] | None = None,
    import_checks: bool = True,
    required: bool = True,
) -> Config:
    """Read and validate the config file; a missing optional file is an empty config."""
    if not path.exists():
        if required:
            raise ConfigError(f"{path}: config file not found (set DISPATCHQ_CONFIG or create it)")
        return Config(kinds=Kinds({}, builtin), path=None)
    yaml = YAML(typ="safe", pure=True)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"))
    except YAMLError as error:
        raise _yaml_error(path, error) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None
    config = parse_config(_plain(data), path.resolve(), builtin=builtin, import_checks=import_checks)
    _warn_unlisted_repositories(config)
    return config


def config_source(path: Path) -> str:
    """The line a role logs at start: which config file it loaded, or that there was none."""
    if path.is_file():
        return f"config: loaded {path.resolve()}"
    return f"config: none loaded (no file at {path}; set DISPATCHQ_CONFIG to name one)"


def _warn_unlisted_repositories(config: Config) -> None:
    """A `github` executor without `triage.repositories` writes wherever a signed delivery says."""
    triage = config.triage
    if triage is None or getattr(triage, "executor", None) != "github":
        return
    if getattr(triage, "repositories", None) is None and str(config.path) not in _WARNED:
        _WARNED.add(str(config.path))
        _log.warning(
            "%s: triage.repositories is not set: the github executor acts on any repository a "
            "delivery names; list the repositories (owner/name) it may write to",
            config.path,
        )
