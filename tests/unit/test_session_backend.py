"""The `SessionBackend` seam: the registry, and Claude Code behind it exactly as the tier ran it.

The claude backend must give the same argv, environment and readings as the functions it
hands over to (the session tier calls only the backend), and a session must see exactly the
one credential it was given, whichever of the CLI's credential variables that is.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dispatchq.backends import DEFAULT_BACKEND, SessionBackend, backend_for, known_backends
from dispatchq.backends import claude as claude_module
from dispatchq.backends.claude import CLAUDE_CREDENTIAL_VARS
from dispatchq.errors import ConfigError, UserError
from dispatchq.launcher.environment import SESSION_FORCED, session_argv, session_environment
from dispatchq.launcher.sandbox import SandboxPlan
from dispatchq.launcher.spawn import DEFAULT_SESSION_COMMAND, build_argv
from dispatchq.settings import load_settings
from dispatchq.tiers.lease import outcome_of
from dispatchq.window import limits

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOKEN = "CLAUDE_CODE_OAUTH_TOKEN"
API_KEY = "ANTHROPIC_API_KEY"
PARENT = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "LANG": "C.UTF-8",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:8089",
    "EDITOR": "vim",  # harmless but unnamed: withheld
    TOKEN: "parent-token",
    f"{TOKEN}_FILE": "/etc/dispatchq/token",
    API_KEY: "sk-ant-parent-key-0123456789",
    f"{API_KEY}_FILE": "/etc/dispatchq/key",
    "ANTHROPIC_AUTH_TOKEN": "gateway-bearer",
}
# The operator allows every credential by name: the rule still withholds all but the chosen.
ALLOW_ALL = (TOKEN, API_KEY, "ANTHROPIC_AUTH_TOKEN", f"{TOKEN}_FILE", f"{API_KEY}_FILE", "EDITOR")


def stream(*events: dict[str, object]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def rate_event(status: str, *, utilization: float | None = None) -> dict[str, object]:
    info: dict[str, object] = {
        "status": status,
        "resetsAt": int(NOW.timestamp()) + 3600,
        "rateLimitType": "five_hour",
    }
    if utilization is not None:
        info["utilization"] = utilization
    return {"type": "rate_limit_event", "rate_limit_info": info, "session_id": "s-1"}


def answer_result(text: str) -> dict[str, object]:
    return {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 2,
        "result": text,
        "session_id": "s-1",
        "total_cost_usd": 0.03,
    }


def claude_env(tmp_path: Path, credential_var: str, value: str | None = "chosen") -> dict[str, str]:
    return backend_for("claude").environment(
        PARENT,
        deny=(),
        allow=ALLOW_ALL,
        credential_var=credential_var,
        credential_value=value,
        scrub_subprocesses=True,
        config_dir=tmp_path / "config",
    )


# --- the registry --------------------------------------------------------------------------
def test_the_claude_backend_satisfies_the_protocol() -> None:
    backend = backend_for("claude")

    assert isinstance(backend, SessionBackend)
    assert backend.name == "claude" == DEFAULT_BACKEND
    assert "claude" in known_backends()
    assert backend.config_var == "CLAUDE_CONFIG_DIR"
    assert {TOKEN, API_KEY} <= backend.credential_vars


def test_something_else_is_not_a_backend() -> None:
    class HalfABackend:
        name = "half"

        def argv(self, command: str) -> list[str]:
            return [command]

    assert not isinstance(HalfABackend(), SessionBackend)


def test_an_unknown_backend_names_itself_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        backend_for("gemini")

    message = str(caught.value)
    assert "'gemini'" in message
    assert all(name in message for name in known_backends())
    assert isinstance(caught.value, UserError)  # the CLI prints one line, exit 2


def test_a_claude_transcript_resumes_under_another_credential() -> None:
    # Its transcript lives in the judgement's config folder, not the credential's.
    assert backend_for("claude").resumes_across_credentials is True


# --- argv ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command", [DEFAULT_SESSION_COMMAND, "python3 -m dispatchq.testing.stand_in_session"]
)
@pytest.mark.parametrize("resume", [None, "4f1c-session-9"])
def test_argv_is_the_tiers_argv(command: str, resume: str | None) -> None:
    extra = ["--model", "opus"]

    got = backend_for("claude").argv(command, extra, resume=resume)

    assert got == session_argv(build_argv(command, extra_args=extra, resume=resume))
    assert got[:2] == command.split()[:2] and "opus" in got
    if resume is None:
        assert "--resume" not in got
    else:
        assert got[got.index("--resume") + 1] == resume


def test_argv_gives_claude_the_forced_settings_and_a_stand_in_none() -> None:
    backend = backend_for("claude")

    real = backend.argv(DEFAULT_SESSION_COMMAND)
    stand_in = backend.argv("python3 stand_in.py")

    forced = json.loads(real[real.index("--settings") + 1])["env"]
    assert forced == dict(SESSION_FORCED)
    assert "--settings" not in stand_in


def test_argv_refuses_a_resume_that_is_an_option() -> None:
    with pytest.raises(UserError, match="plain token"):
        backend_for("claude").argv(DEFAULT_SESSION_COMMAND, resume="--dangerously-skip-permissions")


# --- environment ---------------------------------------------------------------------------
@pytest.mark.parametrize("chosen", [TOKEN, API_KEY])
def test_a_session_sees_exactly_the_credential_it_was_given(tmp_path: Path, chosen: str) -> None:
    env = claude_env(tmp_path, chosen)

    assert env[chosen] == "chosen"  # the configured value, never the parent's copy
    others = (CLAUDE_CREDENTIAL_VARS - {chosen}) | {f"{name}_FILE" for name in CLAUDE_CREDENTIAL_VARS}
    assert sorted(name for name in env if name in others) == []
    assert env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "config")
    assert "EDITOR" in env and env["PATH"] == PARENT["PATH"]


def test_the_environment_is_the_tiers_environment_plus_the_config_folder(tmp_path: Path) -> None:
    env = claude_env(tmp_path, TOKEN)

    before = session_environment(
        PARENT,
        deny=(),
        allow=ALLOW_ALL,
        credential_var=TOKEN,
        credential_value="chosen",
        scrub_subprocesses=True,
    )
    assert env == {**before, "CLAUDE_CONFIG_DIR": str(tmp_path / "config")}


def test_no_credential_configured_adds_none(tmp_path: Path) -> None:
    env = claude_env(tmp_path, TOKEN, value=None)

    assert sorted(name for name in env if name in CLAUDE_CREDENTIAL_VARS) == []


def test_the_other_credentials_go_even_if_the_allowlist_let_them_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backend withholds the CLI's other credential variables by name, on its own.
    def lenient(parent: dict[str, str], **kwargs: object) -> dict[str, str]:
        return {**parent, str(kwargs["credential_var"]): str(kwargs["credential_value"])}

    monkeypatch.setattr(claude_module, "session_environment", lenient)

    env = claude_env(tmp_path, API_KEY)

    assert env[API_KEY] == "chosen"
    assert TOKEN not in env and "ANTHROPIC_AUTH_TOKEN" not in env
    assert f"{TOKEN}_FILE" not in env and f"{API_KEY}_FILE" not in env


def test_the_sandbox_sets_the_backends_config_variable(tmp_path: Path) -> None:
    plan = SandboxPlan(bwrap="bwrap", workdir=tmp_path, config_dir=tmp_path / "c", config_var="AGENT_HOME")

    inside = plan.environment({"PATH": "/bin"})

    assert inside["AGENT_HOME"] == str(tmp_path / "c")
    assert "CLAUDE_CONFIG_DIR" not in inside
    assert SandboxPlan(bwrap="bwrap", workdir=tmp_path, config_dir=tmp_path).environment({})[
        "CLAUDE_CONFIG_DIR"
    ] == str(tmp_path)


# --- egress --------------------------------------------------------------------------------
def test_egress_is_the_api_host_the_session_names() -> None:
    backend = backend_for("claude")

    assert backend.egress({}) == frozenset({("api.anthropic.com", 443)})
    assert backend.egress({"ANTHROPIC_BASE_URL": "http://127.0.0.1:8089"}, ["mcp.example:443"]) == frozenset(
        {("127.0.0.1", 8089), ("mcp.example", 443)}
    )
    with pytest.raises(ValueError, match="host:port"):
        backend.egress({}, ["no-port"])


# --- the output readers --------------------------------------------------------------------
def test_read_outcome_reads_as_the_limits_module_does() -> None:
    backend = backend_for("claude")
    text = stream(
        {"type": "system", "subtype": "init", "session_id": "s-1"},
        rate_event("allowed"),
        answer_result("yes"),
    )
    kwargs = {"now": NOW, "default_tz": "Europe/Berlin", "unknown_reset": 900.0}

    got = backend.read_outcome(text, returncode=0, **kwargs)

    assert (got.kind, got.text, got.session_id, got.total_cost_usd) == ("answer", "yes", "s-1", 0.03)
    assert got == limits.read_outcome(text, returncode=0, **kwargs)


def test_read_outcome_sees_a_rejection_as_the_limit() -> None:
    text = stream(rate_event("rejected"), {**answer_result("You've hit your limit"), "is_error": True})

    got = backend_for("claude").read_outcome(text, now=NOW, default_tz="UTC", unknown_reset=900.0)

    assert got.kind == "limit" and got.limit is not None
    assert got.limit.lifts_at == datetime.fromtimestamp(NOW.timestamp() + 3600, UTC)


@pytest.mark.parametrize(
    ("event", "state"),
    [
        (rate_event("rejected"), "closed"),
        (rate_event("allowed"), "open"),
        ({"type": "system", "subtype": "init", "session_id": "s-1"}, None),
    ],
)
def test_window_state_of_one_event(event: dict[str, object], state: str | None) -> None:
    assert backend_for("claude").window_state(event) == state == limits.window_state(event)


def test_reserve_signals_close_the_share_kept_for_people() -> None:
    events = [rate_event("allowed_warning", utilization=0.95), rate_event("allowed_warning", utilization=0.5)]

    got = backend_for("claude").reserve_signals(events, reserve=0.1, now=NOW)

    assert [(signal.kind, used) for signal, used in got] == [("reserved", 0.95)]
    assert backend_for("claude").reserve_signals(events, reserve=0.0, now=NOW) == []


def test_a_spooled_run_is_read_by_the_backend_handed_in(tmp_path: Path) -> None:
    seen: list[str] = []

    class Recording(claude_module.ClaudeBackend):
        def read_outcome(self, stdout: str, **kwargs: object) -> limits.SessionOutcome:
            seen.append(stdout)
            return super().read_outcome(stdout, **kwargs)

    settings = load_settings({"DISPATCHQ_DATA_DIR": str(tmp_path)})
    text = stream(answer_result("no"))

    got = outcome_of(settings, text, 0, "", NOW, backend=Recording())

    assert seen == [text] and got.kind == "answer" and got.text == "no"


# --- the release check ---------------------------------------------------------------------
def test_a_command_that_is_not_claude_has_no_release_to_check() -> None:
    # No `claude` program in the command: nothing is started, nothing is said.
    assert backend_for("claude").check_release("python3 stand_in.py", {"PATH": "/bin"}) is None
