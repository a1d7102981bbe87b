"""A loopback TCP proxy in front of Redis, one per simulated host, that can cut the host off.

A network partition is not a refused connection: packets simply stop arriving and every open
socket stays open, so a client learns of it only through its own timeouts. `stall()` models
that: the proxy stops reading from either side of every connection (the kernel's buffers fill,
as they would behind a dead link) and keeps every socket open; new connections are accepted and
join the stall. `heal()` lets everything queued meanwhile flow again, in order, as TCP's
retransmissions would. `reset()` is the other fault a network can deal: every open connection
is closed with an RST (SO_LINGER 0), so both ends see a reset at once.

Threads: one accepting, two per connection (one per direction), each waking every `POLL`
seconds to look at the proxy's state, so `close()` (or leaving the `with` block) ends them all
and closes every socket, as pytest's `filterwarnings=error` requires.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

__all__ = [
    "LOOPBACK",
    "POLL",
    "StallProxy",
]

LOOPBACK = "127.0.0.1"
#: How often a blocked pump looks at the proxy's state (stalled, healed, closing).
POLL = 0.05
_CHUNK = 65536


class _Pair:
    """One client connection and its own upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = False
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def close(self, *, rst: bool = False) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for sock in (self.client, self.upstream):
                with contextlib.suppress(OSError):
                    if rst:
                        # Linger on, for zero seconds: close() sends RST instead of FIN.
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    else:
                        sock.shutdown(socket.SHUT_RDWR)
                sock.close()


class StallProxy:
    """Forwards `<listen>:<port>` to `upstream`, until told to stall or reset.

    `listen` is loopback unless a test hands it an address it made itself (the root end of a
    network namespace's veth pair, `tests/support/netns.py`).

    Use as a context manager (or call `close()`): `with StallProxy(("127.0.0.1", 6379)) as p:`
    then point the host's clients at `p.port`. `forwarded` counts bytes moved in both
    directions (a test can check that a stalled proxy moved nothing).
    """

    def __init__(self, upstream: tuple[str, int], *, name: str = "host", listen: str = LOOPBACK) -> None:
        self.upstream = upstream
        self.name = name
        self.listen = listen
        self.forwarded = 0
        self._flowing = threading.Event()  # set = forwarding; clear = stalled
        self._flowing.set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((listen, 0))
        self._listener.listen(128)
        self._listener.settimeout(POLL)
        self.port = int(self._listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept, name=f"stallproxy-{name}", daemon=True)
        self._acceptor.start()

    # -- the faults -------------------------------------------------------------------------

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    def stall(self) -> None:
        """Stop forwarding both ways on every connection, old and new; keep them all open."""
        self._flowing.clear()

    def heal(self) -> None:
        """Forward again; what was sent during the stall arrives now, in order."""
        self._flowing.set()

    def reset(self) -> int:
        """RST every open connection (both sides); returns how many were reset.

        The stall state is kept: a reset during a stall leaves new connections stalled.
        """
        with self._lock:
            pairs, self._pairs = self._pairs, []
        live = [pair for pair in pairs if not pair.closed]
        for pair in live:
            pair.close(rst=True)
        return len(live)

    def connections(self) -> int:
        """Open client connections through this proxy now."""
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]
            return len(self._pairs)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the listener and every connection, and end every thread."""
        self._closing.set()
        self._flowing.set()  # wake pumps parked on a stall
        self._acceptor.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        for pair in pairs:
            for thread in pair.threads:
                thread.join(timeout=5)

    def __enter__(self) -> StallProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "stalled" if self.stalled else "flowing"
        target = f"{self.upstream[0]}:{self.upstream[1]}"
        return f"StallProxy({self.name} {self.listen}:{self.port} -> {target}, {state})"

    # -- the threads ------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                # Nothing behind us: the client sees its connection closed, as a refused one.
                client.close()
                continue
            pair = _Pair(client, upstream)
            for sock in (client, upstream):
                sock.settimeout(POLL)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair.threads = [
                threading.Thread(target=self._pump, args=(pair, client, upstream), daemon=True),
                threading.Thread(target=self._pump, args=(pair, upstream, client), daemon=True),
            ]
            with self._lock:
                if self._closing.is_set():
                    pair.close()
                    return
                self._pairs.append(pair)
            for thread in pair.threads:
                thread.start()

    def _hold(self, pair: _Pair) -> bool:
        """Wait out a stall; False when the pair or the proxy is closing."""
        while not self._flowing.wait(POLL):
            if pair.closed or self._closing.is_set():
                return False
        return not (pair.closed or self._closing.is_set())

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while self._hold(pair):
                try:
                    data = source.recv(_CHUNK)
                except TimeoutError:
                    continue
                if not data:
                    break
                # Read just as a stall began: hold it, as a cut link would, until the heal.
                if not (self._hold(pair) and self._send(pair, sink, data)):
                    break
        except OSError:
            pass
        pair.close()

    def _send(self, pair: _Pair, sink: socket.socket, data: bytes) -> bool:
        """Send `data` on, counting it before the peer can see it: a test that reads `forwarded`
        after its client got an answer must find that answer counted, or a count it takes at a
        stall would move afterwards without a byte crossing the stall."""
        view = memoryview(data)
        while view:
            if not self._hold(pair):
                return False
            with self._lock:
                self.forwarded += len(view)
            try:
                sent = sink.send(view)
            except TimeoutError:
                sent = 0
            view = view[sent:]
            with self._lock:
                self.forwarded -= len(view)  # not sent yet: counted again when it is
        return True
