"""Slots a stranger cannot hold, over real HTTP against a real `dispatchq serve` process: a client
past its connection or request cap is refused while another client is served, idle connections
are closed, a full server makes room by closing the longest-idle connection, the reserved share
keeps `/healthz` and webhooks answered, and a streamed webhook body is verified from a spool
file that is gone once it is answered. Waits are bounded liveness waits, never timings."""

from __future__ import annotations

import json
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.serve import Reply, Server, sign
from tests.support.slots import closed_by_server, connect_from, in_flight, refused_from, request_from

A, B, C = "127.0.0.1", "127.0.0.2", "127.0.0.3"
HELD = {"DISPATCHQ_SERVE_HEADER_TIMEOUT": "60", "DISPATCHQ_SERVE_BODY_TIMEOUT": "60"}


def until(probe: Callable[[], Reply], status: int, *, within: float = 30) -> Reply:
    """Probe until it answers `status` (the server takes a moment to count what it was sent)."""
    deadline = time.monotonic() + within
    while True:
        reply = probe()
        if reply.status == status or time.monotonic() > deadline:
            return reply
        time.sleep(0.1)


def test_a_client_past_its_connection_cap_is_closed_while_others_are_served(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **bounds_env,
        **HELD,
        "DISPATCHQ_SERVE_IDLE_TIMEOUT": "60",
        "DISPATCHQ_SERVE_PEER_CONNECTIONS": "4",
        "DISPATCHQ_SERVE_MAX_CONNECTIONS": "8",
    }
    with Server(env, tmp_path) as server:
        held = [connect_from(A, server.port) for _ in range(4)]
        try:
            extra = connect_from(A, server.port)
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer, closed = closed_by_server(extra)
            assert closed and answer == b"", answer[:300]  # closed at once, never answered
            extra.close()
            assert request_from(B, server.port, "GET", "/healthz").status == 200
            assert refused_from(B, server.port, "peer_connections") >= 1
            # A second client fills the server (8 in all): a third one still gets in, and the
            # connection that waited longest with no request (A's first) is closed for it.
            others = [connect_from(B, server.port) for _ in range(4)]
            try:
                time.sleep(0.5)  # let the server take them in before the newcomer
                assert request_from(C, server.port, "GET", "/healthz").status == 200
                _, oldest_closed = closed_by_server(held[0])
                assert oldest_closed
                assert refused_from(C, server.port, "connections") >= 1
            finally:
                for sock in others:
                    sock.close()
        finally:
            for sock in held:
                sock.close()
        # Its connections gone, the first client is counted down and served again.
        assert until(lambda: request_from(A, server.port, "GET", "/healthz"), 200).status == 200
        assert "Traceback" not in server.output


def test_idle_connections_are_closed_after_the_idle_timeout(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**bounds_env, **HELD, "DISPATCHQ_SERVE_IDLE_TIMEOUT": "1"}
    with Server(env, tmp_path) as server:
        before = refused_from(A, server.port, "idle_timeout")
        with connect_from(A, server.port) as silent:
            answer, closed = closed_by_server(silent)  # the header deadline is 60 s: idle closes it
        assert closed and answer == b"", answer[:300]
        with connect_from(A, server.port) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer, closed = closed_by_server(kept)  # answered, then idle until closed
        assert closed and answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert refused_from(A, server.port, "idle_timeout") >= before + 2


def test_requests_past_the_general_share_are_503_while_healthz_and_webhooks_are_served(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    # 8 slots, one of them (0.125) kept for /healthz and /webhooks/github.
    env = {**bounds_env, **HELD, "DISPATCHQ_SERVE_CONCURRENCY": "8", "DISPATCHQ_SERVE_PEER_REQUESTS": "100"}
    with Server(env, tmp_path) as server:
        with in_flight(A, server.port, 7):
            refused = until(lambda: request_from(B, server.port, "GET", "/status"), 503)
            assert refused.status == 503, refused.body
            assert "DISPATCHQ_SERVE_CONCURRENCY" in refused.json["error"]
            assert refused.headers["retry-after"] and refused.headers["x-frame-options"] == "DENY"
            assert request_from(B, server.port, "GET", "/healthz").status == 200
            ping = json.dumps({"zen": "Keep it logically awesome.", "hook_id": 1}).encode()
            delivered = request_from(
                B, server.port, "POST", "/webhooks/github", ping, _github("ping", ping, sign(ping))
            )
            assert delivered.status == 200 and delivered.json["ping"] == "pong", delivered.body
        assert until(lambda: request_from(B, server.port, "GET", "/status"), 200).status == 200
        assert refused_from(B, server.port, "concurrency") >= 1
        assert "Traceback" not in server.output


def test_a_client_past_its_request_cap_is_503_while_another_client_is_served(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**bounds_env, **HELD, "DISPATCHQ_SERVE_PEER_REQUESTS": "3"}
    with Server(env, tmp_path) as server:
        with in_flight(A, server.port, 3):
            refused = until(lambda: request_from(A, server.port, "GET", "/healthz"), 503)
            assert refused.status == 503 and "DISPATCHQ_SERVE_PEER_REQUESTS" in refused.json["error"]
            assert request_from(B, server.port, "GET", "/status").status == 200
        assert until(lambda: request_from(A, server.port, "GET", "/healthz"), 200).status == 200
        assert refused_from(B, server.port, "peer_requests") >= 1


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_caps(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **bounds_env,
        **HELD,
        "DISPATCHQ_SERVE_TRUSTED_PROXIES": A,
        "DISPATCHQ_SERVE_PEER_CONNECTIONS": "2",
        "DISPATCHQ_SERVE_PEER_REQUESTS": "2",
    }
    via = {"X-Forwarded-For": "203.0.113.9"}
    # The proxy's connections carry every client: more than the per-address cap stay open.
    with (
        Server(env, tmp_path) as server,
        in_flight(A, server.port, 2, forwarded="203.0.113.7"),
        in_flight(A, server.port, 1, "203.0.113.8"),
    ):
        refused = until(
            lambda: request_from(
                A, server.port, "GET", "/healthz", headers={"X-Forwarded-For": "203.0.113.7"}
            ),
            503,
        )
        assert refused.status == 503 and "DISPATCHQ_SERVE_PEER_REQUESTS" in refused.json["error"]
        assert request_from(A, server.port, "GET", "/healthz", headers=via).status == 200
        assert "Traceback" not in server.output


def _github(event: str, body: bytes, signature: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": "d-slots-1",
        "X-Hub-Signature-256": signature,
        "Content-Length": str(len(body)),
    }


def _spooled_delivery(port: int, spool: Path, body: bytes, signature: str) -> tuple[bytes, list[Path]]:
    """Send a delivery in two halves; between them, wait for its spool file: (answer, files seen)."""
    head = "".join(f"{k}: {v}\r\n" for k, v in _github("ping", body, signature).items())
    half = len(body) // 2
    with connect_from(A, port) as sock:
        sock.sendall(
            f"POST /webhooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + body[:half]
        )
        deadline = time.monotonic() + 30
        seen: list[Path] = []
        while not seen and time.monotonic() < deadline:
            seen = list(spool.glob("*")) if spool.is_dir() else []
            time.sleep(0.05)
        assert seen, "no spool file while the body streamed"
        assert stat.S_IMODE(spool.stat().st_mode) == 0o700
        assert stat.S_IMODE(seen[0].stat().st_mode) == 0o600
        sock.sendall(body[half:])
        answer, _ = _read_answer(sock)
    return answer, seen


def _read_answer(sock: socket.socket) -> tuple[bytes, bool]:
    """Read one whole answer (it has a Content-Length), or until the server closes."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            return data, True
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
    )
    while len(rest) < length:
        got = sock.recv(65536)
        if not got:
            break
        rest += got
    return head + b"\r\n\r\n" + rest, False


def test_a_streamed_webhook_is_verified_from_a_spool_file_that_is_gone_after(
    bounds_env: dict[str, str], tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    env = {**bounds_env, **HELD, "DISPATCHQ_SERVE_SPOOL_DIR": str(spool)}
    body = json.dumps({"zen": "Design for failure.", "hook_id": 7, "pad": "x" * 300_000}).encode()
    with Server(env, tmp_path) as server:
        wrong, seen = _spooled_delivery(server.port, spool, body, sign(body, "not the secret"))
        assert wrong.startswith(b"HTTP/1.1 401"), wrong[:300]
        assert b"does not match the webhook secret" in wrong
        assert not seen[0].exists() and list(spool.iterdir()) == []
        right, seen = _spooled_delivery(server.port, spool, body, sign(body))
        assert right.startswith(b"HTTP/1.1 200"), right[:300]
        assert b'"ping":"pong"' in right and b'"hook_id":7' in right
        assert not seen[0].exists() and list(spool.iterdir()) == []
        assert "Traceback" not in server.output
