"""A session that looks around as an attacker would, through a real `dispatchq worker session`.

The session command is tests/support/look_around.py: it reads its prompt, looks at its
environment, the secret files, the data dir, the homes, every socket it can find, every loopback
port, abstract sockets, `/proc/*/environ` and `cmdline`, tries a canary write into dispatchq's
folders and, where it reached a Redis, pushes a job; it answers with a JSON report. The test
plants secrets the way an operator has them (files named by `*_FILE`, variables the old scrub
missed, a HOME with logins, an ssh-agent socket, another process holding secrets, a loopback
listener, an abstract socket, another judgement waiting beside it with secrets in its session
folder) and tells the probe what an attacker could know (the paths, the listener's port) in its
prompt. That neighbour hit its model's limit, so the probe runs on another model (`sonnet`).

With the sandbox on (the default) the report must find nothing but its one credential, on the
embedded default and on a password-protected external server. With it off the same probe must
find what was planted: that is what makes "nothing" mean something. `BENCH_LOOK_AROUND_FIGURES`
(a path) collects the per-kind counts of every run, for the note.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.look_around_world import (
    BESIDE_NEIGHBOUR,
    KINDS,
    Planted,
    StoreHarness,
    assert_reached_the_planted_doors,
    claude_neighbour,
    look_around,
)
from tests.support.pool_config import secret_file, write_pool
from tests.support.session import Harness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
]


def add_external_target(h: Harness, planted: Planted) -> None:
    """On the external server the attacker knows its port (and may push jobs there)."""
    url = h.env.get("DISPATCHQ_REDIS_URL")
    if url:
        port = url.rsplit(":", 1)[1]
        planted.context["forbidden"].append(f"127.0.0.1:{port}")
        planted.context["job_targets"].append(f"127.0.0.1:{port}")


# --- confined: nothing but the one credential ---------------------------------------------------
def test_a_confined_session_finds_nothing_but_its_one_credential(
    look_store: StoreHarness, planted: Planted
) -> None:
    add_external_target(look_store, planted)
    neighbour = claude_neighbour(look_store, planted)
    look = look_around(look_store, planted, "on", look_store.store_name, kind=BESIDE_NEIGHBOUR)
    assert look.counts == dict.fromkeys(KINDS, 0), look.explain()
    info = look.report["info"]
    assert info["environment"]["credential_present"] is True, look.explain()
    assert info["processes"]["foreign"] == 0, look.explain()
    assert "errors" not in info, look.explain()
    assert not Path(look.report["cwd"]).is_relative_to(Path(planted.context["data_dir"])), look.explain()
    # The neighbour's folder was there to reach all along (still waiting, not swept): the sandbox hid it.
    assert not neighbour.under({item["path"] for item in look.found("files")}), look.explain()
    assert look_store.record(neighbour.jid).status == "waiting"
    assert all(path.is_file() for path in neighbour.files), neighbour


# --- a pool of two credentials: the session has its own, and only as a value -----------------------
def pool_of_two(h: Harness, planted: Planted) -> tuple[str, str]:
    """team-a (chosen first) and team-b; the probe is told both files and team-b's value."""
    own, other = "sk-ant-oat01-team-a-" + "w" * 24, "sk-ant-oat01-team-b-" + "y" * 24
    files = [secret_file(h, "team-a", own), secret_file(h, "team-b", other)]
    write_pool(h, f"team-a:\n  token_file: {files[0]}\nteam-b:\n  token_file: {files[1]}\n  order: 1\n")
    planted.context["secret_files"] += [str(path) for path in files]
    planted.context.update(other_credentials=[other], own_credential=own)
    return str(files[0]), str(files[1])


#: Which store the session's worker runs on does not change what credential it is given: one.
embedded_only = pytest.mark.parametrize("look_store", ["embedded"], indirect=True)


@embedded_only
def test_with_two_credentials_a_confined_session_sees_only_its_own_and_no_credential_file(
    look_store: StoreHarness, planted: Planted
) -> None:
    own_file, other_file = pool_of_two(look_store, planted)
    look = look_around(look_store, planted, "on", look_store.store_name)
    assert look.counts == dict.fromkeys(KINDS, 0), look.explain()  # no file read, no other value
    environment = look.report["info"]["environment"]
    assert environment["credential_is_own"] is True, look.explain()  # team-a's value, from its file
    read = {item["path"] for item in look.found("files")}
    assert own_file not in read and other_file not in read, look.explain()


@embedded_only
def test_with_two_credentials_an_unconfined_session_reads_both_files(
    look_store: StoreHarness, planted: Planted
) -> None:
    """The control: without the sandbox both files are there to read, so "not readable" above
    is the sandbox's doing; the environment still carries only the chosen credential."""
    own_file, other_file = pool_of_two(look_store, planted)
    look = look_around(look_store, planted, "off", look_store.store_name)
    read = {item["path"] for item in look.found("files")}
    assert own_file in read and other_file in read, look.explain()
    assert look.report["info"]["environment"]["credential_is_own"] is True, look.explain()
    assert not [f for f in look.found("environment") if "another pool credential" in f["why"]], look.explain()


# --- unconfined: the same probe sees what was planted ---------------------------------------------
def test_an_unconfined_session_finds_what_was_planted(look_store: StoreHarness, planted: Planted) -> None:
    """The control: sandbox off, the probe reports the doors the sandbox is there to close,
    the waiting neighbour's session folder among them (its config and its transcript).

    Only what the sandbox hides is asserted (the environment allowlist withholds variables
    whether or not the sandbox is on, so the environment's count is reported, not asserted).
    """
    add_external_target(look_store, planted)
    neighbour = claude_neighbour(look_store, planted)
    look = look_around(look_store, planted, "off", look_store.store_name, kind=BESIDE_NEIGHBOUR)
    assert "errors" not in look.report["info"], look.explain()
    read = {item["path"] for item in look.found("files")}
    for path in [*planted.context["secret_files"], str(Path(planted.env["HOME"]) / ".netrc")]:
        assert path in read, look.explain()
    left = {str(path) for path in neighbour.files}  # its config and its transcript
    assert left and neighbour.under(read) == left, look.explain()
    assert str(Path(planted.env["XDG_RUNTIME_DIR"]) / "keyring-secret") in read, look.explain()
    assert_reached_the_planted_doors(look, planted)
