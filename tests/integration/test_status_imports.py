"""`dispatchq status` is run in operators' loops, so its start-up is its cost (a target of
0.5 s at a million waiting, bench/backlog.py): it reads the store and renders, and imports
none of what only a running session, the findings gate or the web server needs.

Checked by module, not by clock: the command is run in a fresh interpreter, which then lists
what it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

#: Packages `status` has no use for, each with who needs it instead.
NOT_FOR_STATUS = {
    "dispatchq.backends": "a session worker (each CLI's argv, stream and limits)",
    "dispatchq.findings": "the findings gate",
    "dispatchq.serve": "dispatchq serve",
    "dispatchq.tiers.session": "a session worker",
}

SCRIPT = """
import contextlib, io, json, sys
import dispatchq.cli as cli
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        cli.main(["status", "--json"])
except SystemExit as done:
    code = done.code
json.loads(out.getvalue())  # it did answer
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_status_imports_no_backend_gate_or_server(dq_env: dict[str, str], redis_client: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=dq_env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] in (0, None), done.stderr
    loaded = {
        package: sorted(m for m in report["modules"] if m == package or m.startswith(package + "."))
        for package in NOT_FOR_STATUS
    }
    assert {p: m for p, m in loaded.items() if m} == {}
