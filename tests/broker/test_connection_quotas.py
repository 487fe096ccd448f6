"""Connection quotas of a real ``kbroker serve`` seen from raw sockets (Kafka's ConnectionQuotas):
max.connections.per.ip (and its overrides) closes the connection over the limit at once; the
connection creation rate (max.connection.creation.rate, broker-wide or per listener) delays
accepting; the per-IP ``connection_creation_rate`` client quota closes a throttled connection
after its throttle time, without an answer.

The brokers run with quota.window.num=2 x 1 s, so a rate is measured over >= 1 s."""
import socket
import time

import pytest

from kbroker.network.acceptor import ConnectionQuotas
from kbroker.protocol import ApiKey as K
from kbroker.protocol.messages.api_versions import ApiVersionsRequest
from kbroker.testing import KBrokerProcess
from tests.broker.raw_client import ConnectionClosed, RawClient
from tests.broker.test_quotas import _alter

WINDOWS = {"quota.window.num": 2, "quota.window.size.seconds": 1}


@pytest.fixture(scope="module")
def plain():
    """A broker with no connection limit."""
    with KBrokerProcess(overrides=WINDOWS).start() as b:
        yield b


def _api_versions(c: RawClient) -> None:
    c.call(K.API_VERSIONS, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1"))


def _answered(port: int, timeout_s: float = 10.0) -> bool:
    """Connect and ask ApiVersions: True if answered, False if the broker closed the connection."""
    c = RawClient(port, timeout_s=timeout_s)
    try:
        _api_versions(c)
        return True
    except (ConnectionClosed, ConnectionResetError):
        return False
    finally:
        c.close()


@pytest.mark.parametrize("overrides", [
    {"max.connections.per.ip": 3},
    {"max.connections.per.ip": 1, "max.connections.per.ip.overrides": "127.0.0.1:3"},
], ids=["max.connections.per.ip", "overrides"])
def test_a_connection_over_the_per_ip_limit_is_closed_at_once(overrides):
    with KBrokerProcess(overrides={**WINDOWS, **overrides}).start() as b:
        held = []
        deadline = time.monotonic() + 20
        while len(held) < 3:           # (the start-up probe's connection may not be closed yet)
            c = RawClient(b.port)
            try:
                _api_versions(c)
                held.append(c)
            except ConnectionClosed:
                c.close()
                assert time.monotonic() < deadline, "3 connections from 127.0.0.1 were never allowed"
        t0 = time.monotonic()
        assert not _answered(b.port)
        assert time.monotonic() - t0 < 2.0             # closed, not delayed
        held.pop().close()
        deadline = time.monotonic() + 20
        while not _answered(b.port):                  # a freed slot is taken again
            assert time.monotonic() < deadline
        for c in held:
            c.close()


def _alter_ip(port, name, rate):
    """AlterClientQuotas for an ip entity; its own connection may be throttled by the quota
    being changed (closed unanswered): try again."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return _alter(port, [("ip", name)], {"connection_creation_rate": rate})
        except (ConnectionClosed, ConnectionResetError):
            assert time.monotonic() < deadline
            time.sleep(0.2)


def _time_to_serve(port: int, n: int) -> float:
    """Open ``n`` connections at once (the kernel completes them), then the time until the
    broker has answered an ApiVersions on every one (it must answer them all)."""
    conns = [RawClient(port, timeout_s=30) for _ in range(n)]
    t0 = time.monotonic()
    try:
        for c in conns:
            _api_versions(c)
        return time.monotonic() - t0
    finally:
        for c in conns:
            c.close()


@pytest.mark.parametrize("key", ["max.connection.creation.rate",
                                 "listener.name.plaintext.max.connection.creation.rate"])
def test_the_connection_creation_rate_delays_accepting(key, plain):
    with KBrokerProcess(overrides={**WINDOWS, key: 5}).start() as b:
        # 15 connections at 5/s, the first ~5 within the first window: >= ~2 s, all answered
        took = _time_to_serve(b.port, 15)
        assert took >= 1.5, took
    assert _time_to_serve(plain.port, 15) < 1.0


def test_a_connection_over_its_ips_connection_creation_rate_is_closed_after_its_throttle_time(plain):
    b = plain
    _alter_ip(b.port, "127.0.0.1", 3)
    try:
        outcomes = []                  # (answered, seconds until answered or closed)
        start = time.monotonic()
        for _ in range(10):
            t0 = time.monotonic()
            ok = _answered(b.port)
            outcomes.append((ok, time.monotonic() - t0))
        took = time.monotonic() - start
        served = [t for ok, t in outcomes if ok]
        closed = [t for ok, t in outcomes if not ok]
        # 3 per s, measured over >= 1 s: 3 at once, then about one per throttle time
        assert 3 <= len(served) <= 3 + 3 * took + 1 and len(closed) >= 2, (took, outcomes)
        # Kafka closes a throttled connection once its throttle time (here >= 1/3 s) is over
        assert min(closed) >= 0.2, outcomes
        # the default ip entity applies to every IP; removing both quotas lifts the limit
        _alter_ip(b.port, "127.0.0.1", None)
        _alter_ip(b.port, None, 2)
        start = time.monotonic()
        served = sum(_answered(b.port) for _ in range(8))
        assert served <= 2 + 2 * (time.monotonic() - start) + 1, served
    finally:
        _alter_ip(b.port, None, None)
        _alter_ip(b.port, "127.0.0.1", None)
    assert all(_answered(b.port) for _ in range(8))


def test_the_inter_broker_listener_is_exempt_from_the_broker_wide_rate_when_there_are_others():
    now = [0]
    q = ConnectionQuotas(max_connection_creation_rate=2, inter_broker_listener="INTERNAL",
                         listener_count=2, quota_window_num=2, clock_ms=lambda: now[0])
    assert [q.record_connection_and_get_throttle_ms("INTERNAL") for _ in range(5)] == [0] * 5
    # the client listener: 2 per 1 s window, then (3 - 2) / 2 * 1000 ms, capped at one window
    assert [q.record_connection_and_get_throttle_ms("PLAINTEXT") for _ in range(4)] == [0, 0, 500, 1000]
    # the only listener is not protected
    solo = ConnectionQuotas(max_connection_creation_rate=2, inter_broker_listener="PLAINTEXT",
                            listener_count=1, quota_window_num=2, clock_ms=lambda: 0)
    assert [solo.record_connection_and_get_throttle_ms("PLAINTEXT") for _ in range(3)] == [0, 0, 500]


def test_an_ip_throttled_connection_is_taken_back_out_of_every_rate():
    q = ConnectionQuotas(max_connection_creation_rate=100, listener_connection_creation_rates={"PLAINTEXT": 100},
                         quota_window_num=2, clock_ms=lambda: 0)
    q.update_ip_quotas({(("ip", "127.0.0.1"),): {"connection_creation_rate": 1}})
    for expect in (0, 1000, 1000):
        q.record_connection_and_get_throttle_ms("PLAINTEXT")
        assert q.record_ip_connection_and_get_throttle_ms("PLAINTEXT", "127.0.0.1") == expect
    assert q.record_ip_connection_and_get_throttle_ms("PLAINTEXT", "10.0.0.1") == 0        # no quota
    # counted: 3 connections in the broker and listener rates, 2 taken back
    assert q._broker_rate.rate.measure(0) == pytest.approx(1.0)
    assert q._listener_rates["PLAINTEXT"].rate.measure(0) == pytest.approx(1.0)
