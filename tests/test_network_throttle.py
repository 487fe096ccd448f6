"""The processor's throttle mute (KIP-219) counts from when the response was handed over, as
Kafka's ThrottledChannel does, not from the end of a slow write."""
import socket
import struct
import time

from tests.test_network import echo, echo_parts, frame, read_frame, running_server

BIG = 4 << 20


def test_the_throttle_time_counts_from_the_response_not_from_the_end_of_its_write():
    def handle(channel, request):
        if request.correlation_id == 1:
            body = b"x" * BIG
            channel.send_response(request, [struct.pack(">ii", 4 + len(body), 1), body], throttle_ms=800)
        else:
            echo(channel, request)

    with running_server(handle, socket_send_buffer_bytes=4096) as server:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.bound_port()))
        s.settimeout(10)
        t0 = time.monotonic()
        s.sendall(frame(1) + frame(2, b"next"))
        time.sleep(0.6)                   # the first response's write cannot finish before this
        assert len(read_frame(s)) == 4 + BIG
        second = read_frame(s)
        took = time.monotonic() - t0
        s.close()
    assert second[4:].endswith(b"next")
    # muted until ~0.8 s after the response was queued; counted from the end of the write
    # (>= 0.6 s) it would be >= 1.4 s
    assert 0.75 <= took < 1.25, took
