"""The table of RQ entry points: each name is dispatchq's own function, nothing else resolves."""

from __future__ import annotations

import inspect
import re

import pytest

from dispatchq.core.entrypoints import CALLBACKS, FAILURE_CALLBACK, JOB_FUNCTIONS, TIER_JOB, TIER_OF_JOB
from dispatchq.core.tiers import TIERS
from dispatchq.queue.entrypoints import ENTRY_MODULE_FILE, RefusedEntryPoint, resolve


@pytest.mark.parametrize("name", sorted(JOB_FUNCTIONS))
def test_every_job_name_is_a_function_of_dispatchqs_own_jobs_tiers(name: str) -> None:
    fn = resolve("job", name)
    assert inspect.getsourcefile(fn) == str(ENTRY_MODULE_FILE)
    assert name == f"jobs.tiers.{fn.__name__}"  # the names jobs already in Redis carry


def test_the_failure_callback_resolves_only_as_a_failure_callback() -> None:
    assert resolve("on_failure", FAILURE_CALLBACK).__name__ == "on_job_failure"
    for role in ("job", "on_success", "on_stopped"):
        with pytest.raises(RefusedEntryPoint, match=re.escape(f"refused {role} {FAILURE_CALLBACK!r}")):
            resolve(role, FAILURE_CALLBACK)


@pytest.mark.parametrize("name", ["os.system", "jobs.tiers.nope", "jobs.tiers", "builtins.eval", "", None, 3])
def test_anything_else_is_refused_by_name(name: object) -> None:
    with pytest.raises(RefusedEntryPoint) as caught:
        resolve("job", name)
    assert f"refused job {name!r}" in str(caught.value) and caught.value.name == name


def test_a_tier_job_as_a_callback_is_refused() -> None:
    with pytest.raises(RefusedEntryPoint, match=re.escape(f"allowed: {FAILURE_CALLBACK}")):
        resolve("on_failure", TIER_JOB["code"])
    assert set(CALLBACKS) == {"on_failure", "on_success", "on_stopped"}


def test_every_tier_has_its_job_and_back() -> None:
    assert set(TIER_JOB) == set(TIERS)
    assert {TIER_OF_JOB[name] for name in TIER_JOB.values()} == set(TIERS)


# --- the job class reads and writes strict JSON, and says why a job is not one of ours -----------

import fakeredis  # noqa: E402
from rq import Callback, Queue  # noqa: E402
from rq.webhook import Webhook  # noqa: E402

from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue, RefusedData, refusal_of  # noqa: E402
from dispatchq.queue.serializer import JSONSerializer  # noqa: E402


def test_the_serializer_is_plain_json_rqs_own_reads_and_refuses_what_json_is_not() -> None:
    from rq.serializers import JSONSerializer as RQJSON

    data = JSONSerializer.dumps(("jobs.tiers.code", None, (["a"],), {}))
    assert RQJSON.loads(data) == ["jobs.tiers.code", None, [["a"]], {}]  # `rq info --serializer ...`
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            JSONSerializer.dumps([bad])
    with pytest.raises(ValueError):
        JSONSerializer.loads(b"[NaN]")


def test_a_job_of_ours_is_json_whatever_serializer_a_caller_passes() -> None:
    client = fakeredis.FakeRedis()
    queue = DispatchqQueue("q", connection=client, serializer="pickle")
    job = queue.enqueue_call(TIER_JOB["code"], args=(["a"],))
    fetched = DispatchqJob.fetch(job.id, connection=client, serializer="pickle")
    assert fetched.serializer is JSONSerializer and fetched.args == (["a"],)
    assert refusal_of(fetched) is None and fetched.func_name == TIER_JOB["code"]


def test_a_pickled_job_is_refused_as_data_and_never_unpickled() -> None:
    client = fakeredis.FakeRedis()
    pickled = Queue("q", connection=client).enqueue_call("os.system", args=("true",))
    refused = refusal_of(DispatchqJob.fetch(pickled.id, connection=client))
    assert isinstance(refused, RefusedData) and str(refused) == str(RefusedData("pickle"))
    assert refusal_of(pickled) is not None  # a job read with another serializer is not decoded


@pytest.mark.parametrize("role", ["on_success", "on_failure", "on_stopped"])
def test_a_json_job_with_a_callback_outside_the_table_is_refused_by_role(role: str) -> None:
    client = fakeredis.FakeRedis()
    job = DispatchqQueue("q", connection=client).enqueue_call(
        TIER_JOB["code"], args=(["a"],), **{role: Callback("os.system")}
    )
    refused = refusal_of(DispatchqJob.fetch(job.id, connection=client))
    assert refused is not None and str(refused).startswith(f"refused {role} 'os.system'")


def test_a_json_job_of_the_table_carrying_a_webhook_is_refused_by_its_url() -> None:
    client = fakeredis.FakeRedis()
    url = "http://127.0.0.1:9/collect"
    job = DispatchqQueue("q", connection=client).enqueue_call(
        TIER_JOB["code"], args=(["a"],), webhooks=[Webhook(url, "failed", method="POST")]
    )
    refused = refusal_of(DispatchqJob.fetch(job.id, connection=client))
    assert refused is not None and refused.role == "webhook" and refused.name == url
    assert str(refused).startswith(f"refused webhook {url!r}")
