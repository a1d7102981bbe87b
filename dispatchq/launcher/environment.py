"""The one definition of the environment a child of dispatchq starts with.

Every child that runs repository code (produce-and-verify, approved checks) or a headless
session is started with `child_environment(...)`; a session with `session_environment(...)`.
Keeping the rule here, and only here, is what lets invariant 4 ("no secret-shaped variable of
the parent reaches a spawned session") be tested once and trusted everywhere.

The rule (issue 4, "Environment"):

- Withheld by *name*: any name whose segments (split on `_` and any other non-alphanumeric)
  include one of `SECRET_SEGMENTS` (plus a few well-known compounds such as `PGPASSWORD`,
  `MYSQL_PWD`, `*_APIKEY`); `INPUT_*` (CI inputs); exported shell functions
  (`BASH_FUNC_*`); every `DISPATCHQ_*` (dispatchq's settings are none of a child's business);
  `CLAUDECODE`; the operator's deny list (exact names or shell-style globs).
- Withheld by *value*: a URL carrying userinfo (`scheme://user[:pass]@host`) anywhere in the
  value; an exported shell function body (`() {`).
- The keep list (`PATH`, `HOME`, locale, `XDG_*`, proxies, CA bundles, `CLAUDE_CONFIG_DIR`, ...)
  wins over the *name* patterns and over the userinfo rule, except that a URL with a password
  is withheld even there (`HTTPS_PROXY=http://user:pass@proxy`). The deny list wins over the
  keep list: an operator who names a variable means it.
- `TYPESAFE_API_KEY` and `TYPESAFE_API_KEY_FILE` never pass, whatever the settings: they are
  not accepted as the credential either.
- A session then gets exactly one credential, added after the scrub, plus
  `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1` so Claude Code scrubs its own tool subprocesses too
  (where bubblewrap works: `dispatchq.launcher.scrub`).

Scrubbing the environment is not enough on its own: a process of the same user can read
another's `/proc/<pid>/environ`. `mark_non_dumpable()` closes that door for dispatchq's own
long-running processes, and `read_secret()` lets secrets live in files (`<NAME>_FILE`) rather
than in any process's environment at all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fnmatch
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from dispatchq.errors import SettingsError

__all__ = [
    "KEEP_NAMES",
    "NEVER_PASS",
    "SECRET_SEGMENTS",
    "child_environment",
    "is_dumpable",
    "is_secret_name",
    "mark_non_dumpable",
    "read_secret",
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
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "PRIVATE",
        "SIGNATURE",
        "COOKIE",
        "DSN",
    }
)

# Beyond the segment list: well-known secrets whose names hide the word inside a
# segment (`PGPASSWORD`, `OPENAI_APIKEY`). Strictly more withholding, never less.
_EXTRA_SECRET_SEGMENTS = frozenset({"APIKEY", "ACCESSKEY", "SECRETKEY", "PASSPHRASE", "PGPASSWORD"})
_EXTRA_SECRET_NAMES = frozenset({"MYSQL_PWD"})

# Names that pass even though a pattern would withhold them (value rules still apply).
KEEP_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "TERM",
        "TMPDIR",
        "SSH_AUTH_SOCK",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CLAUDE_CONFIG_DIR",
    }
)
_KEEP_PREFIXES = ("LC_", "XDG_")
# Proxy variables are honoured in either case by curl, requests, node and git.
_KEEP_ANY_CASE = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY"})

NEVER_PASS = frozenset({"TYPESAFE_API_KEY", "TYPESAFE_API_KEY_FILE"})
_DROPPED_NAMES = frozenset({"CLAUDECODE"})

SESSION_SCRUB_FLAG = "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB"

_NAME_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEGMENT_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# scheme://userinfo@ anywhere in the value; userinfo stops at the first / ? # @ or space.
_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/?#@\s]*)@")


def is_secret_name(name: str) -> bool:
    """True when one of the name's segments is secret-shaped (`GITHUB_TOKEN`, `npm_config__auth`).

    Segments, not substrings: `GIT_AUTHOR_NAME`, `TOKENIZERS_PARALLELISM` and `XAUTHORITY`
    carry no secret and must keep working in the child.
    """
    upper = name.upper()
    if upper in _EXTRA_SECRET_NAMES:
        return True
    segments = [seg for seg in _SEGMENT_SPLIT.split(upper) if seg]
    return any(seg in SECRET_SEGMENTS or seg in _EXTRA_SECRET_SEGMENTS for seg in segments)


def url_userinfo(value: str) -> tuple[bool, bool]:
    """(has userinfo, has password) over every URL in `value`."""
    userinfo = has_password = False
    for match in _URL_USERINFO.finditer(value):
        userinfo = True
        if ":" in match.group(1):
            has_password = True
    return userinfo, has_password


def _is_kept(name: str) -> bool:
    return name in KEEP_NAMES or name.startswith(_KEEP_PREFIXES) or name.upper() in _KEEP_ANY_CASE


def _is_shell_function(name: str, value: str) -> bool:
    return name.startswith("BASH_FUNC_") or value.lstrip().startswith("() {")


def _denied(name: str, deny: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in deny)


def _withheld(name: str, value: str, deny: tuple[str, ...]) -> bool:
    upper = name.upper()
    if upper in NEVER_PASS or upper.startswith("DISPATCHQ_") or name in _DROPPED_NAMES:
        return True
    if _denied(name, deny) or _is_shell_function(name, value):
        return True
    userinfo, password = url_userinfo(value)
    if _is_kept(name):
        return password
    if userinfo:
        return True
    return upper.startswith("INPUT_") or is_secret_name(name)


def _check_credential(credential: tuple[str, str]) -> tuple[str, str]:
    name, value = credential
    if not isinstance(name, str) or not _NAME_OK.match(name):
        raise SettingsError(f"session credential variable {name!r} is not a valid environment variable name")
    if name.upper() in NEVER_PASS or name.upper().startswith("DISPATCHQ_"):
        raise SettingsError(f"{name} can never be given to a child process as its credential")
    if not isinstance(value, str) or "\0" in value:
        raise SettingsError(f"the value of session credential {name} is not a valid environment value")
    return name, value


def child_environment(
    parent: Mapping[str, str],
    *,
    deny: Iterable[str] = (),
    credential: tuple[str, str] | None = None,
) -> dict[str, str]:
    """The parent's environment minus everything secret-shaped, plus at most one credential.

    `parent` is passed in (callers give `os.environ` at the edge) so the rule is a pure
    function that tests can feed any environment. `deny` holds exact names or globs.
    The credential is added after the scrub, so it is the only secret-shaped name a child
    can see; a repository-code child gets none (`credential=None`).
    """
    deny_list = tuple(d.strip() for d in deny if d and d.strip())
    env = {name: value for name, value in parent.items() if not _withheld(name, value, deny_list)}
    if credential is not None:
        name, value = _check_credential(credential)
        env[name] = value
    return env


def session_environment(
    parent: Mapping[str, str],
    *,
    deny: Iterable[str] = (),
    credential_var: str,
    credential_value: str | None,
    scrub_subprocesses: bool = True,
) -> dict[str, str]:
    """The environment of a headless session: the scrub, its one credential, the scrub flag.

    `scrub_subprocesses` is `dispatchq.launcher.scrub.decide_scrub`'s answer: the flag is
    `1` only where bubblewrap works (Claude Code refuses to start with it otherwise), and an
    explicit `0` elsewhere.

    A separate helper rather than a flag on `child_environment` so that a call site reads as
    what it starts: repository code never gets a credential by a forgotten keyword.
    `credential_value=None` (no token configured: Claude Code then uses the login stored
    under `CLAUDE_CONFIG_DIR`) adds nothing.
    """
    credential = (credential_var, credential_value) if credential_value is not None else None
    if credential is None:
        _check_credential((credential_var, ""))
    env = child_environment(parent, deny=deny, credential=credential)
    env[SESSION_SCRUB_FLAG] = "1" if scrub_subprocesses else "0"
    return env


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
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
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
