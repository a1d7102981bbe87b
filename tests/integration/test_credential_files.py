"""A credential file a worker cannot read is named, never shown (`config.credential_file_problems`).

Here rather than with the unit tests: as root a file reads whatever its mode, so the check
runs as `nobody` in a child process, as an unprivileged worker would meet it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dispatchq.config import credential_file_problems
from dispatchq.pools.credentials import Credential, Pool, SpendCap


def test_an_unreadable_file_is_named_without_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("sk-ant-api03-secret")
    secret.chmod(0)
    expected = [f"credentials.o: api_key_file {secret} cannot be read: Permission denied"]
    if os.geteuid() != 0:
        credential = Credential(
            "o",
            variable="ANTHROPIC_API_KEY",
            file=str(secret),
            billing="metered",
            spend_cap=SpendCap(day=1.0),
        )
        assert credential_file_problems(Pool((credential,))) == expected
        return
    # Root reads a file whatever its mode: the check runs as `nobody`, as a worker would.
    tmp_path.chmod(0o755)
    script = (
        "import json, sys; from dispatchq.config import credential_file_problems; "
        "from dispatchq.pools.credentials import Credential, Pool, SpendCap; "
        f"c = Credential('o', variable='ANTHROPIC_API_KEY', file={str(secret)!r}, billing='metered', "
        "spend_cap=SpendCap(day=1.0)); print(json.dumps(credential_file_problems(Pool((c,)))))"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert "sk-ant" not in done.stdout
