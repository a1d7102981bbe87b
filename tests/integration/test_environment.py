"""The scrubbed child environment, `<NAME>_FILE` secrets, and the non-dumpable flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dispatchq.errors import SettingsError
from dispatchq.launcher.environment import (
    child_environment,
    is_secret_name,
    read_secret,
    session_environment,
)
from dispatchq.launcher.scrub import ScrubDecision, decide_scrub

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "support" / "fake_claude.py"

BASE = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/home/u",
    "USER": "u",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "xterm",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
    "EDITOR": "vim",
}


@pytest.mark.parametrize(
    "name",
    [
        "GITHUB_TOKEN",
        "github_token",
        "AWS_SECRET_ACCESS_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "CLAUDE_CODE_OAUTH_TOKEN_FILE",
        "DB_PASSWORD",
        "PGPASSWORD",
        "MYSQL_PWD",
        "OPENAI_APIKEY",
        "LDAP_PASSWD",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DOCKER_CREDENTIAL",
        "NPM_CONFIG__AUTH",
        "GPG_PRIVATE_KEY",
        "WEBHOOK_SIGNATURE",
        "SESSION_COOKIE",
        "SENTRY_DSN",
        "KEY",
        "TYPESAFE_API_KEY",
        "TYPESAFE_API_KEY_FILE",
    ],
)
def test_secret_shaped_names_are_withheld(name: str) -> None:
    env = child_environment({**BASE, name: "s3cr3t"})

    assert name not in env
    assert "s3cr3t" not in env.values()


@pytest.mark.parametrize(
    "name",
    ["GIT_AUTHOR_NAME", "TOKENIZERS_PARALLELISM", "XAUTHORITY", "KEYBOARD_LAYOUT", "PASSENGER_HOME", "PWD"],
)
def test_names_that_only_contain_a_secret_word_pass(name: str) -> None:
    assert not is_secret_name(name)
    assert child_environment({name: "v"}) == {name: "v"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgres://app:hunter2@db:5432/app"),
        ("REDIS_URL", "redis://:hunter2@cache:6379/0"),
        ("MIRROR", "https://deploy@git.example.com/repo.git"),
        ("EXTRA_OPTS", "--index-url=https://u:hunter2@pypi.example.com/simple"),
        ("INPUT_NAME", "whatever"),
        ("INPUT_GITHUB_TOKEN", "whatever"),
        ("BASH_FUNC_deploy%%", "() {  curl -H 'x'; }"),
        ("MYFUNC", "() { :; }"),
        ("DISPATCHQ_REDIS_URL", "redis://localhost:6379"),
        ("DISPATCHQ_TIMEZONE", "Europe/Berlin"),
        ("dispatchq_config", "x.yaml"),
        ("CLAUDECODE", "1"),
    ],
)
def test_value_shapes_and_reserved_prefixes_are_withheld(name: str, value: str) -> None:
    assert name not in child_environment({**BASE, name: value})


def test_everything_else_passes_unchanged() -> None:
    parent = {**BASE, "FOO": "bar", "PLAIN_URL": "https://example.com/x?y=1", "EMPTY": ""}

    assert child_environment(parent) == parent


def test_keep_list_wins_over_patterns_but_never_for_a_url_password() -> None:
    parent = {
        **BASE,
        "XDG_SECRET_DIR": "/run/user/1000/secrets",  # a kept prefix despite SECRET
        "HTTP_PROXY": "http://proxy:3128",
        "https_proxy": "http://alice@proxy:3128",  # userinfo without a password: kept
        "HTTPS_PROXY": "http://alice:hunter2@proxy:3128",
        "ALL_PROXY": "socks5://bob:pw@proxy:1080",
        "NO_PROXY": "localhost,127.0.0.1",
        "SSL_CERT_FILE": "/etc/ssl/cert.pem",
        "REQUESTS_CA_BUNDLE": "/etc/ssl/cert.pem",
        "NODE_EXTRA_CA_CERTS": "/etc/ssl/extra.pem",
        "CLAUDE_CONFIG_DIR": "/home/u/.claude-work",
    }
    env = child_environment(parent)

    kept = set(parent) - {"HTTPS_PROXY", "ALL_PROXY"}
    assert set(env) == kept
    assert env["https_proxy"] == "http://alice@proxy:3128"


def test_deny_list_takes_exact_names_and_globs_and_wins_over_the_keep_list() -> None:
    parent = {**BASE, "MY_ONE": "1", "MY_TWO": "2", "OTHER": "3"}
    env = child_environment(parent, deny=["EDITOR", "MY_*", "HOME", " "])

    assert set(env) == set(BASE) - {"EDITOR", "HOME"} | {"OTHER"}


def test_exactly_one_credential_is_added_after_the_scrub() -> None:
    parent = {
        **BASE,
        "CLAUDE_CODE_OAUTH_TOKEN": "from-parent",
        "ANTHROPIC_API_KEY": "other",
        "TYPESAFE_API_KEY": "ts",
    }
    env = child_environment(parent, credential=("CLAUDE_CODE_OAUTH_TOKEN", "given"))

    assert env["CLAUDE_CODE_OAUTH_TOKEN"] == "given"
    assert [name for name in env if is_secret_name(name) and name not in BASE] == ["CLAUDE_CODE_OAUTH_TOKEN"]


@pytest.mark.parametrize("name", ["TYPESAFE_API_KEY", "typesafe_api_key_file", "DISPATCHQ_X", "BAD NAME", ""])
def test_forbidden_credential_names_are_refused(name: str) -> None:
    with pytest.raises(SettingsError):
        child_environment(BASE, credential=(name, "v"))


def test_session_environment_adds_the_scrub_flag_and_its_credential() -> None:
    parent = {**BASE, "CLAUDECODE": "1", "GITHUB_TOKEN": "gh", "DISPATCHQ_SESSION_TIMEOUT": "60"}
    env = session_environment(
        parent, deny=["EDITOR"], credential_var="CLAUDE_CODE_OAUTH_TOKEN", credential_value="tok"
    )

    assert env == {
        **{k: v for k, v in BASE.items() if k != "EDITOR"},
        "CLAUDE_CODE_OAUTH_TOKEN": "tok",
        "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "1",
    }


def test_session_environment_without_a_credential_value_adds_none() -> None:
    env = session_environment(BASE, credential_var="CLAUDE_CODE_OAUTH_TOKEN", credential_value=None)

    assert "CLAUDE_CODE_OAUTH_TOKEN" not in env
    assert env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "1"
    with pytest.raises(SettingsError):
        session_environment(BASE, credential_var="TYPESAFE_API_KEY", credential_value=None)


def test_without_usable_bubblewrap_the_scrub_flag_is_an_explicit_zero() -> None:
    # Claude Code refuses to start with the flag set and no bwrap; a parent's own `1` must not leak.
    parent = {**BASE, "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "1"}
    env = session_environment(
        parent, credential_var="CLAUDE_CODE_OAUTH_TOKEN", credential_value="tok", scrub_subprocesses=False
    )
    assert env["CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"] == "0"


def test_scrub_modes_decide_from_whether_bwrap_runs(tmp_path: Path) -> None:
    empty = str(tmp_path)  # a PATH with no bwrap on it
    assert decide_scrub("off", {"PATH": empty}) == ScrubDecision(False)
    auto = decide_scrub("auto", {"PATH": empty})
    assert not auto.enabled and auto.warning is not None and "bwrap not found on PATH" in auto.warning
    with pytest.raises(SettingsError, match="apt-get install -y bubblewrap"):
        decide_scrub("on", {"PATH": empty})


def test_the_parent_mapping_is_not_modified() -> None:
    parent = {**BASE, "GITHUB_TOKEN": "gh"}
    child_environment(parent, credential=("CLAUDE_CODE_OAUTH_TOKEN", "x"))

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
    pytest.skip("no python3 the unprivileged user can run with this checkout readable")


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


@pytest.fixture
def shared_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="dq-environ-"))
    path.chmod(0o1777)  # the unprivileged reader writes its report here
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")
def test_non_dumpable_process_environ_is_unreadable_to_the_same_user(shared_dir: Path) -> None:
    control, secret, control_status = _read_environ_of(False, shared_dir)
    if not control["ok"]:
        pytest.skip(f"/proc/<pid>/environ of a same-user process is unreadable here: {control['error']}")
    assert control["environ"]["WORKER_SECRET_TOKEN"] == secret  # the hole the flag closes
    assert control_status == "False True"

    marked, secret, status = _read_environ_of(True, shared_dir)

    assert status == "True False"
    assert marked["ok"] is False
    assert secret not in json.dumps(marked)
