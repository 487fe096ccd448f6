"""The per-request fast paths: direct sends, buffered edge-triggered reads, the request
channel's hand-off to idle handlers, and acks=all answered without the purgatory.

Each guards a measured cost (see kbroker/network/processor.py and channel.py); the
behaviour must stay exactly Kafka's, so every test also checks the answers.
"""
from __future__ import annotations

import collections
import os
import select
import socket
import struct
import threading
import time
import types

import pytest

from kbroker.log.config import LogConfig
from kbroker.network import RequestChannel
from kbroker.network import processor as processor_mod
from kbroker.protocol import ErrorCode
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_manager import ProducePartitionResult, ReplicaManager
from kbroker.server.timer import SystemTimer
from tests.test_network import (
    connect, echo, frame, read_echo, recv_exact, running_server, wait_until,
)

pytestmark = pytest.mark.timeout(60)


# -- network: direct send --------------------------------------------------------------------
def test_direct_send_does_not_wake_the_processor(monkeypatch):
    """A handler's response to the request its connection waits for is written on the
    handler thread: no response queue, no eventfd wake-up of the processor."""
    wakes = []
    real_wake = processor_mod._Waker.wake

    def counting_wake(self):
        wakes.append(threading.current_thread().name)
        real_wake(self)

    with running_server(lambda ch, r: echo(ch, r), num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.sendall(frame(0, b"warm-up"))           # the acceptor's hand-over wakes it
            assert read_echo(s) == (0, b"warm-up")
            monkeypatch.setattr(processor_mod._Waker, "wake", counting_wake)
            for i in range(1, 50):
                s.sendall(frame(i, b"%d" % i))
                assert read_echo(s) == (i, b"%d" % i)
            monkeypatch.setattr(processor_mod._Waker, "wake", real_wake)
        # The counters move just after the write returns, so the client can read the
        # last answer a moment before they do.
        wait_until(lambda: server.metrics.totals()["responses_sent"] == 50,
                   what="50 responses counted")
        assert server.processors[0].response_queue_size() == 0
    assert wakes == []
    api = server.metrics.api_totals()[18]
    assert api["count"] == 50 and api["bytes_out"] == sum(8 + len(b"%d" % i) for i in range(1, 50)) + 15


def test_pipelined_frames_in_one_segment_are_answered_in_order():
    """Many whole frames arrive in one recv: they wait in the connection's buffer and
    are handed on one at a time (one in flight), without new readiness events."""
    seen_inflight = []
    lock = threading.Lock()
    active = [0]

    def handle(channel, request):
        with lock:
            active[0] += 1
            seen_inflight.append(active[0])
        time.sleep(0.001)
        with lock:
            active[0] -= 1
        echo(channel, request)

    with running_server(handle, io_threads=4) as server:
        with connect(server.bound_port()) as s:
            blob = b"".join(frame(i, b"p%d" % i) for i in range(200))
            s.sendall(blob)
            for i in range(200):
                assert read_echo(s) == (i, b"p%d" % i)
    assert max(seen_inflight) == 1


def test_pipelined_frames_are_served_back_to_back_by_the_answering_handler(monkeypatch):
    """Whole pipelined frames waiting in the read buffer are taken by the thread that
    answered the previous request and handled by it next (the channel's next slot):
    one handler serves them all, the processor is not woken per request, answers stay
    in order with one request in flight, and every request is counted once."""
    wakes = []
    real_wake = processor_mod._Waker.wake
    threads = []
    active = [0]
    max_active = [0]
    lock = threading.Lock()

    def counting_wake(self):
        wakes.append(threading.current_thread().name)
        real_wake(self)

    def handle(channel, request):
        with lock:
            active[0] += 1
            max_active[0] = max(max_active[0], active[0])
            threads.append(threading.current_thread().name)
            active[0] -= 1
        echo(channel, request)

    n = 100
    with running_server(handle, io_threads=4, num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.sendall(frame(0, b"warm-up"))
            assert read_echo(s) == (0, b"warm-up")
            threads.clear()
            monkeypatch.setattr(processor_mod._Waker, "wake", counting_wake)
            s.sendall(b"".join(frame(i, b"q%d" % i) for i in range(1, n + 1)))  # one segment
            for i in range(1, n + 1):
                assert read_echo(s) == (i, b"q%d" % i)
            monkeypatch.setattr(processor_mod._Waker, "wake", real_wake)
        wait_until(lambda: server.metrics.totals()["responses_sent"] == n + 1,
                   what="all responses counted")
        assert server.metrics.totals()["requests_received"] == n + 1
        assert server.channel.request_queue_size() == 0
    assert max_active[0] == 1
    assert len(threads) == n
    # The processor reads the segment and hands on the first frame; the handler that
    # answers it takes the next, and so on.
    assert len(set(threads)) == 1, collections.Counter(threads)
    assert len(wakes) <= 1, wakes


def test_pipelined_frames_still_in_the_socket_are_read_by_the_answering_handler(monkeypatch):
    """Frames a client pipelines while its connection is muted stay in the socket (the
    processor does not read a muted connection). The thread that answers the in-flight
    request reads them itself (one non-blocking read of the muted connection) and takes
    the next whole frame: more than one read buffer of pipelined frames is served by one
    handler, in order, without waking the processor, and every byte is counted once."""
    wakes = []
    real_wake = processor_mod._Waker.wake
    threads = []
    first = threading.Event()

    def counting_wake(self):
        wakes.append(threading.current_thread().name)
        real_wake(self)

    def handle(channel, request):
        if request.correlation_id == 1:
            assert first.wait(10)
        threads.append(threading.current_thread().name)
        channel.send_response(request, [struct.pack(">ii", 4, request.correlation_id)])

    n = 40
    body = b"x" * 4000                      # 40 frames: more than two 64 KiB reads
    with running_server(handle, io_threads=4, num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.sendall(frame(0, b"warm-up"))
            assert read_echo(s) == (0, b"")
            threads.clear()
            s.sendall(frame(1, body))
            wait_until(lambda: server.channel.request_queue_size() == 0 and not threads
                       and any(c.inflight is not None for c in server.processors[0]._connections.values()),
                       what="request 1 in flight")
            s.sendall(b"".join(frame(i, body) for i in range(2, n + 1)))
            conn = next(iter(server.processors[0]._connections.values()))
            wait_until(lambda: conn.readable, what="the processor saw the pipelined bytes arrive")
            monkeypatch.setattr(processor_mod._Waker, "wake", counting_wake)
            first.set()
            for i in range(1, n + 1):
                assert read_echo(s) == (i, b"")
            monkeypatch.setattr(processor_mod._Waker, "wake", real_wake)
        wait_until(lambda: server.metrics.totals()["responses_sent"] == n + 1,
                   what="all responses counted")
        totals = server.metrics.totals()
        assert totals["requests_received"] == n + 1
        assert totals["bytes_in"] == len(frame(0, b"warm-up")) + n * len(frame(1, body))
    assert len(threads) == n
    assert len(set(threads)) == 1, collections.Counter(threads)
    assert wakes == []


def test_part_of_a_pipelined_frame_read_ahead_waits_for_its_edge_without_a_wake_up(monkeypatch):
    """The answering thread's read-ahead finds only the start of the next frame: it
    leaves it in the buffer and unmutes without waking the processor (the rest of the
    frame raises a new EPOLLIN edge, which does); the frame is then served whole."""
    wakes = []
    real_wake = processor_mod._Waker.wake
    first = threading.Event()

    def counting_wake(self):
        wakes.append(threading.current_thread().name)
        real_wake(self)

    def handle(channel, request):
        if request.correlation_id == 1:
            assert first.wait(10)
        channel.send_response(request, _one_part(request, bytes(request.payload[8:])))

    second = frame(2, b"z" * 3000)
    with running_server(handle, io_threads=2, num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(frame(1, b"one"))
            conn = None

            def in_flight():
                nonlocal conn
                conns = list(server.processors[0]._connections.values())
                conn = conns[0] if conns else None
                return conn is not None and conn.inflight is not None

            wait_until(in_flight, what="request 1 in flight")
            s.sendall(second[:1000])
            wait_until(lambda: conn.readable, what="the processor saw the first 1000 bytes")
            wait_until(lambda: server.processors[0]._selecting, what="the processor back in poll")
            monkeypatch.setattr(processor_mod._Waker, "wake", counting_wake)
            first.set()
            assert read_echo(s) == (1, b"one")
            wait_until(lambda: conn.inflight is None, what="unmuted")
            assert conn.rbuf is not None and len(conn.rbuf) == 1000
            assert wakes == []
            monkeypatch.setattr(processor_mod._Waker, "wake", real_wake)
            s.sendall(second[1000:])
            assert read_echo(s) == (2, b"z" * 3000)
        wait_until(lambda: server.metrics.totals()["responses_sent"] == 2, what="both counted")
        assert server.metrics.totals()["bytes_in"] == len(frame(1, b"one")) + len(second)


def test_pipelined_frames_with_a_full_request_queue_are_kept_by_the_processor():
    """A pipelined frame taken by the answering thread while the request queue is full
    goes back to the processor (as a blocked request) and is still answered in order."""
    release = threading.Event()
    refused = []

    def handle(channel, request):
        if request.api_key == 1:                 # connection X: holds handler A
            release.wait(5)
        elif request.api_key == 18 and request.correlation_id == 0:
            # handler B, first frame of the pipelining connection: wait until Y's
            # request fills the queue, so taking the next frame is refused
            wait_until(lambda: channel.request_queue_size() == 1, what="queue full")
        echo(channel, request)

    with running_server(handle, io_threads=2, num_network_threads=1,
                        queued_max_requests=1) as server:
        channel = server.channel
        real_try = channel.try_send_request

        def spying_try(request, processor, to_caller=False):
            ok = real_try(request, processor, to_caller)
            if to_caller and not ok:
                refused.append(request.correlation_id)
            return ok

        channel.try_send_request = spying_try
        port = server.bound_port()
        with connect(port) as x, connect(port) as y, connect(port) as s:
            x.sendall(frame(0, b"hold", api_key=1))
            wait_until(lambda: server.metrics.totals()["requests_received"] == 1
                       and channel.request_queue_size() == 0, what="X's request taken")
            s.sendall(b"".join(frame(i, b"r%d" % i) for i in range(20)))
            wait_until(lambda: server.metrics.totals()["requests_received"] == 2,
                       what="first pipelined frame taken")
            y.sendall(frame(7, b"y", api_key=2))
            wait_until(lambda: refused, what="a refused next request")
            release.set()
            assert read_echo(x) == (0, b"hold")
            assert read_echo(y) == (7, b"y")
            for i in range(20):
                assert read_echo(s) == (i, b"r%d" % i)
    assert refused == [1]


def test_next_slot_is_used_only_by_handler_threads_and_never_overtakes_the_queue():
    channel = RequestChannel(queue_size=10)

    class Sink:
        def wakeup(self):
            pass

    sink = Sink()
    a, b, c = object(), object(), object()
    # Not a handler thread: to_caller is ignored, the request is queued.
    assert channel.try_send_request(a, sink, to_caller=True)
    assert channel.receive_request(0.01) is a
    channel.register_handler_thread()
    # Something queued: the next request queues behind it (FIFO).
    assert channel.try_send_request(a, sink)
    assert channel.try_send_request(b, sink, to_caller=True)
    assert channel.receive_request(0.01) is a
    assert channel.receive_request(0.01) is b
    # Queue empty: kept in this thread's slot (not queued, so not counted), returned first.
    assert channel.try_send_request(b, sink, to_caller=True)
    assert channel.request_queue_size() == 0
    assert channel.try_send_request(c, sink, to_caller=True)  # slot taken: queued
    assert channel.request_queue_size() == 1
    got = []
    t = threading.Thread(target=lambda: got.append(channel.receive_request(1)))
    t.start()
    t.join(5)
    assert got == [c]                     # another thread never sees this one's slot
    assert channel.receive_request(0.01) is b
    assert channel.receive_request(0.01) is None
    assert channel.request_queue_size() == 0


def _one_part(request, body: bytes) -> list:
    """A response frame as one bytes part (the direct send's one-``send`` case)."""
    return [struct.pack(">ii", 4 + len(body), request.correlation_id) + body]


def test_request_metrics_of_direct_sends_add_up():
    """Per-api metrics of requests answered by direct sends, pipelined ones included:
    RequestQueueTime + LocalTime + ResponseQueueTime + ResponseSendTime == TotalTime (one
    clock reading ends a response and starts the next pipelined request), a direct send
    has no response queue (0 ns), the handler's time is in LocalTime, and every request
    and byte is counted once."""
    def handle(channel, request):
        time.sleep(0.002)
        channel.send_response(request, _one_part(request, bytes(request.payload[8:])))

    n = 30
    frames = [frame(i, b"m%d" % i) for i in range(n)]
    with running_server(handle, io_threads=2, num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.sendall(b"".join(frames))
            for i in range(n):
                assert read_echo(s) == (i, b"m%d" % i)
        wait_until(lambda: server.metrics.totals()["responses_sent"] == n, what="all responses counted")
        totals = server.metrics.totals()
        api = server.metrics.api_totals()[18]
    assert totals["requests_received"] == n and totals["requests_handled"] == n
    assert totals["bytes_in"] == api["bytes_in"] == sum(len(f) for f in frames)
    assert totals["bytes_out"] == api["bytes_out"] == sum(8 + len(b"m%d" % i) for i in range(n))
    assert api["count"] == n
    assert api["response_queue_ns"] == 0
    assert api["handle_ns"] >= n * 2_000_000
    assert min(api["request_queue_ns"], api["response_send_ns"]) >= 0
    assert (api["request_queue_ns"] + api["handle_ns"] + api["response_queue_ns"]
            + api["response_send_ns"]) == api["total_ns"]


def test_one_part_response_larger_than_the_socket_buffer_is_finished_by_the_processor():
    """A direct send whose one ``send`` leaves bytes over hands the rest to the processor:
    the frame arrives whole and byte-identical, the pipelined request behind it is answered
    next, and the bytes are counted once."""
    big = os.urandom(16 << 20)

    def handle(channel, request):
        body = big if request.correlation_id == 1 else b"small"
        channel.send_response(request, _one_part(request, body))

    with running_server(handle, io_threads=2, num_network_threads=1) as server:
        with connect(server.bound_port()) as s:
            s.sendall(frame(1, b"a") + frame(2, b"b"))
            wait_until(lambda: any(c.send_parts is not None and c.response is not None
                                   for c in list(server.processors[0]._connections.values())),
                       what="the rest of the response left to the processor")
            (size,) = struct.unpack(">i", recv_exact(s, 4))
            assert size == 4 + len(big)
            assert recv_exact(s, 4) == struct.pack(">i", 1)
            assert recv_exact(s, len(big)) == big
            assert read_echo(s) == (2, b"small")
        wait_until(lambda: server.metrics.totals()["responses_sent"] == 2, what="both counted")
        assert server.metrics.totals()["bytes_out"] == 8 + len(big) + 8 + 5


def test_frame_split_across_many_segments_and_large_frames():
    """Size prefix and payload trickle in byte by byte; frames larger than the read
    buffer get their own buffer."""
    with running_server(lambda ch, r: echo(ch, r)) as server:
        with connect(server.bound_port()) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = frame(1, b"trickle")
            for b in data:
                s.send(bytes([b]))
                time.sleep(0.0005)
            assert read_echo(s) == (1, b"trickle")
            big = bytes(range(256)) * 1024            # 256 KiB > the 64 KiB read buffer
            s.sendall(frame(2, big) + frame(3, b"after"))
            assert read_echo(s) == (2, big)
            assert read_echo(s) == (3, b"after")


def test_level_triggered_poll_fallback(monkeypatch):
    """Without epoll (e.g. macOS) the processor changes interest masks and never sends
    directly; the same traffic must work."""
    monkeypatch.setattr(processor_mod, "select", types.SimpleNamespace(
        poll=select.poll, POLLIN=select.POLLIN, POLLOUT=select.POLLOUT,
        POLLERR=select.POLLERR, POLLHUP=select.POLLHUP))

    def handle(channel, request):
        if request.correlation_id % 3 == 1:
            channel.send_no_op_response(request)
        else:
            echo(channel, request)

    with running_server(handle) as server:
        assert not server.processors[0]._direct_send
        with connect(server.bound_port()) as s:
            s.sendall(b"".join(frame(i, b"x%d" % i) for i in range(30)))
            expected = [(i, b"x%d" % i) for i in range(30) if i % 3 != 1]
            assert [read_echo(s) for _ in expected] == expected
            big = b"z" * (300 << 10)
            s.sendall(frame(99, big))
            assert read_echo(s) == (99, big)


# -- the request channel ------------------------------------------------------------------
def test_request_goes_to_the_handler_that_became_idle_last():
    channel = RequestChannel(queue_size=10)
    got: dict[str, object] = {}

    def wait(name):
        got[name] = channel.receive_request(2.0)

    first = threading.Thread(target=wait, args=("first",))
    first.start()
    wait_until(lambda: len(channel._idle) == 1, what="first handler idle")
    second = threading.Thread(target=wait, args=("second",))
    second.start()
    wait_until(lambda: len(channel._idle) == 2, what="second handler idle")
    req = object()
    assert channel.try_send_request(req, None)
    second.join(2)
    assert got == {"second": req}             # exactly one woken: the last one idle
    assert channel.request_queue_size() == 0
    first.join(3)
    assert got == {"second": req, "first": None}   # the other timed out, empty-handed
    assert channel._idle == []


def test_request_channel_shutdown_reaches_waiting_and_later_handlers():
    channel = RequestChannel(queue_size=2)
    results = []
    t = threading.Thread(target=lambda: results.append(channel.receive_request()))
    t.start()
    wait_until(lambda: channel._idle, what="handler idle")
    channel.send_shutdown_request()
    t.join(2)
    channel.send_shutdown_request()                # queued: nobody waits
    assert channel.receive_request(0.1) is not None
    assert len(results) == 1 and results[0] is not None and channel.request_queue_size() == 0


def test_request_channel_hands_each_request_to_exactly_one_thread_with_timeouts_racing():
    """Threads waiting with short timeouts (each reuses its own idle handle) race the
    putter: every request is received exactly once, none is counted once handed over,
    and the queue bound still refuses (and later wakes) a processor."""
    channel = RequestChannel(queue_size=3)
    n = 4000
    got = []
    got_lock = threading.Lock()
    stop = threading.Event()

    def consumer():
        mine = []
        while not stop.is_set():
            r = channel.receive_request(0.0005)
            if r is not None:
                mine.append(r)
        with got_lock:
            got.extend(mine)

    class Sink:
        def __init__(self):
            self.woken = threading.Event()

        def wakeup(self):
            self.woken.set()

    sink = Sink()
    threads = [threading.Thread(target=consumer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        refused = 0
        for i in range(n):
            deadline = time.monotonic() + 5
            while not channel.try_send_request(i, sink):
                refused += 1
                assert sink.woken.wait(5), "a refused processor is woken when the queue drains"
                sink.woken.clear()
                assert time.monotonic() < deadline
            assert channel.request_queue_size() <= 3
        wait_until(lambda: channel.request_queue_size() == 0, what="queue drained")
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    assert sorted(got) == list(range(n))
    assert channel.request_queue_size() == 0 and not channel._idle


# -- acks=all without the purgatory ------------------------------------------------------
class _StubLog:
    def __init__(self):
        self.high_watermark = 0
        self.log_end_offset = 0
        self.config = LogConfig()  # min.insync.replicas 1: acks=all is checked against it

    def update_high_watermark(self, offset):
        self.high_watermark = offset
        return offset


class _StubPartition:
    """A partition whose high watermark moves only when told (a lagging follower)."""

    def __init__(self, follows_leader: bool):
        self.log = _StubLog()
        self.follows_leader = follows_leader
        self.isr = frozenset({1})
        self.leader_state = None   # not replicated (Partition.leader_state: KRaft only)
        self.is_leader = True

    def maybe_increment_high_watermark(self):
        if self.follows_leader:
            self.log.high_watermark = self.log.log_end_offset
            return True
        return False


def _replica_manager(follows_leader: bool):
    now = [0]
    timer = SystemTimer("Produce", clock_ms=lambda: now[0], start_ms=0)
    produce = DelayedOperationPurgatory("Produce", timer=timer, reaper_enabled=False)
    fetch = DelayedOperationPurgatory("Fetch", reaper_enabled=False, timer_enabled=False)
    rm = ReplicaManager(None, None, 0, produce, fetch, time_ms=lambda: 0)
    part = _StubPartition(follows_leader)
    rm._partitions = {("t", 0): part}

    def append(tp, buf, internal, version, now=None):
        part.log.log_end_offset += 3
        return ProducePartitionResult(ErrorCode.NONE, part.log.log_end_offset - 3, -1, 0,
                                      last_offset=part.log.log_end_offset - 1)

    rm._append_to_local_log = append
    return rm, part, produce, now


def test_acks_all_answered_at_once_when_the_high_watermark_is_reached():
    rm, _, purgatory, _ = _replica_manager(follows_leader=True)
    answers = []
    rm.append_records(30000, -1, {("t", 0): b"batch"}, answers.append)
    assert len(answers) == 1 and answers[0][("t", 0)].error == ErrorCode.NONE
    assert answers[0][("t", 0)].base_offset == 0
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0
    purgatory.shutdown()


def test_acks_all_waits_in_the_purgatory_until_the_high_watermark_moves():
    rm, part, purgatory, _ = _replica_manager(follows_leader=False)
    answers = []
    rm.append_records(30000, -1, {("t", 0): b"batch"}, answers.append)
    assert answers == [] and purgatory.watched() == 1 and purgatory.num_delayed() == 1
    part.log.high_watermark = 3                       # the follower caught up
    assert purgatory.check_and_complete(("t", 0)) == 1
    assert len(answers) == 1 and answers[0][("t", 0)].error == ErrorCode.NONE
    assert purgatory.num_delayed() == 0
    purgatory.shutdown()


def test_acks_all_times_out_with_request_timed_out():
    rm, _, purgatory, now = _replica_manager(follows_leader=False)
    answers = []
    rm.append_records(100, -1, {("t", 0): b"batch"}, answers.append)
    assert answers == []
    now[0] = 150
    purgatory.advance_clock(0)
    assert len(answers) == 1 and answers[0][("t", 0)].error == ErrorCode.REQUEST_TIMED_OUT
    purgatory.shutdown()


def test_acks_one_never_uses_the_purgatory():
    rm, _, purgatory, _ = _replica_manager(follows_leader=False)
    answers = []
    rm.append_records(100, 1, {("t", 0): b"batch"}, answers.append)
    assert len(answers) == 1 and purgatory.watched() == 0
    purgatory.shutdown()


def test_check_and_complete_with_nothing_watched_is_zero():
    purgatory = DelayedOperationPurgatory("Produce", reaper_enabled=False, timer_enabled=False)
    assert purgatory.check_and_complete(("t", 0)) == 0
    assert purgatory.watched_keys() == 0
    purgatory.shutdown()
