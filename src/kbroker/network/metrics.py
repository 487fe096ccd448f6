"""Plain counters and gauges of the network layer, later exported to Prometheus.

Most counters have exactly one writer thread (a processor's :class:`ProcessorStats`, a
handler's :class:`HandlerStats`), so no locks are taken for them; the response-side
counters of a processor are also written by threads that send a response directly, so
their writers hold ``ProcessorStats.lock``. Readers in other threads see plain ints, and
aggregate on read. Names follow Kafka's JMX metrics
(``kafka.network:type=RequestChannel,name=RequestQueueSize``, ``NetworkProcessorAvgIdlePercent``,
``kafka.server:type=KafkaRequestHandlerPool,name=RequestHandlerAvgIdlePercent``,
``kafka.network:type=RequestMetrics,name=TotalTimeMs,request=...``).
"""
from __future__ import annotations

import threading
import time

#: Fields of :class:`ApiStats` (all times are nanosecond totals), in ``api_totals`` order.
API_FIELD_NAMES = ("count", "total_ns", "request_queue_ns", "handle_ns",
                   "response_queue_ns", "response_send_ns", "bytes_in", "bytes_out")


class ApiStats:
    """Per-api request metrics of one processor (Kafka's RequestMetrics), written under
    ``ProcessorStats.lock``.

    ``total_ns``: received -> send complete (TotalTimeMs); ``request_queue_ns``: received
    -> handler dequeued (RequestQueueTimeMs); ``handle_ns``: handler dequeued -> response
    queued (LocalTimeMs + RemoteTimeMs); ``response_queue_ns``: response queued ->
    processor dequeued (ResponseQueueTimeMs; 0 for a direct send, which has no queue);
    ``response_send_ns``: dequeued -> send complete (ResponseSendTimeMs); ``bytes_in`` /
    ``bytes_out``: request / response frame bytes incl. the size prefix.
    """

    __slots__ = API_FIELD_NAMES

    def __init__(self) -> None:
        self.count = self.total_ns = self.request_queue_ns = self.handle_ns = 0
        self.response_queue_ns = self.response_send_ns = self.bytes_in = self.bytes_out = 0

    def values(self) -> list[int]:
        return [getattr(self, name) for name in API_FIELD_NAMES]


class ProcessorStats:
    """Counters of one network processor.

    Written by that processor's thread, except ``bytes_in``, ``bytes_out``,
    ``responses_sent``, ``responses_no_op``, ``responses_dropped``, ``responses_held``,
    ``requests_received`` and ``api``, which any thread writing a response for that processor (and reading
    ahead or taking the next pipelined request) updates: every writer of those holds
    ``lock``.
    """

    __slots__ = ("processor_id", "started_ns", "idle_ns", "blocked_since_ns",
                 "bytes_in", "bytes_out", "requests_received", "responses_sent",
                 "responses_no_op", "responses_dropped", "connections_created",
                 "connections_closed", "invalid_receives", "idle_closed", "throttled_responses", "api", "lock",
                 "responses_held")

    def __init__(self, processor_id: int) -> None:
        self.processor_id = processor_id
        self.lock = threading.Lock()
        self.started_ns = time.monotonic_ns()
        self.idle_ns = 0               # total time spent blocked in select()
        self.blocked_since_ns = 0      # != 0 while blocked in select()
        self.bytes_in = 0
        self.bytes_out = 0
        self.requests_received = 0
        self.responses_sent = 0
        self.responses_no_op = 0
        self.responses_dropped = 0     # response for a connection that was gone
        self.responses_held = 0        # responses written with a later one (processor.py)
        self.connections_created = 0
        self.connections_closed = 0
        self.invalid_receives = 0      # connections closed for a bad frame
        self.idle_closed = 0           # connections closed by connections.max.idle.ms
        self.throttled_responses = 0   # connections kept muted by a client quota (KIP-219)
        self.api: dict[int, ApiStats] = {}

    def api_stats(self, api_key: int) -> ApiStats:
        s = self.api.get(api_key)
        if s is None:
            s = self.api[api_key] = ApiStats()
        return s

    def current_idle_ns(self, now_ns: int) -> int:
        since = self.blocked_since_ns
        return self.idle_ns + (now_ns - since if since else 0)


class HandlerStats:
    """Counters of one request handler thread. Written only by that thread."""

    __slots__ = ("handler_id", "started_ns", "idle_ns", "blocked_since_ns",
                 "requests_handled", "handler_errors")

    def __init__(self, handler_id: int) -> None:
        self.handler_id = handler_id
        self.started_ns = time.monotonic_ns()
        self.idle_ns = 0              # total time spent waiting on the request queue
        self.blocked_since_ns = 0
        self.requests_handled = 0
        self.handler_errors = 0

    def current_idle_ns(self, now_ns: int) -> int:
        since = self.blocked_since_ns
        return self.idle_ns + (now_ns - since if since else 0)


class _IdleGauge:
    """Average idle fraction of a group of threads since the previous read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, tuple[int, int]] = {}   # id(stats) -> (t_ns, idle_ns)

    def read(self, stats_list: list) -> float:
        now = time.monotonic_ns()
        total_idle = 0
        total_elapsed = 0
        with self._lock:
            last = {}
            for s in stats_list:
                idle = s.current_idle_ns(now)
                t0, idle0 = self._last.get(id(s), (s.started_ns, 0))
                last[id(s)] = (now, idle)
                total_idle += idle - idle0
                total_elapsed += now - t0
            self._last = last
        if total_elapsed <= 0:
            return 1.0
        return min(1.0, max(0.0, total_idle / total_elapsed))


class NetworkMetrics:
    """Registry of the network layer's counters; one per broker.

    Thread-safety: ``processor_stats``/``handler_stats`` are called while threads are
    created; the read methods may be called from any thread at any time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processors: dict[int, ProcessorStats] = {}
        self._handlers: dict[int, HandlerStats] = {}
        self._channel = None
        self._processor_idle = _IdleGauge()
        self._handler_idle = _IdleGauge()

    def bind_channel(self, channel) -> None:
        self._channel = channel

    def processor_stats(self, processor_id: int) -> ProcessorStats:
        with self._lock:
            s = self._processors.get(processor_id)
            if s is None:
                s = self._processors[processor_id] = ProcessorStats(processor_id)
            return s

    def remove_processor(self, processor_id: int) -> None:
        with self._lock:
            self._processors.pop(processor_id, None)

    def handler_stats(self, handler_id: int) -> HandlerStats:
        with self._lock:
            s = self._handlers.get(handler_id)
            if s is None:
                s = self._handlers[handler_id] = HandlerStats(handler_id)
            return s

    def remove_handler(self, handler_id: int) -> None:
        with self._lock:
            self._handlers.pop(handler_id, None)

    # -- gauges ---------------------------------------------------------------------------
    def request_queue_size(self) -> int:
        return self._channel.request_queue_size() if self._channel is not None else 0

    def response_queue_size(self) -> int:
        return self._channel.response_queue_size() if self._channel is not None else 0

    def network_processor_avg_idle_percent(self) -> float:
        """Fraction (0..1) of time processors spent blocked in select, since the last read."""
        with self._lock:
            stats = list(self._processors.values())
        return self._processor_idle.read(stats)

    def request_handler_avg_idle_percent(self) -> float:
        """Fraction (0..1) of time handlers spent waiting for requests, since the last read."""
        with self._lock:
            stats = list(self._handlers.values())
        return self._handler_idle.read(stats)

    # -- counters -------------------------------------------------------------------------
    _PROCESSOR_COUNTERS = ("bytes_in", "bytes_out", "requests_received", "responses_sent",
                           "responses_no_op", "responses_dropped", "connections_created",
                           "connections_closed", "invalid_receives", "idle_closed", "throttled_responses",
                           "responses_held")

    def totals(self) -> dict[str, int]:
        """Sums of all processors' and handlers' counters, plus ``connection_count``."""
        with self._lock:
            procs = list(self._processors.values())
            handlers = list(self._handlers.values())
        out = {name: 0 for name in self._PROCESSOR_COUNTERS}
        for p in procs:
            for name in self._PROCESSOR_COUNTERS:
                out[name] += getattr(p, name)
        out["connection_count"] = out["connections_created"] - out["connections_closed"]
        out["requests_handled"] = sum(h.requests_handled for h in handlers)
        out["handler_errors"] = sum(h.handler_errors for h in handlers)
        return out

    def api_totals(self) -> dict[int, dict[str, int]]:
        """Per api_key sums over processors: see ``API_FIELD_NAMES``."""
        with self._lock:
            procs = list(self._processors.values())
        out: dict[int, list[int]] = {}
        for p in procs:
            for api_key, s in p.api.copy().items():
                acc = out.setdefault(api_key, [0] * len(API_FIELD_NAMES))
                for i, v in enumerate(s.values()):
                    acc[i] += v
        return {k: dict(zip(API_FIELD_NAMES, v)) for k, v in out.items()}

    def snapshot(self) -> dict:
        return {
            "request_queue_size": self.request_queue_size(),
            "response_queue_size": self.response_queue_size(),
            "network_processor_avg_idle_percent": self.network_processor_avg_idle_percent(),
            "request_handler_avg_idle_percent": self.request_handler_avg_idle_percent(),
            **self.totals(),
            "api": self.api_totals(),
        }
