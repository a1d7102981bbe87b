"""The fixed table of dispatchq's RQ entry points, and the job class that honours it.

RQ stores a job's function and callbacks in Redis by dotted name and, left to itself,
imports whatever name it reads. dispatchq's names live in a top-level `jobs` package
(`jobs.tiers.code`, ...: the names jobs already in users' Redis carry), and a user's
project with its own `jobs/` folder on `sys.path` would have RQ import *that* instead:
every job then fails with a traceback from someone else's code. So a dispatchq worker
never imports a name it read from Redis. `DispatchqJob` looks each name up in this
table, which maps it to dispatchq's own callable, loaded from the file inside the
installed package (never found through `sys.path`); any other name is refused, by name,
before anything of the job runs.

The names themselves are data, kept in `dispatchq.core.entrypoints` (derived from the tier
table), so every room names its jobs from there rather than keeping its own string; this
module is the part that resolves them, and the only one that loads `jobs/tiers.py`.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from rq.job import Job

from dispatchq.core import entrypoints as entry_names

__all__ = [
    "ENTRY_MODULE_FILE",
    "DispatchqJob",
    "RefusedEntryPoint",
    "entry_module",
    "resolve",
]

#: dispatchq's own `jobs/tiers.py`: beside the `dispatchq` package, wherever it is installed.
ENTRY_MODULE_FILE = Path(__file__).resolve().parents[2] / "jobs" / "tiers.py"
#: Where the module is kept when `jobs` in `sys.modules` is somebody else's package.
_PRIVATE_NAME = "dispatchq.queue.entrypoints.jobs_tiers"
_LOAD = threading.Lock()


class RefusedEntryPoint(LookupError):
    """A job or callback names something outside dispatchq's table: it is not imported."""

    def __init__(self, role: str, name: object) -> None:
        self.role = role
        self.name = name
        table = entry_names.JOB_FUNCTIONS if role == "job" else entry_names.CALLBACKS.get(role, {})
        known = ", ".join(sorted(table)) or "none"
        super().__init__(
            f"refused {role} {name!r}: not one of dispatchq's entry points (allowed: {known}); "
            "a dispatchq worker never imports a name read from Redis"
        )


def _is_ours(module: ModuleType | None) -> bool:
    found = getattr(module, "__file__", None)
    return found is not None and Path(found).resolve() == ENTRY_MODULE_FILE


def entry_module() -> ModuleType:
    """dispatchq's `jobs/tiers.py`, loaded from its file, never found through `sys.path`.

    `jobs.tiers` already imported from this very file is used as it is (one copy of it per
    process). Otherwise it is loaded under a private name, so that a user's own `jobs`
    package keeps its name for the user's own modules.
    """
    with _LOAD:
        for name in ("jobs.tiers", _PRIVATE_NAME):
            module = sys.modules.get(name)
            if _is_ours(module):
                assert module is not None
                return module
        spec = importlib.util.spec_from_file_location(_PRIVATE_NAME, ENTRY_MODULE_FILE)
        if spec is None or spec.loader is None:
            raise ImportError(f"dispatchq's entry points are missing: {ENTRY_MODULE_FILE}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PRIVATE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_PRIVATE_NAME]
            raise
        return module


def resolve(role: str, name: object) -> Callable[..., Any]:
    """dispatchq's callable for `name` as a job's function (`role="job"`) or as a callback
    (`"on_failure"`, `"on_success"`, `"on_stopped"`); `RefusedEntryPoint` for anything else."""
    table = entry_names.JOB_FUNCTIONS if role == "job" else entry_names.CALLBACKS.get(role, {})
    attr = table.get(name) if isinstance(name, str) else None
    if attr is None:
        raise RefusedEntryPoint(role, name)
    fn: Callable[..., Any] = getattr(entry_module(), attr)
    return fn


class DispatchqJob(Job):
    """An RQ job whose function and callbacks come from the table, never from an import.

    `perform` resolves every name the job carries before anything runs, so a job with a
    refused callback does not run its (allowed) function first and fail afterwards.
    """

    @property
    def func(self) -> Callable[..., Any] | None:
        name = self.func_name
        if name is None:
            return None
        if self.instance is not None:  # a method of a pickled object: never one of ours
            raise RefusedEntryPoint("job", name)
        return resolve("job", name)

    @property
    def success_callback(self) -> Any:
        return self._callback("on_success", self._success_callback_name)

    @property
    def failure_callback(self) -> Any:
        return self._callback("on_failure", self._failure_callback_name)

    @property
    def stopped_callback(self) -> Any:
        return self._callback("on_stopped", self._stopped_callback_name)

    def _callback(self, role: str, name: str | None) -> Callable[..., Any] | None:
        return resolve(role, name) if name else None

    def perform(self) -> Any:
        # Resolved for their refusal only, before anything of the job runs.
        _ = (self.func, self.success_callback, self.failure_callback, self.stopped_callback)
        return super().perform()
