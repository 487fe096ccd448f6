"""The per-request fast paths: direct sends, buffered edge-triggered reads, the request
channel's hand-off to idle handlers, and acks=all answered without the purgatory.

Each guards a measured cost (see kbroker/network/processor.py and channel.py); the
behaviour must stay exactly Kafka's, so every test also checks the answers.
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
import types

import pytest

from kbroker.network import RequestChannel
from kbroker.network import processor as processor_mod
from kbroker.protocol import ErrorCode
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_manager import ProducePartitionResult, ReplicaManager
from kbroker.server.timer import SystemTimer
from tests.test_network import (
    connect, echo, frame, read_echo, running_server, wait_until,
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


# -- acks=all without the purgatory ------------------------------------------------------
class _StubLog:
    def __init__(self):
        self.high_watermark = 0
        self.log_end_offset = 0

    def update_high_watermark(self, offset):
        self.high_watermark = offset
        return offset


class _StubPartition:
    """A partition whose high watermark moves only when told (a lagging follower)."""

    def __init__(self, follows_leader: bool):
        self.log = _StubLog()
        self.follows_leader = follows_leader

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

    def append(tp, buf, internal, version):
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
