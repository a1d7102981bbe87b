"""A loopback stand-in for the Anthropic Messages API, for driving the real Claude Code CLI.

A test double: pointed at it, the real CLI runs and never spends a usage window (no request
leaves 127.0.0.1). It ships in the package because bench/ drives it as the tests do.

Why: our fake session command (`tests/support/fake_claude.py`) prints what *we* believe Claude Code
prints, so it agrees with our parser by construction. The real CLI, pointed here with
`ANTHROPIC_BASE_URL` and `CLAUDE_CODE_OAUTH_TOKEN=<anything>` (it then authenticates as a
subscriber), decides for itself what to print from what this server answers: a streamed
SSE reply, a status code with an error body, and the `anthropic-ratelimit-unified-*`
headers that carry the usage window (`-status`, `-reset`, `-representative-claim`,
`-overage-status`, `-overage-disabled-reason`, `-5h-utilization`/`-5h-reset`/
`-5h-surpassed-threshold`).

It binds 127.0.0.1 only, records every request (method, path, headers, body) and answers
any path it does not know with `{}` (200), so a start-up call of a newer CLI never hangs a
test; `unknown_paths` lists them.

    with FakeAnthropicAPI() as api:
        api.answer("4")                                   # every /v1/messages: a streamed "4"
        api.push(Reply.limit(resets_at=..., claim="five_hour"))   # next request only (FIFO)
        api.default = Reply.limit(...)                    # every request from now on
        api.rule = lambda seen: ...                       # a Reply (or None) per request, first
        env["ANTHROPIC_BASE_URL"] = api.url
        api.message_requests                              # the /v1/messages requests seen
        api.push(Reply.tool_use("Bash", {"command": "env"}))  # the model asks for a tool
        api.tool_call("Bash", {"command": "env"}, then="done")  # ... and answers its result
        api.message_requests[-1].tool_results             # what the tool printed, as sent back
        api.push(Reply.held(gate, "late"))                # answers only once `gate` is set
        api.push(Reply.spend_cap("group_pool"))           # a spend cap named by whose it is
        api.answer("4", **Reply.window_headers(five_hour=(0.42, resets)))  # each window's use
        api.clock_offset = -2.0                           # the service's clock 2 s behind
        api.close_until(resets, claim="five_hour")        # refused until resets, on its clock
        api.limit_credential("tok-A", resets_at=resets)   # that token alone refused until resets
        api.message_requests[-1].credential               # the token or API key it was sent with

The spend caps and the per-window use are the headers Claude Code 2.1.332 reads
(`-overage-scope`, `-overage-period`, `-overage-daily-cap-paused`, `-<5h|7d|7d_oi>-utilization`,
`-<...>-reset`, `-<...>-surpassed-threshold`; read from its binary); 2.1.197 reads fewer of them
and words the same refusal its own way.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatchq.testing.loopback import LoopbackServer, QuietHandler, SeenRequest

__all__ = ["FakeAnthropicAPI", "Reply", "Seen"]

MODEL = "claude-sonnet-4-5"


@dataclass(frozen=True)
class Reply:
    """One answer to `POST /v1/messages`: a streamed text (status 200) or an error status."""

    status: int = 200
    text: str = "ok"
    body: Mapping[str, Any] | None = None  # an error body (status != 200)
    headers: Mapping[str, str] = field(default_factory=dict)
    # A tool call instead of text: {"name": ..., "input": {...}} (stop_reason `tool_use`).
    tool: Mapping[str, Any] | None = None
    # Held: the reply is sent only once this is set (a session cut off mid-request).
    hold: threading.Event | None = field(default=None, compare=False)

    @staticmethod
    def allowed_headers(**extra: str) -> dict[str, str]:
        return {"anthropic-ratelimit-unified-status": "allowed", **extra}

    @classmethod
    def answer(cls, text: str, **headers: str) -> Reply:
        return cls(200, text, headers=cls.allowed_headers(**headers))

    @classmethod
    def limit(
        cls,
        *,
        resets_at: int,
        claim: str = "five_hour",
        overage_status: str = "rejected",
        overage_disabled_reason: str | None = "org_level_disabled",
        message: str = "This request would exceed your account's rate limit. Please try again later.",
    ) -> Reply:
        """The account's usage window is closed until `resets_at` (epoch seconds)."""
        headers = {
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-reset": str(resets_at),
            "anthropic-ratelimit-unified-representative-claim": claim,
            "anthropic-ratelimit-unified-overage-status": overage_status,
        }
        if overage_disabled_reason:
            headers["anthropic-ratelimit-unified-overage-disabled-reason"] = overage_disabled_reason
        return cls(429, body=error_body("rate_limit_error", message), headers=headers)

    @classmethod
    def spend_cap(
        cls,
        whose: str,
        *,
        resets_at: int | None = None,
        cap_resets_at: int | None = None,
        period: str | None = None,
    ) -> Reply:
        """A spend cap refuses: `whose` is `group_pool`, `channel`, `service` (the service's
        `-overage-scope`), `member` (the person's own cap, with `period`) or `org_paused` (the
        organisation's daily cap paused it). `cap_resets_at` is when the cap turns
        (`-overage-reset`); `resets_at` the plan window's reset the service sends beside it."""
        headers = {
            "anthropic-ratelimit-unified-status": "rejected",
            "anthropic-ratelimit-unified-overage-status": "rejected",
        }
        if resets_at is not None:
            headers["anthropic-ratelimit-unified-reset"] = str(resets_at)
        if cap_resets_at is not None:
            headers["anthropic-ratelimit-unified-overage-reset"] = str(cap_resets_at)
        if whose == "org_paused":
            headers["anthropic-ratelimit-unified-overage-daily-cap-paused"] = "true"
        else:
            headers["anthropic-ratelimit-unified-overage-disabled-reason"] = "org_spend_cap_reached"
        if whose in ("group_pool", "channel", "service"):
            headers["anthropic-ratelimit-unified-overage-scope"] = whose
        if whose == "member" and period:
            headers["anthropic-ratelimit-unified-overage-period"] = period
        message = "This request would exceed your organization's spend limit."
        return cls(429, body=error_body("rate_limit_error", message), headers=headers)

    @staticmethod
    def window_headers(**windows: tuple[float, int] | tuple[float, int, float]) -> dict[str, str]:
        """Each window's use as the service reports it: `five_hour=(0.42, resets_at)`, or with a
        third member, the threshold it passed (`five_hour=(0.92, resets_at, 0.9)`). Names:
        `five_hour`, `seven_day`, `seven_day_overage_included`."""
        short = {"five_hour": "5h", "seven_day": "7d", "seven_day_overage_included": "7d_oi"}
        headers: dict[str, str] = {}
        for name, reading in windows.items():
            prefix = f"anthropic-ratelimit-unified-{short[name]}"
            headers[f"{prefix}-utilization"] = str(reading[0])
            headers[f"{prefix}-reset"] = str(reading[1])
            if len(reading) > 2:
                headers[f"{prefix}-surpassed-threshold"] = str(reading[2])
        return headers

    @classmethod
    def error(cls, status: int, kind: str, message: str, **headers: str) -> Reply:
        return cls(status, body=error_body(kind, message), headers=dict(headers))

    @classmethod
    def tool_use(cls, name: str, tool_input: Mapping[str, Any], **headers: str) -> Reply:
        """The model calls tool `name` with `tool_input`; the CLI runs it and asks again."""
        return cls(
            200, "", headers=cls.allowed_headers(**headers), tool={"name": name, "input": dict(tool_input)}
        )

    @classmethod
    def held(cls, gate: threading.Event, text: str = "ok", **headers: str) -> Reply:
        """A streamed `text` sent only once `gate` is set (waited for outside the server's lock)."""
        return cls(200, text, headers=cls.allowed_headers(**headers), hold=gate)


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


@dataclass(frozen=True)
class Seen(SeenRequest):
    """One request the server received."""

    @property
    def model(self) -> str:
        return str(self.body.get("model") or "") if isinstance(self.body, dict) else ""

    @property
    def credential(self) -> str | None:
        """What the request authenticated with: the bearer token (a subscription's login) or
        the `x-api-key` (an API key), as sent; None when it carried neither."""
        return self.bearer if self.bearer is not None else self.headers.get("x-api-key")

    @property
    def tool_results(self) -> list[str]:
        """The text of every `tool_result` block the CLI sent back in this request."""
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        found: list[str] = []
        for message in messages if isinstance(messages, list) else []:
            content = message.get("content") if isinstance(message, dict) else None
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found.append(_block_text(block.get("content")))
        return found


def _block_text(content: Any) -> str:
    """A tool_result's content: a string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _tool_block(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": tool["name"], "input": {}}


def _message(text: str, model: str, tool: Mapping[str, Any] | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if tool is not None:
        content = [{**_tool_block(tool), "input": dict(tool["input"])}]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if tool is not None else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": max(1, len(text) // 4)},
    }


class FakeAnthropicAPI(LoopbackServer):
    """The server; a context manager that starts it on a free loopback port."""

    def __init__(self) -> None:
        super().__init__(_Handler)
        self.default = Reply.answer("ok")
        self.queue: deque[Reply] = deque()
        # Asked first for every /v1/messages request (under the lock): a Reply, or None for
        # the queue and the default. Tests script time- or model-dependent answers with it.
        self.rule: Callable[[Seen], Reply | None] | None = None
        self.seen: list[Seen] = []
        self.unknown_paths: list[str] = []
        # The service's clock minus this host's, in seconds (negative: the service is behind).
        self.clock_offset = 0.0
        # Per credential (a token or API key value): refused with the usage limit until then,
        # asked before `rule`, so one account's window closes while the others answer.
        self.limited: dict[str, tuple[int, Reply]] = {}
        self._lock = threading.Lock()

    # --- scripting --------------------------------------------------------------------
    def answer(self, text: str, **headers: str) -> None:
        self.default = Reply.answer(text, **headers)

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    def next_reply(self, seen: Seen | None = None) -> Reply:
        with self._lock:
            limited = self.limited.get(seen.credential or "") if seen is not None else None
            if seen is not None and limited is not None and seen.at + self.clock_offset < limited[0]:
                return limited[1]
            if self.rule is not None and seen is not None:
                chosen = self.rule(seen)
                if chosen is not None:
                    return chosen
            return self.queue.popleft() if self.queue else self.default

    def tool_call(self, name: str, tool_input: Mapping[str, Any], *, then: str = "done") -> None:
        """Every request whose messages carry no tool_result asks for the tool; one that
        carries one (the CLI's follow-up with the tool's output) is answered with `then`."""

        def rule(seen: Seen) -> Reply:
            return Reply.answer(then) if seen.tool_results else Reply.tool_use(name, tool_input)

        self.rule = rule

    def now(self) -> float:
        """The service's clock (this host's, moved by `clock_offset`)."""
        return time.time() + self.clock_offset

    def close_until(self, resets_at: int, *, claim: str = "five_hour") -> None:
        """Refuse every request with the usage limit until `resets_at` on the service's clock.

        With `clock_offset` negative, a probe sent at this host's `resets_at` is still refused,
        stating that (to this host, just past) reset: the skew a loaded or drifting host meets.
        """

        def rule(seen: Seen) -> Reply | None:
            if seen.at + self.clock_offset < resets_at:
                return Reply.limit(resets_at=resets_at, claim=claim)
            return None

        self.rule = rule

    def limit_credential(self, credential: str, *, resets_at: int, claim: str = "five_hour") -> None:
        """Refuse every request made with `credential` (a token or an API key, as sent) with the
        usage limit (the `anthropic-ratelimit-unified-*` rejection) until `resets_at` on the
        service's clock; requests with any other credential are answered as before."""
        with self._lock:
            self.limited[credential] = (resets_at, Reply.limit(resets_at=resets_at, claim=claim))

    def lift_credential(self, credential: str) -> None:
        """`credential`'s window opens now (before the reset it stated)."""
        with self._lock:
            self.limited.pop(credential, None)

    def requests_with(self, credential: str) -> list[Seen]:
        """The /v1/messages requests made with `credential`, in arrival order."""
        return [s for s in self.message_requests if s.credential == credential]

    @property
    def message_requests(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.method == "POST" and s.path.startswith("/v1/messages")]

    # --- recording --------------------------------------------------------------------
    def record(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)


class _Handler(QuietHandler):
    """One request to the stand-in; `api` is set on the subclass the server makes for itself."""

    api: FakeAnthropicAPI

    def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        body = self._body() if method in ("POST", "PUT", "PATCH") else None
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        seen = Seen(method, self.path, headers, body, time.time())
        self.api.record(seen)
        if method == "POST" and path == "/v1/messages":
            self._messages(body if isinstance(body, dict) else {}, seen)
            return
        if method == "POST" and path == "/v1/messages/count_tokens":
            self._send(200, {"input_tokens": 12})
            return
        with self.api._lock:
            self.api.unknown_paths.append(f"{method} {self.path}")
        self._send(200, {})

    def _messages(self, body: Mapping[str, Any], seen: Seen) -> None:
        reply = self.api.next_reply(seen)
        if reply.hold is not None:
            reply.hold.wait(timeout=300)
        if reply.status != 200:
            self._send(reply.status, reply.body or error_body("api_error", "error"), reply.headers)
            return
        model = str(body.get("model") or MODEL)
        if not body.get("stream"):
            self._send(200, _message(reply.text, model, reply.tool), reply.headers)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        start = _message("", model)
        start["content"] = []
        start["stop_reason"] = None
        start["usage"] = {"input_tokens": 12, "output_tokens": 1}
        chunks = [
            _sse("message_start", {"type": "message_start", "message": start}),
            *(_text_chunks(reply.text) if reply.tool is None else _tool_chunks(reply.tool)),
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": "end_turn" if reply.tool is None else "tool_use",
                        "stop_sequence": None,
                    },
                    "usage": {"output_tokens": max(1, len(reply.text) // 4)},
                },
            ),
            _sse("message_stop", {"type": "message_stop"}),
        ]
        for chunk in chunks:
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_HEAD(self) -> None:
        self._handle("HEAD")


def _text_chunks(text: str) -> list[bytes]:
    return [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]


def _tool_chunks(tool: Mapping[str, Any]) -> list[bytes]:
    """A `tool_use` block as the API streams it: an empty input, then its JSON in one delta."""
    return [
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": _tool_block(tool)},
        ),
        _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(dict(tool["input"]))},
            },
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]


def main() -> None:
    """Run it alone, logging every request: how we found out what the CLI calls at start."""
    with FakeAnthropicAPI() as api:
        print(f"listening on {api.url}", flush=True)
        shown = 0
        while True:
            time.sleep(0.5)
            for seen in api.seen[shown:]:
                print(seen.method, seen.path, json.dumps(seen.body)[:300], flush=True)
            shown = len(api.seen)


if __name__ == "__main__":
    main()
