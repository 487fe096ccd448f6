"""Bounded memory under hostile clients (issue 13): a size prefix is a claim, not a fact.

1,000 raw connections each announce a 100 MiB request (a 4-byte size prefix and the start
of a Produce request header) and then trickle a few KB over a few seconds, while a normal
confluent-kafka producer and consumer keep working. The broker's RSS (``VmRSS`` of
``/proc/<pid>/status``) must stay under 300 MB. Before the fix the broker allocated the
announced size as soon as it read the prefix: two such connections took it from ~30 MB to
~230 MB and 300 made the kernel's OOM killer end it. The hostile connections are opened in
growing batches with the RSS watched throughout, so the old behaviour fails the test after
about ten connections (~1 GB) instead of exhausting the machine.
"""
from __future__ import annotations

import resource
import socket
import struct
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import _topic, create_topic

pytestmark = pytest.mark.timeout(180)

HOSTILE = 1000
ANNOUNCED = 100 * 1024 * 1024          # == socket.request.max.bytes: a valid size
RSS_LIMIT_KB = 300 * 1000
TRICKLE_ROUNDS, TRICKLE_CHUNK, TRICKLE_GAP_S = 16, 256, 0.25   # 4 KB each over ~4 s
BATCHES = (2, 8, 40, 150, 300, 500)    # growing, so an allocating broker fails early


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class RssWatch(threading.Thread):
    """Samples the broker's RSS every 20 ms; ``peak`` is the largest seen."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rss_kb(pid)
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_kb(self.pid))
            except OSError:
                return

    def check(self, what: str) -> None:
        self.peak = max(self.peak, rss_kb(self.pid))
        assert self.peak < RSS_LIMIT_KB, (
            f"broker RSS reached {self.peak // 1000} MB (limit {RSS_LIMIT_KB // 1000} MB) {what}")


def _ensure_fd_limit(needed: int) -> None:
    """1,000 sockets here and 1,000 in the broker (which inherits this limit): raise the
    soft RLIMIT_NOFILE up to the hard one if it is lower than needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"RLIMIT_NOFILE hard limit {hard} < {needed} needed for {HOSTILE} connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _hostile_prefix(correlation_id: int) -> bytes:
    """Size prefix of a 100 MiB frame, then a Produce v9 request header (api_key 0,
    api_version 9, correlation id, client id) and the start of its body."""
    client_id = b"hostile"
    return (struct.pack(">ihhih", ANNOUNCED, 0, 9, correlation_id, len(client_id)) + client_id
            + b"\x00" + struct.pack(">hi", -1, 30000))


def _open_hostile(port: int, n: int, socks: list, watch: RssWatch) -> None:
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(s)
        s.sendall(_hostile_prefix(len(socks)))
        watch.check(f"after {len(socks)} connections announcing 100 MiB each")


def _produce_and_consume(bootstrap: str, topic: str, producer: Producer, consumer: Consumer,
                         start: int, count: int) -> None:
    """Produce ``count`` records (all acknowledged without error) and read them back."""
    errors = []
    for i in range(start, start + count):
        producer.produce(topic, value=b"v%d" % i, partition=0,
                         on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(20) == 0, "records not delivered within 20 s"
    assert not errors, errors
    want = {b"v%d" % i for i in range(start, start + count)}
    deadline = time.monotonic() + 20
    while want and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            want.discard(m.value())
    assert not want, f"{len(want)} records not consumed within 20 s"


def test_hostile_size_prefixes_do_not_allocate_and_normal_clients_keep_working():
    _ensure_fd_limit(2 * HOSTILE + 512)
    broker = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
                                       "socket.listen.backlog.size": 1024})
    broker.start()
    hostile: list[socket.socket] = []
    watch = RssWatch(broker.pid)
    watch.start()
    producer = consumer = None
    try:
        bootstrap = broker.bootstrap
        topic = _topic("mem")
        create_topic(bootstrap, topic)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": False})
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        produced = 0
        _produce_and_consume(bootstrap, topic, producer, consumer, produced, 50)
        produced += 50
        baseline = rss_kb(broker.pid)

        for n in BATCHES:
            _open_hostile(broker.port, n, hostile, watch)
            time.sleep(0.1)      # the broker reads the prefixes (an allocating one grows here)
            watch.check(f"after {len(hostile)} connections announcing 100 MiB each")
            assert broker.proc.poll() is None, "broker died"
        assert len(hostile) == HOSTILE

        # Trickle a few KB per connection over a few seconds, while the normal clients
        # produce and consume.
        trickle_error = []

        def trickle():
            try:
                for _ in range(TRICKLE_ROUNDS):
                    for s in hostile:
                        s.sendall(b"\x01" * TRICKLE_CHUNK)
                    time.sleep(TRICKLE_GAP_S)
            except OSError as e:          # pragma: no cover - reported below
                trickle_error.append(e)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        rounds = 0
        while t.is_alive():
            _produce_and_consume(bootstrap, topic, producer, consumer, produced, 20)
            produced += 20
            rounds += 1
            watch.check("while trickling")
        t.join(30)
        assert not trickle_error, f"the broker dropped hostile connections mid-frame: {trickle_error}"
        assert rounds >= 2, "the normal clients made no progress during the trickle"
        watch.check("after the trickle")
        peak = watch.peak
    finally:
        watch.stop.set()
        for s in hostile:
            s.close()
        if producer is not None:
            producer.flush(5)
        if consumer is not None:
            consumer.close()
        if watch.peak >= RSS_LIMIT_KB:
            broker.kill()            # an allocating broker: do not wait for it
        rc = broker.terminate()
        log = broker.read_log()
        broker.__exit__(None, None, None)
    print(f"broker RSS: {baseline // 1000} MB before, peak {peak // 1000} MB with {HOSTILE} hostile "
          f"connections; {rounds} produce+consume rounds meanwhile")
    assert rc == 0, log[-4000:]
    assert "Traceback" not in log, log[-6000:]
