"""The Codex look-around's world, on top of tests/support/look_around_world.py's.

A pool of a Claude Code credential and two Codex ones, a ChatGPT plan's login (`auth_file`) and
an OpenAI API key (`api_key_file`), the other form serving no Codex kind; a kind only Codex may answer;
a waiting neighbour judgement's `CODEX_HOME` holding another account's login. The probe
(tests/support/look_around.py) stands in for `DISPATCHQ_CODEX_COMMAND`, gets the `codex`
backend's argv and answers in `codex exec --json`'s shape. It is told every credential file, every
value but its own (`other_credentials`) and its own (`own_credential`: the key, or the login's
text with `credential_file: auth.json`, the file its `CODEX_HOME` holds it in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.support.look_around_world import CREDENTIAL_VALUE, Look, Planted, look_around, plant_neighbour
from tests.support.pool_config import secret_file, write_pool
from tests.support.session import Harness

__all__ = [
    "API_KEY",
    "CLAUDE_TOKEN",
    "CODEX_KIND",
    "FORMS",
    "NEIGHBOUR_LOGIN",
    "PLAN_LOGIN",
    "CodexPool",
    "access_token",
    "codex_pool",
    "look_as_codex",
]

#: The two forms of a Codex credential: a plan's login as `auth.json`, an API key as a variable.
FORMS = ("plan", "key")
#: The kind the probe is asked under: `session.backends: [codex]`.
CODEX_KIND = "look"
CLAUDE_TOKEN = "sk-ant-oat01-team-a-" + "w" * 24
API_KEY = "sk-proj-codex-key-" + "z" * 32


def _login(account: str, letter: str) -> str:
    """An `auth.json` as `codex login` writes it (a JWT-shaped id token, an access token)."""
    tokens = {
        "id_token": "eyJhbGciOiJSUzI1NiJ9.eyJlbWFpbCI6ImRxIn0." + letter * 32,
        "access_token": f"codex-{account}-access-" + letter * 24,
        "refresh_token": f"codex-{account}-refresh-" + letter * 24,
        "account_id": f"account-{account}",
    }
    return json.dumps({"OPENAI_API_KEY": None, "tokens": tokens, "last_refresh": "2026-12-01T00:00:00Z"})


PLAN_LOGIN = _login("plan", "x")
NEIGHBOUR_LOGIN = _login("neighbour", "v")


def access_token(login: str) -> str:
    return str(json.loads(login)["tokens"]["access_token"])


@dataclass(frozen=True)
class CodexPool:
    """Which form the session was given, and where every credential's file is."""

    form: str
    claude_file: Path
    plan_file: Path
    key_file: Path
    neighbour: Path  # another judgement's CODEX_HOME/auth.json

    @property
    def files(self) -> list[str]:
        return [str(self.claude_file), str(self.plan_file), str(self.key_file)]


def codex_pool(h: Harness, planted: Planted, form: str) -> CodexPool:
    """Write the pool (`form`'s Codex credential the only one for the kind) and tell the probe."""
    claude_file = secret_file(h, "team-a", CLAUDE_TOKEN)
    plan_file = secret_file(h, "codex-plan.json", PLAN_LOGIN)
    key_file = secret_file(h, "codex-key", API_KEY)
    # The other form serves only a kind no Codex session runs: pooled, its file on the host, never
    # chosen (a plan would otherwise go first: free quota before metered).
    aside = "serves:\n            kinds: [ask]"
    write_pool(
        h,
        f"""
        team-a:
          token_file: {claude_file}
        codex-plan:
          backend: codex
          auth_file: {plan_file}
          {aside if form == "key" else ""}
        codex-key:
          backend: codex
          api_key_file: {key_file}
          spend_cap:
            day: 50
          {aside if form == "plan" else ""}
        """,
        kinds_extra=f"""
          {CODEX_KIND}:
            session:
              prompt: "Answer {{{{ target }}}}"
              backends: [codex]
        """,
    )

    # A neighbour: a judgement waiting (its credential closed), so the worker's sweep keeps its
    # folder, with another account's login in its CODEX_HOME.
    def close() -> None:
        argv = ["window", "close", "--until", "2h", "--credential", "team-a", "--reason", "a neighbour"]
        closed = h.cli(*argv)
        assert closed.returncode == 0, closed.stderr

    neighbour = plant_neighbour(h, planted, "ask", {"config/auth.json": NEIGHBOUR_LOGIN}, close).files[0]
    pool = CodexPool(form, claude_file, plan_file, key_file, neighbour)
    others = [CLAUDE_TOKEN, CREDENTIAL_VALUE, access_token(NEIGHBOUR_LOGIN)]
    if form == "plan":
        own, others = PLAN_LOGIN, [*others, API_KEY]
        planted.context.update(credential="", credential_file="auth.json")
    else:
        own, others = API_KEY, [*others, access_token(PLAN_LOGIN)]
        planted.context.update(credential="CODEX_API_KEY")
    planted.context.update(own_credential=own, other_credentials=others)
    planted.context["secret_files"] += pool.files
    return pool


def look_as_codex(h: Harness, planted: Planted, pool: CodexPool, sandbox: str, store: str) -> Look:
    """One Codex session of the `look` kind, the probe as `DISPATCHQ_CODEX_COMMAND`."""
    return look_around(
        h,
        planted,
        sandbox,
        store,
        kind=CODEX_KIND,
        command_setting="DISPATCHQ_CODEX_COMMAND",
        backend=f"codex:{pool.form}",
    )
