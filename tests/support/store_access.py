"""The store-access tests' listener: a unix socket served as `nobody`, logging each connection."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.connection import redis_pids
from tests.support.helpers import wait_for
from tests.support.serve import free_port
from tests.support.session import NOBODY

__all__ = ["LISTENER", "NOBODY", "Listener", "as_nobody", "free_port", "redis_pids"]


LISTENER = r"""
import os, socket, sys
path, record = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)
server.listen(16)
open(record + ".ready", "w").close()
while True:
    conn, _ = server.accept()
    with open(record, "a") as out:
        out.write("connected\n")
    try:
        conn.recv(4096)
        conn.sendall(b"+OK\r\n")
    except OSError:
        pass
    conn.close()
"""


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]


class Listener:
    """A unix listener run as nobody at `path`, writing one line per connection to a file of its own."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.home = Path(tempfile.mkdtemp(prefix="dq-nobody-"))
        os.chown(self.home, NOBODY, NOBODY)
        self.record = self.home / "connections"
        python = os.path.realpath(sys.executable)
        self.proc = subprocess.Popen(
            as_nobody([python, "-I", "-c", LISTENER, str(path), str(self.record)]),
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        ready = self.home / "connections.ready"
        wait_for(lambda: ready.exists() or self.proc.poll() is not None, what="nobody's listener")
        assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
        assert path.lstat().st_uid == NOBODY

    def connections(self) -> int:
        return len(self.record.read_text().splitlines()) if self.record.exists() else 0

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        shutil.rmtree(self.home, ignore_errors=True)
