"""Under `CI=true` a security test that cannot run fails with its reason; it never skips.

`tests/support/ci.py` is the one way such a test says "cannot run here"; the files of the
security tests are read (ast) so that a plain `pytest.skip` or a `skipif` on anything but the
platform cannot come back into them unnoticed.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ci import cannot_run, require_bwrap

REPO = Path(__file__).resolve().parents[2]
SECURITY_FILES = [
    REPO / "tests" / "integration" / name
    for name in ("test_environment.py", "test_session_tier.py", "test_claude_cli.py")
]


def outcome(call: Callable[[], object]) -> BaseException:
    """What `call` ended with: a failure and a skip are both caught here, so a helper that skips
    where it must fail makes this test fail rather than skip itself."""
    with pytest.raises(BaseException) as caught:
        call()
    return caught.value


def test_under_ci_a_test_that_cannot_run_fails_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    ended = outcome(lambda: cannot_run("no bwrap here"))
    assert isinstance(ended, pytest.fail.Exception) and "CI=true but no bwrap here" in str(ended)


@pytest.mark.parametrize("value", [None, "false", "1"])
def test_elsewhere_it_skips_loudly(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    ended = outcome(lambda: cannot_run("no bwrap here"))
    assert isinstance(ended, pytest.skip.Exception) and "SKIPPED LOUDLY: no bwrap here" in str(ended)


def test_a_missing_bwrap_fails_under_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap on it
    monkeypatch.setenv("CI", "true")
    ended = outcome(require_bwrap)
    assert isinstance(ended, pytest.fail.Exception) and "bubblewrap is not installed" in str(ended)


def _skips(tree: ast.AST) -> list[str]:
    """Every `pytest.skip(...)` call and every `skipif` whose condition is not the platform."""
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, text = ast.unparse(node.func), ast.unparse(node)
        platform_only = name == "pytest.mark.skipif" and "sys.platform" in text
        if name in ("pytest.skip", "pytest.mark.skipif") and not platform_only:
            found.append(text)
    return found


@pytest.mark.parametrize("path", SECURITY_FILES, ids=lambda p: p.name)
def test_the_security_test_files_skip_only_through_the_ci_helper(path: Path) -> None:
    assert _skips(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_finder_sees_a_plain_skip_and_a_skipif_but_not_the_platforms() -> None:
    source = (
        "pytest.skip('x')\n"
        "m = pytest.mark.skipif(shutil.which('bwrap') is None, reason='y')\n"
        "p = pytest.mark.skipif(not sys.platform.startswith('linux'), reason='z')\n"
    )
    assert len(_skips(ast.parse(source))) == 2
