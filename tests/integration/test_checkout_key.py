"""The checkout part of a judgement's key: real git in a temporary repository.

`Dispatcher.prepare` (which computes the key a producer's judgement gets) touches no Redis,
so it is driven with a fakeredis client; git is real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatchq.core.judgement import JudgementIn
from dispatchq.errors import UserError
from dispatchq.git import runner as git
from dispatchq.settings import load_settings
from tests.support.helpers import git as run_git


def j(**fields: Any) -> JudgementIn:
    base: dict[str, Any] = {"kind": "k", "target": "acme/app#12"}
    return JudgementIn(**{**base, **fields})


# --- the checkout fingerprint: HEAD plus every changed or untracked file ----------------------------


def test_fingerprint_is_stable_for_an_unchanged_tree(git_repo: Path) -> None:
    assert git.fingerprint(git_repo) == git.fingerprint(git_repo)


def test_fingerprint_changes_with_head(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    run_git(git_repo, "commit", "-q", "--allow-empty", "-m", "empty but a new HEAD")
    assert git.fingerprint(git_repo) != before


def test_fingerprint_changes_with_a_dirty_tracked_file(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "src" / "app.py").write_text("x = 2\n")
    dirty = git.fingerprint(git_repo)
    assert dirty != before
    (git_repo / "src" / "app.py").write_text("x = 3\n")  # a second edit of the same file
    assert git.fingerprint(git_repo) not in (before, dirty)
    (git_repo / "src" / "app.py").write_text("x = 1\n")  # back to HEAD's content
    assert git.fingerprint(git_repo) == before


def test_fingerprint_changes_with_an_untracked_file_and_its_content(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "notes").mkdir()
    (git_repo / "notes" / "todo.txt").write_text("one\n")
    untracked = git.fingerprint(git_repo)
    assert untracked != before
    (git_repo / "notes" / "todo.txt").write_text("two\n")
    assert git.fingerprint(git_repo) != untracked


def test_fingerprint_changes_with_a_staged_change_and_a_deletion(git_repo: Path) -> None:
    before = git.fingerprint(git_repo)
    (git_repo / "README.md").write_text("changed\n")
    run_git(git_repo, "add", "README.md")
    staged = git.fingerprint(git_repo)
    assert staged != before
    (git_repo / "src" / "app.py").unlink()
    assert git.fingerprint(git_repo) not in (before, staged)


# --- the key a producer's judgement gets at enqueue -------------------------------------------------


def test_enqueue_key_includes_the_checkout_state(prepare: Any, git_repo: Path) -> None:
    judgement = j(context={"checkout": str(git_repo)})
    clean = prepare(judgement).content_key
    assert prepare(judgement).content_key == clean  # stable while the tree is unchanged
    (git_repo / "scratch.txt").write_text("untracked\n")
    assert prepare(judgement).content_key != clean


def test_enqueue_key_of_a_producer_key_ignores_the_tree(prepare: Any, git_repo: Path) -> None:
    judgement = j(context={"checkout": str(git_repo)}, key="my-key")
    before = prepare(judgement).content_key
    (git_repo / "scratch.txt").write_text("untracked\n")
    assert prepare(judgement).content_key == before


def test_enqueue_refuses_a_checkout_outside_the_roots(prepare: Any, tmp_path: Path) -> None:
    outside = tmp_path.parent
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": str(outside)}))
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": f"{tmp_path}/../{outside.name}"}))  # `..` does not escape


def test_enqueue_refuses_a_symlink_escaping_the_roots(prepare: Any, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "sneaky").symlink_to(outside)
    with pytest.raises(UserError, match="outside DISPATCHQ_CHECKOUT_ROOTS"):
        prepare(j(context={"checkout": str(tmp_path / "sneaky")}))


def test_enqueue_refuses_relative_or_missing_checkouts(prepare: Any, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="absolute path"):
        prepare(j(context={"checkout": "repo"}))
    with pytest.raises(UserError, match="not a directory"):
        prepare(j(context={"checkout": str(tmp_path / "absent")}))


def test_produce_verify_needs_a_git_checkout(prepare: Any, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"give context\.checkout"):
        prepare(j(kind="repair"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match="not a git repository"):
        prepare(j(kind="repair", context={"checkout": str(tmp_path / "plain")}))


def test_entry_tier_and_host_binding(prepare: Any, git_repo: Path) -> None:
    unbound = prepare(j())
    assert unbound.tier == "code" and unbound.host is None
    bound = prepare(j(context={"checkout": str(git_repo)}))
    assert bound.host == load_settings({}).host
