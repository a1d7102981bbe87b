"""A loopback fake of the TypeSafe API, for driving the real `typesafe-sdk` in tests.

A test double, shipped in the package so that the tests, bench/ and anyone testing their own
kinds drive the same one: it answers from a script, binds 127.0.0.1 only, and never reaches
the real service, so it spends no quota and needs no key.

Why a real HTTP server rather than a mocked client: the typed tier's behaviour under
trouble (retry-after honoured, retries bounded, errors classified, unknown answer types
dropped, request bodies zstd-compressed) lives inside the SDK. Only a server that speaks
the wire format exercises all of it, and only one that records what it saw lets a test
count requests (batching, cache hits, keyless runs).

In-process use (the `typesafe_api` pytest fixture yields one of these)::

    api.answer("actionable", noul(0.93))                 # by question id (namespace ignored)
    api.answer("Which label fits?", choice("bug", 0.9))  # or by instructions text
    api.add_rule(Rule(choice("docs", 0.7), question="label", state_contains="README"))
    api.responder = lambda qid, question, state: ...     # or any function; None falls through
    api.fail(429, headers={"retry-after-ms": "10"}, times=2)   # scripted failures, FIFO
    api.slow(2.0)                                         # next request answers after 2 s
    api.unknown_type("location")                          # answer {"type": "box2", ...}
    api.request_count                                     # /v1/systemone requests seen
    api.systemone_requests[-1].body["questions"]          # decoded bodies, headers, encoding

As a separate process (for tests where real worker processes make the requests)::

    python -m dispatchq.testing.typesafe --port 0 --script script.json [--api-key K]

prints ``listening on http://127.0.0.1:PORT`` once ready. The script file is JSON::

    {"api_key": "test-key", "model": "jev-2026-09-15",
     "answers": {"actionable": {"type": "noul", "noul": 0.93}},
     "rules": [{"question": "label", "state_contains": "README",
                "answer": {"type": "choice", "choice": "docs", "confidence": 0.7}}],
     "failures": [{"status": 429, "headers": {"retry-after-ms": "10"}, "times": 2},
                  {"delay": 2.0}],
     "unknown_types": ["location"], "latency": 0.2}

Control endpoints (no auth; loopback only): ``GET /_fake/requests`` (recorded requests),
``POST /_fake/script`` (append a script, same JSON), ``POST /_fake/reset``.
`FakeTypeSafeProcess` wraps all of that for a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import math
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from typesafe_sdk._schemas.models import SystemOneRequest

__all__ = [
    "CONTROL_PREFIX",
    "DEFAULT_API_KEY",
    "DEFAULT_RESOLVED_MODEL",
    "MODELS_PATH",
    "SYSTEM_ONE_PATH",
    "Failure",
    "FakeTypeSafeAPI",
    "FakeTypeSafeProcess",
    "RecordedRequest",
    "Responder",
    "Rule",
    "WireAnswer",
    "choice",
    "default_answer",
    "error_body",
    "main",
    "noul",
    "score",
    "unknown_answer",
]

DEFAULT_API_KEY = "test-key"
DEFAULT_RESOLVED_MODEL = "jev-2026-09-15"
SYSTEM_ONE_PATH = "/v1/systemone"
MODELS_PATH = "/v1/models"
CONTROL_PREFIX = "/_fake/"

WireAnswer = dict[str, Any]
Responder = Callable[[str, dict[str, Any], Any], WireAnswer | None]


# --- zstd: the SDK compresses bodies >= 1 KiB when a zstd module is importable -------------
def _load_zstd() -> Callable[[bytes], bytes] | None:
    """Find a zstd decompressor; the SDK's own choice (backports.zstd) first.

    By name, because which of them is installed differs by Python version and extra.
    """
    for module, name in (("backports.zstd", "decompress"), ("compression.zstd", "decompress")):
        with contextlib.suppress(ImportError):
            found: Callable[[bytes], bytes] = getattr(importlib.import_module(module), name)
            return found
    with contextlib.suppress(ImportError):
        zstandard = importlib.import_module("zstandard")
        return lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return None


ZSTD_DECOMPRESS = _load_zstd()


# --- wire answer builders ------------------------------------------------------------------
def noul(p: float) -> WireAnswer:
    """A noul answer: only the probability of yes, as the API sends it."""
    return {"type": "noul", "noul": p}


def choice(label: str, confidence: float, probabilities: Mapping[str, float] | None = None) -> WireAnswer:
    """A choice answer; omitted probabilities are filled from the question's criteria."""
    wire: WireAnswer = {"type": "choice", "choice": label, "confidence": confidence}
    if probabilities is not None:
        wire["probabilities"] = dict(probabilities)
    return wire


def score(
    level: float,
    confidence: float,
    *,
    legend: Mapping[str, Any] | None = None,
    probabilities: Mapping[str, float] | None = None,
) -> WireAnswer:
    """A score answer (fractional level); omitted legend/probabilities come from the question."""
    wire: WireAnswer = {"type": "score", "score": level, "confidence": confidence}
    if legend is not None:
        wire["legend"] = dict(legend)
    if probabilities is not None:
        wire["probabilities"] = dict(probabilities)
    return wire


def unknown_answer(type_name: str = "box2") -> WireAnswer:
    """An answer of a type no SDK version knows, which the SDK drops from the response."""
    return {"type": type_name, type_name: {"x": 0.5, "y": 0.5}, "confidence": 0.99}


def _complete(answer: WireAnswer, question: Mapping[str, Any]) -> WireAnswer:
    """Fill the parts of a scripted answer that follow from the question, as the API would."""
    wire = dict(answer)
    criteria = question.get("criteria")
    if wire.get("type") == "choice" and "probabilities" not in wire:
        labels = list(criteria) if isinstance(criteria, Mapping) else [wire.get("choice")]
        chosen, conf = wire.get("choice"), float(wire.get("confidence", 0.0))
        others = [label for label in labels if label != chosen]
        rest = (1.0 - conf) / len(others) if others else 0.0
        wire["probabilities"] = {str(label): (conf if label == chosen else rest) for label in labels}
    if wire.get("type") == "score":
        levels = list(criteria) if isinstance(criteria, list) else []
        if "legend" not in wire:
            wire["legend"] = {str(i): text for i, text in enumerate(levels)}
        if "probabilities" not in wire:
            level = float(wire.get("score", 0.0))
            lo, hi = math.floor(level), math.ceil(level)
            probs = {str(i): 0.0 for i in range(len(levels))}
            probs[str(lo)] = probs.get(str(lo), 0.0) + (1.0 - (level - lo) if hi != lo else 1.0)
            if hi != lo:
                probs[str(hi)] = probs.get(str(hi), 0.0) + (level - lo)
            wire["probabilities"] = probs
    return wire


def default_answer(question: Mapping[str, Any]) -> WireAnswer:
    """A confident, well-formed answer of the question's own type, for unscripted questions."""
    kind = question.get("type")
    criteria = question.get("criteria")
    if kind == "choice" and isinstance(criteria, Mapping) and criteria:
        return _complete(choice(str(next(iter(criteria))), 0.9), question)
    if kind == "score" and isinstance(criteria, list) and criteria:
        return _complete(score(0.0, 0.9), question)
    return noul(0.9)


def _base_id(question_id: str) -> str:
    """The judgement's own question id inside a namespaced one (`j3__label` -> `label`)."""
    return question_id.rsplit("__", 1)[-1]


# --- scripting -----------------------------------------------------------------------------
@dataclass
class Rule:
    """Answer questions matching every given condition with `answer`.

    `question` matches the exact wire id or the id after the batch namespace; `instructions`
    matches the question's instructions exactly; `state_contains` is a substring of the
    canonical JSON of the state. `times=None` applies forever.
    """

    answer: WireAnswer
    question: str | None = None
    instructions: str | None = None
    state_contains: str | None = None
    times: int | None = None

    def matches(self, question_id: str, question: Mapping[str, Any], state_text: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.question is not None and self.question not in (question_id, _base_id(question_id)):
            return False
        if self.instructions is not None and question.get("instructions") != self.instructions:
            return False
        return self.state_contains is None or self.state_contains in state_text

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rule:
        return cls(
            answer=dict(data["answer"]),
            question=data.get("question"),
            instructions=data.get("instructions"),
            state_contains=data.get("state_contains"),
            times=data.get("times"),
        )


@dataclass
class Failure:
    """One scripted response that replaces a normal answer (consumed by one request).

    `status` 200 with a `body` sends that body as a "successful" response (for malformed
    responses); `delay` alone answers normally but late (for client timeouts);
    `echo_authorization` puts the received Authorization header into the error body, to
    prove the client redacts a key a server might reflect.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    echo_authorization: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        return cls(
            status=int(data.get("status", 200)),
            body=data.get("body"),
            headers={str(k): str(v) for k, v in dict(data.get("headers", {})).items()},
            delay=float(data.get("delay", 0.0)),
            echo_authorization=bool(data.get("echo_authorization", False)),
        )


def error_body(status: int, message: str | None = None) -> Any:
    """The API's error format: FastAPI-style `detail`, a list of validation errors for 422."""
    if status == HTTPStatus.UNPROCESSABLE_ENTITY:
        return {
            "detail": [
                {"loc": ["body", "questions"], "msg": message or "Field required", "type": "missing"},
            ]
        }
    default = {
        400: "Bad request",
        401: "Invalid API key",
        403: "Forbidden",
        404: "Not found",
        429: "Rate limit exceeded",
        500: "Internal server error",
        502: "Bad gateway",
        503: "Service unavailable",
    }.get(status)
    if default is None:
        try:
            default = HTTPStatus(status).phrase
        except ValueError:
            default = "error"
    return {"detail": message or default}


@dataclass(frozen=True)
class RecordedRequest:
    """What the fake saw: enough to assert on counts, batching, auth and compression."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw_size: int
    content_encoding: str | None
    status: int | None
    """The status answered; None while a (slow) response is still being prepared."""
    received: float = 0.0
    """When it arrived (time.time()), for benchmarks."""

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "raw_size": self.raw_size,
            "content_encoding": self.content_encoding,
            "status": self.status,
            "received": self.received,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordedRequest:
        return cls(
            data["method"],
            data["path"],
            dict(data["headers"]),
            data["body"],
            int(data["raw_size"]),
            data.get("content_encoding"),
            data.get("status"),
            float(data.get("received", 0.0)),
        )

    @property
    def question_ids(self) -> list[str]:
        body = self.body if isinstance(self.body, dict) else {}
        questions = body.get("questions")
        return list(questions) if isinstance(questions, dict) else []


# --- the server ----------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Idle keep-alive connections park a handler thread in readline; never join those.
    block_on_close = False
    fake: FakeTypeSafeAPI

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (timeout tests) closes its socket; that is not news."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30  # an idle keep-alive connection's thread ends eventually

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: pytest shows what the test asserts, not an access log."""

    def do_GET(self) -> None:
        self.server.fake._handle(self, "GET")

    def do_POST(self) -> None:
        self.server.fake._handle(self, "POST")

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(raw)


class FakeTypeSafeAPI:
    """A scriptable TypeSafe API on 127.0.0.1, answering in a background thread."""

    def __init__(
        self,
        *,
        api_key: str = DEFAULT_API_KEY,
        model: str = DEFAULT_RESOLVED_MODEL,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.api_key = api_key
        self.model = model
        self.responder: Responder | None = None
        self.latency = 0.0
        """Seconds every /v1/systemone answer waits before it is sent (benchmarks: a real API's RTT)."""
        self._host, self._port = host, port
        self._rules: list[Rule] = []
        self._failures: deque[Failure] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeTypeSafeAPI:
        server = _Server((self._host, self._port), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-typesafe-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes slow responses so they end now
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeTypeSafeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake TypeSafe API is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give the SDK (`base_url=` or TYPESAFE_BASE_URL)."""
        return f"http://{self._host}:{self.port}"

    # scripting ------------------------------------------------------------------------------
    def add_rule(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def answer(self, key: str, wire: WireAnswer, *, times: int | None = None) -> None:
        """Answer the question whose id (namespace ignored) or instructions equal `key`."""
        with self._lock:
            self._rules.append(Rule(wire, question=key, times=times))
            self._rules.append(Rule(wire, instructions=key, times=times))

    def unknown_type(self, key: str, type_name: str = "box2") -> None:
        """Answer `key` with a type the SDK does not model (it drops it from the response)."""
        self.answer(key, unknown_answer(type_name))

    def fail(
        self,
        status: int,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        times: int = 1,
        echo_authorization: bool = False,
    ) -> None:
        """Queue `times` responses with `status`; body defaults to the API's error format."""
        failure = Failure(
            status=status,
            body=error_body(status) if body is None else body,
            headers=dict(headers or {}),
            echo_authorization=echo_authorization,
        )
        with self._lock:
            self._failures.extend(failure for _ in range(times))

    def rate_limit(
        self, *, retry_after_ms: int | None = 10, retry_after: str | None = None, times: int = 1
    ) -> None:
        """Queue 429s advising a delay (milliseconds keep tests fast)."""
        headers: dict[str, str] = {}
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(retry_after_ms)
        if retry_after is not None:
            headers["retry-after"] = retry_after
        self.fail(429, headers=headers, times=times)

    def slow(self, seconds: float, *, times: int = 1) -> None:
        """Queue responses that answer normally, but only after `seconds` (client timeouts)."""
        with self._lock:
            self._failures.extend(Failure(delay=seconds) for _ in range(times))

    def queue(self, failure: Failure) -> None:
        with self._lock:
            self._failures.append(failure)

    def load_script(self, script: Mapping[str, Any]) -> None:
        """Apply a JSON script (the process mode's file format, see the module docstring)."""
        if "api_key" in script:
            self.api_key = str(script["api_key"])
        if "model" in script:
            self.model = str(script["model"])
        if "latency" in script:
            self.latency = float(script["latency"])
        for key, wire in dict(script.get("answers", {})).items():
            self.answer(key, dict(wire))
        for rule in script.get("rules", []):
            self.add_rule(Rule.from_json(rule))
        for key in script.get("unknown_types", []):
            self.unknown_type(str(key))
        for item in script.get("failures", []):
            failure = Failure.from_json(item)
            if failure.status != 200 and failure.body is None:
                failure.body = error_body(failure.status)
            with self._lock:
                self._failures.extend(failure for _ in range(int(item.get("times", 1))))

    def reset(self) -> None:
        """Forget rules, queued failures and recorded requests."""
        with self._lock:
            self._rules.clear()
            self._failures.clear()
            self._requests.clear()
        self.responder = None

    # what was seen --------------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def systemone_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == SYSTEM_ONE_PATH]

    @property
    def request_count(self) -> int:
        """`/v1/systemone` requests received, including the SDK's own retries."""
        return len(self.systemone_requests)

    @property
    def pending_failures(self) -> int:
        with self._lock:
            return len(self._failures)

    # serving --------------------------------------------------------------------------------
    def _handle(self, handler: _Handler, method: str) -> None:
        path = handler.path.split("?", 1)[0]
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        if path.startswith(CONTROL_PREFIX):
            self._control(handler, method, path, raw)
            return
        encoding = handler.headers.get("Content-Encoding")
        headers = {name: value for name, value in handler.headers.items()}
        response: tuple[int, Any, dict[str, str]] | None
        try:
            content = self._decompress(encoding, raw)
            decoded = json.loads(content) if content else None
        except _BadBody as bad:
            decoded, response = None, (bad.status, error_body(bad.status, str(bad)), {})
        except ValueError:
            decoded, response = None, (400, error_body(400, "body is not JSON"), {})
        else:
            response = None
        # Recorded on arrival, so a request still being answered slowly is already counted.
        with self._lock:
            index = len(self._requests)
            self._requests.append(
                RecordedRequest(method, path, headers, decoded, len(raw), encoding, None, time.time())
            )
        if response is None:
            response = self._respond(method, path, handler.headers.get("Authorization"), decoded)
        status, body, extra = response
        with self._lock:
            self._requests[index] = dataclasses.replace(self._requests[index], status=status)
        if self._stopping.is_set():
            return
        with contextlib.suppress(ConnectionError):
            handler.send_json(status, body, extra)

    def _respond(
        self, method: str, path: str, authorization: str | None, decoded: Any
    ) -> tuple[int, Any, dict[str, str]]:
        if (method, path) not in {("POST", SYSTEM_ONE_PATH), ("GET", MODELS_PATH)}:
            return 404, error_body(404), {}
        with self._lock:
            failure = self._failures.popleft() if self._failures else None
        if failure is not None and failure.delay:
            self._stopping.wait(failure.delay)
        if self.latency and path == SYSTEM_ONE_PATH:
            self._stopping.wait(self.latency)
        if authorization != f"Bearer {self.api_key}":
            return 401, error_body(401), {}
        if failure is not None and failure.status != 200:
            body = failure.body
            if failure.echo_authorization:
                body = {"detail": f"rejected credentials: {authorization}"}
            return failure.status, body, failure.headers
        if failure is not None and failure.body is not None:
            return 200, failure.body, failure.headers
        if path == MODELS_PATH:
            return (
                200,
                {"models": [{"name": "jev-latest", "description": "fake", "release_date": "2026-09-15"}]},
                {},
            )
        try:
            SystemOneRequest.model_validate(decoded)
        except ValidationError as invalid:
            detail = [
                {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
                for e in invalid.errors(include_url=False, include_context=False, include_input=False)
            ]
            return 422, {"detail": detail}, {}
        return 200, self._answer_all(decoded), {"x-typesafe-request-id": f"fake-{time.monotonic_ns()}"}

    def _decompress(self, encoding: str | None, raw: bytes) -> bytes:
        if not encoding or encoding == "identity":
            return raw
        if encoding != "zstd":
            raise _BadBody(415, f"unsupported Content-Encoding {encoding!r}")
        if ZSTD_DECOMPRESS is None:
            raise _BadBody(415, "zstd body but no zstd module here; create clients with compression=False")
        try:
            return ZSTD_DECOMPRESS(raw)
        except Exception as error:
            raise _BadBody(400, f"undecodable zstd body: {error}") from None

    def _answer_all(self, body: dict[str, Any]) -> dict[str, Any]:
        state = body["state"]
        state_text = json.dumps(state, sort_keys=True)
        answers = {
            qid: self._answer_one(qid, question, state, state_text)
            for qid, question in body["questions"].items()
        }
        return {
            "model": self.model,
            "answers": answers,
            "usage": {"input_tokens": max(1, len(state_text) // 4), "output_tokens": len(answers)},
        }

    def _answer_one(self, qid: str, question: dict[str, Any], state: Any, state_text: str) -> WireAnswer:
        if self.responder is not None:
            wire = self.responder(qid, question, state)
            if wire is not None:
                return _complete(wire, question)
        with self._lock:
            for rule in reversed(self._rules):  # the latest rule overrides earlier ones
                if rule.matches(qid, question, state_text):
                    if rule.times is not None:
                        rule.times -= 1
                    return _complete(rule.answer, question)
        return default_answer(question)

    def _control(self, handler: _Handler, method: str, path: str, raw: bytes) -> None:
        name = path[len(CONTROL_PREFIX) :]
        if method == "GET" and name == "requests":
            handler.send_json(200, [r.to_json() for r in self.requests])
        elif method == "POST" and name == "script":
            self.load_script(json.loads(raw or b"{}"))
            handler.send_json(200, {"ok": True})
        elif method == "POST" and name == "reset":
            self.reset()
            handler.send_json(200, {"ok": True})
        else:
            handler.send_json(404, error_body(404))


class _BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- the fake as a separate process --------------------------------------------------------
class FakeTypeSafeProcess:
    """The fake in its own process, scripted by a file and inspected over its control endpoints.

    Workers that run as real processes inherit TYPESAFE_BASE_URL=`url` and make their
    requests there; the test asks this object what the server saw.
    """

    def __init__(
        self, script: Mapping[str, Any] | None = None, *, workdir: Path, api_key: str = DEFAULT_API_KEY
    ):
        self._script_path = workdir / "typesafe-script.json"
        self._script_path.write_text(json.dumps({"api_key": api_key, **dict(script or {})}))
        self._proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout: float = 15.0) -> FakeTypeSafeProcess:
        # Started beside the package this module came from, so `-m` runs this very copy.
        root = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dispatchq.testing.typesafe",
                "--port",
                "0",
                "--script",
                str(self._script_path),
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line.startswith("listening on "):
            line = self._proc.stdout.readline()
            if not line and self._proc.poll() is not None:
                raise RuntimeError("fake TypeSafe API process exited before listening")
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError("fake TypeSafe API process did not start in time")
        self.url = line.split()[-1]
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> FakeTypeSafeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, method: str, name: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        # The http://127.0.0.1 address this object read from its own process: no other scheme.
        url = f"{self.url}{CONTROL_PREFIX}{name}"
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return json.loads(response.read())

    @property
    def requests(self) -> list[RecordedRequest]:
        return [RecordedRequest.from_json(r) for r in self._call("GET", "requests")]

    @property
    def request_count(self) -> int:
        return sum(1 for r in self.requests if r.path == SYSTEM_ONE_PATH)

    def script(self, script: Mapping[str, Any]) -> None:
        self._call("POST", "script", dict(script))

    def reset(self) -> None:
        self._call("POST", "reset", {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Loopback fake of the TypeSafe API (tests only).")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--script", type=Path, help="JSON script: answers, rules, failures, unknown_types")
    parser.add_argument("--api-key", default=None, help=f"expected bearer key (default {DEFAULT_API_KEY!r})")
    args = parser.parse_args(argv)
    fake = FakeTypeSafeAPI(host=args.host, port=args.port)
    if args.script is not None:
        fake.load_script(json.loads(args.script.read_text()))
    if args.api_key is not None:
        fake.api_key = args.api_key
    fake.start()
    print(f"listening on {fake.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
