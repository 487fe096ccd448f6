"""Acceptor: one thread per listener that accepts connections and deals them to processors.

Modelled on Kafka's ``Acceptor`` and ``ConnectionQuotas`` in ``core/.../network/SocketServer.scala``.
"""
from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import threading
from typing import Mapping, Sequence

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


class ConnectionQuotas:
    """Broker-wide connection count (``max.connections``) and per-IP count
    (``max.connections.per.ip``, with ``max.connections.per.ip.overrides``: normalised
    IP -> limit, Kafka's ``ConnectionQuotas``; a limit of 0 refuses every connection from
    that IP).

    Thread-safety: all methods are safe from any thread; ``_cond`` guards the counts.
    Acceptors ``inc`` before handing a socket to a processor; the processor that owns
    the socket calls ``dec`` exactly once when it closes it (or the acceptor does, if no
    processor took it). Invariant: ``total == sum(per_ip.values())``.
    """

    def __init__(self, max_connections: int = INT32_MAX,
                 max_connections_per_ip: int = INT32_MAX,
                 max_connections_per_ip_overrides: Mapping[str, int] | None = None) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.overrides = {normalise_ip(ip): n
                          for ip, n in (max_connections_per_ip_overrides or {}).items()}
        self._cond = threading.Condition(threading.Lock())
        self.total = 0
        self._per_ip: dict[str, int] = {}

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


class Acceptor(threading.Thread):
    """Accepts connections on one listener's server socket.

    Each accepted socket gets ``TCP_NODELAY`` and the configured buffer sizes, is counted
    in :class:`ConnectionQuotas`, and is handed to the next processor round-robin. When
    ``max.connections`` is reached the acceptor stops accepting (connections wait in the
    kernel backlog) until a processor closes one.

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

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            self._server_socket.setblocking(False)
            sel.register(self._server_socket, selectors.EVENT_READ, "accept")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            while self._running:
                if not self._quotas.wait_for_slot(0.3):
                    continue
                for key, _ in sel.select(0.5):
                    if key.data == "wake":
                        _drain(self._wake_r)
                    elif self._running:
                        self._accept_all()
        except Exception:
            log.exception("acceptor %s died", self.listener_name)
        finally:
            sel.close()
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
