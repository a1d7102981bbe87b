"""The allowlisted child environment, `<NAME>_FILE` secrets, and the non-dumpable flag.

The allowlist's cases are issue 20's "names the scrub misses" (case 4), every one of them:
a name nobody listed, a name listed but credential-shaped, a value that is a credential.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchq.errors import SettingsError
from dispatchq.launcher.environment import (
    CLI_SETTINGS,
    SESSION_FORCED,
    child_environment,
    is_secret_name,
    is_secret_value,
    read_secret,
    session_env_names,
    session_environment,
)
from dispatchq.launcher.scrub import ScrubDecision, decide_scrub
from tests.support.ci import cannot_run

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "support" / "fake_claude.py"
CRED = "CLAUDE_CODE_OAUTH_TOKEN"

# What a session may have from this parent: its base names.
SESSION_PART = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/u",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LANGUAGE": "en",
    "LC_ALL": "C.UTF-8",
    "TERM": "xterm",
    "TZ": "Europe/Berlin",
    "SSL_CERT_FILE": "/etc/ssl/cert.pem",
    "https_proxy": "http://alice@proxy:3128",  # userinfo without a password: kept
    "NO_PROXY": "localhost,127.0.0.1",
}
# What a repository command has besides.
CHILD_PART = {"USER": "u", "LOGNAME": "u", "SHELL": "/bin/bash"}
# Harmless, but nobody named them: withheld from both.
UNNAMED = {"EDITOR": "vim", "XDG_RUNTIME_DIR": "/run/user/1000", "PYTHONPATH": "/src", "GOPATH": "/go"}
BASE = {**SESSION_PART, **CHILD_PART, **UNNAMED}

# Issue 20, case 4: names the old scrub missed (and the ones it kept on purpose).
CASE4_NAMES = [
    "GH_PAT",
    "NPM_CONFIG__AUTHTOKEN",
    "npm_config__authToken",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "AZURE_STORAGE_CONNECTION_STRING",
    "SLACK_WEBHOOK_URL",
    "GIT_CONFIG_VALUE_0",
    "GIT_CONFIG_KEY_0",
    "GIT_CONFIG_COUNT",
    "DB_PW",
    "ADMIN_PWD",
    "MYSQL_PWD",
    "JWT",
    "githubToken",
    "apiKey",
    "dbPassword",
    "SSH_AUTH_SOCK",
    "CLAUDE_CODE_RETRY_WATCHDOG",
    "CLAUDE_CODE_RETRY_WATCHDOG_MAX_WAIT_MS",
]
# ...and the names the deny approach did catch: still withheld.
KNOWN_NAMES = [
    "GITHUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_CUSTOM_HEADERS",
    "CLAUDE_CODE_OAUTH_TOKEN_FILE",
    "PGPASSWORD",
    "OPENAI_APIKEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SENTRY_DSN",
    "INPUT_GITHUB_TOKEN",
    "TYPESAFE_API_KEY",
    "TYPESAFE_API_KEY_FILE",
    "DISPATCHQ_REDIS_URL",
    "CLAUDECODE",
    "BASH_FUNC_deploy%%",
]
# Never passed even when an allow list names them outright (`*`).
NEVER_EVEN_ALLOWED = [n for n in CASE4_NAMES + KNOWN_NAMES if not n.startswith("CLAUDE_CODE_RETRY_WATCHDOG")]

# Case 4's values, each under a harmless allowed name and under a base name.
CASE4_VALUES = [
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "gho_" + "A" * 36,
    "ghs_" + "0" * 36,
    "github_pat_11ABCDEFG0" + "x" * 40,
    "sk-ant-api03-" + "Z" * 40,
    "sk-proj-" + "q" * 40,
    "xoxb-123456789012-1234567890123-abcdefghij",
    "xoxp-" + "1" * 30,
    "AKIAIOSFODNN7EXAMPLE",
    "https://db.example.com/app?user=app&password=hunter2",
    "https://db.example.com/app?password=hunter2",
    "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=abc123==;EndpointSuffix=core.windows.net",
    "postgres://app:hunter2@db:5432/app",
    "--index-url=https://u:hunter2@pypi.example.com/simple",
    "() {  curl -H 'x'; }",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n",
]
HARMLESS_VALUES = [
    "https://example.com/x?y=1",
    "http://alice@proxy:3128",
    "task-1234",
    "sk-short",
    "ghp_",
    "/home/u/.cache",
    "",
]


def _session(parent: dict[str, str], **kwargs: object) -> dict[str, str]:
    return session_environment(parent, credential_var=CRED, credential_value="tok", **kwargs)  # type: ignore[arg-type]


# --- what passes by default ----------------------------------------------------------------------
def test_a_session_gets_its_base_its_credential_and_the_scrub_flag_only() -> None:
    env = _session({**BASE, **dict.fromkeys(CASE4_NAMES + KNOWN_NAMES, "s3cr3t")})

    assert env == {**SESSION_PART, CRED: "tok", "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "1", **SESSION_FORCED}


def test_a_repository_command_gets_the_child_base_only() -> None:
    env = child_environment({**BASE, **dict.fromkeys(CASE4_NAMES + KNOWN_NAMES, "s3cr3t")})

    assert env == {**SESSION_PART, **CHILD_PART}


@pytest.mark.parametrize("name", sorted(CLI_SETTINGS))
def test_the_cli_s_own_settings_pass_to_a_session_by_name(name: str) -> None:
    assert _session({name: "1"})[name] == "1"
    assert name not in child_environment({name: "1"})  # a repository command has no use for them


@pytest.mark.parametrize(
    "name", ["CLAUDE_CONFIG_DIR", "CLAUDE_CODE_TMPDIR", "ANTHROPIC_PROFILE", "XDG_CONFIG_HOME"]
)
def test_pointers_to_another_login_or_the_host_s_folders_stay_behind(name: str) -> None:
    assert name not in _session({name: "/home/u/.claude"})


# --- the allow list and a kind's env ---------------------------------------------------------------
@pytest.mark.parametrize("name", CASE4_NAMES + KNOWN_NAMES)
def test_every_case_4_name_is_withheld_by_default(name: str) -> None:
    assert _session({**BASE, name: "s3cr3t"}).get(name) == SESSION_FORCED.get(name)  # issue 23: forced
    assert name not in child_environment({**BASE, name: "s3cr3t"})


@pytest.mark.parametrize("name", NEVER_EVEN_ALLOWED)
def test_a_credential_shaped_or_reserved_name_is_withheld_even_when_allowed(name: str) -> None:
    parent = {**BASE, name: "s3cr3t"}

    assert name not in _session(parent, allow=["*", name])
    assert name not in child_environment(parent, allow=["*", name])


def test_the_retry_watchdog_never_passes_even_when_allowed_and_is_forced_off() -> None:
    # Issue 23: under it `claude -p` sleeps through a usage limit while holding the slot.
    parent = {"CLAUDE_CODE_RETRY_WATCHDOG": "1", "CLAUDE_CODE_RETRY_WATCHDOG_MAX_WAIT_MS": "60000"}
    for allow in ([], ["CLAUDE_CODE_RETRY_WATCHDOG*"], ["CLAUDE_CODE_*"], ["*"]):
        env = _session(parent, allow=allow)
        assert env["CLAUDE_CODE_RETRY_WATCHDOG"] == "0", allow
        assert "CLAUDE_CODE_RETRY_WATCHDOG_MAX_WAIT_MS" not in env, allow
        assert not set(parent) & set(child_environment(parent, allow=allow)), allow  # a kind's env:


def test_allow_takes_exact_names_and_globs() -> None:
    env = _session(BASE, allow=["EDITOR", "XDG_*", " ", ""])

    assert set(env) == set(SESSION_PART) | {
        "EDITOR",
        "XDG_RUNTIME_DIR",
        CRED,
        "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB",
        *SESSION_FORCED,
    }


def test_a_kind_s_env_reaches_its_commands_but_not_a_glob_matched_credential() -> None:
    parent = {
        **BASE,
        "CARGO_HOME": "/c",
        "CARGO_REGISTRY_TOKEN": "s3cr3t",
        "CARGO_NET_GIT_FETCH_WITH_CLI": "true",
    }
    env = child_environment(parent, allow=["GOPATH", "CARGO_*"])

    assert env == {
        **SESSION_PART,
        **CHILD_PART,
        "GOPATH": "/go",
        "CARGO_HOME": "/c",
        "CARGO_NET_GIT_FETCH_WITH_CLI": "true",
    }


@pytest.mark.parametrize(
    "name",
    [
        "GIT_AUTHOR_NAME",
        "TOKENIZERS_PARALLELISM",
        "XAUTHORITY",
        "KEYBOARD_LAYOUT",
        "PASSENGER_HOME",
        "PWD",
        "PATHEXT",
    ],
)
def test_names_that_only_contain_a_secret_word_pass_when_allowed(name: str) -> None:
    assert not is_secret_name(name)
    assert child_environment({name: "v"}, allow=[name]) == {name: "v"}


def test_deny_wins_over_allow_and_over_the_base() -> None:
    env = _session(
        {**BASE, "MY_ONE": "1", "MY_TWO": "2"}, allow=["MY_*", "EDITOR"], deny=["MY_TWO", "EDITOR", "TZ"]
    )

    assert "MY_ONE" in env and not {"MY_TWO", "EDITOR", "TZ"} & set(env)
    assert "HOME" not in child_environment(BASE, deny=["HOME"])


# --- values ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", CASE4_VALUES)
def test_a_credential_shaped_value_is_withheld_under_any_name(value: str) -> None:
    assert is_secret_value(value)
    parent = {"MY_SETTING": value, "ANTHROPIC_BASE_URL": value, "HTTPS_PROXY": value, "LANG": value}

    assert not set(parent) & set(_session(parent, allow=["MY_SETTING"]))
    assert not set(parent) & set(child_environment(parent, allow=["MY_SETTING"]))


@pytest.mark.parametrize("value", HARMLESS_VALUES)
def test_ordinary_values_pass(value: str) -> None:
    assert not is_secret_value(value)
    assert _session({"MY_SETTING": value}, allow=["MY_SETTING"])["MY_SETTING"] == value


def test_the_credential_itself_is_exempt_from_the_value_rule() -> None:
    token = "sk-ant-oat01-" + "k" * 60
    env = session_environment({CRED: "from-parent"}, credential_var=CRED, credential_value=token)

    assert env[CRED] == token


def test_a_parent_copy_of_the_credential_never_stands_in_for_the_configured_one() -> None:
    env = session_environment(
        {**BASE, CRED: "from-parent"}, allow=[CRED], credential_var=CRED, credential_value=None
    )

    assert CRED not in env


# --- the credential --------------------------------------------------------------------------------
def test_exactly_one_credential_is_added_after_the_rule() -> None:
    parent = {**BASE, CRED: "from-parent", "ANTHROPIC_API_KEY": "other", "TYPESAFE_API_KEY": "ts"}
    env = child_environment(parent, credential=(CRED, "given"))

    assert env[CRED] == "given"
    assert [name for name in env if is_secret_name(name)] == [CRED]


@pytest.mark.parametrize(
    "name", ["TYPESAFE_API_KEY", "typesafe_api_key_file", "DISPATCHQ_X", "SSH_AUTH_SOCK", "BAD NAME", ""]
)
def test_forbidden_credential_names_are_refused(name: str) -> None:
    with pytest.raises(SettingsError):
        child_environment(BASE, credential=(name, "v"))
    with pytest.raises(SettingsError):
        session_environment(BASE, credential_var=name, credential_value=None)


def test_session_environment_without_a_credential_value_adds_none() -> None:
    env = session_environment(BASE, credential_var=CRED, credential_value=None)

    assert CRED not in env
    assert env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "1"


def test_without_usable_bubblewrap_the_scrub_flag_is_an_explicit_zero() -> None:
    # Claude Code refuses to start with the flag set and no bwrap; a parent's own `1` must not leak.
    parent = {**BASE, "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "1"}
    env = _session(parent, allow=["CLAUDE_CODE_*"], scrub_subprocesses=False)
    assert env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "0"


def test_session_env_names_lists_names_only_and_what_the_allow_list_could_not_pass() -> None:
    secret = "ghp_" + "s" * 36
    parent = {**BASE, "GH_PAT": secret, "MY_URL": "https://u:hunter2@x/", "MY_OK": "1", CRED: "tok"}
    names = session_env_names(parent, allow=["GH_*", "MY_*"], credential_var=CRED, credential_present=True)

    assert names == {
        "passes": sorted({*SESSION_PART, "MY_OK", CRED, "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB", *SESSION_FORCED}),
        "allowed_but_withheld": ["GH_PAT", "MY_URL"],
    }
    assert secret not in json.dumps(names) and "hunter2" not in json.dumps(names)


def test_scrub_modes_decide_from_whether_bwrap_runs(tmp_path: Path) -> None:
    empty = str(tmp_path)  # a PATH with no bwrap on it
    assert decide_scrub("off", {"PATH": empty}) == ScrubDecision(False)
    auto = decide_scrub("auto", {"PATH": empty})
    assert not auto.enabled and auto.warning is not None and "bwrap not found on PATH" in auto.warning
    with pytest.raises(SettingsError, match="apt-get install -y bubblewrap"):
        decide_scrub("on", {"PATH": empty})


def test_the_parent_mapping_is_not_modified() -> None:
    parent = {**BASE, "GITHUB_TOKEN": "gh"}
    child_environment(parent, credential=(CRED, "x"))
    session_environment(parent, allow=["*"], credential_var=CRED, credential_value="x")

    assert parent == {**BASE, "GITHUB_TOKEN": "gh"}


# --- read_secret -------------------------------------------------------------------------
def test_read_secret_prefers_the_variable(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("from-file\n")

    assert read_secret("TOKEN_X", {"TOKEN_X": "from-env", "TOKEN_X_FILE": str(secret)}) == "from-env"


def test_read_secret_falls_back_to_the_file_stripped(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("  from-file \n")

    assert read_secret("TOKEN_X", {"TOKEN_X_FILE": str(secret)}) == "from-file"
    assert read_secret("TOKEN_X", {"TOKEN_X": "", "TOKEN_X_FILE": str(secret)}) == "from-file"


def test_read_secret_none_when_neither_is_set() -> None:
    assert read_secret("TOKEN_X", {"OTHER": "1"}) is None


@pytest.mark.parametrize("problem", ["missing", "directory", "empty"])
def test_read_secret_bad_file_is_an_error_naming_the_variable(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "secret"
    if problem == "directory":
        path.mkdir()
    elif problem == "empty":
        path.write_text("\n")

    with pytest.raises(SettingsError, match="TYPESAFE_API_KEY_FILE"):
        read_secret("TYPESAFE_API_KEY", {"TYPESAFE_API_KEY_FILE": str(path)})


# --- /proc/<pid>/environ ------------------------------------------------------------------------
# A session runs as the same user as its worker. Root reads every /proc file, so both sides run
# as `nobody` when the tests run as root: only the non-dumpable flag stands between them.
_TARGET = r"""
import importlib.util, sys, types
pkg = types.ModuleType("dispatchq"); pkg.__path__ = [sys.argv[1]]; sys.modules["dispatchq"] = pkg
name = "dispatchq.launcher.environment"
spec = importlib.util.spec_from_file_location(name, sys.argv[1] + "/launcher/environment.py")
mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
marked = mod.mark_non_dumpable() if sys.argv[2] == "1" else False
print(marked, mod.is_dumpable(), flush=True)
sys.stdin.read()
"""


def _as_other_user() -> dict[str, object]:
    if os.geteuid() != 0:
        return {}
    return {"user": 65534, "group": 65534, "extra_groups": []}


def _python_for(run_as: dict[str, object]) -> str:
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = [
            candidate,
            "-c",
            f"open({str(FAKE)!r}).read(); open({str(REPO / 'dispatchq' / 'errors.py')!r})",
        ]
        try:
            ok = subprocess.run(probe, cwd="/", capture_output=True, timeout=30, **run_as).returncode == 0
        except OSError:
            ok = False
        if ok:
            return candidate
    cannot_run("no python3 the unprivileged user can run with this checkout readable")


def _read_environ_of(mark: bool, report_dir: Path) -> tuple[dict, str, str]:
    run_as = _as_other_user()
    python = _python_for(run_as)
    secret = "s3cr3t-" + os.urandom(4).hex()
    target = subprocess.Popen(
        [python, "-c", _TARGET, str(REPO / "dispatchq"), "1" if mark else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "WORKER_SECRET_TOKEN": secret},
        text=True,
        **run_as,
    )
    try:
        assert target.stdout is not None
        status = target.stdout.readline().strip()
        report = report_dir / f"report-{int(mark)}.json"
        subprocess.run(
            [python, str(FAKE), "-p"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd="/",
            env={
                "PATH": "/usr/bin:/bin",
                "FAKE_CLAUDE_READ_ENVIRON": str(target.pid),
                "FAKE_CLAUDE_ENVIRON_REPORT": str(report),
            },
            timeout=60,
            check=True,
            **run_as,
        )
        return json.loads(report.read_text())[str(target.pid)], secret, status
    finally:
        target.kill()
        target.wait()
        for pipe in (target.stdin, target.stdout):  # closed here, not left to the collector
            if pipe is not None:
                pipe.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")
def test_non_dumpable_process_environ_is_unreadable_to_the_same_user(shared_dir: Path) -> None:
    control, secret, control_status = _read_environ_of(False, shared_dir)
    if not control["ok"]:
        cannot_run(f"/proc/<pid>/environ of a same-user process is unreadable here: {control['error']}")
    assert control["environ"]["WORKER_SECRET_TOKEN"] == secret  # the hole the flag closes
    assert control_status == "False True"

    marked, secret, status = _read_environ_of(True, shared_dir)

    assert status == "True False"
    assert marked["ok"] is False
    assert secret not in json.dumps(marked)
