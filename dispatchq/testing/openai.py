"""A loopback stand-in for the OpenAI API and ChatGPT's backend, for driving the real Codex CLI.

A test double, like `dispatchq.testing.anthropic`: pointed at it (`openai_base_url` and
`chatgpt_base_url` in the session's `config.toml`, which dispatchq writes from
`OPENAI_BASE_URL` / `CHATGPT_BASE_URL`), the real `codex exec --json` runs and never spends a
usage window (no request leaves 127.0.0.1). What Codex then prints is its own reading of what
this server answered, so a test asserts how dispatchq reads the real thing.

What it answers (each form as the real 0.169.0 and 0.171.0 were seen to take it, docs/codex-cli.md):

- the WebSocket handshake Codex opens first (`GET …/responses` with `Upgrade: websocket`):
  `426 Upgrade Required`, which sends Codex to HTTPS at once (a 404 would cost five reconnects,
  about 10 s, per run);
- `POST …/responses` (any prefix; `/v1/responses` for an API key and a plan login alike when
  `openai_base_url` names this server: without it a plan login sends its model requests to
  chatgpt.com's own host, not to `chatgpt_base_url`, and its turn fails with "workspace routing
  discovery failed"; a plan's request body is zstd-compressed, read back for `Seen.body`):
  a streamed answer (`response.created`, the assistant message as an output
  item, `response.completed` with `usage`), or while the account is closed the service's 429
  `{"error": {"type": "usage_limit_reached", "plan_type", "resets_at", "resets_in_seconds"}}`
  with the `x-codex-primary-*` / `x-codex-secondary-*` headers;
- `GET …/wham/usage` (what `codex app-server`'s `account/rateLimits/read` reads for a ChatGPT
  login): the primary (5-hour) and secondary (weekly) windows, `used_percent`,
  `limit_window_seconds`, `reset_at`: full until the reset instant, open after it;
- anything else: 404 (Codex carries on past its start-up calls' 404s); `unknown_paths` lists them.

A *reset* is the instant `close_until` names: from then on the responses are answered again and
the usage reading says the window is open. `chatgpt_auth` writes a ChatGPT login (`auth.json`
with JWT-shaped tokens, signed by nobody) that the CLI takes as a plan login and this server
accepts.

    with FakeOpenAIAPI() as api:
        api.answer("yes")                              # every responses request: a streamed "yes"
        api.answer("yes", delay=2.0)                   # ... sent 2 s after the request came
        api.close_until(resets, plan_type="plus")      # refused with the 429 until `resets`
        env["OPENAI_BASE_URL"], env["CHATGPT_BASE_URL"] = api.url + "/v1", api.chatgpt_url
        api.response_requests                          # the POSTs seen, `credential` on each
        api.answered_at                                # when each answer had been sent
        api.refused                                    # the requests answered with the 429
        api.paths()                                    # every request, "METHOD /path"
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import threading
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dispatchq.testing.loopback import LoopbackServer, QuietHandler, SeenRequest

__all__ = ["FakeOpenAIAPI", "Seen", "chatgpt_auth", "limit_body", "window_headers"]

#: The plan windows' lengths, as the service states them (`limit_window_seconds`).
PRIMARY_SECONDS = 5 * 3600
SECONDARY_SECONDS = 7 * 86400
#: The account a `chatgpt_auth` login names (Codex sends it as `ChatGPT-Account-Id`).
ACCOUNT_ID = "acct-stand-in"


def _b64(data: Mapping[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(dict(data)).encode()).rstrip(b"=").decode()


def chatgpt_auth(*, account_id: str = ACCOUNT_ID, plan_type: str = "plus", now: float | None = None) -> str:
    """A ChatGPT login as `codex login` writes it (`auth.json`), for the stand-in only.

    The tokens are JWT-shaped (Codex reads the plan and the account from the id token's claims)
    and unsigned; they expire in 30 days and were refreshed just now, so the CLI does not try to
    renew them at auth.openai.com during a test.
    """
    issued = int(time.time() if now is None else now)
    claims = {
        "email": "stand-in@example.invalid",
        "iat": issued,
        "exp": issued + 30 * 86400,
        "https://api.openai.com/auth": {
            "chatgpt_plan_type": plan_type,
            "chatgpt_account_id": account_id,
            "chatgpt_user_id": "user-stand-in",
        },
    }
    token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.stand-in"
    refreshed = datetime.fromtimestamp(issued, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    login = {
        "OPENAI_API_KEY": None,
        "tokens": {
            "id_token": token,
            "access_token": token,
            "refresh_token": "rt-stand-in",
            "account_id": account_id,
        },
        "last_refresh": refreshed,
    }
    return json.dumps(login)


def window_headers(primary: tuple[int, int], secondary: tuple[int, int]) -> dict[str, str]:
    """The `x-codex-*` headers: each window's (used percent, reset instant in epoch seconds)."""
    headers: dict[str, str] = {}
    for slot, (used, resets), minutes in (
        ("primary", primary, PRIMARY_SECONDS // 60),
        ("secondary", secondary, SECONDARY_SECONDS // 60),
    ):
        headers[f"x-codex-{slot}-used-percent"] = str(used)
        headers[f"x-codex-{slot}-window-minutes"] = str(minutes)
        headers[f"x-codex-{slot}-reset-at"] = str(int(resets))
    return headers


def limit_body(resets_at: int, *, now: float, plan_type: str = "plus") -> dict[str, Any]:
    """The service's 429 body for a closed usage window."""
    return {
        "error": {
            "type": "usage_limit_reached",
            "message": "The usage limit has been reached",
            "plan_type": plan_type,
            "resets_at": int(resets_at),
            "resets_in_seconds": max(0, int(resets_at - now)),
        }
    }


@dataclass(frozen=True)
class Seen(SeenRequest):
    """One request the server received."""

    @property
    def credential(self) -> str | None:
        """The bearer token it was sent with (an API key, or a plan login's access token)."""
        return self.bearer

    @property
    def websocket(self) -> bool:
        return self.headers.get("upgrade", "").lower() == "websocket"


def _sse(kind: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def answer_stream(text: str) -> bytes:
    """A Responses API stream of one assistant message carrying `text`, with its usage."""
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    message = {
        "type": "message",
        "id": message_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    usage = {
        "input_tokens": 2100,
        "input_tokens_details": {"cached_tokens": 1800},
        "output_tokens": 40,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2140,
    }
    started = {**message, "status": "in_progress", "content": []}
    delta = {"item_id": message_id, "output_index": 0, "content_index": 0, "delta": text}
    return b"".join(
        [
            _sse("response.created", {"response": {"id": response_id}}),
            _sse("response.output_item.added", {"output_index": 0, "item": started}),
            _sse("response.output_text.delta", delta),
            _sse("response.output_item.done", {"output_index": 0, "item": message}),
            _sse(
                "response.completed", {"response": {"id": response_id, "usage": usage, "output": [message]}}
            ),
        ]
    )


class FakeOpenAIAPI(LoopbackServer):
    """The server; a context manager that starts it on a free loopback port."""

    def __init__(self) -> None:
        super().__init__(_Handler)
        self.text = "ok"
        self.delay = 0.0
        self.plan_type = "plus"
        # Refused with the usage limit while this host's clock is before it (epoch seconds).
        self.closed_until: int | None = None
        # Refuse the WebSocket handshake itself with the 429 while closed (the service may).
        self.closed_on_websocket = False
        self.seen: list[Seen] = []
        # The requests refused with the 429 (a POST, or a WebSocket handshake), in arrival order.
        self.refused: list[Seen] = []
        # When each streamed answer had been sent in full (time.time()), in that order.
        self.answered_at: list[float] = []
        self.unknown_paths: list[str] = []
        self._lock = threading.Lock()

    # --- scripting ----------------------------------------------------------------------------
    def answer(self, text: str, *, delay: float = 0.0) -> None:
        """Every responses request from now on: a streamed `text`, sent `delay` seconds after it
        arrived (a model that takes its time: a probe's answer that is not in at once)."""
        with self._lock:
            self.text, self.delay = text, delay

    def close_until(self, resets_at: int, *, plan_type: str = "plus", on_websocket: bool = False) -> None:
        """The account's 5-hour window is full until `resets_at`: every responses request is
        refused with the 429 and the usage reading says so; from `resets_at` on both say open.

        `on_websocket`: the 429 answers the WebSocket handshake too (instead of the 426), which
        0.171.0 reads without its body ("exceeded retry limit, last status: 429")."""
        with self._lock:
            self.closed_until, self.plan_type = int(resets_at), plan_type
            self.closed_on_websocket = on_websocket

    def closed(self, at: float) -> bool:
        with self._lock:
            return self.closed_until is not None and at < self.closed_until

    def windows(self, at: float) -> tuple[tuple[int, int], tuple[int, int]]:
        """(used percent, reset instant) of the primary and the secondary window at `at`: whole
        percents, as the service sends them (0.171.0's app-server refuses a fraction there)."""
        with self._lock:
            until = self.closed_until
        full = until is not None and at < until
        primary = (100, int(until or 0)) if full else (3, int(at) + PRIMARY_SECONDS)
        return primary, (41, int(at) + SECONDARY_SECONDS)

    def usage_reading(self, at: float) -> dict[str, Any]:
        """`GET /backend-api/wham/usage`'s body at `at`."""
        (used, resets), (weekly, weekly_resets) = self.windows(at)

        def window(percent: int, reset_at: int, seconds: int) -> dict[str, Any]:
            return {
                "used_percent": percent,
                "limit_window_seconds": seconds,
                "reset_after_seconds": max(0, int(reset_at - at)),
                "reset_at": reset_at,
            }

        full = used >= 100
        return {
            "plan_type": self.plan_type,
            "rate_limit": {
                "allowed": not full,
                "limit_reached": full,
                "primary_window": window(used, resets, PRIMARY_SECONDS),
                "secondary_window": window(weekly, weekly_resets, SECONDARY_SECONDS),
            },
            "credits": {"has_credits": False, "unlimited": False, "balance": "0"},
        }

    # --- what was seen ------------------------------------------------------------------------
    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    @property
    def response_requests(self) -> list[Seen]:
        """The `POST …/responses` requests (a model turn each), in arrival order."""
        with self._lock:
            return [s for s in self.seen if s.method == "POST" and _route(s.path) == "responses"]

    @property
    def usage_requests(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if _route(s.path) == "usage"]

    def paths(self) -> list[str]:
        with self._lock:
            return [f"{s.method} {s.path}" + (" (websocket)" if s.websocket else "") for s in self.seen]

    # --- lifetime -----------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        """What `OPENAI_BASE_URL` names: the API's base, `/v1` included."""
        return f"{self.url}/v1"

    @property
    def chatgpt_url(self) -> str:
        """What `CHATGPT_BASE_URL` names: ChatGPT's backend (`/backend-api/`)."""
        return f"{self.url}/backend-api/"


def _route(path: str) -> str | None:
    bare = path.split("?", 1)[0].rstrip("/")
    if bare.endswith("/responses"):
        return "responses"
    if bare.endswith("/wham/usage"):
        return "usage"
    return None


def _decoded(raw: bytes, encoding: str) -> bytes:
    """A request body as sent before its `content-encoding`: a plan login's Codex compresses its
    model requests with zstd (read with the standard library's `compression.zstd` where it has
    one, else the `backports.zstd` package, else left as it came)."""
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "deflate"):
        with contextlib.suppress(zlib.error):
            return zlib.decompress(raw, zlib.MAX_WBITS | 32)
    elif encoding == "zstd":
        for module in ("compression.zstd", "backports.zstd"):
            with contextlib.suppress(Exception):  # no such module, or not zstd after all
                return bytes(importlib.import_module(module).decompress(raw))
    return raw


class _Handler(QuietHandler):
    api: FakeOpenAIAPI

    def decoded(self, raw: bytes) -> bytes:
        return _decoded(raw, self.headers.get("content-encoding", ""))

    def _send(self, status: int, data: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in {"content-length": str(len(data)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._send(status, data, {"content-type": "application/json", **(headers or {})})

    def _handle(self) -> None:
        body = self._body() if self.command == "POST" else None
        headers = {k.lower(): v for k, v in self.headers.items()}
        seen = Seen(self.command, self.path, headers, body, time.time())
        self.api.record(seen)
        route = _route(self.path)
        if (
            route == "responses"
            and seen.websocket
            and self.api.closed_on_websocket
            and self.api.closed(seen.at)
        ):
            self._limit(seen)
            self.close_connection = True
        elif route == "responses" and seen.websocket:
            # No WebSocket here: 426 sends Codex to HTTPS at once, with no reconnects.
            self._json(426, {"error": {"message": "use HTTPS"}}, {"connection": "close"})
            self.close_connection = True
        elif route == "responses" and self.command == "POST":
            self._responses(seen)
        elif route == "usage" and self.command == "GET":
            self._json(200, self.api.usage_reading(seen.at))
        else:
            with self.api._lock:
                self.api.unknown_paths.append(f"{self.command} {self.path}")
            self._json(404, {"error": {"message": "not here"}})

    def _limit(self, seen: Seen) -> None:
        """The service's 429 for a full window: its body and the `x-codex-*` headers."""
        at = seen.at
        with self.api._lock:
            self.api.refused.append(seen)
        primary, secondary = self.api.windows(at)
        body = limit_body(primary[1], now=at, plan_type=self.api.plan_type)
        self._json(429, body, window_headers(primary, secondary))

    def _responses(self, seen: Seen) -> None:
        at = seen.at
        primary, secondary = self.api.windows(at)
        headers = window_headers(primary, secondary)
        if self.api.closed(at):
            self._limit(seen)
            return
        with self.api._lock:
            text, delay = self.api.text, self.api.delay
        time.sleep(delay)
        self._send(200, answer_stream(text), {"content-type": "text/event-stream", **headers})
        self.wfile.flush()
        with self.api._lock:
            self.api.answered_at.append(time.time())

    do_GET = do_POST = _handle


def main() -> None:
    """Run it alone, printing every request: how to find out what a new release asks."""
    with FakeOpenAIAPI() as api:
        print(f"listening on {api.url}", flush=True)
        shown = 0
        while True:
            time.sleep(0.5)
            for line in api.paths()[shown:]:
                print(line, flush=True)
            shown = len(api.seen)


if __name__ == "__main__":
    main()
