"""A loopback TCP proxy that injects network faults between the clients and a Redis server.

Modes, switchable while connections are open:
- ``pass``: bytes flow both ways;
- ``blackhole``: nothing is forwarded in either direction and new connections are accepted but
  not served, as in a partition: TCP keeps the bytes, the peers see silence, and whatever is
  still buffered flows on recovery (a client that gave up meanwhile has closed its socket);
- ``latency``: every chunk is delivered ``latency_ms`` after it was read, in order;
- ``reset``: each chunk of a client's request has ``reset_rate`` probability to end both
  connections with a TCP RST instead, half of them before the request reached Redis (the
  request is lost) and half after (the reply is lost).
``latency`` and ``reset`` combine. Counters say what was done.
"""

from __future__ import annotations

import collections
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class ProxyStats:
    accepted: int = 0
    resets: int = 0
    open: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets an RST, not an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FaultProxy:
    def __init__(self, listen_port: int, target_port: int, *, seed: int = 7) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.mode = "pass"
        self.latency_ms = 0.0
        self.reset_rate = 0.0
        self.stats = ProxyStats()
        self._random = random.Random(seed)
        self._random_lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", listen_port), backlog=512)
        self._conns: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="fault-proxy")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.listen_port}/0"

    # -- switching faults -------------------------------------------------------------------

    def blackhole(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        """Back to plain forwarding (latency and resets off, blackhole lifted)."""
        self.latency_ms, self.reset_rate = 0.0, 0.0
        self._flowing.set()

    def degrade(self, *, latency_ms: float = 0.0, reset_rate: float = 0.0) -> None:
        self.latency_ms, self.reset_rate = latency_ms, reset_rate

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._server.close()
        with self.stats.lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.close()
            except OSError:
                pass
        self._thread.join(5)

    # -- forwarding -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._flowing.wait()  # a blackholed connection is accepted, then left unanswered
        if self._closed.is_set():
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.stats.lock:
            self.stats.accepted += 1
            self.stats.open += 1
            self._conns.update((client, upstream))
        pair = _Pair(self, client, upstream)
        up = threading.Thread(target=pair.pump, args=(client, upstream, True), daemon=True)
        up.start()
        pair.pump(upstream, client, False)
        up.join()
        with self.stats.lock:
            self.stats.open -= 1
            self._conns.difference_update((client, upstream))

    def _draw(self) -> float:
        with self._random_lock:
            return self._random.random()


class _Pair:
    """One proxied connection: two pumps; the first to end closes both sockets."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.done = threading.Event()
        self.lock = threading.Lock()

    def end(self, *, reset: bool = False) -> None:
        with self.lock:
            if self.done.is_set():
                return
            self.done.set()
            for sock in (self.client, self.upstream):
                if reset:
                    _reset(sock)
                else:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    sock.close()

    def pump(self, src: socket.socket, dst: socket.socket, request: bool) -> None:
        proxy = self.proxy
        delayed: collections.deque[tuple[float, bytes]] = collections.deque()
        ready = threading.Condition()
        sender = threading.Thread(
            target=self._send_delayed, args=(dst, delayed, ready), daemon=True
        )
        sender.start()
        try:
            while not self.done.is_set():
                try:
                    data = src.recv(CHUNK)
                except OSError:
                    break
                if not data:
                    break
                proxy._flowing.wait()  # blackhole: hold the bytes (TCP would retransmit them)
                if self.done.is_set() or proxy._closed.is_set():
                    break
                if request and proxy.reset_rate and proxy._draw() < proxy.reset_rate:
                    if proxy._draw() < 0.5:  # after the request reached Redis: reply lost
                        self._send_now(dst, data)
                    with proxy.stats.lock:
                        proxy.stats.resets += 1
                    self.end(reset=True)
                    break
                with ready:
                    delayed.append((time.monotonic() + proxy.latency_ms / 1000, data))
                    ready.notify()
        finally:
            with ready:
                delayed.append((0.0, b""))  # end marker: the sender drains what is due, then stops
                ready.notify()
            sender.join(10)
            self.end()

    def _send_now(self, dst: socket.socket, data: bytes) -> None:
        try:
            dst.sendall(data)
        except OSError:
            pass

    def _send_delayed(self, dst, delayed, ready) -> None:
        while True:
            with ready:
                while not delayed:
                    ready.wait()
                due, data = delayed.popleft()
            if not data:
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.proxy._flowing.wait()
            try:
                dst.sendall(data)
            except OSError:
                self.end()
                return
