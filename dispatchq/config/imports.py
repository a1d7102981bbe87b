"""Importing a kind's check (`module:function`) with the config file's folder on the path."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["import_check"]


@contextmanager
def _on_path(directory: Path) -> Iterator[None]:
    # The directory stays on the path: a check may import its own helpers from there
    # when it runs, long after the config was loaded. Last, not first: a folder of the
    # user's must never shadow an installed package (their own `jobs/` once replaced
    # dispatchq's entry points, and every job failed).
    entry = str(directory)
    if entry not in sys.path:
        sys.path.append(entry)
    yield


def import_check(spec: str, base_dir: Path) -> Callable[..., Any]:
    """Import `module:function` with the config file's directory on the path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not module:function")
    with _on_path(base_dir):
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"cannot import {module_name!r}: {error}") from None
        except Exception as error:  # the module itself raised while importing
            raise ValueError(f"importing {module_name!r} raised {type(error).__name__}: {error}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return fn
