"""`DeliveryBatcher`: deliveries arriving during an accept call ride the next one, together.

The Redis side (`AsyncDeliveries`) is replaced by a recorder that holds each call until the
test lets it go, so what is asserted is only the batcher's own logic: who rides which
call, what each waiting request is told, and what a failed call does to them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest
from rq import Queue

from dispatchq.serve.webhooks import DeliveryBatcher
from dispatchq.storage.prepared import JobTemplate, PreparedJob
from dispatchq.storage.serve import Delivery


class HeldCalls:
    """Stands in for `AsyncDeliveries`: records each call and answers when released."""

    def __init__(self, *, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[list[str], PreparedJob]] = []
        self.release = asyncio.Event()
        self.fail = fail

    async def accept(self, deliveries: list[Delivery], job: PreparedJob) -> list[dict[str, Any] | None]:
        self.calls.append(([d.id for d in deliveries], job))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        # the first copy of an id is new; a later copy in the same call is its redelivery
        seen: set[str] = set()
        out: list[dict[str, Any] | None] = []
        for delivery in deliveries:
            out.append({"job": job.id} if delivery.id in seen else None)
            seen.add(delivery.id)
        return out


def _template() -> JobTemplate:
    queue = Queue("typed", connection=fakeredis.FakeRedis())
    return JobTemplate(queue, "jobs.tiers.triage_deliveries", timeout=60, result_ttl=60, failure_ttl=60)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_deliveries_arriving_during_a_call_ride_the_next_one_together() -> None:
    async def go() -> None:
        held = HeldCalls()
        batcher = DeliveryBatcher(held, _template())  # type: ignore[arg-type]
        first = asyncio.create_task(batcher.accept(Delivery("d-0", {})))
        await _settle()
        assert [ids for ids, _ in held.calls] == [["d-0"]]  # a lone delivery is not held back
        rest = [asyncio.create_task(batcher.accept(Delivery(f"d-{i}", {}))) for i in range(1, 6)]
        await _settle()
        assert len(held.calls) == 1  # they wait for the call in flight
        held.release.set()
        assert await first is None
        assert await asyncio.gather(*rest) == [None] * 5
        assert [ids for ids, _ in held.calls] == [["d-0"], ["d-1", "d-2", "d-3", "d-4", "d-5"]]
        # each call has its own job, naming exactly the deliveries it carried
        (_, job_a), (_, job_b) = held.calls
        assert job_a.id != job_b.id
        assert batcher.calls == 2

    asyncio.run(go())


def test_a_redelivery_in_the_same_batch_is_told_it_is_one() -> None:
    async def go() -> None:
        held = HeldCalls()
        held.release.set()
        batcher = DeliveryBatcher(held, _template())  # type: ignore[arg-type]
        answers = await asyncio.gather(
            batcher.accept(Delivery("d-x", {})), batcher.accept(Delivery("d-x", {}))
        )
        assert answers[0] is None and answers[1] is not None

    asyncio.run(go())


def test_a_failed_call_fails_every_delivery_it_carried_and_the_next_call_still_runs() -> None:
    async def go() -> None:
        held = HeldCalls(fail=ConnectionError("Redis went away"))
        batcher = DeliveryBatcher(held, _template())  # type: ignore[arg-type]
        tasks = [asyncio.create_task(batcher.accept(Delivery(f"d-{i}", {}))) for i in range(3)]
        await _settle()
        held.release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        held.fail = None
        assert await batcher.accept(Delivery("d-later", {})) is None  # the batcher is not stuck

    asyncio.run(go())


def test_a_request_that_went_away_does_not_break_the_others() -> None:
    async def go() -> None:
        held = HeldCalls()
        batcher = DeliveryBatcher(held, _template())  # type: ignore[arg-type]
        first = asyncio.create_task(batcher.accept(Delivery("d-0", {})))
        await _settle()
        gone = asyncio.create_task(batcher.accept(Delivery("d-gone", {})))
        stays = asyncio.create_task(batcher.accept(Delivery("d-stays", {})))
        await _settle()
        gone.cancel()
        held.release.set()
        assert await first is None and await stays is None
        with pytest.raises(asyncio.CancelledError):
            await gone
        # the client's delivery may still be recorded: GitHub's redelivery then answers 200
        assert ["d-gone", "d-stays"] in [ids for ids, _ in held.calls]

    asyncio.run(go())


def test_a_batch_is_capped() -> None:
    async def go() -> None:
        held = HeldCalls()
        batcher = DeliveryBatcher(held, _template(), max_batch=2)  # type: ignore[arg-type]
        first = asyncio.create_task(batcher.accept(Delivery("d-0", {})))
        await _settle()
        rest = [asyncio.create_task(batcher.accept(Delivery(f"d-{i}", {}))) for i in range(1, 6)]
        await _settle()
        held.release.set()
        await asyncio.gather(first, *rest)
        assert [len(ids) for ids, _ in held.calls] == [1, 2, 2, 1]

    asyncio.run(go())
