"""A restart is a leadership change: every partition's leader epoch goes up (KIP-320).

Kafka bumps a partition's leader epoch whenever its leadership changes, and a broker that
restarts loses and regains leadership of its partitions. Consumers detect log truncation
by leader epoch, so a node that served epoch 0 forever would defeat that check.
"""
import uuid

from confluent_kafka import Consumer, TopicPartition

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import fetch as F
from kbroker.protocol.messages import metadata as M
from kbroker.protocol.messages import offset_for_leader_epoch as O
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient
from tests.broker.test_restart import _produce_n


def _epochs(port, topic):
    with RawClient(port) as c:
        r = c.call(ApiKey.METADATA, 12, M.MetadataRequest(topics=[M.MetadataRequestTopic(name=topic)]))
    (t,) = r.topics
    return [p.leader_epoch for p in sorted(t.partitions, key=lambda p: p.partition_index)]


def _end_offset_for(port, topic, epoch, current=-1):
    with RawClient(port) as c:
        part = O.OffsetForLeaderPartition(partition=0, leader_epoch=epoch, current_leader_epoch=current)
        r = c.call(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, O.OffsetForLeaderEpochRequest(
            replica_id=-1, topics=[O.OffsetForLeaderTopic(topic=topic, partitions=[part])]))
    (p,) = r.topics[0].partitions
    return p.error_code, p.leader_epoch, p.end_offset


def test_restart_bumps_leader_epoch(fresh_broker):
    b = fresh_broker()
    topic = "le-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic, partitions=2)
    first = _epochs(b.port, topic)
    assert first == [first[0]] * 2
    _produce_n(b.bootstrap, topic, 5)
    assert b.terminate() == 0

    b2 = fresh_broker()
    second = _epochs(b2.port, topic)
    assert second == [first[0] + 1] * 2
    _produce_n(b2.bootstrap, topic, 3, start=5)
    # the old epoch ends where the new one began; the new epoch is the latest
    assert _end_offset_for(b2.port, topic, first[0]) == (ErrorCode.NONE, first[0], 5)
    assert _end_offset_for(b2.port, topic, second[0]) == (ErrorCode.NONE, second[0], 8)
    # a client still holding the previous epoch is fenced
    assert _end_offset_for(b2.port, topic, first[0], current=first[0])[0] == ErrorCode.FENCED_LEADER_EPOCH

    # the records written after the restart carry the new partition leader epoch
    with RawClient(b2.port) as c:
        req = F.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=[
            F.FetchTopic(topic=topic, partitions=[F.FetchPartition(partition=0, fetch_offset=0,
                                                                   partition_max_bytes=1 << 20)])])
        r = c.call(ApiKey.FETCH, 11, req)
    raw = bytes(r.responses[0].partitions[0].records)
    epochs = []
    pos = 0
    while pos + 61 <= len(raw):
        size = int.from_bytes(raw[pos + 8:pos + 12], "big")
        epochs.append(int.from_bytes(raw[pos + 12:pos + 16], "big"))
        pos += 12 + size
    assert epochs[0] == first[0] and epochs[-1] == second[0]

    # a third start: one more
    assert b2.terminate() == 0
    b3 = fresh_broker()
    assert _epochs(b3.port, topic) == [first[0] + 2] * 2


def test_consumer_resumes_after_restart_without_false_truncation(fresh_broker):
    """librdkafka validates a committed position's leader epoch after a leader change
    (OffsetForLeaderEpoch); the position must hold, nothing re-read or skipped."""
    b = fresh_broker()
    topic = "lc-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic)
    _produce_n(b.bootstrap, topic, 10)
    group = "g-" + uuid.uuid4().hex[:6]
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    while len(got) < 10:
        m = c.poll(10)
        assert m is not None and m.error() is None
        got.append(m.value())
    c.commit(asynchronous=False)
    c.close()
    assert b.terminate() == 0
    b2 = fresh_broker()
    _produce_n(b2.bootstrap, topic, 4, start=10)
    c = Consumer({"bootstrap.servers": b2.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    more = []
    while len(more) < 4:
        m = c.poll(15)
        assert m is not None and m.error() is None, m and m.error()
        more.append((m.offset(), m.value()))
    c.close()
    assert more == [(10 + i, b"r%06d" % (10 + i)) for i in range(4)]
