"""Reading the YAML config: which file, the YAML 1.2 parse, and the `Config` the code reads.

Everything is validated when the file is loaded, never in a worker: the document is
checked against `dispatchq.config.model.ConfigFile` (unknown keys, types, a check that
does not import, an `answer` naming no question, an unknown prompt placeholder), and
every mistake is one line naming its full path (`kinds.k.session.prompt: field required`).

The file is read with a YAML 1.2 loader (ruamel.yaml), so `on`, `yes` and `no` stay
strings instead of turning into booleans as they do in YAML 1.1.

Which file is read is the settings' choice (`DISPATCHQ_CONFIG`, else a config folder),
never the working directory's: a checkout's own `dispatchq.yaml` names checks to import.
A long-running role says in one line which file it loaded (`config_source`, logged once
Redis answers, so a refusal at start stays one line), and loading warns when a `github`
executor has no `triage.repositories` allowlist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from dispatchq.config.messages import problems_of
from dispatchq.config.model import ConfigFile, CredentialName, CredentialSection, credentials_pool
from dispatchq.core.judgement import canonical_json, sha256_hex
from dispatchq.core.kinds import Kind, Kinds
from dispatchq.errors import ConfigError
from dispatchq.pools.credentials import Pool

__all__ = [
    "Config",
    "config_error",
    "config_source",
    "kind_digest",
    "load_config",
    "load_pool",
    "parse_config",
    "read_document",
]

_log = logging.getLogger("dispatchq.config")
#: Config paths this process already warned about (once each, not on every reload).
_WARNED: set[str] = set()


#: Keys of a kind that order its work and never change an answer: left out of its digest,
#: so editing them re-judges nothing (`session.cost_estimate` inside the session block).
_SCHEDULING_KEYS = ("priority",)
_SESSION_SCHEDULING_KEYS = ("cost_estimate",)


@dataclass(frozen=True)
class Config:
    kinds: dict[str, Kind]
    triage: Any = None  # the rules engine's own config object, when a `triage` section exists
    path: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    # The `credentials:` section as the pool (file paths absolute); None when the file has
    # none, and the environment's one credential is the pool (`Pool.of_one`).
    credentials: Pool | None = None

    def kind(self, name: str) -> Kind:
        try:
            return self.kinds[name]
        except KeyError:
            known = ", ".join(sorted(self.kinds)) or "none"
            raise ConfigError(f"unknown kind {name!r} (known: {known})") from None


def config_error(lines: list[str]) -> ConfigError:
    """One error carrying every mistake, one line each (`problems`)."""
    return ConfigError("\n".join(lines))


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
    context = {"base_dir": base_dir, "import_checks": import_checks, "builtin": builtin or {}}
    try:
        document = ConfigFile.model_validate(data, context=context)
    except ValidationError as error:
        raise config_error(problems_of(error, ConfigFile)) from None
    raw_kinds = data.get("kinds") or {}
    kinds = Kinds(
        {
            str(name): section.kind(str(name), kind_digest(raw_kinds[name]))
            for name, section in (document.kinds or {}).items()
        },
        builtin,
    )
    triage = document.triage.engine if document.triage is not None else None
    credentials = credentials_pool(document.credentials)
    return Config(kinds=kinds, triage=triage, path=path, base_dir=base_dir, credentials=credentials)


def kind_digest(raw: Mapping[str, Any]) -> str:
    """The hash of a kind's definition as written, without the keys that only schedule it."""
    kept = {k: v for k, v in raw.items() if k not in _SCHEDULING_KEYS}
    session = kept.get("session")
    if isinstance(session, dict):
        kept["session"] = {k: v for k, v in session.items() if k not in _SESSION_SCHEDULING_KEYS}
    return sha256_hex(canonical_json(kept))


def _plain(value: Any) -> Any:
    """ruamel's commented containers -> plain dicts and lists (for hashing and JSON)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def read_document(path: Path) -> Any:
    """The file's YAML as plain data; a syntax error is one line with its line and column."""
    yaml = YAML(typ="safe", pure=True)
    try:
        return _plain(yaml.load(path.read_text(encoding="utf-8")))
    except YAMLError as error:
        if isinstance(error, MarkedYAMLError) and error.problem_mark is not None:
            mark = error.problem_mark
            raise ConfigError(f"{path}:{mark.line + 1}:{mark.column + 1}: {error.problem}") from None
        raise ConfigError(f"{path}: {error}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from None


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
    config = parse_config(read_document(path), path.resolve(), builtin=builtin, import_checks=import_checks)
    _warn_unlisted_repositories(config)
    return config


def load_pool(path: Path) -> Pool | None:
    """Only the file's `credentials:` section, as a pool (None: no file or no section).

    For what needs the pool but not the kinds (`status`, `/metrics`, the page): the kinds'
    validation imports their checks and the built-in kinds' modules, which a status read must
    not pay for. Each credential is checked as `load_config` checks it, except `serves.kinds`
    (which kinds exist is the kinds' business; a worker loads the whole file).
    """
    if not path.exists():
        return None
    data = read_document(path)
    sections = data.get("credentials") if isinstance(data, Mapping) else None
    if not sections:
        return None
    adapter: TypeAdapter[dict[str, CredentialSection]] = TypeAdapter(dict[CredentialName, CredentialSection])
    try:
        parsed = adapter.validate_python(sections, context={"base_dir": str(path.resolve().parent)})
    except ValidationError as error:
        lines = []
        for item in error.errors():
            where = ".".join(str(part) for part in ("credentials", *item["loc"]))
            lines.append(f"{path}: {where}: {item['msg']}")
        raise config_error(lines) from None
    return credentials_pool(parsed)


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
