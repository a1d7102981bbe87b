"""Accepting webhook deliveries on a real Redis: the prepared RQ job and the one-call accept.

`dispatchq.storage.prepared` builds RQ's job hash without `Queue.enqueue_call`, and
`storage.serve.ACCEPT` writes it in the Lua call that claims the deliveries. Both are
checked against the real thing: RQ's own enqueue of the same call, and a real RQ worker
running what the script queued.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from rq import Queue, SimpleWorker
from rq.job import Job

from dispatchq.core.entrypoints import DELIVERIES_JOB
from dispatchq.queue.entrypoints import DispatchqJob, DispatchqQueue
from dispatchq.storage import keys
from dispatchq.storage.prepared import JobTemplate, PreparedJob
from dispatchq.storage.serve import AsyncDeliveries, Delivery, ServeStorage
from dispatchq.storage.triage import TriageStorage
from dispatchq.triage.jobs import prepare_deliveries
from tests.support.helpers import counting_check, run_cli
from tests.support.serve import module_env, payload

# A function any RQ worker can import: the test needs a job that runs, not dispatchq's.
FUNC = "json.dumps"
TIMES = {"created_at", "enqueued_at"}


def _hash(client: Any, key: str) -> dict[str, bytes]:
    return {k.decode(): v for k, v in client.hgetall(key).items()}


def _fields(job: PreparedJob) -> dict[str, bytes]:
    it = iter(job.fields)
    return {str(k): (v if isinstance(v, bytes) else str(v).encode()) for k, v in zip(it, it, strict=True)}


def _accept(redis_server: Any, deliveries: list[Delivery], job: PreparedJob) -> list[dict[str, Any] | None]:
    async def go() -> list[dict[str, Any] | None]:
        client = redis.asyncio.Redis(**redis_server.connection_kwargs())
        try:
            return await AsyncDeliveries(client, ttl=600).accept(deliveries, job)
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_prepared_job_is_the_hash_rq_itself_would_write(redis_client: Any) -> None:
    """Field by field against `Queue.enqueue_call`: an RQ upgrade that changes it fails here."""
    queue = Queue("dispatchq-test", connection=redis_client)
    args = ({"event": "issues.opened", "n": 1},)
    options = {"timeout": 300, "result_ttl": 86400, "failure_ttl": 3600}
    theirs = queue.enqueue_call(FUNC, args=args, description="d", **options)
    ours = JobTemplate(queue, FUNC, **options).prepare(args, "d")

    rq_hash = _hash(redis_client, theirs.key.decode() if isinstance(theirs.key, bytes) else theirs.key)
    prepared = _fields(ours)
    assert set(prepared) == set(rq_hash)
    for name in set(rq_hash) - TIMES - {"data"}:
        assert prepared[name] == rq_hash[name], name
    assert prepared["status"] == b"queued" and prepared["origin"] == b"dispatchq-test"
    # Same function, instance, args and kwargs once decompressed and loaded.
    assert queue.serializer.loads(zlib.decompress(prepared["data"])) == queue.serializer.loads(
        zlib.decompress(rq_hash["data"])
    )
    assert ours.key == f"rq:job:{ours.id}" and ours.queue_key == queue.key
    assert ours.queues_key == Queue.redis_queues_keys


def test_two_jobs_from_one_template_share_nothing_they_should_not(redis_client: Any) -> None:
    template = JobTemplate(
        Queue("dispatchq-test", connection=redis_client), FUNC, timeout=5, result_ttl=5, failure_ttl=5
    )
    first, second = template.prepare(([1],), "one"), template.prepare(([2],), "two")
    assert first.id != second.id
    assert _fields(first)["description"] == b"one" and _fields(second)["description"] == b"two"
    assert _fields(first)["data"] != _fields(second)["data"]


def test_accept_records_the_new_deliveries_and_queues_one_job_that_a_real_worker_runs(
    redis_server: Any, redis_client: Any
) -> None:
    queue = Queue("dispatchq-test", connection=redis_client)
    template = JobTemplate(queue, FUNC, timeout=60, result_ttl=600, failure_ttl=600)
    batch = [
        Delivery("d-a", {"decision_id": "A"}),
        Delivery("d-b", {"decision_id": "B"}),
        Delivery("d-a", {"decision_id": "A2"}),
    ]
    job = template.prepare((["d-a", "d-b", "d-a"],), "a batch")

    replies = _accept(redis_server, batch, job)

    # The third is the first's redelivery, riding the same call: it gets the first's record.
    assert replies[:2] == [None, None]
    assert replies[2] == {"decision_id": "A", "job": job.id}
    storage = ServeStorage(redis_client)
    assert storage.delivery("d-a") == {"decision_id": "A", "job": job.id}
    assert storage.delivery("d-b") == {"decision_id": "B", "job": job.id}
    assert 0 < redis_client.ttl(keys.webhook_delivery("d-a")) <= 600
    assert queue.job_ids == [job.id]
    assert redis_client.sismember(Queue.redis_queues_keys, queue.key)

    # What the script wrote is a job RQ can run: a real worker takes it and finishes it.
    assert SimpleWorker([queue], connection=redis_client).work(burst=True)
    done = Job.fetch(job.id, connection=redis_client)
    assert done.get_status() == "finished"
    assert json.loads(done.return_value()) == ["d-a", "d-b", "d-a"]


def test_a_batch_of_redeliveries_queues_no_job(redis_server: Any, redis_client: Any) -> None:
    queue = Queue("dispatchq-test", connection=redis_client)
    template = JobTemplate(queue, FUNC, timeout=60, result_ttl=600, failure_ttl=600)
    first = template.prepare((["d-1"],), "first")
    assert _accept(redis_server, [Delivery("d-1", {"decision_id": "X"})], first) == [None]

    again = template.prepare((["d-1"],), "again")
    replies = _accept(redis_server, [Delivery("d-1", {"decision_id": "Y"})], again)

    assert replies == [{"decision_id": "X", "job": first.id}]  # the first record, unchanged
    assert queue.job_ids == [first.id]
    assert not redis_client.exists(again.key)  # no hash for a job that queues nothing


def test_a_refused_accept_writes_nothing(redis_server: Any, redis_client: Any) -> None:
    """Redis refusing the call (here: full) leaves no record and no job, so a redelivery is new."""
    queue = Queue("dispatchq-test", connection=redis_client)
    job = JobTemplate(queue, FUNC, timeout=60, result_ttl=600, failure_ttl=600).prepare((["d-full"],), "x")
    redis_client.set("ballast", "x" * 200_000)
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory", str(used - 50_000))
    try:
        with pytest.raises(redis.ResponseError, match="OOM"):
            _accept(redis_server, [Delivery("d-full", {"decision_id": "F"})], job)
    finally:
        redis_client.config_set("maxmemory", "0")
    assert ServeStorage(redis_client).delivery("d-full") is None
    assert queue.job_ids == [] and not redis_client.exists(job.key)


def test_a_typed_worker_triages_each_accepted_delivery_once_and_names_the_one_that_failed(
    redis_server: Any, redis_client: Any, tmp_path: Path
) -> None:
    """Real typed worker, real records: a redelivery riding a later batch is skipped by that
    batch's job (its first job triages it), and one bad event fails its job by name while
    the others in the same job are still triaged."""
    check, _ = counting_check(tmp_path, answer="'ok'")
    env = module_env(redis_server, tmp_path, check)
    template = JobTemplate(
        DispatchqQueue(keys.queue_name("typed"), connection=redis_client),
        DELIVERIES_JOB,
        timeout=60,
        result_ttl=600,
        failure_ttl=600,
    )
    issue = json.loads(payload("issues", "opened.payload.json"))

    def delivery(delivery_id: str, number: int, *, event: str = "issues.opened") -> Delivery:
        envelope = {
            "event": event,
            "target": f"acme/app#{number}",
            "item": f"issue:{number}",
            "context": {"repository": "acme/app"},
            "state": {"issue": {"title": f"issue {number}", "body": issue["issue"]["body"]}},
        }
        return Delivery(delivery_id, {"decision_id": f"decision-{number}", "envelope": envelope})

    first = prepare_deliveries(template, ["d-1"])
    assert _accept(redis_server, [delivery("d-1", 1)], first) == [None]
    batch = [delivery("d-1", 1), delivery("d-2", 2), delivery("d-bad", 3, event="not an event")]
    second = prepare_deliveries(template, [d.id for d in batch])
    assert _accept(redis_server, batch, second)[1:] == [None, None]

    done = run_cli(["worker", "typed", "--burst"], env, timeout=180)
    assert done.returncode == 0, done.stderr

    ok = DispatchqJob.fetch(first.id, connection=redis_client)
    assert ok.get_status() == "finished"
    assert [r["delivery"] for r in ok.return_value()] == ["d-1"]
    failed = DispatchqJob.fetch(second.id, connection=redis_client)
    assert failed.get_status() == "failed"
    why = failed.latest_result().exc_string
    assert "DeliveriesFailed: 1 of 3 deliveries failed: d-bad: UserError" in why
    assert "d-1" not in why.split("DeliveriesFailed")[-1]  # the redelivery was skipped, not failed
    # d-2 shared the failed job and was triaged all the same; d-1 once, by its first job.
    triage = TriageStorage(redis_client)
    targets = sorted(triage.decision(d)["event"]["target"] for d in triage.decision_ids())  # type: ignore[index]
    assert targets == ["acme/app#1", "acme/app#2"]
    assert len(triage.recent_runs(10)) == 2
