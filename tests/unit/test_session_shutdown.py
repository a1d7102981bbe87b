"""Which ends of a session are a shutdown's (requeued uncharged) rather than the session's own."""

from __future__ import annotations

import pytest

from dispatchq.launcher.spawn import LaunchResult
from dispatchq.tiers.session import ended_by_shutdown


@pytest.mark.parametrize("code", [143, 130, 129, -15, -2, -1])
def test_a_session_ended_by_sigterm_sigint_or_sighup_was_stopped_by_a_shutdown(code: int) -> None:
    assert ended_by_shutdown(LaunchResult(argv=("claude",), returncode=code))


@pytest.mark.parametrize("code", [0, 1, 2, 15, 127, 137, -9, None])
def test_any_other_end_is_the_sessions_own(code: int | None) -> None:
    assert not ended_by_shutdown(LaunchResult(argv=("claude",), returncode=code))


def test_the_launchers_own_sigterm_on_a_timeout_or_a_cancel_is_not_a_shutdown() -> None:
    assert not ended_by_shutdown(LaunchResult(argv=("claude",), returncode=143, timed_out=True))
    assert not ended_by_shutdown(LaunchResult(argv=("claude",), returncode=143, cancelled=True))
