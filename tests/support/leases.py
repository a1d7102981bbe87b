"""The scripted fake `claude` and its plan and spawn count, shared by the lease tests and their fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchq.storage import keys
from dispatchq.storage.store import NewRecord

if TYPE_CHECKING:
    from dispatchq.storage.store import Store

__all__ = ["FAKE_CLAUDE", "SPOOL_WAIT", "WAIT_LEASE", "claimed", "in_line", "plan", "spawns"]


# --- a session judgement put in its line, and claimed as admission claims it ----------------------
def in_line(store: Store, jid: str, *, host: str = "", line: str | None = None) -> str:
    """A session judgement `jid` waiting in its line (the shared one, or `host`'s); its member."""
    line = line or keys.session_line(host or None)
    fields = {
        "id": jid,
        "content_key": f"ck-{jid}",
        "force": "0",
        "line": line,
        "input": json.dumps({"kind": "ask", "target": jid}),
        "tier": "session",
        "effect": "local",
        "host": host,
    }
    store.create_many([NewRecord(**{n: fields.get(n, "") for n in NewRecord._fields})])
    [member] = [m.decode() for m in store.redis.zrange(line, 0, -1) if m.decode().endswith(jid)]
    return str(member)


def claimed(store: Store, jid: str, *, host: str = "", lease: float | None = None) -> str:
    """`in_line`, then claimed from the line (for `lease` seconds, else the store's); its token."""
    line = keys.session_line(host or None)
    member = in_line(store, jid, host=host, line=line)
    if lease is not None:
        store.claim_lease = lease
    token = store.claim_from_line(line, member, jid)
    assert token
    return str(token)


# --- a real (fake) session run in-process: the fence ends it, an unwritable answer is spooled -----
FAKE_CLAUDE = Path(__file__).resolve().parents[1] / "support" / "fake_claude.py"


def plan(tmp_path: Path, *steps: dict[str, Any]) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(list(steps)))


def spawns(tmp_path: Path) -> int:
    log = tmp_path / "spawns.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


# --- the spool wait's two hosts (tests/integration/test_spool_wait.py) ----------------------------
#: DISPATCHQ_SESSION_LEASE of the holder's host: it holds for this plus the wait.
WAIT_LEASE = 2
#: DISPATCHQ_SESSION_SPOOL_WAIT of the holder's host, seconds.
SPOOL_WAIT = 3
