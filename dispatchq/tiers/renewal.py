"""A login a session renewed goes back to its credential's file.

A plan's login (Codex's `auth.json`) is copied into each session's own config folder, and the
CLI rewrites that copy when it refreshes its access token. The refresh may rotate the refresh
token as well, retiring the one in the credential's file: left there, the next session would
start with a dead login and every session on the credential would fail to sign in. So after
each session the tier asks its backend for the renewed login (`renewed_login`) and carries it
back here, under a lock per credential in the data dir, so that two sessions of one login
ending at once leave the newer of their two renewals:

- the file still holds what this session was given: it is replaced by the renewal;
- another session's renewal got there first: the later `last_refresh` stays (the renewal
  when the file's cannot be read as a login).

The file is replaced whole (a new inode, mode 0600, renamed into place; a symlink's target is
the file replaced), so a reader sees the old login or the new one, never half of each. A
renewal that cannot be written is one WARNING naming the file and the fix, never the
session's failure: the answer the session gave stands.

Each host carries back into its own copy of the file: a login shared by several hosts' files
is renewed on one and retired on the others (docs/codex-cli.md says to give each host its own
login, or to renew with `codex login` where sessions start failing to sign in).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Literal

from dispatchq.storage.private import read_private, write_private

__all__ = ["Carried", "carry_back"]

log = logging.getLogger("dispatchq.session")

Carried = Literal["written", "newer kept", "failed"]


def carry_back(name: str, file: str, given: str, renewed: str, lock_dir: Path) -> Carried:
    """Put `renewed` (the session's login) in place of `given` (what it was handed) in `file`."""
    try:
        with _locked(lock_dir, name):
            target = Path(os.path.realpath(file))
            current = read_private(target)
            if current is not None and current != given.strip() and not _later(renewed, current):
                return "newer kept"
            write_private(target, renewed.strip() + "\n")
    except OSError as error:
        log.warning(
            "credential %s: the session renewed its login but %s could not be written (%s); "
            "renew it with `codex login` if sessions on it fail to sign in",
            name,
            file,
            error.strerror or type(error).__name__,
        )
        return "failed"
    log.info("credential %s: the session's renewed login was written to %s", name, file)
    return "written"


def _later(renewed: str, current: str) -> bool:
    """Is `renewed` a later login than `current`? Yes when `current` cannot say when it was made."""
    mine, theirs = _refreshed(renewed), _refreshed(current)
    return theirs is None or (mine is not None and mine > theirs)


def _refreshed(text: str) -> datetime | None:
    """A login's `last_refresh` as an aware instant, else None."""
    try:
        login = json.loads(text)
        stamp = login.get("last_refresh") if isinstance(login, dict) else None
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None
    return when if when is not None and when.tzinfo is not None else None


@contextlib.contextmanager
def _locked(lock_dir: Path, name: str) -> Iterator[None]:
    """The credential's own lock in the data dir: the credential's folder may not be writable."""
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_dir / f"login-{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
