"""Deprecated: the example checks moved to `examples/checks.py`; this shim goes next release.

A config beside them names them `checks:lockfile_only` (its folder is on `sys.path`).
The `jobs` package holds dispatchq's RQ entry points only. Until the shim goes, the old
names `jobs.examples:lockfile_only` and `jobs.examples:noop` still load the same
functions, from the file in the checkout (no warning: the tests turn warnings into errors).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["LOCKFILES", "lockfile_only", "noop"]

_FILE = Path(__file__).resolve().parents[1] / "examples" / "checks.py"
_NAME = "dispatchq_examples_checks"


def _load() -> ModuleType:
    for name in ("checks", _NAME):
        module = sys.modules.get(name)
        found = getattr(module, "__file__", None)
        if module is not None and found is not None and Path(found).resolve() == _FILE:
            return module
    spec = importlib.util.spec_from_file_location(_NAME, _FILE)
    if spec is None or spec.loader is None or not _FILE.is_file():
        raise ImportError(f"jobs.examples moved to examples/checks.py, which is not here ({_FILE})")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


_checks = _load()
LOCKFILES = _checks.LOCKFILES
lockfile_only = _checks.lockfile_only
noop = _checks.noop
