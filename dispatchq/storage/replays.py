"""What a session's answer leaves to be done once, and how long a lost holder's spool is waited for.

- **Hooks due**: a session answer is written with `hooks_due` = the answering claim on the
  record, in the same script as the answer (`HOOKS_DUE` beside `settled_by`). Whoever runs
  the kind's after-session hooks for that answer takes the field first (`take_hooks`: one
  script, only while it still names that claim): the live run or the replay of its spool,
  never both, and a replay repeated after a crash finds it taken. A hook is therefore run at
  most once per answer; one cut off by a crash mid-hook is not run again (as on the live
  path, where a worker killed mid-hook leaves it unrun too).
- **Replay wait**: beside its lease, a holder renews a key that lives the spool wait longer
  (`hold_for_replay`). A judgement whose holder on another host lost contact is taken over
  only once that key is gone too (`waiting_for_replay`), so a host that comes back in time
  applies the answer it spooled instead of another host paying for the session again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatchq.core.text import as_text
from dispatchq.storage import keys

if TYPE_CHECKING:
    import redis

__all__ = ["HOOKS_DUE", "Replays"]

#: The record field naming the claim whose answer's after-session hooks have not run yet.
HOOKS_DUE = "hooks_due"

# KEYS: record. ARGV: the answering claim. 1: taken (the caller runs the hooks), 0: not due.
_TAKE_HOOKS = """
if redis.call('HGET', KEYS[1], '$FIELD') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], '$FIELD')
return 1
""".replace("$FIELD", HOOKS_DUE)


class Replays:
    """The hooks-due field and the replay wait, on one client (the holder's bounded one)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._take_hooks = client.register_script(_TAKE_HOOKS)

    def take_hooks(self, jid: str, claim: str) -> bool:
        """Take the after-session hooks of `claim`'s answer: True once, for one caller only."""
        return bool(self._take_hooks(keys=[keys.record(jid)], args=[claim]))

    def hold_for_replay(self, jid: str, claim: str, seconds: float) -> None:
        """Keep the judgement for `claim`'s own replay for `seconds` (its lease plus the wait)."""
        self.redis.set(keys.replay_wait(jid), claim, px=max(1, int(seconds * 1000)))

    def waiting_for_replay(self, jid: str, claim: str) -> bool:
        """Is the judgement still kept for the replay of the holder that wrote `claim`?"""
        return as_text(self.redis.get(keys.replay_wait(jid))) == claim
