"""A pool with Codex credentials, and kinds that say which backends may answer them.

`credentials.<name>.backend: codex` takes `auth_file` (a ChatGPT plan's auth.json) or
`api_key_file` (an OpenAI key); `kinds.<name>.session.backends` names the CLIs that may
answer (default: the pool's first credential's), `session.prompts` a backend's own prompt.
Every mistake is one line naming its field. Routing then refuses a credential of another
backend, and the session tier runs each backend's own command with its own prompt.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dispatchq.backends import command_for
from dispatchq.config import parse_config
from dispatchq.core.kinds import SessionSpec
from dispatchq.errors import ConfigError
from dispatchq.pools.credentials import CODEX_API_KEY_VAR, CODEX_AUTH_VAR, Credential, SpendCap
from dispatchq.pools.routing import CredentialState, route
from dispatchq.settings import Settings
from dispatchq.tiers.preflight import unrunnable_backends

HERE = Path("/etc/dispatchq/dispatchq.yaml")
PLAN = {"backend": "codex", "auth_file": "/etc/dispatchq/codex-plan.json"}
TEAM = {"token_file": "/etc/dispatchq/team-max"}


def parse(document: dict[str, Any]) -> Any:
    return parse_config(document, HERE, builtin={})


def problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(document)
    return caught.value.problems


def kind(**session: Any) -> dict[str, Any]:
    return {"k": {"session": {"prompt": "Decide {{ target }}", **session}}}


def test_codex_credentials_are_a_plan_login_or_a_metered_key() -> None:
    pool = parse(
        {
            "credentials": {
                "team": TEAM,
                "plan": PLAN,
                "api": {
                    "backend": "codex",
                    "api_key_file": "/etc/dispatchq/openai",
                    "spend_cap": {"day": 5.0},
                },
            }
        }
    ).credentials
    team, plan, api = pool.credentials
    assert (team.backend, team.variable, team.billing) == (
        "claude",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "subscription",
    )
    assert (plan.backend, plan.variable, plan.billing) == ("codex", CODEX_AUTH_VAR, "subscription")
    assert plan.file == "/etc/dispatchq/codex-plan.json"
    assert (api.backend, api.variable, api.billing) == ("codex", "CODEX_API_KEY", "metered")


@pytest.mark.parametrize(
    ("credential", "line"),
    [
        (
            {"backend": "codex", "token_file": "/t"},
            "credentials.c.token_file: token_file is for backend claude; backend codex takes auth_file or"
            " api_key_file",
        ),
        (
            {"auth_file": "/a"},
            "credentials.c.auth_file: auth_file is for backend codex; backend claude takes token_file or"
            " api_key_file",
        ),
        (
            {"backend": "codex", "auth_file": "/a", "api_key_file": "/k"},
            "credentials.c: give exactly one of auth_file (a ChatGPT plan's auth.json) or api_key_file"
            " (an OpenAI API key)",
        ),
        ({"backend": "codex"}, "credentials.c: give exactly one of auth_file"),
        ({"backend": "gemini", "token_file": "/t"}, "credentials.c.backend: must be claude or codex"),
        ({"backend": "codex", "api_key_file": "/k"}, "credentials.c: a metered credential needs spend_cap"),
    ],
)
def test_a_codex_credential_mistake_names_its_field(credential: dict[str, Any], line: str) -> None:
    found = problems({"credentials": {"c": credential}})
    assert any(p.startswith(line) for p in found), found


def test_a_kind_names_its_backends_and_a_prompt_for_one() -> None:
    config = parse(
        {
            "credentials": {"team": TEAM, "plan": PLAN},
            "kinds": kind(backends=["claude", "codex"], prompts={"codex": "Answer only: {{ target }}"}),
        }
    )
    spec = config.kinds["k"].session
    assert spec.backends == ("claude", "codex")
    assert spec.prompt_for("codex") == "Answer only: {{ target }}"
    assert spec.prompt_for("claude") == "Decide {{ target }}"


def test_the_backends_change_the_kinds_digest() -> None:
    credentials = {"team": TEAM, "plan": PLAN}
    both = parse({"credentials": credentials, "kinds": kind(backends=["claude", "codex"])}).kinds["k"]
    one = parse({"credentials": credentials, "kinds": kind()}).kinds["k"]
    assert both.digest != one.digest


@pytest.mark.parametrize(
    ("credentials", "session", "line"),
    [
        (None, {"backends": ["codex"]},
         "kinds.k.session.backends[0]: no credential runs codex (credentials: default (claude))"),
        ({"team": TEAM}, {"backends": ["claude", "codex"]},
         "kinds.k.session.backends[1]: no credential runs codex (credentials: team (claude))"),
        ({"plan": PLAN}, {"backends": ["codex", "codex"]}, "kinds.k.session.backends[1]: names codex twice"),
        ({"plan": PLAN}, {"backends": ["codex"], "prompts": {"claude": "x"}},
         "kinds.k.session.prompts.claude: claude is not one of session.backends (codex)"),
        ({"plan": PLAN}, {"prompts": {"codex": "x"}},
         "kinds.k.session.prompts.codex: codex is not one of session.backends (none: add session.backends)"),
        ({"plan": PLAN, "team": TEAM}, {"backends": ["claude", "codex"], "model": "opus"},
         "kinds.k.session.model: a model is one CLI's name; a kind answered by claude and codex gives none"),
        ({"plan": PLAN, "team": TEAM}, {"backends": ["claude", "codex"], "args": ["--max-turns", "3"]},
         "kinds.k.session.args: args are one CLI's words; a kind answered by claude and codex gives none"),
        ({"plan": PLAN}, {"backends": []}, "kinds.k.session.backends: "),
        ({"plan": PLAN}, {"backends": ["codex"], "prompts": {"codex": "{{ nope }}"}},
         "kinds.k.session.prompts.codex: unknown placeholder"),
    ],
)  # fmt: skip
def test_a_kinds_backends_mistake_names_its_field(
    credentials: dict[str, Any] | None, session: dict[str, Any], line: str
) -> None:
    document: dict[str, Any] = {"kinds": kind(**session)}
    if credentials is not None:
        document["credentials"] = credentials
    found = problems(document)
    assert any(p.startswith(line) for p in found), found


# --- routing -------------------------------------------------------------------------------
NOW = 1_796_000_000.0
TEAM_CRED = Credential("team")
PLAN_CRED = Credential("plan", variable=CODEX_AUTH_VAR, backend="codex")
KEY_CRED = Credential("api", variable=CODEX_API_KEY_VAR, backend="codex", billing="metered",
                      spend_cap=SpendCap(day=5.0))  # fmt: skip


def names(credentials: tuple[Credential, ...]) -> list[str]:
    return [c.name for c in credentials]


def test_a_kind_that_names_no_backend_runs_on_the_pools_first_backend_only() -> None:
    states = [CredentialState(TEAM_CRED), CredentialState(PLAN_CRED)]
    plan = route(states, priority=None, kind="k", now=NOW)
    assert names(plan.usable) == ["team"]
    (refused,) = plan.refusals
    assert (refused.credential, refused.cause) == ("plan", "serves")
    assert refused.why == "runs codex, not claude"


def test_a_kind_for_both_backends_runs_on_whichever_has_room() -> None:
    closed = CredentialState(TEAM_CRED, slots_used=1)
    plan = route(
        [closed, CredentialState(PLAN_CRED)], priority=None, kind="k", now=NOW, backends=("claude", "codex")
    )
    assert names(plan.usable) == ["plan"]
    codex_only = route(
        [CredentialState(TEAM_CRED), CredentialState(PLAN_CRED), CredentialState(KEY_CRED, estimate=0.1)],
        priority=None, kind="k", now=NOW, backends=("codex",),
    )  # fmt: skip
    assert names(codex_only.usable) == ["plan", "api"]  # a subscription before a metered key


def test_a_backend_this_host_cannot_run_is_routed_around_naming_why() -> None:
    why = "codex sessions cannot start on host h1: 'codex' not found on PATH"
    states = [CredentialState(PLAN_CRED), CredentialState(TEAM_CRED)]
    plan = route(
        states, priority=None, kind="k", now=NOW, backends=("codex", "claude"), unrunnable={"codex": why}
    )
    assert names(plan.usable) == ["team"]
    (refused,) = plan.refusals
    assert (refused.credential, refused.why, refused.cause) == ("plan", why, "blocked")
    only = route(states, priority=None, kind="k", now=NOW, backends=("codex",), unrunnable={"codex": why})
    assert only.waiting and only.opens_at is None  # waits for a host that has the command


def _path_with(tmp_path: Path, *names: str) -> dict[str, str]:
    """A PATH holding an executable of each of `names` (and nothing else)."""
    for name in names:
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    return {"PATH": str(tmp_path)}


@pytest.mark.parametrize(
    ("installed", "pool", "unrunnable"),
    [
        (("claude",), ("claude", "codex"), ["codex"]),  # Codex missing: its credentials routed around
        (("codex",), ("claude", "codex", "codex"), ["claude"]),
        (("claude", "codex"), ("claude", "codex"), []),
        ((), ("claude", "codex"), []),  # nothing runs here: the host breaker's, as ever
        ((), ("codex",), []),  # one backend: the host breaker's too
    ],
)
def test_only_a_missing_command_beside_a_present_one_is_routed_around(
    tmp_path: Path, installed: tuple[str, ...], pool: tuple[str, ...], unrunnable: list[str]
) -> None:
    settings = Settings(session_command="claude -p", codex_command="codex", host="h1")
    found = unrunnable_backends(pool, settings, _path_with(tmp_path, *installed))
    assert sorted(found) == unrunnable
    for backend in unrunnable:
        assert found[backend] == f"{backend} sessions cannot start on host h1: {backend!r} not found on PATH"


# --- the tier's choices --------------------------------------------------------------------
def test_each_backend_runs_its_own_command() -> None:
    settings = Settings(codex_command="/opt/codex/bin/codex --profile ci")
    assert command_for("codex", settings) == "/opt/codex/bin/codex --profile ci"
    assert command_for("claude", settings) == settings.session_command
    assert Settings().codex_command == "codex"


def test_a_prompt_for_another_backend_leaves_the_kinds_prompt() -> None:
    spec = SessionSpec("kind's", backends=("claude", "codex"), prompts=(("codex", "codex's"),))
    assert spec.prompt_for("codex") == "codex's"
    assert spec.prompt_for("claude") == "kind's"
    assert replace(spec, prompts=()).prompt_for("codex") == "kind's"
