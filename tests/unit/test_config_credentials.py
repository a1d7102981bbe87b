"""The `credentials:` section: what a good one builds (the pool), and one line per mistake,
each naming the credential; whether each credential's file reads; the kind's `priority`
and `session.cost_estimate`, which schedule work and never change a kind's digest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dispatchq.config import config_schema, credential_file_problems, parse_config
from dispatchq.core.kinds import Kind
from dispatchq.errors import ConfigError
from dispatchq.pools.credentials import API_KEY_VAR, TOKEN_VAR, Credential, Pool, Serves, SpendCap

HERE = Path("/etc/dispatchq/dispatchq.yaml")
SESSION = {"prompt": "Decide {{ target }}"}
BUILTIN = {"findings-gate": Kind(name="findings-gate")}

#: The issue's example, as operators will copy it.
EXAMPLE: dict[str, Any] = {
    "team-max": {"token_file": "/etc/dispatchq/team-max", "concurrency": 2},
    "api-overflow": {
        "api_key_file": "/etc/dispatchq/anthropic",
        "billing": "metered",
        "spend_cap": {"day": 20.0, "month": 300.0},
        "serves": {"priority": "urgent"},
    },
}


def pool_of(credentials: Any, kinds: Any = None, path: Path = HERE) -> Pool:
    document: dict[str, Any] = {"credentials": credentials}
    if kinds is not None:
        document["kinds"] = kinds
    pool = parse_config(document, path, builtin=BUILTIN).credentials
    assert pool is not None
    return pool


def problems(document: Any, path: Path = HERE) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, path, builtin=BUILTIN)
    return caught.value.problems


def test_the_issue_s_example_is_a_pool_of_two_in_the_order_written() -> None:
    pool = pool_of(EXAMPLE)
    assert pool.names == ["team-max", "api-overflow"]
    assert pool.credentials == (
        Credential(
            name="team-max",
            variable=TOKEN_VAR,
            file="/etc/dispatchq/team-max",
            billing="subscription",
            concurrency=2,
            pacing=True,
        ),
        Credential(
            name="api-overflow",
            variable=API_KEY_VAR,
            file="/etc/dispatchq/anthropic",
            billing="metered",
            spend_cap=SpendCap(day=20.0, month=300.0),
            serves=Serves(priority="urgent"),
            pacing=False,
        ),
    )


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"token_file": "t"}, {"billing": "subscription", "pacing": True, "variable": TOKEN_VAR}),
        (
            {"api_key_file": "k", "spend_cap": {"day": 5}},
            {"billing": "metered", "pacing": False, "variable": API_KEY_VAR, "spend_cap": SpendCap(day=5.0)},
        ),
        ({"api_key_file": "k", "billing": "subscription"}, {"billing": "subscription", "pacing": True}),
        (
            {"token_file": "t", "billing": "metered", "spend_cap": {"month": 100}},
            {"billing": "metered", "pacing": False, "spend_cap": SpendCap(month=100.0)},
        ),
        ({"token_file": "t", "pacing": False}, {"pacing": False}),
        (
            {"api_key_file": "k", "spend_cap": {"day": 1}, "pacing": True},
            {"pacing": True, "billing": "metered"},
        ),
        ({"token_file": "t", "order": -3, "reserve_urgent": True}, {"order": -3, "reserve_urgent": True}),
        ({"token_file": "t"}, {"concurrency": 1, "order": 0, "backend": "claude", "reserve_urgent": False}),
        ({"token_file": "sub/t"}, {"file": "/etc/dispatchq/sub/t"}),
        ({"token_file": "../secrets/./t"}, {"file": "/etc/secrets/t"}),
        ({"token_file": "t", "serves": {"kinds": ["k"]}}, {"serves": Serves(kinds=("k",))}),
        (
            {"token_file": "t", "serves": {"priority": "normal", "kinds": ["k", "findings-gate"]}},
            {"serves": Serves(priority="normal", kinds=("k", "findings-gate"))},
        ),
    ],
)
def test_defaults_resolve_at_build(section: dict[str, Any], expected: dict[str, Any]) -> None:
    """Billing follows the file (an API key is billed per use), pacing follows billing, and a
    relative file is the config file's folder's."""
    (credential,) = pool_of({"c": section}, kinds={"k": {"session": SESSION}})
    assert {key: getattr(credential, key) for key in expected} == expected


def test_no_section_is_no_pool_and_default_is_a_name_like_any() -> None:
    assert parse_config({"kinds": {"k": {"session": SESSION}}}).credentials is None
    assert parse_config({"credentials": None}).credentials is None
    (default,) = pool_of({"default": {"token_file": "/run/token"}})
    assert (default.name, default.file) == ("default", "/run/token")


_NAME = (
    "is not a credential name "
    "(up to 40 lower-case letters, digits, '_' and '-', starting with a letter or digit)"
)

#: One mistake each, and the one line it reads as.
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "metered without a cap": (
        {"api-overflow": {"api_key_file": "/k", "billing": "metered"}},
        "credentials.api-overflow: a metered credential needs spend_cap (USD per day and/or month)",
    ),
    "an api key is metered unless written otherwise": (
        {"api-overflow": {"api_key_file": "/k"}},
        "credentials.api-overflow: a metered credential needs spend_cap (USD per day and/or month)",
    ),
    "a cap on a subscription": (
        {"team-max": {"token_file": "/t", "spend_cap": {"day": 5}}},
        "credentials.team-max: spend_cap bounds a metered credential (billing: metered); "
        "a subscription's windows bound it",
    ),
    "an unknown field": (
        {"team-max": {"token_file": "/t", "spend_limit": 5}},
        "credentials.team-max.spend_limit: unknown key (allowed: api_key_file, auth_file, backend, billing, "
        "concurrency, order, pacing, reserve_urgent, serves, spend_cap, token_file)",
    ),
    "an unknown field in the cap": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"week": 5}}},
        "credentials.api-overflow.spend_cap.week: unknown key (allowed: day, month)",
    ),
    "no file": (
        {"team-max": {"concurrency": 2}},
        "credentials.team-max: give exactly one of token_file (a subscription's token) "
        "or api_key_file (an API key)",
    ),
    "two files": (
        {"team-max": {"token_file": "/t", "api_key_file": "/k"}},
        "credentials.team-max: give exactly one of token_file (a subscription's token) "
        "or api_key_file (an API key)",
    ),
    "an empty file name": (
        {"team-max": {"token_file": ""}},
        "credentials.team-max.token_file: must be a file path (absolute, or relative to the "
        "config file's folder) (got '')",
    ),
    "the same token file twice": (
        {"a": {"token_file": "/etc/dispatchq/t"}, "b": {"token_file": "t"}},
        "credentials.b: token_file /etc/dispatchq/t is credential a's file too (one file, one credential)",
    ),
    "a token file used as an api key": (
        {"a": {"token_file": "/x"}, "b": {"api_key_file": "/y/../x", "spend_cap": {"day": 1}}},
        "credentials.b: api_key_file /x is credential a's file too (one file, one credential)",
    ),
    "an empty cap": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {}}},
        "credentials.api-overflow.spend_cap: give day and/or month (USD)",
    ),
    "a cap of zero": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"day": 0}}},
        "credentials.api-overflow.spend_cap.day: must be a number of USD above 0 (got 0)",
    ),
    "an infinite cap": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"month": float("inf")}}},
        "credentials.api-overflow.spend_cap.month: must be a number of USD above 0 (got inf)",
    ),
    "a cap written as text": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"day": "20"}}},
        "credentials.api-overflow.spend_cap.day: must be a number of USD above 0 (got '20')",
    ),
    "serves an unknown priority": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"day": 1}, "serves": {"priority": "high"}}},
        "credentials.api-overflow.serves.priority: must be urgent, normal or background (got 'high')",
    ),
    "serves an unknown kind": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"day": 1}, "serves": {"kinds": ["k", "nope"]}}},
        "credentials.api-overflow.serves.kinds[1]: 'nope' names no kind (kinds: k)",
    ),
    "serves no kinds": (
        {"api-overflow": {"api_key_file": "/k", "spend_cap": {"day": 1}, "serves": {"kinds": []}}},
        "credentials.api-overflow.serves.kinds: must be a non-empty list of kind names (got [])",
    ),
    "no concurrency": (
        {"team-max": {"token_file": "/t", "concurrency": 0}},
        "credentials.team-max.concurrency: must be a whole number of sessions at once, at least 1 (got 0)",
    ),
    "a billing nobody offers": (
        {"team-max": {"token_file": "/t", "billing": "free"}},
        "credentials.team-max.billing: must be subscription or metered (got 'free')",
    ),
    "a backend not built": (
        {"team-max": {"token_file": "/t", "backend": "openai"}},
        "credentials.team-max.backend: must be claude or codex (got 'openai')",
    ),
    "pacing as yes": (
        {"team-max": {"token_file": "/t", "pacing": "yes"}},
        "credentials.team-max.pacing: must be true or false (got 'yes')",
    ),
    "a name with a slash": ({"team/max": {"token_file": "/t"}}, f"credentials.team/max: 'team/max' {_NAME}"),
    "a capitalised name": ({"Team": {"token_file": "/t"}}, f"credentials.Team: 'Team' {_NAME}"),
    "a name too long": ({"a" * 41: {"token_file": "/t"}}, f"credentials.{'a' * 41}: '{'a' * 41}' {_NAME}"),
    "an empty section": ({}, "credentials: must be a mapping of credential name to credential (got {})"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_each_mistake_is_one_line_naming_the_credential(case: str) -> None:
    credentials, line = BAD[case]
    assert problems({"kinds": {"k": {"session": SESSION}}, "credentials": credentials}) == [line]


def test_a_name_of_forty_is_a_name() -> None:
    assert pool_of({"a" * 40: {"token_file": "/t"}}).names == ["a" * 40]


def test_two_names_for_one_file_through_a_symlink_are_one_file(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("token\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    found = problems(
        {"credentials": {"a": {"token_file": "real"}, "b": {"token_file": "link"}}}, tmp_path / "dq.yaml"
    )
    assert found == [
        f"credentials.b: token_file {tmp_path / 'link'} is credential a's file too (one file, one credential)"
    ]


def test_the_pool_keeps_a_symlink_as_written_so_a_rotated_mount_is_read_afresh(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("token\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (credential,) = pool_of({"a": {"token_file": "link"}}, path=tmp_path / "dq.yaml")
    assert credential.file == str(tmp_path / "link")


def test_serves_may_name_a_built_in_kind_and_waits_for_the_kinds_to_load() -> None:
    served = {"api_key_file": "/k", "spend_cap": {"day": 1}, "serves": {"kinds": ["findings-gate", "k"]}}
    (credential,) = pool_of({"o": served}, kinds={"k": {"session": SESSION}})
    assert credential.serves.kinds == ("findings-gate", "k")
    assert problems({"credentials": {"o": served}}) == [
        "credentials.o.serves.kinds[1]: 'k' names no kind (kinds: none)"
    ]
    # A broken kind is named once; its name is not also reported as unknown.
    assert problems(
        {"kinds": {"k": {"effect": "global", "session": SESSION}}, "credentials": {"o": served}}
    ) == ["kinds.k.effect: must be local or external (got 'global')"]


def test_mistakes_in_two_credentials_are_two_lines() -> None:
    found = problems(
        {
            "credentials": {
                "a": {"api_key_file": "/k"},
                "b": {"token_file": "/t", "concurency": 2},
            }
        }
    )
    assert found[0] == "credentials.a: a metered credential needs spend_cap (USD per day and/or month)"
    assert found[1].startswith("credentials.b.concurency: unknown key (allowed: ")
    assert len(found) == 2


# --- the files ---------------------------------------------------------------------------------


def _pool(tmp_path: Path, **files: str) -> Pool:
    return pool_of({name: {"token_file": file} for name, file in files.items()}, path=tmp_path / "dq.yaml")


def test_readable_files_are_no_problem(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("sk-ant-oat01-secret\n")
    (tmp_path / "b").write_text("x")
    assert credential_file_problems(_pool(tmp_path, a="a", b="b")) == []


def test_a_missing_a_blank_and_a_folder_are_one_line_each_naming_credential_and_path(tmp_path: Path) -> None:
    (tmp_path / "blank").write_text("  \n\t\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "good").write_text("sk-ant-oat01-secret")
    (tmp_path / "plain").write_text("sk-ant-oat01-other")
    pool = _pool(tmp_path, gone="gone", blank="blank", folder="folder", good="good", under="plain/child")
    assert credential_file_problems(pool) == [
        f"credentials.gone: token_file {tmp_path / 'gone'} does not exist",
        f"credentials.blank: token_file {tmp_path / 'blank'} is empty",
        f"credentials.folder: token_file {tmp_path / 'folder'} is not a regular file",
        f"credentials.under: token_file {tmp_path / 'plain/child'} cannot be read: Not a directory",
    ]


def test_the_environment_s_credential_is_the_settings_to_check() -> None:
    assert credential_file_problems(Pool.of_one(TOKEN_VAR, 1)) == []


# --- a kind's priority and cost estimate --------------------------------------------------------


def test_a_kind_s_priority_and_cost_estimate_reach_the_kind() -> None:
    kinds = parse_config(
        {
            "kinds": {
                "urgent-review": {"priority": "urgent", "session": {**SESSION, "cost_estimate": 0.4}},
                "plain": {"session": SESSION},
            }
        }
    ).kinds
    assert kinds["urgent-review"].priority == "urgent"
    assert kinds["urgent-review"].session is not None and kinds["urgent-review"].session.cost_estimate == 0.4
    assert kinds["plain"].priority == "normal"
    assert kinds["plain"].session is not None and kinds["plain"].session.cost_estimate is None


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        (
            {"priority": "asap", "session": SESSION},
            "kinds.k.priority: must be urgent, normal or background (got 'asap')",
        ),
        (
            {"session": {**SESSION, "cost_estimate": -1}},
            "kinds.k.session.cost_estimate: must be a number of USD above 0: what one session is "
            "expected to cost (got -1)",
        ),
    ],
)
def test_a_bad_priority_or_estimate_is_one_line(kind: dict[str, Any], line: str) -> None:
    assert problems({"kinds": {"k": kind}}) == [line]


def test_scheduling_keys_leave_the_digest_alone_and_the_definition_moves_it() -> None:
    """Judgements answered under a kind are not judged afresh because it became urgent."""

    def digest(kind: dict[str, Any]) -> str:
        return parse_config({"kinds": {"k": kind}}).kinds["k"].digest

    plain = digest({"session": SESSION})
    assert digest({"priority": "urgent", "session": {**SESSION, "cost_estimate": 2.5}}) == plain
    assert digest({"session": {**SESSION, "prompt": "Decide {{ target }} again"}}) != plain
    assert digest({"session": {**SESSION, "format": "json"}}) != plain


# --- the schema --------------------------------------------------------------------------------


def test_the_schema_accepts_the_example_and_refuses_what_loading_refuses_by_shape() -> None:
    validator = jsonschema.Draft202012Validator(config_schema())
    assert list(validator.iter_errors({"credentials": EXAMPLE})) == []
    for credentials in (
        {"team/max": {"token_file": "/t"}},
        {"team-max": {"token_file": "/t", "spend_limit": 1}},
        {"team-max": {"token_file": "/t", "billing": "free"}},
        {"o": {"api_key_file": "/k", "spend_cap": {"day": 0}}},
        {"o": {"api_key_file": "/k", "spend_cap": {"day": 1}, "serves": {"priority": "high"}}},
        {"team-max": {"token_file": "/t", "concurrency": 0}},
    ):
        assert list(validator.iter_errors({"credentials": credentials})), credentials
        with pytest.raises(ConfigError):
            parse_config({"credentials": credentials}, HERE)
