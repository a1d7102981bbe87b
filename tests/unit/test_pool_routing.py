"""Routing a judgement among the pool's credentials: who may take it, in what order, and the
reason a judgement with none reads (pure, over what the window read)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from dispatchq.core.priority import Priority
from dispatchq.core.waiting import reason_class
from dispatchq.pools.credentials import Credential, Serves, SpendCap
from dispatchq.pools.routing import (
    PACING_MARGIN,
    Closure,
    CredentialState,
    Refusal,
    Route,
    WindowUse,
    ahead_of_pace,
    elapsed_share,
    route,
    utilisation,
    waiting_reason,
    weekly_reset,
)
from dispatchq.window.marker import Marker
from dispatchq.window.marker import waiting_reason as marker_waiting_reason
from dispatchq.window.messages import limit_kind


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


NOW = _at("2026-12-05T12:00:00+00:00")
HOUR = 3600.0
DAY = 24 * HOUR
CAP = SpendCap(day=20.0, month=300.0)


def _sub(name: str, **fields: object) -> CredentialState:
    """A subscription credential's state; `fields` are the credential's, then the state's."""
    return _state(Credential(name), fields)


def _metered(name: str, **fields: object) -> CredentialState:
    cred = Credential(name, variable="ANTHROPIC_API_KEY", billing="metered", spend_cap=CAP)
    return _state(cred, {"estimate": 1.0, **fields})


def _state(cred: Credential, fields: dict[str, object]) -> CredentialState:
    own = {k: v for k, v in fields.items() if k in Credential.__dataclass_fields__}
    rest = {k: v for k, v in fields.items() if k not in own}
    return CredentialState(replace(cred, **own), **rest)  # type: ignore[arg-type]


def _five_hour(used: float, resets_in: float, reported_ago: float = 0.0) -> WindowUse:
    return WindowUse("five_hour", used, NOW + resets_in, NOW - reported_ago)


def _weekly(
    used: float | None, resets_in: float, window: str = "seven_day", reported_ago: float = 0.0
) -> WindowUse:
    return WindowUse(window, used, NOW + resets_in, NOW - reported_ago)


def _names(r: Route) -> list[str]:
    return [c.name for c in r.usable]


# An hour before its reset a five-hour window is 80 % through: 0.5 used is well behind pace.
BEHIND = _five_hour(0.5, 1 * HOUR)
# Four hours before its reset it is 20 % through: 0.6 used is 40 points ahead.
AHEAD = _five_hour(0.6, 4 * HOUR)


@pytest.mark.parametrize(
    ("states", "usable", "margin"),
    [
        pytest.param(
            [_metered("api"), _sub("max", order=5)], ["max", "api"], PACING_MARGIN, id="subscription-first"
        ),
        pytest.param(
            [_metered("api", order=-3), _sub("max", usage=(AHEAD,))],
            ["max", "api"],
            PACING_MARGIN,
            id="a-paced-subscription-still-before-metered",
        ),
        pytest.param([_sub("a", order=2), _sub("b", order=1)], ["b", "a"], PACING_MARGIN, id="order"),
        pytest.param(
            [_sub("a", usage=(_weekly(0.1, 3 * DAY),)), _sub("b", usage=(_weekly(0.9, 1 * DAY),))],
            ["b", "a"],
            PACING_MARGIN,
            id="drain-soonest",
        ),
        pytest.param(
            [
                _sub("unknown"),
                _sub("later", usage=(_weekly(None, 5 * DAY),)),
                _sub("sooner", usage=(_weekly(None, 2 * DAY, "seven_day_opus"),)),
            ],
            ["sooner", "later", "unknown"],
            PACING_MARGIN,
            id="drain-soonest-any-weekly-window-unknown-last",
        ),
        pytest.param(
            [
                _sub("a", order=1, usage=(_weekly(0.1, 1 * DAY),)),
                _sub("b", order=0, usage=(_weekly(0.1, 6 * DAY),)),
            ],
            ["b", "a"],
            PACING_MARGIN,
            id="order-before-drain-soonest",
        ),
        pytest.param(
            [_sub("a", usage=(BEHIND,)), _sub("b", usage=(_five_hour(0.2, 1 * HOUR),))],
            ["b", "a"],
            PACING_MARGIN,
            id="lowest-utilisation",
        ),
        pytest.param(
            [_sub("reported", usage=(_five_hour(0.2, 1 * HOUR),)), _sub("never")],
            ["never", "reported"],
            PACING_MARGIN,
            id="unreported-utilisation-counts-as-unused",
        ),
        pytest.param(
            [_sub("a", usage=(AHEAD,)), _sub("b", order=3)],
            ["b", "a"],
            PACING_MARGIN,
            id="pacing-yields",
        ),
        pytest.param(
            [_sub("a", pacing=False, usage=(AHEAD,)), _sub("b", order=3)],
            ["a", "b"],
            PACING_MARGIN,
            id="pacing-off",
        ),
        pytest.param(
            [_sub("a", usage=(AHEAD,)), _sub("b", order=3, usage=(_five_hour(0.7, 4 * HOUR),))],
            ["a", "b"],
            PACING_MARGIN,
            id="all-ahead-fall-back-to-order",
        ),
        pytest.param(
            [_sub("a", usage=(_five_hour(0.25, 4 * HOUR),)), _sub("b", order=3)],
            ["a", "b"],
            PACING_MARGIN,
            id="within-the-margin-does-not-yield",
        ),
        pytest.param(
            [_sub("a", usage=(_five_hour(0.25, 4 * HOUR),)), _sub("b", order=3)],
            ["b", "a"],
            0.0,
            id="a-smaller-margin-yields",
        ),
        pytest.param(
            [_sub("a", usage=(_five_hour(0.99, 4 * HOUR, reported_ago=6 * HOUR),)), _sub("b", order=3)],
            ["a", "b"],
            PACING_MARGIN,
            id="stale-report-older-than-its-window-ignored",
        ),
        pytest.param(
            [
                _sub("a", usage=(WindowUse("five_hour", 0.98, NOW - 60, NOW - HOUR),)),
                _sub("b", usage=(BEHIND,)),
            ],
            ["a", "b"],
            PACING_MARGIN,
            id="report-of-a-window-since-reset-ignored",
        ),
        pytest.param(
            [
                _sub("a", usage=(_weekly(0.1, 1 * DAY, reported_ago=8 * DAY),)),
                _sub("b", usage=(_weekly(0.1, 3 * DAY),)),
            ],
            ["b", "a"],
            PACING_MARGIN,
            id="stale-weekly-reset-ignored",
        ),
        pytest.param(
            [_sub("a", usage=(WindowUse("overage", 0.99, NOW + HOUR, NOW),)), _sub("b", usage=(BEHIND,))],
            ["a", "b"],
            PACING_MARGIN,
            id="a-window-of-unknown-length-says-nothing",
        ),
        pytest.param([_sub("y"), _sub("x")], ["y", "x"], PACING_MARGIN, id="pool-order-among-equals"),
        pytest.param(
            [_metered("m1", order=2), _metered("m2", order=1), _sub("s")],
            ["s", "m2", "m1"],
            PACING_MARGIN,
            id="metered-by-order",
        ),
    ],
)
def test_routing_order(states: list[CredentialState], usable: list[str], margin: float) -> None:
    r = route(states, priority="normal", kind="review", now=NOW, margin=margin)
    assert _names(r) == usable
    assert r.refusals == ()
    assert not r.waits


LIFT = _at("2026-12-05T15:00:00+00:00")
CLOSED_5H = Closure("five_hour", LIFT)


@pytest.mark.parametrize(
    ("state", "priority", "kind", "refusal"),
    [
        pytest.param(
            _metered("api", serves=Serves(priority="urgent")),
            "normal",
            "review",
            Refusal("api", "kept for urgent judgements", cause="serves"),
            id="serves-floor",
        ),
        pytest.param(
            _metered("api", serves=Serves(priority="urgent")), "urgent", "review", None, id="serves-floor-met"
        ),
        pytest.param(
            _sub("s", serves=Serves(priority="normal")),
            "background",
            "review",
            Refusal("s", "kept for urgent and normal judgements", cause="serves"),
            id="serves-normal-floor",
        ),
        pytest.param(
            _sub("s", serves=Serves(priority="normal")), None, "review", None, id="no-priority-is-normal"
        ),
        pytest.param(
            _sub("s", serves=Serves(kinds=("review",))),
            "urgent",
            "sweep",
            Refusal("s", "not for kind sweep", cause="serves"),
            id="serves-kinds",
        ),
        pytest.param(
            _sub("s", serves=Serves(kinds=("review",))), "background", "review", None, id="serves-kind-met"
        ),
        pytest.param(
            _sub("s", blocked="authentication failed (401)", closures=(CLOSED_5H,)),
            "normal",
            "review",
            Refusal("s", "blocked: authentication failed (401)", cause="blocked"),
            id="blocked",
        ),
        pytest.param(
            _sub("s", closures=(CLOSED_5H,)),
            "normal",
            "review",
            Refusal("s", "closed until 2026-12-05 15:00 UTC (five_hour)", until=LIFT, limit="five_hour"),
            id="closed",
        ),
        pytest.param(
            _sub("s", closures=(Closure("five_hour", NOW),)), "normal", "review", None, id="lifted-at-now"
        ),
        pytest.param(
            _sub(
                "s", closures=(CLOSED_5H, Closure("seven_day", LIFT + 2 * DAY), Closure("operator", NOW - 1))
            ),
            "normal",
            "review",
            Refusal(
                "s", "closed until 2026-12-07 15:00 UTC (seven_day)", until=LIFT + 2 * DAY, limit="seven_day"
            ),
            id="the-latest-lift-is-named",
        ),
        pytest.param(
            _sub("s", reserve_urgent=True, closures=(Closure("reserved", LIFT),)),
            "urgent",
            "review",
            None,
            id="reserve-urgent-admits-urgent",
        ),
        pytest.param(
            _sub("s", reserve_urgent=True, closures=(Closure("reserved", LIFT),)),
            "normal",
            "review",
            Refusal("s", "closed until 2026-12-05 15:00 UTC (reserved)", until=LIFT, limit="reserved"),
            id="reserve-urgent-holds-normal",
        ),
        pytest.param(
            _sub("s", closures=(Closure("reserved", LIFT),)),
            "urgent",
            "review",
            Refusal("s", "closed until 2026-12-05 15:00 UTC (reserved)", until=LIFT, limit="reserved"),
            id="reserve-kept-for-people",
        ),
        pytest.param(
            _sub("s", reserve_urgent=True, closures=(Closure("reserved", LIFT + HOUR), CLOSED_5H)),
            "urgent",
            "review",
            Refusal("s", "closed until 2026-12-05 15:00 UTC (five_hour)", until=LIFT, limit="five_hour"),
            id="reserve-urgent-does-not-open-a-limit",
        ),
        pytest.param(
            _sub("s", concurrency=2, slots_used=2),
            "normal",
            "review",
            Refusal("s", "all 2 session slot(s) busy", hard=False, cause="busy"),
            id="busy",
        ),
        pytest.param(_sub("s", concurrency=2, slots_used=1), "normal", "review", None, id="a-slot-free"),
        pytest.param(
            _sub("s", concurrency=2, slots_used=2, closures=(CLOSED_5H,)),
            "normal",
            "review",
            Refusal("s", "closed until 2026-12-05 15:00 UTC (five_hour)", until=LIFT, limit="five_hour"),
            id="closed-before-busy",
        ),
        pytest.param(
            _metered("api", spend_cap=None),
            "urgent",
            "review",
            Refusal("api", "no spend cap", cause="cap"),
            id="metered-without-cap",
        ),
        pytest.param(
            _metered("api", spent_day=19.5, spent_month=19.5),
            "urgent",
            "review",
            Refusal("api", "today's $20.00 cap reached", until=_at("2026-12-06T00:00:00+00:00"), cause="cap"),
            id="day-cap",
        ),
        pytest.param(
            _metered("api", spent_day=19.0, spent_month=19.0),
            "urgent",
            "review",
            None,
            id="cap-exactly-filled",
        ),
        pytest.param(
            _metered("api", spent_day=2.0, spent_month=299.5),
            "urgent",
            "review",
            Refusal(
                "api", "this month's $300.00 cap reached", until=_at("2027-01-01T00:00:00+00:00"), cause="cap"
            ),
            id="month-cap",
        ),
        pytest.param(
            _metered("api", spend_cap=SpendCap(day=5.0), spent_day=12.0, spent_month=12.0, estimate=0.0),
            "urgent",
            "review",
            Refusal("api", "today's $5.00 cap reached", until=_at("2026-12-06T00:00:00+00:00"), cause="cap"),
            id="cap-lowered-below-spend",
        ),
        pytest.param(
            _sub("s", spend_cap=SpendCap(day=1.0), spent_day=50.0, spent_month=50.0, estimate=1.0),
            "normal",
            "review",
            None,
            id="subscription-never-cap-refused",
        ),
        pytest.param(
            _metered("api", spent_day=20.0, spent_month=20.0, concurrency=1, slots_used=1),
            "urgent",
            "review",
            Refusal("api", "today's $20.00 cap reached", until=_at("2026-12-06T00:00:00+00:00"), cause="cap"),
            id="cap-before-busy",
        ),
    ],
)
def test_refusals(
    state: CredentialState, priority: Priority | None, kind: str, refusal: Refusal | None
) -> None:
    r = route([state], priority=priority, kind=kind, now=NOW)
    if refusal is None:
        assert _names(r) == [state.credential.name]
        assert r.refusals == ()
    else:
        assert r.usable == ()
        assert r.refusals == (refusal,)


def test_refusals_read_in_the_zone() -> None:
    r = route(
        [_sub("s", closures=(CLOSED_5H,))], priority=None, kind="review", now=NOW, timezone="Europe/Berlin"
    )
    assert r.refusals[0].why == "closed until 2026-12-05 16:00 CET (five_hour)"
    day = route(
        [_metered("api", spent_day=20.0)], priority="urgent", kind="k", now=NOW, timezone="Europe/Berlin"
    )
    assert day.refusals[0].until == _at("2026-12-06T00:00:00+01:00")


@pytest.mark.parametrize(
    ("states", "waits", "waiting", "opens_at"),
    [
        pytest.param([_sub("a"), _sub("b", closures=(CLOSED_5H,))], False, False, None, id="one-open"),
        pytest.param(
            [_sub("a", closures=(CLOSED_5H,)), _sub("b", closures=(Closure("seven_day", LIFT + DAY),))],
            True,
            True,
            LIFT,
            id="all-closed",
        ),
        pytest.param(
            [_sub("a", closures=(CLOSED_5H,)), _sub("b", slots_used=1)],
            True,
            False,
            LIFT,
            id="one-busy-is-queued-not-waiting",
        ),
        pytest.param(
            [_sub("a", blocked="401"), _metered("api", serves=Serves(priority="urgent"))],
            True,
            True,
            None,
            id="nothing-lifts-by-itself",
        ),
        pytest.param(
            [
                _metered("api", serves=Serves(priority="urgent"), slots_used=1),
                _sub("a", closures=(CLOSED_5H,)),
            ],
            True,
            True,
            LIFT,
            id="a-busy-one-it-may-not-use-does-not-count",
        ),
    ],
)
def test_route_waits(
    states: list[CredentialState], waits: bool, waiting: bool, opens_at: float | None
) -> None:
    r = route(states, priority="normal", kind="review", now=NOW)
    assert (r.waits, r.waiting, r.opens_at) == (waits, waiting, opens_at)


def test_every_credential_is_usable_or_refused_once() -> None:
    states = [
        _sub("a", closures=(CLOSED_5H,)),
        _sub("b"),
        _metered("c", serves=Serves(priority="urgent")),
        _metered("d"),
        _sub("e", slots_used=1),
    ]
    r = route(states, priority="normal", kind="review", now=NOW)
    assert _names(r) == ["b", "d"]
    assert [x.credential for x in r.refusals] == ["a", "c", "e"]


# --- waiting reasons -----------------------------------------------------------------------
def _marker(kind: str, lifts_at: float) -> Marker:
    return Marker(
        scope="general",
        lifts_at=lifts_at,
        state="closed",
        kind=limit_kind(kind),
        message="",
        session=None,
        set_at=NOW,
        stated="unknown",
        refusals=0,
        source="session",
    )


@pytest.mark.parametrize(
    "closures",
    [
        pytest.param([("five_hour", LIFT)], id="five-hour"),
        pytest.param([("seven_day", LIFT + 3 * DAY + 17 * 60)], id="seven-day"),
        pytest.param([("seven_day_opus", LIFT + 59)], id="model-weekly"),
        pytest.param([("reserved", LIFT)], id="reserve"),
        pytest.param(
            [("five_hour", LIFT), ("seven_day", LIFT + DAY), ("operator", LIFT - HOUR)], id="several"
        ),
    ],
)
def test_single_reason_reads_as_the_marker_s(closures: list[tuple[str, float]]) -> None:
    """With one credential the reason is the one a closed marker has always given."""
    state = _sub("default", closures=tuple(Closure(k, t) for k, t in closures))
    r = route([state], priority="normal", kind="review", now=NOW)
    latest = max((_marker(k, t) for k, t in closures), key=lambda m: m.lifts_at)
    assert waiting_reason(r, single=True) == marker_waiting_reason(latest)


@pytest.mark.parametrize(
    ("states", "single", "timezone", "reason"),
    [
        pytest.param(
            [
                _sub("team-max", closures=(CLOSED_5H,)),
                _metered("api-overflow", spent_day=20.0, spent_month=20.0),
            ],
            False,
            "UTC",
            "usage window: team-max closed until 2026-12-05 15:00 UTC (five_hour); "
            "api-overflow: today's $20.00 cap reached",
            id="closed-and-spent",
        ),
        pytest.param(
            [
                _sub("team-max", closures=(CLOSED_5H,)),
                _metered("api-overflow", serves=Serves(priority="urgent")),
            ],
            False,
            "UTC",
            "usage window: team-max closed until 2026-12-05 15:00 UTC (five_hour)",
            id="one-it-may-not-use-is-not-named",
        ),
        pytest.param(
            [_sub("team-max", closures=(CLOSED_5H,)), _sub("seat-2", blocked="authentication failed")],
            False,
            "Europe/Berlin",
            "usage window: team-max closed until 2026-12-05 16:00 CET (five_hour); "
            "seat-2: blocked: authentication failed",
            id="in-the-zone",
        ),
        pytest.param(
            [_metered("api", serves=Serves(priority="urgent")), _sub("s", serves=Serves(kinds=("sweep",)))],
            False,
            "UTC",
            "usage window: api: kept for urgent judgements; s: not for kind review",
            id="none-it-may-use-names-all",
        ),
        pytest.param(
            [_sub("default", closures=(CLOSED_5H,))],
            True,
            "America/New_York",
            "usage window closed until 2026-12-05 10:00 EST (five_hour)",
            id="single-in-the-zone",
        ),
        pytest.param(
            [_sub("default", blocked="authentication failed")],
            True,
            "UTC",
            "usage window: blocked: authentication failed",
            id="single-not-a-closure",
        ),
        pytest.param([], True, "UTC", "usage window: no credential in the pool", id="empty"),
    ],
)
def test_waiting_reasons(states: list[CredentialState], single: bool, timezone: str, reason: str) -> None:
    r = route(states, priority="normal", kind="review", now=NOW)
    text = waiting_reason(r, single=single, timezone=timezone)
    assert text == reason
    assert text.startswith("usage window")
    assert reason_class(text) == "window"


# --- pacing arithmetic ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("use", "share", "ahead"),
    [
        pytest.param(_five_hour(0.6, 4 * HOUR), 0.2, True, id="early-and-heavy"),
        pytest.param(_five_hour(0.5, 1 * HOUR), 0.8, False, id="late-and-light"),
        pytest.param(_five_hour(0.9, 1 * HOUR), 0.8, False, id="at-the-margin-is-not-ahead"),
        pytest.param(_five_hour(0.91, 1 * HOUR), 0.8, True, id="past-the-margin"),
        pytest.param(_weekly(0.6, 3.5 * DAY), 0.5, False, id="weekly-half-through"),
        pytest.param(_weekly(0.7, 3.5 * DAY, "seven_day_fable"), 0.5, True, id="a-model-week"),
        pytest.param(_five_hour(0.2, 6 * HOUR), 0.0, True, id="reset-further-than-a-window-clamps"),
        pytest.param(WindowUse("five_hour", 0.9, None, NOW), None, False, id="no-reset"),
        pytest.param(WindowUse("five_hour", None, NOW + HOUR, NOW), 0.8, False, id="no-utilisation"),
        pytest.param(WindowUse("five_hour", 0.9, NOW + HOUR, None), 0.8, False, id="no-report-time"),
        pytest.param(_five_hour(0.99, 4 * HOUR, reported_ago=5 * HOUR + 1), None, False, id="stale"),
        pytest.param(WindowUse("five_hour", 0.99, NOW, NOW - 60), None, False, id="reset-at-now"),
        pytest.param(WindowUse("monthly", 0.99, NOW + HOUR, NOW), None, False, id="unknown-window"),
    ],
)
def test_pace(use: WindowUse, share: float | None, ahead: bool) -> None:
    got = elapsed_share(use, NOW)
    assert got == (pytest.approx(share) if share is not None else None)
    assert ahead_of_pace(use, NOW) is ahead


def test_utilisation_and_weekly_reset_read_only_fresh_reports() -> None:
    usage = (
        _five_hour(0.4, HOUR),
        _five_hour(0.97, HOUR, reported_ago=6 * HOUR),
        _weekly(0.3, 2 * DAY),
        _weekly(0.8, DAY, "seven_day_opus", reported_ago=8 * DAY),
        _weekly(0.2, 3 * DAY, "seven_day_opus"),
    )
    assert utilisation(usage, NOW) == pytest.approx(0.4)
    assert weekly_reset(usage, NOW) == NOW + 2 * DAY
    assert utilisation((), NOW) == 0.0
    assert weekly_reset((_five_hour(0.1, HOUR),), NOW) is None
