"""The look-around from a Codex session: a real `dispatchq worker session` runs the probe as
`DISPATCHQ_CODEX_COMMAND` for a kind only Codex may answer, in a pool that also holds a Claude
Code credential.

The probe (tests/support/look_around.py) gets the `codex` backend's argv (`exec --json … -`) and
answers as `codex exec --json` does; the world is test_look_around.py's (planted secrets,
sockets, a listener, another process, another judgement's folder) plus the pool's three
credential files and a neighbour judgement's `CODEX_HOME` with another account's login. Each
Codex credential form is tried as the chosen one, the other form pooled behind it:

- `plan`: the login reaches the session only as `auth.json` in its own `CODEX_HOME`. The probe
  counts that file as its one credential (dispatchq wrote it there for this session alone, as it
  hands a key over as a variable), never as a way out; any other text in it would be a finding.
- `key`: the key reaches it only as `CODEX_API_KEY`, and its `CODEX_HOME` holds no login.

Confined, the report must hold nothing else: no other credential's value or file, no Redis, no
canary, no foreign process. Unconfined, the same probe must find what was planted, which is what
makes the zeros mean something. `BENCH_LOOK_AROUND_FIGURES` collects the per-kind counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.look_around_codex import FORMS, CodexPool, codex_pool, look_as_codex
from tests.support.look_around_world import (
    KINDS,
    Look,
    Planted,
    StoreHarness,
    assert_reached_the_planted_doors,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]

#: Every variable Codex reads a credential from, and Claude Code's: only the chosen key may show.
CREDENTIAL_NAMES = {
    "OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN", "CODEX_AUTH_JSON",
    "CLAUDE_CODE_OAUTH_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
}  # fmt: skip


def add_external_target(h: StoreHarness, planted: Planted) -> None:
    """On the external server the attacker knows its port (and may push jobs there)."""
    url = h.env.get("DISPATCHQ_REDIS_URL")
    if url:
        port = url.rsplit(":", 1)[1]
        planted.context["forbidden"].append(f"127.0.0.1:{port}")
        planted.context["job_targets"].append(f"127.0.0.1:{port}")


def assert_its_one_credential(look: Look, pool: CodexPool) -> None:
    """It ran as Codex, with the chosen credential in the chosen form and no other."""
    report = look.report
    assert report["run_as"] == "codex", look.explain()
    environment = report["info"]["environment"]
    assert environment["credential_present"] is True, look.explain()
    assert environment["credential_is_own"] is True, look.explain()
    names = set(environment["names"])
    assert "CODEX_HOME" in names, look.explain()
    expected = {"CODEX_API_KEY"} if pool.form == "key" else set()
    assert names & CREDENTIAL_NAMES == expected, look.explain()
    own_files = report["info"].get("own_config_files", [])
    if pool.form == "plan":
        assert own_files == [report["info"]["credential_file"]], look.explain()
    else:
        assert own_files == [], look.explain()


def read_paths(look: Look) -> set[str]:
    return {item["path"] for item in look.found("files")}


# --- confined: nothing but the one credential ---------------------------------------------------
@pytest.mark.parametrize("form", FORMS)
def test_a_confined_codex_session_finds_nothing_but_its_one_credential(
    look_store: StoreHarness, planted: Planted, form: str
) -> None:
    pool = codex_pool(look_store, planted, form)
    add_external_target(look_store, planted)
    look = look_as_codex(look_store, planted, pool, "on", look_store.store_name)
    assert look.counts == dict.fromkeys(KINDS, 0), look.explain()
    assert_its_one_credential(look, pool)
    info = look.report["info"]
    assert info["processes"]["foreign"] == 0, look.explain()
    assert "errors" not in info, look.explain()
    assert not read_paths(look) & {*pool.files, str(pool.neighbour)}, look.explain()
    assert not Path(look.report["cwd"]).is_relative_to(Path(planted.context["data_dir"])), look.explain()


# --- unconfined: the same probe finds what was planted ---------------------------------------------
@pytest.mark.parametrize("look_store", ["embedded"], indirect=True)
@pytest.mark.parametrize("form", FORMS)
def test_an_unconfined_codex_session_finds_what_was_planted(
    look_store: StoreHarness, planted: Planted, form: str
) -> None:
    """The control: sandbox off, the probe reads every credential file (the Claude one, both
    Codex ones, the neighbour's login), reaches the sockets and the listener, sees the other
    process's secrets and writes into the data dir. The environment is an allowlist whether or
    not the sandbox is on: it still carries only the chosen credential."""
    pool = codex_pool(look_store, planted, form)
    look = look_as_codex(look_store, planted, pool, "off", look_store.store_name)
    assert "errors" not in look.report["info"], look.explain()
    assert_its_one_credential(look, pool)
    read = read_paths(look)
    for path in [*planted.context["secret_files"], str(pool.neighbour)]:
        assert path in read, look.explain()
    assert str(Path(planted.env["HOME"]) / ".netrc") in read, look.explain()
    assert not [f for f in look.found("environment") if "another pool credential" in f["why"]], look.explain()
    assert_reached_the_planted_doors(look, planted)
