"""Network layer: SocketServer / Processor / RequestChannel / KafkaRequestHandlerPool.

Every test talks to a real server on 127.0.0.1 with a port chosen by the kernel; client
sockets have timeouts and every wait is bounded, so a bug fails a test instead of hanging.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import struct
import threading
import time

import pytest

from kbroker.network import Listener, RequestChannel, SocketServer, SocketServerConfig
from kbroker.records.region import FileRegion
from kbroker.server.request_handler import KafkaRequestHandlerPool

pytestmark = pytest.mark.timeout(60)

CLIENT_TIMEOUT_S = 5.0


# -- client helpers -------------------------------------------------------------------------
def frame(correlation_id: int, body: bytes = b"", api_key: int = 18, api_version: int = 3) -> bytes:
    payload = struct.pack(">hhi", api_key, api_version, correlation_id) + body
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def read_echo(sock: socket.socket) -> tuple[int, bytes]:
    """Response of the echo handler: correlation_id int32 + request body."""
    data = read_frame(sock)
    return struct.unpack(">i", data[:4])[0], data[4:]


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S)
    s.settimeout(CLIENT_TIMEOUT_S)
    return s


def assert_closed_by_server(sock: socket.socket) -> None:
    """The server closed ``sock``: reads give EOF or a reset, within the socket timeout."""
    try:
        while True:
            if sock.recv(65536) == b"":
                return
    except (ConnectionResetError, BrokenPipeError):
        return


def wait_until(predicate, timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def echo_parts(request) -> list:
    """Size-prefixed response frame: correlation_id int32 + the request body."""
    body = request.payload[8:]
    return [struct.pack(">ii", 4 + body.nbytes, request.correlation_id), body]


@contextlib.contextmanager
def running_server(handle, *, io_threads: int = 2, drain_timeout_s: float = 0.5, **config):
    """Start a SocketServer + handler pool; ``handle(channel, request)``.

    On exit stops both and checks every thread they started has exited.
    """
    config.setdefault("listeners", "PLAINTEXT://127.0.0.1:0")
    config.setdefault("num_network_threads", 2)
    server = SocketServer(SocketServerConfig(**config))
    channel = server.channel
    pool = KafkaRequestHandlerPool(channel, lambda r: handle(channel, r), io_threads,
                                   server.metrics)
    server.start()
    pool.start()
    try:
        yield server
    finally:
        server.stop(drain_timeout_s)
        pool.shutdown(timeout_s=5)
        leftover = [t for t in server.threads() + pool.threads if t.is_alive()]
        assert not leftover, f"threads still running after shutdown: {leftover}"


def echo(channel: RequestChannel, request) -> None:
    channel.send_response(request, echo_parts(request))


# -- tests ------------------------------------------------------------------------------------
def test_round_trip_and_request_fields():
    seen = []

    def handle(channel, request):
        seen.append(request)
        echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        assert port > 0
        assert server.bound_port("plaintext") == port
        with connect(port) as s:
            bodies = [b"", b"x", os.urandom(1000), os.urandom(1 << 20)]
            for i, body in enumerate(bodies):
                s.sendall(frame(i, body, api_key=1, api_version=11))
                assert read_echo(s) == (i, body)
            local = s.getsockname()
    r = seen[0]
    assert (r.api_key, r.api_version, r.correlation_id) == (1, 11, 0)
    assert r.client_address == local
    assert r.listener_name == "PLAINTEXT"
    assert re.fullmatch(rf"127\.0\.0\.1:{port}-127\.0\.0\.1:{local[1]}-\d+", r.connection_id)
    assert isinstance(seen[3].payload, memoryview) and seen[3].payload.nbytes == 8 + (1 << 20)
    assert r.received_ns <= r.dequeued_ns <= r.response_queued_ns <= r.send_complete_ns
    api = server.metrics.api_totals()[1]
    assert api["count"] == 4
    assert api["total_ns"] > 0
    assert api["bytes_in"] == sum(12 + len(b) for b in bodies)


def test_pipelined_requests_answered_in_order_with_async_out_of_order_handler():
    """Three clients pipeline 30 requests each; the handler answers from timer threads
    after random delays, so completions are out of order across connections. Each
    connection must see its responses strictly in order, with one request in flight."""
    lock = threading.Lock()
    inflight: dict[str, int] = {}
    max_inflight = [0]
    rng = random.Random(7)
    timers = []

    def handle(channel, request):
        with lock:
            n = inflight[request.connection_id] = inflight.get(request.connection_id, 0) + 1
            max_inflight[0] = max(max_inflight[0], n)
            delay = rng.uniform(0, 0.004)

        def answer():
            with lock:
                inflight[request.connection_id] -= 1
            echo(channel, request)

        t = threading.Timer(delay, answer)
        timers.append(t)
        t.start()

    n_requests = 30
    with running_server(handle, io_threads=4) as server:
        clients = [connect(server.bound_port()) for _ in range(3)]
        try:
            for c in clients:
                c.sendall(b"".join(frame(i, b"%d" % i) for i in range(n_requests)))
            for c in clients:
                got = [read_echo(c) for _ in range(n_requests)]
                assert got == [(i, b"%d" % i) for i in range(n_requests)]
        finally:
            for c in clients:
                c.close()
        for t in timers:
            t.join(5)
    assert max_inflight[0] == 1


def test_many_concurrent_connections():
    n_conns, n_requests = 120, 8
    processors = set()

    def handle(channel, request):
        processors.add(request.processor_id)
        echo(channel, request)

    errors = []

    def client(port, conns):
        try:
            socks = [connect(port) for _ in range(conns)]
            for i in range(n_requests):
                for k, s in enumerate(socks):
                    s.sendall(frame(i, b"c%d-%d" % (k, i)))
                for k, s in enumerate(socks):
                    assert read_echo(s) == (i, b"c%d-%d" % (k, i))
            for s in socks:
                s.close()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with running_server(handle, num_network_threads=3, io_threads=4) as server:
        port = server.bound_port()
        threads = [threading.Thread(target=client, args=(port, n_conns // 4)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        totals = server.metrics.totals()
        assert totals["requests_received"] == n_conns * n_requests
        assert totals["connections_created"] == n_conns
        wait_until(lambda: server.connection_count() == 0, what="connections to close")
    assert processors == {0, 1, 2}   # round-robin spread connections over all processors


@pytest.mark.parametrize("size", [1025, -1, 0x7FFFFFFF, -0x80000000])
def test_oversize_or_negative_frame_closes_only_that_connection(size):
    with running_server(lambda ch, r: echo(ch, r), socket_request_max_bytes=1024) as server:
        port = server.bound_port()
        with connect(port) as good, connect(port) as bad:
            good.sendall(frame(1, b"before"))
            assert read_echo(good) == (1, b"before")
            bad.sendall(struct.pack(">i", size) + b"\0" * 16)
            assert_closed_by_server(bad)
            good.sendall(frame(2, b"after"))
            assert read_echo(good) == (2, b"after")
            # A frame of exactly the limit is fine.
            good.sendall(frame(3, b"y" * (1024 - 8)))
            assert read_echo(good) == (3, b"y" * (1024 - 8))
        assert server.metrics.totals()["invalid_receives"] == 1


@pytest.mark.parametrize("size", [0, 1, 7])
def test_frame_shorter_than_header_prefix_closes(size):
    with running_server(lambda ch, r: echo(ch, r)) as server:
        port = server.bound_port()
        with connect(port) as bad, connect(port) as good:
            bad.sendall(struct.pack(">i", size) + b"\1" * size)
            assert_closed_by_server(bad)
            good.sendall(frame(5))           # exactly 8 bytes: a valid frame
            assert read_echo(good) == (5, b"")
        assert server.metrics.totals()["invalid_receives"] == 1


def _reset_close(sock: socket.socket) -> None:
    """Close with RST instead of FIN (SO_LINGER 0): an abrupt disconnect."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("abrupt", [False, True])
def test_client_disconnect_mid_frame(abrupt):
    handled = []

    def handle(channel, request):
        handled.append(request.correlation_id)
        echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        for cut in (2, 4, 10, 60):                 # inside the size, and inside the payload
            s = connect(port)
            s.sendall(frame(99, b"z" * 100)[:cut])
            time.sleep(0.01)
            _reset_close(s) if abrupt else s.close()
        wait_until(lambda: server.metrics.totals()["connections_closed"] == 4,
                   what="server to notice the disconnects")
        with connect(port) as good:
            good.sendall(frame(1, b"still here"))
            assert read_echo(good) == (1, b"still here")
        assert handled == [1]
        assert server.connection_count() <= 1


def test_client_disconnect_mid_response():
    big = os.urandom(16 << 20)

    def handle(channel, request):
        if request.correlation_id == 0:
            channel.send_response(request, [struct.pack(">ii", 4 + len(big), 0), big])
        else:
            echo(channel, request)

    with running_server(handle, socket_send_buffer_bytes=65536) as server:
        port = server.bound_port()
        s = connect(port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(frame(0))
        recv_exact(s, 100_000)                 # part of the 16 MiB response
        _reset_close(s)
        wait_until(lambda: server.metrics.totals()["connections_closed"] == 1,
                   what="server to notice the reset")
        assert server.metrics.totals()["responses_sent"] == 0
        with connect(port) as good:
            good.sendall(frame(1, b"ok"))
            assert read_echo(good) == (1, b"ok")


def test_disconnect_while_request_in_flight():
    """Client resets while its request is in the handler: the late response fails to
    write (the muted socket is not read, so that is when the server notices) and only
    that connection is closed."""
    held = []

    def handle(channel, request):
        if request.correlation_id == 0:
            held.append(request)              # answered later from the test thread
        else:
            echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        s = connect(port)
        s.sendall(frame(0))
        wait_until(lambda: held, what="request to reach the handler")
        _reset_close(s)
        time.sleep(0.05)
        # From a non-handler thread, like a delayed operation completing in the purgatory.
        server.channel.send_response(held[0], [struct.pack(">i", 4 << 20), os.urandom(4 << 20)])
        wait_until(lambda: server.metrics.totals()["connections_closed"] == 1,
                   what="server to notice the reset")
        assert server.metrics.totals()["responses_sent"] == 0
        with connect(port) as good:
            good.sendall(frame(1, b"fine"))
            assert read_echo(good) == (1, b"fine")


def test_late_and_duplicate_responses_are_dropped():
    held = []

    def handle(channel, request):
        if request.correlation_id == 0:
            held.append(request)
        else:
            echo(channel, request)

    with running_server(handle, connections_max_idle_ms=200) as server:
        port = server.bound_port()
        with connect(port) as s:
            s.sendall(frame(0))
            # The idle reaper closes the connection while its request is in flight ...
            assert_closed_by_server(s)
        # ... so the response that arrives afterwards is dropped.
        server.channel.send_response(held[0], [b"\0\0\0\4late"])
        wait_until(lambda: server.metrics.totals()["responses_dropped"] == 1,
                   what="late response to be dropped")
        with connect(port) as good:
            good.sendall(frame(1, b"a"))
            assert read_echo(good) == (1, b"a")
            held.clear()
            good.sendall(frame(0, b"b"))
            wait_until(lambda: held, what="held request")
            server.channel.send_response(held[0], echo_parts(held[0]))
            server.channel.send_response(held[0], [b"\0\0\0\x09duplicate"])   # dropped
            assert read_echo(good) == (0, b"b")
            good.sendall(frame(2, b"c"))
            assert read_echo(good) == (2, b"c")   # the duplicate never reached the wire
        assert server.metrics.totals()["responses_dropped"] == 2


def test_file_region_response_is_sent_with_sendfile_byte_identical(tmp_path, monkeypatch):
    size = size_ = 8 << 20
    data = os.urandom(size)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    calls = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd, in_fd, offset, count):
        n = real_sendfile(out_fd, in_fd, offset, count)
        calls.append((offset, count, n))
        return n

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    with open(path, "rb") as f:
        regions = [FileRegion(f, 123, size - 1000), FileRegion(f, 0, 10),
                   FileRegion(f, size - 5, 5), FileRegion(f, 50, 0)]

        def handle(channel, request):
            size = 4 + 4 + (size_ - 1000) + 6 + 10 + 5 + 4
            channel.send_response(request, [struct.pack(">ii", size, request.correlation_id),
                                            b"head", regions[0], b"mid", memoryview(b"dle"),
                                            regions[1], regions[2], regions[3], b"tail"])

        with running_server(handle, socket_send_buffer_bytes=65536) as server:
            with connect(server.bound_port()) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
                for corr in (7, 8):
                    s.sendall(frame(corr))
                    resp = read_frame(s)
                    expected = (struct.pack(">i", corr) + b"head" + data[123:size - 877]
                                + b"middle" + data[:10] + data[size - 5:] + b"tail")
                    assert len(resp) == len(expected)
                    assert resp == expected
    # The 8 MiB region did not fit the 64 KiB socket buffer: many partial sendfile calls,
    # continued from the right offsets.
    big = [c for c in calls if 123 <= c[0] < size - 877]
    assert len(big) > 4
    assert any(n < count for _, count, n in big)
    assert all(n >= 0 for _, _, n in calls)


def test_file_region_beyond_end_of_file_closes_connection(tmp_path):
    path = tmp_path / "short.log"
    path.write_bytes(b"abc")
    with open(path, "rb") as f:
        def handle(channel, request):
            if request.correlation_id == 0:
                channel.send_response(request, [struct.pack(">i", 101), b"h",
                                                FileRegion(f, 0, 100)])
            else:
                echo(channel, request)

        with running_server(handle) as server:
            port = server.bound_port()
            with connect(port) as s:
                s.sendall(frame(0))
                assert_closed_by_server(s)
            with connect(port) as good:
                good.sendall(frame(1, b"ok"))
                assert read_echo(good) == (1, b"ok")


def test_no_op_response_unmutes():
    def handle(channel, request):
        if request.correlation_id % 2:
            channel.send_no_op_response(request)      # e.g. produce with acks=0
        else:
            echo(channel, request)

    with running_server(handle) as server:
        with connect(server.bound_port()) as s:
            s.sendall(b"".join(frame(i, b"%d" % i) for i in range(1, 8)))
            assert [read_echo(s) for _ in range(3)] == [(2, b"2"), (4, b"4"), (6, b"6")]
            s.settimeout(0.2)
            with pytest.raises(socket.timeout):
                s.recv(1)
        assert server.metrics.totals()["responses_no_op"] == 4


def test_close_connection_response_and_handler_error_close_only_that_connection():
    def handle(channel, request):
        if request.correlation_id == 1:
            channel.close_connection(request)
        elif request.correlation_id == 2:
            raise RuntimeError("boom (expected by the test)")
        else:
            echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        with connect(port) as a, connect(port) as b, connect(port) as good:
            a.sendall(frame(1))
            assert_closed_by_server(a)
            b.sendall(frame(2))
            assert_closed_by_server(b)
            good.sendall(frame(3, b"alive"))
            assert read_echo(good) == (3, b"alive")
        assert server.metrics.totals()["handler_errors"] == 1


def test_back_pressure_processor_stops_reading_when_request_queue_is_full():
    release = threading.Event()
    first = threading.Event()
    order = []

    def handle(channel, request):
        order.append(request.correlation_id)
        if request.correlation_id == 1:
            first.set()
            assert release.wait(10)
        echo(channel, request)

    with running_server(handle, io_threads=1, num_network_threads=1,
                        queued_max_requests=1) as server:
        port = server.bound_port()
        processor = server.processors[0]
        totals = server.metrics.totals
        conns = [connect(port) for _ in range(4)]
        try:
            conns[0].sendall(frame(1))                   # taken by the only handler, blocks it
            assert first.wait(5)
            conns[1].sendall(frame(2))                   # fills the queue (size 1)
            wait_until(lambda: server.channel.request_queue_size() == 1, what="queue full")
            conns[2].sendall(frame(3))                   # read, refused: processor holds it
            wait_until(lambda: processor.backpressured, what="back-pressure")
            bytes_in = totals()["bytes_in"]
            conns[3].sendall(frame(4, b"not read yet"))
            time.sleep(0.3)
            assert processor.backpressured
            assert totals()["requests_received"] == 3
            assert totals()["bytes_in"] == bytes_in      # the processor did not read conn 4
            assert server.channel.request_queue_size() == 1
            release.set()
            for i, c in enumerate(conns, 1):
                assert read_echo(c)[0] == i
            assert not processor.backpressured
            assert sorted(order) == [1, 2, 3, 4]
        finally:
            release.set()
            for c in conns:
                c.close()


def test_idle_connections_are_closed():
    with running_server(lambda ch, r: echo(ch, r), connections_max_idle_ms=300) as server:
        port = server.bound_port()
        with connect(port) as idle, connect(port) as busy:
            t0 = time.monotonic()
            for i in range(12):                           # active every 50 ms for 0.6 s
                busy.sendall(frame(i))
                assert read_echo(busy)[0] == i
                time.sleep(0.05)
            assert_closed_by_server(idle)
            assert time.monotonic() - t0 < 3
            busy.sendall(frame(100))
            assert read_echo(busy)[0] == 100
        assert server.metrics.totals()["idle_closed"] >= 1


def test_max_connections_waits_for_a_free_slot():
    with running_server(lambda ch, r: echo(ch, r), max_connections=2) as server:
        port = server.bound_port()
        a, b = connect(port), connect(port)
        for s in (a, b):
            s.sendall(frame(1))
            assert read_echo(s)[0] == 1
        c = connect(port)                 # completes in the kernel backlog, not accepted
        c.sendall(frame(3))
        c.settimeout(0.3)
        with pytest.raises(socket.timeout):
            c.recv(1)
        a.close()
        c.settimeout(CLIENT_TIMEOUT_S)
        assert read_echo(c)[0] == 3
        b.close()
        c.close()


def test_shutdown_drains_in_flight_responses_and_joins_threads():
    got = threading.Event()

    def handle(channel, request):
        got.set()
        threading.Timer(0.2, echo, (channel, request)).start()

    server = SocketServer(SocketServerConfig(listeners="PLAINTEXT://127.0.0.1:0,"
                                                       "INTERNAL://127.0.0.1:0",
                                             num_network_threads=2))
    pool = KafkaRequestHandlerPool(server.channel, lambda r: handle(server.channel, r), 3,
                                   server.metrics)
    server.start()
    pool.start()
    assert server.bound_port("PLAINTEXT") != server.bound_port("INTERNAL")
    assert len(server.processors) == 4
    assert sorted(p.processor_id for p in server.processors) == [0, 1, 2, 3]
    s = connect(server.bound_port("INTERNAL"))
    idle = connect(server.bound_port("PLAINTEXT"))
    s.sendall(frame(42, b"drain me"))
    assert got.wait(5)
    server.stop(drain_timeout_s=3)              # the response is still in the timer
    assert read_echo(s) == (42, b"drain me")    # ... but was written before closing
    assert_closed_by_server(s)
    assert_closed_by_server(idle)
    pool.shutdown(timeout_s=5)
    threads = server.threads() + pool.threads
    assert threads and not [t for t in threads if t.is_alive()]
    with pytest.raises(OSError):
        connect(server.bound_port("PLAINTEXT"))
    server.stop()                                # idempotent
    s.close()
    idle.close()
    assert server.connection_count() == 0


def test_metrics_gauges():
    with running_server(lambda ch, r: echo(ch, r)) as server:
        with connect(server.bound_port()) as s:
            for i in range(20):
                s.sendall(frame(i, api_key=i % 2))
                read_echo(s)
        m = server.metrics
        time.sleep(0.05)
        assert 0.0 <= m.network_processor_avg_idle_percent() <= 1.0
        assert 0.0 <= m.request_handler_avg_idle_percent() <= 1.0
        time.sleep(0.2)                          # nothing to do: mostly idle
        assert m.network_processor_avg_idle_percent() > 0.5
        assert m.request_handler_avg_idle_percent() > 0.5
        api = m.api_totals()
        assert api[0]["count"] == api[1]["count"] == 10
        snap = m.snapshot()
        assert snap["request_queue_size"] == 0 and snap["response_queue_size"] == 0
        assert snap["requests_received"] == 20
        assert snap["bytes_in"] == 20 * 12 and snap["bytes_out"] == 20 * 8


def test_listener_parsing():
    assert Listener.parse("PLAINTEXT://127.0.0.1:9092") == Listener("PLAINTEXT", "127.0.0.1", 9092)
    assert Listener.parse("internal://:0") == Listener("INTERNAL", "", 0)
    assert Listener.parse("X://[::1]:19092") == Listener("X", "::1", 19092)
    assert [l.name for l in Listener.parse_list("A://:1, B://h:2")] == ["A", "B"]
    for bad in ("127.0.0.1:9092", "A://host", "A://h:1,A://h:2"):
        with pytest.raises(ValueError):
            Listener.parse_list(bad)


def test_request_channel_bounded_queue_wakes_refused_processor():
    channel = RequestChannel(queue_size=2)

    class Sink:
        woken = 0

        def wakeup(self):
            Sink.woken += 1

    sink = Sink()
    reqs = [object(), object(), object()]
    assert channel.try_send_request(reqs[0], sink)
    assert channel.try_send_request(reqs[1], sink)
    assert not channel.try_send_request(reqs[2], sink)
    assert channel.request_queue_size() == 2
    assert channel.receive_request(1) is reqs[0]
    assert Sink.woken == 1
    assert channel.try_send_request(reqs[2], sink)
    assert channel.receive_request(1) is reqs[1]
    assert Sink.woken == 1                      # nobody was refused since
    assert channel.receive_request(0.01) is reqs[2]
    assert channel.receive_request(0.01) is None
    assert channel.request_queue_size() == 0


def test_unsendable_response_part_closes_only_that_connection():
    def handle(channel, request):
        if request.correlation_id == 0:
            channel.send_response(request, [b"\0\0\0\x0bok", "not bytes"])
        else:
            echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        with connect(port) as bad, connect(port) as good:
            bad.sendall(frame(0))
            assert_closed_by_server(bad)
            good.sendall(frame(1, b"x"))
            assert read_echo(good) == (1, b"x")


@pytest.mark.parametrize("parts", [[b"\0\0\0\x05abcd"], [b"\0\0\0\x03abcd"], [b"abc"], []])
def test_wrong_response_size_prefix_closes_connection(parts):
    def handle(channel, request):
        if request.correlation_id == 0:
            channel.send_response(request, parts)
        else:
            echo(channel, request)

    with running_server(handle) as server:
        port = server.bound_port()
        with connect(port) as bad, connect(port) as good:
            bad.sendall(frame(0))
            assert_closed_by_server(bad)
            good.sendall(frame(1, b"x"))
            assert read_echo(good) == (1, b"x")


def test_idle_timeout_disabled_with_negative_value():
    with running_server(lambda ch, r: echo(ch, r), connections_max_idle_ms=-1) as server:
        with connect(server.bound_port()) as s:
            time.sleep(0.3)
            s.sendall(frame(1))
            assert read_echo(s)[0] == 1
        assert server.metrics.totals()["idle_closed"] == 0


def test_network_layer_does_not_import_protocol_log_or_server():
    """The network layer moves opaque frames: no dependency on codecs, log or handlers."""
    import ast
    import pathlib

    import kbroker.network

    root = pathlib.Path(kbroker.network.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("kbroker.protocol", "kbroker.log",
                                            "kbroker.server", "kbroker.coordinator")), \
                    f"{path.name} imports {name}"


# -- held responses (processor.py, "Held responses") ------------------------------------------
def test_pipelined_responses_are_held_and_written_together_in_order():
    """Requests that arrive together are answered together: a response whose next request
    is already read is held back and written with the next one, in request order."""
    with running_server(echo, io_threads=1) as server:
        s = connect(server.bound_port())
        try:
            n = 40
            s.sendall(b"".join(frame(i, b"body-%d" % i) for i in range(n)))
            got = [read_echo(s) for _ in range(n)]
            assert got == [(i, b"body-%d" % i) for i in range(n)]
            totals = server.metrics.totals()
            assert totals["responses_held"] > 0
            wait_until(lambda: server.metrics.totals()["responses_sent"] == n, what="metrics")
            assert server.metrics.api_totals()[18]["count"] == n
        finally:
            s.close()


def test_held_responses_do_not_wait_for_a_request_left_in_a_purgatory():
    """A request its handler leaves unanswered (answered later, from another thread) does
    not keep the responses held before it: they are written when its handler returns."""
    first_seen = threading.Event()
    done = []

    def handle(channel, request):
        cid = request.correlation_id
        if cid == 5:            # "waits in a purgatory" until the client has read 0..4
            def later():
                done.append(first_seen.wait(10))
                echo(channel, request)
            threading.Thread(target=later, daemon=True).start()
        else:
            echo(channel, request)

    with running_server(handle, io_threads=1) as server:
        s = connect(server.bound_port())
        try:
            s.sendall(b"".join(frame(i) for i in range(8)))
            got = [read_echo(s)[0] for _ in range(5)]
            first_seen.set()
            got += [read_echo(s)[0] for _ in range(3)]
            assert got == list(range(8))
            assert done == [True], "answers 0..4 waited for request 5's late answer"
        finally:
            s.close()


def test_held_responses_go_before_a_no_op_and_before_a_close():
    def handle(channel, request):
        cid = request.correlation_id
        if cid == 2:
            channel.send_no_op_response(request)
        elif cid == 4:
            channel.close_connection(request)
        else:
            echo(channel, request)

    with running_server(handle, io_threads=1) as server:
        s = connect(server.bound_port())
        try:
            s.sendall(b"".join(frame(i) for i in range(6)))
            got = []
            try:
                for _ in range(3):
                    got.append(read_echo(s)[0])
            except Exception:
                print("GOT", got, server.metrics.totals())
                raise
            assert got == [0, 1, 3]
            assert_closed_by_server(s)
        finally:
            s.close()


def test_answer_that_comes_while_held_responses_are_still_being_written_follows_them():
    """The client reads nothing for a while, so the write of held responses stops half way
    (the socket buffer is full) and the processor finishes it; the late answer of the
    request they were held for comes meanwhile and must follow them, not be dropped."""
    release = threading.Event()

    def handle(channel, request):
        if request.correlation_id % 10 == 9:       # answered later, from another thread
            def later():
                release.wait(10)
                echo(channel, request)
            threading.Thread(target=later, daemon=True).start()
        else:
            echo(channel, request)

    body = b"x" * 20000
    with running_server(handle, io_threads=1) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(CLIENT_TIMEOUT_S)
        s.connect(("127.0.0.1", server.bound_port()))
        try:
            n = 60
            sender = threading.Thread(target=s.sendall,
                                      args=(b"".join(frame(i, body) for i in range(n)),), daemon=True)
            sender.start()
            time.sleep(0.3)                          # the server fills its send buffer
            release.set()
            got = [read_echo(s) for _ in range(n)]
            assert [c for c, _ in got] == list(range(n))
            assert all(b == body for _, b in got)
            sender.join(5)
            assert server.metrics.totals()["responses_dropped"] == 0
        finally:
            s.close()


def test_held_responses_are_all_written_before_a_close():
    """A request whose handler closes the connection comes after requests whose answers
    are held: they are written in full first (the client reads nothing for a while, so
    one write cannot take them), then the connection is closed."""
    def handle(channel, request):
        if request.correlation_id == 5:
            channel.close_connection(request)
        else:
            echo(channel, request)

    body = b"y" * 15000
    with running_server(handle, io_threads=1, socket_send_buffer_bytes=4096) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(CLIENT_TIMEOUT_S)
        s.connect(("127.0.0.1", server.bound_port()))
        try:
            s.sendall(b"".join(frame(i, body) for i in range(6)))
            time.sleep(0.3)                          # the server fills its send buffer
            got = [read_echo(s) for _ in range(5)]
            assert [c for c, _ in got] == list(range(5))
            assert all(b == body for _, b in got)
            assert_closed_by_server(s)
            assert server.metrics.totals()["responses_held"] > 0
        finally:
            s.close()
