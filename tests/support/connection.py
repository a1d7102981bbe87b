"""How a test finds the redis-server processes serving a data dir."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["redis_pids"]


def redis_pids(data_dir: Path) -> list[int]:
    """The redis-server processes serving `data_dir` (a server's cwd is its data dir)."""
    found = []
    target = data_dir.resolve()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if b"redis-server" in cmdline and cwd == target:
            found.append(int(entry.name))
    return found
