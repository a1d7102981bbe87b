"""The one definition of the environment a child of dispatchq starts with.

Every child that runs repository code (produce-and-verify, approved checks, git) is started
with `child_environment(...)`; a headless session with `session_environment(...)`. Keeping
the rule here, and only here, is what lets invariant 4 ("a session gets its one credential and
nothing else") be tested once and trusted everywhere.

The rule: the environment is an allowlist. A deny list only ever withholds the
names it knows, and every host grows names nobody listed (`GH_PAT`, `OTEL_EXPORTER_OTLP_HEADERS`,
`AZURE_STORAGE_CONNECTION_STRING`, ...); so a child gets only what is *named*:

- A session: `SESSION_BASE` (PATH, HOME, TMPDIR, TERM, TZ, locale: LANG, LANGUAGE, LC_*),
  proxy settings (any case) and CA bundle paths, the CLI's own non-secret settings
  (`CLI_SETTINGS`, by name), the operator's `DISPATCHQ_SESSION_ALLOW_ENV` (exact names or
  globs), then its one credential, added last, and `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB`.
- Repository code: `CHILD_BASE` (the session's base plus USER, LOGNAME, SHELL), proxies and CA
  bundles, plus what the kind names under `env:` (exact names or globs).
- Never, whatever is allowed (`_NEVER`): `TYPESAFE_API_KEY(_FILE)`, every `DISPATCHQ_*`,
  `CLAUDECODE`, `SSH_AUTH_SOCK` (the operator's ssh-agent is a second credential),
  `GIT_CONFIG_*` (`GIT_CONFIG_VALUE_0` carries `http.extraHeader` tokens), exported shell
  functions (`BASH_FUNC_*`), `CLAUDE_CODE_RETRY_WATCHDOG*` (under it `claude -p`
  sleeps through a usage limit, holding a slot for hours while dispatchq believes it works).
- Set by dispatchq for every session (`SESSION_FORCED`), whatever the parent has:
  `CLAUDE_CODE_RETRY_WATCHDOG=0` and `CLAUDE_CODE_STARTUP_FAILURE_RESULTS=1` (a start-up
  refusal is written as a result with its `startup_failure_reason`). Claude Code applies a
  checkout's `.claude/settings.json` `env` over its process environment (measured on
  2.1.197 and 2.1.332), so the same values also go in as `--settings` (`session_argv`),
  which ranks above the project's and the local settings.
- A name let in by the operator's allow list or a kind's `env:` is still withheld when it is
  secret-shaped (`is_secret_name`: a segment such as TOKEN, PAT, PWD, JWT, WEBHOOK, HEADERS,
  camelCase split too): the allow list widens what a session sees, never its credentials.
  The base names and the CLI settings are fixed names and need no such check.
- Any passed name is withheld when its *value* is secret-shaped (`is_secret_value`): a URL with
  a password in its userinfo (a proxy's `user@` alone is kept), `ghp_`/`gho_`/`ghs_`/`ghu_`/
  `ghr_`/`github_pat_`, `sk-`, `xox?-`, `glpat-`, `AKIA`/`ASIA` keys, `?password=`/`&password=`,
  `AccountKey=`/`SharedAccessKey=`, a private key block, an exported shell function. The
  session's own credential is exempt: it is the one secret it is meant to have.
- The operator's deny list (`DISPATCHQ_SESSION_DENY_ENV`) wins over everything but the
  credential: an operator who names a variable means it.

Scrubbing the environment is not enough on its own: a process of the same user can read
another's `/proc/<pid>/environ`. `mark_non_dumpable()` closes that door for dispatchq's own
long-running processes, and `read_secret()` lets secrets live in files (`<NAME>_FILE`) rather
than in any process's environment at all.
"""

from __future__ import annotations

import ctypes
import fnmatch
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from dispatchq.errors import SettingsError
from dispatchq.launcher.releases import is_claude_command

__all__ = [
    "CA_BUNDLE_NAMES",
    "CHILD_BASE",
    "CLI_SETTINGS",
    "NEVER_PASS",
    "PROXY_NAMES",
    "SECRET_SEGMENTS",
    "SESSION_BASE",
    "SESSION_FORCED",
    "child_environment",
    "is_dumpable",
    "is_secret_name",
    "is_secret_value",
    "mark_non_dumpable",
    "read_secret",
    "session_argv",
    "session_env_names",
    "session_environment",
    "url_userinfo",
]

SECRET_SEGMENTS = frozenset(
    {
        "KEY",
        "TOKEN",
        "SECRET",
        "PASS",
        "PASSWORD",
        "PASSWD",
        "PW",
        "PWD",
        "PAT",
        "JWT",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "AUTH",
        "AUTHTOKEN",
        "APIKEY",
        "ACCESSKEY",
        "SECRETKEY",
        "PASSPHRASE",
        "PGPASSWORD",
        "PRIVATE",
        "SIGNATURE",
        "COOKIE",
        "DSN",
        "WEBHOOK",
        "HEADERS",
        "CONNECTIONSTRING",
        "SAS",
    }
)
# Two segments that together name a secret though neither does alone.
_SECRET_PAIRS = frozenset({("CONNECTION", "STRING")})
# A name that is one of these whole is harmless although a segment matches (`PWD` is the
# shell's working directory, `OLDPWD` its previous one).
_HARMLESS_NAMES = frozenset({"PWD", "OLDPWD"})

# What every session needs; HOME and TMPDIR are overridden by the sandbox where it runs.
SESSION_BASE = frozenset({"PATH", "HOME", "TMPDIR", "TERM", "TZ", "LANG", "LANGUAGE"})
# What a toolchain-neutral repository command needs besides (many tools read the user's name).
CHILD_BASE = SESSION_BASE | {"USER", "LOGNAME", "SHELL"}
_LOCALE_PREFIX = "LC_"
# Honoured in either case by curl, requests, node and git; a value with a password is withheld.
PROXY_NAMES = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY"})
CA_BUNDLE_NAMES = frozenset(
    {
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
    }
)
# Claude Code's own settings that carry no secret and point nowhere private, by name. Left
# out on purpose: ANTHROPIC_CUSTOM_HEADERS (headers carry tokens), ANTHROPIC_PROFILE and
# ANTHROPIC_CONFIG_DIR (a second login), every other credential or `*_FILE` of the CLI,
# CLAUDE_CODE_USE_BEDROCK/VERTEX/FOUNDRY (another provider means another credential),
# CLAUDE_CODE_RETRY_WATCHDOG* (dispatchq waits out limits itself: the watchdog would hide a
# closed window in a silent sleep), CLAUDE_CODE_TMPDIR and CLAUDE_CONFIG_DIR (the sandbox
# sets the session's own). An operator who wants one of them names it in the allow list.
CLI_SETTINGS = frozenset(
    {
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
        "MAX_THINKING_TOKENS",
        "MAX_MCP_OUTPUT_TOKENS",
        "MCP_TIMEOUT",
        "MCP_TOOL_TIMEOUT",
        "API_TIMEOUT_MS",
        "BASH_DEFAULT_TIMEOUT_MS",
        "BASH_MAX_TIMEOUT_MS",
        "BASH_MAX_OUTPUT_LENGTH",
        "CLAUDE_CODE_MAX_RETRIES",
        "CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE",
        "CLAUDE_CODE_DISABLE_DEFERRED_TOOL_RESUME",
        "CLAUDE_CODE_RESUME_INTERRUPTED_TURN",
        "CLAUDE_CODE_FORWARD_SUBAGENT_TEXT",
        "CLAUDE_CODE_PROJECT_DIR_NAME",
        "CLAUDE_CODE_RESTRICTED",
        "DISABLE_TELEMETRY",
        "DISABLE_ERROR_REPORTING",
        "DISABLE_AUTOUPDATER",
        "DISABLE_BUG_COMMAND",
        "DISABLE_COST_WARNINGS",
        "DISABLE_PROMPT_CACHING",
        "DISABLE_NON_ESSENTIAL_MODEL_CALLS",
        "USE_BUILTIN_RIPGREP",
    }
)

NEVER_PASS = frozenset({"TYPESAFE_API_KEY", "TYPESAFE_API_KEY_FILE"})
# Never passed, not even when allowed (globs, matched case-insensitively).
_NEVER = (
    "DISPATCHQ_*",
    "CLAUDECODE",
    "SSH_AUTH_SOCK",
    "GIT_CONFIG_*",
    "BASH_FUNC_*",
    "CLAUDE_CODE_RETRY_WATCHDOG*",
)
# What dispatchq itself sets for every session: limits are reported, never slept
# through (dispatchq waits them out with no slot held), and a refused start says why.
SESSION_FORCED: Mapping[str, str] = {
    "CLAUDE_CODE_RETRY_WATCHDOG": "0",
    "CLAUDE_CODE_STARTUP_FAILURE_RESULTS": "1",
}
_SETTINGS_FLAG = "--settings"

SESSION_SCRUB_FLAG = "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"

_NAME_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEGMENT_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# scheme://userinfo@ anywhere in the value; userinfo stops at the first / ? # @ or space.
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#@\s]*)@")
_SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_\-]{16,}"
    r"|xox[a-z]-[A-Za-z0-9\-]{10,}"
    r"|glpat-[A-Za-z0-9_\-]{16,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r")"
    r"|[?&;]\s*(?:password|passwd|pwd)="
    r"|(?:AccountKey|SharedAccessKey|SharedAccessSignature)="
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----",
    re.IGNORECASE,
)


def _segments(name: str) -> list[str]:
    return [seg.upper() for part in _SEGMENT_SPLIT.split(name) for seg in _CAMEL.split(part) if seg]


def is_secret_name(name: str) -> bool:
    """True when one of the name's segments is secret-shaped (`GH_PAT`, `npm_config__authToken`).

    Segments, not substrings: `GIT_AUTHOR_NAME`, `TOKENIZERS_PARALLELISM` and `XAUTHORITY`
    carry no secret. camelCase splits too (`githubToken`), and a few pairs count together
    (`..._CONNECTION_STRING`).
    """
    if name.upper() in _HARMLESS_NAMES:
        return False
    segments = _segments(name)
    if any(seg in SECRET_SEGMENTS for seg in segments):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(segments))


def url_userinfo(value: str) -> tuple[bool, bool]:
    """(has userinfo, has password) over every URL in `value`."""
    userinfo = has_password = False
    for match in _URL_USERINFO.finditer(value):
        userinfo = True
        if ":" in match.group(1):
            has_password = True
    return userinfo, has_password


def is_secret_value(value: str) -> bool:
    """True when the value itself looks like a credential, whatever its name."""
    if value.lstrip().startswith("() {"):  # an exported shell function: code, not a setting
        return True
    if url_userinfo(value)[1]:
        return True
    return _SECRET_VALUE.search(value) is not None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _never(name: str) -> bool:
    upper = name.upper()
    return upper in NEVER_PASS or _matches(upper, _NEVER)


def _clean(patterns: Iterable[str]) -> tuple[str, ...]:
    return tuple(p.strip() for p in patterns if p and p.strip())


def _is_base(name: str, base: frozenset[str]) -> bool:
    """A fixed name of the base: no name check (`TZ` and `LANG` are what they say)."""
    return (
        name in base
        or name.startswith(_LOCALE_PREFIX)
        or name.upper() in PROXY_NAMES
        or name in CA_BUNDLE_NAMES
    )


def _passes(
    name: str, value: str, fixed: frozenset[str], allow: tuple[str, ...], deny: tuple[str, ...]
) -> bool:
    """One name's verdict under the allowlist; the order of the checks is the rule's order."""
    if _never(name) or _matches(name, deny):
        return False
    if not (_is_base(name, fixed) or (_matches(name, allow) and not is_secret_name(name))):
        return False
    return not is_secret_value(value)


def _check_credential(credential: tuple[str, str]) -> tuple[str, str]:
    name, value = credential
    if not isinstance(name, str) or not _NAME_OK.match(name):
        raise SettingsError(f"session credential variable {name!r} is not a valid environment variable name")
    if _never(name):
        raise SettingsError(f"{name} can never be given to a child process as its credential")
    if not isinstance(value, str) or "\0" in value:
        raise SettingsError(f"the value of session credential {name} is not a valid environment value")
    return name, value


def _allowed(
    parent: Mapping[str, str], fixed: frozenset[str], allow: Iterable[str], deny: Iterable[str]
) -> dict[str, str]:
    allow_list, deny_list = _clean(allow), _clean(deny)
    return {
        name: value for name, value in parent.items() if _passes(name, value, fixed, allow_list, deny_list)
    }


def child_environment(
    parent: Mapping[str, str],
    *,
    deny: Iterable[str] = (),
    allow: Iterable[str] = (),
    credential: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a child running repository code: `CHILD_BASE` plus what `allow` names.

    `parent` is passed in (callers give `parent_environment()` at the edge) so the rule is a
    pure function that tests can feed any environment. `allow` is the kind's `env:` (exact
    names or globs), `deny` the operator's deny list. A repository-code child gets no
    credential (`credential=None`); one given is added after the rule, so it is the only
    secret a child can see.
    """
    env = _allowed(parent, CHILD_BASE, allow, deny)
    if credential is not None:
        name, value = _check_credential(credential)
        env[name] = value
    return env


def session_environment(
    parent: Mapping[str, str],
    *,
    deny: Iterable[str] = (),
    allow: Iterable[str] = (),
    credential_var: str,
    credential_value: str | None,
    scrub_subprocesses: bool = True,
) -> dict[str, str]:
    """The environment of a headless session: the allowlist, its one credential, the scrub flag.

    `allow` is `DISPATCHQ_SESSION_ALLOW_ENV`, `deny` `DISPATCHQ_SESSION_DENY_ENV` (which wins).
    `scrub_subprocesses` is `dispatchq.launcher.scrub.decide_scrub`'s answer: the flag is
    `1` only where bubblewrap works (Claude Code refuses to start with it otherwise), and an
    explicit `0` elsewhere.

    A separate helper rather than a flag on `child_environment` so that a call site reads as
    what it starts: repository code never gets a credential by a forgotten keyword.
    `credential_value=None` (no token configured) adds nothing; the name is checked anyway.
    """
    name, _ = _check_credential((credential_var, credential_value or ""))
    env = _allowed(parent, SESSION_BASE | CLI_SETTINGS, allow, deny)
    env.pop(name, None)  # the parent's copy never stands in for the configured one
    if credential_value is not None:
        env[name] = _check_credential((name, credential_value))[1]
    env[SESSION_SCRUB_FLAG] = "1" if scrub_subprocesses else "0"
    env.update(SESSION_FORCED)
    return env


def _given_settings(value: str) -> dict[str, object]:
    """The operator's own `--settings` value (a JSON object or a file holding one), parsed."""
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = type(exc).__name__
            raise SettingsError(f"session --settings file {value!r} cannot be read ({why})") from None
    try:
        parsed = json.loads(text)
    except ValueError:
        raise SettingsError(f"session --settings {value!r} is not a JSON object") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f"session --settings {value!r} is not a JSON object")
    return parsed


def session_argv(argv: list[str]) -> list[str]:
    """`argv` with `SESSION_FORCED` given as `--settings` when the command is Claude Code.

    The process environment alone loses to a checkout's `.claude/settings.json` `env` (the
    CLI applies settings over it), and a checkout could turn the retry watchdog back on;
    `--settings` ranks above project and local settings, below only the host's managed
    policy. An operator's own `--settings` (in the command or a kind's `args`) is kept: it
    is read and merged, ours winning for the forced names, since the CLI takes only the last.
    Any other command (a stand-in, a wrapper) is left as it is.
    """
    if not argv or not is_claude_command(argv[0]):
        return list(argv)
    out: list[str] = []
    given: dict[str, object] = {}
    words = iter(argv)
    for word in words:
        if word == _SETTINGS_FLAG:
            given = _given_settings(next(words, ""))
        elif word.startswith(_SETTINGS_FLAG + "="):
            given = _given_settings(word.split("=", 1)[1])
        else:
            out.append(word)
    theirs = given.get("env")
    env = dict(theirs) if isinstance(theirs, dict) else {}
    env.update(SESSION_FORCED)
    return [*out, _SETTINGS_FLAG, json.dumps({**given, "env": env}, separators=(",", ":"))]


def session_env_names(
    parent: Mapping[str, str],
    *,
    deny: Iterable[str] = (),
    allow: Iterable[str] = (),
    credential_var: str,
    credential_present: bool,
) -> dict[str, list[str]]:
    """What a session started now would get, by name only (`dispatchq settings`), and what the
    allow list named but the rule withholds (secret-shaped, denied or never), so an operator
    sees why a name they allowed does not arrive. Values are never returned."""
    env = session_environment(
        parent,
        deny=deny,
        allow=allow,
        credential_var=credential_var,
        credential_value="x" if credential_present else None,
    )
    allow_list = _clean(allow)
    refused = sorted(name for name in parent if name not in env and _matches(name, allow_list))
    return {"passes": sorted(env), "allowed_but_withheld": refused}


def read_secret(name: str, environ: Mapping[str, str]) -> str | None:
    """A secret from `<NAME>` or, when that is unset or empty, the file named by `<NAME>_FILE`.

    Files let a secret stay out of every process's environment (and so out of every
    `/proc/<pid>/environ`). The file's content is stripped, since editors and
    `echo >` add a trailing newline. A named file that is missing, unreadable or empty is a
    setting error naming the variable: silently running without the secret would look like
    "no key" and quietly change behaviour.
    """
    value = environ.get(name)
    if value:
        return value
    file_var = f"{name}_FILE"
    path = environ.get(file_var)
    if not path:
        return None
    try:
        content = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise SettingsError(f"{file_var}: file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SettingsError(f"{file_var}: cannot read {path!r} ({reason})") from None
    if not content:
        raise SettingsError(f"{file_var}: file {path!r} is empty")
    return content


# --- /proc/<pid>/environ protection -----------------------------------------------------
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols hold libc's: `find_library` would start `ldconfig -p`, a
        # child process, in every dispatchq process that marks itself.
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


def mark_non_dumpable() -> bool:
    """Make this process's `/proc/<pid>/environ` and memory unreadable to other processes.

    A session runs as the same user as its worker and could otherwise read the worker's
    starting environment (TypeSafe key, Redis password) straight out of `/proc`. Non-dumpable
    processes are readable only with CAP_SYS_PTRACE, i.e. by root. Call it first thing in
    every long-running dispatchq process. Returns False where the platform has no such switch.
    The flag does not survive `execve`, so children are unaffected.
    """
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def is_dumpable() -> bool | None:
    """The current dumpable flag (None where it cannot be read): for status and tests."""
    prctl = _prctl()
    if prctl is None:
        return None
    value = prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    return None if value < 0 else value != 0
