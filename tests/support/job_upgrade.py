"""What the job-upgrade tests read and plant in RQ's job hashes: a job's stored payload, and a
pickle that would run a command if anything unpickled it."""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

__all__ = ["Evil", "stored_data"]


class Evil:
    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.canary}",))


def stored_data(redis_client: Any, job_id: str) -> bytes:
    return bytes(zlib.decompress(redis_client.hget(f"rq:job:{job_id}", "data")))
