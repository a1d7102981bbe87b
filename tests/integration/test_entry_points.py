"""RQ names resolve through dispatchq's fixed table of entry points, never by import.

A user's project with its own `jobs/` package (ahead of dispatchq's on `sys.path`, or
already imported as `jobs` for the user's checks) once had every dispatchq job import the
user's `jobs.tiers` and fail. And a worker imported whatever function or callback name
it read from Redis. Both against a real Redis and real workers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rq import Callback
from rq.job import JobStatus
from rq.registry import FailedJobRegistry
from rq.webhook import Webhook

from dispatchq.client import Client
from dispatchq.core.entrypoints import CODE_JOB
from dispatchq.process.wiring import drain
from dispatchq.queue.entrypoints import ENTRY_MODULE_FILE, DispatchqJob, DispatchqQueue, entry_module
from dispatchq.storage import keys
from tests.support.entry_points import HookCatcher, user_project
from tests.support.helpers import calls_of, run_cli, scheduler_in_process

HERE = __name__  # importable by RQ's `import_attribute` from the test process


def record(path: str, *rest: Any) -> None:
    """What a name that must never be imported does if it is: leaves a mark."""
    Path(path).write_text("imported and ran\n")


def record_callback(job: Any, connection: Any, *rest: Any) -> None:
    Path(job.meta["mark"]).write_text("callback ran\n")


def failed_jobs(redis_client: Any) -> list[str]:
    return [
        job_id
        for name in (keys.queue_name("code"), keys.queue_name("typed"))
        for job_id in FailedJobRegistry(name, connection=redis_client).get_job_ids()
    ]


# --- (a) a user's own `jobs/` never shadows dispatchq's ------------------------------------------


def test_a_worker_run_from_a_project_with_its_own_jobs_package_answers_with_the_users_checks(
    dq_env: dict[str, str], tmp_path: Path, redis_client: Any
) -> None:
    """`python -m` puts the project folder first on `sys.path`, so `jobs` is the user's."""
    mark = tmp_path / "user-jobs-tiers-imported"
    user_project(tmp_path, mark)
    lines = [
        {"kind": "lock", "target": "acme/app#1", "state": {"conflicts": ["poetry.lock"]}},
        {"kind": "lock", "target": "acme/app#2", "state": {"conflicts": ["src/app.py"]}},
    ]
    done = run_cli(["enqueue", "-"], dq_env, input="".join(json.dumps(j) + "\n" for j in lines), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ids = [line.split("\t")[1] for line in done.stdout.splitlines()]

    worker = run_cli(["worker", "code", "--burst"], dq_env, cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr
    assert "Traceback" not in worker.stderr, worker.stderr

    answered = json.loads(run_cli(["result", ids[0], "--json"], dq_env, cwd=tmp_path).stdout)
    cannot_tell = json.loads(run_cli(["result", ids[1], "--json"], dq_env, cwd=tmp_path).stdout)
    assert (answered["status"], answered["tier"], answered["value"]) == (
        "answered",
        "code",
        "user-says-rebuild",
    )
    assert cannot_tell["status"] == "needs-triage"  # the user's check could not tell
    assert not mark.exists()  # the user's jobs/tiers.py was never imported
    assert failed_jobs(redis_client) == []


def test_in_process_the_users_jobs_package_in_sys_modules_does_not_replace_dispatchqs(
    users_jobs_imported: Path, make_runtime: Any, redis_client: Any
) -> None:
    rt = make_runtime()
    client = Client(runtime=rt)
    results = client.enqueue_many([{"kind": "lock", "target": "t", "state": {"conflicts": ["uv.lock"]}}])
    assert results[0].ok, results[0].error
    assert sys.modules["jobs"].__file__ == str(users_jobs_imported.parent / "jobs" / "__init__.py")

    drain(rt, sessions=False)

    (got,) = rt.storage.records.get_many([results[0].id])
    assert (got.status, got.tier, got.value) == ("answered", "code", "user-says-rebuild")
    assert not users_jobs_imported.exists()
    assert failed_jobs(redis_client) == []
    module = entry_module()
    assert Path(module.__file__ or "") == ENTRY_MODULE_FILE and module is not sys.modules.get("jobs.tiers")


# --- (b) a name outside the table is refused, by name, and nothing of it runs --------------------


def failure_of(redis_client: Any, job_id: str) -> str:
    job = DispatchqJob.fetch(job_id, connection=redis_client)
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None
    return result.exc_string or ""


@pytest.mark.parametrize("name", ["os.system", "jobs.tiers.nope", f"{HERE}.record"])
def test_a_job_function_outside_the_table_is_refused_and_the_worker_goes_on(
    name: str, code_queue: Any, redis_client: Any, tmp_path: Path
) -> None:
    rt, queue, calls = code_queue
    mark = tmp_path / "mark"
    argument = f"touch {mark}" if name == "os.system" else str(mark)
    refused = queue.enqueue_call(name, args=(argument,), failure_ttl=500)
    after = Client(runtime=rt).enqueue_many([{"kind": "k", "target": "after-the-refused-job"}])

    drain(rt, sessions=False)

    assert not mark.exists()  # nothing of the refused name ran
    message = failure_of(redis_client, refused.id)
    assert f"refused job {name!r}" in message and "never imports a name read from Redis" in message
    (got,) = rt.storage.records.get_many([after[0].id])
    assert (got.status, got.value) == ("answered", "answered")  # the worker kept working
    assert calls_of(calls) == ["after-the-refused-job"]


@pytest.mark.parametrize("role", ["on_success", "on_failure", "on_stopped"])
def test_a_callback_outside_the_table_is_refused_before_the_job_runs(
    role: str, code_queue: Any, redis_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, queue, calls = code_queue
    ran = tmp_path / "job-ran"
    real = entry_module().code

    def code(ids: list[str]) -> int:
        if ids == ["no-such-judgement"]:  # the refused job's: it must never get here
            ran.write_text("ran")
            return 0
        return real(ids)

    monkeypatch.setattr(entry_module(), "code", code)
    mark = tmp_path / "callback-ran"
    name = f"{HERE}.record_callback"
    refused = queue.enqueue_call(
        CODE_JOB,
        args=(["no-such-judgement"],),
        failure_ttl=500,
        meta={"mark": str(mark)},
        **{role: Callback(name)},
    )
    after = Client(runtime=rt).enqueue_many([{"kind": "k", "target": "after-the-refused-job"}])

    drain(rt, sessions=False)

    assert not ran.exists() and not mark.exists()
    assert f"refused {role} {name!r}" in failure_of(redis_client, refused.id)
    (got,) = rt.storage.records.get_many([after[0].id])
    assert (got.status, got.value) == ("answered", "answered")
    assert calls_of(calls) == ["after-the-refused-job"]


def test_a_job_carrying_an_rq_webhook_is_refused_before_it_runs_and_its_url_is_never_called(
    code_queue: Any, redis_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ calls a job's webhook URLs when it ends: a job from Redis must not make a worker call out."""
    rt, queue, calls = code_queue
    ran = tmp_path / "job-ran"
    real = entry_module().code

    def code(ids: list[str]) -> int:
        if ids == ["no-such-judgement"]:  # the refused job's: it must never get here
            ran.write_text("ran")
            return 0
        return real(ids)

    monkeypatch.setattr(entry_module(), "code", code)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)  # the call, were it made, would reach the catcher
    with HookCatcher() as hook:
        hooks = [Webhook(hook.url, status, method="POST") for status in ("finished", "failed")]
        refused = queue.enqueue_call(CODE_JOB, args=(["no-such-judgement"],), failure_ttl=500, webhooks=hooks)
        after = Client(runtime=rt).enqueue_many([{"kind": "k", "target": "after-the-refused-job"}])

        drain(rt, sessions=False)

    assert not ran.exists()
    assert f"refused webhook {hook.url!r}" in failure_of(redis_client, refused.id)
    assert hook.requests == []
    (got,) = rt.storage.records.get_many([after[0].id])
    assert (got.status, got.value) == ("answered", "answered")  # the worker kept working
    assert calls_of(calls) == ["after-the-refused-job"]


def test_the_schedulers_control_queue_refuses_a_name_outside_the_table(
    code_queue: Any, redis_client: Any, tmp_path: Path
) -> None:
    rt = code_queue[0]
    mark = tmp_path / "mark"
    control = DispatchqQueue(keys.CONTROL_QUEUE, connection=redis_client)
    refused = control.enqueue_call("os.system", args=(f"touch {mark}",), failure_ttl=500)
    scheduler_in_process(rt, burst=True)

    assert not mark.exists()
    assert "refused job 'os.system'" in failure_of(redis_client, refused.id)
