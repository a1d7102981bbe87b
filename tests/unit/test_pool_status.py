"""The pool as `status` shows it (`window.poolstatus`): each credential's state, and the backlog's
estimated drain from the measured rate (pure, table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatchq.core.status import BacklogPart, PoolCredential
from dispatchq.pools.credentials import Credential, Pool, SpendCap
from dispatchq.storage.pools import StoredPoolState
from dispatchq.window.limits import limit_kind
from dispatchq.window.marker import Marker
from dispatchq.window.poolstatus import (
    RATE_MIN_MINUTES,
    MinuteSample,
    credential_line,
    credential_rows,
    drain_estimate,
    drain_start,
    measured_rate,
    minutes_of,
    pool_lines,
)

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0

SUB = Credential("team-max", concurrency=2)
API = Credential(
    "api-overflow",
    variable="ANTHROPIC_API_KEY",
    file="/etc/dispatchq/anthropic",
    billing="metered",
    spend_cap=SpendCap(day=20.0, month=300.0),
)


def _marker(scope: str, kind: str, lifts_at: float, state: str = "closed") -> Marker:
    return Marker(
        scope=scope,
        lifts_at=lifts_at,
        state=state,
        kind=limit_kind(kind),
        message="",
        session=None,
        set_at=NOW - HOUR,
        stated="unknown",
        refusals=1,
        source="session",
    )


def _held(
    slots: int = 0, day: float = 0.0, month: float = 0.0, blocked: str | None = None
) -> StoredPoolState:
    return StoredPoolState(slots_used=slots, spent_day=day, spent_month=month, recent=(), blocked=blocked)


def _row(
    credential: Credential,
    *,
    markers: tuple[Marker, ...] = (),
    held: StoredPoolState | None = None,
    running: tuple[str | None, ...] = (),
) -> PoolCredential:
    (row,) = credential_rows(
        Pool((credential,)),
        list(markers),
        stored={credential.name: held} if held is not None else {},
        usage={},
        running=running,
        now=NOW,
        timezone="UTC",
    )
    return row


# --- a credential's state ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("credential", "markers", "held", "running", "state", "why", "lifts"),
    [
        pytest.param(SUB, (), None, (), "open", "open", None, id="open"),
        pytest.param(
            SUB,
            (_marker("team-max/general", "five_hour", NOW + 3 * HOUR),),
            _held(),
            (),
            "closed",
            "closed until 2026-12-05 15:00 UTC (five_hour)",
            NOW + 3 * HOUR,
            id="closed-names-the-limit",
        ),
        pytest.param(
            SUB,
            (
                _marker("team-max/general", "five_hour", NOW + HOUR),
                _marker("team-max/weekly", "seven_day", NOW + 30 * HOUR),
            ),
            _held(),
            (),
            "closed",
            "closed until 2026-12-06 18:00 UTC (seven_day)",
            NOW + 30 * HOUR,
            id="closed-until-the-later-lift",
        ),
        pytest.param(
            SUB,
            (_marker("team-max/general", "five_hour", NOW - 60, state="probing"),),
            _held(),
            (),
            "probing",
            "lifted at 2026-12-05 11:59 UTC: one probe session goes first",
            None,
            id="lifted-probing",
        ),
        pytest.param(
            SUB,
            (_marker("team-max/general", "five_hour", NOW + HOUR),),
            _held(blocked="401 invalid token"),
            (),
            "blocked",
            "blocked: 401 invalid token",
            None,
            id="blocked-before-closed",
        ),
        pytest.param(
            SUB,
            (),
            _held(slots=2),
            ("team-max", "team-max"),
            "busy",
            "all 2 session slot(s) busy",
            None,
            id="busy",
        ),
        pytest.param(
            SUB,
            (_marker("general", "five_hour", NOW + HOUR),),
            None,
            (),
            "open",
            "open",
            None,
            id="another-credential-s-marker-is-not-its-own",
        ),
        pytest.param(
            API,
            (),
            _held(day=19.5, month=40.0),
            (),
            "spent",
            "today's $20.00 cap reached",
            datetime(2026, 12, 6, tzinfo=UTC).timestamp(),
            id="spent-today-opens-tomorrow",
        ),
        pytest.param(
            API,
            (),
            _held(day=1.0, month=300.0),
            (),
            "spent",
            "this month's $300.00 cap reached",
            datetime(2027, 1, 1, tzinfo=UTC).timestamp(),
            id="spent-this-month",
        ),
        pytest.param(API, (), _held(day=3.1, month=3.1), (), "open", "open", None, id="metered-with-room"),
    ],
)
def test_credential_state(
    credential: Credential,
    markers: tuple[Marker, ...],
    held: StoredPoolState | None,
    running: tuple[str | None, ...],
    state: str,
    why: str,
    lifts: float | None,
) -> None:
    row = _row(credential, markers=markers, held=held, running=running)
    assert (row.state, row.why, row.lifts_at_epoch) == (state, why, lifts)
    assert [m.scope for m in row.markers] == [m.scope for m in markers if m.credential == credential.name]


def test_a_row_counts_its_sessions_and_spend_and_reads_its_windows() -> None:
    usage = {
        "team-max/five_hour": {"utilization": 0.83, "resets_at": NOW + 3 * HOUR, "reported_at": NOW - 240},
        "five_hour": {"utilization": 0.1, "resets_at": NOW + HOUR, "reported_at": NOW},
    }
    rows = credential_rows(
        Pool((SUB, API)),
        [],
        stored={"team-max": _held(slots=1), "api-overflow": _held(day=3.1, month=12.0)},
        usage=usage,
        running=["team-max", "api-overflow", "team-max", None],
        now=NOW,
        timezone="UTC",
    )
    sub, api = rows
    assert (sub.running, api.running) == (2, 1)  # a session written before pools is default's
    assert [(w.window, w.utilization, w.age_seconds) for w in sub.windows] == [("five_hour", 0.83, 240)]
    assert sub.windows[0].resets_at == "2026-12-05T15:00:00+00:00"
    assert api.windows == []
    assert (api.spend.day, api.spend.month, api.spend.cap_day, api.spend.cap_month) == (
        3.1,
        12.0,
        20.0,
        300.0,
    )
    assert (sub.spend.cap_day, sub.spend.cap_month) == (None, None)
    assert (sub.state, api.state) == ("busy", "busy")  # their sessions hold every slot
    line = credential_line(sub, now=NOW, timezone="UTC")
    assert (
        line
        == "team-max: all 2 session slot(s) busy · 2 running of 2 · five_hour 83% (resets 15:00, 4 min ago)"
    )
    assert credential_line(api, now=NOW, timezone="UTC") == (
        "api-overflow: all 1 session slot(s) busy · 1 running of 1 · "
        "spend today $3.10 of $20.00, this month $12.00 of $300.00"
    )


def test_a_closed_line_reads_its_lift_as_a_clock() -> None:
    row = _row(SUB, markers=(_marker("team-max/general", "five_hour", NOW + 3 * HOUR),), held=_held())
    assert credential_line(row, now=NOW, timezone="UTC").startswith(
        "team-max: closed until 15:00 (five_hour) · "
    )


def test_status_prints_credentials_only_for_a_pool() -> None:
    backlog = BacklogPart(waiting=0, drain_text="nothing waiting")
    single = [_row(Credential("default"))]
    assert pool_lines(single, backlog, now=NOW, timezone="UTC") == ["session backlog: nothing waiting"]
    metered = [_row(API)]
    assert pool_lines(metered, backlog, now=NOW, timezone="UTC")[0].startswith(
        "credential api-overflow: open"
    )
    two = [_row(SUB), _row(API)]
    assert len(pool_lines(two, backlog, now=NOW, timezone="UTC")) == 3


# --- the measured rate --------------------------------------------------------------------------
def _minutes(n: int, answered: int, closed: bool = False) -> list[MinuteSample]:
    return [MinuteSample(at=NOW - (n - i) * 60, answered=answered, closed=closed) for i in range(n)]


@pytest.mark.parametrize(
    ("minutes", "rate", "hours"),
    [
        pytest.param([], None, 0.0, id="no-history"),
        pytest.param(_minutes(RATE_MIN_MINUTES - 1, 3), None, (RATE_MIN_MINUTES - 1) / 60, id="too-few"),
        pytest.param(_minutes(60, 0), None, 1.0, id="none-answered"),
        pytest.param(_minutes(60, 1), 60.0, 1.0, id="one-a-minute"),
        pytest.param(_minutes(120, 0) + _minutes(60, 2), 40.0, 3.0, id="idle-open-minutes-count"),
        pytest.param(
            _minutes(240, 0, closed=True) + _minutes(30, 1), 60.0, 0.5, id="closed-minutes-left-out"
        ),
    ],
)
def test_measured_rate(minutes: list[MinuteSample], rate: float | None, hours: float) -> None:
    assert measured_rate(minutes) == (pytest.approx(rate) if rate is not None else None, pytest.approx(hours))


def test_the_history_s_rows_become_minutes_and_a_gap_is_none() -> None:
    rows = [
        {"at": NOW - 120, "gap": False, "closed": False, "answered:session": 4},
        {"at": NOW - 60, "gap": True},
        {"at": NOW, "gap": False, "closed": True, "answered:session": 0},
    ]
    assert minutes_of(rows) == [
        MinuteSample(at=NOW - 120, answered=4, closed=False),
        MinuteSample(at=NOW, answered=0, closed=True),
    ]


# --- when the drain starts, and when it ends -----------------------------------------------------
def _states(*pairs: tuple[str, float | None]) -> list[PoolCredential]:
    return [
        PoolCredential(name=f"c{i}", state=state, lifts_at_epoch=lifts)  # type: ignore[arg-type]
        for i, (state, lifts) in enumerate(pairs)
    ]


@pytest.mark.parametrize(
    ("states", "start"),
    [
        pytest.param(_states(("open", None)), NOW, id="open-now"),
        pytest.param(_states(("closed", NOW + HOUR), ("busy", None)), NOW, id="busy-counts-as-taking"),
        pytest.param(_states(("closed", NOW + HOUR), ("probing", None)), NOW, id="probing-counts-as-taking"),
        pytest.param(
            _states(("closed", NOW + 3 * HOUR), ("spent", NOW + HOUR)), NOW + HOUR, id="earliest-lift"
        ),
        pytest.param(
            _states(("closed", NOW + 2 * HOUR), ("blocked", None)), NOW + 2 * HOUR, id="blocked-ignored"
        ),
        pytest.param(_states(("blocked", None)), None, id="all-blocked"),
        pytest.param(_states(("closed", NOW - 5)), NOW, id="a-past-lift-is-now"),
    ],
)
def test_drain_start(states: list[PoolCredential], start: float | None) -> None:
    assert drain_start(states, NOW) == start


@pytest.mark.parametrize(
    ("waiting", "rate", "start", "drain_at", "text"),
    [
        pytest.param(0, 10.0, NOW, None, "nothing waiting", id="nothing"),
        pytest.param(
            412, None, NOW, None, "412 waiting: no estimate yet (no session rate measured)", id="no-rate"
        ),
        pytest.param(
            412, 0.0, NOW, None, "412 waiting: no estimate yet (no session rate measured)", id="zero-rate"
        ),
        pytest.param(
            412, 10.0, None, None, "412 waiting: no estimate (no credential opens by itself)", id="no-start"
        ),
        pytest.param(
            412, 53.0, NOW, NOW + 412 / 53.0 * HOUR, "412 waiting: ~19:46 at today's rate", id="from-now"
        ),
        pytest.param(
            10,
            20.0,
            NOW + 3 * HOUR,
            NOW + 3.5 * HOUR,
            "10 waiting: ~15:30 at today's rate",
            id="from-the-lift",
        ),
        pytest.param(
            48, 2.0, NOW, NOW + 24 * HOUR, "48 waiting: ~Dec 06 12:00 at today's rate", id="tomorrow-dated"
        ),
    ],
)
def test_drain_estimate(
    waiting: int, rate: float | None, start: float | None, drain_at: float | None, text: str
) -> None:
    part = drain_estimate(waiting, rate, start, now=NOW, timezone="UTC", rate_hours=2.0)
    assert part.drain_text == text
    assert part.drain_at_epoch == (pytest.approx(drain_at) if drain_at is not None else None)
    if drain_at is not None:
        assert part.drain_seconds == pytest.approx(drain_at - NOW)
        assert part.drain_at == datetime.fromtimestamp(part.drain_at_epoch or 0, UTC).isoformat()
    assert (part.waiting, part.rate_per_hour, part.rate_hours) == (waiting, rate, 2.0)


def test_the_drain_text_reads_in_the_operator_s_zone() -> None:
    part = drain_estimate(20, 10.0, NOW, now=NOW, timezone="Europe/Berlin")
    assert part.drain_text == "20 waiting: ~15:00 at today's rate"  # 14:00 UTC is 15:00 in Berlin
