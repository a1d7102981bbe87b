"""Every command that takes a judgement id takes the 12-character ids the run table prints
(any unique prefix of 8+ characters), through the real CLI on a real Redis."""

from __future__ import annotations

from tests.support.helpers import run_cli


def cli(env: dict[str, str], *args: str) -> str:
    done = run_cli(list(args), env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_result_cancel_and_retry_take_a_unique_prefix(prefix_env: dict[str, str]) -> None:
    jid = cli(prefix_env, "enqueue", "--kind", "ask", "--target", "acme/app#1", "--state", '{"body": "x"}')
    short = jid[:12]
    assert short != jid
    assert f'"id": "{jid}"' in cli(prefix_env, "result", short, "--json")
    assert cli(prefix_env, "cancel", short) == f"cancelled {jid}"
    assert cli(prefix_env, "retry", jid[:8]) == f"re-queued {jid}"


def test_a_prefix_shorter_than_8_or_unknown_is_no_judgement(prefix_env: dict[str, str]) -> None:
    jid = cli(prefix_env, "enqueue", "--kind", "ask", "--target", "acme/app#2", "--state", '{"body": "y"}')
    for wrong in (jid[:7], "zzzzzzzzzzzz"):
        done = run_cli(["result", wrong], prefix_env)
        assert done.returncode == 2 and f"no judgement {wrong}" in done.stderr
