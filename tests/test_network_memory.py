"""Bounded memory in the network layer: the memory pool (``queued.max.request.bytes``),
frame buffers that grow with what arrives, per-IP connection limits with overrides, and
the idle reaper for connections stuck in the middle of a frame.

The whole-broker proof (1,000 hostile connections against ``kbroker serve``) is
``tests/broker/test_memory_bound.py``.
"""
from __future__ import annotations

import socket
import struct
import threading

import pytest

from kbroker.network.acceptor import ConnectionQuotas, normalise_ip
from kbroker.network.channel import Request
from kbroker.network.memory_pool import MemoryPool
from tests.test_network import (
    CLIENT_TIMEOUT_S, _reset_close, assert_closed_by_server, connect, echo, frame, read_echo,
    running_server, wait_until,
)

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


class Waiter:
    def __init__(self):
        self.woken = 0

    def wakeup(self):
        self.woken += 1


def _request(pool_bytes: int) -> Request:
    r = Request(0, "c", "PLAINTEXT", ("127.0.0.1", 1), memoryview(bytes(8)), 0)
    r.pool_bytes = pool_bytes
    return r


# -- MemoryPool ---------------------------------------------------------------------------
def test_pool_grant_and_release():
    pool = MemoryPool(100, 60)
    assert pool.try_allocate(30) and pool.try_allocate(30)
    assert pool.available == 40 and pool.used == 60 and not pool.is_out_of_memory()
    pool.release(30)
    pool.release(30)
    assert pool.available == 100 and pool.used == 0


def test_pool_is_not_strict_and_refuses_only_when_empty():
    """Kafka's SimpleMemoryPool(strict=false): granted while *any* memory is left, so the
    pool dips below zero by less than one request; refused at <= 0."""
    pool = MemoryPool(100, 60)
    waiter = Waiter()
    assert pool.try_allocate(60)              # 40 left
    assert pool.try_allocate(60)              # larger than what is left: granted, -20
    assert pool.available == -20 and pool.is_out_of_memory()
    assert not pool.try_allocate(1, waiter)   # exhausted: refused, waiter remembered
    assert pool.wait_for_memory(waiter)       # still out: registered (once)
    pool.release(10)                          # -10: still out of memory, nobody woken
    assert waiter.woken == 0
    pool.release(50)                          # 40: memory again, the waiter is woken once
    assert waiter.woken == 1
    pool.release(60)
    assert waiter.woken == 1 and pool.available == 100
    assert not pool.wait_for_memory(waiter)   # memory now: not registered
    pool.release(0)
    assert waiter.woken == 1


def test_pool_refuses_a_request_larger_than_its_max_single_allocation():
    """A single request larger than the pool cannot be granted: the pool refuses to exist
    with max_single > size (KafkaConfig refuses queued.max.request.bytes below
    socket.request.max.bytes), and an allocation above max_single is a bug (frames above
    socket.request.max.bytes are refused before the pool is asked)."""
    with pytest.raises(ValueError):
        MemoryPool(100, 101)
    for bad in ((0, 1), (-1, 1), (10, 0)):
        with pytest.raises(ValueError):
            MemoryPool(*bad)
    pool = MemoryPool(100, 100)
    for n in (101, 0, -5):
        with pytest.raises(ValueError):
            pool.try_allocate(n)
    assert pool.try_allocate(100) and pool.available == 0     # exactly the whole pool
    assert not pool.try_allocate(1)


def test_pool_release_request_is_idempotent_across_threads():
    pool = MemoryPool(1000, 100)
    requests = [_request(100) for _ in range(10)]
    for _ in requests:
        assert pool.try_allocate(100)
    assert pool.available == 0
    barrier = threading.Barrier(4)

    def release_all():
        barrier.wait()
        for r in requests:
            pool.release_request(r)

    threads = [threading.Thread(target=release_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert pool.available == 1000 and all(r.pool_bytes == 0 for r in requests)


# -- the pool in the processors -----------------------------------------------------------
def _hold_handler(held: dict, release: threading.Event):
    """Echo, except that requests with a correlation id >= 100 wait for ``release``."""
    def handle(channel, request):
        if request.correlation_id >= 100:
            held[request.correlation_id] = request
            assert release.wait(20)
        echo(channel, request)
    return handle


def test_empty_pool_stops_reading_until_a_request_is_done():
    """Back-pressure, not allocation: with the pool taken, a new request is not read (its
    connection is paused for memory) until a request's bytes are returned."""
    held, release = {}, threading.Event()
    limit = 64 * 1024
    with running_server(_hold_handler(held, release), num_network_threads=1,
                        socket_request_max_bytes=limit, queued_max_request_bytes=limit) as server:
        pool = server.memory_pool
        port = server.bound_port()
        processor = server.processors[0]
        with connect(port) as big, connect(port) as small:
            body = b"b" * (limit - 8)
            big.sendall(frame(100, body))              # takes the whole pool, then waits
            wait_until(lambda: 100 in held, what="big request handled")
            assert pool.available == 0
            small.sendall(frame(1, b"small"))          # no memory: not read
            wait_until(lambda: processor.memory_paused_count() == 1, what="memory pause")
            bytes_in = server.metrics.totals()["bytes_in"]
            assert server.metrics.totals()["requests_received"] == 1
            release.set()                              # big is answered: 64 KiB returned
            assert read_echo(big) == (100, body)
            assert read_echo(small) == (1, b"small")
            assert server.metrics.totals()["bytes_in"] > bytes_in
            wait_until(lambda: pool.used == 0, what="all bytes returned")
        assert processor.memory_paused_count() == 0


def test_connections_holding_a_grant_keep_reading_when_the_pool_is_empty():
    """Two frames granted together overdraw the pool (not strict); both are still read to
    the end, a third connection waits, and everything is returned afterwards."""
    held, release = {}, threading.Event()
    limit = 256 * 1024
    with running_server(_hold_handler(held, release), num_network_threads=1, io_threads=3,
                        socket_request_max_bytes=limit, queued_max_request_bytes=limit) as server:
        pool = server.memory_pool
        port = server.bound_port()
        with connect(port) as a, connect(port) as b, connect(port) as c:
            fa, fb = frame(100, b"a" * 200_000), frame(101, b"b" * 200_000)
            a.sendall(fa[:1000])
            b.sendall(fb[:1000])                       # both sizes known: both granted
            wait_until(lambda: pool.available == limit - 2 * (len(fa) - 4), what="grants")
            assert pool.is_out_of_memory()
            c.sendall(frame(2, b"c"))                  # refused
            wait_until(lambda: server.processors[0].memory_paused_count() == 1, what="pause")
            a.sendall(fa[1000:])
            b.sendall(fb[1000:])
            wait_until(lambda: 100 in held and 101 in held, what="both frames read")
            release.set()
            assert read_echo(a)[0] == 100 and read_echo(b)[0] == 101
            assert read_echo(c) == (2, b"c")
        wait_until(lambda: pool.used == 0, what="all bytes returned")


@pytest.mark.parametrize("stage", ["mid-frame", "in-flight"])
def test_pool_bytes_are_returned_when_the_connection_closes(stage):
    held, release = {}, threading.Event()
    limit = 128 * 1024
    try:
        with running_server(_hold_handler(held, release), num_network_threads=1,
                            socket_request_max_bytes=limit,
                            queued_max_request_bytes=limit) as server:
            pool = server.memory_pool
            s = connect(server.bound_port())
            data = frame(100, b"x" * 100_000)
            if stage == "in-flight":
                s.sendall(data)
                wait_until(lambda: 100 in held, what="handled")
                assert pool.used == len(data) - 4
                _reset_close(s)          # a muted connection notices a reset (not a FIN)
            else:
                s.sendall(data[:30_000])
                wait_until(lambda: pool.used == len(data) - 4, what="grant")
                s.close()
            wait_until(lambda: pool.used == 0, what="grant returned on close")
            with connect(server.bound_port()) as s:      # and the broker reads again
                s.sendall(frame(1, b"ok"))
                assert read_echo(s) == (1, b"ok")
            release.set()
    finally:
        release.set()


def test_announced_size_is_not_allocated_and_buffers_grow_with_what_arrives():
    """A frame's buffer holds at most 4x what arrived of it (16 KiB before it gets one)."""
    with running_server(lambda ch, r: echo(ch, r), num_network_threads=1) as server:
        processor = server.processors[0]
        with connect(server.bound_port()) as s:
            s.sendall(struct.pack(">ihhi", 100 * MiB, 0, 9, 7) + b"h" * 100)
            wait_until(lambda: server.metrics.totals()["bytes_in"] == 112, what="bytes read")
            (conn,) = processor._connections.values()
            assert conn.payload is None and len(conn.rbuf) == 112      # small: stays in rbuf
            sent = 112
            for _ in range(20):                          # 20 x 10 KB
                s.sendall(b"x" * 10_000)
                sent += 10_000
                wait_until(lambda: server.metrics.totals()["bytes_in"] == sent, what="read")
                buffered = len(conn.payload) if conn.payload is not None else len(conn.rbuf)
                assert buffered <= 4 * sent, (buffered, sent)
            assert conn.payload is not None and conn.payload_read == sent - 4
        body = bytes(range(256)) * 2048                  # 512 KiB: grows 3 times, intact
        with connect(server.bound_port()) as s:
            for k in range(3):
                s.sendall(frame(k, body))
                assert read_echo(s) == (k, body)


def test_idle_connection_holding_a_partial_frame_is_closed_and_its_grant_returned():
    limit = 1 * MiB
    with running_server(lambda ch, r: echo(ch, r), connections_max_idle_ms=300,
                        socket_request_max_bytes=limit, queued_max_request_bytes=limit) as server:
        pool = server.memory_pool
        with connect(server.bound_port()) as stuck:
            stuck.sendall(struct.pack(">ihhi", limit, 0, 9, 7) + b"p" * 50_000)
            wait_until(lambda: pool.used == limit, what="grant")
            assert pool.is_out_of_memory()
            assert_closed_by_server(stuck)                   # idle for 300 ms: closed
            wait_until(lambda: pool.used == 0, what="grant returned")
        with connect(server.bound_port()) as s:
            s.sendall(frame(1))
            assert read_echo(s) == (1, b"")
        assert server.metrics.totals()["idle_closed"] == 1


def test_socket_server_refuses_a_pool_smaller_than_the_largest_request():
    from kbroker.network import SocketServer, SocketServerConfig

    with pytest.raises(ValueError):
        SocketServer(SocketServerConfig(socket_request_max_bytes=2 * MiB,
                                        queued_max_request_bytes=MiB))
    assert SocketServer(SocketServerConfig(queued_max_request_bytes=-1)).memory_pool is None
    assert SocketServer(SocketServerConfig(queued_max_request_bytes=0)).memory_pool is None


# -- per-IP connection limits -------------------------------------------------------------
def test_quotas_per_ip_with_overrides():
    q = ConnectionQuotas(max_connections=100, max_connections_per_ip=2,
                         max_connections_per_ip_overrides={"10.0.0.1": 3, "::ffff:10.0.0.2": 0,
                                                           "::1": 1})
    assert [q.inc("10.0.0.9") for _ in range(3)] == [True, True, False]      # default 2
    assert [q.inc("10.0.0.1") for _ in range(4)] == [True, True, True, False]
    assert not q.inc("10.0.0.2") and not q.inc("::ffff:10.0.0.2")          # 0: none at all
    assert [q.inc("0:0::1") for _ in range(2)] == [True, False]              # same as ::1
    assert q.total == 6 and q.get("10.0.0.1") == 3
    q.dec("10.0.0.1")
    assert q.inc("10.0.0.1")
    assert normalise_ip("::ffff:127.0.0.1") == "127.0.0.1" and normalise_ip("::0:1") == "::1"


def test_per_ip_limit_and_override_on_a_real_listener():
    def refused(sock):
        try:
            sock.sendall(frame(9))
            sock.settimeout(CLIENT_TIMEOUT_S)
            return sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    with running_server(lambda ch, r: echo(ch, r), max_connections_per_ip=1) as server:
        port = server.bound_port()
        with connect(port) as first, connect(port) as second:
            first.sendall(frame(1))
            assert read_echo(first)[0] == 1
            assert refused(second)
    with running_server(lambda ch, r: echo(ch, r), max_connections_per_ip=1,
                        max_connections_per_ip_overrides={"127.0.0.1": 3}) as server:
        port = server.bound_port()
        socks = [connect(port) for _ in range(4)]
        try:
            for i, s in enumerate(socks[:3]):
                s.sendall(frame(i))
                assert read_echo(s)[0] == i
            assert refused(socks[3])
            wait_until(lambda: server.connection_count() == 3, what="3 counted")
        finally:
            for s in socks:
                s.close()
