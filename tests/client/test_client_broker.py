"""kbroker.client against real brokers: the same bodies run on Tansu and on kbroker
(``broker`` fixture in conftest.py). Consumers use assign() (groups are slow on Tansu)."""
import threading
import time

import pytest

from kbroker.client import (
    Admin, Consumer, IllegalStateError, KafkaTimeoutError, NewTopic, Producer,
    TopicPartition,
)
from kbroker.client import errors as E
from kbroker.client.producer.partitioner import partition_for_key


def _producer(broker, **cfg):
    return Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 10000, **cfg})


def _consumer(broker, **cfg):
    return Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest", **cfg})


def _create(broker, name, partitions=1):
    with Admin({"bootstrap.servers": broker.bootstrap}) as a:
        a.create_topics([NewTopic(name, partitions, 1)], timeout=20)


def _consume_all(c, n, timeout_s=15.0):
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        out.extend(c.poll(0.5))
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_every_codec(broker, topic_name, codec):
    _create(broker, topic_name, 2)
    sent = []
    with _producer(broker, **{"compression.type": codec, "linger.ms": 20}) as p:
        futs = []
        for i in range(300):
            key = None if i % 5 == 0 else b"key-%d" % (i % 17)
            value = None if i % 7 == 0 else (b"value-%d-" % i) * (i % 4 + 1)
            headers = [("h", b"%d" % i), ("empty", None)] if i % 3 == 0 else []
            futs.append(p.send(topic_name, value, key=key, headers=headers))
            sent.append((key, value, headers))
        p.flush(20)
        mds = [f.get(1) for f in futs]
    assert all(md.topic == topic_name and md.offset >= 0 for md in mds)
    for (key, _, _), md in zip(sent, mds):
        if key is not None:
            assert md.partition == partition_for_key(key, 2)
    c = _consumer(broker)
    c.assign([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
    recs = _consume_all(c, 300)
    c.close()
    assert len(recs) == 300
    by_pos = {(r.partition, r.offset): r for r in recs}
    for (key, value, headers), md in zip(sent, mds):
        r = by_pos[(md.partition, md.offset)]
        assert (r.key, r.value) == (key, value)
        assert [tuple(h) for h in r.headers] == [tuple(h) for h in headers]
    for part in (0, 1):
        offs = [r.offset for r in recs if r.partition == part]
        assert offs == sorted(offs) == list(range(len(offs)))


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(broker, topic_name, acks):
    _create(broker, topic_name)
    with _producer(broker, acks=acks) as p:
        futs = [p.send(topic_name, b"v%d" % i) for i in range(50)]
        p.flush(10)
        mds = [f.get(1) for f in futs]
    if acks == "0":
        assert all(md.offset == -1 for md in mds)   # unknown without a response, as in Java
    else:
        assert [md.offset for md in mds] == list(range(50))
    c = _consumer(broker)
    c.assign([TopicPartition(topic_name, 0)])
    recs = _consume_all(c, 50)
    c.close()
    assert [r.value for r in recs] == [b"v%d" % i for i in range(50)]


def test_keyed_partitions_match_librdkafka_murmur2(broker, topic_name):
    import confluent_kafka
    _create(broker, topic_name, 5)
    keys = [b"user-%d" % i for i in range(60)] + [b"", b"\x00\xff"]
    rd = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random"})
    rd_parts = {}
    for k in keys:
        rd.produce(topic_name, b"v", key=k, on_delivery=lambda err, m: rd_parts.__setitem__(m.key(), m.partition()))
    assert rd.flush(10) == 0
    with _producer(broker) as p:
        futs = {k: p.send(topic_name, b"v", key=k) for k in keys}
        ours = {k: f.get(10).partition for k, f in futs.items()}
    assert ours == rd_parts
    assert ours == {k: partition_for_key(k, 5) for k in keys}


def test_linger_and_batch_size(broker, topic_name):
    _create(broker, topic_name)
    with _producer(broker, **{"linger.ms": 400}) as p:
        t0 = time.monotonic()
        futs = [p.send(topic_name, b"x", partition=0) for _ in range(10)]
        done_early, elapsed = [f.done() for f in futs], time.monotonic() - t0
        assert elapsed >= 0.4 or not any(done_early), "records left before linger.ms expired"
        futs[-1].get(5)
        assert time.monotonic() - t0 >= 0.35
        assert len({id(f._result) for f in futs}) == 1     # one batch
    with _producer(broker, **{"batch.size": 500, "linger.ms": 1000}) as p:
        futs = [p.send(topic_name, b"y" * 100, partition=0) for _ in range(20)]
        futs[0].get(5)                                       # full batches go before linger
        assert len({id(f._result) for f in futs}) >= 4
        p.flush(5)


def test_callbacks_futures_flush_close(broker, topic_name):
    _create(broker, topic_name)
    seen = []
    done = threading.Event()
    p = _producer(broker)

    def cb(err, md):
        seen.append((err, md.offset if md else None))
        if len(seen) == 20:
            done.set()
    futs = [p.send(topic_name, b"%d" % i, on_delivery=cb) for i in range(20)]
    p.flush(10)
    assert all(f.done() and f.succeeded() for f in futs)
    assert done.wait(5)
    assert seen == [(None, i) for i in range(20)]        # in order, once each
    late = []
    futs[0].add_callback(lambda err, md: late.append(md.offset))
    assert late == [0]
    pending = [p.send(topic_name, b"z") for _ in range(5)]
    p.close(10)                                            # close delivers what is queued
    assert all(f.get(0).offset >= 20 for f in pending)
    with pytest.raises(IllegalStateError):
        p.send(topic_name, b"after close")


def test_batches_that_wait_for_memory_are_all_delivered_in_order(broker, topic_name):
    """A partition's queue leaves the accumulator when it empties (so the sender's passes
    cost what is queued, not every partition written): an append that waits for
    buffer.memory while the sender drains and completes that partition's last batch
    must still queue its new batch where the sender looks."""
    _create(broker, topic_name, partitions=2)
    values = [b"%04d" % i + b"x" * 600 for i in range(300)]
    p = _producer(broker, **{"batch.size": 1024, "buffer.memory": 4096, "linger.ms": 0,
                             "max.block.ms": 20000})
    try:
        futs = [p.send(topic_name, v, partition=i % 2) for i, v in enumerate(values)]
        p.flush(30)
        mds = [f.get(0) for f in futs]
        assert not p.accumulator.batches and not p.accumulator.incomplete
    finally:
        p.close(0)
    for part in (0, 1):
        offsets = [md.offset for md in mds[part::2]]
        assert offsets == list(range(150))
    c = _consumer(broker)
    try:
        c.assign([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
        got = _consume_all(c, 300)
    finally:
        c.close()
    assert sorted(r.value for r in got) == sorted(values)
    for part in (0, 1):
        assert [r.value for r in got if r.partition == part] == values[part::2]


def test_serializers_and_str(broker, topic_name):
    _create(broker, topic_name)
    with _producer(broker, **{"key.serializer": lambda k: k.encode() if k else None,
                              "value.serializer": lambda v: repr(v).encode()}) as p:
        p.send(topic_name, {"a": 1}, key="k").get(10)
    c = _consumer(broker, **{"value.deserializer": lambda b: b.decode()})
    c.assign([TopicPartition(topic_name, 0)])
    [r] = _consume_all(c, 1)
    c.close()
    assert (r.key, r.value) == (b"k", "{'a': 1}")


def test_idempotent_producer(broker, topic_name):
    _create(broker, topic_name)
    with Admin({"bootstrap.servers": broker.bootstrap}) as a:
        a.describe_cluster()
        # InitProducerId (api key 22) as negotiated on any connection the admin opened
        if broker.kind == "tansu" and all(c.versions.get(22) is None for c in list(a.client.conns.values())):
            with _producer(broker, **{"enable.idempotence": True, "max.block.ms": 3000}) as p:
                with pytest.raises(E.UnsupportedVersionError):
                    p.send(topic_name, b"x").get(10)
            pytest.skip(f"{broker.kind} does not implement InitProducerId yet")
    with _producer(broker, **{"enable.idempotence": True}) as p:
        futs = [p.send(topic_name, b"i%d" % i) for i in range(30)]
        p.flush(10)
        assert [f.get(1).offset for f in futs] == list(range(30))
        assert p.sender.txn.producer_id >= 0
    c = _consumer(broker)
    c.assign([TopicPartition(topic_name, 0)])
    recs = _consume_all(c, 30)
    c.close()
    assert [r.value for r in recs] == [b"i%d" % i for i in range(30)]


def test_seek_position_offsets_for_times(broker, topic_name):
    _create(broker, topic_name)
    tp = TopicPartition(topic_name, 0)
    with _producer(broker, **{"linger.ms": 0}) as p:
        for i in range(10):
            p.send(topic_name, b"%d" % i, timestamp_ms=1_000_000 + 1000 * i).get(10)
    c = _consumer(broker)
    c.assign([tp])
    assert c.position(tp) == 0
    c.seek(tp, 5)
    recs = _consume_all(c, 5)
    assert [r.offset for r in recs] == [5, 6, 7, 8, 9]
    assert recs[0].timestamp == 1_005_000
    assert c.position(tp) == 10
    found = c.offsets_for_times({tp: 1_002_500})
    if broker.kind == "kbroker":
        # Tansu answers ListOffsets(timestamp) with offset 0 / now (librdkafka sees the same)
        assert found[tp].offset == 3 and found[tp].timestamp == 1_003_000
        assert c.offsets_for_times({tp: 9_000_000})[tp] is None
    else:
        assert found[tp] is not None and found[tp].offset >= 0
    c.seek_to_beginning([tp])
    assert c.position(tp) == 0
    assert [r.offset for r in _consume_all(c, 10)] == list(range(10))
    assert c.beginning_offsets([tp]) == {tp: 0}
    if broker.kind == "kbroker":
        # Tansu's ListOffsets(latest) answers last batch's base offset + 1 (memory engine)
        assert c.end_offsets([tp]) == {tp: 10}
    c.close()


def test_offset_out_of_range_resets(broker, topic_name):
    _create(broker, topic_name)
    tp = TopicPartition(topic_name, 0)
    with _producer(broker) as p:
        for i in range(3):
            p.send(topic_name, b"%d" % i)
    c = _consumer(broker, **{"auto.offset.reset": "none"})
    c.assign([tp])
    with pytest.raises(E.NoOffsetForPartitionError):
        c.poll(1)
    if broker.kind == "tansu":
        c.close()
        pytest.skip("Tansu answers a Fetch beyond the log end with NONE and no records, "
                    "not OFFSET_OUT_OF_RANGE")
    c.seek(tp, 1000)
    with pytest.raises(E.OffsetOutOfRangeError):
        for _ in range(20):
            c.poll(0.5)
    c.close()
    c = _consumer(broker)
    c.assign([tp])
    c.seek(tp, 1000)
    recs = _consume_all(c, 3)
    assert [r.value for r in recs] == [b"0", b"1", b"2"]          # reset to earliest
    c.close()


def test_admin_errors_and_metadata(broker, topic_name):
    with Admin({"bootstrap.servers": broker.bootstrap}) as a:
        a.create_topics([NewTopic(topic_name, 3, 1)], timeout=20)
        with pytest.raises(E.TopicAlreadyExistsError) as ei:
            a.create_topics([NewTopic(topic_name, 3, 1)], timeout=20)
        assert ei.value.name == "TOPIC_ALREADY_EXISTS" and not ei.value.retriable
        assert len(a.describe_topics([topic_name])[topic_name]) == 3
        with pytest.raises(E.UnknownTopicOrPartitionError):
            a.describe_topics(["no-such-topic-" + topic_name])
        cd = a.describe_cluster()
        assert cd.brokers and cd.controller_id in {b.node_id for b in cd.brokers}
        res = a.list_offsets({TopicPartition(topic_name, 0): -2})
        assert res[TopicPartition(topic_name, 0)].offset == 0
        assert a.delete_topics([topic_name]) == {topic_name: None}


def test_metadata_refresh_after_partitions_added(broker, topic_name):
    with Admin({"bootstrap.servers": broker.bootstrap}) as a:
        a.create_topics([NewTopic(topic_name, 1, 1)], timeout=20)
        if broker.kind == "tansu" and all(c.versions.get(37) is None for c in list(a.client.conns.values())):
            pytest.skip(f"{broker.kind} does not implement CreatePartitions")
        with _producer(broker, **{"max.block.ms": 5000}) as p:
            assert p.partitions_for(topic_name) == [0]
            a.create_partitions({topic_name: 3}, timeout=20)
            md = p.send(topic_name, b"x", partition=2).get(10)   # waits for fresh metadata
            assert md.partition == 2


def test_unknown_topic_without_auto_create_times_out(broker, topic_name):
    with _producer(broker, **{"max.block.ms": 500}) as p:
        p.metadata.allow_auto_topic_creation = False
        with pytest.raises(KafkaTimeoutError, match="not present in metadata"):
            p.send("missing-" + topic_name, b"x")


def test_commit_and_committed_with_assign(broker, topic_name):
    _create(broker, topic_name)
    tp = TopicPartition(topic_name, 0)
    with _producer(broker) as p:
        for i in range(5):
            p.send(topic_name, b"%d" % i)
    c = _consumer(broker, **{"group.id": "g-" + topic_name, "enable.auto.commit": False})
    c.assign([tp])
    assert len(_consume_all(c, 5)) == 5
    assert c.committed([tp]) == {tp: None}
    c.commit()
    assert c.committed([tp])[tp].offset == 5
    c.commit({tp: 2})
    assert c.committed([tp])[tp].offset == 2
    results = []
    c.commit_async({tp: 4}, lambda offsets, exc: results.append(exc))
    deadline = time.monotonic() + 5
    while not results and time.monotonic() < deadline:
        c.poll(0.1)
    assert results == [None]
    c.close()
    c = _consumer(broker, **{"group.id": "g-" + topic_name})
    c.assign([tp])                            # starts from the committed offset
    assert [r.value for r in _consume_all(c, 1)][:1] == [b"4"]
    c.close()


def test_subscribe_single_member(broker, topic_name):
    _create(broker, topic_name, 2)
    with _producer(broker) as p:
        for i in range(10):
            p.send(topic_name, b"%d" % i, key=b"%d" % i)
    group = "sub-" + topic_name
    c = _consumer(broker, **{"group.id": group, "heartbeat.interval.ms": 500,
                             "session.timeout.ms": 10000})
    assigned = []
    c.subscribe([topic_name], on_assign=lambda cons, tps: assigned.append(sorted(tps)))
    recs = _consume_all(c, 10, timeout_s=30)
    assert sorted(r.value for r in recs) == sorted(b"%d" % i for i in range(10))
    assert assigned[-1] == [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
    c.commit()
    committed = c.committed([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
    assert sum(om.offset for om in committed.values()) == 10
    c.close()
    with Admin({"bootstrap.servers": broker.bootstrap, "default.api.timeout.ms": 15000}) as a:
        tps = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
        offsets = a.list_consumer_group_offsets(group, tps)
        assert sum(om.offset for om in offsets.values()) == 10
        if broker.kind == "kbroker":   # Tansu does not answer OffsetFetch for all topics
            assert a.list_consumer_group_offsets(group) == offsets


def test_subscribe_two_members_split_partitions(broker, topic_name):
    if broker.kind == "tansu":
        pytest.skip("rebalances take many seconds on Tansu; covered on kbroker")
    _create(broker, topic_name, 2)
    with _producer(broker) as p:
        for i in range(20):
            p.send(topic_name, b"%d" % i, partition=i % 2)
    group = "two-" + topic_name
    consumers = [_consumer(broker, **{"group.id": group, "heartbeat.interval.ms": 200,
                                      "session.timeout.ms": 6000,
                                      "partition.assignment.strategy": strategy})
                 for strategy in ("roundrobin", "roundrobin")]
    got = {0: [], 1: []}
    owned = {0: 0, 1: 0}  # partitions each consumer owns, written by its own thread
    done = threading.Event()

    def split_and_all_seen():
        # without committed offsets a partition that moves is read again by its next owner:
        # count distinct values, not messages
        return owned == {0: 1, 1: 1} and {int(r.value) for r in got[0] + got[1]} == set(range(20))

    def run(i):
        c = consumers[i]
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < deadline:
            got[i].extend(c.poll(0.2))
            owned[i] = len(c.assignment())
            if split_and_all_seen():
                done.set()
    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    try:
        a0, a1 = consumers[0].assignment(), consumers[1].assignment()
        assert len(a0) == len(a1) == 1 and a0 != a1
        values = sorted(int(r.value) for r in got[0] + got[1])
        assert set(values) == set(range(20))
    finally:
        for c in consumers:
            c.close()


def test_commit_inside_on_revoke_uses_the_current_generation(broker, topic_name):
    """Eager rebalance: a member's on_revoke commits with the generation it still holds
    (Kafka's onJoinPrepare), so the next owner resumes where it stopped. A commit with
    generation -1 would be refused while the group has members."""
    _create(broker, topic_name, 2)
    with _producer(broker) as p:
        for i in range(10):
            p.send(topic_name, b"%d" % i, partition=i % 2)
    group = "revoke-" + topic_name
    settings = {"group.id": group, "heartbeat.interval.ms": 200, "session.timeout.ms": 6000,
                "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    c1 = _consumer(broker, **settings)
    results = []

    def on_revoke(cons, tps):
        try:
            cons.commit()
            results.append(None)
        except E.KafkaError as e:
            results.append(e)
    c1.subscribe([topic_name], on_revoke=on_revoke)
    recs = _consume_all(c1, 10, timeout_s=30)
    assert len(recs) == 10
    c2 = _consumer(broker, **settings)
    c2.subscribe([topic_name])
    stop = threading.Event()

    def keep_polling(c):
        while not stop.is_set():
            c.poll(0.1)
    t = threading.Thread(target=keep_polling, args=(c2,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not results and time.monotonic() < deadline:
            c1.poll(0.1)
        assert results == [None], results
        committed = c1.committed([TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)])
        assert sorted(om.offset for om in committed.values()) == [5, 5]
    finally:
        stop.set()
        t.join(10)
        c1.close()
        c2.close()


def test_admin_calls_go_to_another_broker_when_the_named_controller_is_gone(broker, topic_name):
    """A KRaft broker names a random live broker as "controller"; one just killed is still
    named until its session times out. The admin client leaves a node that refuses the
    connection out and sends the call elsewhere (Kafka's AdminClient retries on disconnect),
    instead of waiting for that node until the call's deadline."""
    from kbroker.client.metadata import BrokerMetadata
    from kbroker.testing import free_port

    with Admin({"bootstrap.servers": broker.bootstrap, "reconnect.backoff.ms": 50}) as a:
        a.describe_cluster(timeout=20)
        dead = BrokerMetadata(4242, "127.0.0.1", free_port(), None)   # nothing listens there
        a.metadata.cluster.brokers[dead.node_id] = dead
        a.metadata.cluster.controller_id = dead.node_id
        assert a.create_topics([NewTopic(topic_name, 1, 1)], timeout=20) == {topic_name: None}
        assert a.client.connection_failed(dead.node_id)              # it was tried, and refused
