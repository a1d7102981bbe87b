"""What one session spawn sees: its folders, its environment, and the sandbox around it.

The session tier decides *when* a judgement's session runs; this module decides what that
session is given, in one place, so the promise "a session gets its one credential and
nothing else" can be read off one page:

- a per-judgement folder under `Settings.sessions_dir` (beside the data dir, never in it)
  holding its scratch working directory (when the judgement names no checkout) and the CLI's
  own config folder (`CLAUDE_CONFIG_DIR`), kept until the judgement ends so `--resume` finds
  its transcript, and removed then (`forget`): no session reads another's transcripts;
- the environment (`dispatchq.launcher.environment.session_environment`: an allowlist plus
  the one credential);
- with `DISPATCHQ_SESSION_SANDBOX=on`, the bubblewrap plan (`dispatchq.launcher.sandbox`)
  with the deployment's and the kind's extra binds, the secrets to keep hidden even under a
  bound folder, and the egress allow-list (the session's `dispatchq.backends` backend).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dispatchq.core.judgement import FINISHED
from dispatchq.errors import SettingsError
from dispatchq.launcher.environment import CA_BUNDLE_NAMES, read_secret
from dispatchq.launcher.sandbox import BWRAP_HINT, Bind, SandboxPlan, parse_bind, sandbox_problem

if TYPE_CHECKING:
    from dispatchq.backends.base import SessionBackend
    from dispatchq.core.kinds import Kind
    from dispatchq.pools.credentials import Credential
    from dispatchq.settings import Settings

__all__ = [
    "CREDENTIAL_HINT",
    "Confinement",
    "config_dir",
    "confinement",
    "credential_or_empty",
    "credential_problem",
    "forget",
    "judgement_dir",
    "pool_credential_problem",
    "read_pool_credential",
    "sandbox_refusal",
    "secret_paths",
    "spawn_refusal",
    "sweep",
    "trust_bundles",
    "work_dir",
    "write_config_files",
]

CREDENTIAL_HINT = (
    "sessions authenticate only with their credential variable: run `claude setup-token` and put "
    "the token in a file named by {var}_FILE (or set {var})"
)


def judgement_dir(settings: Settings, jid: str) -> Path:
    """`<sessions_dir>/<jid>`, created 0700 (with its parent) when missing."""
    root = settings.sessions_dir
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = root / jid
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def work_dir(settings: Settings, jid: str) -> Path:
    """A stable, empty working directory per judgement, so `--resume` finds its session."""
    path = judgement_dir(settings, jid) / "work"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def config_dir(settings: Settings, jid: str) -> Path:
    """The CLI's own config folder for this judgement (transcripts, `.claude.json`)."""
    path = judgement_dir(settings, jid) / "config"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_config_files(config: Path, files: Mapping[str, str]) -> None:
    """The backend's `config_files` into the session's config folder, each 0600 and replaced whole.

    A name is one plain file name: a backend never writes outside its folder.
    """
    for name, text in files.items():
        if not name or name != os.path.basename(name) or name in (".", ".."):
            raise ValueError(f"config file name {name!r} is not a plain file name")
        target = config / name
        partial = config / f".{name}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(partial, target)


def forget(settings: Settings, jid: str) -> None:
    """The judgement ended: its scratch folder and its transcripts go."""
    shutil.rmtree(settings.sessions_dir / jid, ignore_errors=True)


def sweep(settings: Settings, statuses: Callable[[list[str]], list[str | None]]) -> int:
    """Remove the folders of judgements that ended elsewhere (cancelled, pruned, failed by
    another path); `statuses` is the record store's. Returns how many went."""
    root = settings.sessions_dir
    try:
        names = sorted(entry.name for entry in root.iterdir() if entry.is_dir())
    except OSError:
        return 0
    gone = 0
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        for jid, status in zip(chunk, statuses(chunk), strict=True):
            if status is None or status in FINISHED:
                forget(settings, jid)
                gone += 1
    return gone


def secret_paths(
    settings: Settings, environ: Mapping[str, str], credential_files: Sequence[str] = ()
) -> tuple[str, ...]:
    """What must stay hidden even where it lies under a folder a session sees.

    The data dir (the store's socket, its password, the append-only file), every file a
    `*_FILE` variable names (the TypeSafe key, the GitHub token, the session credential's own
    file: the credential reaches the session as a value, never as a readable file), every
    pool credential's file (`credential_files`: the chosen one's too) and `/etc/dispatchq`.
    """
    found = [str(settings.data_dir.expanduser().resolve()), "/etc/dispatchq"]
    found += [os.path.realpath(path) for path in credential_files]
    trust = trust_bundles(environ)
    for name, value in environ.items():
        if name.upper().endswith("_FILE") and value.startswith("/"):
            path = os.path.realpath(value)
            if path not in trust:
                found.append(path)
    return tuple(dict.fromkeys(found))


def trust_bundles(environ: Mapping[str, str]) -> frozenset[str]:
    """The CA bundles the session's TLS clients are told to trust (`SSL_CERT_FILE`, ...): public
    certificates, never a secret, although `SSL_CERT_FILE` ends in `_FILE` like one.

    The session is given these variables (`CA_BUNDLE_NAMES`), so the files must stay readable:
    Codex reads `SSL_CERT_FILE` to set up TLS, even for its WebSocket to a plain-http base, and
    a bundle masked as `/dev/null` fails every connection it makes (0.169.0 and 0.171.0:
    "Failed to read CA certificate file ... Permission denied", then five reconnects).
    """
    return frozenset(
        os.path.realpath(value)
        for name, value in environ.items()
        if name in CA_BUNDLE_NAMES and value.startswith("/")
    )


def credential_problem(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why the session's credential cannot be read now (one line with the fix), or None.

    Read again before every spawn, not only at start: a `<VAR>_FILE` deleted (or emptied, or
    made unreadable) while the worker runs is a host-wide failure. The host breaker then
    blocks the host with this reason and the judgement waits uncharged, instead of the spawn
    preparation raising inside the RQ job (counted as a worker death, then a failure).
    """
    var = settings.session_credential_var
    try:
        found = read_secret(var, environ)
    except SettingsError as error:
        return f"session credential unreadable: {error}: {CREDENTIAL_HINT.format(var=var)}"
    if found is None:
        return f"{var} is not set: {CREDENTIAL_HINT.format(var=var)}"
    return None


def credential_or_empty(settings: Settings, environ: Mapping[str, str]) -> str:
    """The session credential, or "" when it cannot be read (for the host block's fingerprint)."""
    try:
        return read_secret(settings.session_credential_var, environ) or ""
    except SettingsError:
        return ""


def spawn_refusal(
    settings: Settings, environ: Mapping[str, str], credential: Credential | None = None
) -> str | None:
    """Why no session may be spawned on this host right now (credential, then sandbox), or None.

    `credential`: a pool credential read from its file (None or the environment's `default`:
    the variable, as always)."""
    if credential is not None and credential.file is not None:
        problem = pool_credential_problem(credential)
    else:
        problem = credential_problem(settings, environ)
    return problem or sandbox_refusal(settings, environ)


def read_pool_credential(credential: Credential) -> str:
    """A pool credential's secret from its file, stripped; `SettingsError` naming it when unreadable."""
    assert credential.file is not None
    try:
        content = Path(credential.file).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise SettingsError(
            f"credential {credential.name}: file {credential.file!r} does not exist"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(
            f"credential {credential.name}: cannot read {credential.file!r} ({reason})"
        ) from None
    if not content:
        raise SettingsError(f"credential {credential.name}: file {credential.file!r} is empty")
    return content


def pool_credential_problem(credential: Credential) -> str | None:
    """Why a pool credential cannot be read now (one line naming it), or None."""
    try:
        read_pool_credential(credential)
    except SettingsError as error:
        return str(error)
    return None


def sandbox_refusal(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why no confined session can start on this host (for the host breaker), or None."""
    if settings.session_sandbox != "on":
        return None
    problem = sandbox_problem(environ.get("PATH", os.defpath))
    return None if problem is None else f"{problem}: {BWRAP_HINT}"


@dataclass(frozen=True)
class Confinement:
    """The plan for one spawn (None: unconfined) and where its proxy may lead."""

    plan: SandboxPlan | None
    egress: frozenset[tuple[str, int]]


def _binds(settings: Settings, kind: Kind) -> tuple[Bind, ...]:
    binds = [parse_bind(item, "DISPATCHQ_SESSION_SANDBOX_BIND") for item in settings.session_sandbox_bind]
    extra = getattr(kind.session, "bind", ()) if kind.session is not None else ()
    binds += [parse_bind(item, f"kinds.{kind.name}.session.bind") for item in extra]
    return tuple(binds)


def confinement(
    settings: Settings,
    kind: Kind,
    environ: Mapping[str, str],
    env: Mapping[str, str],
    workdir: Path,
    config: Path,
    credential_files: Sequence[str] = (),
    *,
    backend: SessionBackend,
) -> Confinement:
    """The sandbox for a spawn in `workdir` with `env` (the session's own environment).

    `backend` says where its CLI's API lies (the egress allow-list) and what the config
    folder's variable is called inside.
    """
    try:
        egress = backend.egress(env, settings.session_egress)
    except ValueError as error:
        raise SettingsError(f"DISPATCHQ_SESSION_EGRESS: {error}") from None
    if settings.session_sandbox != "on":
        return Confinement(None, egress)
    bwrap = shutil.which("bwrap", path=environ.get("PATH", os.defpath)) or "bwrap"
    plan = SandboxPlan(
        bwrap=bwrap,
        workdir=workdir,
        config_dir=config,
        binds=_binds(settings, kind),
        hide=secret_paths(settings, environ, credential_files),
        config_var=backend.config_var,
    )
    return Confinement(plan, egress)
