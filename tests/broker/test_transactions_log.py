"""Transactions on the partition leader against a real kbroker process: transactional
Produce with explicit producer ids/epochs, WriteTxnMarkers COMMIT/ABORT, the last
stable offset, read_committed fetches (confluent-kafka / librdkafka's default,
kafka-python's and aiokafka's isolation_level, kbroker.client's isolation.level),
ListOffsets, DelayedFetch, crash recovery of the LSO
and the ``.txnindex``. The transaction coordinator is not involved: these tests play
its part with raw WriteTxnMarkers requests, on brokers with KIP-890's produce-time
verification off (``transaction.partition.verification.enable=false``: no coordinator
knows these producers; tests/broker/test_txn_verification.py covers it on)."""
import asyncio
import glob
import os
import random
import threading
import time
import uuid

import aiokafka
import confluent_kafka as ck
import kafka
import pytest

from kbroker.kernels import records
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from kbroker.protocol.messages.list_offsets import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
)
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData
from kbroker.protocol.messages.write_txn_markers import (
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
)
from kbroker.client import Consumer, TopicPartition
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient, advertised
from kbroker.testing import KBrokerProcess

NO_VERIFY = {"transaction.partition.verification.enable": "false"}

TS = int(time.time() * 1000)   # markers carry the broker clock: no time-based roll between


@pytest.fixture(scope="module")
def broker():
    """The module's broker (tests/broker/conftest.py's, with verification off)."""
    b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0, **NO_VERIFY})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, f"broker exited with {rc} on SIGTERM; log tail:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-6000:]


def _topic(prefix="txn"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _pid():
    return random.randrange(10_000, 1 << 40)


class Txn:
    """Raw transactional producer: explicit producer id / epoch, sequences per partition."""

    def __init__(self, client, topic, pid=None, epoch=0, transactional_id="tid"):
        self.c, self.topic, self.pid, self.epoch = client, topic, pid or _pid(), epoch
        self.transactional_id = transactional_id
        self.seq = {}

    def send(self, partition, values, transactional=True, epoch=None, transactional_id=...):
        epoch = self.epoch if epoch is None else epoch
        seq = self.seq.get(partition, 0)
        batch = records.encode_batch([(TS, None, v, []) for v in values], producer_id=self.pid,
                                     producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)
        tid = self.transactional_id if transactional_id is ... else transactional_id
        err, base = produce(self.c, self.topic, partition, batch, transactional_id=tid)
        if err == 0:
            self.seq[partition] = seq + len(values)
        return err, base

    def end(self, commit, partitions, coordinator_epoch=0, epoch=None, version=1):
        return write_markers(self.c, [(self.pid, self.epoch if epoch is None else epoch, commit,
                                       {self.topic: partitions}, coordinator_epoch)], version)


def produce(c, topic, partition, batch, transactional_id=None, version=9):
    req = ProduceRequest(transactional_id=transactional_id, acks=-1, timeout_ms=10000, topic_data=[
        TopicProduceData(name=topic, partition_data=[PartitionProduceData(index=partition, records=batch)])])
    p = c.call(ApiKey.PRODUCE, version, req).responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def plain(c, topic, partition, values):
    return produce(c, topic, partition, records.encode_batch([(TS, None, v, []) for v in values]))


def write_markers(c, markers, version=1):
    """markers: (pid, epoch, commit, {topic: [partitions]}, coordinator_epoch) ->
    {(pid, topic, partition): error_code}"""
    req = WriteTxnMarkersRequest(markers=[
        WritableTxnMarker(producer_id=pid, producer_epoch=epoch, transaction_result=commit,
                          coordinator_epoch=ce,
                          topics=[WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in tps.items()])
        for pid, epoch, commit, tps, ce in markers])
    r = c.call(ApiKey.WRITE_TXN_MARKERS, version, req)
    return {(m.producer_id, t.name, p.partition_index): p.error_code
            for m in r.markers for t in m.topics for p in t.partitions}


def list_latest(c, topic, partition, isolation):
    req = ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
        ListOffsetsTopic(name=topic, partitions=[ListOffsetsPartition(partition_index=partition, timestamp=-1)])])
    p = c.call(ApiKey.LIST_OFFSETS, 5, req).topics[0].partitions[0]
    assert p.error_code == 0
    return p.offset


def fetch(c, topic, partition, offset, isolation, max_wait_ms=0, min_bytes=1):
    req = FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
                       isolation_level=isolation, topics=[FetchTopic(topic=topic, partitions=[
                           FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20)])])
    return c.call(ApiKey.FETCH, 11, req, timeout_s=30).responses[0].partitions[0]


def batches_of(p):
    return records.decode_batches(bytes(p.records)) if p.records else []


def _confluent_read(bootstrap, topic, partitions, until, conf=None, timeout_s=30, out=None):
    """Values read by a confluent-kafka consumer (default isolation.level=read_committed)
    until ``until(values)``; then 0.5 s more to catch anything extra. ``out``: the list
    to append to as records arrive."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                     "enable.auto.commit": False, "fetch.wait.max.ms": 50, **(conf or {})})
    c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in partitions])
    out = [] if out is None else out
    try:
        deadline = time.monotonic() + timeout_s
        extra = None
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                out.append((m.partition(), m.value()))
            if extra is None and until(out):
                extra = time.monotonic() + 0.5
            if extra is not None and time.monotonic() > extra:
                break
    finally:
        c.close()
    return out


def _kafka_python_read(bootstrap, topic, partitions, until, isolation, timeout_s=30):
    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation,
                            fetch_max_wait_ms=50)
    tps = [kafka.TopicPartition(topic, p) for p in partitions]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    out = []
    try:
        deadline = time.monotonic() + timeout_s
        extra = None
        while time.monotonic() < deadline:
            for tp, msgs in c.poll(timeout_ms=100).items():
                out.extend((tp.partition, m.value) for m in msgs)
            if extra is None and until(out):
                extra = time.monotonic() + 0.5
            if extra is not None and time.monotonic() > extra:
                break
    finally:
        c.close()
    return out


def _kbroker_client_read(bootstrap, topic, partitions, until, isolation, timeout_s=30):
    """Our own client's consumer (kbroker.client), assigned from the beginning."""
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "isolation.level": isolation,
                  "fetch.max.wait.ms": 50})
    c.assign([TopicPartition(topic, p) for p in partitions])
    out = []
    try:
        deadline = time.monotonic() + timeout_s
        extra = None
        while time.monotonic() < deadline:
            out.extend((r.partition, r.value) for r in c.poll(0.1))
            if extra is None and until(out):
                extra = time.monotonic() + 0.5
            if extra is not None and time.monotonic() > extra:
                break
    finally:
        c.close()
    return out


async def _aiokafka_read(bootstrap, topic, partitions, until, isolation, timeout_s=30):
    c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                  auto_offset_reset="earliest", isolation_level=isolation, fetch_max_wait_ms=50)
    await c.start()
    out = []
    try:
        c.assign([aiokafka.TopicPartition(topic, p) for p in partitions])
        deadline = time.monotonic() + timeout_s
        extra = None
        while time.monotonic() < deadline:
            for tp, msgs in (await c.getmany(timeout_ms=100)).items():
                out.extend((tp.partition, m.value) for m in msgs)
            if extra is None and until(out):
                extra = time.monotonic() + 0.5
            if extra is not None and time.monotonic() > extra:
                break
    finally:
        await c.stop()
    return out


def _saw_ends(parts):
    return lambda out: all((p, b"end") in out for p in parts)


def test_write_txn_markers_is_advertised(broker):
    assert advertised(broker.port)[ApiKey.WRITE_TXN_MARKERS] == (0, 1)


def test_committed_visible_aborted_hidden_for_every_client(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=2)
    with RawClient(broker.port) as c:
        a, b = Txn(c, topic), Txn(c, topic)
        for p in (0, 1):
            assert a.send(p, [b"a1-%d" % p, b"a2-%d" % p])[0] == 0
            assert b.send(p, [b"b1-%d" % p])[0] == 0
            assert plain(c, topic, p, [b"plain-%d" % p])[0] == 0
            assert a.send(p, [b"a3-%d" % p])[0] == 0
            assert b.send(p, [b"b2-%d" % p])[0] == 0
        assert a.end(True, [0, 1]) == {(a.pid, topic, 0): 0, (a.pid, topic, 1): 0}
        assert b.end(False, [0, 1], version=0) == {(b.pid, topic, 0): 0, (b.pid, topic, 1): 0}
        for p in (0, 1):
            assert plain(c, topic, p, [b"end"])[0] == 0
            # no transaction open: the LSO is the high watermark
            assert list_latest(c, topic, p, 1) == list_latest(c, topic, p, 0) == 9
            f = fetch(c, topic, p, 0, 1)
            assert f.last_stable_offset == f.high_watermark == 9
            assert [(t.producer_id, t.first_offset) for t in f.aborted_transactions] == [(b.pid, 2)]
            assert f.aborted_transactions is not None
            assert fetch(c, topic, p, 0, 0).aborted_transactions in (None, [])
            kinds = [(bt.is_control, bt.is_transactional) for bt in batches_of(f)]
            assert kinds.count((True, True)) == 2     # the markers are in the data, for the client to skip

    committed = {(p, v) for p in (0, 1) for v in (b"a1-%d" % p, b"a2-%d" % p, b"plain-%d" % p, b"a3-%d" % p,
                                                    b"end")}
    everything = committed | {(p, v) for p in (0, 1) for v in (b"b1-%d" % p, b"b2-%d" % p)}
    got = _confluent_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]))
    assert sorted(got) == sorted(committed)
    got = _confluent_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]),
                          {"isolation.level": "read_uncommitted"})
    assert sorted(got) == sorted(everything)
    got = _kafka_python_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]), "read_committed")
    assert sorted(got) == sorted(committed)
    got = _kafka_python_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]), "read_uncommitted")
    assert sorted(got) == sorted(everything)
    got = _kbroker_client_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]), "read_committed")
    assert sorted(got) == sorted(committed)
    got = asyncio.run(_aiokafka_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]), "read_committed"))
    assert sorted(got) == sorted(committed)
    got = _kbroker_client_read(broker.bootstrap, topic, [0, 1], _saw_ends([0, 1]), "read_uncommitted")
    assert sorted(got) == sorted(everything)
    # order within a partition is the log's
    p0 = [v for p, v in _confluent_read(broker.bootstrap, topic, [0], _saw_ends([0])) if p == 0]
    assert p0 == [b"a1-0", b"a2-0", b"plain-0", b"a3-0", b"end"]


def test_consumer_blocked_at_open_transaction_advances_when_marker_lands(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=1)
    with RawClient(broker.port) as c:
        assert plain(c, topic, 0, [b"before"])[0] == 0          # 0
        t = Txn(c, topic)
        assert t.send(0, [b"t1", b"t2"]) == (0, 1)              # 1-2, open
        assert plain(c, topic, 0, [b"after"])[0] == 0           # 3: held behind the open transaction
        assert list_latest(c, topic, 0, 1) == 1                 # LSO = the open transaction's first offset
        assert list_latest(c, topic, 0, 0) == 4
        for isolation, end in (("read_committed", 1), ("read_uncommitted", 4)):
            cons = Consumer({"bootstrap.servers": broker.bootstrap, "isolation.level": isolation})
            try:
                assert cons.end_offsets([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): end}
            finally:
                cons.close()
        f = fetch(c, topic, 0, 0, 1)
        assert (f.high_watermark, f.last_stable_offset) == (4, 1)
        assert [r.value for bt in batches_of(f) for r in bt.records] == [b"before"]
        assert fetch(c, topic, 0, 1, 1).records in (None, b"")   # at the LSO: nothing
        # a DelayedFetch at the LSO waits for the marker, not for the open data
        with RawClient(broker.port) as c2:
            start = time.monotonic()
            f = fetch(c2, topic, 0, 1, 1, max_wait_ms=700)
            assert time.monotonic() - start >= 0.6 and not f.records
            answer = {}

            def waiting_fetch():
                answer["f"] = fetch(c2, topic, 0, 1, 1, max_wait_ms=20000)
                answer["t"] = time.monotonic()
            th = threading.Thread(target=waiting_fetch)
            th.start()
            seen = []
            consumer = threading.Thread(target=lambda: _confluent_read(
                broker.bootstrap, topic, [0], lambda out: (0, b"after") in out, out=seen))
            consumer.start()
            deadline = time.monotonic() + 20
            while (0, b"before") not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert seen == [(0, b"before")]      # the consumer got what is below the LSO
            time.sleep(0.5)                      # and gets nothing more while the transaction is open
            assert seen == [(0, b"before")] and th.is_alive()
            marked = time.monotonic()
            assert t.end(True, [0]) == {(t.pid, topic, 0): 0}
            th.join(20)
            consumer.join(40)
        assert answer["t"] - marked < 5
        assert [r.value for bt in batches_of(answer["f"]) for r in bt.records if not bt.is_control][:2] == \
            [b"t1", b"t2"]
        assert answer["f"].last_stable_offset == 5
        assert seen == [(0, b"before"), (0, b"t1"), (0, b"t2"), (0, b"after")]
        assert list_latest(c, topic, 0, 1) == list_latest(c, topic, 0, 0) == 5


def test_bad_markers_and_transactional_produces(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=2)
    with RawClient(broker.port) as c:
        t = Txn(c, topic, epoch=5)
        assert t.send(0, [b"x"])[0] == 0
        assert t.send(1, [b"y"])[0] == 0
        # a marker from an older producer epoch
        assert t.end(True, [0], epoch=4) == {(t.pid, topic, 0): ErrorCode.INVALID_PRODUCER_EPOCH}
        # an unknown partition among good ones: per-partition errors
        r = write_markers(c, [(t.pid, 5, False, {topic: [0, 7], "no-such-topic": [0]}, 3)])
        assert r == {(t.pid, topic, 0): 0, (t.pid, topic, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                     (t.pid, "no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        # a coordinator epoch older than the producer's last marker is fenced
        assert t.end(False, [0], coordinator_epoch=2) == {
            (t.pid, topic, 0): ErrorCode.TRANSACTION_COORDINATOR_FENCED}
        # several markers in one request, the fenced one does not stop the others
        r = write_markers(c, [(t.pid, 5, False, {topic: [1]}, 3), (t.pid, 5, True, {topic: [0]}, 1)])
        assert r == {(t.pid, topic, 1): 0, (t.pid, topic, 0): ErrorCode.TRANSACTION_COORDINATOR_FENCED}
        # transactional produce from a stale epoch
        assert t.send(0, [b"z"], epoch=4)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        # a plain (non-transactional) batch from a producer inside its transaction
        assert t.send(0, [b"open"])[0] == 0
        assert t.send(0, [b"plain"], transactional=False)[0] == ErrorCode.INVALID_TXN_STATE
        # transactional records without a transactional id
        assert t.send(1, [b"w"], transactional_id=None)[0] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        # a transactional batch without a producer id
        bad = records.encode_batch([(TS, None, b"q", [])], is_transactional=True)
        assert produce(c, topic, 1, bad, transactional_id="tid")[0] == ErrorCode.INVALID_RECORD
        assert t.end(False, [0], coordinator_epoch=3) == {(t.pid, topic, 0): 0}
        assert list_latest(c, topic, 0, 1) == list_latest(c, topic, 0, 0)


def _partition_dir(broker, topic, p):
    (d,) = glob.glob(os.path.join(broker.data_dir, "logs", f"{topic}-{p}"))
    return d


def _txnindex(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if n.endswith(".txnindex")}


def _answers(c, topic):
    out = []
    for p in (0, 1):
        f = fetch(c, topic, p, 0, 1)
        out.append((list_latest(c, topic, p, 1), list_latest(c, topic, p, 0), f.last_stable_offset,
                    [(a.producer_id, a.first_offset) for a in f.aborted_transactions]))
    return out


@pytest.mark.parametrize("lose_files", [False, True])
def test_sigkill_restart_rebuilds_lso_and_txnindex(fresh_broker, lose_files):
    b = fresh_broker(**{"num.partitions": 2, "log.segment.bytes": 400, **NO_VERIFY})
    topic = _topic()
    create_topic(b.bootstrap, topic, partitions=2)
    with RawClient(b.port) as c:
        committed, aborted, open_ = Txn(c, topic), Txn(c, topic), Txn(c, topic)
        for p in (0, 1):
            for i in range(3):
                assert committed.send(p, [b"c%d" % i])[0] == 0
                assert aborted.send(p, [b"x%d" % i])[0] == 0
                assert plain(c, topic, p, [b"p%d" % i])[0] == 0
        assert committed.end(True, [0, 1]) == {(committed.pid, topic, p): 0 for p in (0, 1)}
        assert aborted.end(False, [0, 1]) == {(aborted.pid, topic, p): 0 for p in (0, 1)}
        for p in (0, 1):
            assert open_.send(p, [b"o1"])[0] == 0
            assert plain(c, topic, p, [b"late"])[0] == 0
        before = _answers(c, topic)
    assert before[0][0] == 11 and before[0][1] == 13 and before[0][3] == [(aborted.pid, 1)]
    dirs = [_partition_dir(b, topic, p) for p in (0, 1)]
    files = [_txnindex(d) for d in dirs]
    assert all(files) and all(len(os.listdir(d)) > 6 for d in dirs)   # several segments
    b.kill()
    if lose_files:
        for d in dirs:
            for n in os.listdir(d):
                if n.endswith((".txnindex", ".snapshot")):
                    os.unlink(os.path.join(d, n))
    b = fresh_broker(**{"num.partitions": 2, "log.segment.bytes": 400, **NO_VERIFY})
    with RawClient(b.port) as c:
        assert _answers(c, topic) == before
        assert [_txnindex(d) for d in dirs] == files
        # the reopened transaction still ends with its marker
        open_.c = c
        assert open_.end(True, [0, 1]) == {(open_.pid, topic, p): 0 for p in (0, 1)}
        assert list_latest(c, topic, 0, 1) == list_latest(c, topic, 0, 0) == 14
    got = _confluent_read(b.bootstrap, topic, [0, 1], lambda out: all((p, b"late") in out for p in (0, 1)))
    expect = {(p, v) for p in (0, 1) for v in (b"c0", b"c1", b"c2", b"p0", b"p1", b"p2", b"o1", b"late")}
    assert sorted(got) == sorted(expect)
