"""The data plane of a KRaft cluster of real processes (1 controller + 3 brokers): topics
placed by the controller are led by different brokers, each serving its own partitions.
confluent-kafka produces (acks=all, idempotent: producer ids from AllocateProducerIds) to
every partition and a consumer group reads everything back with committed offsets (the
coordinator is the leader of the group's __consumer_offsets partition, created through the
controller on first FindCoordinator); kafka-python does the same on another topic; a raw
Produce to a broker that does not lead the partition answers NOT_LEADER_OR_FOLLOWER naming
the leader (KIP-951); a SIGKILLed broker's partitions go offline (RF 1: nothing to elect)
and come back, with their records and a higher leader epoch, when it restarts; producing
to an unknown topic creates it through the controller."""
from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic, ResourceType,
)

from kbroker.kernels import records as rec
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.frames import decode_response, encode_request
from kbroker.protocol.messages import fetch as fm, init_producer_id as ipi, metadata as md_msg, produce as pr
from kbroker.testing import KRaftControllerQuorum

FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
        "broker.session.timeout.ms": 2000, "broker.heartbeat.interval.ms": 300,
        "offsets.topic.num.partitions": 6, "group.initial.rebalance.delay.ms": 0}
BROKERS = [2, 3, 4]


def _wait(cond, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            v = cond()
        except KafkaException:
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


def _metadata(q, port=None):
    bootstrap = q.bootstrap if port is None else f"127.0.0.1:{port}"
    return AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5)


def _raw(port, api_key, version, body):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(encode_request(api_key, version, 7, "kdata-test", body))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    return decode_response(buf[4:4 + int.from_bytes(buf[:4], "big")], api_key, version)[1]


def _topic_metadata(port, topic):
    r = _raw(port, ApiKey.METADATA, 12, md_msg.MetadataRequest(
        topics=[md_msg.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
    return r.topics[0]


def _leaders(port, topic):
    """{partition: (leader, leader epoch)} from a raw Metadata v12."""
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in _topic_metadata(port, topic).partitions}


def _produce_all(q, topic, n_partitions, per_partition):
    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    errors = []
    for i in range(n_partitions * per_partition):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % n_partitions,
                  on_delivery=lambda e, m: errors.append(e) if e else None)
    assert p.flush(30) == 0
    assert errors == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for the module's tests (each leaves every broker running and unfenced)."""
    q = KRaftControllerQuorum(str(tmp_path_factory.mktemp("kraft")), n=1, overrides=FAST, brokers=3)
    try:
        q.start()
        _wait(lambda: sorted(_metadata(q).brokers) == BROKERS, what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


def test_kraft_data_plane(cluster):
    q = cluster
    admin = AdminClient({"bootstrap.servers": q.bootstrap})
    admin.create_topics([NewTopic("orders", num_partitions=6, replication_factor=1)])["orders"].result(15)
    md = _wait(lambda: (lambda m: m if "orders" in m.topics and all(
        p.leader in BROKERS for p in m.topics["orders"].partitions.values()) else None)(_metadata(q)),
        what="orders led")
    parts = md.topics["orders"].partitions
    leaders = {i: p.leader for i, p in parts.items()}
    assert set(leaders.values()) == set(BROKERS)            # spread over the three brokers
    for p in parts.values():
        assert p.replicas == [p.leader] and p.isrs == [p.leader]

    # every partition produced to its own leader, consumed back by a group with committed offsets
    _produce_all(q, "orders", 6, 10)
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "g-orders", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        c.subscribe(["orders"])
        seen = {}
        deadline = time.monotonic() + 30
        while sum(seen.values()) < 60 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            seen[m.partition()] = seen.get(m.partition(), 0) + 1
            assert m.leader_epoch() is not None and m.leader_epoch() >= 0
        assert seen == {i: 10 for i in range(6)}
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition("orders", i) for i in range(6)], timeout=10)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(i, 10) for i in range(6)]
    finally:
        c.close()

    # a raw Produce v10 to a broker that does not lead partition 0: NOT_LEADER_OR_FOLLOWER naming the leader
    leader0 = leaders[0]
    other = next(b for b in BROKERS if b != leader0)
    batch = rec.encode_batch([(int(time.time() * 1000), b"k", b"v", [])])
    r = _raw(q.broker_ports[other], ApiKey.PRODUCE, 10, pr.ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[pr.TopicProduceData(
            name="orders", partition_data=[pr.PartitionProduceData(index=0, records=batch)])]))
    p0 = r.responses[0].partition_responses[0]
    assert p0.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    epochs = _leaders(q.broker_ports[other], "orders")
    assert {i: lead for i, (lead, _) in epochs.items()} == leaders
    assert (p0.current_leader.leader_id, p0.current_leader.leader_epoch) == epochs[0]
    assert [(e.node_id, e.port) for e in r.node_endpoints] == [(leader0, q.broker_ports[leader0])]

    # Fetch v16 (by topic id) to the same non-leader: the same, with the leader's endpoint (KIP-951)
    topic_id = _topic_metadata(q.broker_ports[other], "orders").topic_id
    r = _raw(q.broker_ports[other], ApiKey.FETCH, 16, fm.FetchRequest(
        max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[fm.FetchTopic(topic_id=topic_id, partitions=[fm.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id=""))
    f0 = r.responses[0].partitions[0]
    assert f0.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (f0.current_leader.leader_id, f0.current_leader.leader_epoch) == epochs[0]
    assert [(e.node_id, e.port) for e in r.node_endpoints] == [(leader0, q.broker_ports[leader0])]
    # the leader itself, asked with a stale or a future leader epoch
    for epoch, code in ((epochs[0][1] - 1, ErrorCode.FENCED_LEADER_EPOCH),
                        (epochs[0][1] + 1, ErrorCode.UNKNOWN_LEADER_EPOCH)):
        if epoch < 0:
            continue
        r = _raw(q.broker_ports[leader0], ApiKey.FETCH, 16, fm.FetchRequest(
            max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[fm.FetchTopic(topic_id=topic_id, partitions=[fm.FetchPartition(
                partition=0, current_leader_epoch=epoch, fetch_offset=0, partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id=""))
        assert r.responses[0].partitions[0].error_code == code

    # RF 3: the followers fetch, so acks=all is answered once both have the batch; acks=1 at once
    # (tests/cluster/test_replication_e2e.py covers replication itself)
    admin.create_topics([NewTopic("rf3", num_partitions=1, replication_factor=3)])["rf3"].result(15)
    lead3 = _wait(lambda: (lambda l: l.get(0, (-1,))[0] if l.get(0, (-1,))[0] > 0 else None)(
        _leaders(q.broker_ports[other], "rf3")), what="rf3 led")
    def produce3(acks):
        r = _raw(q.broker_ports[lead3], ApiKey.PRODUCE, 9, pr.ProduceRequest(
            transactional_id=None, acks=acks, timeout_ms=10000, topic_data=[pr.TopicProduceData(
                name="rf3", partition_data=[pr.PartitionProduceData(index=0, records=batch)])]))
        return r.responses[0].partition_responses[0].error_code

    # another broker's metadata named the leader: the leader itself may apply that record a
    # moment later (NOT_LEADER_OR_FOLLOWER until then, which a client retries)
    first = _wait(lambda: (lambda c: None if c == ErrorCode.NOT_LEADER_OR_FOLLOWER else (c,))(produce3(-1)),
                  what="rf3 leader serving")
    assert first == (ErrorCode.NONE,)
    assert produce3(1) == ErrorCode.NONE

    # kafka-python on another topic (auto-created by its first produce, through the controller)
    from kafka import KafkaConsumer, KafkaProducer
    kp = KafkaProducer(bootstrap_servers=q.bootstrap, acks="all")
    for i in range(20):
        kp.send("auto-created", key=b"%d" % i, value=b"kp%d" % i)
    kp.flush(30)
    kp.close()
    md = _metadata(q)
    assert len(md.topics["auto-created"].partitions) == 1   # num.partitions
    kc = KafkaConsumer("auto-created", bootstrap_servers=q.bootstrap, group_id="g-kp",
                       auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=15000)
    try:
        values = []
        for m in kc:
            values.append(m.value)
            if len(values) == 20:
                break
        assert values == [b"kp%d" % i for i in range(20)]
        kc.commit()
    finally:
        kc.close()

    # SIGKILL the leader of partition 0: after the session timeout its partitions are offline
    victim = leader0
    victim_parts = sorted(i for i, b in leaders.items() if b == victim)
    q.procs[victim].kill()
    port = q.broker_ports[next(b for b in BROKERS if b != victim)]

    def offline():
        m = _metadata(q, port)
        ps = m.topics["orders"].partitions
        return m if victim not in m.brokers and all(ps[i].leader == -1 for i in victim_parts) else None
    _wait(offline, what="the killed broker's partitions offline")
    q.procs[victim].start()
    _wait(lambda: (lambda m: m if all(m.topics["orders"].partitions[i].leader == victim
                                             for i in victim_parts) else None)(_metadata(q, port)),
                 what="partitions led again after the restart")
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "g-after", "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition("orders", i, 0) for i in victim_parts])
        got = 0
        deadline = time.monotonic() + 20
        while got < 10 * len(victim_parts) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
        assert got == 10 * len(victim_parts)
    finally:
        c.close()
    after = _leaders(port, "orders")
    for i in victim_parts:   # a new leadership: a higher leader epoch (consumers' truncation detection)
        assert after[i][0] == victim and after[i][1] > epochs[i][1]


def test_kraft_configs_and_producer_ids(cluster):
    """Runs after test_kraft_data_plane on the same cluster (its restarted broker is back).
    DescribeConfigs answered from the image (values and sources), IncrementalAlterConfigs
    forwarded to the controller and published back to every broker; InitProducerId ids
    come from controller-allocated blocks, so two brokers never hand out the same id."""
    q = cluster
    _wait(lambda: sorted(_metadata(q).brokers) == BROKERS, what="3 brokers unfenced")
    admin = AdminClient({"bootstrap.servers": q.bootstrap})
    admin.create_topics([NewTopic("cfg", num_partitions=3, replication_factor=1,
                                  config={"retention.ms": "3600000"})])["cfg"].result(15)
    res = ConfigResource(ResourceType.TOPIC, "cfg")

    def described():
        entries = admin.describe_configs([res])[res].result(10)
        return entries if entries["retention.ms"].value == "3600000" else None
    entries = _wait(described, what="topic config described")
    assert ConfigSource(entries["retention.ms"].source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert ConfigSource(entries["cleanup.policy"].source) == ConfigSource.DEFAULT_CONFIG
    admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])])[res].result(15)
    _wait(lambda: admin.describe_configs([res])[res].result(10)["retention.ms"].value == "7200000",
          what="altered config published")
    for b in BROKERS:   # every broker describes its own broker configs
        br = ConfigResource(ResourceType.BROKER, str(b))
        one = AdminClient({"bootstrap.servers": f"127.0.0.1:{q.broker_ports[b]}"})
        cfg = one.describe_configs([br])[br].result(10)
        assert cfg["broker.session.timeout.ms"].value == "2000"

    ids = []
    for b in BROKERS:
        for _ in range(2):
            r = _raw(q.broker_ports[b], ApiKey.INIT_PRODUCER_ID, 4, ipi.InitProducerIdRequest(
                transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
            assert r.error_code == ErrorCode.NONE
            ids.append(r.producer_id)
    assert len(set(ids)) == len(ids)
    assert ids[0] + 1 == ids[1]                     # one block per broker, ids from it in order
    assert len({i // 1000 for i in ids}) == 3       # three different blocks


def test_combined_nodes_serve_data_across_a_clean_restart(tmp_path):
    """3 combined nodes (broker,controller): a group reads what an idempotent producer wrote;
    a node stopped cleanly (controlled shutdown) and started again leads its partitions
    again with a higher leader epoch and its records."""
    q = KRaftControllerQuorum(str(tmp_path), overrides=FAST, combined=True)
    try:
        q.start()
        _wait(lambda: sorted(_metadata(q).brokers) == [1, 2, 3], what="3 combined nodes unfenced")
        admin = AdminClient({"bootstrap.servers": q.bootstrap})
        admin.create_topics([NewTopic("c6", num_partitions=6, replication_factor=1)])["c6"].result(15)
        port = q.broker_ports[1]
        before = _wait(lambda: (lambda l: l if all(lead > 0 for lead, _ in l.values()) else None)(
            _leaders(port, "c6")), what="c6 led")
        assert {lead for lead, _ in before.values()} == {1, 2, 3}
        _produce_all(q, "c6", 6, 5)
        node = before[0][0]
        q.procs[node].terminate()
        q.procs[node].start()
        after = _wait(lambda: (lambda l: l if all(l[i][0] == node for i in l if before[i][0] == node) else None)(
            _leaders(q.broker_ports[node % 3 + 1], "c6")), what="led again after the restart")
        mine = [i for i in before if before[i][0] == node]
        assert all(after[i][1] > before[i][1] for i in mine)
        c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "g-c6", "auto.offset.reset": "earliest"})
        try:
            c.subscribe(["c6"])
            got = 0
            deadline = time.monotonic() + 30
            while got < 30 and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    got += 1
            assert got == 30
        finally:
            c.close()
    finally:
        q.stop()
