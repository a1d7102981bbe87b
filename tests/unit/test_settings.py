"""Settings: one object built at the edge; every bad value is one line naming its variable.

Unit tests: no Redis. `load_settings(mapping)` reads only the mapping it is handed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatchq.errors import RedisUnavailable, SettingsError, UserError
from dispatchq.settings import DAY, Settings, env_name, load_settings, redact_url
from dispatchq.storage.sentinel import parse_sentinel_url

pytestmark = pytest.mark.usefixtures("isolated_cwd")

REDIS_PASSWORD = "hunter2-redis-pw"
TYPESAFE_KEY = "ts-live-0123456789abcdef"


def test_defaults() -> None:
    s = load_settings({})
    assert s.redis_url is None
    assert s.embedded
    assert s.result_ttl == 7 * DAY
    assert s.config == Path.home() / ".config" / "dispatchq" / "dispatchq.yaml"
    assert s.checkout_roots == [Path.cwd().resolve()]
    assert s.appendfsync == "everysec"
    assert s.typesafe_api_key is None


def test_reads_only_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHQ_RESULT_TTL", "5")
    assert load_settings({}).result_ttl == 7 * DAY
    assert load_settings({"DISPATCHQ_RESULT_TTL": "9"}).result_ttl == 9
    # ...and with no mapping, the process environment.
    assert load_settings().result_ttl == 5


def test_values_are_parsed_from_the_environment() -> None:
    s = load_settings(
        {
            "DISPATCHQ_RESULT_TTL": "42",
            "DISPATCHQ_APPENDFSYNC": "always",
            "DISPATCHQ_BATCH_SIZE": "7",
            "DISPATCHQ_GATE_EXTERNAL": "0.9",
            "DISPATCHQ_SESSION_DENY_ENV": " FOO , BAR_* ,,",
            "DISPATCHQ_CONFIG": "/etc/dq.yaml",
        }
    )
    assert (s.result_ttl, s.appendfsync, s.batch_size, s.gate_external) == (42, "always", 7, 0.9)
    assert s.session_deny_env == ["FOO", "BAR_*"]
    assert s.config == Path("/etc/dq.yaml")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DISPATCHQ_RESULT_TTL", "abc"),
        ("DISPATCHQ_RESULT_TTL", "0"),
        ("DISPATCHQ_APPENDFSYNC", "sometimes"),
        ("DISPATCHQ_BATCH_SIZE", "0"),
        ("DISPATCHQ_BATCH_SIZE", "100000"),
        ("DISPATCHQ_GATE_LOCAL", "1.5"),
        ("DISPATCHQ_HEARTBEAT_INTERVAL", "fast"),
        ("DISPATCHQ_TYPED_TIMEOUT", "-1"),
        ("DISPATCHQ_TIMEZONE", "Mars/Olympus_Mons"),
        ("DISPATCHQ_SESSION_COMMAND", 'claude "unclosed'),
        ("DISPATCHQ_SESSION_COMMAND", "   "),
        ("DISPATCHQ_CHECKOUT_ROOTS", os.pathsep),
    ],
)
def test_an_invalid_value_is_one_line_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert "\n" not in message
    assert isinstance(caught.value, UserError)  # the CLI prints it as one line, exit 2


def test_redis_url_password_is_redacted_everywhere() -> None:
    url = f"redis://worker:{REDIS_PASSWORD}@redis.internal:6380/2"
    s = load_settings({"DISPATCHQ_REDIS_URL": url, "TYPESAFE_API_KEY": TYPESAFE_KEY})
    assert not s.embedded
    assert s.redis_url is not None and s.redis_url.get_secret_value() == url
    assert s.describe_redis() == "redis://worker:***@redis.internal:6380/2"
    shown = str(s.public())
    assert REDIS_PASSWORD not in shown and TYPESAFE_KEY not in shown
    assert s.public()["DISPATCHQ_REDIS_URL"]["value"] == "redis://worker:***@redis.internal:6380/2"
    assert s.public()["TYPESAFE_API_KEY"]["value"] == "**********"
    assert REDIS_PASSWORD not in repr(s) and TYPESAFE_KEY not in repr(s)
    assert REDIS_PASSWORD not in str(s) and TYPESAFE_KEY not in str(s)


def test_a_settings_error_never_carries_a_secret() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {
                "DISPATCHQ_REDIS_URL": f"redis://:{REDIS_PASSWORD}@h/0",
                "TYPESAFE_API_KEY": TYPESAFE_KEY,
                "DISPATCHQ_RESULT_TTL": "soon",
            }
        )
    assert str(caught.value).startswith("DISPATCHQ_RESULT_TTL: ")
    assert REDIS_PASSWORD not in str(caught.value) and TYPESAFE_KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host/0", "redis://:***@host/0"),
        ("rediss://user:p%40ss@host/0", "rediss://user:***@host/0"),
        ("redis://user:p@ss@host/0", "redis://user:***@host/0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
        ("redis+sentinel://u:pw@h1:26379,h2:26380/svc/2", "redis+sentinel://u:***@h1:26379,h2:26380/svc/2"),
        ("redis+sentinel://:p%40w@[::1]:26379,h2/svc", "redis+sentinel://:***@[::1]:26379,h2/svc"),
        ("redis+sentinel://h1:26379,h2:26380/svc", "redis+sentinel://h1:26379,h2:26380/svc"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_url_never_echoes_an_unparseable_url() -> None:
    assert "pw" not in redact_url("redis://user:pw@[::1/0")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("unix:///run/r.sock?password=pw&db=1", "unix:///run/r.sock?password=***&db=1"),
        ("redis://h:6379/0?username=dq&password=pw", "redis://h:6379/0?username=***&password=***"),
        ("redis://h/0?Password=pw#frag", "redis://h/0?Password=***#frag"),
        ("redis://u:pw@h/0?password=pw2", "redis://u:***@h/0?password=***"),
        ("redis://h/0?db=1&health_check_interval=3", "redis://h/0?db=1&health_check_interval=3"),
        ("redis+sentinel://u:pw@h1:1,h2:2/svc", "redis+sentinel://u:***@h1:1,h2:2/svc"),
        ("redis://u:pw@h:notaport/0", "redis://u:***@h:notaport/0"),
        ("https://ghp_tok@api.example", "https://***@api.example"),
    ],
)
def test_redact_url_query_secrets_and_odd_urls(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "pw" not in shown.replace("password", "")


def test_the_config_file_default_is_a_config_folder_never_the_cwd(tmp_path: Path) -> None:
    (tmp_path / "dispatchq.yaml").write_text("kinds: {}\n")  # the cwd (see _isolated_cwd)
    s = load_settings({"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert s.config == tmp_path / "xdg" / "dispatchq" / "dispatchq.yaml"
    assert load_settings({"DISPATCHQ_CONFIG": "here.yaml"}).config == tmp_path / "here.yaml"


def test_a_dotenv_in_the_cwd_is_ignored(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("DISPATCHQ_SESSION_COMMAND=evil\nTYPESAFE_BASE_URL=http://evil.example\n")
    s = load_settings({})
    assert s.session_command.startswith("claude ")
    assert s.typesafe_base_url is None


def test_an_env_file_is_read_only_when_named(tmp_path: Path) -> None:
    named = tmp_path / "dq.env"
    named.write_text(
        "DISPATCHQ_RESULT_TTL=5\nDISPATCHQ_BATCH_SIZE=3\nTYPESAFE_API_KEY_FILE=" + str(tmp_path / "k") + "\n"
    )
    (tmp_path / "k").write_text(TYPESAFE_KEY)
    s = load_settings({"DISPATCHQ_ENV_FILE": str(named), "DISPATCHQ_BATCH_SIZE": "9"})
    assert (s.result_ttl, s.batch_size) == (5, 9)  # the environment wins over the file
    assert s.typesafe_api_key is not None and s.typesafe_api_key.get_secret_value() == TYPESAFE_KEY
    with pytest.raises(SettingsError, match=r"^DISPATCHQ_ENV_FILE: cannot read .*missing\.env"):
        load_settings({"DISPATCHQ_ENV_FILE": str(tmp_path / "missing.env")})


@pytest.mark.parametrize("field", ["TYPESAFE_BASE_URL", "DISPATCHQ_GITHUB_API_URL"])
@pytest.mark.parametrize(
    "url",
    [
        "http://api.example.com",
        "http://10.0.0.1:8080/v1",
        "ftp://api.example.com",
        "api.example.com",
        "http://127.0.0.1.evil.example",
        "http://evil.localhost",
    ],
)
def test_credential_urls_must_be_https_unless_loopback(field: str, url: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({field: url})
    message = str(caught.value)
    assert message.startswith(f"{field}: must be") and "\n" not in message


@pytest.mark.parametrize(
    "url", ["https://api.example.com", "http://127.0.0.1:9999", "http://localhost:1/x", "http://[::1]:2"]
)
def test_https_or_loopback_urls_are_accepted(url: str) -> None:
    s = load_settings({"TYPESAFE_BASE_URL": url, "DISPATCHQ_GITHUB_API_URL": url})
    assert (s.typesafe_base_url, s.github_api_url) == (url, url)


def test_a_refused_url_is_shown_redacted() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"DISPATCHQ_GITHUB_API_URL": "http://user:hunter2@ghe.example/api/v3"})
    assert "hunter2" not in str(caught.value) and "user:***@ghe.example" in str(caught.value)


def test_public_redacts_every_url_shaped_value() -> None:
    s = load_settings(
        {
            "DISPATCHQ_REDIS_URL": "unix:///run/r.sock?password=hunter2",
            "DISPATCHQ_REDIS_SENTINEL_PASSWORD": "sentinel-pw",
            "TYPESAFE_BASE_URL": "https://u:hunter3@ts.example",
        }
    )
    shown = repr(s.public())
    assert "hunter2" not in shown and "hunter3" not in shown and "sentinel-pw" not in shown
    assert s.public()["DISPATCHQ_REDIS_URL"]["value"] == "unix:///run/r.sock?password=***"


def test_secret_from_file(tmp_path: Path) -> None:
    key_file = tmp_path / "typesafe.key"
    key_file.write_text(f"  {TYPESAFE_KEY}\n")
    url_file = tmp_path / "redis.url"
    url_file.write_text(f"redis://:{REDIS_PASSWORD}@h/0\n")
    token_file = tmp_path / "gh.token"
    token_file.write_text("ghp_abc\n")
    s = load_settings(
        {
            "TYPESAFE_API_KEY_FILE": str(key_file),
            "DISPATCHQ_REDIS_URL_FILE": str(url_file),
            "DISPATCHQ_GITHUB_TOKEN_FILE": str(token_file),
        }
    )
    assert s.typesafe_api_key is not None and s.typesafe_api_key.get_secret_value() == TYPESAFE_KEY
    assert s.redis_url is not None and s.redis_url.get_secret_value() == f"redis://:{REDIS_PASSWORD}@h/0"
    assert s.github_token is not None and s.github_token.get_secret_value() == "ghp_abc"


def test_a_variable_set_directly_wins_over_its_file(tmp_path: Path) -> None:
    key_file = tmp_path / "typesafe.key"
    key_file.write_text("from-file")
    s = load_settings({"TYPESAFE_API_KEY": "from-env", "TYPESAFE_API_KEY_FILE": str(key_file)})
    assert s.typesafe_api_key is not None and s.typesafe_api_key.get_secret_value() == "from-env"


def test_missing_secret_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"TYPESAFE_API_KEY_FILE": str(tmp_path / "absent.key")})
    assert str(caught.value).startswith("TYPESAFE_API_KEY_FILE: ")
    assert "\n" not in str(caught.value)


def test_empty_secret_file_is_an_error_not_a_missing_key(tmp_path: Path) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(SettingsError, match=r"^TYPESAFE_API_KEY_FILE: .*empty"):
        load_settings({"TYPESAFE_API_KEY_FILE": str(empty)})


def test_checkout_roots_are_split_resolved_and_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    raw = os.pathsep.join([str(tmp_path / "a"), "", "~/code", "rel/dir", str(tmp_path / "link")])
    s = load_settings({"DISPATCHQ_CHECKOUT_ROOTS": raw})
    assert s.checkout_roots == [
        (tmp_path / "a").resolve(),
        (tmp_path / "home" / "code").resolve(),
        (tmp_path / "rel" / "dir").resolve(),
        (tmp_path / "a").resolve(),  # a symlinked root resolves to where it points
    ]


def test_every_field_has_an_environment_variable_and_a_description() -> None:
    s = load_settings({})
    public = s.public()
    assert set(public) == {env_name(f) for f in Settings.model_fields}
    assert all(entry["description"] for entry in public.values())
    assert env_name("typesafe_api_key") == "TYPESAFE_API_KEY"
    assert env_name("result_ttl") == "DISPATCHQ_RESULT_TTL"


# --- `dispatchq settings`: what a session would get, by name only ---------------------------------
def test_the_settings_command_lists_the_session_s_names_never_its_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import json

    from click.testing import CliRunner

    from dispatchq.cli import main

    pat = "ghp_" + "p" * 36
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "tok-secret-value")
    monkeypatch.setenv("GH_PAT", pat)
    monkeypatch.setenv("EDITOR", "vim-is-a-value")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    monkeypatch.setenv("DISPATCHQ_SESSION_ALLOW_ENV", "EDITOR,GH_*")

    done = CliRunner().invoke(main, ["settings", "--json"], catch_exceptions=False)

    assert done.exit_code == 0, done.output
    names = json.loads(done.output)["session_environment"]
    assert {"EDITOR", "CLAUDE_CODE_OAUTH_TOKEN", "PATH", "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"} <= set(
        names["passes"]
    )
    assert not {"GH_PAT", "SSH_AUTH_SOCK"} & set(names["passes"])
    assert names["allowed_but_withheld"] == ["GH_PAT"]
    assert names["credential"] == "CLAUDE_CODE_OAUTH_TOKEN"
    for value in ("tok-secret-value", pat, "vim-is-a-value"):
        assert value not in done.output

    text = CliRunner().invoke(main, ["settings"], catch_exceptions=False).output
    assert "a session would get:" in text and "EDITOR" in text and "GH_PAT" in text
    assert "tok-secret-value" not in text and pat not in text


def test_the_sentinel_password_is_a_secret_with_a_file_and_never_shown(tmp_path: Path) -> None:
    secret_file = tmp_path / "sentinel.password"
    secret_file.write_text("sentinel-pw\n")
    url = f"redis+sentinel://:{REDIS_PASSWORD}@h1:26379,h2:26379/svc"
    s = load_settings(
        {"DISPATCHQ_REDIS_URL": url, "DISPATCHQ_REDIS_SENTINEL_PASSWORD_FILE": str(secret_file)}
    )
    assert s.redis_sentinel_password is not None
    assert s.redis_sentinel_password.get_secret_value() == "sentinel-pw"
    assert s.describe_redis() == "redis+sentinel://:***@h1:26379,h2:26379/svc"
    shown = f"{s.public()} {s!r} {s}"
    assert "sentinel-pw" not in shown and REDIS_PASSWORD not in shown
    assert s.public()["DISPATCHQ_REDIS_SENTINEL_PASSWORD"]["value"] == "**********"


@pytest.mark.parametrize(
    ("url", "sentinels", "service", "db", "login"),
    [
        ("redis+sentinel://h1:26379,h2:26380/svc", (("h1", 26379), ("h2", 26380)), "svc", 0, {}),
        (
            "redis+sentinel://u:p%40ss@h1/svc/3",
            (("h1", 26379),),
            "svc",
            3,
            {"username": "u", "password": "p@ss"},
        ),
        (
            "redis+sentinel://:pw@[::1]:5000,h2/svc/",
            (("::1", 5000), ("h2", 26379)),
            "svc",
            0,
            {"password": "pw"},
        ),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_db_and_the_primary_s_login(
    url: str, sentinels: tuple[tuple[str, int], ...], service: str, db: int, login: dict[str, str]
) -> None:
    target = parse_sentinel_url(url)
    assert (target.sentinels, target.service, target.db) == (sentinels, service, db)
    assert target.primary_kwargs() == {"db": db, **login}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379", "ends in /<service>"),
        ("redis+sentinel://h1:26379/svc/zero", "must be a number"),
        ("redis+sentinel://h1:26379/svc/0/extra", "ends in /<service>"),
        ("redis+sentinel://h1:port/svc", "not a port number"),
        ("redis+sentinel://h1:26379,/svc", "empty"),
        ("redis+sentinel://h1:26379/svc?ssl=true", "no ?query"),
    ],
)
def test_a_bad_sentinel_url_is_one_line_naming_the_variable(url: str, says: str) -> None:
    with pytest.raises(RedisUnavailable) as caught:
        parse_sentinel_url(url.replace("h1", f"u:{REDIS_PASSWORD}@h1", 1))
    assert str(caught.value).startswith("DISPATCHQ_REDIS_URL: ")
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert REDIS_PASSWORD not in str(caught.value)
