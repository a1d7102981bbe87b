"""What stops sessions before any judgement is asked: a blocked host, a refused credential.

A host-wide failure (no executable, no sandbox, no network, the environment's credential
refused) blocks the *host*: every session there would fail the same way, so it costs one spawn
per host until it clears (a changed command or credential, the periodic probe, an operator).
A pool credential that is refused blocks the *credential*, on every host: the others answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dispatchq.launcher.spawn import build_argv
from dispatchq.storage.store import Store
from dispatchq.tiers.confine import credential_or_empty
from dispatchq.tiers.lease import requeue_front

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.settings import Settings
    from dispatchq.window.face import Window

__all__ = [
    "block_credential",
    "block_host",
    "held",
    "host_fingerprint",
    "lines_for",
    "recheck_blocked",
    "unblock_host",
]

log = logging.getLogger("dispatchq.session")


def lines_for(host: str) -> list[str]:
    """The lines this host serves: its own (judgements bound to its checkouts), then the shared one."""
    return [Store.line_of(host), Store.line_of()]


def held(window: Window, host: str) -> list[Record]:
    """Every judgement waiting in this host's lines."""
    ids: list[str] = []
    for line in lines_for(host):
        ids += window.records.line_ids(line)
    return [r for r in window.records.get_many(ids) if r is not None]


def host_fingerprint(settings: Settings, environ: Mapping[str, str]) -> str:
    """What a host block was set under: the command, where it resolves, the credential (hashed).

    A block clears by itself when any of these changes: the executable got installed, the
    session command was changed, a new token (or token file) was put in place. Only a digest
    is stored; the credential itself never leaves this process.
    """
    argv = build_argv(settings.session_command)
    resolved = shutil.which(argv[0], path=environ.get("PATH")) or ""
    var = settings.session_credential_var
    secret = credential_or_empty(settings, environ)  # a deleted *_FILE still fingerprints
    file_name = environ.get(f"{var}_FILE") or ""
    stamp = ""
    if file_name:
        with contextlib.suppress(OSError):
            stamp = repr(os.stat(file_name).st_mtime_ns)
    parts = [
        settings.session_command,
        resolved,
        settings.session_sandbox,
        shutil.which("bwrap", path=environ.get("PATH")) or "",
        var,
        hashlib.sha256(secret.encode()).hexdigest(),
        file_name,
        stamp,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def unblock_host(window: Window, host: str) -> bool:
    """Clear a host's block and release the judgements it held; True if it was blocked."""
    was = window.store.unblock(host)
    for record in held(window, host):
        if record.status == "waiting" and not (record.reason or "").startswith("usage window"):
            window.records.transition(record.id, "queued", expect=["waiting"], delete=["reason"])
    return was


def recheck_blocked(window: Window, settings: Settings, environ: Mapping[str, str]) -> None:
    """A blocked host's setting may have changed since (executable installed, new credential)."""
    host = settings.host
    if not window.store.blocked_reason(host):
        return
    stored = window.store.blocked_fingerprint(host)
    if stored:
        if stored != host_fingerprint(settings, environ):
            unblock_host(window, host)
        return
    argv = build_argv(settings.session_command)  # a block set before fingerprints were kept
    if shutil.which(argv[0], path=environ.get("PATH")):
        unblock_host(window, host)


def block_host(
    window: Window, record: Record, reason: str, fingerprint: str, *, claim: str | None = None
) -> None:
    """A host-wide failure: block the host, this judgement back to the front uncharged, hold the rest.

    Costs at most one spawn per host until an operator (`dispatchq window open --host`), a
    changed command or credential, or the periodic probe clears it. `claim`: the holder's
    token, which fences the put-back of this judgement (not the others it holds).
    """
    settings = window.settings
    why = reason  # what the judgement, `run` and `status` show (`sessions.blocked` names the host)
    window.store.block(
        settings.host, reason, fingerprint=fingerprint, probe_after=settings.host_probe_interval
    )
    requeue_front(
        window,
        record,
        why,
        status="waiting",
        trail_why=f"host-wide failure (no cost): {reason}",
        wclass="host_blocked",
        claim=claim,
    )
    for other in held(window, settings.host):
        if other.status == "queued":
            window.records.transition(
                other.id, "waiting", expect=["queued"], fields={"reason": why, "wclass": "host_blocked"}
            )
    log.warning("sessions blocked on host %s: %s", settings.host, reason)


def block_credential(
    window: Window, record: Record, credential: str, reason: str, *, claim: str | None
) -> None:
    """A pool credential was refused (revoked, expired, out of credit): blocked everywhere, not
    the host; the judgement goes back to the front uncharged, for another credential.

    Cleared by `dispatchq window open --credential NAME` (after the operator fixed it).
    """
    window.store.pool.block(credential, reason[:300])
    why = f"credential {credential} refused: {reason[:200]}"
    requeue_front(window, record, why, trail_why=f"credential refused (no cost): {reason[:200]}", claim=claim)
    log.warning("credential %s blocked on every host: %s", credential, reason)
