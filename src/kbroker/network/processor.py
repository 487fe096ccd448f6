"""Processor: a network thread that owns a set of connections.

Modelled on Kafka's ``Processor`` in ``core/.../network/SocketServer.scala`` (and the parts
of ``org.apache.kafka.common.network.Selector`` / ``NetworkReceive`` it relies on).

Frame format (both directions)::

    size     int32 big-endian   bytes that follow; requests: 8 <= size <= socket.request.max.bytes
    payload  size bytes         request: header (api_key int16, api_version int16,
                                correlation_id int32, ...) + body; response: header + body

Requests are handed on without their size prefix; responses arrive as complete frames
(size prefix first, as ``kbroker.protocol.frames.encode_response_parts`` makes them) and
the processor checks the prefix against the parts before writing.

Per-connection ordering (Kafka's guarantee): after a whole request has been read the
connection is *muted* (not read) until its response has been completely written, or a
no-op response arrived; so at most one request per connection is in flight and responses
go out in request order. Bytes of pipelined requests wait in the kernel's socket buffer
(or in the connection's read buffer), which also gives TCP back-pressure to a client that
pipelines too much.

The run loop is a list of small steps, as in Kafka's ``Processor.run``::

    configure_new_connections   sockets handed over by the acceptor
    enqueue_blocked_requests    retry requests refused by a full request queue
    process_new_responses       responses queued by handlers: start writing / unmute / close
    process_resumed             connections unmuted by a direct send that have bytes to read
    process_completed_sends     response written -> metrics; unmute (or keep muted while
                                a client quota throttles the connection, KIP-219)
    unmute_throttled            throttled connections whose throttle time is over
    process_disconnected        peer closed / I/O error -> forget the connection
    close_idle_connections      connections.max.idle.ms
    process_completed_receives  whole frames -> request queue (just before blocking in poll,
                                so the woken handler thread finds the GIL free)
    poll                        epoll_wait, then read and write ready sockets

Costs per request, measured (single-record produce, 2 cores): every system call made
while another thread waits for the GIL is a GIL hand-over, i.e. a context switch. So:

* Reads are buffered: one ``recv`` into a 64 KiB scratch buffer usually brings a whole
  frame (size prefix included) or several pipelined ones; a frame larger than the scratch
  buffer gets its own buffer once 16 KiB of it are here, filled in place by ``recv_into``
  (no copy of large payloads).
* Sockets are registered once, edge-triggered (``EPOLLIN | EPOLLOUT | EPOLLET``), so
  muting and unmuting is bookkeeping, not an ``epoll_ctl``. ``readable`` remembers that
  the socket may hold unread bytes: set by every EPOLLIN event, cleared by a short read.
  Without epoll (``poll``: level-triggered) the interest mask is changed instead.
* A response is written by the thread that produces it (:meth:`enqueue_response`, the
  *direct send*) when the connection is waiting for exactly that response: no queue, no
  wake-up of this thread, no second GIL hand-over. Whatever does not fit in the socket
  buffer, and every failure, is handed to this thread, which finishes or closes.
* Pipelined requests: when the direct send has written the response and the next frame
  of that connection is already whole in its read buffer, the responding thread takes
  it as the connection's in-flight request (the connection stays muted) and, on a
  handler thread, keeps it for its own next turn (``RequestChannel`` next slot). A
  client that pipelines (librdkafka with ``linger.ms=0``) is then served back to back,
  still one request at a time and in order, without two thread hand-overs per request.
  If the next frame is not whole in the read buffer, the responding thread first reads
  the muted connection's socket once itself (``_read_ahead``: PLAINTEXT, small frames,
  non-blocking), so pipelined requests still in the socket (librdkafka sends one
  ProduceRequest per partition, back to back) are taken the same way; measured on
  1,000 partitions: request-queue time per Produce 67 -> 27 µs.
* Python steps per request on that path are counted: a one-part response is one
  ``send``; one clock reading ends a response and starts the next pipelined request;
  the counters of both go under one ``stats.lock``; no Response object unless the
  processor must finish the write; a read-ahead that finds only the start of a frame
  does not wake the processor (the rest comes with an EPOLLIN edge).
* Held responses: when the next request of a PLAINTEXT connection is already whole in its
  read buffer (after one read-ahead if need be) as a response is about to be written, the
  response is held back (``conn.held``, at most ``_HOLD_MAX`` responses and
  ``_HOLD_BYTES``, no file regions) and written in the same ``sendmsg`` as the next
  response, still in request order. The client then reads several responses per wake-up
  (librdkafka's broker thread scans every partition it produces to once per wake-up: at
  10,000 partitions that scan is most of its CPU) and the broker makes one send per
  group. A held response waits only for requests already read and handled at once: every
  other way out writes the held ones first (a response sent by this processor, a NO_OP,
  a CLOSE, which closes only once they are written), and a request left unanswered by its
  handler (a purgatory) has them written by ``flush_held`` as soon as its handler returns;
  an answer that comes while that write is unfinished is *parked* and sent after it.
  Their metrics count the send as complete when the write that carries them is made.

Memory (Kafka's ``NetworkReceive`` and ``SimpleMemoryPool``, see ``memory_pool.py``): the
size prefix is a claim, not a fact, so nothing is allocated for it. A frame's bytes live in
``rbuf`` (at most what arrived plus one 64 KiB read) and then in its own buffer, which grows
as bytes arrive, to at most 4x what arrived (a frame up to 256 KiB whose first 64 KiB came
in one read gets its full buffer at once; larger ones grow by realloc): a client that
announces 100 MiB and sends 10 KB costs about 10 KB. With ``queued.max.request.bytes`` set,
the processor also takes the announced size from the broker-wide pool when it learns it;
if the pool is empty it stops reading that connection (*paused for memory*; connections
that already hold a grant keep reading, so grants are always completed) and resumes when a
request's bytes are returned. Connections paused for memory are not read, so they do not
count as active for ``connections.max.idle.ms``; a connection that stops sending in the
middle of a frame is closed by that reaper like any idle one, and its grant returned.

Thread-safety: the read side of a connection (``rbuf``, ``payload``, reading the socket)
and the connection map are touched only by the processor's own thread, except that a
responding thread holding ``lock`` may take a whole frame out of ``rbuf`` while the
connection is still muted (the processor reads only unmuted connections). The write side
(``response``, ``send_*``), ``closed`` and the socket's lifetime are guarded by the
connection's ``lock``, which a direct send holds for its whole attempt and the processor
holds while it writes or closes; so no thread writes to a closed (possibly reused) file
descriptor. ``inflight`` is set by the processor (mute) and cleared by whoever completes
the response (unmute). Requests refused by the full request queue are kept in
``_blocked`` (FIFO) and while any is kept the processor reads from no socket.
"""
from __future__ import annotations

import collections
import heapq
import logging
import os
import queue
import random
import select
import socket
import ssl
import struct
import threading
import time
from typing import Optional

from kbroker.network.channel import (
    REQUEST_HEADER_PREFIX_SIZE, Request, RequestChannel, Response,
)
from kbroker.security.sasl import ChannelSession
from kbroker.security.tls import ssl_principal
from kbroker.network.memory_pool import MemoryPool
from kbroker.network.metrics import ProcessorStats
from kbroker.records.region import FileRegion

log = logging.getLogger(__name__)

EVENT_READ = select.POLLIN          # == EPOLLIN
EVENT_WRITE = select.POLLOUT        # == EPOLLOUT
_EVENT_FAILED = select.POLLERR | select.POLLHUP
_MSG_MORE = getattr(socket, "MSG_MORE", 0)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
_SENDFILE_MAX = 1 << 30       # cap per os.sendfile() call
_POLL_TIMEOUT_S = 0.3         # Kafka's Processor poll timeout
_READ_CHUNK = 1 << 16         # scratch buffer for one recv; larger frames get their own buffer
_PAYLOAD_MIN = 1 << 14        # a large frame gets its own buffer once this much of it is here
_GROWTH = 4                   # a frame's own buffer holds at most 4x the bytes of it received
_ZEROS = bytes(1 << 20)       # source for growing a frame buffer (bytearray has no resize)
_ZEROS_VIEW = memoryview(_ZEROS)
_monotonic_ns = time.monotonic_ns
_unpack_size = struct.Struct(">i").unpack_from
_thread_local = threading.local()
_HOLD_MAX = 16                # responses held back at most (see "Held responses")
_HOLD_BYTES = 1 << 16         # bytes of held responses at most


def _read_ahead_buffer() -> tuple:
    """This thread's (bytearray, memoryview) of ``_READ_CHUNK`` bytes for read-ahead."""
    try:
        return _thread_local.read_ahead
    except AttributeError:
        b = bytearray(_READ_CHUNK)
        t = _thread_local.read_ahead = (b, memoryview(b))
        return t

_TLS_CHUNK = 1 << 18          # plaintext bytes handed to one SSL_write (FileRegions are read into it)
_TLS_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)
#: what an unauthenticated SASL connection may send (Kafka's SaslServerAuthenticator):
#: SaslHandshake, ApiVersions, SaslAuthenticate
_PRE_AUTH_APIS = frozenset((17, 18, 36))
_REAUTH_APIS = frozenset((17, 36))

# _write results
_WRITE_DONE = 1
_WRITE_PARTIAL = 0            # the socket buffer is full: wait for EVENT_WRITE
_WRITE_FAILED = -1            # conn.write_error says why

_SEND = Response.SEND
_NO_OP = Response.NO_OP


class _Waker:
    """Wakes a thread blocked in select(): eventfd on Linux, a socketpair elsewhere.

    ``_lock`` makes ``wake`` and ``close`` exclusive, so a late ``wake`` from a handler
    thread never writes to a closed (and possibly reused) file descriptor.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        if hasattr(os, "eventfd"):
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._r = self._w = None
        else:  # pragma: no cover - non-Linux
            self._efd = -1
            self._r, self._w = socket.socketpair()
            self._r.setblocking(False)
            self._w.setblocking(False)

    def fileno(self) -> int:
        return self._efd if self._efd >= 0 else self._r.fileno()

    def wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                if self._efd >= 0:
                    os.eventfd_write(self._efd, 1)
                else:  # pragma: no cover
                    self._w.send(b"\0")
            except OSError:
                pass  # already signalled (counter saturated / buffer full)

    def drain(self) -> None:
        try:
            if self._efd >= 0:
                os.eventfd_read(self._efd)
            else:  # pragma: no cover
                while self._r.recv(4096):
                    pass
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._efd >= 0:
                os.close(self._efd)
            else:  # pragma: no cover
                self._r.close()
                self._w.close()


class _Poller:
    """fd -> object registry over ``epoll`` (``poll`` where there is no epoll).

    With epoll (``edge_triggered``) a connection is registered once for
    ``EPOLLIN | EPOLLOUT | EPOLLET`` and never modified: an event means "something
    changed", and the processor keeps its own ``readable`` flag. With ``poll`` the
    interest mask is level-triggered and modified to mute/unmute; an fd may stay
    registered with an empty mask. Either way the kernel reports ERR/HUP at once, so a
    muted connection that is reset by its peer is noticed.
    """

    def __init__(self) -> None:
        if hasattr(select, "epoll"):
            self._p = select.epoll()
            self._scale = 1.0
            self.edge_triggered = True
        else:  # pragma: no cover - non-Linux
            self._p = select.poll()
            self._scale = 1000.0
            self.edge_triggered = False
        self._objects: dict[int, object] = {}

    def register(self, fd: int, events: int, obj) -> None:
        self._p.register(fd, events)
        self._objects[fd] = obj

    def register_connection(self, fd: int, obj) -> int:
        """Register a connection socket; returns the events registered."""
        if self.edge_triggered:
            events = EVENT_READ | EVENT_WRITE | select.EPOLLET
        else:  # pragma: no cover - non-Linux
            events = EVENT_READ
        self.register(fd, events, obj)
        return events

    def modify(self, fd: int, events: int) -> None:
        self._p.modify(fd, events)

    def unregister(self, fd: int) -> None:
        self._objects.pop(fd, None)
        self._p.unregister(fd)

    def poll(self, timeout_s: float) -> list:
        try:
            ready = self._p.poll(timeout_s * self._scale)
        except InterruptedError:
            return []
        objects = self._objects
        return [(objects[fd], mask) for fd, mask in ready if fd in objects]

    def close(self) -> None:
        if self._scale == 1.0:
            self._p.close()
        self._objects.clear()


class _Connection:
    """One client connection; owned by its processor's thread (see the module docstring
    for what other threads may touch, under ``lock``).

    Read state: ``rbuf`` holds bytes read past the last whole frame (a partial size
    prefix or frame, or whole pipelined frames), or is None; ``payload`` is the buffer of
    a frame of ``frame_size`` bytes too large for the scratch buffer, of which
    ``payload_read`` bytes are filled; it grows with what arrives (``len(payload)`` is at
    most ``_GROWTH`` times ``payload_read``, never the announced size up front). ``grant``:
    bytes of the memory pool held for the frame being read (0: none, or no pool); it
    passes to the Request when the frame is whole. ``readable``: the socket may hold
    unread bytes. Write state:
    ``send_parts[send_index:]`` remain, the first of them from ``send_offset`` on;
    ``write_error`` is set when a direct send failed. ``inflight`` is the request being
    handled (the connection is muted while it is set). ``events`` is the interest
    currently registered.

    Security (SSL, SASL_*): ``session`` holds the principal and SASL state (see
    ``kbroker.security.sasl``); TLS connections (``tls``) wrap the socket in a non-blocking
    ``SSLSocket`` whose handshake is driven by readiness events (``handshaking``); their writes go
    through SSL_write in chunks (``tls_out`` is a chunk SSL_write asked to be retried as it is).
    """

    __slots__ = ("sock", "fd", "connection_id", "client_address", "lock", "rbuf", "readable",
                 "payload", "payload_view", "payload_read", "frame_size", "grant",
                 "inflight", "response",
                 "send_parts", "send_sizes", "send_index", "send_offset", "write_error",
                 "events", "read_paused", "last_active_ns", "closed",
                 "tls", "handshaking", "tls_out", "session", "held", "held_bytes", "parked")

    def __init__(self, sock: socket.socket, connection_id: str, client_address: tuple,
                 now_ns: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.connection_id = connection_id
        self.client_address = client_address
        self.lock = threading.Lock()
        self.rbuf: Optional[bytearray] = None
        self.readable = True            # whatever arrived before registration
        self.payload: Optional[bytearray] = None
        self.payload_view: Optional[memoryview] = None
        self.payload_read = 0
        self.frame_size = 0
        self.grant = 0
        self.inflight: Optional[Request] = None
        self.response: Optional[Response] = None
        self.send_parts: Optional[list] = None
        self.send_sizes: Optional[list] = None
        self.send_index = 0
        self.send_offset = 0
        self.write_error: Optional[str] = None
        self.events = 0
        self.read_paused = False
        self.last_active_ns = now_ns
        self.closed = False
        self.tls = False                # sock is a non-blocking ssl.SSLSocket
        self.handshaking = False        # TLS handshake not finished: nothing is read or written
        self.tls_out = None             # plaintext handed to SSL_write, to retry as it is
        self.session: Optional[ChannelSession] = None   # None: PLAINTEXT
        self.held: Optional[list] = None   # [(request, parts, sizes)] answered, not yet written
        self.held_bytes = 0
        self.parked: Optional[Response] = None   # the answer that came while held ones were written


class _HeldFlush(Response):
    """The write of held responses alone (``Processor.flush_held``); ``request`` is the
    last of them, already answered, so its completion unmutes nothing."""

    __slots__ = ()

    def __init__(self, request: Request) -> None:
        super().__init__(request, Response.SEND, None)


class InvalidReceive(Exception):
    """A frame that cannot be a request (Kafka's ``InvalidReceiveException``)."""


def _response_parts(response_parts) -> tuple[list, list]:
    """``(parts, sizes)`` of a size-prefixed response frame, empty parts dropped.

    Raises ValueError / TypeError for a part that is not a buffer or FileRegion, or when
    the frame does not start with a 4-byte size prefix equal to the bytes that follow (a
    wrong size would desynchronise the client's stream).
    """
    parts = []
    sizes = []
    total = 0
    for part in response_parts:
        if type(part) is bytes or type(part) is bytearray:
            n = len(part)
        elif isinstance(part, FileRegion):
            n = part.size
            if n < 0 or part.position < 0:
                raise ValueError(f"bad FileRegion {part!r}")
        else:
            part = memoryview(part)        # TypeError for non-buffers: caller closes
            if part.format != "B" or part.ndim != 1:
                part = part.cast("B")
            n = part.nbytes
        if n == 0:
            continue
        parts.append(part)
        sizes.append(n)
        total += n
    if not parts or isinstance(parts[0], FileRegion) or sizes[0] < 4:
        raise ValueError("a response frame must start with its 4-byte size prefix")
    declared = _unpack_size(parts[0], 0)[0]
    if declared != total - 4:
        raise ValueError(f"response size prefix {declared} != {total - 4} bytes that follow")
    return parts, sizes


def _tls_chunk(parts: list, sizes: list, i: int, off: int) -> tuple:
    """The next plaintext chunk of a response for SSL_write, from part ``i`` at ``off``:
    a view of a large bytes-like part, else up to ``_TLS_CHUNK`` bytes gathered (FileRegions
    read with pread). Returns ``(chunk, i, off)`` with the position after it."""
    part = parts[i]
    if not isinstance(part, FileRegion) and sizes[i] - off >= _TLS_CHUNK:
        end = off + _TLS_CHUNK
        return memoryview(part)[off:end], i, end
    buf = bytearray()
    nparts = len(parts)
    while i < nparts and len(buf) < _TLS_CHUNK:
        part = parts[i]
        want = min(sizes[i] - off, _TLS_CHUNK - len(buf))
        if isinstance(part, FileRegion):
            data = os.pread(part.file.fileno(), want, part.position + off)
            if not data:
                raise EOFError(f"file region {part!r} is beyond the end of its file")
            buf += data
            n = len(data)
        else:
            buf += memoryview(part)[off:off + want]
            n = want
        off += n
        if off == sizes[i]:
            i += 1
            off = 0
    return buf, i, off


class Processor(threading.Thread):
    """Network thread: reads request frames, writes response frames, for its connections."""

    def __init__(self, processor_id: int, channel: RequestChannel, listener_name: str,
                 stats: ProcessorStats, quotas, *, max_request_size: int = 104857600,
                 connections_max_idle_ms: int = 600000,
                 connection_queue_size: int = 20, memory_pool: Optional[MemoryPool] = None,
                 security=None) -> None:
        super().__init__(name=f"kbroker-network-thread-{listener_name}-{processor_id}",
                         daemon=True)
        self.processor_id = processor_id
        self.listener_name = listener_name
        self._channel = channel
        self._stats = stats
        self._quotas = quotas
        self._max_request_size = max_request_size
        self._pool = memory_pool          # None: queued.max.request.bytes unbounded
        # kbroker.security.config.ListenerSecurity; None (or PLAINTEXT): no session, no TLS
        self._security = security if security is not None and not security.is_plaintext else None
        self._ssl_context = security.ssl_context if self._security is not None else None
        self._delayed_closes: list = []   # (deadline ns, conn): failed authentications
        self._throttled: list = []        # heap of (deadline ns, id, conn, request): muted by a quota
        # connections.max.idle.ms < 0 disables the idle reaper (as Kafka's Selector).
        self._max_idle_ns = connections_max_idle_ms * 1_000_000
        self._idle_check_interval_ns = (
            max(min(self._max_idle_ns // 10, 1_000_000_000), 1_000_000)
            if connections_max_idle_ms >= 0 else 3600 * 10**9)

        self._poller = _Poller()
        # Direct sends need the edge-triggered registration: unmuting must not have to
        # change the interest mask (only this thread may).
        self._direct_send = self._poller.edge_triggered
        self._waker = _Waker()
        self._poller.register(self._waker.fileno(), EVENT_READ, None)
        self._scratch = bytearray(_READ_CHUNK)
        self._scratch_view = memoryview(self._scratch)
        self._connections: dict[str, _Connection] = {}
        self._connection_index = 0
        self._new_connections: queue.Queue = queue.Queue(connection_queue_size)
        self._responses: collections.deque = collections.deque()
        self._resumed: collections.deque = collections.deque()    # _Connection
        self._selecting = False
        self._blocked: collections.deque = collections.deque()   # (conn, Request)
        self._paused: list[_Connection] = []          # request queue full (or shutting down)
        self._memory_paused: list[_Connection] = []   # memory pool empty, no grant held
        self._completed_receives: list = []      # (conn, Request), muted, not yet queued
        self._completed_sends: list[_Connection] = []
        self._disconnected: list[tuple[_Connection, str]] = []
        self._now_ns = _monotonic_ns()
        self._next_idle_check_ns = self._now_ns + self._idle_check_interval_ns
        self._running = True
        self._accepting = True
        self._drain_deadline_ns = 0

    # -- called from other threads ---------------------------------------------------------
    def accept(self, sock: socket.socket, addr, timeout_s: float = 0.0) -> bool:
        """Take ownership of an accepted socket (acceptor thread).

        The hand-over queue holds ``connection_queue_size`` sockets (Kafka: 20); when it is
        full, wait up to ``timeout_s``. ``False``: not taken (full, or shutting down).
        """
        if not self._accepting:
            return False
        try:
            self._new_connections.put((sock, addr), block=timeout_s > 0, timeout=timeout_s or None)
        except queue.Full:
            return False
        self._waker.wake()
        return True

    def enqueue_response(self, response: Response) -> None:
        """Answer a request (any thread).

        A SEND or NO_OP response to the request its connection is waiting for is done
        right here (the direct send); the processor only hears about it if bytes are left
        to write, the write failed, or the connection has more requests to read. Anything
        else (CLOSE, a throttled response, a response to a connection that is gone or
        busy) is queued for the processor, which is woken only if it is blocked in poll.
        """
        if self._direct_send and response.kind != Response.CLOSE and not response.throttle_ms:
            request = response.request
            conn = request.connection
            if conn is not None and self._send_directly(conn, request, response.kind, response.parts, response):
                return
        self._responses.append(response)
        if self._selecting:
            self._waker.wake()

    def send_response(self, request: Request, parts: list, throttle_ms: int = 0) -> None:
        """``enqueue_response(Response(request, Response.SEND, parts, throttle_ms))``,
        without making the Response when the direct send writes it all."""
        if self._direct_send and not throttle_ms:
            conn = request.connection
            if conn is not None and self._send_directly(conn, request, _SEND, parts, None):
                return
        self._responses.append(Response(request, _SEND, parts, throttle_ms))
        if self._selecting:
            self._waker.wake()

    def wakeup(self) -> None:
        self._waker.wake()

    def response_queue_size(self) -> int:
        return len(self._responses)

    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def backpressured(self) -> bool:
        """True while requests are held back because the request queue is full."""
        return bool(self._blocked)

    def memory_paused_count(self) -> int:
        """Connections not read because the memory pool is empty (a gauge; any thread)."""
        return len(self._memory_paused)

    def begin_shutdown(self, drain_timeout_s: float = 0.0) -> None:
        """Stop reading requests; keep writing responses to in-flight requests for up to
        ``drain_timeout_s``; then close every connection and exit."""
        self._accepting = False
        self._drain_deadline_ns = _monotonic_ns() + int(drain_timeout_s * 1e9)
        self._running = False
        self._waker.wake()

    def shutdown(self, drain_timeout_s: float = 0.0) -> None:
        self.begin_shutdown(drain_timeout_s)
        if self.is_alive():
            self.join()

    def _send_directly(self, conn: _Connection, request: Request, kind: int, parts,
                       response: Optional[Response]) -> bool:
        """The direct send, on the responding thread. True when the response was dealt
        with here (written and the connection unmuted, or handed to the processor to
        finish); False to queue it instead (the processor then drops, closes or sends).

        Per-request cost matters here (librdkafka sends one request per partition): the
        usual response (one bytes part, PLAINTEXT) goes out with one ``send``; the clock
        is read once, after the write (``send_complete_ns``, also the next pipelined
        request's ``received_ns``); the counters are updated under one ``stats.lock``.
        ``response`` (made here when None and the processor must finish the write) is
        ``kind`` with ``parts``, not throttled (the processor keeps a throttled connection
        muted after its response, so a throttled response is never sent directly)."""
        session = conn.session
        if session is not None and session.close_delay_ms is not None:
            return False                     # failed authentication: the processor closes later
        one = None                           # the frame, when it is one bytes part
        if kind == _SEND:
            if len(parts) == 1:
                one = parts[0]
                if (type(one) is not bytes or len(one) < 4
                        or _unpack_size(one, 0)[0] != len(one) - 4):
                    one = None
            if one is not None:
                total = len(one)
            else:
                try:
                    parts, sizes = _response_parts(parts)
                except (TypeError, ValueError):
                    return False             # the processor fails it again and closes
                total = sum(sizes)
        elif kind == _NO_OP and conn.held is None:
            total = 0
        else:
            return False                     # (a NO_OP after held responses: the processor writes them)
        stats = self._stats
        written = 0                          # bytes written here and not yet counted
        nread = 0                            # bytes read ahead here, not yet counted
        following = None
        handover = False
        partial = False                      # rbuf holds part of a frame, and no more
        with conn.lock:
            if conn.closed or conn.inflight is not request or conn.response is not None:
                return False                 # gone, or a second answer: the processor drops it
            # No response queue on this path: it is dequeued when it is handed over.
            queued = request.response_queued_ns
            held = conn.held
            if kind == _SEND:
                if one is not None:
                    parts = [one]
                    sizes = [total]
                hold, nread = self._may_hold(conn, parts)
                if hold:
                    now = _monotonic_ns()
                    following = self._take_buffered_request(conn, now)
                    if following is not None:
                        # written with a later response (see "Held responses")
                        if held is None:
                            held = conn.held = []
                        held.append((request, parts, sizes))
                        conn.held_bytes += total
                        request.response_dequeued_ns = queued or now
                        if request.pool_bytes:
                            self._pool.release_request(request)
                        with stats.lock:
                            stats.responses_held += 1
                            stats.requests_received += 1
                            if nread:
                                stats.bytes_in += nread
                        conn.inflight = following
                if following is None and nread:
                    with stats.lock:
                        stats.bytes_in += nread
                nread = 0
                if held is not None and following is None:
                    parts, sizes = self._with_held(conn, parts, sizes)
                    one = None
            if following is not None:
                pass                         # held: handed on below
            elif kind == _NO_OP:
                now = queued or _monotonic_ns()
                request.response_dequeued_ns = request.send_complete_ns = now
            elif one is not None and not conn.tls:
                try:
                    n = conn.sock.send(one)
                except (BlockingIOError, InterruptedError):
                    n = 0
                except Exception as e:       # as in _write: reset, broken pipe, ...
                    conn.write_error = f"write failed: {e!r}"
                    n = -1
                if n == total:
                    written = n
                else:
                    handover = True
                    conn.send_parts = parts
                    conn.send_sizes = [total]
                    conn.send_index = 0
                    conn.send_offset = n if n > 0 else 0
                    if n > 0:
                        with stats.lock:
                            stats.bytes_out += n
            else:
                conn.send_parts = parts
                conn.send_sizes = sizes if one is None else [total]
                conn.send_index = 0
                conn.send_offset = 0
                done = self._write(conn) == _WRITE_DONE    # counts its bytes itself
                if held is not None:
                    self._held_written(held)
                if done:
                    conn.send_parts = None
                    conn.send_sizes = None
                else:
                    handover = True
            if following is not None:
                pass
            elif handover:
                # Bytes left (EVENT_WRITE will follow: the buffer is full) or a failure:
                # the processor finishes or closes; it finds conn.response is response.
                if response is None:
                    response = Response(request, kind, parts)
                conn.response = response
                request.response_dequeued_ns = queued or _monotonic_ns()
            else:
                if kind == _SEND:
                    now = request.send_complete_ns = _monotonic_ns()
                    request.response_dequeued_ns = queued or now
                if request.pool_bytes:
                    self._pool.release_request(request)
                if self._running and not self._blocked and not conn.read_paused:
                    if conn.rbuf is not None:
                        following = self._take_buffered_request(conn, now)
                    if following is None:
                        nread = self._read_ahead(conn)
                        if nread:
                            following = self._take_buffered_request(conn, now)
                        # Only the start of a frame here, on a PLAINTEXT connection: the
                        # processor has nothing to do until its next bytes arrive, and
                        # their EPOLLIN edge wakes it (unless readable, checked below).
                        rbuf = conn.rbuf
                        partial = (following is None and conn.session is None and conn.payload is None
                                   and (rbuf is None or self._partial_frame(rbuf)))
                with stats.lock:
                    if kind == _SEND:
                        stats.responses_sent += 1
                    else:
                        stats.responses_no_op += 1
                    if written:
                        stats.bytes_out += written
                    if nread:
                        stats.bytes_in += nread
                    if following is not None:
                        stats.requests_received += 1
                    self._update_request_metrics(request, total)
                conn.inflight = following    # unmute, or stay muted for the next request
        if handover:
            self._responses.append(response)
            if self._selecting:
                self._waker.wake()
        elif following is not None:
            if not self._channel.try_send_request(following, self, to_caller=True):
                # Request queue full: the processor keeps it, as one it read itself.
                self._blocked.append((conn, following))
                self._waker.wake()
        elif conn.readable or (not partial and (conn.rbuf is not None or conn.payload is not None)):
            # Requests may be waiting: only the processor reads.
            self._resumed.append(conn)
            if self._selecting:
                self._waker.wake()
        return True

    def _may_hold(self, conn: _Connection, parts: list) -> tuple[bool, int]:
        """Whether a response written now may instead be held back for the next one
        (``conn.lock`` held), and the bytes read ahead to find out: a PLAINTEXT connection
        whose next request is whole in ``rbuf``, after one read-ahead if need be (it is
        handled next, on this thread), with room left under ``_HOLD_MAX`` and
        ``_HOLD_BYTES``, and no file region (a held response holds bytes only)."""
        if conn.tls or not self._running or self._blocked or conn.read_paused:
            return False, 0
        held = conn.held
        if held is not None and (len(held) >= _HOLD_MAX or conn.held_bytes >= _HOLD_BYTES):
            return False, 0
        for part in parts:
            if isinstance(part, FileRegion):
                return False, 0
        rbuf = conn.rbuf
        if rbuf is not None and len(rbuf) >= 4 and len(rbuf) >= 4 + _unpack_size(rbuf, 0)[0]:
            return True, 0
        # the next request may still be in the socket (a pipelining client): read it now,
        # as the read-ahead after the write would
        nread = self._read_ahead(conn)
        if not nread:
            return False, 0
        rbuf = conn.rbuf
        return len(rbuf) >= 4 and len(rbuf) >= 4 + _unpack_size(rbuf, 0)[0], nread

    @staticmethod
    def _with_held(conn: _Connection, parts: list, sizes: list) -> tuple[list, list]:
        """The held responses' parts, then ``parts`` (``conn.lock`` held); empties the hold."""
        all_parts: list = []
        all_sizes: list = []
        for _request, p, z in conn.held:
            all_parts += p
            all_sizes += z
        conn.held = None
        conn.held_bytes = 0
        return all_parts + parts, all_sizes + sizes

    def _held_written(self, held: list) -> None:
        """Metrics of held responses handed to the socket (or, for what it did not take, to
        this processor) by the write that carried them."""
        now = _monotonic_ns()
        stats = self._stats
        with stats.lock:
            for request, _parts, sizes in held:
                request.send_complete_ns = now
                stats.responses_sent += 1
                self._update_request_metrics(request, sum(sizes))

    def flush_held(self, conn: _Connection) -> None:
        """Write the held responses of ``conn`` now: its in-flight request was handled
        without an answer (it waits in a purgatory), so nothing may wait for that answer.
        Any thread; a no-op without held responses or while a send is under way (that
        send's response carries them)."""
        with conn.lock:
            held = conn.held
            if held is None or conn.closed or conn.response is not None:
                return
            parts, sizes = self._with_held(conn, [], [])
            flush = _HeldFlush(held[-1][0])
            conn.response = flush
            conn.send_parts = parts
            conn.send_sizes = sizes
            conn.send_index = 0
            conn.send_offset = 0
            result = self._write(conn)
            self._held_written(held)
            if result == _WRITE_DONE:
                conn.response = None
                conn.send_parts = None
                conn.send_sizes = None
                return
        self._responses.append(flush)        # the rest (or the failure) is the processor's
        if self._selecting:
            self._waker.wake()

    def _flush_held_before(self, conn: _Connection, response: Response) -> bool:
        """Held responses answer requests that came before ``response`` (a CLOSE): write
        them first, as Kafka had written every earlier response before it read the
        request that closes. Processor thread. True when the write is unfinished: it is
        finished as a ``_HeldFlush`` and ``response`` is parked behind it (processed again
        once the held bytes are written); False when nothing is left to write."""
        with conn.lock:
            held = conn.held
            if conn.closed or conn.response is not None or held is None:
                return False
            flush = _HeldFlush(held[-1][0])
            conn.send_parts, conn.send_sizes = self._with_held(conn, [], [])
            conn.send_index = 0
            conn.send_offset = 0
            conn.response = flush
            result = self._write(conn)
            self._held_written(held)
            if result == _WRITE_DONE:
                conn.response = None
                conn.send_parts = None
                conn.send_sizes = None
                return False
            conn.parked = response
        if result == _WRITE_FAILED:
            self._disconnected.append((conn, conn.write_error))
        else:
            self._update_interest(conn)      # the rest as the socket takes it (EVENT_WRITE)
        return True

    def _partial_frame(self, rbuf: bytearray) -> bool:
        """``rbuf`` (of a PLAINTEXT connection) holds less than one frame of a valid size."""
        have = len(rbuf)
        if have < 4:
            return True
        size = _unpack_size(rbuf, 0)[0]
        return REQUEST_HEADER_PREFIX_SIZE <= size <= self._max_request_size and have < 4 + size

    def _read_ahead(self, conn: _Connection) -> int:
        """One non-blocking read of a muted connection's socket on the responding thread
        (``conn.lock`` held, ``conn.inflight`` still set, so the processor does not touch
        the read side), appended to ``rbuf``: a client that pipelines (librdkafka sends
        one ProduceRequest per partition, back to back) then has its next request taken
        here without waking the processor and a second thread. Returns the bytes read
        (0: none), which the caller counts in ``bytes_in``.

        Only a PLAINTEXT connection between frames or with a small frame begun in
        ``rbuf`` (a frame larger than the read chunk, a TLS or SASL connection stay with
        the processor), and only if the socket may hold bytes (``readable``). So ``rbuf``
        stays below one small frame plus one read. ``readable`` is cleared *before* the
        read: bytes that arrive after it raise a new edge, whose event sets it again; a
        full read sets it back (more may wait); EOF and errors leave it set, for the
        processor to find."""
        if (not conn.readable or conn.tls or conn.session is not None or conn.payload is not None
                or conn.closed):
            return 0
        rbuf = conn.rbuf
        if rbuf is not None and (len(rbuf) >= _READ_CHUNK
                                 or (len(rbuf) >= 4 and _unpack_size(rbuf, 0)[0] > _READ_CHUNK)):
            return 0
        try:
            buf = _thread_local.read_ahead
        except AttributeError:
            buf = _read_ahead_buffer()
        conn.readable = False
        try:
            n = conn.sock.recv_into(buf[1])
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            conn.readable = True
            return 0
        if n == 0:
            conn.readable = True
            return 0
        if n == _READ_CHUNK:
            conn.readable = True
        if rbuf is None:
            conn.rbuf = buf[0][:n]
        else:
            rbuf += buf[1][:n]
        return n

    def _take_buffered_request(self, conn: _Connection, now: int) -> Optional[Request]:
        """The next request of a connection whose response was just written on this
        (responding) thread, if its frame is already whole in ``rbuf``; else None and
        nothing changes. ``conn.lock`` held and ``conn.inflight`` still set: while it is,
        the processor does not touch the read side, so the responding thread owns it
        here. A frame with a bad size, and any frame before authentication (or of a
        session that expires), is left for the processor. ``now`` (monotonic ns) is its
        ``received_ns``; the caller counts it in ``requests_received``."""
        session = conn.session
        if session is not None and (not session.authenticated or session.session_expiry_ns):
            return None
        rbuf = conn.rbuf
        have = len(rbuf)
        if have < 4:
            return None
        size = _unpack_size(rbuf, 0)[0]
        end = 4 + size
        if (have < end or size < REQUEST_HEADER_PREFIX_SIZE
                or size > self._max_request_size):
            return None
        pool = self._pool
        if pool is not None and not pool.try_allocate(size):
            return None                  # memory pressure: the processor pauses it
        frame = rbuf[4:end]
        if have == end:
            conn.rbuf = None
        else:
            del rbuf[:end]
        request = Request(self.processor_id, conn.connection_id, self.listener_name,
                          conn.client_address, memoryview(frame), now)
        request.connection = conn
        if pool is not None:
            request.pool_bytes = size
        conn.last_active_ns = now
        return request

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self._running:
                self._step()
            self._drain()
        except Exception:
            log.exception("processor %d died", self.processor_id)
        finally:
            self._close_all()

    def _step(self) -> None:
        # Each step is called only when it has something to do (one loop per request or
        # two when requests are not pipelined: the calls cost more than the checks).
        try:
            if self._new_connections.queue:     # unlocked peek; accept() wakes us after its put
                self._configure_new_connections()
            if self._blocked:
                self._enqueue_blocked_requests()
            if self._paused or self._memory_paused:
                self._resume_paused()
            if self._responses:
                self._process_new_responses()
            if self._resumed:
                self._process_resumed()
            if self._completed_sends:
                self._process_completed_sends()
            if self._throttled:
                self._unmute_throttled()
            if self._disconnected:
                self._process_disconnected()
            if self._now_ns >= self._next_idle_check_ns:
                self._close_idle_connections()
            if self._delayed_closes:
                self._process_delayed_closes()
            if self._completed_receives:
                self._process_completed_receives()
            self._poll()
        except Exception:
            # Per-connection errors are handled where they happen; anything here is a bug,
            # but one bad connection must not stop the others from being served.
            log.exception("processor %d: unexpected error in loop", self.processor_id)

    def _drain(self) -> None:
        """Shutdown: no more reads; finish in-flight requests until the deadline."""
        for conn, request in self._completed_receives:   # read, never handed on
            if conn.inflight is request:
                conn.inflight = None
            self._release(request)
        self._completed_receives.clear()
        for conn in list(self._connections.values()):
            conn.read_paused = True
            self._update_interest(conn)
        while _monotonic_ns() < self._drain_deadline_ns:
            if not any(c.inflight is not None for c in self._connections.values()):
                break
            try:
                self._enqueue_blocked_requests()
                self._process_new_responses()
                self._resumed.clear()
                self._process_completed_sends()
                self._process_disconnected()
                self._poll(max_timeout_s=0.05)
            except Exception:
                log.exception("processor %d: error while draining", self.processor_id)
                break

    # -- steps ----------------------------------------------------------------------------
    def _configure_new_connections(self) -> None:
        new = self._new_connections
        if not new.queue:          # unlocked peek; accept() wakes us after its put
            return
        while True:
            try:
                sock, addr = new.get_nowait()
            except queue.Empty:
                return
            try:
                local_host, local_port = sock.getsockname()[:2]
            except OSError as e:   # already reset by the peer
                log.debug("processor %d: dropping new connection from %s: %s",
                          self.processor_id, addr, e)
                sock.close()
                self._quotas.dec(addr[0])
                continue
            remote_host, remote_port = addr[:2]
            index = self._connection_index
            self._connection_index = (index + 1) & 0x7FFFFFFF
            connection_id = f"{local_host}:{local_port}-{remote_host}:{remote_port}-{index}"
            conn = _Connection(sock, connection_id, (remote_host, remote_port), self._now_ns)
            self._connections[connection_id] = conn
            self._stats.connections_created += 1
            security = self._security
            if security is not None:
                conn.session = ChannelSession(security.protocol, self.listener_name, security.sasl)
                if self._ssl_context is not None:
                    try:
                        conn.sock = self._ssl_context.wrap_socket(
                            sock, server_side=True, do_handshake_on_connect=False)
                    except (OSError, ValueError) as e:
                        self._close(conn, f"TLS set-up failed: {e}")
                        continue
                    conn.tls = conn.handshaking = True
            try:
                conn.events = self._poller.register_connection(conn.fd, conn)
            except (OSError, ValueError) as e:
                self._close(conn, f"could not register with the selector: {e}")
                continue
            # Bytes that arrived before registration: epoll reports them at once.
            log.debug("processor %d listening to new connection %s",
                      self.processor_id, connection_id)

    def _enqueue_blocked_requests(self) -> None:
        blocked = self._blocked
        if not blocked:
            return
        while blocked:
            conn, request = blocked[0]
            if conn.closed or conn.inflight is not request:
                blocked.popleft()
                continue
            if not self._channel.try_send_request(request, self):
                return
            blocked.popleft()

    def _resume_paused(self) -> None:
        """Resume reading the connections paused for back-pressure once the request queue
        takes requests again, and those paused for memory once the pool has memory again
        (in random order, as Kafka's Selector under memory pressure, so none starves)."""
        if self._blocked or not self._running:
            return
        if self._paused:
            paused, self._paused = self._paused, []
            for conn in paused:
                self._unpause(conn)
        if self._memory_paused and not self._pool.wait_for_memory(self):
            paused, self._memory_paused = self._memory_paused, []
            if len(paused) > 1:
                random.shuffle(paused)
            for conn in paused:
                self._unpause(conn)

    def _unpause(self, conn: _Connection) -> None:
        if not conn.closed:
            conn.read_paused = False
            self._update_interest(conn)
            self._maybe_read(conn)

    def _pause(self, conn: _Connection, for_memory: bool = False) -> None:
        """Stop reading ``conn`` until :meth:`_resume_paused` resumes it."""
        conn.read_paused = True
        (self._memory_paused if for_memory else self._paused).append(conn)
        self._update_interest(conn)

    def _needs_memory(self, conn: _Connection) -> bool:
        """True if the pool is empty and ``conn`` holds no grant, so it must not be read
        (this processor is then registered to be woken when memory is back)."""
        pool = self._pool
        return (pool is not None and not conn.grant and pool.available <= 0
                and pool.wait_for_memory(self))

    def _release(self, request: Request) -> None:
        if request.pool_bytes:
            self._pool.release_request(request)

    def _process_new_responses(self) -> None:
        responses = self._responses
        while responses:
            response = responses.popleft()
            request = response.request
            conn = self._connections.get(request.connection_id)
            if conn is not None and conn.response is response:
                self._continue_direct_send(conn)
                continue
            request.response_dequeued_ns = _monotonic_ns()
            if (conn is not None and conn.inflight is request and type(conn.response) is _HeldFlush
                    and conn.parked is None):
                conn.parked = response       # after the held responses (_process_completed_sends)
                continue
            if conn is None or conn.inflight is not request or conn.response is not None:
                # Kafka: "Attempting to send response via channel for which there is no
                # open connection" - the client went away (or the idle reaper closed it).
                # Also a second response to a request already being answered.
                with self._stats.lock:
                    self._stats.responses_dropped += 1
                log.debug("processor %d: dropping %r, connection gone",
                          self.processor_id, response)
                self._release(request)
                continue
            kind = response.kind
            try:
                if kind == Response.SEND:
                    self._start_send(conn, response)
                elif kind == Response.NO_OP and conn.held is not None:
                    # nothing of its own to write, but held responses go first: written as
                    # this response's bytes (counted as a NO_OP when they are written)
                    with self._stats.lock:
                        self._stats.responses_no_op += 1
                    self._start_send(conn, response)
                elif kind == Response.NO_OP:
                    request.send_complete_ns = request.response_dequeued_ns
                    with self._stats.lock:
                        self._stats.responses_no_op += 1
                        self._update_request_metrics(request, 0)
                    self._release(request)
                    if response.throttle_ms:
                        self._throttle(conn, request, response.throttle_ms)
                        continue
                    conn.inflight = None
                    self._update_interest(conn)
                    self._maybe_read(conn)
                elif kind == Response.CLOSE:
                    if conn.held is not None and self._flush_held_before(conn, response):
                        continue                 # closed once the held responses are written
                    if conn.session is not None and conn.session.close_delay_ms is not None:
                        self._close_later(conn)
                    else:
                        self._close(conn, "handler asked to close the connection")
                else:
                    raise ValueError(f"unknown response kind {kind}")
            except Exception as e:
                log.exception("processor %d: error processing response for %s",
                              self.processor_id, conn.connection_id)
                self._close(conn, f"error processing response: {e!r}")

    def _continue_direct_send(self, conn: _Connection) -> None:
        """A direct send left bytes to write, or failed: finish it here."""
        error = conn.write_error
        if error is not None:
            self._disconnected.append((conn, error))
        elif conn.send_parts is not None:
            with conn.lock:
                if conn.closed:
                    return
                result = self._write(conn)
            if result == _WRITE_DONE:
                self._completed_sends.append(conn)
            elif result == _WRITE_FAILED:
                self._disconnected.append((conn, conn.write_error))

    def _process_resumed(self) -> None:
        resumed = self._resumed
        while resumed:
            self._maybe_read(resumed.popleft())

    def _start_send(self, conn: _Connection, response: Response) -> None:
        """Begin writing a response frame (see :func:`_response_parts` for the checks)."""
        parts, sizes = _response_parts(response.parts) if response.kind == Response.SEND else ([], [])
        with conn.lock:
            if conn.closed:
                return
            held = conn.held
            if held is not None:
                parts, sizes = self._with_held(conn, parts, sizes)
                self._held_written(held)
            conn.response = response
            conn.send_parts = parts
            conn.send_sizes = sizes
            conn.send_index = 0
            conn.send_offset = 0
            # Write right away: the socket buffer is usually empty, which saves a poll round.
            result = self._write(conn)
        if result == _WRITE_DONE:
            self._completed_sends.append(conn)
        elif result == _WRITE_FAILED:
            self._disconnected.append((conn, conn.write_error))
        else:
            self._update_interest(conn)

    def _poll(self, max_timeout_s: float = _POLL_TIMEOUT_S) -> None:
        stats = self._stats
        self._selecting = True
        if (self._responses or self._resumed or self._new_connections.queue
                or self._completed_sends or self._disconnected or self._completed_receives):
            timeout = 0
        else:
            timeout = min(max_timeout_s,
                          max(0, (self._next_idle_check_ns - self._now_ns) / 1e9))
            if self._delayed_closes:
                first = min(d for d, _ in self._delayed_closes)
                timeout = min(timeout, max(0, (first - self._now_ns) / 1e9))
            if self._throttled:
                timeout = min(timeout, max(0, (self._throttled[0][0] - self._now_ns) / 1e9))
            elif not self._connections and not self._delayed_closes and max_timeout_s == _POLL_TIMEOUT_S:
                timeout = -1      # nothing to time out: sleep until accept() or shutdown wakes us
        t0 = _monotonic_ns()
        stats.blocked_since_ns = t0
        try:
            ready = self._poller.poll(timeout)
        finally:
            self._selecting = False
            now = self._now_ns = _monotonic_ns()
            stats.blocked_since_ns = 0
            stats.idle_ns += now - t0
        for conn, mask in ready:
            if conn is None:
                self._waker.drain()
                continue
            if conn.closed:
                continue
            if mask & _EVENT_FAILED:
                # Reset by the peer (also seen while muted); a response could not arrive.
                self._disconnected.append((conn, "connection reset by peer"))
                continue
            if conn.handshaking:
                conn.last_active_ns = now
                self._handshake(conn)
                continue
            if mask & EVENT_WRITE and conn.send_parts is not None:
                conn.last_active_ns = now
                with conn.lock:
                    # Only a send this thread owns; a direct send in progress on another
                    # thread holds the lock and hands over whatever it leaves.
                    result = (self._write(conn) if conn.response is not None
                              and conn.send_parts is not None and not conn.closed
                              else _WRITE_PARTIAL)
                if result == _WRITE_DONE:
                    self._completed_sends.append(conn)
                elif result == _WRITE_FAILED:
                    self._disconnected.append((conn, conn.write_error))
                    continue
            if mask & EVENT_READ:
                # Dekker pair with _send_directly: set readable, then look at inflight.
                conn.readable = True
                if conn.inflight is None and not conn.read_paused:
                    if self._blocked or not self._running:
                        # Request queue full (or shutting down): stop reading this socket.
                        self._pause(conn)
                        continue
                    if self._needs_memory(conn):
                        self._pause(conn, for_memory=True)
                        continue
                    conn.last_active_ns = now
                    self._read(conn)

    def _process_completed_receives(self) -> None:
        receives = self._completed_receives
        if not receives:
            return
        self._completed_receives = []
        channel = self._channel
        blocked = self._blocked
        for conn, request in receives:
            if conn.closed:
                continue
            if blocked or not channel.try_send_request(request, self):
                blocked.append((conn, request))

    def _process_completed_sends(self) -> None:
        sends = self._completed_sends
        if not sends:
            return
        self._completed_sends = []
        stats = self._stats
        now = _monotonic_ns()
        for conn in sends:
            with conn.lock:
                response = conn.response
                sizes = conn.send_sizes
                conn.response = None
                conn.send_parts = None
                conn.send_sizes = None
            if response is None:
                continue
            if type(response) is _HeldFlush:
                # held responses written (their metrics were taken): the in-flight request's
                # own answer, if it came meanwhile, is next
                parked = conn.parked
                if parked is not None:
                    conn.parked = None
                    self._responses.append(parked)
                continue
            request = response.request
            request.send_complete_ns = now
            with stats.lock:
                if response.kind == Response.NO_OP:      # it carried held responses only
                    self._update_request_metrics(request, 0)
                else:
                    stats.responses_sent += 1
                    self._update_request_metrics(request, sum(sizes))
            self._release(request)
            if conn.closed:
                continue
            session = conn.session
            if session is not None and session.close_delay_ms is not None:
                self._close_later(conn)         # stays muted until it is closed
                continue
            if response.throttle_ms and conn.inflight is request:
                self._throttle(conn, request, response.throttle_ms)
                continue
            if conn.inflight is request:
                conn.inflight = None            # unmute
            self._update_interest(conn)
            self._maybe_read(conn)

    def _throttle(self, conn: _Connection, request: Request, throttle_ms: int) -> None:
        """Keep ``conn`` muted (``inflight`` stays ``request``) for ``throttle_ms``: Kafka's
        MUTED_AND_THROTTLED channel state after a quota violation. As Kafka's ThrottledChannel,
        the throttle time counts from when the response was handed over (``response_queued_ns``),
        not from when its last byte was written: a slow write does not lengthen it."""
        start = request.response_queued_ns or _monotonic_ns()
        heapq.heappush(self._throttled, (start + throttle_ms * 1_000_000, id(conn), conn, request))
        with self._stats.lock:
            self._stats.throttled_responses += 1

    def _unmute_throttled(self) -> None:
        throttled = self._throttled
        now = _monotonic_ns()
        while throttled and throttled[0][0] <= now:
            _, _, conn, request = heapq.heappop(throttled)
            if conn.closed or conn.inflight is not request:
                continue
            conn.inflight = None
            self._update_interest(conn)
            self._maybe_read(conn)

    def _process_disconnected(self) -> None:
        disconnected = self._disconnected
        while disconnected:
            conn, reason = disconnected.pop()
            self._close(conn, reason)

    def _close_idle_connections(self) -> None:
        now = self._now_ns
        if now < self._next_idle_check_ns:
            return
        if self._max_idle_ns < 0:
            self._next_idle_check_ns = now + self._idle_check_interval_ns
            return
        self._next_idle_check_ns = now + self._idle_check_interval_ns
        limit = now - self._max_idle_ns
        idle = [c for c in self._connections.values() if c.last_active_ns < limit]
        for conn in idle:
            self._stats.idle_closed += 1
            self._close(conn, f"idle for more than connections.max.idle.ms="
                              f"{self._max_idle_ns // 1_000_000}")

    # -- I/O ----------------------------------------------------------------------------
    def _maybe_read(self, conn: _Connection) -> None:
        """Read the next request of an unmuted connection if bytes may be waiting
        (edge-triggered: no new event comes for bytes that arrived while it was muted)."""
        if (conn.inflight is None and not conn.read_paused and not conn.closed
                and not conn.handshaking and self._running and not self._blocked
                and (conn.readable or conn.rbuf is not None)):
            if self._needs_memory(conn):
                self._pause(conn, for_memory=True)
            else:
                self._read(conn)

    def _read(self, conn: _Connection) -> None:
        """Read until one whole frame is here (it becomes the connection's in-flight
        request, muting it), the socket has no more bytes (a short read clears
        ``readable``), or the memory pool refuses the frame (the connection is paused)."""
        sock = conn.sock
        stats = self._stats
        try:
            while True:
                payload = conn.payload
                if payload is not None:
                    # A large frame: read straight into its own buffer, grown as it fills.
                    read = conn.payload_read
                    if read == len(payload):
                        self._grow_payload(conn)
                    want = len(payload) - read
                    n = sock.recv_into(conn.payload_view[read:])
                    if n == 0:
                        self._disconnected.append((conn, "peer closed the connection mid-frame"))
                        return
                    with stats.lock:
                        stats.bytes_in += n
                    read = conn.payload_read = read + n
                    if n < want and not conn.tls:
                        conn.readable = False
                    if read == conn.frame_size:
                        conn.payload = None
                        conn.payload_view = None
                        self._receive(conn, payload)
                        return
                    if not conn.readable:
                        return
                    continue
                rbuf = conn.rbuf
                if rbuf is not None and self._take_frame(conn, rbuf):
                    return
                if conn.payload is not None:
                    continue
                if not conn.readable:
                    return
                scratch = self._scratch
                n = sock.recv_into(self._scratch_view)
                if n == 0:
                    self._disconnected.append((conn, "peer closed the connection"
                                               if rbuf is None else
                                               "peer closed the connection mid-frame"))
                    return
                with stats.lock:
                    stats.bytes_in += n
                if n < _READ_CHUNK and not conn.tls:
                    # (TLS: a read returns at most one record, and OpenSSL may hold more
                    # bytes; read on until it wants more from the socket)
                    conn.readable = False
                if rbuf is None:
                    if n >= 4 and _unpack_size(scratch, 0)[0] == n - 4:
                        # The usual case: exactly one whole frame arrived.
                        size = n - 4
                        self._check_size(size, conn)
                        pool = self._pool
                        if pool is not None:
                            if not pool.try_allocate(size, self):
                                conn.rbuf = scratch[:n]
                                self._pause(conn, for_memory=True)
                                return
                            conn.grant = size
                        self._receive(conn, scratch[4:n])
                        return
                    conn.rbuf = scratch[:n]
                else:
                    rbuf += self._scratch_view[:n]
        except _TLS_WANT:
            conn.readable = False
        except InvalidReceive as e:
            stats.invalid_receives += 1
            log.warning("processor %d: closing connection %s from %s: %s", self.processor_id,
                        conn.connection_id, conn.client_address, e)
            self._disconnected.append((conn, str(e)))
        except OSError as e:
            self._disconnected.append((conn, f"read failed: {e}"))

    @staticmethod
    def _grow_payload(conn: _Connection) -> None:
        """The frame buffer is full but the frame is not: grow it to at most ``_GROWTH``
        times its size (bounded by what arrived), appending zeros (realloc moves large
        buffers without copying; the zeros are the page touches ``bytearray(n)`` makes)."""
        payload = conn.payload
        have = len(payload)
        extra = min(conn.frame_size, (have + 4) * _GROWTH) - have
        conn.payload_view.release()          # a bytearray with exports cannot be resized
        conn.payload_view = None
        while extra > len(_ZEROS):
            payload += _ZEROS
            extra -= len(_ZEROS)
        payload += _ZEROS_VIEW[:extra]
        conn.payload_view = memoryview(payload)

    def _check_size(self, size: int, conn: _Connection) -> None:
        limit, least = self._max_request_size, REQUEST_HEADER_PREFIX_SIZE
        session = conn.session
        if session is not None and not session.authenticated:
            # Before authentication: sasl.server.max.receive.size (Kafka's bound on
            # unauthenticated frames); a bare SASL token may be short.
            limit = session.max_receive_size
            if session.raw_tokens:
                least = 0
        if size < least or size > limit:
            raise InvalidReceive(
                f"Invalid receive (size = {size}"
                + (f" larger than {limit})"
                   if size > limit else
                   f", a request frame has at least {least} bytes)"))

    def _take_frame(self, conn: _Connection, rbuf: bytearray) -> bool:
        """Look at the first frame of the buffered bytes once its size is known: take its
        bytes from the memory pool (refused: the connection is paused for memory, True);
        if it is whole, receive it (True). Otherwise False, and a frame larger than the
        scratch buffer moves to its own buffer once ``_PAYLOAD_MIN`` bytes of it are here
        (sized by what is here, not by the announced size: a slow client's few bytes
        stay in ``rbuf``)."""
        have = len(rbuf)
        if have < 4:
            return False
        size = _unpack_size(rbuf, 0)[0]
        self._check_size(size, conn)
        pool = self._pool
        if pool is not None and not conn.grant:
            if not pool.try_allocate(size, self):
                self._pause(conn, for_memory=True)
                return True
            conn.grant = size
        end = 4 + size
        if have >= end:
            frame = rbuf[4:end]
            if have == end:
                conn.rbuf = None
            else:
                del rbuf[:end]
            self._receive(conn, frame)
            return True
        if size > _READ_CHUNK and have >= _PAYLOAD_MIN:
            got = have - 4
            payload = conn.payload = bytearray(min(size, have * _GROWTH))
            payload[:got] = memoryview(rbuf)[4:]
            conn.payload_view = memoryview(payload)
            conn.payload_read = got
            conn.frame_size = size
            conn.rbuf = None
        return False

    def _receive(self, conn: _Connection, frame: bytearray) -> None:
        """A whole request frame: mute the connection (one request in flight) and queue
        the request for the next hand-off to the handlers. The frame's grant passes to
        the request."""
        session = conn.session
        raw = False
        if (session is not None and session.session_expiry_ns and session.authenticated
                and _monotonic_ns() > session.session_expiry_ns
                and _unpack_size(frame, 0)[0] >> 16 not in _REAUTH_APIS):
            # KIP-368: the session ended and the client did not re-authenticate (SaslHandshake
            # and SaslAuthenticate are a re-authentication)
            log.info("processor %d: closing %s from %s: SASL session expired (connections.max.reauth.ms)",
                     self.processor_id, conn.connection_id, conn.client_address)
            self._disconnected.append((conn, "SASL session expired"))
            conn.read_paused = True
            return
        if session is not None and not session.authenticated:
            raw = session.raw_tokens
            api_key = _unpack_size(frame, 0)[0] >> 16 if not raw else 0
            if not raw and api_key not in _PRE_AUTH_APIS:
                # Kafka's IllegalSaslStateException: only SASL and ApiVersions requests (or a
                # bare token after a v0 handshake) before authentication.
                log.info("processor %d: closing %s from %s: ILLEGAL_SASL_STATE: request (api key %d) "
                         "before SASL authentication completed", self.processor_id,
                         conn.connection_id, conn.client_address, api_key)
                self._disconnected.append((conn, "unexpected request before SASL authentication"))
                conn.read_paused = True          # never read again; closed in this loop
                return
        request = Request(self.processor_id, conn.connection_id, self.listener_name,
                          conn.client_address, memoryview(frame), _monotonic_ns(), raw)
        request.connection = conn
        if conn.grant:
            request.pool_bytes = conn.grant
            conn.grant = 0
        stats = self._stats
        with stats.lock:                 # a responding thread counts pipelined ones too
            stats.requests_received += 1
        conn.inflight = request          # mute
        self._update_interest(conn)
        self._completed_receives.append((conn, request))

    def _write(self, conn: _Connection) -> int:
        """Write as much of the pending response as the socket takes (conn.lock held, on
        any thread). ``_WRITE_DONE``, ``_WRITE_PARTIAL`` (the socket buffer is full, so an
        EVENT_WRITE will follow) or ``_WRITE_FAILED`` (``conn.write_error`` says why)."""
        parts = conn.send_parts
        sizes = conn.send_sizes
        i = conn.send_index
        off = conn.send_offset
        nparts = len(parts)
        sock = conn.sock
        if conn.tls:
            return self._write_tls(conn)
        out = 0
        try:
            while i < nparts:
                part = parts[i]
                if isinstance(part, FileRegion):
                    remaining = sizes[i] - off
                    n = os.sendfile(conn.fd, part.file.fileno(), part.position + off,
                                    min(remaining, _SENDFILE_MAX))
                    if n == 0:
                        raise EOFError(f"file region {part!r} is beyond the end of its file")
                    out += n
                    off += n
                    if off < sizes[i]:
                        if n < min(remaining, _SENDFILE_MAX):
                            return _WRITE_PARTIAL
                        continue
                    i += 1
                    off = 0
                    continue
                # Gather consecutive bytes-like parts into one sendmsg (no joining).
                j = i + 1
                while j < nparts and j - i < _IOV_MAX and not isinstance(parts[j], FileRegion):
                    j += 1
                if off:
                    bufs = [memoryview(part)[off:], *parts[i + 1:j]]
                elif j == i + 1:
                    bufs = (part,)
                else:
                    bufs = parts[i:j]
                flags = _MSG_MORE if j < nparts else 0
                n = sock.sendmsg(bufs, (), flags)
                out += n
                while n > 0:
                    left = sizes[i] - off
                    if n >= left:
                        n -= left
                        i += 1
                        off = 0
                    else:
                        off += n
                        n = 0
                if i < j:
                    return _WRITE_PARTIAL
            return _WRITE_DONE
        except (BlockingIOError, InterruptedError):
            return _WRITE_PARTIAL
        except Exception as e:
            # OSError: reset / broken pipe; ValueError/TypeError: a closed file behind a
            # FileRegion, or a bad part; EOFError: a region beyond the end of its file.
            conn.write_error = f"write failed: {e!r}"
            return _WRITE_FAILED
        finally:
            conn.send_index = i
            conn.send_offset = off
            if out:
                stats = self._stats
                with stats.lock:
                    stats.bytes_out += out

    # -- security -------------------------------------------------------------------------
    def _handshake(self, conn: _Connection) -> None:
        """Advance a TLS handshake on a readiness event (never blocks: the socket is
        non-blocking, OpenSSL says what it waits for). A failure closes only this connection."""
        try:
            conn.sock.do_handshake()
        except _TLS_WANT:
            return
        except (ssl.SSLError, OSError, ValueError) as e:
            self._stats.invalid_receives += 1
            log.info("processor %d: TLS handshake with %s failed, closing %s: %s", self.processor_id,
                     conn.client_address, conn.connection_id, e)
            self._disconnected.append((conn, f"TLS handshake failed: {e}"))
            return
        conn.handshaking = False
        session = conn.session
        if session.sasl is None:
            try:
                cert = conn.sock.getpeercert()
            except (ssl.SSLError, OSError, ValueError):
                cert = None
            session.principal = ssl_principal(cert, self._security.principal_mapper)
        log.debug("processor %d: TLS handshake with %s done (%s, %s)", self.processor_id,
                  conn.client_address, conn.sock.version(), session.principal)
        conn.readable = True             # application data may have come with the Finished
        self._maybe_read(conn)

    def _write_tls(self, conn: _Connection) -> int:
        """``_write`` for a TLS connection (``conn.lock`` held): the pending parts go through
        SSL_write in chunks of up to ``_TLS_CHUNK`` bytes; FileRegions are read into the chunk
        (no sendfile through TLS). A chunk SSL_write could not finish is kept in
        ``conn.tls_out`` and retried as it is, as OpenSSL requires."""
        parts = conn.send_parts
        sizes = conn.send_sizes
        i = conn.send_index
        off = conn.send_offset
        nparts = len(parts)
        sock = conn.sock
        out = 0
        try:
            while True:
                chunk = conn.tls_out
                if chunk is None:
                    if i >= nparts:
                        return _WRITE_DONE
                    chunk, i, off = _tls_chunk(parts, sizes, i, off)
                    conn.tls_out = chunk
                n = sock.send(chunk)
                out += n
                conn.tls_out = chunk[n:] if n < len(chunk) else None
        except _TLS_WANT:
            return _WRITE_PARTIAL
        except Exception as e:
            conn.write_error = f"write failed: {e!r}"
            return _WRITE_FAILED
        finally:
            conn.send_index = i
            conn.send_offset = off
            if out:
                stats = self._stats
                with stats.lock:
                    stats.bytes_out += out

    def _close_later(self, conn: _Connection) -> None:
        """A failed authentication: close after connection.failed.authentication.delay.ms
        (Kafka delays it so that a client cannot hammer the broker); muted until then."""
        conn.read_paused = True
        delay_ns = conn.session.close_delay_ms * 1_000_000
        self._delayed_closes.append((_monotonic_ns() + delay_ns, conn))

    def _process_delayed_closes(self) -> None:
        now = _monotonic_ns()
        due = [c for d, c in self._delayed_closes if d <= now]
        if due:
            self._delayed_closes = [(d, c) for d, c in self._delayed_closes if d > now]
            for conn in due:
                self._close(conn, "authentication failed")

    # -- helpers --------------------------------------------------------------------------
    def _update_interest(self, conn: _Connection) -> None:
        if self._poller.edge_triggered:
            return          # registered once for both directions
        events = 0          # pragma: no cover - non-Linux
        if conn.send_parts is not None:
            events = EVENT_WRITE
        elif conn.inflight is None and not conn.read_paused:
            events = EVENT_READ
        if events != conn.events:
            self._poller.modify(conn.fd, events)
            conn.events = events

    def _update_request_metrics(self, request: Request, bytes_out: int) -> None:
        """Per-api counters (see ``metrics.ApiStats``); the caller holds ``self._stats.lock``."""
        stats = self._stats
        s = stats.api.get(request.api_key)
        if s is None:
            s = stats.api_stats(request.api_key)
        received = request.received_ns
        dequeued = request.dequeued_ns
        queued = request.response_queued_ns
        sending = request.response_dequeued_ns
        end = request.send_complete_ns
        s.count += 1
        s.bytes_in += request.payload.nbytes + 4
        s.bytes_out += bytes_out
        s.total_ns += end - received
        if dequeued:
            s.request_queue_ns += dequeued - received
            if queued:
                s.handle_ns += queued - dequeued
        if queued:
            s.response_queue_ns += sending - queued
        s.response_send_ns += end - sending

    def _close(self, conn: _Connection, reason: str) -> None:
        with conn.lock:                  # waits for a direct send in progress
            if conn.closed:
                return
            conn.closed = True
            log.debug("processor %d: closing %s: %s", self.processor_id, conn.connection_id,
                      reason)
            try:
                self._poller.unregister(conn.fd)
            except (KeyError, ValueError, OSError):
                pass
            conn.events = 0
            try:
                conn.sock.close()
            except OSError:
                pass
            conn.tls_out = None
            if conn.inflight is not None:
                self._release(conn.inflight)
            conn.inflight = None
            conn.response = None
            conn.send_parts = None
            conn.held = None
            conn.parked = None
            conn.rbuf = None
            conn.payload = conn.payload_view = None
            if conn.grant:               # a frame read in part
                self._pool.release(conn.grant)
                conn.grant = 0
        if self._connections.get(conn.connection_id) is conn:
            del self._connections[conn.connection_id]
        self._stats.connections_closed += 1
        self._quotas.dec(conn.client_address[0])

    def _close_all(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn, "processor shutting down")
        while True:
            try:
                sock, addr = self._new_connections.get_nowait()
            except queue.Empty:
                break
            sock.close()
            self._quotas.dec(addr[0])
        self._responses.clear()
        self._resumed.clear()
        self._blocked.clear()
        self._paused.clear()
        self._memory_paused.clear()
        self._poller.close()
        self._waker.close()
