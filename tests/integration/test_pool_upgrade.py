"""The upgrade to pools: a store written by the release before credential pools drains as the
`default` credential's.

The store is written by that release's own code: its `dispatchq` package, taken from the
repository's history with `git archive`, runs as the CLI against the test's Redis (judgements
enqueued, the window closed by an operator, which schedules its retrigger). Then the current
scheduler and session worker start with no `credentials:` section, and everything drains on
the environment's credential once the lift comes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from dispatchq.storage import keys
from dispatchq.window.limits import GENERAL_SCOPE
from tests.support.helpers import REPO
from tests.support.session import Harness

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux")

#: The last release before credential pools (the structure round's landed main).
PREVIOUS = "2d5db49"


def _previous_release(into: Path) -> Path:
    """That release's `dispatchq` and `jobs` packages, unpacked under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS, "dispatchq", "jobs"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        pytest.fail(
            f"git archive {PREVIOUS} failed ({archive.stderr.decode(errors='replace').strip()}): "
            "the upgrade test needs the repository's history (a clone, not an export)"
        )
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def _old_cli(harness: Harness, old: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _old_python(harness, old, "-m", "dispatchq.cli", *args)


# The editable install of the current package maps `dispatchq` to this checkout ahead of
# PYTHONPATH (a meta path finder): drop it, so the old release's packages are the ones imported.
_BOOT = (
    "import runpy, sys; "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]; "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True) if sys.argv[0] != '-c' "
    "else exec(sys.argv[1])"
)


def _old_python(harness: Harness, old: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**harness.env, "PYTHONPATH": f"{old}{os.pathsep}{REPO}"}
    module = list(args[1:]) if args[0] == "-m" else list(args)
    return subprocess.run(
        [sys.executable, "-c", _BOOT, *module],
        env=env,
        cwd=harness.tmp,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_store_the_previous_release_wrote_drains_as_the_default_credentials(harness: Harness) -> None:
    old = _previous_release(harness.tmp / "previous")
    where = _old_python(harness, old, "-c", "import dispatchq.pools")
    assert where.returncode != 0 and "No module named 'dispatchq.pools'" in where.stderr  # the old code runs
    ids = []
    for target in ("one", "two", "three"):
        done = _old_cli(harness, old, "enqueue", "--kind", "ask", "--target", target)
        assert done.returncode == 0, done.stderr
        ids.append(done.stdout.strip())
    closed = _old_cli(harness, old, "window", "close", "--until", "6s", "--reason", "before the upgrade")
    assert closed.returncode == 0, closed.stderr
    # What the previous release left: its bare `general` marker, closed, with one retrigger.
    assert harness.marker_state(GENERAL_SCOPE) == "closed"
    assert [scope for scope, _ in harness.retriggers()] == [GENERAL_SCOPE]
    assert sorted(harness.rt.storage.records.line_ids(keys.session_line())) == sorted(ids)

    harness.scheduler()
    harness.workers(1)
    harness.wait(lambda: harness.all_status(ids, "answered"), "the old line drained", timeout=60)
    assert harness.spawns_on("test-session-credential") == len(ids)
    assert harness.marker(GENERAL_SCOPE) is None
    assert harness.retriggers() == []
    actions = [(entry["scope"], entry["action"]) for entry in harness.audit()]
    assert (GENERAL_SCOPE, "opened") in actions and (GENERAL_SCOPE, "closed") in actions
