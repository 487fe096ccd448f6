"""BrokerLifecycle: registration, heartbeats and state transitions (Kafka's
BrokerLifecycleManager), driven on a simulated clock; then the threaded manager against a
fake controller over real sockets."""
from __future__ import annotations

import random
import socket
import struct
import threading
import time
import uuid

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.frames import decode_request, encode_response
from kbroker.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from kbroker.protocol.messages.broker_heartbeat import BrokerHeartbeatResponse as HB
from kbroker.protocol.messages.broker_registration import BrokerRegistrationResponse as REG
from kbroker.server.broker_lifecycle import BrokerLifecycle, BrokerLifecycleManager, BrokerState
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes

K = ApiKey


def _lc(**kw):
    args = dict(node_id=4, cluster_id="c1", listeners=[("PLAINTEXT", "127.0.0.1", 9092, 0)],
                features={"metadata.version": (1, 21)}, rack="r1", log_dirs=[uuid.UUID(int=2), uuid.UUID(int=1)],
                metadata_offset=lambda: 77, rng=random.Random(5))
    args.update(kw)
    return BrokerLifecycle(**args)


def test_registration_catch_up_unfence_and_run():
    lc = _lc()
    calls = []
    lc.on_unfenced = lambda: calls.append(lc.state)
    assert lc.poll(0) is None and lc.state == BrokerState.NOT_RUNNING
    lc.start(1000)
    key, req = lc.poll(1000)
    assert key == K.BROKER_REGISTRATION and req.broker_id == 4 and req.cluster_id == "c1"
    assert req.rack == "r1" and req.log_dirs == [uuid.UUID(int=1), uuid.UUID(int=2)]
    assert [(f.name, f.min_supported_version, f.max_supported_version) for f in req.features] == \
        [("metadata.version", 1, 21)]
    assert [(x.name, x.host, x.port) for x in req.listeners] == [("PLAINTEXT", "127.0.0.1", 9092)]
    assert lc.poll(1001) is None  # one request in flight at a time
    lc.on_response(1005, REG(error_code=0, broker_epoch=42))
    key, hb = lc.poll(1005)      # a heartbeat at once
    assert key == K.BROKER_HEARTBEAT and (hb.broker_epoch, hb.current_metadata_offset) == (42, 77)
    assert hb.want_fence and not hb.want_shut_down
    lc.on_response(1010, HB(is_caught_up=False, is_fenced=True))
    assert lc.state == BrokerState.STARTING and lc.next_deadline_ms() == 1020
    lc.poll(1020)
    lc.on_response(1021, HB(is_caught_up=True, is_fenced=True))
    assert lc.state == BrokerState.RECOVERY and lc.caught_up.is_set() and not lc.unfenced.is_set()
    lc.poll(1031)
    lc.set_ready_to_unfence(1032)          # while a heartbeat is in flight
    lc.on_response(1040, HB(is_caught_up=True, is_fenced=True))
    key, hb = lc.poll(1040)                # ... so the next one goes at once, asking to unfence
    assert not hb.want_fence
    assert calls == []
    lc.on_response(1041, HB(is_caught_up=True, is_fenced=False))
    assert lc.state == BrokerState.RUNNING and lc.unfenced.is_set()
    assert calls == [BrokerState.RUNNING]      # once, as it is unfenced
    assert lc.next_deadline_ms() == 1041 + 2000
    t = lc.next_deadline_ms()
    lc.poll(t)
    lc.on_response(t + 1, HB(is_caught_up=True, is_fenced=False))
    assert calls == [BrokerState.RUNNING]


def test_failures_back_off_exponentially_up_to_the_session_timeout():
    lc = _lc(session_timeout_ms=1000)
    lc.start(0)
    now, delays = 0, []
    for _ in range(6):
        assert lc.poll(now) is not None
        lc.on_response(now, None)
        delays.append(lc.next_deadline_ms() - now)
        now = lc.next_deadline_ms()
    want = [100, 200, 400, 800, 1000, 1000]
    assert all(abs(d - w) <= w * 0.02 + 1 for d, w in zip(delays, want)), delays
    lc.poll(now)
    lc.on_response(now, REG(error_code=ErrorCode.INCONSISTENT_CLUSTER_ID))
    assert not lc.registered and lc.next_deadline_ms() - now >= 980


def test_initial_registration_timeout_shuts_down():
    lc = _lc(initial_registration_timeout_ms=500)
    lc.start(0)
    lc.poll(0)
    lc.on_response(10, None)
    assert lc.poll(499) is None or lc.state == BrokerState.STARTING
    assert lc.poll(500) is None and lc.state == BrokerState.SHUTTING_DOWN and lc.shut_down.is_set()


def test_controlled_shutdown():
    lc = _lc()
    lc.start(0)
    lc.poll(0)
    lc.on_response(0, REG(broker_epoch=9))
    lc.set_ready_to_unfence(0)
    lc.poll(0)
    lc.on_response(0, HB(is_caught_up=True, is_fenced=False))   # STARTING -> RECOVERY
    lc.poll(10)
    lc.on_response(10, HB(is_caught_up=True, is_fenced=False))  # RECOVERY -> RUNNING
    assert lc.state == BrokerState.RUNNING
    lc.begin_controlled_shutdown(100)
    assert lc.state == BrokerState.PENDING_CONTROLLED_SHUTDOWN
    _, hb = lc.poll(100)
    assert hb.want_shut_down
    lc.on_response(105, HB(is_caught_up=True, should_shut_down=False))
    assert lc.next_deadline_ms() == 155                          # the first wait is short
    lc.poll(155)
    lc.on_response(160, HB(is_caught_up=True, should_shut_down=False))
    assert lc.next_deadline_ms() == 2160
    lc.poll(2160)
    lc.on_response(2161, HB(is_caught_up=True, should_shut_down=True))
    assert lc.state == BrokerState.SHUTTING_DOWN and lc.shut_down.is_set() and lc.poll(9999) is None


def test_controlled_shutdown_before_running_shuts_down_at_once():
    lc = _lc()
    lc.start(0)
    lc.begin_controlled_shutdown(1)
    assert lc.state == BrokerState.SHUTTING_DOWN


class LifecycleController:
    """A fake active controller: registers with epoch 100 + n, unfences on request, lets
    a broker go when it asks."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.seen = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
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
                    h, body = decode_request(frame)
                    key = h.request_api_key
                    if key == K.API_VERSIONS:
                        resp = ApiVersionsResponse(api_keys=[
                            ApiVersion(api_key=int(k), min_version=0, max_version=v) for k, v in
                            ((K.API_VERSIONS, 3), (K.BROKER_REGISTRATION, 4), (K.BROKER_HEARTBEAT, 1))])
                    elif key == K.BROKER_REGISTRATION:
                        self.seen.append(("register", body.broker_id))
                        resp = REG(broker_epoch=100 + len(self.seen))
                    else:
                        self.seen.append(("heartbeat", body.want_fence, body.want_shut_down))
                        resp = HB(is_caught_up=True, is_fenced=body.want_fence,
                                  should_shut_down=body.want_shut_down)
                    c.sendall(encode_response(h.correlation_id, key, h.request_api_version, resp))


def test_manager_runs_against_a_controller_over_sockets():
    fc = LifecycleController()
    sender = InterNodeSendThread("lifecycle-test", StaticNodes({1: ("127.0.0.1", fc.port)}))
    lc = _lc(heartbeat_interval_ms=50)
    mgr = BrokerLifecycleManager(lc, ControllerChannel(sender))
    try:
        mgr.start()
        assert lc.caught_up.wait(10)
        mgr.set_ready_to_unfence()
        assert lc.unfenced.wait(10) and lc.state == BrokerState.RUNNING
        deadline = time.monotonic() + 10
        while sum(1 for s in fc.seen if s[0] == "heartbeat") < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        mgr.begin_controlled_shutdown()
        assert lc.shut_down.wait(10)
        assert fc.seen[0] == ("register", 4) and fc.seen[-1] == ("heartbeat", False, True)
        assert lc.broker_epoch == 101
    finally:
        mgr.close()
        sender.close()
        fc.sock.close()
