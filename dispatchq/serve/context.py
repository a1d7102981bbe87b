"""What every route of `dispatchq serve` needs, in one object the app builds once.

Its own module so the routes (`judgements`, `webhooks`) and the app that mounts them all
import it from below, instead of the routes naming the app that imports them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from dispatchq.runtime import Runtime
from dispatchq.storage.connection import connect_async
from dispatchq.storage.logins import AsyncLogins
from dispatchq.storage.outage import OutageLog, wait_for_redis
from dispatchq.storage.prepared import JobTemplate
from dispatchq.storage.serve import AsyncDeliveries, ServeStorage
from dispatchq.triage.jobs import deliveries_template

__all__ = ["ServeContext"]

log = logging.getLogger("dispatchq.serve")


@dataclass
class ServeContext:
    """What every route needs: the runtime, its Redis gateway, the two secrets."""

    runtime: Runtime
    webhook_secret: str | None
    api_token: str | None
    storage: ServeStorage = field(init=False)
    #: Webhook deliveries go through the event loop's own client (`webhooks.DeliveryBatcher`).
    deliveries: AsyncDeliveries = field(init=False)
    #: The job a batch of accepted deliveries becomes, made once (`triage.jobs.deliveries_template`).
    deliveries_job: JobTemplate = field(init=False)
    #: The page's logins and the wrong-credential counts, on the event loop's own client.
    logins: AsyncLogins = field(init=False)
    _recovering: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.storage = self.runtime.storage.serve
        settings = self.runtime.settings
        self.deliveries = AsyncDeliveries(connect_async(settings), ttl=settings.result_ttl)
        self.deliveries_job = deliveries_template(self.runtime.dispatcher, settings)
        self.logins = AsyncLogins(connect_async(settings))

    def __repr__(self) -> str:
        return "ServeContext(***)"

    async def aclose(self) -> None:
        """Close the event loop's Redis clients, on that loop, when the server has stopped."""
        await self.deliveries.aclose()
        await self.logins.aclose()

    def redis_away(self, error: BaseException) -> None:
        """Note an outage: one thread (at most) waits for Redis to come back and says so."""
        if not self._recovering.acquire(blocking=False):
            return
        outage = OutageLog(self.runtime.settings.describe_redis(), log)
        outage.down(error, 0.5)

        def wait() -> None:
            try:
                wait_for_redis(self.runtime.settings, log=log, stopping=lambda: False, outage=outage)
            except Exception as failure:  # a configuration error: said, not fatal to the server
                log.warning("waiting for Redis failed: %s", type(failure).__name__)
            finally:
                self._recovering.release()

        threading.Thread(target=wait, name="dispatchq-serve-redis", daemon=True).start()
