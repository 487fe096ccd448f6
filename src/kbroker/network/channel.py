"""RequestChannel: the only handoff between network processors and request handlers.

Modelled on Kafka's ``core/.../network/RequestChannel.scala``.

Data flow::

    Processor thread --try_send_request--> [shared bounded request queue] --receive_request--> handler thread
    any thread ------send_response-------> [per-processor response queue] ------------------> Processor thread

* The request queue is shared by all processors and bounded by ``queued.max.requests``
  (default 500). When it is full, :meth:`RequestChannel.try_send_request` refuses the
  request and remembers the processor; that processor keeps the request and stops reading
  from its sockets until a handler takes a request off the queue and wakes it (back-pressure;
  Kafka blocks the processor in ``ArrayBlockingQueue.put`` instead, which also stops it
  from writing responses — ours keeps writing).
* Each processor owns one response queue (a ``deque`` inside the processor). Responses may
  be sent from any thread at any later time (handler threads, purgatory expiry, timer
  threads); the processor drops a response whose connection has gone away. When the
  connection is waiting for exactly that response, the processor writes it on the
  responding thread instead (the *direct send*, see ``processor.py``).

Frames: ``Request.payload`` is the whole request frame after its 4-byte size prefix
(request header + body). The parts given to ``send_response`` are the whole response
frame *including* its size prefix (int32 size, response header, body), as
``kbroker.protocol.frames.encode_response_parts`` returns it; the processor checks that
the prefix equals the bytes that follow and closes the connection if not.
"""
from __future__ import annotations

import collections
import logging
import struct
import threading
import time
from typing import Iterable, Protocol, Sequence, Union

from kbroker.records.region import FileRegion

log = logging.getLogger(__name__)

#: Bytes of the request header that every Kafka request header version shares:
#: ``request_api_key int16, request_api_version int16, correlation_id int32``.
REQUEST_HEADER_PREFIX_SIZE = 8

_monotonic_ns = time.monotonic_ns
_unpack_header_prefix = struct.Struct(">hhi").unpack_from

#: ``Request.api_key`` of a bare SASL token frame (SaslHandshake v0 framing): it has no header.
#: Outside int16, so no request a client sends (api key -1 included) can pass for one.
RAW_SASL_TOKEN = -(1 << 16)

BytesLike = Union[bytes, bytearray, memoryview]
ResponsePart = Union[bytes, bytearray, memoryview, FileRegion]


class Request:
    """One request frame read from a connection, plus its timing marks.

    ``payload`` is a memoryview over the whole frame after the 4-byte size prefix, a
    writable buffer that belongs to this request. Only the first 8 bytes are parsed here.

    Timestamps are ``time.monotonic_ns()`` values, set by the owner of each stage:
    ``received_ns`` (processor, frame complete), ``dequeued_ns`` (handler thread took it),
    ``response_queued_ns`` (``send_response`` called), ``response_dequeued_ns``
    (a thread started writing the response), ``send_complete_ns`` (last byte handed to
    the kernel).

    ``connection`` is the processor's own object for the request's connection (opaque
    here; None for requests made elsewhere): it lets the processor write the response on
    the responding thread.

    ``api_key`` is :data:`RAW_SASL_TOKEN` for a bare SASL token (``payload`` is the token).

    ``pool_bytes``: bytes of the broker's memory pool (``queued.max.request.bytes``) this
    request holds, returned once by the network layer when the request is done (see
    ``memory_pool.py``); 0 when there is no pool or after the return.
    """

    __slots__ = (
        "processor_id", "connection_id", "listener_name", "client_address",
        "api_key", "api_version", "correlation_id", "payload",
        "received_ns", "dequeued_ns", "response_queued_ns",
        "response_dequeued_ns", "send_complete_ns", "connection", "pool_bytes",
    )

    def __init__(self, processor_id: int, connection_id: str, listener_name: str,
                 client_address: tuple, payload: memoryview, received_ns: int,
                 raw_sasl_token: bool = False) -> None:
        self.processor_id = processor_id
        self.connection_id = connection_id
        self.listener_name = listener_name
        self.client_address = client_address
        if raw_sasl_token:
            # A bare SASL token after SaslHandshake v0: no request header at all.
            self.api_key, self.api_version, self.correlation_id = RAW_SASL_TOKEN, 0, 0
        else:
            self.api_key, self.api_version, self.correlation_id = _unpack_header_prefix(payload, 0)
        self.payload = payload
        self.received_ns = received_ns
        self.dequeued_ns = 0
        self.response_queued_ns = 0
        self.response_dequeued_ns = 0
        self.send_complete_ns = 0
        self.connection = None
        self.pool_bytes = 0

    def __repr__(self) -> str:
        return (f"Request(api_key={self.api_key}, api_version={self.api_version}, "
                f"correlation_id={self.correlation_id}, connection_id={self.connection_id!r}, "
                f"processor_id={self.processor_id}, size={self.payload.nbytes})")


class Response:
    """What a handler wants done with a request's connection.

    ``kind`` is one of :data:`SEND` (write ``parts``, a size-prefixed frame, then unmute),
    :data:`NO_OP` (write nothing, unmute: e.g. produce with acks=0) or :data:`CLOSE`
    (close the connection). ``parts`` (SEND only) are bytes-like objects and
    :class:`~kbroker.records.region.FileRegion` s, written in order without joining.
    ``throttle_ms`` > 0 (a client quota was violated, KIP-219): the connection stays muted
    for that long after the response is written (or, NO_OP, from now).
    """

    __slots__ = ("request", "kind", "parts", "throttle_ms")

    SEND = 0
    NO_OP = 1
    CLOSE = 2

    def __init__(self, request: Request, kind: int, parts: list | None = None, throttle_ms: int = 0) -> None:
        self.request = request
        self.kind = kind
        self.parts = parts
        self.throttle_ms = throttle_ms

    def __repr__(self) -> str:
        kind = ("SEND", "NO_OP", "CLOSE")[self.kind]
        return f"Response({kind}, {self.request!r})"


class ResponseSink(Protocol):
    """What a processor offers the channel."""

    def enqueue_response(self, response: Response) -> None: ...

    def send_response(self, request: Request, parts: list, throttle_ms: int) -> None:
        """``enqueue_response`` of a SEND response (which it may never need to make)."""

    def wakeup(self) -> None: ...

    def response_queue_size(self) -> int: ...


class _Shutdown:
    __slots__ = ()

    def __repr__(self) -> str:
        return "SHUTDOWN"


#: Sentinel returned by :meth:`RequestChannel.receive_request` to make a handler exit.
SHUTDOWN = _Shutdown()


class _IdleHandler:
    """A handler thread blocked in :meth:`RequestChannel.receive_request`: ``lock`` is
    held until a request is put in ``item`` for it."""

    __slots__ = ("lock", "item")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.item = None


class RequestChannel:
    """Bounded request queue shared by all processors, and routing of responses.

    A request goes straight to a handler thread that is waiting, if there is one
    (the one that became idle last, whose stack and caches are warm), else to the
    FIFO queue. One request wakes exactly one thread: a ``queue.SimpleQueue`` shared by
    several waiting threads passes its internal lock on, waking a second thread (and a
    GIL hand-over) per request just to find the queue empty again; measured with
    num.io.threads=8 that was ~5 context switches per request instead of ~1.

    A handler thread that answers a request may queue the next request of the same
    connection (a pipelined frame already read, see ``Processor._send_directly``) for
    itself: :meth:`try_send_request` with ``to_caller=True`` keeps it in that thread's
    *next* slot, which its next :meth:`receive_request` (or :meth:`next_request`)
    returns, when the queue is empty (so it overtakes nothing) and below its bound. Such
    a request is not queued, so it is not counted in ``_size`` (nor in
    RequestQueueSize), and no lock is taken for it; nothing is woken, so a pipelining
    connection is served back to back without a thread hand-over per request. Other
    threads (purgatory reapers, timers) queue as usual.

    Thread-safety: every method may be called from any thread. ``_lock`` guards the
    queue, ``_idle`` (waiting handlers, most recently idle last), ``_size`` (requests
    in the queue: Kafka's RequestQueueSize) and ``_waiters`` (processors refused since
    the last dequeue). A next slot (``_local.next``) and a thread's own
    ``_IdleHandler`` (``_local.idle``) are touched only by that thread (and the putter
    that pops the handler from ``_idle`` under ``_lock``).
    Invariant: ``0 <= _size <= queue_size``, and ``_idle`` is empty unless the queue
    is; shutdown sentinels, requests handed straight to a waiting thread and next
    slots are not counted (each handler thread holds at most one of either).
    """

    def __init__(self, queue_size: int = 500) -> None:
        if queue_size < 1:
            raise ValueError(f"queued.max.requests must be >= 1, got {queue_size}")
        self.queue_size = queue_size
        self._queue: collections.deque = collections.deque()
        self._idle: list[_IdleHandler] = []
        self._lock = threading.Lock()
        self._size = 0
        self._waiters: list[ResponseSink] = []
        self._processors: dict[int, ResponseSink] = {}
        self._local = threading.local()       # .next: a handler thread's next slot

    # -- processors -------------------------------------------------------------------
    def add_processor(self, processor_id: int, processor: ResponseSink) -> None:
        if processor_id in self._processors:
            raise ValueError(f"processor {processor_id} already registered")
        self._processors[processor_id] = processor

    def remove_processor(self, processor_id: int) -> None:
        self._processors.pop(processor_id, None)

    def try_send_request(self, request: Request, processor: ResponseSink,
                         to_caller: bool = False) -> bool:
        """Queue ``request`` unless the queue is full.

        On refusal ``processor.wakeup()`` will be called once a slot frees up; the
        processor must keep the request and retry. ``to_caller``: a handler thread keeps
        it in its next slot when that is free and nothing is queued (see the class
        docstring); from any other thread the flag is ignored.
        """
        if to_caller:
            local = self._local
            # Unlocked reads: a request queued meanwhile by another thread is for another
            # connection, so overtaking it reorders nothing; the bound is kept as before.
            if (not self._queue and self._size < self.queue_size
                    and getattr(local, "next", False) is None):
                local.next = request
                return True
        with self._lock:
            idle = self._idle
            if idle:                         # the queue is empty: straight to a waiting thread
                handler = idle.pop()
                handler.item = request
                handler.lock.release()
                return True
            if self._size >= self.queue_size:
                if processor not in self._waiters:
                    self._waiters.append(processor)
                return False
            self._size += 1
            self._queue.append(request)
        return True

    def _put_locked(self, item) -> None:
        idle = self._idle
        if idle:
            handler = idle.pop()
            handler.item = item
            handler.lock.release()
        else:
            self._queue.append(item)

    # -- handlers ---------------------------------------------------------------------
    def register_handler_thread(self) -> None:
        """Give the calling thread (a request handler) a next slot."""
        self._local.next = None

    def next_request(self):
        """The request in the calling handler thread's next slot (taken out), or None;
        never blocks."""
        local = self._local
        request = getattr(local, "next", None)
        if request is not None:
            local.next = None
        return request

    def receive_request(self, timeout_s: float | None = None):
        """Next request (the caller's next slot first), ``None`` on timeout, or
        :data:`SHUTDOWN`."""
        local = self._local
        request = getattr(local, "next", None)
        if request is not None:
            local.next = None
            return request
        with self._lock:
            if self._queue:
                request = self._queue.popleft()
                if request is SHUTDOWN:
                    return request
                waiters = self._dequeued_locked()
            elif timeout_s is not None and timeout_s <= 0:
                return None
            else:
                # This thread's own _IdleHandler, reused: its lock is held whenever the
                # thread is not waiting on it.
                handler = getattr(local, "idle", None)
                if handler is None:
                    handler = local.idle = _IdleHandler()
                self._idle.append(handler)
                waiters = None
        if waiters is None:
            if not handler.lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
                with self._lock:
                    try:
                        self._idle.remove(handler)
                        return None
                    except ValueError:
                        pass              # a request was handed over just now
                handler.lock.acquire()    # already released by the putter
            request = handler.item
            handler.item = None
            return request                # handed over: never queued, never counted
        if waiters:
            for processor in waiters:
                processor.wakeup()
        return request

    def _dequeued_locked(self) -> list:
        """Count a request out; the processors to wake (call outside the lock)."""
        self._size -= 1
        waiters = self._waiters
        if waiters:
            self._waiters = []
        return waiters

    def send_shutdown_request(self) -> None:
        """Make one handler thread blocked in ``receive_request`` exit."""
        with self._lock:
            self._put_locked(SHUTDOWN)

    def clear(self) -> None:
        """Drop queued requests (after shutdown); their connections are already closed."""
        with self._lock:
            while self._queue:
                if self._queue.popleft() is not SHUTDOWN:
                    self._size -= 1

    # -- responses (any thread) -------------------------------------------------------
    def send_response(self, request: Request, parts: Sequence[ResponsePart] | ResponsePart,
                      throttle_ms: int = 0) -> None:
        """Send one size-prefixed response frame (bytes-like / FileRegion parts) and unmute
        (``throttle_ms`` after the write when a client quota throttles the connection)."""
        if type(parts) is not list:
            if isinstance(parts, (bytes, bytearray, memoryview, FileRegion)):
                parts = [parts]
            else:
                parts = list(parts)
        request.response_queued_ns = _monotonic_ns()
        processor = self._processors.get(request.processor_id)
        if processor is None:
            self._drop(request)
        else:
            processor.send_response(request, parts, throttle_ms)

    def send_no_op_response(self, request: Request, throttle_ms: int = 0) -> None:
        """Send nothing and unmute the connection (e.g. produce with acks=0), now or after
        ``throttle_ms``."""
        self._route(Response(request, Response.NO_OP, None, throttle_ms))

    def close_connection(self, request: Request) -> None:
        """Close the request's connection instead of answering."""
        self._route(Response(request, Response.CLOSE))

    def flush_held(self, request: Request) -> None:
        """The request was handled without an answer yet: its processor writes the answers
        held back on its connection for the next one (``Processor.flush_held``)."""
        processor = self._processors.get(request.processor_id)
        flush = getattr(processor, "flush_held", None)
        if flush is not None:
            flush(request.connection)

    def _route(self, response: Response) -> None:
        request = response.request
        request.response_queued_ns = _monotonic_ns()
        processor = self._processors.get(request.processor_id)
        if processor is None:
            self._drop(request)
        else:
            processor.enqueue_response(response)

    @staticmethod
    def _drop(request: Request) -> None:
        log.debug("dropping the response to %r: processor %d is gone", request, request.processor_id)

    # -- gauges -------------------------------------------------------------------------
    def request_queue_size(self) -> int:
        """Kafka's ``RequestQueueSize``."""
        return self._size

    def response_queue_size(self, processor_id: int | None = None) -> int:
        """Kafka's ``ResponseQueueSize`` (all processors, or one)."""
        if processor_id is not None:
            p = self._processors.get(processor_id)
            return p.response_queue_size() if p is not None else 0
        return sum(p.response_queue_size() for p in list(self._processors.values()))

    def processor_ids(self) -> Iterable[int]:
        return list(self._processors)
