"""A login a Codex session renewed goes back to the credential's file, and only a renewal of
the same account, and never over a later renewal another session carried back first."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from dispatchq.backends.codex import CodexBackend
from dispatchq.tiers.renewal import carry_back


def _jwt(sub: str) -> str:
    def part(value: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'sub': sub})}.sig"


def _login(refresh: str, *, account: str = "acct-1", sub: str = "user-1", at: str | None = None) -> str:
    login: dict[str, object] = {
        "OPENAI_API_KEY": None,
        "tokens": {"id_token": _jwt(sub), "refresh_token": refresh, "account_id": account},
    }
    if at is not None:
        login["last_refresh"] = at
    return json.dumps(login)


def _left(tmp_path: Path, text: str) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir(exist_ok=True)
    (home / "auth.json").write_text(text)
    return home


GIVEN = _login("rt-1", at="2026-12-05T10:00:00Z")


@pytest.mark.parametrize(
    ("left", "carried"),
    [
        (_login("rt-2", at="2026-12-05T11:00:00Z"), True),  # the same account, renewed
        (GIVEN, False),  # untouched
        (GIVEN + "\n", False),  # untouched but for a newline
        (_login("rt-2", account="acct-other"), False),  # another account
        (_login("rt-2", sub="user-other"), False),  # another person's ID token
        (json.dumps({"tokens": {"account_id": "acct-1"}}), False),  # no refresh token: no login
        ("not json", False),
    ],
)
def test_the_codex_backend_hands_back_only_a_renewal_of_the_same_account(
    tmp_path: Path, left: str, carried: bool
) -> None:
    home = _left(tmp_path, left)
    assert CodexBackend().renewed_login(home, GIVEN) == (left.strip() if carried else None)


def test_nothing_is_handed_back_when_the_session_removed_its_login(tmp_path: Path) -> None:
    home = _left(tmp_path, GIVEN)
    (home / "auth.json").unlink()
    assert CodexBackend().renewed_login(home, GIVEN) is None


def _credential_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "logins" / "codex.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text + "\n")
    path.chmod(0o640)
    return path


def test_a_renewal_replaces_the_login_it_was_given_whole_and_private(tmp_path: Path) -> None:
    path = _credential_file(tmp_path, GIVEN)
    before = path.stat().st_ino
    renewed = _login("rt-2", at="2026-12-05T11:00:00Z")
    assert carry_back("codex", str(path), GIVEN, renewed, tmp_path / "locks") == "written"
    assert path.read_text() == renewed + "\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.stat().st_ino != before  # renamed into place: a reader sees old or new, whole


def test_through_a_symlink_the_target_is_renewed_and_the_link_kept(tmp_path: Path) -> None:
    target = _credential_file(tmp_path, GIVEN)
    link = tmp_path / "auth-link.json"
    link.symlink_to(target)
    renewed = _login("rt-2", at="2026-12-05T11:00:00Z")
    assert carry_back("codex", str(link), GIVEN, renewed, tmp_path / "locks") == "written"
    assert link.is_symlink() and json.loads(target.read_text())["tokens"]["refresh_token"] == "rt-2"


@pytest.mark.parametrize(
    ("theirs_at", "outcome", "kept"),
    [
        ("2026-12-05T12:00:00Z", "newer kept", "rt-theirs"),  # theirs is later: it stays
        ("2026-12-05T10:30:00Z", "written", "rt-mine"),  # mine is later: mine goes in
    ],
)
def test_two_sessions_renewing_one_login_leave_the_later_renewal(
    tmp_path: Path, theirs_at: str, outcome: str, kept: str
) -> None:
    path = _credential_file(tmp_path, _login("rt-theirs", at=theirs_at))  # another session's, first
    mine = _login("rt-mine", at="2026-12-05T11:00:00Z")
    assert carry_back("codex", str(path), GIVEN, mine, tmp_path / "locks") == outcome
    assert json.loads(path.read_text())["tokens"]["refresh_token"] == kept


def test_a_renewal_that_cannot_be_written_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = tmp_path / "unmounted" / "codex.json"  # its folder went away while the session ran
    with caplog.at_level(logging.WARNING, logger="dispatchq.session"):
        outcome = carry_back("codex", str(gone), GIVEN, _login("rt-2"), tmp_path / "locks")
    assert outcome == "failed"
    assert not gone.parent.exists()
    assert "codex login" in caplog.text and str(gone) in caplog.text
