"""Files and folders only this user may touch: the embedded store's password, socket, data.

The embedded Redis is the one store every dispatchq process shares, and RQ runs what it
finds there, so whoever can reach it can run code as dispatchq. Its socket therefore lives
only in a folder this uid owns with no group or other bits, checked (without following a
symlink) before every connection, and everything under the data dir is the owner's alone.
A secret is created with its final mode in one step (`O_CREAT|O_EXCL`, 0600): a file that
is chmod-ed after creation is readable by anyone who opened it in between.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = [
    "create_secret",
    "folder_problem",
    "read_private",
    "secret_problem",
    "tighten_tree",
    "write_private",
]


def folder_problem(path: Path, *, follow: bool = False) -> str | None:
    """Why `path` is not a folder private to this uid, or None when it is.

    `follow=False` (the default) refuses a symlink: a socket folder someone swapped for a
    link to their own would otherwise pass every other test. The data dir itself may be
    reached through a symlink the operator made, so its check follows one.
    """
    try:
        info = path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as error:
        return f"{path}: {error.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink, not a folder of this user's"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a folder"
    if info.st_uid != os.getuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    if info.st_mode & 0o077:
        return f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}, wanted 0700)"
    return None


def secret_problem(path: Path) -> str | None:
    """Why the secret at `path` may have leaked (not ours, not a plain file, group/other bits)."""
    try:
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        return f"{path} is not a plain file of this user's"
    if info.st_mode & 0o077:
        return f"{path} is readable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def create_secret(path: Path) -> str:
    """The random secret at `path`, created 0600 with its content in one step if absent.

    The secret is written to a private temporary name first and then hard-linked into
    place: a link fails if the name exists, so two processes creating it at once agree on
    one secret, and no reader ever sees the file half-written.
    """
    value = read_private(path)
    if value:
        return value
    value = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(value + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return read_private(path) or value
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return value


def read_private(path: Path) -> str | None:
    """The stripped text of `path`, or None when it is absent or empty; never follows a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as handle:
        text = handle.read().strip()
    return text or None


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from creation (a new inode, renamed into place)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def tighten_tree(root: Path, *, keep: frozenset[Path] = frozenset()) -> list[Path]:
    """Clear the group and other bits of everything under `root` (and `root`); return what changed.

    An older release left the data dir 0755 and the append-only file, log and config 0644;
    a file created under umask 022 by any other writer would too. Symlinks are skipped (a
    chmod would follow one out of the tree); `keep` names files never to chmod (a secret
    is created 0600 and a changed mode there means it leaked, not that it needs fixing).
    """
    changed: list[Path] = []
    for folder, _dirs, files in os.walk(root, followlinks=False):
        base = Path(folder)
        # Each folder is tightened when the walk reaches it, so `dirs` needs no turn here.
        for path in [base, *(base / name for name in files)]:
            if path in keep:
                continue
            try:
                info = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o077 or info.st_uid != os.getuid():
                continue
            with contextlib.suppress(OSError):
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)
                changed.append(path)
    return changed
