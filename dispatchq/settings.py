"""dispatchq's settings: one typed object, built once at the edge of a process.

Every setting comes from an environment variable prefixed `DISPATCHQ_`; the TypeSafe
SDK's own variables keep their names. Nothing is read from the working directory: a
`.env` (or `dispatchq.yaml`) in an untrusted checkout once replaced the session command
and the URLs the keys are sent to. An env file is read only when `DISPATCHQ_ENV_FILE`
names it. Library code receives this object (or the few values it needs), never
`os.environ`, so a test can build exactly the configuration it means.

Secrets may come from files instead (`<NAME>_FILE`, e.g. `TYPESAFE_API_KEY_FILE`) so
they need not sit in any process's environment, where a session could read them.
They are `SecretStr`s, redacted wherever settings or errors are printed.
"""

from __future__ import annotations

import io
import ipaddress
import json
import math
import os
import re
import shlex
import socket
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dotenv import dotenv_values
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from dispatchq.errors import SettingsError

__all__ = [
    "DAY",
    "ENV_FILE",
    "SECRET_ENV",
    "Settings",
    "default_config_path",
    "env_name",
    "is_loopback_host",
    "load_settings",
    "parent_environment",
    "redact_url",
    "require_https",
]

DAY = 86_400

#: The one env file dispatchq reads, only when this variable names it (never `./.env`).
ENV_FILE = "DISPATCHQ_ENV_FILE"

#: Settings that hold secrets: their values may come from `<ENV>_FILE`.
SECRET_ENV = (
    "DISPATCHQ_REDIS_URL",
    "DISPATCHQ_REDIS_SENTINEL_PASSWORD",
    "TYPESAFE_API_KEY",
    "DISPATCHQ_GITHUB_TOKEN",
    "DISPATCHQ_GITHUB_WEBHOOK_SECRET",
    "DISPATCHQ_API_TOKEN",
)


_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("dispatchq_environ", default=None)


def _env() -> Mapping[str, str]:
    """The environment `load_settings` was handed (defaults must read it too, not os.environ)."""
    return _ENVIRON.get() or os.environ


def parent_environment() -> dict[str, str]:
    """A copy of this process's environment, for the one rule that scrubs it for a child.

    The only place outside `load_settings` that reads `os.environ`: every child (a session,
    git, a repository's regenerators) is started from what this returns after
    `dispatchq.launcher.environment` withheld the secrets, so nothing else needs to look.
    """
    return dict(os.environ)


def _default_data_dir() -> Path:
    base = _env().get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dispatchq"


def _local_timezone() -> str:
    """The machine's zone name, which is what Claude Code prints reset times in."""
    tz = _env().get("TZ", "").lstrip(":")
    if tz and "/" in tz:
        return tz
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return "UTC"
    marker = "zoneinfo/"
    return target.split(marker, 1)[1] if marker in target else "UTC"


def default_config_path() -> Path:
    """Where the config file is looked for without DISPATCHQ_CONFIG: a folder dispatchq names.

    `$XDG_CONFIG_HOME/dispatchq/dispatchq.yaml` (`~/.config/dispatchq/dispatchq.yaml`),
    never the working directory, which may be an untrusted checkout (`findings run`
    defaults to the cwd's repository) whose own `dispatchq.yaml` would name checks to import.
    """
    base = _env().get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "dispatchq" / "dispatchq.yaml"


class _MappingEnvSource(EnvSettingsSource):
    """Reads the mapping `load_settings` was handed instead of the process environment."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        if environ is None:
            return super()._load_env_vars()
        return parse_env_vars(environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class Settings(BaseSettings):
    """All of dispatchq's knobs. Durations are in seconds."""

    model_config = SettingsConfigDict(
        env_prefix="DISPATCHQ_",
        extra="ignore",
        validate_default=True,
        populate_by_name=True,
        env_ignore_empty=True,  # FOO= (empty) means unset, not "" (an empty data dir is the cwd)
    )

    # --- Redis and storage -----------------------------------------------------------
    redis_url: SecretStr | None = Field(
        None, description="Redis server to use; unset starts the embedded server under the data dir."
    )
    redis_sentinel_password: SecretStr | None = Field(
        None,
        description="Password of the sentinels a redis+sentinel:// URL names (the URL's is the primary's).",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir, description="Where the embedded Redis keeps its data."
    )
    appendfsync: Literal["everysec", "always", "no"] = Field(
        "everysec",
        description="Embedded Redis fsync: everysec may lose the last second on a hard kill; always: none.",
    )
    result_ttl: int = Field(7 * DAY, ge=1, description="How long finished judgement records are kept.")

    # --- config and judgements --------------------------------------------------------
    config: Path = Field(
        default_factory=default_config_path,
        description="The YAML file declaring kinds and triage (never looked for in the working directory).",
    )
    checkout_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=lambda: [Path.cwd()],
        description="Directories a judgement's checkout may lie in (os.pathsep-separated).",
    )
    host: str = Field(
        default_factory=socket.gethostname,
        description="This machine's name; judgements naming a checkout run only on the host that holds it.",
    )

    # --- workers ----------------------------------------------------------------------------
    batch_size: int = Field(200, ge=1, le=10_000, description="Judgements carried by one RQ job.")
    code_job_timeout: int = Field(3600, ge=1, description="RQ job timeout for a code-tier job.")
    typed_job_timeout: int = Field(600, ge=1, description="RQ job timeout for a typed-tier job.")
    produce_timeout: int = Field(900, ge=1, description="Timeout for each produce or verify command.")
    job_retries: int = Field(3, ge=0, description="RQ retries of a job whose worker died mid-job.")
    recovery_interval: int = Field(
        60, ge=1, description="How often workers look for jobs abandoned by a dead worker (RQ maintenance)."
    )
    heartbeat_interval: int = Field(
        10, ge=1, description="How often a busy worker renews its job's heartbeat."
    )
    heartbeat_grace: int = Field(
        60, ge=1, description="A job whose heartbeat is this late is considered abandoned and retried."
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="Worker and scheduler logs: one line per event as text, or one JSON object."
    )

    # --- typed tier ------------------------------------------------------------------------------
    typesafe_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("TYPESAFE_API_KEY", "typesafe_api_key"),
        description="TypeSafe key; unset means the typed tier answers nothing and everything escalates.",
    )
    # The SDK's own variables, read here too so that settings built from a mapping (or
    # DISPATCHQ_ENV_FILE) reach the client; unset passes None and leaves the SDK's default in charge.
    typesafe_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("TYPESAFE_BASE_URL", "typesafe_base_url"),
        description="TypeSafe API base URL; unset leaves the SDK's default.",
    )
    typesafe_default_model: str | None = Field(
        None,
        validation_alias=AliasChoices("TYPESAFE_DEFAULT_MODEL", "typesafe_default_model"),
        description="Model the typed tier requests; unset leaves the SDK's default.",
    )
    gate_local: float = Field(
        0.6, ge=0, le=1, description="Confidence needed to act on a local-effect answer."
    )
    gate_external: float = Field(
        0.85, ge=0, le=1, description="Confidence needed for a write outside the checkout (external effect)."
    )
    typed_max_questions: int = Field(
        64, ge=1, description="Cap on questions sent in one batched provider request."
    )
    typed_attempts: int = Field(
        5, ge=1, description="Provider attempts (after the SDK's own retries) before a judgement moves up."
    )
    typed_timeout: float = Field(10.0, gt=0, description="Timeout of one provider HTTP request.")
    typed_concurrency: int = Field(
        4, ge=1, description="Provider requests for different states a typed worker runs at once."
    )
    typed_cache_ttl: int = Field(
        30 * DAY,
        ge=1,
        description="How long cached provider answers serve re-delivered judgements (default 30 days).",
    )
    retry_horizon: int = Field(
        30, ge=0, description="A burst run waits for delayed retries due within this many seconds."
    )

    # --- session tier -----------------------------------------------------------------------------
    session_command: str = Field(
        "claude -p --output-format stream-json --verbose",
        description="The headless session command, split like a shell would and run with no shell.",
    )
    codex_command: str = Field(
        "codex",
        description="The Codex CLI a `codex` credential's sessions run, split like a shell would (no shell).",
    )
    codex_prices: str = Field(
        "",
        description="USD per million tokens a metered Codex run is priced at, over the built-in table: "
        'a JSON object {"model": [input, cached_input, output]}.',
    )
    session_timeout: int = Field(1800, ge=1, description="A session running longer than this is killed.")
    session_concurrency: int = Field(1, ge=1, description="Sessions running at once, across all machines.")
    session_credential_var: str = Field(
        "CLAUDE_CODE_OAUTH_TOKEN", description="The one credential variable a session receives."
    )
    session_deny_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Extra variable names never passed to a child (comma-separated)."
    )
    session_subprocess_scrub: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Ask Claude Code to scrub its tool subprocesses (needs bubblewrap): auto, on or off.",
    )
    session_allow_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra variable names a session may receive (comma-separated, globs allowed).",
    )
    session_sandbox: Literal["on", "off"] = Field(
        "on",
        description="Run each session confined by bubblewrap (on) or unconfined (off: status says so).",
    )
    session_sandbox_bind: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra paths every session sees (comma-separated, PATH or PATH:rw; read-only by default)",
    )
    session_egress: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra host:port a confined session may reach through its proxy (the API host always).",
    )
    timezone: str = Field(
        default_factory=_local_timezone, description="Zone for reset times printed without one."
    )
    unknown_reset_probe: int = Field(
        900, ge=1, description="With no reset time in a limit message, probe again after this long."
    )
    probe_grace: int = Field(
        20,
        ge=1,
        description="A probe session running this long without a limit result shows the window open.",
    )
    reprobe_min: int = Field(
        300,
        ge=1,
        description="A probe refused again with the same stated time waits at least this (doubling).",
    )
    window_reserve: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Share of the usage window kept for people: sessions pause at 1 - this (0: off).",
    )
    host_probe_interval: int = Field(
        300,
        ge=1,
        description="A host blocked by a host-wide failure (not logged in, no network) probes this often.",
    )

    # --- rules engine -------------------------------------------------------------------------------
    github_token: SecretStr | None = Field(None, description="Token for the GitHub executor.")
    github_api_url: str = Field("https://api.github.com", description="GitHub REST API base URL.")
    triage_hourly_budget: int = Field(
        1000, ge=0, description="Overall cap on triage provider requests in any rolling hour (all processes)."
    )

    # --- serve (HTTP in and out) ----------------------------------------------------------------------
    github_webhook_secret: SecretStr | None = Field(
        None, description="Secret GitHub signs webhook deliveries with; unset: `serve` refuses every one."
    )
    api_token: SecretStr | None = Field(
        None, description="Bearer token `serve` requires on every route but /healthz and /webhooks/github."
    )
    serve_host: str = Field("127.0.0.1", description="Address `dispatchq serve` listens on.")
    serve_port: int = Field(8484, ge=1, le=65535, description="Port `dispatchq serve` listens on.")
    # -- the operator's first hour --
    log_rq: bool = Field(False, description="Show RQ's own INFO lines in worker and scheduler logs.")

    # --- serve's gate: which Host names serve answers, whose X-Forwarded-For counts, access log
    serve_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names `serve` answers besides loopback (comma-separated, `*.example.com` allowed).",
    )
    serve_trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Proxies (addresses or networks, comma-separated) whose X-Forwarded-For tail is the peer",
    )
    serve_public_url: str | None = Field(
        None,
        description="URL browsers reach `serve` by (https://dispatchq.example.com): its scheme decides "
        "whether the login cookie is Secure. Unset: Secure unless served to this machine only.",
    )
    serve_access_log: Literal["writes", "all", "off"] = Field(
        "writes", description="Which requests `serve` logs a line for: writes, all (reads too) or off."
    )

    @field_validator("serve_allowed_hosts", "serve_trusted_proxies", mode="before")
    @classmethod
    def _split_serve_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip().lower() for part in value.split(",") if part.strip()]
        return value

    @field_validator("serve_allowed_hosts")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        """Names as Starlette's TrustedHostMiddleware compares them (no port, an IPv6 address in
        brackets, `*.domain`), refused here in one line rather than by its assert at start."""
        names = []
        for pattern in value:
            if "*" in pattern and not (pattern.startswith("*.") and "*" not in pattern[1:]):
                raise ValueError(f"{pattern!r}: give a host name, or *.example.com for its subdomains")
            try:
                pattern = f"[{ipaddress.IPv6Address(pattern.strip('[]'))}]"
            except ValueError:
                if ":" in pattern:
                    raise ValueError(f"{pattern!r}: give the host name without a port") from None
            names.append(pattern)
        return names

    @field_validator("serve_public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r}: give the URL browsers use, as https://dispatchq.example.com")
        return value.strip()

    @field_validator("serve_trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value

    # --- serve's bounds: what one request may cost ---------------------------------------------------
    serve_max_body: int = Field(
        5 * 1024 * 1024,
        ge=1024,
        le=25 * 1024 * 1024,
        description="Largest request body `serve` reads, in bytes (GitHub's hard maximum, 25 MB, at most).",
    )
    serve_body_timeout: float = Field(
        30.0, gt=0, description="Seconds a request's whole body may take to arrive before a 408."
    )
    serve_header_timeout: float = Field(
        5.0, gt=0, description="Seconds a request's headers may take to arrive before a 408 and a close."
    )
    serve_idle_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a connection may wait with no request begun (after it opens, or after "
        "its last answer) before it is closed.",
    )
    serve_concurrency: int = Field(
        256,
        ge=8,
        description="Requests `serve` works on at once; past it, 503. A share of it is kept for "
        "/healthz and /webhooks/github (DISPATCHQ_SERVE_RESERVED_SHARE).",
    )
    serve_reserved_share: float = Field(
        0.125,
        ge=0,
        le=0.5,
        description="Share of DISPATCHQ_SERVE_CONCURRENCY only /healthz and /webhooks/github may use, "
        "so requests to other routes cannot take every slot.",
    )
    serve_peer_connections: int = Field(
        32,
        ge=1,
        description="Connections one client address (an IPv6 /64) may hold open; past it a new one is "
        "closed at once. DISPATCHQ_SERVE_TRUSTED_PROXIES are not capped.",
    )
    serve_peer_requests: int = Field(
        32,
        ge=1,
        description="Requests one client (behind a trusted proxy: the address it forwards) may have "
        "in flight; past it, 503.",
    )
    serve_max_connections: int = Field(
        512,
        ge=8,
        description="Connections `serve` holds open in all; past it the longest-waiting one with no "
        "request in flight is closed for the newcomer.",
    )
    serve_spool_dir: Path | None = Field(
        None,
        description="Private folder webhook bodies past 64 KB are written to while their signature is "
        "checked (deleted after) [default: DISPATCHQ_DATA_DIR/serve-spool].",
    )
    serve_max_lines: int = Field(1000, ge=1, description="Most judgements in one `POST /judgements`.")
    serve_max_state: int = Field(
        256 * 1024,
        ge=1024,
        description="Largest judgement state (its JSON, in bytes) `POST /judgements` takes.",
    )
    serve_max_errors: int = Field(
        100,
        ge=1,
        description="Most refused lines one `POST /judgements` may hold before it is refused whole.",
    )
    # --- TLS and WAIT (failover) ---------------------------------------------------------------------
    redis_tls_ca_file: Path | None = Field(
        None, description="CA bundle a rediss:// (or rediss+sentinel://) server's certificate must chain to."
    )
    redis_tls_cert_file: Path | None = Field(
        None, description="Client certificate (PEM) for a Redis that asks for one (tls-auth-clients)."
    )
    redis_tls_key_file: Path | None = Field(
        None, description="Private key (PEM) of DISPATCHQ_REDIS_TLS_CERT_FILE, when not in that file."
    )
    redis_wait_ms: int = Field(
        500, ge=0, description="With Sentinel: how long an enqueue waits for a replica (WAIT); 0 = off."
    )

    # --- session leases ------------------------------------------------------------------------------
    session_lease: int = Field(
        120,
        ge=2,
        description="How long a session's claim lives unrenewed: its holder renews it, and another host "
        "takes the judgement over only after it lapsed (keep it above a failover plus an AOF reload).",
    )
    session_spool_wait: int | None = Field(
        None,
        ge=0,
        description="How long past its lease a judgement whose holder on another host lost contact "
        "waits for that host to replay the answer it may have spooled, before another host asks again "
        "(unset: one DISPATCHQ_SESSION_LEASE; 0: at once).",
    )

    @field_validator("checkout_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part for part in value.split(os.pathsep) if part]
        return value

    @field_validator("checkout_roots")
    @classmethod
    def _resolve_roots(cls, value: list[Path]) -> list[Path]:
        if not value:
            raise ValueError("at least one directory is needed")
        return [Path(p).expanduser().resolve() for p in value]

    @field_validator("typesafe_api_key")
    @classmethod
    def _usable_key(cls, value: SecretStr | None) -> SecretStr | None:
        """The SDK's own rule for a key, checked when settings load, never in a worker's request."""
        if value is None:
            return None
        key = value.get_secret_value().strip()
        if not key:
            return None
        if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
            raise ValueError("must be printable ASCII with no whitespace inside")
        return SecretStr(key)

    @field_validator("typesafe_base_url", "typesafe_default_model")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("typesafe_base_url", "github_api_url")
    @classmethod
    def _https(cls, value: str | None) -> str | None:
        """The TypeSafe key and the GitHub token are sent there: never in clear over a network."""
        if value is not None:
            require_https(value)
        return value

    @field_validator("config")
    @classmethod
    def _absolute_config(cls, value: Path) -> Path:
        """Absolute once, here: the line saying which file was loaded names it unambiguously."""
        return Path(os.path.abspath(value.expanduser()))

    @field_validator(
        "session_deny_env", "session_allow_env", "session_sandbox_bind", "session_egress", mode="before"
    )
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value

    @field_validator("codex_prices")
    @classmethod
    def _price_table(cls, value: str) -> str:
        """A JSON object of model to three prices at or above 0 (empty: the built-in table only)."""
        if not value.strip():
            return value
        try:
            table = json.loads(value)
        except ValueError:
            raise ValueError('is not JSON: give {"model": [input, cached_input, output]}') from None
        if not isinstance(table, dict):
            raise ValueError('must be a JSON object: {"model": [input, cached_input, output]}')
        for model, entry in table.items():
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and all(
                    isinstance(n, int | float) and not isinstance(n, bool) and 0 <= n < math.inf
                    for n in entry
                )
            ):
                raise ValueError(
                    f"{model!r}: give three USD prices per million tokens [input, cached_input, output]"
                )
        return value

    @field_validator("session_command", "codex_command")
    @classmethod
    def _splittable(cls, value: str) -> str:
        try:
            argv = shlex.split(value)
        except ValueError as error:
            raise ValueError(f"cannot be split into words: {error}") from None
        if not argv:
            raise ValueError("must name a command")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No dotenv source: `load_settings` merges DISPATCHQ_ENV_FILE into the mapping itself.
        return (init_settings, _MappingEnvSource(settings_cls))

    # --- derived ------------------------------------------------------------------------------------
    @property
    def embedded(self) -> bool:
        return self.redis_url is None

    @property
    def sessions_dir(self) -> Path:
        """Per-judgement session folders (scratch working dir, the CLI's config folder).

        Beside the data dir, never inside it: a session's working directory is bound into its
        sandbox, and nothing under the data dir (the store, its password) may be reachable
        from there, even by `..` with the sandbox off.
        """
        data = self.data_dir.expanduser().resolve()
        return data.with_name(f"{data.name}-sessions")

    @property
    def serve_spool(self) -> Path:
        """Where `serve` writes webhook bodies while it checks them: inside the data dir (mode 0700)
        by default, on disk rather than in memory (a tmpfs `/tmp` would hold them in RAM)."""
        if self.serve_spool_dir is not None:
            return self.serve_spool_dir.expanduser()
        return self.data_dir.expanduser() / "serve-spool"

    def describe_redis(self) -> str:
        """Which server this process uses, with any password redacted."""
        if self.redis_url is None:
            return f"embedded ({self.data_dir})"
        return redact_url(self.redis_url.get_secret_value())

    def public(self) -> dict[str, Any]:
        """Every setting with its environment variable, secrets redacted (for `dispatchq settings`).

        Any text holding a URL goes through `redact_url` too: a base URL may carry a login.
        """
        out: dict[str, Any] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "**********"
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, list):
                value = [redact_url(str(v)) for v in value]
            elif isinstance(value, str) and "://" in value:
                value = redact_url(value)
            out[env_name(name)] = {"value": value, "description": field.description}
        if self.redis_url is not None:
            out["DISPATCHQ_REDIS_URL"]["value"] = redact_url(self.redis_url.get_secret_value())
        return out


def env_name(field: str) -> str:
    """The environment variable that sets a field."""
    if field.startswith("typesafe_"):
        return field.upper()
    return f"DISPATCHQ_{field.upper()}"


#: Query parameters whose values are secrets (redis-py reads `?password=` and `?username=`).
_SECRET_QUERY = re.compile(r"(?i)^(?:password|username|user|sentinel_password|passwd|pass|token|secret)$")


def redact_url(url: str) -> str:
    """A URL fit to show: the userinfo's password (or a lone token) and secret query values become `***`.

    `redis://user:secret@host/0` -> `redis://user:***@host/0`;
    `unix:///run/redis.sock?password=secret&db=1` -> `unix:///run/redis.sock?password=***&db=1`.
    Split by hand, never by `urlsplit`: a Sentinel URL (`redis+sentinel://u:p@h1:1,h2:2/svc`)
    has several ports, a malformed one must not be echoed whole in a traceback-free error,
    and everything not redacted stays byte for byte what the operator wrote. The one
    redaction everything that shows a URL uses (status, the page, `settings`, outage lines).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        # A lone userinfo is a token as often as a name (`https://<token>@host`): hidden too.
        netloc = f"{user}:***@{hosts}" if colon else f"***@{hosts}"
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, fragment = query.partition("#")
        query = "&".join(_redact_pair(pair) for pair in query.split("&")) + hash_ + fragment
    return f"{scheme}{sep}{netloc}{path}{qmark}{query}"


def _redact_pair(pair: str) -> str:
    name, eq, _value = pair.partition("=")
    return f"{name}=***" if eq and _SECRET_QUERY.match(name) else pair


def is_loopback_host(host: str | None) -> bool:
    """True for a name or address only this machine reaches (`localhost`, 127.0.0.0/8, `::1`)."""
    if not host:
        return False
    name = host.strip().strip("[]").lower().rstrip(".")
    if name == "localhost":  # not `*.localhost`: not every resolver keeps those on this machine
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def require_https(url: str) -> None:
    """Raise ValueError unless `url` is https, or http to a loopback host (a local stand-in).

    A key or token sent over plain http to another machine is readable on the way.
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise ValueError(f"{redact_url(url)!r} is not a URL") from None
    scheme = parts.scheme.lower()
    if not host or scheme not in ("http", "https"):
        raise ValueError(f"must be an https:// URL (got {redact_url(url)!r})")
    if scheme == "http" and not is_loopback_host(host):
        raise ValueError(
            f"must be https://, or http:// to a loopback host only: a credential is sent there "
            f"(got {redact_url(url)!r})"
        )


def _secrets_from_files(environ: Mapping[str, str]) -> dict[str, str]:
    """Values for secret settings given as `<NAME>_FILE` (the file's content, stripped)."""
    found: dict[str, str] = {}
    for env in SECRET_ENV:
        path = environ.get(f"{env}_FILE")
        if not path or environ.get(env):
            continue
        try:
            found[env] = Path(path).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise SettingsError(f"{env}_FILE: cannot read {path}: {error.strerror}") from None
        if not found[env]:
            raise SettingsError(f"{env}_FILE: {path} is empty")
    return found


def _with_env_file(environ: dict[str, str]) -> dict[str, str]:
    """The environment with DISPATCHQ_ENV_FILE's lines beneath it (the environment wins).

    Only a file the operator names: `./.env` is never read, so a checkout cannot set the
    session command or where a key is sent. Its `<NAME>_FILE` lines work like the
    environment's; a child process never sees its values (they are not exported).
    """
    path = environ.get(ENV_FILE)
    if not path:
        return environ
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise SettingsError(f"{ENV_FILE}: cannot read {path}: {reason}") from None
    values = dotenv_values(stream=io.StringIO(text), interpolate=False)
    return {**{k: v for k, v in values.items() if v is not None}, **environ}


def _shown(value: Any) -> str:
    """A rejected value for an error line, any URL in it redacted."""
    return repr(redact_url(value)) if isinstance(value, str) else repr(value)


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from an environment (default: this process's), or fail in one line.

    The error names the variable and never echoes a secret's value.
    """
    env = _with_env_file(dict(os.environ if environ is None else environ))
    file_values = _secrets_from_files(env)
    init: dict[str, Any] = {}
    for env_var, value in file_values.items():
        init[
            "typesafe_api_key"
            if env_var == "TYPESAFE_API_KEY"
            else env_var.removeprefix("DISPATCHQ_").lower()
        ] = value
    init.update(overrides)
    token = _ENVIRON.set(env)
    try:
        return Settings(**init)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        name = env_name(field) if field in Settings.model_fields else field
        message = first["msg"].removeprefix("Value error, ")
        shown = "" if name in SECRET_ENV or "(got " in message else f" (got {_shown(first.get('input'))})"
        raise SettingsError(f"{name}: {message}{shown}") from None
    finally:
        _ENVIRON.reset(token)
