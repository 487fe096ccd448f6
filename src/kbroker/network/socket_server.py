"""SocketServer: the broker's network front end (Kafka's ``core/.../network/SocketServer.scala``).

Threads: one :class:`~kbroker.network.acceptor.Acceptor` per listener, and per listener
``num.network.threads`` :class:`~kbroker.network.processor.Processor` s (processor ids are
unique across listeners). Processors hand requests to the
:class:`~kbroker.network.channel.RequestChannel`; request handler threads
(:class:`kbroker.server.request_handler.KafkaRequestHandlerPool`) take them from there.

Lifecycle: ``start()`` binds every listener (port 0 picks a free port; see
:meth:`bound_port`) and starts the threads; ``stop()`` stops accepting, lets responses to
in-flight requests drain for up to ``drain_timeout_s``, closes every socket and joins
every thread. Stop the handler pool after the socket server (Kafka's order in
``KafkaServer.shutdown``), so that in-flight requests can still be answered while draining.

Bounded memory: the SocketServer owns the broker's one
:class:`~kbroker.network.memory_pool.MemoryPool` (``queued.max.request.bytes`` > 0;
none otherwise, Kafka's default), shared by all processors, and the
:class:`~kbroker.network.acceptor.ConnectionQuotas` (``max.connections``,
``max.connections.per.ip`` and its overrides, the connection creation rates; the broker's
QuotaManagers feed it the per-IP ``connection_creation_rate`` quotas) shared by all
acceptors and processors.
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from typing import Mapping, Optional, Sequence

from kbroker.network.acceptor import INT32_MAX, Acceptor, ConnectionQuotas
from kbroker.network.channel import RequestChannel
from kbroker.network.memory_pool import MemoryPool
from kbroker.network.metrics import NetworkMetrics
from kbroker.network.processor import Processor

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Listener:
    """One ``listeners`` entry: ``NAME://host:port`` (its security: ``SocketServerConfig.listener_security``)."""

    name: str
    host: str
    port: int

    @classmethod
    def parse(cls, spec: str) -> "Listener":
        """Parse ``PLAINTEXT://127.0.0.1:9092`` / ``NAME://[::1]:0`` / ``NAME://:9092``."""
        name, sep, rest = spec.strip().partition("://")
        if not sep or not name:
            raise ValueError(f"listener {spec!r} is not NAME://host:port")
        host, sep, port = rest.rpartition(":")
        if not sep:
            raise ValueError(f"listener {spec!r} has no port")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return cls(name.upper(), host, int(port))

    @classmethod
    def parse_list(cls, specs: str | Sequence[str]) -> list["Listener"]:
        """From ``"A://h:1,B://h:2"``, a list of such strings, or objects with
        ``name``/``host``/``port`` (e.g. ``kbroker.server.config.Listener``)."""
        if isinstance(specs, str):
            specs = [s for s in specs.split(",") if s.strip()]
        listeners = [cls.parse(s) if isinstance(s, str) else cls(s.name.upper(), s.host, s.port)
                     for s in specs]
        names = [l.name for l in listeners]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate listener names in {specs!r}")
        return listeners


@dataclasses.dataclass
class SocketServerConfig:
    """Kafka broker configs of the network layer (Kafka's names, snake_case, Kafka's defaults)."""

    listeners: str | Sequence[str] = "PLAINTEXT://:9092"
    num_network_threads: int = 3
    queued_max_requests: int = 500
    socket_request_max_bytes: int = 104857600
    socket_send_buffer_bytes: int = 102400       # -1: OS default
    socket_receive_buffer_bytes: int = 102400    # -1: OS default
    socket_listen_backlog_size: int = 50
    connections_max_idle_ms: int = 600000        # < 0: never close idle connections
    max_connections: int = INT32_MAX
    max_connections_per_ip: int = INT32_MAX
    #: IP address (normalised: ``ipaddress`` text, IPv4 for v4-mapped IPv6) -> its limit
    max_connections_per_ip_overrides: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: new connections per second (Kafka's max.connection.creation.rate; per listener: name -> rate)
    max_connection_creation_rate: int = INT32_MAX
    listener_connection_creation_rates: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: exempt from the broker-wide creation rate when there are other listeners (Kafka's protectedListener)
    inter_broker_listener: Optional[str] = None
    #: the rates' windows (quota.window.num x quota.window.size.seconds)
    quota_window_num: int = 11
    quota_window_size_s: int = 1
    #: broker-wide bytes of requests in flight; <= 0: unbounded (Kafka's default, -1)
    queued_max_request_bytes: int = -1
    #: listener name -> kbroker.security.config.ListenerSecurity; a listener not here is PLAINTEXT
    listener_security: Mapping[str, object] = dataclasses.field(default_factory=dict)


class SocketServer:
    """Acceptors + processors of all listeners, sharing one RequestChannel.

    Thread-safety: ``start``/``stop`` from one controlling thread; the gauges from any.
    """

    def __init__(self, config: SocketServerConfig | None = None,
                 channel: RequestChannel | None = None,
                 metrics: NetworkMetrics | None = None) -> None:
        self.config = config = config or SocketServerConfig()
        if config.num_network_threads < 1:
            raise ValueError("num.network.threads must be >= 1")
        self.listeners = Listener.parse_list(config.listeners)
        self.channel = channel or RequestChannel(config.queued_max_requests)
        self.metrics = metrics or NetworkMetrics()
        self.metrics.bind_channel(self.channel)
        self.quotas = ConnectionQuotas(
            config.max_connections, config.max_connections_per_ip, config.max_connections_per_ip_overrides,
            max_connection_creation_rate=config.max_connection_creation_rate,
            listener_connection_creation_rates=config.listener_connection_creation_rates,
            inter_broker_listener=config.inter_broker_listener, listener_count=len(self.listeners),
            quota_window_num=config.quota_window_num, quota_window_size_s=config.quota_window_size_s)
        # Kafka: new SimpleMemoryPool(queued.max.request.bytes, socket.request.max.bytes,
        # strict = false) when > 0, else MemoryPool.NONE. ValueError if smaller than
        # socket.request.max.bytes (KafkaConfig refuses that at start-up).
        self.memory_pool: Optional[MemoryPool] = (
            MemoryPool(config.queued_max_request_bytes, config.socket_request_max_bytes)
            if config.queued_max_request_bytes > 0 else None)
        self.acceptors: dict[str, Acceptor] = {}
        self.processors: list[Processor] = []
        self._bound: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

    def start(self) -> None:
        """Bind all listeners, then start processors and acceptors."""
        with self._lock:
            if self._started:
                raise RuntimeError("SocketServer already started")
            self._started = True
            sockets = []
            try:
                for listener in self.listeners:
                    sockets.append(self._open_server_socket(listener))
            except BaseException:
                for s in sockets:
                    s.close()
                raise
            next_id = 0
            for listener, server_socket in zip(self.listeners, sockets):
                self._bound[listener.name] = server_socket.getsockname()[:2]
                processors = []
                for _ in range(self.config.num_network_threads):
                    p = Processor(next_id, self.channel, listener.name,
                                  self.metrics.processor_stats(next_id), self.quotas,
                                  max_request_size=self.config.socket_request_max_bytes,
                                  connections_max_idle_ms=self.config.connections_max_idle_ms,
                                  memory_pool=self.memory_pool,
                                  security=self.config.listener_security.get(listener.name))
                    next_id += 1
                    self.channel.add_processor(p.processor_id, p)
                    processors.append(p)
                self.processors.extend(processors)
                self.acceptors[listener.name] = Acceptor(
                    listener.name, server_socket, processors, self.quotas,
                    send_buffer_bytes=self.config.socket_send_buffer_bytes,
                    receive_buffer_bytes=self.config.socket_receive_buffer_bytes)
            for p in self.processors:
                p.start()
            for a in self.acceptors.values():
                a.start()
            log.info("socket server listening on %s", ", ".join(
                f"{name}://{host}:{port}" for name, (host, port) in self._bound.items()))

    def _open_server_socket(self, listener: Listener) -> socket.socket:
        host = listener.host
        infos = socket.getaddrinfo(host or None, listener.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        # Empty host binds all interfaces (Kafka: "PLAINTEXT://:9092"); prefer IPv4 there.
        if not host:
            infos.sort(key=lambda i: i[0] != socket.AF_INET)
        family, type_, proto, _, addr = infos[0]
        s = socket.socket(family, type_, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.config.socket_receive_buffer_bytes > 0:
                # Must be set on the listening socket to affect the TCP window scale.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF,
                             self.config.socket_receive_buffer_bytes)
            s.bind(addr)
            s.listen(self.config.socket_listen_backlog_size)
        except OSError as e:
            s.close()
            raise OSError(e.errno, f"Socket server failed to bind to {host}:{listener.port}: "
                                   f"{e.strerror}") from e
        return s

    def bound_port(self, listener_name: Optional[str] = None) -> int:
        """Port a listener is bound to (the real one when configured with port 0)."""
        return self.bound_address(listener_name)[1]

    def bound_address(self, listener_name: Optional[str] = None) -> tuple[str, int]:
        if not self._bound:
            raise RuntimeError("SocketServer not started")
        if listener_name is None:
            listener_name = self.listeners[0].name
        return self._bound[listener_name.upper()]

    def stop(self, drain_timeout_s: float = 1.0) -> None:
        """Stop accepting; drain in-flight responses for up to ``drain_timeout_s``;
        close all sockets; join all threads. Idempotent."""
        with self._lock:
            if not self._started or self._stopped:
                self._stopped = True
                return
            self._stopped = True
            for a in self.acceptors.values():
                a.shutdown()
            for p in self.processors:
                p.begin_shutdown(drain_timeout_s)
            for p in self.processors:
                if p.is_alive():
                    p.join()
                self.channel.remove_processor(p.processor_id)
            log.info("socket server stopped")

    def threads(self) -> list[threading.Thread]:
        return [*self.acceptors.values(), *self.processors]

    # -- gauges -----------------------------------------------------------------------------
    def connection_count(self) -> int:
        return self.quotas.total

    def memory_pool_available(self) -> int:
        """Kafka's ``MemoryPoolAvailable`` (LONG_MAX without a pool, as MemoryPool.NONE)."""
        pool = self.memory_pool
        return pool.available if pool is not None else 2**63 - 1

    def memory_pool_used(self) -> int:
        """Kafka's ``MemoryPoolUsed``: request bytes taken from the pool (0 without one)."""
        pool = self.memory_pool
        return pool.used if pool is not None else 0

    def __enter__(self) -> "SocketServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
