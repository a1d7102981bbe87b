"""The TypeSafe provider the provider tests build against the loopback fake API, with fast retries."""

from __future__ import annotations

from typing import Any

from dispatchq.testing.typesafe import FakeTypeSafeAPI
from dispatchq.tiers.typed.protocol import ProviderOptions
from dispatchq.tiers.typed.provider import TypeSafeProvider

__all__ = ["FAST", "provider_for"]


# Fast retries: the fake advises retry-after-ms 10, and un-advised backoff is a few ms.
FAST = {"backoff_initial": 0.01, "backoff_max": 0.02}


def provider_for(api: FakeTypeSafeAPI, **options: Any) -> TypeSafeProvider:
    return TypeSafeProvider(api.api_key, base_url=api.url, options=ProviderOptions(**{**FAST, **options}))
