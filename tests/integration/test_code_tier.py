"""The code tier: checks, and produce-and-verify in a throwaway git worktree.

Checks are plain functions (no Redis). Produce-and-verify runs real git and real commands
in a temporary repository; the last tests run it through a real `dispatchq worker code
--burst` subprocess on the test's Redis.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatchq.config import parse_config
from dispatchq.core.judgement import Judgement
from dispatchq.core.kinds import Kind
from dispatchq.launcher.environment import child_environment
from dispatchq.tiers.code import TAIL_CHARS, produce_and_verify, run_check
from tests.support.helpers import git, pid_alive, run_cli, tree_snapshot, wait_for, write_config

PY = sys.executable


def check_kind(fn: Any) -> Kind:
    kind = parse_config({"kinds": {"k": {"check": "tests.support.checks:noop"}}}).kinds["k"]
    object.__setattr__(kind, "check_fn", fn)  # the check under test instead of the example
    return kind


def judgement(**fields: Any) -> Judgement:
    return Judgement(**{"id": "j1", "kind": "k", "target": "acme/app#1", **fields})


# --- checks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [False, 0, "", [], {"labels": ["bug"]}, "rebuild"])
def test_a_check_answer_is_the_answer_whatever_its_value(value: Any) -> None:
    outcome = run_check(check_kind(lambda j: value), judgement())
    assert outcome.status == "answered"
    assert outcome.value == value and type(outcome.value) is type(value)


def test_none_means_cannot_tell() -> None:
    outcome = run_check(check_kind(lambda j: None), judgement())
    assert outcome.status == "up"
    assert "cannot tell" in outcome.reason


def test_value_and_reason_form() -> None:
    outcome = run_check(check_kind(lambda j: {"value": False, "reason": "only lockfiles"}), judgement())
    assert (outcome.status, outcome.value, outcome.reason) == ("answered", False, "only lockfiles")


def test_a_mapping_with_other_keys_is_the_value_itself() -> None:
    answer = {"value": 1, "reason": "r", "extra": True}
    assert run_check(check_kind(lambda j: answer), judgement()).value == answer


def test_the_check_receives_the_judgement() -> None:
    seen: list[Judgement] = []
    run_check(check_kind(lambda j: seen.append(j)), judgement(state={"conflicts": ["uv.lock"]}))
    assert seen[0].id == "j1" and seen[0].state == {"conflicts": ["uv.lock"]}


def test_a_check_that_raises_fails_the_judgement_with_the_reason() -> None:
    def broken(j: Judgement) -> Any:
        raise KeyError("conflicts")

    outcome = run_check(check_kind(broken), judgement())
    assert outcome.status == "failed"  # never "up": a crashing check must not become a session
    assert "KeyError" in outcome.reason and "conflicts" in outcome.reason
    assert "test_code_tier.py:" in outcome.reason


def test_a_non_json_answer_fails_the_judgement() -> None:
    outcome = run_check(check_kind(lambda j: {1, 2}), judgement())
    assert outcome.status == "failed"
    assert "not JSON" in outcome.reason


# --- produce-and-verify -------------------------------------------------------------------------


def pv_kind(produce: list[list[str]], verify: list[list[str]]) -> Kind:
    return parse_config({"kinds": {"repair": {"produce": produce, "verify": verify}}}).kinds["repair"]


def pv_judgement(checkout: Path, jid: str = "r1") -> Judgement:
    return Judgement(id=jid, kind="repair", target="acme/app", context={"checkout": str(checkout)})


def regenerate(path: str, text: str) -> list[str]:
    """A produce command writing `text` to `path` (relative to where it runs)."""
    return [PY, "-c", f"import pathlib; pathlib.Path({path!r}).write_text({text!r})"]


def verify_contains(path: str, text: str) -> list[str]:
    code = (
        f"import pathlib, sys; t = pathlib.Path({path!r}).read_text(); print('checked', t); "
        f"sys.exit(0 if {text!r} in t else 1)"
    )
    return [PY, "-c", code]


def make_dirty(repo: Path) -> None:
    (repo / "README.md").write_text("a person's unsaved edit\n")  # modified, unstaged
    (repo / "src" / "app.py").write_text("x = 'staged'\n")
    git(repo, "add", "src/app.py")  # modified, staged
    (repo / "wip.txt").write_text("untracked work in progress\n")  # untracked


def git_state(repo: Path) -> tuple[str, str, str, str]:
    return (
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        git(repo, "diff", "--cached"),
        git(repo, "stash", "list"),
    )


def worktrees(repo: Path) -> list[str]:
    return [
        line
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def env_now() -> dict[str, str]:
    return child_environment(os.environ)


def test_pass_commits_to_a_branch_and_never_touches_the_working_tree(git_repo: Path) -> None:
    make_dirty(git_repo)
    files_before, state_before = tree_snapshot(git_repo), git_state(git_repo)
    head = state_before[0].strip()
    kind = pv_kind(
        [regenerate("generated.txt", "regenerated\n")], [verify_contains("generated.txt", "regenerated")]
    )

    outcome = produce_and_verify(kind, pv_judgement(git_repo), env=env_now(), timeout=60)

    assert outcome.status == "answered", outcome
    assert tree_snapshot(git_repo) == files_before  # byte-identical, untracked file included
    assert git_state(git_repo) == state_before  # HEAD, index and status unchanged
    value = outcome.value
    assert value["changed"] is True and value["branch"] == "dispatchq/repair-r1"
    assert "generated.txt" in value["diff"] and "+regenerated" in value["diff"]
    assert git(git_repo, "rev-parse", "dispatchq/repair-r1").strip() == value["commit"]
    assert git(git_repo, "rev-parse", f"{value['commit']}^").strip() == head
    # The branch holds HEAD plus the regenerated file, none of the person's uncommitted work.
    assert git(git_repo, "show", f"{value['commit']}:generated.txt") == "regenerated\n"
    assert git(git_repo, "show", f"{value['commit']}:README.md") == "hello\n"
    assert "wip.txt" not in git(git_repo, "ls-tree", "-r", "--name-only", value["commit"])
    assert len(worktrees(git_repo)) == 1  # the temporary worktree is gone


def test_fail_moves_up_with_the_verify_output_tail(git_repo: Path) -> None:
    make_dirty(git_repo)
    files_before, state_before = tree_snapshot(git_repo), git_state(git_repo)
    noisy = [PY, "-c", "print('x' * 9000); print('THE LAST LINE: 3 tests failed'); raise SystemExit(1)"]
    kind = pv_kind([regenerate("generated.txt", "regenerated\n")], [noisy])

    outcome = produce_and_verify(kind, pv_judgement(git_repo), env=env_now(), timeout=60)

    assert outcome.status == "up"
    assert outcome.reason.startswith("verify ") and "exited 1" in outcome.reason
    tail = outcome.raw["output_tail"]
    assert "THE LAST LINE: 3 tests failed" in tail
    assert len(tail) <= TAIL_CHARS + 1
    assert [c["phase"] for c in outcome.raw["commands"]] == ["produce", "verify"]
    assert "dispatchq/repair-r1" not in git(git_repo, "branch", "--list")
    assert tree_snapshot(git_repo) == files_before and git_state(git_repo) == state_before
    assert len(worktrees(git_repo)) == 1


def test_a_failing_produce_step_stops_before_verify(git_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "verify-ran"
    kind = pv_kind([[PY, "-c", "raise SystemExit(3)"]], [[PY, "-c", f"open({str(marker)!r}, 'w')"]])
    outcome = produce_and_verify(kind, pv_judgement(git_repo), env=env_now(), timeout=60)
    assert outcome.status == "up" and "produce" in outcome.reason and "exited 3" in outcome.reason
    assert not marker.exists()


def test_a_missing_command_moves_up(git_repo: Path) -> None:
    kind = pv_kind([["dispatchq-no-such-regenerator"]], [["true"]])
    outcome = produce_and_verify(kind, pv_judgement(git_repo), env=env_now(), timeout=60)
    assert outcome.status == "up" and "exited 127" in outcome.reason


def test_nothing_to_change_is_answered_without_a_branch(git_repo: Path) -> None:
    kind = pv_kind([["true"]], [verify_contains("README.md", "hello")])
    outcome = produce_and_verify(kind, pv_judgement(git_repo, "r2"), env=env_now(), timeout=60)
    assert outcome.status == "answered"
    assert outcome.value == {"changed": False, "diff": "", "branch": None, "commit": None}
    assert "dispatchq/repair-r2" not in git(git_repo, "branch", "--list")


def test_commands_run_in_the_checkouts_subdirectory_of_the_worktree(git_repo: Path) -> None:
    kind = pv_kind([regenerate("here.txt", "made in src\n")], [verify_contains("app.py", "x = 1")])
    outcome = produce_and_verify(kind, pv_judgement(git_repo / "src"), env=env_now(), timeout=60)
    assert outcome.status == "answered", outcome
    assert "src/here.txt" in outcome.value["diff"]
    assert not (git_repo / "src" / "here.txt").exists()


def test_a_command_past_its_timeout_is_killed_with_its_children(git_repo: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    grandchild = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    spawn = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
        "time.sleep(60)"
    )
    kind = pv_kind([[PY, "-c", spawn]], [["true"]])
    outcome = produce_and_verify(kind, pv_judgement(git_repo), env=env_now(), timeout=2)
    assert outcome.status == "up"
    assert "exited -9" in outcome.reason
    assert "killed after 2s" in outcome.raw["output_tail"]
    # The whole process group went, the grandchild too (else it would sleep on for a minute).
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the grandchild's pid"))
    wait_for(lambda: not pid_alive(pid), timeout=10, what="the grandchild to be killed")


def test_children_get_the_scrubbed_environment(git_repo: Path, tmp_path: Path) -> None:
    dump = tmp_path / "env.json"
    parent = {
        **os.environ,
        "SOME_TOKEN": "tok-should-not-leak",
        "DISPATCHQ_X": "dq-should-not-leak",
        "TYPESAFE_API_KEY": "ts-should-not-leak",
        "HARMLESS": "visible",
    }
    kind = pv_kind(
        [[PY, "-c", f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"]], [["true"]]
    )
    outcome = produce_and_verify(
        kind, pv_judgement(git_repo), env=child_environment(parent, allow=["HARMLESS"]), timeout=60
    )
    assert outcome.status == "answered", outcome
    seen = json.loads(dump.read_text())
    assert seen["HARMLESS"] == "visible" and "PATH" in seen
    assert not {"SOME_TOKEN", "DISPATCHQ_X", "TYPESAFE_API_KEY"} & set(seen)


# --- through a real worker process -----------------------------------------------------------------


def enqueue(env: dict[str, str], kind: str, checkout: Path) -> str:
    done = run_cli(
        [
            "enqueue",
            "--kind",
            kind,
            "--target",
            "acme/app",
            "--context",
            json.dumps({"checkout": str(checkout)}),
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def result(env: dict[str, str], jid: str) -> dict[str, Any]:
    done = run_cli(["result", jid, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_worker_process_repairs_in_a_worktree_and_scrubs_its_environment(
    dq_env: dict[str, str], tmp_path: Path, git_repo: Path, redis_client: Any
) -> None:
    dump = tmp_path / "verify-env.json"
    dump_env = [PY, "-c", f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"]
    produce = json.dumps([regenerate("generated.txt", "regenerated\n")])
    verify = json.dumps([verify_contains("generated.txt", "regenerated"), dump_env])
    write_config(
        tmp_path / "dispatchq.yaml", f"kinds:\n  repair:\n    produce: {produce}\n    verify: {verify}\n"
    )
    make_dirty(git_repo)
    files_before, state_before = tree_snapshot(git_repo), git_state(git_repo)
    jid = enqueue(dq_env, "repair", git_repo)

    worker_env = {**dq_env, "SOME_TOKEN": "tok-should-not-leak", "DISPATCHQ_X": "dq-should-not-leak"}
    done = run_cli(["worker", "code", "--burst"], worker_env)
    assert done.returncode == 0, done.stderr

    record = result(dq_env, jid)
    assert (record["status"], record["tier"]) == ("answered", "code"), record
    assert record["value"]["branch"] == f"dispatchq/repair-{jid}"
    assert git(git_repo, "rev-parse", f"dispatchq/repair-{jid}").strip() == record["value"]["commit"]
    assert tree_snapshot(git_repo) == files_before and git_state(git_repo) == state_before
    seen = json.loads(dump.read_text())
    assert "PATH" in seen
    assert "SOME_TOKEN" not in seen and not [k for k in seen if k.startswith("DISPATCHQ_")]


def test_worker_process_moves_a_failed_verify_up_with_its_output(
    dq_env: dict[str, str], tmp_path: Path, git_repo: Path, redis_client: Any
) -> None:
    failing = [PY, "-c", "print('lint: 2 problems left in src/app.py'); raise SystemExit(1)"]
    verify = json.dumps([failing])
    write_config(
        tmp_path / "dispatchq.yaml", f'kinds:\n  repair:\n    produce: [["true"]]\n    verify: {verify}\n'
    )
    jid = enqueue(dq_env, "repair", git_repo)
    done = run_cli(["worker", "code", "--burst"], dq_env)
    assert done.returncode == 0, done.stderr
    record = result(dq_env, jid)
    assert record["status"] == "needs-triage"  # no typed or session tier: a person reads it
    assert record["trail"][0]["tier"] == "code" and record["trail"][0]["outcome"] == "moved-up"
    assert "exited 1" in record["trail"][0]["why"]
    assert "lint: 2 problems left in src/app.py" in record["raw"]["output_tail"]
    assert f"dispatchq/repair-{jid}" not in git(git_repo, "branch", "--list")
