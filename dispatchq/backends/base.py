"""What the session tier asks of the CLI it runs: the `SessionBackend` seam.

The session tier decides *when* a judgement's session runs, on which slot and under which
window; it never needs to know which command-line agent it is. Everything that depends on
that CLI sits behind this one protocol, as the typed tier's `Provider` hides its SDK:

- **argv**: the command split into words, a kind's extra arguments, and how a cut-off
  session is resumed (`resume`: the session id the CLI printed);
- **environment**: what the session starts with: the environment allowlist, its one
  credential under the variable it was chosen with, and the CLI's own per-judgement config
  folder (`config_var`), where its transcripts live; `config_files`: what the tier writes into
  that folder first (a credential that is a file, a setting only a config file takes);
- **egress**: where a confined session's only proxy may lead (the CLI's API host);
- **the output readers**: one run's outcome from what it printed (`read_outcome`: answer,
  limit, throttle, error, host failure, with the usage it reported, filled into
  `SessionOutcome.usage`), what the run cost (`cost`: reported, or its tokens priced), what
  one live stream event says about the window
  (`window_state`, for a probe), and which windows entered the share kept for people
  (`reserve_signals`);
- **the release check**: the installed CLI's version against the range dispatchq tests;
- two facts a pool of credentials routes by: which variables the CLI reads as a credential
  (`credential_vars`: every one of them but the chosen is withheld from a session), and
  whether a transcript cut off under one credential resumes under another
  (`resumes_across_credentials`).

A backend is a module under `dispatchq/backends/` and a row of the registry in its
`__init__`; the tier obtains one with `backend_for(name)`. Every backend returns the same
`SessionOutcome`, `LimitSignal` and window states, so the window, the markers, the spool and
the accounting stay the same whatever CLI ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dispatchq.window.limits import LimitSignal, SessionOutcome, WindowState

__all__ = ["Destination", "ReleaseCheck", "SessionBackend"]

#: A `(host, port)` a confined session's proxy may connect to.
Destination = tuple[str, int]


@dataclass(frozen=True)
class ReleaseCheck:
    """What a worker's start learned of the installed CLI: its release, and whether it is tested.

    `problem` is the WARNING line (outside the range, or the version could not be read), or
    None when all is well.
    """

    backend: str
    executable: str
    version: str | None
    supported: bool
    supported_range: str
    problem: str | None


@runtime_checkable
class SessionBackend(Protocol):
    """One command-line agent as the session tier sees it (see the module docstring)."""

    @property
    def name(self) -> str:
        """The registry's name for it, as a credential's `backend:` names it."""
        ...

    @property
    def config_var(self) -> str:
        """The variable that points the CLI at its per-judgement config folder."""
        ...

    @property
    def credential_vars(self) -> frozenset[str]:
        """Every variable the CLI reads a credential from (only the chosen one reaches a session)."""
        ...

    @property
    def resumes_across_credentials(self) -> bool:
        """Does a session cut off under one credential resume under another one?"""
        ...

    def argv(self, command: str, extra_args: Sequence[str] = (), resume: str | None = None) -> list[str]:
        """The session's argv: `command` split as a shell would, `extra_args`, then resuming `resume`."""
        ...

    def environment(
        self,
        parent_environ: Mapping[str, str],
        *,
        deny: Iterable[str],
        allow: Iterable[str],
        credential_var: str,
        credential_value: str | None,
        scrub_subprocesses: bool,
        config_dir: Path,
    ) -> dict[str, str]:
        """The session's environment: the allowlist, its one credential, its config folder."""
        ...

    def config_files(
        self, session_env: Mapping[str, str], credential_var: str, credential_value: str | None
    ) -> dict[str, str]:
        """Files the CLI reads from its config folder, written there (0600) before the session starts.

        A credential that is a file rather than a variable (a login's `auth.json`) goes here and
        never into the environment; so does a setting the CLI takes only from its config file.
        """
        ...

    def renewed_login(self, config_dir: Path, given: str | None) -> str | None:
        """The login as the session left it in its config folder when the CLI renewed it there
        (a refreshed token rewritten into its `auth.json`), else None: what the tier carries
        back to the credential's file, since a renewal may retire the token that file holds."""
        ...

    def egress(self, session_env: Mapping[str, str], extra: Iterable[str] = ()) -> frozenset[Destination]:
        """Where a confined session may connect: the API host `session_env` names, plus `extra`.

        Raises ValueError naming an `extra` entry that is not `host:port`.
        """
        ...

    def read_outcome(
        self,
        stdout: str,
        *,
        now: datetime,
        default_tz: str | tzinfo,
        unknown_reset: float,
        returncode: int | None = None,
        stderr: str = "",
    ) -> SessionOutcome:
        """What one run amounted to, from its whole output (pure: `now` and defaults passed in)."""
        ...

    def refine_limits(
        self,
        outcome: SessionOutcome,
        *,
        command: str,
        session_env: Mapping[str, str],
        cwd: Path,
        now: datetime,
        unknown_reset: float,
    ) -> SessionOutcome:
        """A limit the run stated, with what a machine-readable source says in its place (the
        CLI asked once more, with the session's environment); the outcome as it is otherwise."""
        ...

    def cost(self, outcome: SessionOutcome, *, model: str | None, prices: str) -> float | None:
        """What the run cost in USD: what the CLI reported, else its tokens priced for `model`
        with the operator's table `prices` (`DISPATCHQ_CODEX_PRICES`); None when unknown."""
        ...

    def window_state(self, event: Mapping[str, Any]) -> WindowState | None:
        """What one live stream event says about the window (None: no evidence either way)."""
        ...

    def reserve_signals(
        self, events: Sequence[Mapping[str, Any]], *, reserve: float, now: datetime
    ) -> list[tuple[LimitSignal, float]]:
        """The windows whose reported use entered the share kept for people, with that use."""
        ...

    def check_release(self, command: str, environ: Mapping[str, str]) -> ReleaseCheck | None:
        """The installed CLI against the tested range, warning once per process when outside.

        None when `command` does not run this backend's CLI (a stand-in, a wrapper).
        """
        ...
