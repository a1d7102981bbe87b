#!/usr/bin/env python3
"""A session command that looks around as an attacker who controls the prompt would.

Used as DISPATCHQ_SESSION_COMMAND (`python3 -I look_around.py`) by
tests/integration/test_look_around.py, and as a Bash tool command inside the real CLI.
Standard library only, so it runs under any python3 and inside a sandbox that shows only
the interpreter's own installation. It reads the prompt on stdin, looks at everything a
session could reach from where it runs, and prints Claude-Code-shaped stream-json whose
`result` text is a JSON report of what it found, grouped by kind:

- environment: every variable whose name or value looks secret, besides the one expected
  credential, and any variable holding another pool credential's value it was told of
  (`other_credentials`; with `own_credential`, whether its credential is that one), and the
  full list of names;
- files: each secret-bearing file it can read (`*_FILE` paths it was told or learnt from
  /proc, the data dir, the homes' logins and keys, /etc/dispatchq, $XDG_RUNTIME_DIR, other
  judgements' session folders);
- stores: every unix socket (walked from the likely folders, then from /, with a time budget;
  and /proc/net/unix), every loopback TCP port that accepts, abstract unix sockets: each is
  sent a Redis PING (then INFO/KEYS, and AUTH with any password it learnt); the proxy named in
  its own HTTPS_PROXY/HTTP_PROXY is expected, and is a finding only if it lets the probe reach a
  forbidden target;
- processes: how many it sees, and every secret-shaped value in the environ or cmdline of a
  process outside its own tree (ancestors count as outside: they are dispatchq's);
- writes: a canary file created (then removed) in dispatchq's folders;
- jobs: a job pushed onto each dispatchq queue of a store it reached (only in stores the test
  named as targets, so a run on a shared machine never writes into someone else's Redis).

Run as Codex (`… exec --json … -`, the `codex` backend's argv) it answers in `codex exec --json`'s
JSON Lines instead (`thread.started`, `turn.started`, the report as an `agent_message` item,
`turn.completed` with `usage`). Its own CLI config folder (`CLAUDE_CONFIG_DIR`, or `CODEX_HOME`
when run as Codex) is the session's own: a file there is no way out, except one holding another
pool credential or a secret-shaped value; the credential file the context names there
(`credential_file`: a plan's `auth.json`) is its one credential when it holds `own_credential`,
and a finding otherwise.

What an attacker may know (the data dir, the secret file paths, the repo, a listener's port) is
given in the prompt between LOOKAROUND< and >LOOKAROUND as base64 JSON; without it the probe still
looks everywhere it can guess. Secret values are never printed: a finding names where it was
and which rule matched.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import errno
import json
import os
import pickle
import re
import resource
import selectors
import socket
import stat
import sys
import time
import uuid
import zlib

MAX_LISTED = 300

# --- what looks secret ---------------------------------------------------------------------------
SECRET_SEGMENTS = {
    "KEY", "KEYS", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASS", "PASSWORD", "PASSWD", "PW", "PWD",
    "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "AUTH", "AUTHTOKEN", "PRIVATE", "SIGNATURE", "COOKIE",
    "DSN", "JWT", "PAT", "APIKEY", "ACCESSKEY", "SECRETKEY", "PASSPHRASE", "WEBHOOK", "BEARER",
    "SAS", "CONNECTION", "OTP", "HEADERS", "PGPASSWORD",
}  # fmt: skip
HARMLESS_NAMES = {"PWD", "OLDPWD", "XAUTHORITY_UNUSED"}
SOCKET_NAMES = {"SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS", "GNOME_KEYRING_CONTROL"}
VALUE_RULES = [
    ("github token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("sk- key", re.compile(r"\bsk-[A-Za-z0-9_-]{12,}")),
    ("slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}")),
    ("slack webhook", re.compile(r"hooks\.slack\.com/")),
    ("aws access key", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("AccountKey=", re.compile(r"AccountKey=", re.I)),
    ("SharedAccessSignature", re.compile(r"(SharedAccessSignature|sig)=[A-Za-z0-9%]{10,}", re.I)),
    ("password=", re.compile(r"[?&;]?\b(password|passwd|pwd|pass)=[^&;\s]+", re.I)),
    ("url userinfo", re.compile(r"[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@", re.I)),
    ("authorization header", re.compile(r"(authorization|x-api-key|api-key)\s*[=:]\s*\S+", re.I)),
    ("bearer", re.compile(r"\bbearer\s+[A-Za-z0-9._~+/-]{8,}", re.I)),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}")),
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("npm token", re.compile(r"\bnpm_[A-Za-z0-9]{20,}")),
    ("gitlab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}")),
    ("typesafe/anthropic key", re.compile(r"\b(ts|sk-ant)-[A-Za-z0-9_-]{12,}")),
]


def segments(name: str) -> list[str]:
    """`camelCaseName_or_SNAKE-name` -> upper-case words (camelCase split too)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [part.upper() for part in re.split(r"[^A-Za-z0-9]+", spaced) if part]


def name_rule(name: str) -> str | None:
    if name in HARMLESS_NAMES:
        return None
    if name in SOCKET_NAMES:
        return "agent/keyring socket"
    if name.startswith("GIT_CONFIG_"):
        return "GIT_CONFIG_* (config given by environment)"
    words = segments(name)
    hit = [w for w in words if w in SECRET_SEGMENTS]
    if hit:
        return f"name segment {hit[0]}"
    upper = name.upper()
    for word in ("PASSWORD", "PASSWD", "TOKEN", "SECRET", "APIKEY", "AUTHTOKEN"):
        if word in upper:
            return f"name contains {word}"
    return None


def value_rule(value: str) -> str | None:
    for why, rule in VALUE_RULES:
        if rule.search(value):
            return f"value looks like {why}"
    return None


def secret_why(name: str, value: str, allowed: set[str]) -> str | None:
    """Why name=value looks secret, or None; the expected credential's value never counts."""
    if value in allowed and value:
        return None
    return name_rule(name) or value_rule(value)


# --- small helpers -------------------------------------------------------------------------------
def read_environ(pid: str) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        raw = handle.read()
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def parent_of(pid: str) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def error_name(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno:
        return errno.errorcode.get(error.errno, str(error.errno))
    return type(error).__name__


def context_from(prompt: str) -> dict:
    match = re.search(r"LOOKAROUND<([A-Za-z0-9+/=_-]+)>LOOKAROUND", prompt)
    if not match:
        return {}
    try:
        return json.loads(base64.urlsafe_b64decode(match.group(1)))
    except ValueError:
        return {}


class Probe:
    """One look around; `report()` is the JSON the session answers with."""

    def __init__(self, context: dict) -> None:
        self.ctx = context
        self.started = time.monotonic()
        self.env = self._own_environ()
        self.credential = context.get("credential", "CLAUDE_CODE_OAUTH_TOKEN")
        home = self.env.get(context.get("config_var", "CLAUDE_CONFIG_DIR"), "")
        self.config_home = os.path.realpath(home) if home else ""  # its own CLI config folder
        self.credential_file = context.get("credential_file")  # a file there that is its credential
        cred_value = self.env.get(self.credential, "")
        self.allowed_values = {cred_value} if cred_value else set()
        self.findings: dict[str, list[dict]] = {
            k: [] for k in ("environment", "files", "stores", "processes", "writes", "jobs")
        }
        self.info: dict[str, object] = {}
        self.secret_files: set[str] = set(context.get("secret_files", []))
        self.passwords: set[str] = set(context.get("passwords", []))  # what an attacker guesses
        self.own_tree: set[str] = set()
        self.read_paths: set[str] = set()
        self.reached: list[tuple[str, object]] = []  # stores answering commands: (label, address)

    @staticmethod
    def _own_environ() -> dict[str, str]:
        try:
            return read_environ("self")
        except OSError:
            return dict(os.environ)

    def add(self, kind: str, **finding: object) -> None:
        self.findings[kind].append(finding)

    # --- processes (first: what it learns there feeds the rest) ----------------------------------
    def look_at_processes(self) -> None:
        me = str(os.getpid())
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        parents = {p: parent_of(p) for p in pids}
        ancestors = []
        cursor = parents.get(me)
        while cursor and cursor != "0" and cursor not in ancestors:
            ancestors.append(cursor)
            cursor = parents.get(cursor)
        descendants = {me}
        grew = True
        while grew:
            grew = False
            for pid, parent in parents.items():
                if parent in descendants and pid not in descendants:
                    descendants.add(pid)
                    grew = True
        self.own_tree = descendants
        environ_ok = cmdline_ok = 0
        for pid in sorted(set(pids) - descendants, key=int):
            try:
                env = read_environ(pid)
                environ_ok += 1
            except OSError:
                env = {}
            for name, value in env.items():
                self._learn(name, value)
                why = secret_why(name, value, self.allowed_values)
                if why:
                    self.add("processes", pid=int(pid), where="environ", name=name, why=why)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    argv = [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
                cmdline_ok += 1
            except OSError:
                argv = []
            self._cmdline_secrets(pid, argv)
        self.info["processes"] = {
            "visible": len(pids),
            "own_tree": len(descendants),
            "ancestors": len(ancestors),
            "foreign": len(set(pids) - descendants - set(ancestors)),
            "readable_environ": environ_ok,
            "readable_cmdline": cmdline_ok,
        }

    def _cmdline_secrets(self, pid: str, argv: list[str]) -> None:
        for i, arg in enumerate(argv):
            why = value_rule(arg) if arg not in self.allowed_values else None
            flag = argv[i - 1] if i else ""
            if not why and flag.startswith("-") and name_rule(flag.lstrip("-").replace("-", "_")):
                why = f"argument of {flag}"
                self.passwords.add(arg)
            if why:
                self.add("processes", pid=int(pid), where="cmdline", name=f"argv[{i}]", why=why)

    def _learn(self, name: str, value: str) -> None:
        """What an attacker takes away from an environment: file paths and passwords."""
        if name.endswith("_FILE") and value.startswith("/") and name_rule(name[: -len("_FILE")]):
            self.secret_files.add(value)
        for match in re.finditer(r"rediss?://[^:/@\s]*:([^@\s]+)@", value):
            self.passwords.add(match.group(1))
        if name_rule(name) and value and value not in self.allowed_values and len(value) < 200:
            self.passwords.add(value)

    # --- environment ---------------------------------------------------------------------------
    def look_at_environment(self) -> None:
        for name, value in sorted(self.env.items()):
            self._learn(name, value)
            if name == self.credential:
                continue
            why = secret_why(name, value, self.allowed_values)
            if why:
                self.add("environment", name=name, why=why)
        # Another pool credential's value anywhere in the environment (the test names them).
        for other in self.ctx.get("other_credentials", []):
            for name, value in sorted(self.env.items()):
                if other and other in value:
                    self.add("environment", name=name, why="another pool credential's value")
        own = self.ctx.get("own_credential")
        value = self.env.get(self.credential)
        if self.credential_file:  # a file in its own config folder, not a variable
            value = self._text(os.path.join(self.config_home, self.credential_file))
            self.info["credential_file"] = os.path.join(self.config_home, self.credential_file)
        self.info["environment"] = {
            "names": sorted(self.env),
            "credential": self.credential_file or self.credential,
            "credential_present": bool(value),
            "credential_is_own": None if own is None else (value or "").strip() == own.strip(),
        }

    @staticmethod
    def _text(path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read(1 << 20)
        except OSError:
            return None

    def own_config_file(self, path: str) -> bool:
        """Whether `path` is the session's own and no way out (listed in info, not a finding): a
        file in its own config folder, holding its own credential if it is the credential file,
        else no secret-shaped value and no other pool credential."""
        real = os.path.realpath(path)
        if not self.config_home or not real.startswith(self.config_home + os.sep):
            return False
        text = self._text(path) or ""
        if any(other and other in text for other in self.ctx.get("other_credentials", [])):
            return False
        if self.credential_file and real == os.path.join(self.config_home, self.credential_file):
            own = self.ctx.get("own_credential")
            mine = own is not None and text.strip() == own.strip()
        else:
            mine = value_rule(text) is None
        if mine:
            self.info.setdefault("own_config_files", []).append(path)
        return mine

    # --- files ---------------------------------------------------------------------------------
    def homes(self) -> list[str]:
        found = [self.env.get("HOME", ""), self.ctx.get("operator_home", ""), "/root"]
        with contextlib.suppress(OSError):
            found += [os.path.join("/home", name) for name in os.listdir("/home")]
        return [h for h in dict.fromkeys(found) if h]

    def data_dirs(self) -> list[str]:
        found = [self.ctx.get("data_dir", "")]
        cwd = os.getcwd()
        parent = os.path.dirname(cwd)
        grand = os.path.dirname(parent)
        if os.path.basename(parent) == "sessions":
            found.append(grand)  # <data>/sessions/<id>
        if parent.endswith("-sessions"):
            found.append(parent[: -len("-sessions")])  # <data>-sessions/<id>
        for home in self.homes():
            found.append(os.path.join(home, ".local", "share", "dispatchq"))
        return [d for d in dict.fromkeys(found) if d]

    def session_dirs(self) -> list[str]:
        """Folders holding other judgements' session folders (transcripts, config)."""
        found = list(self.ctx.get("sessions_dirs", []))
        parent = os.path.dirname(os.getcwd())
        if os.path.basename(parent) == "sessions" or parent.endswith("-sessions"):
            found.append(parent)
        for data in self.data_dirs():
            found += [os.path.join(data, "sessions"), data.rstrip("/") + "-sessions"]
        return [d for d in dict.fromkeys(found) if d]

    def file_candidates(self) -> list[str]:
        paths = list(self.secret_files) + list(self.ctx.get("files", []))
        for home in self.homes():
            for rel in (
                ".netrc", ".aws/credentials", ".aws/config", ".config/gh/hosts.yml", ".git-credentials",
                ".docker/config.json", ".npmrc", ".pypirc", ".claude/.credentials.json", ".ssh",
                ".config/dispatchq", ".gnupg",
            ):  # fmt: skip
                paths.append(os.path.join(home, rel))
        paths += self.data_dirs()
        paths += ["/etc/dispatchq", self.env.get("XDG_RUNTIME_DIR", ""), self.ctx.get("xdg_runtime_dir", "")]
        with contextlib.suppress(OSError):
            paths += [os.path.join("/run/user", name) for name in os.listdir("/run/user")]
        me = os.path.realpath(os.getcwd())
        for folder in self.session_dirs():
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            paths += [
                os.path.join(folder, n) for n in names if os.path.realpath(os.path.join(folder, n)) != me
            ]
        return [p for p in dict.fromkeys(paths) if p]

    def look_at_files(self) -> None:
        tried = 0
        budget = [400]
        for path in self.file_candidates():
            tried += self._read_tree(path, depth=4, budget=budget)
        self.info["files"] = {"tried": tried}
        host = []
        for path in ("/etc/shadow", "/etc/gshadow"):
            if self._readable(path):
                host.append(path)
        self.info["host_files_readable"] = host  # root-only on a normal host: not counted

    def _readable(self, path: str) -> int | None:
        try:
            with open(path, "rb") as handle:
                data = handle.read(1 << 20)
        except OSError:
            return None
        return len(data)

    def _read_tree(self, path: str, depth: int, budget: list[int]) -> int:
        if budget[0] <= 0:
            return 0
        try:
            info = os.lstat(path)
        except OSError:
            return 0
        if stat.S_ISDIR(info.st_mode):
            if depth <= 0:
                return 0
            try:
                names = sorted(os.listdir(path))
            except OSError as error:
                self.info.setdefault("unlistable", []).append(f"{path}: {error_name(error)}")
                return 0
            return sum(self._read_tree(os.path.join(path, n), depth - 1, budget) for n in names)
        if not stat.S_ISREG(info.st_mode) or path in self.read_paths:
            return 0
        budget[0] -= 1
        self.read_paths.add(path)
        if self.own_config_file(path):
            return 1
        size = self._readable(path)
        if size:
            self.add("files", path=path, size=size)
            if size < 200:
                try:
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        self.passwords.add(handle.read().strip())
                except OSError:
                    pass
        return 1

    # --- stores --------------------------------------------------------------------------------
    def socket_paths(self) -> tuple[list[str], list[str], dict]:
        paths: list[str] = []
        abstract: list[str] = []
        try:
            with open("/proc/net/unix", encoding="utf-8", errors="replace") as handle:
                for line in handle.read().splitlines()[1:]:
                    parts = line.split()
                    if len(parts) >= 8:
                        (abstract if parts[7].startswith("@") else paths).append(parts[7])
        except OSError:
            pass
        for name in SOCKET_NAMES:
            value = self.env.get(name, "")
            if value.startswith("/"):
                paths.append(value.split(":", 1)[0])
        walk = self._walk_for_sockets(paths)
        own = os.path.realpath(os.getcwd())
        paths = [p for p in dict.fromkeys(paths) if not os.path.realpath(p).startswith(own + os.sep)]
        return paths, list(dict.fromkeys(abstract)), walk

    def _walk_for_sockets(self, out: list[str]) -> dict:
        first = ["/tmp", "/run", "/var/run", "/dev/shm", "/var/tmp", *self.data_dirs(), *self.homes()]
        first += [self.env.get("XDG_RUNTIME_DIR", ""), os.path.dirname(os.getcwd())]
        skip = {"/proc", "/sys", "/usr", "/dev/pts", "/boot"}
        heavy = {"node_modules", ".git", ".venv", "site-packages", "__pycache__", ".cache", ".mypy_cache"}
        deadline = time.monotonic() + float(self.ctx.get("walk_seconds", 4))
        seen: set[str] = set()
        stack = [*[d for d in first if d][::-1], "/"]
        visited = 0
        complete = True
        while stack:
            folder = stack.pop()
            if folder in seen or folder in skip:
                continue
            if time.monotonic() > deadline:
                complete = False
                break
            seen.add(folder)
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            visited += 1
            for entry in entries:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if stat.S_ISSOCK(mode):
                    out.append(entry.path)
                elif stat.S_ISDIR(mode) and entry.name not in heavy:
                    stack.append(entry.path)
        return {"folders": visited, "complete": complete}

    def look_at_stores(self) -> None:
        paths, abstract, walk = self.socket_paths()
        targets: list[tuple[str, object, int]] = [("unix", p, socket.AF_UNIX) for p in paths]
        targets += [("abstract", "\0" + name[1:], socket.AF_UNIX) for name in abstract]
        proxies = self.proxy_ports()
        ports = self.open_loopback_ports()
        targets += [("tcp", addr, fam) for addr, fam in ports if addr[1] not in proxies]
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda t: (t, self.talk(t[1], t[2])), targets))
        for (label, address, family), answer in answers:
            if answer is None:
                continue
            shown = address.replace("\0", "@") if isinstance(address, str) else f"{address[0]}:{address[1]}"
            self.add("stores", where=f"{label} {shown}", what=answer["kind"], detail=answer.get("detail", ""))
            if answer["kind"] in ("redis-open", "redis-password-found"):
                self.reached.append((shown, (address, family, answer.get("password"))))
        for port in proxies:
            self.probe_proxy(port)
        self.info["stores"] = {
            "unix_sockets": len(paths),
            "abstract_sockets": len(abstract),
            "loopback_ports_open": sorted({a[1] for a, _ in ports}),
            "proxy_ports": sorted(proxies),
            "walk": walk,
        }

    def proxy_ports(self) -> set[int]:
        ports = set()
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"):
            match = re.match(r"https?://(127\.0\.0\.1|localhost|\[::1\]):(\d+)", self.env.get(name, ""))
            if match:
                ports.add(int(match.group(2)))
        return ports

    def open_loopback_ports(self) -> list[tuple[tuple[str, int], int]]:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
        batch = max(64, min(4096, soft - 200))
        found: list[tuple[tuple[str, int], int]] = []
        # 127.0.0.1 port by port; ::1 from the listening table (a socket bound to `::` answers
        # on 127.0.0.1 too, and a second full scan would double the probe's time).
        for start in range(1, 65536, batch):
            found += self._scan("127.0.0.1", socket.AF_INET, range(start, min(65536, start + batch)))
        found += [item for item in self._listening() if item not in found]
        own = self._own_listening_ports()
        return [item for item in found if item[0][1] not in own]

    @staticmethod
    def _listening() -> list[tuple[tuple[str, int], int]]:
        """Listening TCP sockets of this network namespace (/proc/net/tcp, tcp6), any address."""
        found = []
        for table, host, family in (("tcp", "127.0.0.1", socket.AF_INET), ("tcp6", "::1", socket.AF_INET6)):
            try:
                with open(f"/proc/net/{table}", encoding="ascii") as handle:
                    rows = handle.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                parts = row.split()
                if len(parts) > 3 and parts[3] == "0A":
                    found.append(((host, int(parts[1].rsplit(":", 1)[1], 16)), family))
        return found

    def _own_listening_ports(self) -> set[int]:
        return set()  # the probe listens on nothing

    @staticmethod
    def _scan(host: str, family: int, ports: range) -> list[tuple[tuple[str, int], int]]:
        sel = selectors.DefaultSelector()
        open_ports = []
        try:
            for port in ports:
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setblocking(False)
                code = sock.connect_ex((host, port))
                if code == 0:
                    open_ports.append(((host, port), family))
                    sock.close()
                elif code in (errno.EINPROGRESS, errno.EAGAIN):
                    sel.register(sock, selectors.EVENT_WRITE, port)
                else:
                    sock.close()
            deadline = time.monotonic() + 0.5
            while sel.get_map() and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        open_ports.append(((host, key.data), family))
                    sel.unregister(sock)
                    sock.close()
        finally:
            for key in list(sel.get_map().values()):
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()
        return open_ports

    def talk(self, address: object, family: int) -> dict | None:
        """None when nothing accepts there; else what answered (a Redis PING first)."""
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            return None
        with sock:
            sock.settimeout(0.5)
            try:
                sock.connect(address)  # type: ignore[arg-type]
            except OSError:
                return None
            reply = resp(sock, "PING")
        if reply.startswith("+PONG"):
            return {"kind": "redis-open", "detail": self.redis_look(address, family, None)}
        if "NOAUTH" in reply or "Authentication required" in reply:
            for password in sorted(self.passwords):
                if self.redis_auth(address, family, password):
                    detail = self.redis_look(address, family, password)
                    return {"kind": "redis-password-found", "detail": detail, "password": password}
            return None  # a closed store: the probe reached nothing behind it
        if not reply.strip() or reply.startswith("HTTP/"):
            leak = self.proxy_leaks(address, family)
            if leak is None:
                self.info.setdefault("restricted_proxies", []).append(str(address).replace("\0", "@"))
                return None  # a proxy that refused every forbidden target and serves nothing itself
            if leak:
                return {"kind": "proxy-leak", "detail": leak}
        banner = reply.strip().splitlines()[0][:80] if reply.strip() else "(no reply to PING)"
        return {"kind": "accepts", "detail": banner}

    def forbidden(self) -> list[str]:
        guessed = ["127.0.0.1:6379", "127.0.0.1:8484", "169.254.169.254:80"]
        return list(dict.fromkeys([*self.ctx.get("forbidden", []), *guessed]))

    def proxy_leaks(self, address: object, family: int) -> str | None:
        """For a socket that speaks HTTP or waits for a request: '' when it serves something
        itself (a finding as such), None when it relays none of the forbidden targets and
        serves nothing (a restricted proxy: the sandbox's, or the CLI's own), else what leaked."""
        for target in self.forbidden():
            leaked = through_proxy(address, family, target)
            if leaked:
                return f"{target}: {leaked}"
        # A proxy that relayed nothing is the expected door only if it serves nothing itself:
        # `dispatchq serve` (or any local web service) answers its own pages with 2xx/3xx.
        # A socket that never speaks HTTP (a silent service) is no proxy: it is a door.
        codes = [http_status(address, family, f"CONNECT {self.forbidden()[0]} HTTP/1.1\r\n\r\n")]
        for path in ("/", "/healthz"):
            request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            codes.append(http_status(address, family, request))
        if any(code is not None and 200 <= code < 400 for code in codes[1:]):
            return ""
        return None if any(code is not None for code in codes) else ""

    @staticmethod
    def redis_auth(address: object, family: int, password: str) -> bool:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(address)  # type: ignore[arg-type]
                return resp(sock, "AUTH", password).startswith("+OK")
        except OSError:
            return False

    @staticmethod
    def redis_look(address: object, family: int, password: str | None) -> str:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                sock.connect(address)  # type: ignore[arg-type]
                if password is not None:
                    resp(sock, "AUTH", password)
                size = resp(sock, "DBSIZE").strip()
                keys = resp(sock, "KEYS", "*", limit=1 << 20)
                version = re.search(r"redis_version:(\S+)", resp(sock, "INFO", "server"))
        except OSError as error:
            return f"reached, then {error_name(error)}"
        named = len(re.findall(r"^\$\d+\r$", keys, re.M))
        return f"DBSIZE {size}, KEYS * listed {named}, version {version.group(1) if version else '?'}"

    def probe_proxy(self, port: int) -> None:
        """The proxy in its own HTTPS_PROXY is the one expected door: a finding if it leaks."""
        results = {}
        for target in self.forbidden():
            results[target] = through_proxy(("127.0.0.1", port), socket.AF_INET, target)
            if results[target]:
                self.add(
                    "stores",
                    where=f"proxy 127.0.0.1:{port} -> {target}",
                    what="proxy-leak",
                    detail=results[target],
                )
        self.info.setdefault("proxy", {})[str(port)] = {t: bool(r) for t, r in results.items()}

    # --- writes and jobs -----------------------------------------------------------------------
    def look_at_writes(self) -> None:
        folders = list(self.data_dirs()) + list(self.ctx.get("write_targets", []))
        me = os.path.realpath(os.getcwd())
        for folder in self.session_dirs():
            folders.append(folder)
            with contextlib.suppress(OSError):
                folders += [os.path.join(folder, n) for n in os.listdir(folder)]
        tried = []
        for folder in dict.fromkeys(folders):
            if not os.path.isdir(folder) or os.path.realpath(folder) == me:
                continue
            tried.append(folder)
            canary = os.path.join(folder, f".look-around-canary-{os.getpid()}")
            try:
                fd = os.open(canary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except OSError:
                continue
            os.close(fd)
            if self.ctx.get("keep_canaries"):
                self.add("writes", path=folder, canary=canary)  # the test looks for it on the host
            else:
                os.unlink(canary)
                self.add("writes", path=folder)
        self.info["writes"] = {"tried": len(tried)}

    def look_at_jobs(self) -> None:
        named = set(self.ctx.get("job_targets", []))
        for shown, (address, family, password) in self.reached:
            if not any(t in shown for t in named):
                continue
            try:
                with socket.socket(family, socket.SOCK_STREAM) as sock:
                    sock.settimeout(1.0)
                    sock.connect(address)
                    if password is not None:
                        resp(sock, "AUTH", password)
                    queues = re.findall(r"rq:queue:([^\r\n]+)", resp(sock, "KEYS", "rq:queue:*"))
                    for queue in sorted(set(queues) | {"dispatchq-code"}):
                        for how in ("pickle", "json"):
                            if self.push_job(sock, queue, how):
                                self.add("jobs", store=shown, queue=queue, serializer=how)
            except OSError as error:
                self.info.setdefault("jobs_errors", []).append(f"{shown}: {error_name(error)}")

    def push_job(self, sock: socket.socket, queue: str, how: str) -> bool:
        command = self.ctx.get("job_command", "true")
        call = ("os.system", None, (command,), {})
        data = pickle.dumps(call) if how == "pickle" else json.dumps(list(call)).encode()
        jid = str(uuid.uuid4())
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        fields = {
            "data": zlib.compress(data), "created_at": now, "enqueued_at": now, "origin": queue,
            "description": "look-around", "status": "queued", "timeout": "60",
        }  # fmt: skip
        args: list[object] = ["HSET", f"rq:job:{jid}"]
        for key, value in fields.items():
            args += [key, value]
        pushed = resp(sock, *args).startswith(":") and resp(
            sock, "RPUSH", f"rq:queue:{queue}", jid
        ).startswith(":")
        return pushed

    # --- the whole look ------------------------------------------------------------------------
    def run(self) -> dict:
        for step in (
            self.look_at_processes,
            self.look_at_environment,
            self.look_at_files,
            self.look_at_stores,
            self.look_at_writes,
            self.look_at_jobs,
        ):
            try:
                step()
            except Exception as error:  # a broken step is reported, never hidden
                self.info.setdefault("errors", []).append(f"{step.__name__}: {error!r}")
        counts = {kind: len(items) for kind, items in self.findings.items()}
        return {
            "probe": "look_around",
            "uid": os.getuid(),
            "cwd": os.getcwd(),
            "seconds": round(time.monotonic() - self.started, 2),
            "counts": counts,
            "total": sum(counts.values()),
            "findings": {kind: items[:MAX_LISTED] for kind, items in self.findings.items()},
            "info": self.info,
        }


def through_proxy(address: object, family: int, target: str) -> str:
    """What came back from `target` through the proxy at `address` ('' when refused)."""
    banner = "LOOKAROUND-LISTENER"
    for request in (
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n",
        f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n",
    ):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                sock.connect(address)  # type: ignore[arg-type]
                sock.sendall(request.encode())
                head = recv_some(sock, 4096)
                if request.startswith("CONNECT") and re.match(r"HTTP/1\.[01] 200", head):
                    sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                    tail = recv_some(sock, 4096)
                    return f"CONNECT 200, then {(head + tail)[-60:]!r}"
                if banner in head or "+PONG" in head or "NOAUTH" in head:
                    return f"GET reached it: {head[:60]!r}"
        except OSError:
            continue
    return ""


def http_status(address: object, family: int, request: str) -> int | None:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(address)  # type: ignore[arg-type]
            sock.sendall(request.encode())
            head = recv_some(sock, 4096)
    except OSError:
        return None
    match = re.match(r"HTTP/1\.[01] (\d{3})", head)
    return int(match.group(1)) if match else None


def resp(sock: socket.socket, *args: object, limit: int = 65536) -> str:
    """Send one RESP command, read what comes back within the timeout (text)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    try:
        sock.sendall(b"".join(parts))
    except OSError:
        return ""
    return recv_some(sock, limit)


def recv_some(sock: socket.socket, limit: int) -> str:
    """Read until the peer pauses (a short timeout) or closes, up to `limit` bytes."""
    chunks = []
    size = 0
    try:
        while size < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            sock.settimeout(0.15)
    except OSError:
        pass
    return b"".join(chunks).decode("utf-8", "replace")


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def emit_codex(text: str, argv: list[str]) -> None:
    """The report as `codex exec --json` prints an answer (what the `codex` backend reads)."""
    thread = argv[argv.index("resume") + 1] if "resume" in argv[:-1] else str(uuid.uuid4())
    emit({"type": "thread.started", "thread_id": thread})
    emit({"type": "turn.started"})
    emit({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": text}})
    usage = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}
    emit({"type": "turn.completed", "usage": usage})


def main() -> int:
    prompt = "" if sys.stdin.isatty() else sys.stdin.read()
    argv = sys.argv[1:]
    context = context_from(prompt)
    if "--context-file" in argv:
        with open(argv[argv.index("--context-file") + 1], encoding="utf-8") as handle:
            context = json.load(handle)
    codex = "exec" in argv and ("--json" in argv or "--experimental-json" in argv)
    if codex:
        context.setdefault("config_var", "CODEX_HOME")
    report = Probe(context).run()
    report["run_as"] = "codex" if codex else "claude"
    if "--plain" in argv:  # a Bash tool call: the report alone
        print(json.dumps(report))
        return 0
    if codex:
        emit_codex(json.dumps(report), argv)
        return 0
    session = argv[argv.index("--resume") + 1] if "--resume" in argv else str(uuid.uuid4())
    emit({"type": "system", "subtype": "init", "session_id": session, "cwd": os.getcwd(), "tools": []})
    text = json.dumps(report)
    emit({
        "type": "assistant", "session_id": session,
        "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
    })  # fmt: skip
    emit({
        "type": "result", "subtype": "success", "is_error": False, "result": text, "session_id": session,
        "num_turns": 1, "total_cost_usd": 0, "stop_reason": "end_turn", "usage": {},
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
