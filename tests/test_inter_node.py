"""InterNodeSendThread and ControllerChannel against real sockets.

A tiny fake controller (a thread speaking Kafka framing with the generated codecs) answers
ApiVersions and BrokerHeartbeat, either NONE or NOT_CONTROLLER, so the channel's retry and
rotation are checked against what goes over the wire.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from kbroker.client import errors as E
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.frames import decode_request, encode_response
from kbroker.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from kbroker.protocol.messages.broker_heartbeat import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes
from kbroker.testing import free_port


class FakeController:
    """Accepts connections; answers ApiVersions, and BrokerHeartbeat with ``error``."""

    def __init__(self, error=ErrorCode.NONE):
        self.error = error
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.heartbeats = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        with c:
            while True:
                try:
                    chunk = c.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    n = struct.unpack_from(">i", buf)[0]
                    frame, buf = buf[4:4 + n], buf[4 + n:]
                    header, body = decode_request(frame)
                    key, v = header.request_api_key, header.request_api_version
                    if key == ApiKey.API_VERSIONS:
                        resp = ApiVersionsResponse(error_code=0, api_keys=[
                            ApiVersion(api_key=int(ApiKey.API_VERSIONS), min_version=0, max_version=3),
                            ApiVersion(api_key=int(ApiKey.BROKER_HEARTBEAT), min_version=0, max_version=1)])
                    else:
                        self.heartbeats.append(body.broker_id)
                        resp = BrokerHeartbeatResponse(error_code=self.error)
                    c.sendall(encode_response(header.correlation_id, key, v, resp))

    def close(self):
        self.closed = True
        self.sock.close()


def _wait(box, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not box and time.monotonic() < deadline:
        time.sleep(0.01)
    assert box, "no callback"
    return box[0]


@pytest.fixture
def controllers():
    made = []
    yield lambda **kw: made.append(FakeController(**kw)) or made[-1]
    for f in made:
        f.close()


def _heartbeat(broker_id=4):
    return BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=7)


def test_send_to_a_live_node(controllers):
    fc = controllers()
    t = InterNodeSendThread("test-send", StaticNodes({1: ("127.0.0.1", fc.port)}))
    try:
        box = []
        t.send(1, ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)))
        resp, exc = _wait(box)
        assert exc is None and resp.error_code == ErrorCode.NONE and fc.heartbeats == [4]
    finally:
        t.close()


def test_unknown_node_and_dead_node_fail_by_deadline():
    dead = free_port()   # nothing listens there
    t = InterNodeSendThread("test-dead", StaticNodes({1: ("127.0.0.1", dead)}),
                            {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 50})
    try:
        box = []
        t.send(9, ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)))
        assert isinstance(_wait(box)[1], E.KafkaConnectionError)
        box.clear()
        start = time.monotonic()
        t.send(1, ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)), timeout_s=0.5)
        resp, exc = _wait(box)
        assert resp is None and isinstance(exc, E.KafkaTimeoutError)
        assert 0.4 <= time.monotonic() - start < 5
    finally:
        t.close()


def test_close_fails_what_is_queued():
    t = InterNodeSendThread("test-close", StaticNodes({1: ("127.0.0.1", free_port())}))
    box = []
    t.send(1, ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)), timeout_s=60)
    t.close()
    assert isinstance(_wait(box)[1], E.KafkaConnectionError)
    t.send(1, ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)))
    assert len(box) == 2 and isinstance(box[1][1], E.KafkaConnectionError)


def test_controller_channel_skips_dead_and_not_controller(controllers):
    """Voter 1 is down, voter 2 answers NOT_CONTROLLER, voter 3 is the active controller."""
    not_active = controllers(error=ErrorCode.NOT_CONTROLLER)
    active = controllers()
    nodes = StaticNodes({1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", not_active.port),
                         3: ("127.0.0.1", active.port)})
    t = InterNodeSendThread("test-controller", nodes, {"reconnect.backoff.ms": 20})
    try:
        ch = ControllerChannel(t, retry_backoff_s=0.02)
        for i in range(3):
            box = []
            ch.send(ApiKey.BROKER_HEARTBEAT, _heartbeat(i), lambda r, e: box.append((r, e)),
                    timeout_s=20, per_try_timeout_s=0.5)
            resp, exc = _wait(box, 25)
            assert exc is None and resp.error_code == ErrorCode.NONE
        assert active.heartbeats == [0, 1, 2]
        # with a hint, the active controller is asked first and only
        before = len(not_active.heartbeats)
        ch = ControllerChannel(t, leader_hint=lambda: 3)
        box = []
        ch.send(ApiKey.BROKER_HEARTBEAT, _heartbeat(9), lambda r, e: box.append((r, e)), timeout_s=5)
        assert _wait(box)[1] is None and active.heartbeats[-1] == 9 and len(not_active.heartbeats) == before
    finally:
        t.close()


def test_controller_channel_gives_up_at_its_deadline(controllers):
    only = controllers(error=ErrorCode.NOT_CONTROLLER)
    t = InterNodeSendThread("test-giveup", StaticNodes({2: ("127.0.0.1", only.port)}))
    try:
        ch = ControllerChannel(t, retry_backoff_s=0.05)
        box = []
        start = time.monotonic()
        ch.send(ApiKey.BROKER_HEARTBEAT, _heartbeat(), lambda r, e: box.append((r, e)), timeout_s=0.6)
        resp, exc = _wait(box)
        assert resp is None and isinstance(exc, E.KafkaError) and exc.code == ErrorCode.NOT_CONTROLLER
        assert time.monotonic() - start < 3 and len(only.heartbeats) >= 3
    finally:
        t.close()
