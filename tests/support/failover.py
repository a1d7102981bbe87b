"""The replication guard the HA failover tests give their primary."""

from __future__ import annotations

__all__ = ["GUARDED"]


GUARDED = ("min-replicas-to-write 1", "min-replicas-max-lag 10")
