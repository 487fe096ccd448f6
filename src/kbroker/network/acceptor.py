"""Acceptor: one thread per listener that accepts connections and deals them to processors.

Modelled on Kafka's ``Acceptor`` and ``ConnectionQuotas`` in ``core/.../network/SocketServer.scala``.
An accepted socket passes, in Kafka's order:

1. the connection creation rate, broker-wide (``max.connection.creation.rate``; not on the
   inter-broker listener while there are others) and per listener
   (``listener.name.<l>.max.connection.creation.rate``): over it, the acceptor stops accepting
   for the throttle time (the rate's (O - T) / T * W, at most one quota window);
2. the per-IP ``connection_creation_rate`` client quota (entity ``ip``, or the ``ip`` default):
   over it the connection is not counted (nor in the rates of 1.) and is closed once the
   throttle time is over (Kafka's delayed close of a throttled socket);
3. ``max.connections.per.ip`` (and its overrides): over it the connection is closed at once.

``max.connections`` is waited for before accepting (connections wait in the kernel backlog).
"""
from __future__ import annotations

import heapq
import ipaddress
import logging
import selectors
import socket
import threading
import time
from typing import Mapping, Sequence

from kbroker.quota.rate import SampledRate

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1


def normalise_ip(ip: str) -> str:
    """The canonical text of an IP address (IPv4 for an IPv4-mapped IPv6 address, as Java's
    InetAddress does), so that overrides and accepted peers compare equal."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _RateQuota:
    """A connection creation rate and its bound (Kafka: a Rate sensor with a quota)."""
    __slots__ = ("rate", "bound")

    def __init__(self, bound: float, samples: int, window_ms: int):
        self.rate = SampledRate(samples, window_ms)
        self.bound = float(bound)

    def record(self, now_ms: int, max_throttle_ms: int) -> int:
        """Count one connection; the throttle time if that puts the rate over its bound
        (Kafka's QuotaUtils.boundedThrottleTime), else 0."""
        self.rate.record(1.0, now_ms)
        rate = self.rate.measure(now_ms)
        if rate <= self.bound:
            return 0
        window = self.rate.window_size_ms(now_ms)
        return min(round((rate - self.bound) / self.bound * window), max_throttle_ms)

    def unrecord(self, now_ms: int) -> None:
        self.rate.record(-1.0, now_ms)


class ConnectionQuotas:
    """Broker-wide connection count (``max.connections``) and per-IP count
    (``max.connections.per.ip``, with ``max.connections.per.ip.overrides``: normalised
    IP -> limit, Kafka's ``ConnectionQuotas``; a limit of 0 refuses every connection from
    that IP), and the connection creation rates (broker-wide, per listener, per IP; see the
    module docstring).

    Thread-safety: all methods are safe from any thread; ``_cond`` guards the counts and
    the rates. Acceptors ``inc`` before handing a socket to a processor; the processor that owns
    the socket calls ``dec`` exactly once when it closes it (or the acceptor does, if no
    processor took it). Invariant: ``total == sum(per_ip.values())``.
    """

    def __init__(self, max_connections: int = INT32_MAX,
                 max_connections_per_ip: int = INT32_MAX,
                 max_connections_per_ip_overrides: Mapping[str, int] | None = None, *,
                 max_connection_creation_rate: int = INT32_MAX,
                 listener_connection_creation_rates: Mapping[str, int] | None = None,
                 inter_broker_listener: str | None = None, listener_count: int = 1,
                 quota_window_num: int = 11, quota_window_size_s: int = 1,
                 clock_ms=_monotonic_ms) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.overrides = {normalise_ip(ip): n
                          for ip, n in (max_connections_per_ip_overrides or {}).items()}
        self._cond = threading.Condition(threading.Lock())
        self.total = 0
        self._per_ip: dict[str, int] = {}
        self._samples = quota_window_num
        self._window_ms = quota_window_size_s * 1000
        #: Kafka's maxThrottleTimeMs: a connection is never held longer than one quota window
        self.max_throttle_ms = self._window_ms
        self._clock_ms = clock_ms
        self._broker_rate = _RateQuota(max_connection_creation_rate, self._samples, self._window_ms)
        self._listener_rates = {name.upper(): _RateQuota(r, self._samples, self._window_ms)
                                for name, r in (listener_connection_creation_rates or {}).items()}
        # Kafka's protectedListener: the inter-broker listener, when it is not the only one
        self._protected = (inter_broker_listener.upper()
                           if inter_broker_listener and listener_count > 1 else None)
        #: connection_creation_rate client quotas: IP -> rate, and the <default> IP's (None: none)
        self._ip_rate_default: int | None = None
        self._ip_rates: dict[str, int] = {}
        self._ip_sensors: dict[str, _RateQuota] = {}

    def wait_for_slot(self, timeout_s: float) -> bool:
        """Block until ``total < max_connections`` (Kafka's ``waitForConnectionSlot``)."""
        with self._cond:
            if self.total < self.max_connections:
                return True
            return self._cond.wait_for(lambda: self.total < self.max_connections, timeout_s)

    def max_for(self, ip: str) -> int:
        """The connection limit of ``ip``: its override, else ``max.connections.per.ip``."""
        if self.overrides:
            return self.overrides.get(normalise_ip(ip), self.max_connections_per_ip)
        return self.max_connections_per_ip

    def inc(self, ip: str) -> bool:
        """Count a new connection; ``False`` (nothing counted) if its IP is over quota."""
        limit = self.max_for(ip)
        with self._cond:
            n = self._per_ip.get(ip, 0)
            if n >= limit:
                return False
            self._per_ip[ip] = n + 1
            self.total += 1
            return True

    def dec(self, ip: str) -> None:
        with self._cond:
            n = self._per_ip.get(ip, 0)
            if n <= 0:
                log.error("connection count for %s would go negative", ip)
                return
            if n == 1:
                del self._per_ip[ip]
            else:
                self._per_ip[ip] = n - 1
            self.total -= 1
            self._cond.notify_all()

    def get(self, ip: str) -> int:
        with self._cond:
            return self._per_ip.get(ip, 0)

    # -- creation rates ---------------------------------------------------------------------------
    def record_connection_and_get_throttle_ms(self, listener: str, now_ms: int | None = None) -> int:
        """Count a new connection on ``listener`` in the broker-wide (unless the listener is
        protected) and the listener's creation rate; the longer throttle time, or 0 (Kafka's
        recordConnectionAndGetThrottleTimeMs: the acceptor waits that long)."""
        now = self._clock_ms() if now_ms is None else now_ms
        listener = listener.upper()
        with self._cond:
            throttle = 0
            if listener != self._protected:
                throttle = self._broker_rate.record(now, self.max_throttle_ms)
            lq = self._listener_rates.get(listener)
            if lq is not None:
                throttle = max(throttle, lq.record(now, self.max_throttle_ms))
            return throttle

    def connection_rate_for_ip(self, ip: str) -> int | None:
        """The ``connection_creation_rate`` quota of ``ip`` (its own, else the default), or None."""
        r = self._ip_rates.get(normalise_ip(ip))
        return self._ip_rate_default if r is None else r

    def record_ip_connection_and_get_throttle_ms(self, listener: str, ip: str, now_ms: int | None = None) -> int:
        """Count a new connection from ``ip`` against its ``connection_creation_rate``; over it,
        take the connection back out of every rate it was counted in and return the throttle
        time (the acceptor closes the socket when it is over), else 0 (Kafka's
        recordIpConnectionMaybeThrottle)."""
        bound = self.connection_rate_for_ip(ip)
        if bound is None:
            return 0
        now = self._clock_ms() if now_ms is None else now_ms
        ip = normalise_ip(ip)
        listener = listener.upper()
        with self._cond:
            q = self._ip_sensors.get(ip)
            if q is None:
                q = self._ip_sensors[ip] = _RateQuota(bound, self._samples, self._window_ms)
            q.bound = float(bound)
            throttle = q.record(now, self.max_throttle_ms)
            if throttle:
                q.unrecord(now)
                if listener != self._protected:
                    self._broker_rate.unrecord(now)
                lq = self._listener_rates.get(listener)
                if lq is not None:
                    lq.unrecord(now)
            return throttle

    def update_ip_quotas(self, quotas: Mapping) -> None:
        """Take the ``connection_creation_rate`` quotas of ``ip`` entities from a client quota
        map (entity key ((type, name | None), ...) -> {key: value}); a sensor of an IP that
        has none any more is dropped (its rate restarts if one is set again)."""
        default, rates = None, {}
        for key, values in quotas.items():
            v = values.get("connection_creation_rate")
            d = dict(key)
            if v is None or set(d) != {"ip"}:
                continue
            name = d["ip"]
            if name is None:
                default = int(v)
            else:
                rates[normalise_ip(name)] = int(v)
        with self._cond:
            self._ip_rate_default = default
            self._ip_rates = rates
            if default is None:
                for ip in [ip for ip in self._ip_sensors if ip not in rates]:
                    del self._ip_sensors[ip]


class Acceptor(threading.Thread):
    """Accepts connections on one listener's server socket.

    Each accepted socket gets ``TCP_NODELAY`` and the configured buffer sizes, is counted
    in :class:`ConnectionQuotas`, and is handed to the next processor round-robin. When
    ``max.connections`` is reached the acceptor stops accepting (connections wait in the
    kernel backlog) until a processor closes one; over a creation rate it waits the throttle
    time; a socket refused by its IP's creation rate is kept (unread) in ``_delayed_close``
    until its throttle time is over, then closed.

    Thread-safety: the server socket is owned by this thread once started;
    :meth:`shutdown` may be called from any thread.
    """

    def __init__(self, listener_name: str, server_socket: socket.socket,
                 processors: Sequence, quotas: ConnectionQuotas, *,
                 send_buffer_bytes: int = 102400, receive_buffer_bytes: int = 102400) -> None:
        super().__init__(name=f"kbroker-acceptor-{listener_name}", daemon=True)
        self.listener_name = listener_name
        self._server_socket = server_socket
        self._processors = list(processors)
        self._quotas = quotas
        self._send_buffer_bytes = send_buffer_bytes
        self._receive_buffer_bytes = receive_buffer_bytes
        self._next_processor = 0
        self._running = True
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = threading.Event()
        #: heap of (close at, monotonic ns; seq; socket): IP-throttled sockets (this thread's)
        self._delayed_close: list = []
        self._seq = 0

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            self._server_socket.setblocking(False)
            sel.register(self._server_socket, selectors.EVENT_READ, "accept")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            while self._running:
                self._close_throttled()
                if not self._quotas.wait_for_slot(0.3):
                    continue
                timeout = None      # shutdown wakes the select through _wake_w
                if self._delayed_close:
                    timeout = max(0.0, (self._delayed_close[0][0] - time.monotonic_ns()) / 1e9)
                for key, _ in sel.select(timeout):
                    if key.data == "wake":
                        _drain(self._wake_r)
                    elif self._running:
                        self._accept_all()
        except Exception:
            log.exception("acceptor %s died", self.listener_name)
        finally:
            sel.close()
            for _, _, sock in self._delayed_close:
                sock.close()
            self._delayed_close.clear()
            self._server_socket.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept_all(self) -> None:
        # Accept until EAGAIN or until max.connections is reached.
        while self._running and self._quotas.wait_for_slot(0):
            try:
                sock, addr = self._server_socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                # EMFILE/ENFILE/ECONNABORTED: log and keep serving.
                log.warning("acceptor %s: accept failed: %s", self.listener_name, e)
                return
            ip = addr[0]
            throttle_ms = self._quotas.record_connection_and_get_throttle_ms(self.listener_name)
            if throttle_ms > 0:
                # Kafka's waitForConnectionSlot: the acceptor takes no connection for that long
                log.debug("acceptor %s: connection creation rate over quota, waiting %d ms",
                          self.listener_name, throttle_ms)
                if self._stopping.wait(throttle_ms / 1000):
                    sock.close()
                    return
            ip_throttle_ms = self._quotas.record_ip_connection_and_get_throttle_ms(self.listener_name, ip)
            if ip_throttle_ms > 0:
                log.debug("acceptor %s: %s over its connection_creation_rate; closing its connection in %d ms",
                          self.listener_name, ip, ip_throttle_ms)
                self._seq += 1
                heapq.heappush(self._delayed_close,
                               (time.monotonic_ns() + ip_throttle_ms * 1_000_000, self._seq, sock))
                continue
            if not self._quotas.inc(ip):
                log.info("rejecting connection from %s: its limit of %d connections "
                         "(max.connections.per.ip / max.connections.per.ip.overrides) is reached",
                         ip, self._quotas.max_for(ip))
                sock.close()
                continue
            try:
                self._configure(sock)
            except OSError as e:
                log.debug("acceptor %s: configuring %s failed: %s", self.listener_name, addr, e)
                sock.close()
                self._quotas.dec(ip)
                continue
            self._assign(sock, addr)

    def _close_throttled(self) -> None:
        now = time.monotonic_ns()
        while self._delayed_close and self._delayed_close[0][0] <= now:
            heapq.heappop(self._delayed_close)[2].close()

    def _configure(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
        if self._receive_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer_bytes)

    def _assign(self, sock: socket.socket, addr) -> None:
        """Round-robin; if every processor's hand-over queue is full, wait on the next one
        (Kafka's ``assignNewConnection`` blocks on the last try too)."""
        n = len(self._processors)
        for attempt in range(n):
            processor = self._processors[self._next_processor]
            self._next_processor = (self._next_processor + 1) % n
            if processor.accept(sock, addr):
                return
        while self._running:
            if processor.accept(sock, addr, timeout_s=0.3):
                return
        log.debug("acceptor %s: shutting down; closing %s", self.listener_name, addr)
        sock.close()
        self._quotas.dec(addr[0])

    def shutdown(self) -> None:
        """Stop accepting and close the server socket (the thread does it); then join."""
        self._running = False
        self._stopping.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        if self.is_alive():
            self.join()


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass
