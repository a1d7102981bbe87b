"""The window's usage as sessions last reported it, and when a host's stored login ends.

People want to see how much of each window is used and when it resets without the CLI's TUI
(anthropics/claude-code #78476, #77018, #30764). Every session's stream already says so
(`unifiedWindows`, `allowed_warning`), so each report is kept: one small hash, a field per
window (`five_hour`, `seven_day`, ...) holding the latest utilisation, reset, when it was
reported and by which session. A report older than the stored one (two sessions finishing
out of order) never replaces it: the Lua below keeps the later `reported_at`.

A second hash keeps, per host, the `credential_expires_at` its sessions reported (a stored
claude.ai login has a hard end; a token from the environment reports none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dispatchq.core.text import as_text
from dispatchq.storage.keys import PREFIX

if TYPE_CHECKING:
    import redis

__all__ = [
    "CREDENTIAL_KEY",
    "USAGE_KEY",
    "UsageStore",
    "parse_reports",
    "read_credentials",
    "read_usage",
    "record_credential",
    "record_usage",
]

USAGE_KEY = f"{PREFIX}:window:usage"  # hash: window name -> json (utilization, resets_at, reported_at)
CREDENTIAL_KEY = f"{PREFIX}:window:credential"  # hash: host -> json (expires_at, reported_at)

# KEYS: the hash. ARGV: field, json, reported_at. Keeps the later report of a field.
_KEEP_LATER = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local ok, old = pcall(cjson.decode, cur)
  if ok and type(old) == 'table' and tonumber(old['reported_at'] or 0) > tonumber(ARGV[3]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def _keep_later(client: redis.Redis, key: str, field: str, value: Mapping[str, Any], at: float) -> bool:
    script = client.register_script(_KEEP_LATER)
    return bool(script(keys=[key], args=[field, json.dumps(dict(value)), repr(at)]))


def record_usage(
    client: redis.Redis,
    reports: Iterable[Mapping[str, Any]],
    *,
    reported_at: float,
    session: str | None,
    host: str,
) -> int:
    """Store each window's report (`window`, `utilization`, `resets_at`, `status`); how many were newer."""
    stored = 0
    for report in reports:
        window = str(report.get("window") or "")
        if not window:
            continue
        value = {
            "utilization": report.get("utilization"),
            "resets_at": report.get("resets_at"),
            "status": report.get("status"),
            "reported_at": reported_at,
            "session": session or "",
            "host": host,
        }
        stored += _keep_later(client, USAGE_KEY, window, value, reported_at)
    return stored


def read_usage(client: redis.Redis) -> dict[str, dict[str, Any]]:
    """Every window's latest report, by window name (a field that is not JSON is skipped)."""
    return _read(client, USAGE_KEY)


def record_credential(client: redis.Redis, host: str, expires_at: float, *, reported_at: float) -> bool:
    """A session on `host` reported when its stored login ends."""
    value = {"expires_at": expires_at, "reported_at": reported_at}
    return _keep_later(client, CREDENTIAL_KEY, host, value, reported_at)


def read_credentials(client: redis.Redis) -> dict[str, dict[str, Any]]:
    """Per host, when its stored login ends as last reported."""
    return _read(client, CREDENTIAL_KEY)


def _read(client: redis.Redis, key: str) -> dict[str, dict[str, Any]]:
    return parse_reports(client.hgetall(key))


def parse_reports(stored: Mapping[Any, Any]) -> dict[str, dict[str, Any]]:
    """A usage hash as read (field -> JSON), by field; a field that is not a JSON object is skipped."""
    out: dict[str, dict[str, Any]] = {}
    for field, raw in stored.items():
        try:
            value = json.loads(as_text(raw))
        except ValueError:
            continue
        if isinstance(value, dict):
            out[as_text(field)] = value
    return out


class UsageStore:
    """The window's usage as sessions reported it, and when each host's stored login ends."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def record(
        self, reports: Iterable[Mapping[str, Any]], *, reported_at: float, session: str | None, host: str
    ) -> int:
        """Keep each window's report unless a later one is stored; how many were newer."""
        return record_usage(self._redis, reports, reported_at=reported_at, session=session, host=host)

    def read(self) -> dict[str, dict[str, Any]]:
        return read_usage(self._redis)

    def record_credential(self, host: str, expires_at: float, *, reported_at: float) -> bool:
        return record_credential(self._redis, host, expires_at, reported_at=reported_at)

    def credentials(self) -> dict[str, dict[str, Any]]:
        return read_credentials(self._redis)
