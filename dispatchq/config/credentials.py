"""Whether each credential of the pool can be read: its file exists, is readable and holds something.

Validating the file's shape needs no machine; this needs the one that runs sessions, so it
is its own step: `dispatchq config check` runs it (unless `--no-files`), and a role that
spawns sessions runs it at start. A line names the credential and its file, never what the
file holds: the content is read only to see that it is not blank, and dropped.
"""

from __future__ import annotations

import os
import stat

from dispatchq.config.model import FILE_KEYS
from dispatchq.pools.credentials import Credential, Pool

__all__ = ["credential_file_problem", "credential_file_problems"]


def credential_file_problems(pool: Pool) -> list[str]:
    """One line per credential whose file is missing, unreadable or empty, in the pool's order.

    A credential with no file of its own (the environment's `default`) is the settings'
    to check, and is skipped here."""
    return [line for line in map(credential_file_problem, pool) if line is not None]


def credential_file_problem(credential: Credential) -> str | None:
    """What is wrong with `credential`'s file, as one line; None when it can be read."""
    if credential.file is None:
        return None
    path = credential.file
    where = f"credentials.{credential.name}: {FILE_KEYS.get(credential.variable, 'file')} {path}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{where} does not exist"
    except OSError as error:
        return f"{where} cannot be read: {error.strerror or error}"
    if not stat.S_ISREG(info.st_mode):
        return f"{where} is not a regular file"
    try:
        with open(path, "rb") as handle:
            blank = not handle.read().strip()
    except OSError as error:
        return f"{where} cannot be read: {error.strerror or error}"
    return f"{where} is empty" if blank else None
