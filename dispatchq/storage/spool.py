"""A host's local spool: outcomes a session's holder saw but could not write to Redis.

A session that ends while its host is cut off from Redis has still *seen* something that
must not be lost: its answer (for host-bound work it cannot be asked again elsewhere) or a
usage limit (every other host would keep spawning into the closed window). Each goes to a
file under `<data dir>/spool/` before the job ends, fsync'd with its directory, so a crash
right after keeps it; the session worker replays the spool when Redis is back.

Each entry is named by its claim token and its outcome (`<claim>.<kind>.json`): writing the
same outcome twice overwrites one file, and the replay of an entry is written to be safe to
run again (a crash between applying an entry and removing its file only repeats it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["SPOOL_KINDS", "Spool", "SpoolEntry", "SpoolKind", "spool_dir"]

SpoolKind = Literal["answer", "limit"]
SPOOL_KINDS: tuple[SpoolKind, ...] = ("answer", "limit")
_NAME = re.compile(r"^(?P<claim>[A-Za-z0-9_-]{1,80})\.(?P<kind>answer|limit)\.json$")


def spool_dir(data_dir: Path) -> Path:
    """Where a host keeps its spool (beside the embedded server's data, on the same disk)."""
    return data_dir.expanduser() / "spool"


@dataclass(frozen=True)
class SpoolEntry:
    """One outcome waiting for Redis: whose claim saw it, of which judgement, and what it was."""

    claim: str
    kind: SpoolKind
    jid: str
    body: dict[str, Any] = field(default_factory=dict)
    written: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.claim}.{self.kind}.json"


class Spool:
    """The spool folder of one host: put, list and drop entries, each durable once `put` returns."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def put(self, entry: SpoolEntry) -> Path:
        """Write `entry` so that it survives a crash: temporary file, fsync, rename, fsync the folder."""
        if not _NAME.match(entry.name):
            raise ValueError(f"not a spool entry name: {entry.name!r}")
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = self.folder / entry.name
        temporary = self.folder / f".{entry.name}.{os.getpid()}.tmp"
        data = {
            "claim": entry.claim,
            "kind": entry.kind,
            "jid": entry.jid,
            "body": entry.body,
            "written": entry.written or time.time(),
        }
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data, ensure_ascii=False, default=str).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
        self._sync_folder()
        return target

    def entries(self) -> list[SpoolEntry]:
        """Every readable entry, oldest first; a file that is not one (torn, foreign) is skipped."""
        try:
            names = sorted(os.listdir(self.folder))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if not _NAME.match(name):
                continue
            try:
                data = json.loads((self.folder / name).read_text(encoding="utf-8"))
                entry = SpoolEntry(
                    claim=str(data["claim"]),
                    kind=data["kind"],
                    jid=str(data["jid"]),
                    body=dict(data.get("body") or {}),
                    written=float(data.get("written") or 0.0),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if entry.name == name:
                out.append(entry)
        return sorted(out, key=lambda e: (e.written, e.name))

    def remove(self, entry: SpoolEntry) -> None:
        """The entry was applied (or recorded as late): its file goes, durably."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.folder / entry.name)
            self._sync_folder()

    def __len__(self) -> int:
        return len(self.entries())

    def _sync_folder(self) -> None:
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
