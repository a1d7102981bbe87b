"""The `codex` backend behind the seam: its argv, one credential, config files, egress, and its stream.

The streams are built event by event in the shapes `codex exec --json` prints
(`codex-rs/exec/src/exec_events.rs`, docs/codex-cli.md); the limit words are
`UsageLimitReachedError`'s, read in the zone of the host that ran the CLI.
"""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from dispatchq.backends import SessionBackend, backend_for, known_backends
from dispatchq.backends import codex as codex_module
from dispatchq.backends.claude import ClaudeBackend
from dispatchq.backends.codex import CODEX_AUTH_VAR, CODEX_CREDENTIAL_VARS, CodexBackend
from dispatchq.backends.codex_prices import PRICES, ModelPrice, cost_usd, parse_prices, price_table
from dispatchq.backends.codex_stream import TokenUsage, codex_window_state, token_usage
from dispatchq.errors import UserError
from dispatchq.launcher import codex_releases
from dispatchq.settings import Settings
from dispatchq.tiers.confine import write_config_files
from dispatchq.window.limits import SessionOutcome

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)  # 07:00 in New York
NY = "America/New_York"
UNKNOWN = 900.0
CODEX = CodexBackend()
PARENT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "OPENAI_API_KEY": "sk-parent-key-0123456789abcdef",
    "OPENAI_API_KEY_FILE": "/etc/dispatchq/openai",
    "CODEX_API_KEY": "sk-codex-parent-0123456789abcdef",
    "CODEX_ACCESS_TOKEN": "parent-access-token",
    "CLAUDE_CODE_OAUTH_TOKEN": "parent-claude-token",
    "ANTHROPIC_API_KEY": "sk-ant-parent-0123456789",
}
AUTH_JSON = json.dumps({"OPENAI_API_KEY": None, "tokens": {"access_token": "a.b.c", "refresh_token": "r"}})


def env_of(credential_var: str, value: str | None, parent: dict[str, str] | None = None) -> dict[str, str]:
    return CODEX.environment(
        parent if parent is not None else PARENT, deny=(), allow=(), credential_var=credential_var,
        credential_value=value, scrub_subprocesses=True, config_dir=Path("/sessions/j1/config"),
    )  # fmt: skip


def test_the_registry_answers_codex_with_the_whole_seam() -> None:
    assert "codex" in known_backends()
    backend = backend_for("codex")
    assert isinstance(backend, CodexBackend)
    assert isinstance(backend, SessionBackend)
    assert backend.config_var == "CODEX_HOME"
    assert not backend.resumes_across_credentials


# --- argv ----------------------------------------------------------------------------------
def test_argv_runs_exec_json_confined_unattended_with_the_prompt_on_stdin() -> None:
    assert CODEX.argv("codex", ["--model", "gpt-5.1-codex"]) == [
        "codex", "exec", "--json", "--skip-git-repo-check", "--sandbox", "workspace-write",
        "-c", 'approval_policy="never"', "--model", "gpt-5.1-codex",
        "-c", "shell_environment_policy.ignore_default_excludes=false", "-",
    ]  # fmt: skip


def test_a_kind_cannot_hand_the_credential_to_the_models_commands() -> None:
    argv = CODEX.argv("codex", ["-c", "shell_environment_policy.ignore_default_excludes=true"])
    overrides = [value for flag, value in pairwise(argv) if flag == "-c"]
    assert overrides[-1] == "shell_environment_policy.ignore_default_excludes=false"


def test_a_denied_base_url_stays_behind() -> None:
    parent = {**PARENT, "OPENAI_BASE_URL": "http://127.0.0.1:8461/v1"}
    env = CODEX.environment(
        parent, deny=("OPENAI_*",), allow=(), credential_var=CODEX_AUTH_VAR, credential_value=AUTH_JSON,
        scrub_subprocesses=True, config_dir=Path("/sessions/j1/config"),
    )  # fmt: skip
    assert "OPENAI_BASE_URL" not in env


def test_argv_resumes_a_thread_by_its_id() -> None:
    argv = CODEX.argv("/opt/codex/bin/codex", resume="0199a213-81c0-7800-8aa1-bbab2a035a53")
    assert argv[-3:] == ["resume", "0199a213-81c0-7800-8aa1-bbab2a035a53", "-"]
    assert argv[:3] == ["/opt/codex/bin/codex", "exec", "--json"]
    with pytest.raises(UserError, match="not a plain token"):
        CODEX.argv("codex", resume="--dangerously-bypass-approvals-and-sandbox")


@pytest.mark.parametrize(
    ("command", "args", "absent"),
    [
        ("codex", ["--sandbox", "read-only"], "workspace-write"),
        ("codex", ["-s", "read-only"], "workspace-write"),
        ("codex", ["--sandbox=danger-full-access"], "workspace-write"),
        ("codex", ["-c", "approval_policy=on-request"], 'approval_policy="never"'),
    ],
)
def test_a_kind_that_chooses_its_own_sandbox_or_approval_keeps_it(
    command: str, args: list[str], absent: str
) -> None:
    argv = CODEX.argv(command, args)
    assert absent not in argv
    assert argv[-3 - len(args) : -3] == args


def test_a_wrapping_command_keeps_its_words_before_codexs() -> None:
    argv = CODEX.argv("/usr/bin/python3 /opt/fake_codex.py --profile ci")
    assert argv[:5] == ["/usr/bin/python3", "/opt/fake_codex.py", "--profile", "ci", "exec"]


def test_words_the_command_already_says_are_not_repeated() -> None:
    argv = CODEX.argv("codex exec --json --skip-git-repo-check")
    assert argv.count("exec") == 1
    assert argv.count("--json") == 1
    assert argv.count("--skip-git-repo-check") == 1


# --- environment, config files, egress ----------------------------------------------------
def test_a_metered_session_sees_only_its_api_key() -> None:
    env = env_of("CODEX_API_KEY", "sk-chosen-0123456789abcdef")
    assert env["CODEX_API_KEY"] == "sk-chosen-0123456789abcdef"
    assert env["CODEX_HOME"] == "/sessions/j1/config"
    for name in (
        "OPENAI_API_KEY",
        "CODEX_ACCESS_TOKEN",
        "OPENAI_API_KEY_FILE",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "ANTHROPIC_API_KEY",
        CODEX_AUTH_VAR,
        "CLAUDE_CODE_RETRY_WATCHDOG",
    ):
        assert name not in env, name  # fmt: skip
    assert CODEX.config_files(env, "CODEX_API_KEY", "sk-chosen-0123456789abcdef") == {}


def test_a_plan_session_gets_its_login_as_a_file_and_no_credential_variable() -> None:
    env = env_of(CODEX_AUTH_VAR, AUTH_JSON)
    secrets = {"OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN", CODEX_AUTH_VAR}
    assert not secrets & set(env)
    assert AUTH_JSON not in env.values()
    assert CODEX.config_files(env, CODEX_AUTH_VAR, AUTH_JSON) == {"auth.json": AUTH_JSON}


@pytest.mark.parametrize(
    ("chosen", "value"), [("CODEX_API_KEY", "sk-chosen-0123456789"), (CODEX_AUTH_VAR, AUTH_JSON)]
)
def test_the_other_credentials_go_even_if_the_allowlist_let_them_pass(
    monkeypatch: pytest.MonkeyPatch, chosen: str, value: str
) -> None:
    def lenient(parent: dict[str, str], **kwargs: object) -> dict[str, str]:
        return {**parent, str(kwargs["credential_var"]): str(kwargs["credential_value"])}

    monkeypatch.setattr(codex_module, "session_environment", lenient)
    env = env_of(chosen, value)
    kept = {name for name in CODEX_CREDENTIAL_VARS if name in env}
    assert kept == ({chosen} if chosen != CODEX_AUTH_VAR else set())
    assert "OPENAI_API_KEY_FILE" not in env


def test_the_api_base_reaches_the_config_and_the_egress_alike() -> None:
    env = env_of(CODEX_AUTH_VAR, AUTH_JSON, {**PARENT, "OPENAI_BASE_URL": "http://127.0.0.1:8461/v1"})
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8461/v1"
    files = CODEX.config_files(env, CODEX_AUTH_VAR, AUTH_JSON)
    assert files["config.toml"] == 'openai_base_url = "http://127.0.0.1:8461/v1"\n'
    assert CODEX.egress(env) == frozenset({("127.0.0.1", 8461)})
    leaky = env_of(CODEX_AUTH_VAR, AUTH_JSON, {**PARENT, "OPENAI_BASE_URL": "https://u:pw@gw.example/v1"})
    assert "OPENAI_BASE_URL" not in leaky


def test_a_stand_in_for_the_chatgpt_backend_is_configured_and_reached_too() -> None:
    parent = {**PARENT, "OPENAI_BASE_URL": "http://127.0.0.1:8461/v1",
              "CHATGPT_BASE_URL": "http://127.0.0.1:8462/backend-api/"}  # fmt: skip
    env = env_of(CODEX_AUTH_VAR, AUTH_JSON, parent)
    assert CODEX.config_files(env, CODEX_AUTH_VAR, AUTH_JSON)["config.toml"] == (
        'openai_base_url = "http://127.0.0.1:8461/v1"\nchatgpt_base_url = "http://127.0.0.1:8462/backend-api/"\n'
    )
    assert CODEX.egress(env) == frozenset({("127.0.0.1", 8461), ("127.0.0.1", 8462)})


def test_egress_is_the_plans_hosts_or_the_api_and_the_extras() -> None:
    plan = env_of(CODEX_AUTH_VAR, AUTH_JSON)
    assert CODEX.egress(plan) == frozenset({("chatgpt.com", 443), ("auth.openai.com", 443)})
    metered = env_of("CODEX_API_KEY", "sk-chosen-0123456789abcdef")
    assert CODEX.egress(metered, ["proxy.internal:3128"]) == frozenset(
        {("api.openai.com", 443), ("proxy.internal", 3128)}
    )


def test_claude_writes_no_config_files() -> None:
    assert ClaudeBackend().config_files({}, "CLAUDE_CODE_OAUTH_TOKEN", "t") == {}


def test_config_files_are_written_0600_and_only_inside_the_folder(tmp_path: Path) -> None:
    write_config_files(tmp_path, {"auth.json": AUTH_JSON})
    written = tmp_path / "auth.json"
    assert written.read_text(encoding="utf-8") == AUTH_JSON
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    write_config_files(tmp_path, {"auth.json": "{}"})
    assert written.read_text(encoding="utf-8") == "{}"
    for bad in ("../auth.json", "sub/auth.json", ""):
        with pytest.raises(ValueError, match="plain file name"):
            write_config_files(tmp_path, {bad: "x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auth.json"]


# --- the stream ----------------------------------------------------------------------------
THREAD = "0199a213-81c0-7800-8aa1-bbab2a035a53"
LIMIT = "You've hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/codex/settings/usage to purchase more credits or try again at 3:04 PM."  # noqa: E501


def jsonl(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def started() -> list[dict[str, Any]]:
    return [{"type": "thread.started", "thread_id": THREAD}, {"type": "turn.started"}]


def item(kind: str, n: int, **fields: Any) -> dict[str, Any]:
    return {"type": "item.completed", "item": {"id": f"item_{n}", "type": kind, **fields}}


def failed(message: str) -> list[dict[str, Any]]:
    return [{"type": "error", "message": message}, {"type": "turn.failed", "error": {"message": message}}]


def completed(inp: int = 1200, cached: int = 1000, out: int = 80) -> dict[str, Any]:
    return {
        "type": "turn.completed",
        "usage": {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out},
    }


def read(stdout: str, returncode: int | None = 0, stderr: str = "") -> SessionOutcome:
    return CODEX.read_outcome(
        stdout, now=NOW, default_tz=NY, unknown_reset=UNKNOWN, returncode=returncode, stderr=stderr
    )


def test_a_completed_turn_answers_with_the_last_agent_message() -> None:
    outcome = read(jsonl(
        *started(), item("reasoning", 0, text="thinking"), item("agent_message", 1, text="draft"),
        item("command_execution", 2, command="ls", aggregated_output="", exit_code=0, status="completed"),
        item("agent_message", 3, text='{"answer": true}'), completed(),
    ))  # fmt: skip
    assert (outcome.kind, outcome.text, outcome.session_id) == ("answer", '{"answer": true}', THREAD)
    assert outcome.window_opened and not outcome.is_error
    assert token_usage(outcome) == TokenUsage(1200, 1000, 80)


def test_retries_reported_before_a_completed_turn_do_not_spoil_the_answer() -> None:
    retry = {"type": "error", "message": "Reconnecting... 1/5"}
    stdout = jsonl(*started(), retry, item("agent_message", 0, text="ok"), completed())
    assert read(stdout).kind == "answer"


def test_a_limit_before_any_item_was_refused_at_spawn_and_lifts_in_the_hosts_zone() -> None:
    outcome = read(jsonl(*started(), *failed(LIMIT)), returncode=1)
    assert outcome.kind == "limit"
    assert outcome.refused_at_spawn
    assert outcome.limit is not None
    assert outcome.limit.lifts_at == datetime(2026, 11, 25, 20, 4, tzinfo=UTC)  # 15:04 EST
    assert outcome.session_id == THREAD


def test_a_limit_after_work_was_cut_off_mid_run() -> None:
    later = "You've hit your usage limit. Try again later."
    outcome = read(jsonl(*started(), item("reasoning", 0, text="x"), *failed(later)), returncode=1)
    assert outcome.kind == "limit" and outcome.cut_off_mid_run
    assert outcome.limit is not None and outcome.limit.lifts_at == NOW + timedelta(seconds=UNKNOWN)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("exceeded retry limit, last status: 502 Bad Gateway", "transient"),
        ("Selected model is at capacity. Please try a different model.", "transient"),
        ("Quota exceeded. Check your plan and billing details.", "host"),
        ("stream disconnected before completion: error sending request for url (https://chatgpt.com/"
         "backend-api/codex/responses): client error (Connect): tcp connect error: Connection refused"
         " (os error 111)", "host"),
        ("unexpected status 401 Unauthorized: Your authentication token has expired.", "host"),
        ("Codex ran out of room in the model's context window. Start a new thread or clear earlier history"
         " before retrying.", "error"),
    ],
)  # fmt: skip
def test_a_failed_turn_is_told_by_its_words(message: str, kind: str) -> None:
    outcome = read(jsonl(*started(), *failed(message)), returncode=1)
    assert outcome.kind == kind
    assert outcome.text == message
    assert outcome.limit is None


# Recorded from codex-cli 0.171.0 (`codex exec --json --skip-git-repo-check --sandbox workspace-write
# -c approval_policy="never" -`, API key, TZ=America/New_York) against a loopback stand-in that
# refused every Responses request with the service's 429 `usage_limit_reached` body (plan_type
# plus, resets_at two hours on) and x-codex-* headers, at 2026-12-05 10:14 UTC. Over HTTPS (the
# WebSocket handshake answered 404 first, so Codex fell back):
RECORDED_HTTPS_LIMIT = """\
{"type":"thread.started","thread_id":"01a245b3-0103-7583-8581-16788b094aac"}
{"type":"turn.started"}
{"type":"error","message":"Reconnecting... 2/5 (unexpected status 404 Not Found: not here, url: ws://127.0.0.1:18461/v1/responses)"}
{"type":"error","message":"Reconnecting... 5/5 (unexpected status 404 Not Found: not here, url: ws://127.0.0.1:18461/v1/responses)"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Falling back from WebSockets to HTTPS transport. unexpected status 404 Not Found: not here, url: ws://127.0.0.1:18461/v1/responses"}}
{"type":"error","message":"You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at 7:14 AM."}
{"type":"turn.failed","error":{"message":"You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at 7:14 AM."}}
"""  # noqa: E501
# The same 429 on the WebSocket handshake: Codex reads no body and says only this.
RECORDED_WS_LIMIT = """\
{"type":"thread.started","thread_id":"01a245b3-46c9-7f41-9eff-68173255f919"}
{"type":"turn.started"}
{"type":"error","message":"exceeded retry limit, last status: 429 Too Many Requests"}
{"type":"turn.failed","error":{"message":"exceeded retry limit, last status: 429 Too Many Requests"}}
"""
# codex-cli 0.169.0 given the same 429 on the WebSocket handshake read its body: the words.
RECORDED_WS_LIMIT_0_169 = """\
{"type":"thread.started","thread_id":"01a245c0-c413-71a3-b3da-dc9b7172d0a8"}
{"type":"turn.started"}
{"type":"error","message":"You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at 7:29 AM."}
{"type":"turn.failed","error":{"message":"You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit https://chatgpt.com/settings/usage to purchase more credits or try again at 7:29 AM."}}
"""  # noqa: E501
RECORDED_AT = datetime(2026, 12, 5, 10, 14, 50, tzinfo=UTC)
# The same CLI answering: the stand-in refused the WebSocket (404) and streamed one assistant
# message ("yes") over HTTPS with usage 2100 in (1800 cached) / 40 out.
RECORDED_ANSWER = """\
{"type":"thread.started","thread_id":"01a245b4-3743-7ea0-8437-ba2211142121"}
{"type":"turn.started"}
{"type":"error","message":"Reconnecting... 2/5 (unexpected status 404 Not Found: not here, url: ws://127.0.0.1:18461/v1/responses)"}
{"type":"error","message":"Reconnecting... 5/5 (unexpected status 404 Not Found: Unknown error, url: ws://127.0.0.1:18461/v1/responses)"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Falling back from WebSockets to HTTPS transport. unexpected status 404 Not Found: not here, url: ws://127.0.0.1:18461/v1/responses"}}
{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"yes"}}
{"type":"turn.completed","usage":{"input_tokens":2100,"cached_input_tokens":1800,"cache_write_input_tokens":0,"output_tokens":40,"reasoning_output_tokens":0}}
"""  # noqa: E501


def test_a_recorded_answer_is_the_agent_message_with_its_tokens() -> None:
    outcome = CODEX.read_outcome(
        RECORDED_ANSWER, now=RECORDED_AT, default_tz=NY, unknown_reset=UNKNOWN, returncode=0
    )
    assert (outcome.kind, outcome.text) == ("answer", "yes")
    assert outcome.session_id == "01a245b4-3743-7ea0-8437-ba2211142121"
    assert outcome.window_opened
    assert token_usage(outcome) == TokenUsage(2100, 1800, 40)


def test_a_recorded_limit_over_https_lifts_at_the_stated_minute_in_the_hosts_zone() -> None:
    outcome = CODEX.read_outcome(
        RECORDED_HTTPS_LIMIT, now=RECORDED_AT, default_tz=NY, unknown_reset=UNKNOWN, returncode=1
    )
    assert outcome.kind == "limit" and outcome.refused_at_spawn
    assert outcome.limit is not None
    assert outcome.limit.lifts_at == datetime(2026, 12, 5, 12, 14, tzinfo=UTC)  # 7:14 AM EST
    assert outcome.session_id == "01a245b3-0103-7583-8581-16788b094aac"
    assert outcome.text.startswith("You\u2019ve hit your usage limit.")


def test_the_oldest_release_words_the_websocket_429_and_it_lifts_at_its_minute() -> None:
    at = datetime(2026, 12, 5, 10, 29, 30, tzinfo=UTC)
    outcome = CODEX.read_outcome(
        RECORDED_WS_LIMIT_0_169, now=at, default_tz=NY, unknown_reset=UNKNOWN, returncode=1
    )
    assert outcome.kind == "limit" and outcome.limit is not None
    assert outcome.limit.lifts_at == datetime(2026, 12, 5, 12, 29, tzinfo=UTC)  # 7:29 AM EST


def test_a_recorded_429_on_the_websocket_is_the_limit_with_an_unknown_reset() -> None:
    outcome = CODEX.read_outcome(
        RECORDED_WS_LIMIT, now=RECORDED_AT, default_tz=NY, unknown_reset=UNKNOWN, returncode=1
    )
    assert outcome.kind == "limit" and outcome.refused_at_spawn
    assert outcome.limit is not None and not outcome.limit.reset_known
    assert outcome.limit.lifts_at == RECORDED_AT + timedelta(seconds=UNKNOWN)


def test_a_recorded_resume_of_a_thread_this_home_does_not_hold_asks_for_a_fresh_session() -> None:
    # codex-cli 0.171.0, `exec … resume <id> -` in a CODEX_HOME without that thread: nothing on stdout.
    stderr = (
        "Error: thread/resume: thread/resume failed: no rollout found for thread id "
        "0199a213-81c0-7800-8aa1-bbab2a035a53 (code -32600)\n"
    )
    outcome = read("", returncode=1, stderr=stderr)
    assert (outcome.kind, outcome.resume_missing) == ("error", True)
    assert "no rollout found" in outcome.text


def test_a_lost_thread_asks_for_a_fresh_session() -> None:
    outcome = read(jsonl(*failed(f"no thread with id: {THREAD}")), returncode=1)
    assert outcome.kind == "error" and outcome.resume_missing


def test_no_json_at_all_takes_the_reason_from_stderr() -> None:
    outcome = read(
        "",
        returncode=2,
        stderr="Error: Not inside a trusted directory and --skip-git-repo-check was not specified.\n",
    )
    assert outcome.kind == "error" and outcome.is_error
    assert "trusted directory" in outcome.text
    assert read("", returncode=0).kind == "error"


@pytest.mark.parametrize(
    ("event", "state"),
    [
        ({"type": "thread.started", "thread_id": THREAD}, None),
        ({"type": "turn.started"}, None),
        (item("agent_message", 0, text="hi"), "open"),
        (
            {"type": "item.started", "item": {"id": "item_1", "type": "command_execution", "command": "ls"}},
            "open",
        ),
        (item("error", 1, message="model rerouted"), None),
        (completed(), "open"),
        (failed(LIMIT)[0], "closed"),
        (failed(LIMIT)[1], "closed"),
        (failed("Selected model is at capacity.")[1], None),
    ],
)
def test_what_each_live_event_says_about_the_window(event: dict[str, Any], state: str | None) -> None:
    assert codex_window_state(event) == state
    assert CODEX.window_state(event) == state


def test_the_stream_reports_no_reserve() -> None:
    assert CODEX.reserve_signals([completed()], reserve=0.2, now=NOW) == []


# --- prices and releases -------------------------------------------------------------------
def test_a_metered_run_is_priced_from_its_tokens() -> None:
    prices = {"m": ModelPrice(input=2.0, cached_input=0.5, output=8.0)}
    # 200 fresh input, 1000 cached, 80 output: (200*2 + 1000*0.5 + 80*8) / 1e6
    assert cost_usd(TokenUsage(1200, 1000, 80), "M", prices) == pytest.approx(1540 / 1_000_000)
    assert cost_usd(TokenUsage(1200, 1000, 80), "other", prices) is None
    assert cost_usd(TokenUsage(1200, 1000, 80), None, prices) is None


def test_each_backend_says_what_a_run_cost() -> None:
    answered = read(jsonl(*started(), item("agent_message", 0, text="ok"), completed(1200, 1000, 80)))
    table = '{"m": [2, 0.5, 8]}'
    assert CODEX.cost(answered, model="m", prices=table) == pytest.approx(1540 / 1_000_000)
    assert CODEX.cost(answered, model="gpt-5.1-codex", prices="") == pytest.approx(
        (200 * 1.25 + 1000 * 0.125 + 80 * 10.0) / 1_000_000
    )
    assert CODEX.cost(answered, model="unpriced", prices=table) is None
    refused = read(jsonl(*started(), *failed(LIMIT)), returncode=1)
    assert CODEX.cost(refused, model="m", prices=table) is None
    claude_run = SessionOutcome(kind="answer", text="ok", total_cost_usd=0.25)
    assert ClaudeBackend().cost(claude_run, model="opus", prices=table) == 0.25


@pytest.mark.parametrize(
    ("value", "ok"),
    [("", True), ('{"m": [1, 0.1, 4]}', True), ('{"m": [1, 2]}', False), ('{"m": [1, -1, 2]}', False),
     ("[]", False), ("nope", False)],
)  # fmt: skip
def test_the_price_setting_is_checked_when_settings_load(value: str, ok: bool) -> None:
    if ok:
        assert Settings(codex_prices=value).codex_prices == value
    else:
        with pytest.raises(ValueError, match="codex_prices"):
            Settings(codex_prices=value)


def test_the_operator_overrides_and_adds_prices() -> None:
    table = price_table('{"gpt-5.1-codex": [2, 0.2, 12], "My-Model": [1, 0, 1]}')
    assert table["gpt-5.1-codex"] == ModelPrice(2.0, 0.2, 12.0)
    assert table["my-model"] == ModelPrice(1.0, 0.0, 1.0)
    assert table["gpt-5"] == PRICES["gpt-5"]
    assert price_table(None) == dict(PRICES)


@pytest.mark.parametrize(
    "text", ['{"gpt-5": [1, 2]}', '{"gpt-5": [1, -2, 3]}', '{"gpt-5": "cheap"}', "[1, 2, 3]", "not json"]
)
def test_a_bad_price_table_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="DISPATCHQ_CODEX_PRICES"):
        parse_prices(text)


def test_the_supported_codex_releases() -> None:
    oldest, newest = codex_releases.RELEASES[0], codex_releases.RELEASES[-1]
    assert codex_releases.supported(oldest) and codex_releases.supported(newest)
    assert not codex_releases.supported("0.1.0")
    assert not codex_releases.supported("9.0.0")
    assert codex_releases.is_codex_command("/usr/local/bin/codex")
    assert not codex_releases.is_codex_command("claude")
    assert codex_releases.check_codex("claude -p", {"PATH": "/usr/bin"}) is None
