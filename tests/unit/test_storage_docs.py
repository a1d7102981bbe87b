"""docs/storage.md lists every operation of the storage gateway, one line each, and cannot drift.

The page is generated from `dispatchq.storage.gateway.Storage`: its areas, and each area's
public methods with the first line of their docstring. A method added, renamed or removed
without the page fails here; `python tests/unit/test_storage_docs.py` writes the page again.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script to write the page
    sys.path.insert(0, str(ROOT))

from dispatchq.storage.gateway import AREAS, Storage, area_classes  # noqa: E402

PAGE = ROOT / "docs" / "storage.md"

HEAD = """\
# Storage: every Redis operation, by area

Everything dispatchq does to Redis goes through one object per process, `runtime.storage`
(`dispatchq.storage.gateway.Storage`), with one attribute per area; each area's methods are
the named operations below. Redis commands, Lua scripts and key names live only under
`dispatchq/storage/`: an import-linter contract keeps `storage.keys`, `storage.scripts` and
`storage.counts` inside it, and `tests/unit/test_storage_boundary.py` refuses a Redis command,
a Lua script or a key name written anywhere else in `dispatchq/` or `jobs/`.

RQ's own objects (queues, jobs, workers, rq-scheduler) are handed the client itself: what
they do with it is RQ's business. What dispatchq does to RQ's keys is the `jobs` area and
`dispatchq/storage/rqstate.py`, whose functions the RQ subclasses (which hold a connection,
not a runtime) call directly.

This page is generated from the code (`python tests/unit/test_storage_docs.py`), and
`tests/unit/test_storage_docs.py` fails when it differs.
"""


def operations(cls: type) -> list[tuple[str, str]]:
    """(name, summary) of each public method of an area class, in source order."""
    found = []
    for name, member in cls.__dict__.items():
        function = member.__func__ if isinstance(member, staticmethod | classmethod) else member
        if name.startswith("_") or not inspect.isfunction(function):
            continue
        doc = inspect.getdoc(function)
        summary = doc.split("\n\n")[0].replace("\n", " ") if doc else ""
        found.append((name, summary))
    return found


def page() -> str:
    lines = [HEAD]
    counts = []
    for area, cls in area_classes():
        ops = operations(cls)
        counts.append(f"| `{area}` | `{cls.__name__}` | {len(ops)} |")
        source = Path(inspect.getfile(cls)).relative_to(ROOT)
        lines.append(f"## `storage.{area}`: `{cls.__name__}` ({len(ops)})\n")
        summary = inspect.getdoc(getattr(Storage, area).func)
        lines.append(f"{summary or inspect.getdoc(cls) or ''} In [`{source}`](../{source}).\n")
        lines.extend(f"- `{name}`" + (f": {text}" if text else "") for name, text in ops)
        lines.append("")
    table = ["| area | class | operations |", "| --- | --- | --- |", *counts, ""]
    total = sum(len(operations(cls)) for _, cls in area_classes())
    lines.insert(1, f"{len(AREAS)} areas, {total} operations.\n\n" + "\n".join(table))
    return "\n".join(lines).rstrip("\n") + "\n"


def test_the_page_lists_every_operation() -> None:
    assert PAGE.read_text(encoding="utf-8") == page(), (
        "docs/storage.md is stale: run python tests/unit/test_storage_docs.py"
    )


def test_every_area_is_a_cached_attribute_of_the_gateway() -> None:
    names = {name for name, value in vars(Storage).items() if hasattr(value, "func")}
    assert names == set(AREAS)


def test_an_operation_added_to_an_area_changes_the_page() -> None:
    class Probe:
        def new_operation(self) -> None:
            """What it does."""

    assert operations(Probe) == [("new_operation", "What it does.")]


if __name__ == "__main__":
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
