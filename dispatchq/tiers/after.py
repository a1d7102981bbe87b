"""A kind's after-session hooks, run once per answer whichever path writes it.

A session's answer reaches the record on one of two paths: the live run's own write, or, when
Redis was away at that moment, the replay of the host's spool (`tiers.lease.replay_spool`).
Both run the kind's `after_session` hook (a fixer's hook grades what the session changed in
the tree: skipping it on one path loses that grade), and only one of them may: the answer is
written with its hooks marked due under the answering claim, in the same script, and a path
runs the hooks only after taking that mark (`dispatchq.storage.replays`). So a replay after
the live run ran them, or a second replay of the same entry, runs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dispatchq.backends import DEFAULT_BACKEND, backend_for
from dispatchq.core.judgement import FINISHED
from dispatchq.launcher.spawn import LaunchResult
from dispatchq.storage.replays import Replays
from dispatchq.tiers.confine import forget
from dispatchq.tiers.hooks import NO_HOOKS

if TYPE_CHECKING:
    from dispatchq.core.judgement import Record
    from dispatchq.runtime import Runtime
    from dispatchq.storage.spool import SpoolEntry
    from dispatchq.tiers.hooks import SessionHooks
    from dispatchq.window.face import Window
    from dispatchq.window.limits import SessionOutcome

__all__ = ["answer_hooks", "replayed_hooks", "spooled_result"]

log = logging.getLogger("dispatchq.session")


def answer_hooks(
    runtime: Runtime,
    hooks: SessionHooks,
    window: Window,
    record: Record,
    outcome: SessionOutcome,
    result: Any,
    claim: str,
) -> bool:
    """Run the after-session hooks of the answer `claim` wrote, if no other path took them; True when run."""
    if not Replays(window.records.redis).take_hooks(record.id, claim):
        return False
    hooks.after_session(runtime, record, outcome, result)
    return True


def spooled_result(entry: SpoolEntry) -> LaunchResult:
    """The spawn's result as the spool kept it (its output, its exit, whether it timed out)."""
    body = entry.body
    code = body.get("returncode")
    return LaunchResult(
        argv=(),
        returncode=code if isinstance(code, int) else None,
        stdout=str(body.get("stdout") or ""),
        stderr=str(body.get("stderr") or ""),
        session_id=str(body.get("session_id") or "") or None,
        timed_out=bool(body.get("timed_out")),
    )


def replayed_hooks(
    runtime: Runtime | None,
    hooks: Mapping[str, SessionHooks] | None,
    window: Window,
    record: Record,
    entry: SpoolEntry,
    *,
    answered: bool,
) -> bool:
    """A replayed outcome's after-session hooks, as the live run would have run them; True when run.

    `answered`: the entry is an answer (its hooks are taken under its claim, once); else a
    limit the replay just put back under its claim (that requeue happens once, so the hooks do).
    Without a runtime (a caller that only applies outcomes) nothing runs and an answer's hooks
    stay due for a replay that has one.
    """
    if runtime is None:
        return False
    kind_hooks = (hooks or {}).get(record.kind, NO_HOOKS)
    result = spooled_result(entry)
    now = datetime.fromisoformat(str(entry.body.get("now"))) if entry.body.get("now") else datetime.now(UTC)
    settings = window.settings
    outcome = backend_for(str(entry.body.get("backend") or DEFAULT_BACKEND)).read_outcome(
        result.stdout,
        now=now,
        default_tz=settings.timezone,
        unknown_reset=settings.unknown_reset_probe,
        returncode=result.returncode,
        stderr=result.stderr,
    )
    token = str(entry.body.get("token") or entry.claim)
    if answered:
        ran = answer_hooks(runtime, kind_hooks, window, record, outcome, result, token)
    else:
        kind_hooks.after_session(runtime, record, outcome, result)
        ran = True
    if ran:
        log.warning(
            "session judgement %s: the after-session hooks of its replayed %s ran", record.id, entry.kind
        )
        if window.records.statuses([record.id])[0] in FINISHED:
            forget(settings, record.id)  # its transcripts and scratch folder end with it, as live
    return ran
