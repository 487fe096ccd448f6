"""FaultProxy: a TCP proxy on 127.0.0.1 in front of one broker, with faults on command.

Threads, one per direction per connection; every loop polls ``stopped`` at least every
0.2 s, so ``stop`` returns promptly. The broker must advertise the proxy's port
(``advertised.listeners``), else clients leave the proxy after bootstrap.

Faults on the broker->client direction (after the broker handled a request):
``kill_probability`` drops a reply and closes both connections (at most ``max_faults``
times), ``delay_probability`` holds a reply back 50-250 ms, ``blackhole`` (an Event) drops
every reply (counted in ``dropped``). The first ``spare_replies`` reply chunks of a
connection (ApiVersions ...) are never killed: librdkafka takes a connection closed during
ApiVersions for a pre-0.10 broker and then refuses idempotence.

On the client->broker direction, ``hold`` (an Event) keeps the client's bytes in the proxy
while set and forwards them, in order, once it is cleared (a delayed request arriving
late). ``partition()`` cuts the broker off: open connections are closed and new ones
closed at once, until ``heal()``.

Held requests (the Jepsen transaction anomalies: a request of an earlier transaction that
reaches the broker after the next one began). With ``framed=True`` the proxy splits the
client's bytes into request frames; ``hold_requests(api_key, ...)`` then captures every
request with one of those API keys (and whatever follows it on its connection, so the
broker still sees each connection's requests in order) until ``stop_holding()``; captured
requests stay in the proxy, even after the client gave up and closed its connection
(the upstream connection stays open for them), until ``release()`` forwards them.
``held_requests`` counts the captured requests, ``released_replies`` the replies the
broker sent to released requests of closed client connections (they are dropped).

Selective cuts (a broker cut off from *some* peers, :mod:`kbroker.chaos.cluster`):
``refuse`` is None or a callable taking the client's address (host, port) and saying
whether that connection must not pass now; it is asked on every accept, and
``sever()`` closes the open connections it rejects (call it after changing what it
answers). ``connections`` counts the connections forwarded so far.
"""
from __future__ import annotations

import random
import socket
import threading
import time


class FaultProxy:
    spare_replies = 2

    def __init__(self, upstream_port=None, *, seed=0, kill_probability=0.0, delay_probability=0.0,
                 max_faults=0, upstream_host="127.0.0.1", framed=False):
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.rnd = random.Random(seed)
        self.kill_probability = kill_probability
        self.delay_probability = delay_probability
        self.max_faults = max_faults
        self.kills = 0
        self.delays = 0
        self.dropped = 0
        self.held = 0
        self.blackhole = threading.Event()
        self.hold = threading.Event()
        self.partitioned = threading.Event()
        self.stopped = threading.Event()
        self.refuse = None
        self.connections = 0
        self.framed = framed
        self.held_requests = 0
        self.released_replies = 0
        self._capture: frozenset = frozenset()
        self._releasing = threading.Event()    # set: held requests go out
        self._releasing.set()
        self._replies: dict = {}               # pair -> reply chunks forwarded (or dropped) so far
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._pairs: dict = {}     # (client, upstream) -> the client's address
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        self._spawn(self._accept_loop)
        return self

    def partition(self) -> None:
        """Cut the broker off: close every open connection, refuse new ones."""
        self.partitioned.set()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._close(pair)

    def sever(self) -> None:
        """Close the open connections that ``refuse`` rejects now."""
        refuse = self.refuse
        if refuse is None:
            return
        with self._lock:
            pairs = list(self._pairs.items())
        for pair, addr in pairs:
            if refuse(addr):
                self._close(pair)

    def heal(self) -> None:
        self.partitioned.clear()

    def hold_requests(self, *api_keys: int) -> None:
        """Capture from now on every request with one of ``api_keys`` (needs ``framed``)."""
        if not self.framed:
            raise ValueError("hold_requests needs FaultProxy(framed=True)")
        with self._lock:
            self._releasing.clear()
            self._capture = frozenset(int(k) for k in api_keys)

    def stop_holding(self) -> None:
        """Capture no more requests; those captured stay held until ``release()``."""
        with self._lock:
            self._capture = frozenset()

    def release(self) -> None:
        """Forward every held request (in order per connection) and capture no more."""
        with self._lock:
            self._capture = frozenset()
            self._releasing.set()

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                client, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            refuse = self.refuse
            if (self.partitioned.is_set() or self.upstream_port is None
                    or (refuse is not None and refuse(addr))):
                client.close()
                continue
            try:
                upstream = socket.create_connection((self.upstream_host, self.upstream_port), timeout=1)
            except OSError:
                client.close()   # broker down: the client sees a closed connection and reconnects
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs[pair] = addr
                self.connections += 1
            self._spawn(self._pump, upstream, client, pair, True)
            self._spawn(self._pump, client, upstream, pair, False)

    def _fault(self, reply_number: int):
        with self._lock:
            if self.blackhole.is_set():
                self.dropped += 1
                return "drop"
            x = self.rnd.random()
            if reply_number < self.spare_replies:
                return None
            if self.kills < self.max_faults and x < self.kill_probability:
                self.kills += 1
                return "kill"
            if x > 1 - self.delay_probability:
                self.delays += 1
                return self.rnd.uniform(0.05, 0.25)
            return None

    def _pump(self, src, dst, pair, replies: bool) -> None:
        n = 0
        pending: list[bytes] = []
        held: list[bytes] = []           # captured request frames of this connection
        buf = bytearray()                # framed: the incomplete request frame
        try:
            src.settimeout(0.2)   # inside the try: the other direction may have closed src already
            while not self.stopped.is_set() and not self.partitioned.is_set():
                if pending and not self.hold.is_set():
                    dst.sendall(b"".join(pending))
                    pending.clear()
                if held and self._releasing.is_set():
                    dst.sendall(b"".join(held))
                    held.clear()
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    if held:
                        self._linger_held(dst, pair, held)
                    break
                if replies:
                    with self._lock:
                        self._replies[pair] = self._replies.get(pair, 0) + 1
                    fault = self._fault(n)
                    n += 1
                    if fault == "drop":
                        continue
                    if fault == "kill":
                        break
                    if fault is not None:
                        time.sleep(fault)
                elif self.framed:
                    buf += data
                    for frame in self._frames(buf):
                        if held or self._captures(frame):
                            held.append(frame)
                            with self._lock:
                                self.held_requests += 1
                        elif self.hold.is_set() or pending:
                            pending.append(frame)
                        else:
                            dst.sendall(frame)
                    continue
                elif self.hold.is_set() or pending:
                    pending.append(data)
                    with self._lock:
                        self.held += 1
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(pair)

    @staticmethod
    def _frames(buf: bytearray):
        """Take the complete request frames (4-byte size prefix) off the front of ``buf``."""
        while len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big") + 4
            if len(buf) < size:
                return
            frame = bytes(buf[:size])
            del buf[:size]
            yield frame

    def _captures(self, frame: bytes) -> bool:
        capture = self._capture
        return bool(capture) and len(frame) >= 6 and int.from_bytes(frame[4:6], "big", signed=True) in capture

    def _linger_held(self, upstream, pair, held: list) -> None:
        """The client closed a connection with held requests: keep the upstream connection
        until they are released and the broker answered (its replies are dropped)."""
        while not self._releasing.wait(0.2):
            if self.stopped.is_set():
                return
        with self._lock:
            before = self._replies.get(pair, 0)
        upstream.sendall(b"".join(held))
        held.clear()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.stopped.is_set():
            with self._lock:
                if self._replies.get(pair, 0) > before or pair not in self._pairs:
                    self.released_replies += 1
                    return
            time.sleep(0.02)

    def _close(self, pair) -> None:
        with self._lock:
            self._pairs.pop(pair, None)
            self._replies.pop(pair, None)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stop(self) -> None:
        self.stopped.set()
        self._listener.close()
        for t in list(self._threads):
            t.join(2)
