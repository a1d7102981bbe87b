"""Where settings and the config file come from, with a real `dispatchq` in a hostile cwd.

A checkout's `.env` once replaced the session command and where the TypeSafe key is
sent, and its `dispatchq.yaml` named checks to import: both are now ignored unless
named (`DISPATCHQ_ENV_FILE`, `DISPATCHQ_CONFIG`). The executor's repository allowlist is
tested over the whole path: a signed delivery to a running `dispatchq serve`, a typed
worker, and a loopback fake of GitHub that records every write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatchq.storage.triage import TriageStorage
from tests.support.github_api import FakeGitHub
from tests.support.helpers import counting_check, run_cli
from tests.support.serve import PROXIES, Server, deliver, module_env, payload
from tests.support.settings_sources import HOSTILE_URL

GITHUB_TOKEN = "ghp_allowlist-test-token-0123456789"


def _env(dq_env: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in dq_env.items() if k != "DISPATCHQ_CONFIG"}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "xdg"), **extra)
    return env


def test_a_dotenv_in_the_cwd_is_ignored(dq_env: dict[str, str], tmp_path: Path, checkout: Path) -> None:
    done = run_cli(["settings", "--json"], _env(dq_env, tmp_path), cwd=checkout)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["DISPATCHQ_SESSION_COMMAND"]["value"] == "claude -p --output-format stream-json --verbose"
    assert shown["TYPESAFE_BASE_URL"]["value"] is None
    assert shown["DISPATCHQ_RESULT_TTL"]["value"] == 604800
    assert shown["config_file"] == {
        "path": str(tmp_path / "xdg" / "dispatchq" / "dispatchq.yaml"),
        "exists": False,
    }


def test_an_env_file_is_read_when_named_and_its_urls_are_held_to_https(
    dq_env: dict[str, str], tmp_path: Path, checkout: Path
) -> None:
    named = _env(dq_env, tmp_path, DISPATCHQ_ENV_FILE=str(checkout / ".env"))
    refused = run_cli(["settings"], named, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: TYPESAFE_BASE_URL: must be https://, or http:// to a loopback host only: a credential "
        f"is sent there (got {HOSTILE_URL!r})"
    ]
    good = tmp_path / "dq.env"
    good.write_text("DISPATCHQ_RESULT_TTL=7\nTYPESAFE_BASE_URL=https://typesafe.example\n")
    done = run_cli(["settings", "--json"], _env(dq_env, tmp_path, DISPATCHQ_ENV_FILE=str(good)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["DISPATCHQ_RESULT_TTL"]["value"], shown["TYPESAFE_BASE_URL"]["value"]) == (
        7,
        "https://typesafe.example",
    )


@pytest.mark.parametrize("name", ["TYPESAFE_BASE_URL", "DISPATCHQ_GITHUB_API_URL"])
def test_an_http_url_for_a_credential_is_one_line_naming_the_field(
    dq_env: dict[str, str], tmp_path: Path, name: str
) -> None:
    done = run_cli(["status"], _env(dq_env, tmp_path, **{name: "http://u:hunter2@api.example/v1"}))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {name}: must be https://") and "Traceback" not in done.stderr
    assert "hunter2" not in line and "u:***@api.example" in line


def test_the_cwd_config_is_not_loaded_and_the_loaded_one_is_named_at_start(
    dq_env: dict[str, str], tmp_path: Path, checkout: Path
) -> None:
    marker = checkout / "imported"
    unnamed = run_cli(["worker", "code", "--burst"], _env(dq_env, tmp_path), cwd=checkout)
    assert unnamed.returncode == 0, unnamed.stderr
    default = tmp_path / "xdg" / "dispatchq" / "dispatchq.yaml"
    assert f"config: none loaded (no file at {default}; set DISPATCHQ_CONFIG to name one)" in unnamed.stderr
    assert not marker.exists()  # the checkout's check module was never imported
    refused = run_cli(["enqueue", "--kind", "planted", "--state", "{}"], _env(dq_env, tmp_path), cwd=checkout)
    assert refused.returncode == 2 and f"{default}: config file not found" in refused.stderr

    # The folder dispatchq names is read; an explicit DISPATCHQ_CONFIG is too, and said so.
    default.parent.mkdir(parents=True)
    default.write_text("kinds: {}\n")
    folder = run_cli(["worker", "code", "--burst"], _env(dq_env, tmp_path), cwd=checkout)
    assert f"config: loaded {default}" in folder.stderr, folder.stderr
    named = _env(dq_env, tmp_path, DISPATCHQ_CONFIG="dispatchq.yaml")  # relative: to the cwd, named
    explicit = run_cli(["worker", "code", "--burst"], named, cwd=checkout)
    assert explicit.returncode == 0, explicit.stderr
    assert f"config: loaded {checkout / 'dispatchq.yaml'}" in explicit.stderr
    assert marker.exists()


# --- triage.repositories over real HTTP -----------------------------------------------------------

TRIAGE = """\
kinds:
  echo:
    check: {check}
triage:
  mode: auto
  executor: github
{repositories}  rules:
    - id: mark-opened
      events: [issues.opened]
      actions:
        - {{op: label.add, label: seen}}
"""


@pytest.mark.parametrize(
    ("repositories", "acted"), [("[acme/widgets]", False), ("[acme/widgets, codertocat/hello-world]", True)]
)
def test_a_delivery_for_an_unlisted_repository_is_recorded_and_not_acted_on(
    redis_server: Any, redis_client: Any, tmp_path: Path, repositories: str, acted: bool
) -> None:
    check, _ = counting_check(tmp_path, answer="'ok'")
    target = "Codertocat/Hello-World#1"
    with FakeGitHub(GITHUB_TOKEN) as github:
        github.issue(target)
        env = module_env(
            redis_server,
            tmp_path,
            check,
            DISPATCHQ_GITHUB_TOKEN=GITHUB_TOKEN,
            DISPATCHQ_GITHUB_API_URL=github.url,
        )
        env = {k: v for k, v in env.items() if k not in PROXIES}
        (tmp_path / "dispatchq.yaml").write_text(
            TRIAGE.format(check=check, repositories=f"  repositories: {repositories}\n")
        )
        with Server(env, tmp_path) as server:
            reply = deliver(
                server.port, "issues", payload("issues", "opened.payload.json"), delivery="d-allow"
            )
            assert reply.status == 202, reply.body
            decision = reply.json["decision_id"]
            assert "triage.repositories is not set" not in server.output
        done = run_cli(["worker", "typed", "--burst"], env, timeout=180)
        assert done.returncode == 0, done.stderr
        stored = TriageStorage(redis_client).decision(decision)
        writes = [(w.method, w.path) for w in github.writes]
    assert stored is not None and stored["result"] is not None, "the delivery's run is recorded either way"
    result = stored["result"]
    if acted:
        assert writes == [("POST", "/repos/Codertocat/Hello-World/issues/1/labels")]
        assert [e["executed"] for e in result["applied"]] == ["performed: label seen added"]
    else:
        assert writes == []
        assert result["applied"] == []
        assert [e["executed"] for e in result["failed"]] == [
            "refused: Codertocat/Hello-World is not in triage.repositories"
        ]


def test_without_an_allowlist_serve_warns_at_start(redis_server: Any, tmp_path: Path) -> None:
    check, _ = counting_check(tmp_path, answer="'ok'")
    env = module_env(redis_server, tmp_path, check)
    (tmp_path / "dispatchq.yaml").write_text(TRIAGE.format(check=check, repositories=""))
    with Server(env, tmp_path) as server:
        pass
    assert "triage.repositories is not set: the github executor acts on any repository" in server.output
    assert f"config: loaded {tmp_path / 'dispatchq.yaml'}" in server.output
