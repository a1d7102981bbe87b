"""`codex app-server`'s `account/rateLimits/read`: the exchange dispatchq writes, and the reply it reads.

The reply below was recorded from codex-cli 0.171.0's app-server (ChatGPT login, `chatgpt_base_url`
on a loopback stand-in that served `/backend-api/wham/usage` with the 5-hour window full), at
2026-12-05 10:18 UTC (docs/codex-cli.md). Its windows become the same limits as a 429's.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from dispatchq.backends.codex_appserver import READ_ID, rate_limits_requests, rate_limits_result
from dispatchq.window.codex_limits import limits_from_windows, windows_from_rate_limits

RECORDED = [
    '{"id":0,"result":{"userAgent":"dispatchq_probe/0.171.0 (Debian 12.0.0; x86_64) unknown '
    '(dispatchq_probe; 0.0.1)",'
    '"codexHome":"/root/codex-probe-home","platformFamily":"unix","platformOs":"linux"}}',
    '{"method":"remoteControl/status/changed","params":{"status":"disabled","serverName":"vm",'
    '"installationId":"6a4bf4c3-047f-4f1b-b5a6-6bf7ff72a44b","environmentId":null},"emittedAtMs":1796465923780}',
    '{"id":1,"result":{"ordinaryUsageAllowed":null,"rateLimits":{"limitId":"codex","limitName":null,'
    '"normalModelSlug":null,"primary":{"usedPercent":100,"windowDurationMins":300,"resetsAt":1796469524},'
    '"secondary":{"usedPercent":41,"windowDurationMins":10080,"resetsAt":1796552324},"credits":{"hasCredits":false,'
    '"unlimited":false,"balance":"0"},"individualLimit":null,"spendControlReached":null,"planType":"plus",'
    '"rateLimitReachedType":null},"rateLimitsByLimitId":{"codex":{"limitId":"codex","limitName":null,'
    '"normalModelSlug":null,"primary":{"usedPercent":100,"windowDurationMins":300,"resetsAt":1796469524},'
    '"secondary":{"usedPercent":41,"windowDurationMins":10080,"resetsAt":1796552324},"credits":{"hasCredits":false,'
    '"unlimited":false,"balance":"0"},"individualLimit":null,"spendControlReached":null,"planType":"plus",'
    '"rateLimitReachedType":null}},"rateLimitResetCredits":null,"accountId":null,"rateLimitUpsell":null}}',
]
NOW = datetime(2026, 12, 5, 10, 18, 44, tzinfo=UTC)


def test_the_exchange_initializes_then_reads() -> None:
    first, then = rate_limits_requests()
    initialize = json.loads(first)
    assert initialize["method"] == "initialize" and initialize["params"]["clientInfo"]["name"] == "dispatchq"
    assert first.endswith("\n") and "jsonrpc" not in first  # the wire leaves the header out
    messages = [json.loads(line) for line in then.splitlines()]
    assert messages == [{"method": "initialized"}, {"method": "account/rateLimits/read", "id": READ_ID}]


def test_the_recorded_reply_closes_the_full_window_at_its_reset() -> None:
    result = rate_limits_result(RECORDED)
    assert result is not None
    (signal,) = limits_from_windows(windows_from_rate_limits(result), now=NOW, unknown_reset=900.0)
    assert (signal.kind, signal.scope) == ("five_hour", "general")
    assert signal.lifts_at == datetime.fromtimestamp(1796469524, UTC)
    assert signal.source == "event"


def test_an_error_or_no_reply_is_no_reading() -> None:
    assert (
        rate_limits_result(['{"id":1,"error":{"code":-32600,"message":"chatgpt authentication required"}}'])
        is None
    )
    assert rate_limits_result(RECORDED[:2]) is None
    assert (
        rate_limits_result(["not json", '{"method":"account/rateLimits/updated","id":1,"params":{}}']) is None
    )
