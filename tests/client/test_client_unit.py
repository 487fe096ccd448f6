"""kbroker.client pieces that need no real broker: config validation, partitioner
compatibility, assignors, consumer-protocol payloads, and producer behaviour against a
scripted fake broker that never answers Produce (buffer.memory blocking, timeouts)."""
import socket
import struct
import threading
import time

import pytest

from kbroker.client import (
    BufferExhaustedError, KafkaConfigError, KafkaTimeoutError, Producer, RecordTooLargeError,
)
from kbroker.client import errors as E
from kbroker.client.consumer.assignors import range_assign, roundrobin_assign
from kbroker.client.consumer.coordinator import (
    decode_assignment, decode_subscription, encode_assignment, encode_subscription,
)
from kbroker.client.metadata import Cluster, PartitionMetadata, TopicPartition
from kbroker.client.producer.partitioner import BuiltInPartitioner, partition_for_key
from kbroker.client.producer.sender import stamp_producer_state
from kbroker.kernels import records
from kbroker.protocol import ApiKey, decode_request, encode_response
from kbroker.protocol.messages.api_versions import ApiVersion, ApiVersionsResponse
from kbroker.protocol.messages.metadata import (
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
)


# -- config -----------------------------------------------------------------------------
def test_config_defaults_are_kafkas():
    p = Producer.__new__(Producer)
    from kbroker.client.config import PRODUCER, ClientConfig
    cfg = ClientConfig(PRODUCER, {"bootstrap.servers": "127.0.0.1:9092"})
    assert cfg["batch.size"] == 16384 and cfg["linger.ms"] == 5
    assert cfg["buffer.memory"] == 33554432 and cfg["max.block.ms"] == 60000
    assert cfg["retries"] == 2147483647 and cfg["delivery.timeout.ms"] == 120000
    assert cfg["request.timeout.ms"] == 30000 and cfg["acks"] == -1
    assert cfg["bootstrap.servers"] == [("127.0.0.1", 9092)]
    del p


@pytest.mark.parametrize("props, key", [
    ({"linger.ms": -1}, "linger.ms"),
    ({"linger.ms": "soon"}, "linger.ms"),
    ({"acks": "2"}, "acks"),
    ({"compression.type": "brotli"}, "compression.type"),
    ({"no.such.key": 1}, "no.such.key"),
    ({"enable.idempotence": True, "acks": 1}, "acks"),
    ({"delivery.timeout.ms": 10}, "delivery.timeout.ms"),
])
def test_config_errors_name_the_key(props, key):
    with pytest.raises(KafkaConfigError, match=key.replace(".", r"\.")):
        Producer({"bootstrap.servers": "127.0.0.1:1", **props})


def test_config_requires_bootstrap():
    with pytest.raises(KafkaConfigError, match="bootstrap.servers"):
        Producer({})


def test_error_classes_carry_kafka_names():
    e = E.for_code(6)
    assert type(e).__name__ == "NotLeaderOrFollowerError" and e.name == "NOT_LEADER_OR_FOLLOWER"
    assert e.retriable and isinstance(e, E.KafkaError)
    assert not E.for_code(36).retriable and E.for_code(36).name == "TOPIC_ALREADY_EXISTS"


# -- partitioner ------------------------------------------------------------------------
def test_partitioner_matches_kafka_python_and_java():
    from kafka.partitioner.default import DefaultPartitioner, murmur2

    class _Cluster:   # the ClusterMetadata surface DefaultPartitioner.partition uses
        def __init__(self, n):
            self.n = n

        def topics(self):
            return {"t"}

        def partitions_for_topic(self, topic):
            return set(range(self.n))

        available_partitions_for_topic = partitions_for_topic
    keys = [b"", b"a", b"key", b"hello world", bytes(range(256))] + [b"k%d" % i for i in range(500)]
    for n in (1, 3, 7, 64, 1000):
        for k in keys:
            assert partition_for_key(k, n) == DefaultPartitioner().partition("t", k, k, None, None, _Cluster(n))
            assert partition_for_key(k, n) == (murmur2(k) & 0x7FFFFFFF) % n
    # Java's UtilsTest.testMurmur2 vector: murmur2("21") == -973932308
    assert partition_for_key(b"21", 1 << 30) == (-973932308 & 0x7FFFFFFF) % (1 << 30)


def _cluster(n):
    return Cluster(topics={"t": [PartitionMetadata(i, 1, 0, (1,), (1,), 0) for i in range(n)]})


def test_sticky_partitioner_switches_after_a_batch():
    c = _cluster(4)
    bp = BuiltInPartitioner(batch_size=1000)
    first = bp.partition("t", None, c)
    seen = {first}
    for _ in range(9):
        assert bp.partition("t", None, c) == first
        bp.on_append("t", first, 100, c, False)
    bp.on_append("t", first, 100, c, False)   # 1000 bytes: switch
    second = bp.partition("t", None, c)
    assert second != first
    for _ in range(40):
        p = bp.partition("t", None, c)
        seen.add(p)
        bp.on_append("t", p, 1000, c, False)
    assert seen == {0, 1, 2, 3}
    assert bp.partition("t", b"key", c) == partition_for_key(b"key", 4)


# -- assignors / consumer protocol --------------------------------------------------------
def test_range_and_roundrobin_assignors():
    assert range_assign({"b": ["t"], "a": ["t"]}, {"t": 5}) == {"a": {"t": [0, 1, 2]}, "b": {"t": [3, 4]}}
    rr = roundrobin_assign({"a": ["t", "u"], "b": ["t", "u"]}, {"t": 3, "u": 2})
    assert rr == {"a": {"t": [0, 2], "u": [1]}, "b": {"t": [1], "u": [0]}}
    assert range_assign({"a": ["t"], "b": ["u"]}, {"t": 2, "u": 1}) == {"a": {"t": [0, 1]}, "b": {"u": [0]}}


def test_consumer_protocol_payloads_round_trip():
    assert decode_subscription(encode_subscription(["x", "y"])) == ["x", "y"]
    assert decode_assignment(encode_assignment({"x": [2, 0]})) == [TopicPartition("x", 2), TopicPartition("x", 0)]
    assert encode_subscription(["x"])[:2] == b"\x00\x00"   # int16 version prefix


def test_stamp_producer_state_keeps_the_batch_valid():
    buf = records.encode_batch([(1, None, b"v%d" % i, []) for i in range(3)])
    out = stamp_producer_state(buf, 42, 3, 17)
    b = records.decode_batches(out)[0]     # CRC checked
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (42, 3, 17)
    assert [r.value for r in b.records] == [b"v0", b"v1", b"v2"]


# -- fake broker: answers ApiVersions and Metadata, never Produce -------------------------
class SilentBroker:
    """A one-broker 'cluster' on 127.0.0.1 that swallows Produce requests."""

    def __init__(self, partitions=2):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.partitions = partitions
        self.produce_count = 0
        #: the topics each MetadataRequest named (None: all topics)
        self.metadata_requests = []
        self.stop = False
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, c):
        c.settimeout(0.2)
        buf = b""
        while not self.stop:
            try:
                d = c.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not d:
                return
            buf += d
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                n = struct.unpack(">i", buf[:4])[0]
                header, body = decode_request(buf[4:4 + n])
                buf = buf[4 + n:]
                key, ver, cid = header.request_api_key, header.request_api_version, header.correlation_id
                if key == ApiKey.API_VERSIONS:
                    resp = ApiVersionsResponse(error_code=0, api_keys=[
                        ApiVersion(api_key=ApiKey.PRODUCE, min_version=3, max_version=9),
                        ApiVersion(api_key=ApiKey.METADATA, min_version=0, max_version=12),
                        ApiVersion(api_key=ApiKey.API_VERSIONS, min_version=0, max_version=3)])
                elif key == ApiKey.METADATA:
                    self.metadata_requests.append(
                        None if body.topics is None else [t.name for t in body.topics])
                    resp = MetadataResponse(brokers=[MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.port)],
                                            cluster_id="fake", controller_id=1, topics=[
                        MetadataResponseTopic(error_code=0, name=t.name, partitions=[
                            MetadataResponsePartition(error_code=0, partition_index=i, leader_id=1, leader_epoch=0,
                                                      replica_nodes=[1], isr_nodes=[1], offline_replicas=[])
                            for i in range(self.partitions)]) for t in (body.topics or [])])
                else:
                    self.produce_count += 1
                    continue
                c.sendall(encode_response(cid, key, ver, resp))

    def close(self):
        self.stop = True
        self.sock.close()
        for t in self.threads:
            t.join(2)


@pytest.fixture
def silent():
    b = SilentBroker()
    yield b
    b.close()


def test_buffer_memory_blocks_then_raises_after_max_block_ms(silent):
    p = Producer({"bootstrap.servers": f"127.0.0.1:{silent.port}", "enable.idempotence": False,
                  "buffer.memory": 40000,
                  "batch.size": 16384, "max.block.ms": 300, "request.timeout.ms": 5000,
                  # a long linger: a batch leaves only when full, so each 16 sends are one batch
                  # (with linger 0 the sender could drain a batch of a few records, and the
                  # first sends already needed a third batch)
                  "delivery.timeout.ms": 70000, "linger.ms": 60000})
    try:
        futs = [p.send("t", b"x" * 1000, partition=0) for _ in range(16)]   # one batch
        futs += [p.send("t", b"x" * 1000, partition=1) for _ in range(16)]  # a second
        t0 = time.monotonic()
        with pytest.raises(BufferExhaustedError, match="max blocking time 300 ms"):
            for _ in range(100):     # a third batch needs memory held by unanswered produces
                p.send("t", b"x" * 1000, partition=0)
        assert 0.25 <= time.monotonic() - t0 < 3
        assert isinstance(BufferExhaustedError("x"), KafkaTimeoutError)
        assert not any(f.done() for f in futs)
    finally:
        p.close(0)
    assert all(f.failed() for f in futs)


def test_unanswered_produce_fails_with_timeout(silent):
    p = Producer({"bootstrap.servers": f"127.0.0.1:{silent.port}", "enable.idempotence": False,
                  "request.timeout.ms": 300,
                  "delivery.timeout.ms": 800, "linger.ms": 0, "retry.backoff.ms": 50})
    seen = []
    try:
        f = p.send("t", b"v", partition=0, on_delivery=lambda err, md: seen.append((err, md)))
        with pytest.raises(KafkaTimeoutError):
            f.get(10)
        assert silent.produce_count >= 1
        # Java's Callback contract: on failure the metadata names the partition, -1 elsewhere
        [(err, md)] = seen
        assert isinstance(err, KafkaTimeoutError)
        assert tuple(md) == ("t", 0, -1, -1, -1, -1)
        late = []
        f.add_callback(lambda err, md: late.append(md))     # already failed: runs at once
        assert tuple(late[0]) == ("t", 0, -1, -1, -1, -1)
    finally:
        p.close(1)


def test_metadata_wait_times_out_for_missing_partition(silent):
    p = Producer({"bootstrap.servers": f"127.0.0.1:{silent.port}", "max.block.ms": 300})
    try:
        with pytest.raises(KafkaTimeoutError, match="Partition 5 of topic t with partition count 2"):
            p.send("t", b"v", partition=5)
    finally:
        p.close(0)


def test_new_topics_are_fetched_at_once_and_alone(silent):
    """Kafka's requestUpdateForNewTopics: a topic the producer has not seen is asked for
    at once (not after retry.backoff.ms) and alone (a partial MetadataRequest merged into
    what is known). With a backoff of a minute and max.block.ms of 5 s, waiting out the
    backoff for each new topic would time the waits out."""
    p = Producer({"bootstrap.servers": f"127.0.0.1:{silent.port}", "enable.idempotence": False,
                  "retry.backoff.ms": 60000, "max.block.ms": 5000})
    names = [f"n{i}" for i in range(12)]
    try:
        for t in names:
            # the send path's wait for a topic's metadata (a send would also put
            # Produce requests on the connection, which this fake broker never answers)
            assert p.partitions_for(t) == [0, 1]
        first = silent.metadata_requests.index(["n0"])
        assert silent.metadata_requests[first:] == [[t] for t in names]
        # every answer was merged: all topics are known without another request
        assert sorted(p.metadata.cluster.topics) == sorted(names)
        assert all(p.partitions_for(t) == [0, 1] for t in names)
        assert len(silent.metadata_requests) == first + len(names)
    finally:
        p.close(0)


def test_failed_partial_metadata_request_backs_off_and_asks_again():
    from kbroker.client.config import PRODUCER, ClientConfig
    from kbroker.client.metadata import Metadata
    md = Metadata(ClientConfig(PRODUCER, {"bootstrap.servers": "127.0.0.1:1", "retry.backoff.ms": 1000}))
    md.update(MetadataResponse(brokers=[], cluster_id="c", controller_id=1, topics=[]), now=100.0)
    assert md.time_to_next_update(100.5) > 0           # nothing new: the backoff holds
    assert md.add_topics("a")
    assert md.time_to_next_update(100.5) == 0          # a new topic: at once
    req = md.build_request(100.5)
    assert [t.name for t in req.topics] == ["a"]
    md.failed_update(OSError("gone"), 100.6)
    # a failure backs off (no busy loop) and asks for "a" again, in a full request now
    assert md.time_to_next_update(100.6) == pytest.approx(0.9)
    req = md.build_request(101.6)
    assert [t.name for t in req.topics] == ["a"]
    md.update(MetadataResponse(brokers=[], cluster_id="c", controller_id=1, topics=[
        MetadataResponseTopic(error_code=0, name="a", partitions=[
            MetadataResponsePartition(error_code=0, partition_index=0, leader_id=1, leader_epoch=0,
                                      replica_nodes=[1], isr_nodes=[1], offline_replicas=[])])]), now=101.65)
    assert md.add_topics("b") and md.time_to_next_update(101.7) == 0
    assert [t.name for t in md.build_request(101.7).topics] == ["b"]
    # an answer with a retriable error for the new topic: a full update follows, after the backoff
    md.update(MetadataResponse(brokers=[], cluster_id="c", controller_id=1, topics=[
        MetadataResponseTopic(error_code=5, name="b", partitions=[])]), now=101.8)
    assert md.cluster.topic_errors == {"b": 5} and list(md.cluster.topics) == ["a"]
    assert md.time_to_next_update(101.8) == pytest.approx(0.9)
    assert [t.name for t in md.build_request(102.7).topics] == ["a", "b"]


def test_record_too_large(silent):
    p = Producer({"bootstrap.servers": f"127.0.0.1:{silent.port}", "max.request.size": 1000})
    try:
        with pytest.raises(RecordTooLargeError, match="max.request.size"):
            p.send("t", b"x" * 2000, partition=0)
    finally:
        p.close(0)


def test_idempotence_default_follows_the_java_client():
    from kbroker.client.config import PRODUCER as PRODUCER_CONFIG, ClientConfig
    from kbroker.client.errors import KafkaConfigError as CfgErr

    base = {"bootstrap.servers": "127.0.0.1:1"}
    assert ClientConfig(PRODUCER_CONFIG, base)["enable.idempotence"] is True
    # a conflicting setting the user chose, without asking for idempotence, turns it off
    assert ClientConfig(PRODUCER_CONFIG, {**base, "acks": "1"})["enable.idempotence"] is False
    assert ClientConfig(PRODUCER_CONFIG, {**base, "retries": 0})["enable.idempotence"] is False
    # asking for both is an error naming acks
    with pytest.raises(CfgErr, match="acks"):
        ClientConfig(PRODUCER_CONFIG, {**base, "acks": "1", "enable.idempotence": True})


# -- idempotent retries after a leader change (found by kbroker.chaos on 3 brokers) -----------------

class _Batch:
    def __init__(self, tp, seq, count=5, epoch=0):
        self.tp, self.base_sequence, self.record_count, self.producer_epoch = tp, seq, count, epoch
        self.attempts, self.last_attempt, self.created = 0, 0.0, time.monotonic()


def test_retried_batches_go_back_in_sequence_order():
    """A dropped connection fails every in-flight batch of a partition, oldest first; they
    must be sent again in that order (Kafka's insertInSequenceOrder), not reversed."""
    from collections import deque
    from kbroker.client.producer.accumulator import RecordAccumulator

    acc = RecordAccumulator.__new__(RecordAccumulator)
    acc._lock = threading.Lock()
    tp = TopicPartition("t", 0)
    new = _Batch(tp, -1)                   # not drained yet: no sequence
    acc.batches = {tp: deque([new])}
    for seq in (0, 5, 10):                 # failed together, handled oldest first
        acc.reenqueue(_Batch(tp, seq), 1.0)
    assert [b.base_sequence for b in acc.batches[tp]] == [0, 5, 10, -1]
    acc.reenqueue(_Batch(tp, 7), 1.0)
    assert [b.base_sequence for b in acc.batches[tp]] == [0, 5, 7, 10, -1]


def test_out_of_order_sequence_is_retried_unless_the_batch_is_next_in_line():
    """Kafka's TransactionManager.canRetry: OUT_OF_ORDER_SEQUENCE_NUMBER for a batch behind
    an unacknowledged one (being retried on the new leader) is retried; for the batch
    right after the last acknowledged sequence it is final."""
    from kbroker.client.producer.sender import Sender
    from kbroker.client.producer.transaction_manager import TransactionManager
    from kbroker.protocol import ErrorCode

    tp = TopicPartition("t", 0)
    txn = TransactionManager()
    txn.producer_id, txn.producer_epoch = 7, 0
    txn.acked(tp, 0, 9)
    requeued, finished = [], []
    s = Sender.__new__(Sender)
    s.txn, s.retries, s.running, s.delivery_timeout_s = txn, 10, True, 120.0
    s.in_flight_batches, s.guarantee_order = set(), False
    s.metadata = type("M", (), {"request_update": lambda self: None})()
    s.accumulator = type("A", (), {"reenqueue": lambda self, b, now: requeued.append(b.base_sequence)})()
    s._finish = lambda b, off, t, err: finished.append((b.base_sequence, err))
    err = E.for_code(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    s._complete_or_retry(_Batch(tp, 15), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, -1, time.monotonic(), err)
    assert requeued == [15] and finished == []
    s._complete_or_retry(_Batch(tp, 10), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, -1, time.monotonic(), err)
    assert requeued == [15] and finished[0][0] == 10 and finished[0][1] is err
    # an acknowledgement moves the line: 15 is next after 10..14
    s._complete_or_retry(_Batch(tp, 10), ErrorCode.NONE, 100, -1, time.monotonic(), None)
    assert txn.next_acked_sequence(tp) == 15
