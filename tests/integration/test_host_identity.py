"""One `DISPATCHQ_HOST`, one machine: a worker refuses a name a live worker of another machine holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.storage.store import Store
from dispatchq.workers.identity import holder_elsewhere, machine_id
from tests.support.helpers import run_cli

pytestmark = pytest.mark.usefixtures("no_ghost_left")


def _ghost(redis_client: Any, host: str, machine: str, *, age: float = 0.0) -> None:
    """A worker entry as another process publishes it; `age` seconds since its last beat."""
    Store(redis_client).publish_worker(
        "ghost-worker", {"tier": "code", "host": host, "machine_id": machine, "pid": 4242}, ttl=60
    )
    redis_client.zadd(keys.WORKERS, {"ghost-worker": time.time() - age})


def test_a_second_machine_under_a_live_hosts_name_refuses_to_start(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path
) -> None:
    (tmp_path / "dispatchq.yaml").write_text("kinds: {}\n")
    host = load_settings(dq_env).host
    _ghost(redis_client, host, "another-machine-id")
    done = run_cli(["worker", "code", "--burst"], dq_env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"DISPATCHQ_HOST={host!r} is held by a live worker on another machine" in done.stderr
    assert "worker ghost-worker, pid 4242" in done.stderr and "Traceback" not in done.stderr
    # The same name under its own DISPATCHQ_HOST starts.
    own = run_cli(["worker", "code", "--burst"], {**dq_env, "DISPATCHQ_HOST": f"{host}-b"}, cwd=tmp_path)
    assert own.returncode == 0, own.stderr


def test_the_same_machine_restarting_inside_its_old_heartbeat_and_a_lapsed_holder_are_not_refused(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path
) -> None:
    (tmp_path / "dispatchq.yaml").write_text("kinds: {}\n")
    host = load_settings(dq_env).host
    _ghost(redis_client, host, machine_id())  # this machine's own worker, still beating
    assert run_cli(["worker", "code", "--burst"], dq_env, cwd=tmp_path).returncode == 0
    _ghost(redis_client, host, "another-machine-id", age=3600)  # gone an hour ago
    done = run_cli(["worker", "code", "--burst"], dq_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_machine_id_falls_back_to_the_boot_id_and_hostname(tmp_path: Path) -> None:
    given = tmp_path / "machine-id"
    given.write_text("abc123\n")
    boot = tmp_path / "boot_id"
    boot.write_text("boot-one\n")
    assert machine_id((str(given),), str(boot)) == "abc123"
    fallback = machine_id((str(tmp_path / "missing"),), str(boot))
    assert fallback.startswith("boot-") and fallback != "abc123"
    boot.write_text("boot-two\n")
    machine_id.cache_clear()
    assert machine_id((str(tmp_path / "missing"),), str(boot)) != fallback
    live = [{"host": "h", "machine_id": "x", "name": "w"}, {"host": "h", "machine_id": None}]
    assert holder_elsewhere(live, "h", "x") is None
    assert holder_elsewhere(live, "h", "y") == live[0]
    assert holder_elsewhere(live, "other", "y") is None
