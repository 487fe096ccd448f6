"""KafkaRequestHandlerPool: the I/O threads (Kafka's ``core/.../server/KafkaRequestHandler.scala``).

``num.io.threads`` threads take requests from the
:class:`~kbroker.network.channel.RequestChannel` and call the injected
``handle(request) -> None``. ``handle`` must eventually answer every request exactly once
through the channel (``send_response``, ``send_no_op_response`` or ``close_connection``),
from this thread or any other later (e.g. a delayed operation completing in the
purgatory); until it does, the request's connection stays muted. If ``handle`` raises,
the error is logged and the connection is closed, so the client is never left waiting.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kbroker.network.channel import SHUTDOWN, Request, RequestChannel
from kbroker.network.metrics import HandlerStats, NetworkMetrics

log = logging.getLogger(__name__)

_monotonic_ns = time.monotonic_ns


class KafkaRequestHandler(threading.Thread):
    """One I/O thread. Its :class:`HandlerStats` is written only by itself."""

    def __init__(self, handler_id: int, channel: RequestChannel,
                 handle: Callable[[Request], None], stats: HandlerStats,
                 name_prefix: str = "kbroker-request-handler") -> None:
        super().__init__(name=f"{name_prefix}-{handler_id}", daemon=True)
        self.handler_id = handler_id
        self._channel = channel
        self._handle = handle
        self._stats = stats

    def run(self) -> None:
        channel = self._channel
        handle = self._handle
        stats = self._stats
        receive = channel.receive_request
        next_request = channel.next_request
        channel.register_handler_thread()
        while True:
            # A pipelined request this thread took while answering the previous one
            # (its next slot) needs no wait: one clock read, no idle time.
            request = next_request()
            if request is None:
                t0 = _monotonic_ns()
                stats.blocked_since_ns = t0
                request = receive()     # no timeout: shutdown hands each thread SHUTDOWN
                t1 = _monotonic_ns()
                stats.blocked_since_ns = 0
                stats.idle_ns += t1 - t0
                if request is None:
                    continue
                if request is SHUTDOWN:
                    break
            else:
                t1 = _monotonic_ns()
            request.dequeued_ns = t1
            stats.requests_handled += 1
            try:
                handle(request)
                conn = request.connection
                if (conn is not None and conn.held is not None and conn.inflight is request
                        and not request.response_queued_ns):
                    # answered later (a purgatory): earlier answers held back for it go now
                    channel.flush_held(request)
            except Exception:
                stats.handler_errors += 1
                log.exception("handler %d: error handling %r; closing its connection",
                              self.handler_id, request)
                channel.close_connection(request)
            except BaseException:
                log.exception("handler %d: fatal error handling %r", self.handler_id, request)
                channel.close_connection(request)
                raise


class KafkaRequestHandlerPool:
    """``num.io.threads`` :class:`KafkaRequestHandler` threads sharing one channel.

    Thread-safety: ``start``/``shutdown`` from one controlling thread.
    """

    def __init__(self, channel: RequestChannel, handle: Callable[[Request], None],
                 num_io_threads: int = 8, metrics: NetworkMetrics | None = None,
                 name_prefix: str = "kbroker-request-handler") -> None:
        if num_io_threads < 1:
            raise ValueError("num.io.threads must be >= 1")
        self.channel = channel
        self.metrics = metrics or NetworkMetrics()
        self.threads: list[KafkaRequestHandler] = [
            KafkaRequestHandler(i, channel, handle, self.metrics.handler_stats(i), name_prefix)
            for i in range(num_io_threads)
        ]
        self._started = False

    def start(self) -> None:
        if self._started:
            raise RuntimeError("KafkaRequestHandlerPool already started")
        self._started = True
        for t in self.threads:
            t.start()

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Make every thread exit after its current request; join them.

        Requests still queued behind the shutdown markers are not handled.
        """
        for _ in self.threads:
            self.channel.send_shutdown_request()
        for t in self.threads:
            if t.is_alive():
                t.join(timeout_s)
        self.channel.clear()
        log.info("request handler pool shut down")
