"""A KRaft cluster of real processes seen through confluent-kafka's AdminClient: 3
controllers + 3 brokers, and 3 combined nodes. Topics are created, described and deleted
through any broker (admin requests forwarded to the active controller); Metadata and
DescribeCluster list the live brokers; a SIGKILLed broker is fenced after its session
times out and leaves Metadata, and comes back unfenced when it restarts."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from kbroker.testing import KRaftControllerQuorum

FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
        "broker.session.timeout.ms": 2000, "broker.heartbeat.interval.ms": 300}


def _wait(cond, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


def _brokers(port):
    """The live brokers a broker's Metadata lists (None while it lists none: librdkafka
    answers a Metadata response without brokers with a partial-response error)."""
    try:
        return sorted(AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=5).brokers)
    except KafkaException:
        return None


@pytest.fixture
def cluster(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), overrides=FAST, brokers=3)
    try:
        q.start()
        _wait(lambda: all(_brokers(p) == [4, 5, 6] for p in q.broker_ports.values()), what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


@pytest.fixture
def combined(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), overrides=FAST, combined=True)
    try:
        q.start()
        _wait(lambda: all(_brokers(p) == [1, 2, 3] for p in q.broker_ports.values()), what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


def _admin_round_trip(q, broker_ids):
    ports = list(q.broker_ports.values())
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[1]}"})
    fs = admin.create_topics([NewTopic("orders", num_partitions=6, replication_factor=3),
                              NewTopic("events", num_partitions=3, replication_factor=1)], operation_timeout=10)
    for f in fs.values():
        assert f.result(timeout=15) is None
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        admin.create_topics([NewTopic("orders", num_partitions=1, replication_factor=1)])["orders"].result(15)
    # every broker's Metadata: all brokers, every partition placed on distinct live brokers
    for port in ports:
        md = _wait(lambda: (lambda m: m if "orders" in m.topics and "events" in m.topics else None)(
            AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)), what="topics visible")
        assert sorted(md.brokers) == broker_ids
        orders = md.topics["orders"].partitions
        assert sorted(orders) == list(range(6))
        for p in orders.values():
            assert len(set(p.replicas)) == 3 and set(p.replicas) == set(broker_ids)
            assert p.leader in broker_ids and p.leader in p.isrs
        leaders = [p.leader for p in orders.values()]
        assert all(leaders.count(b) == 2 for b in broker_ids)      # leaders spread evenly
        events = md.topics["events"].partitions
        assert sorted(p.replicas[0] for p in events.values()) == broker_ids
    desc = admin.describe_cluster(request_timeout=10).result()
    assert desc.cluster_id == q.cluster_id and sorted(n.id for n in desc.nodes) == broker_ids
    assert desc.controller.id in broker_ids
    assert admin.create_partitions([NewPartitions("events", 5)])["events"].result(15) is None
    _wait(lambda: len(admin.list_topics(timeout=10).topics["events"].partitions) == 5, what="5 partitions")
    assert admin.delete_topics(["orders"], operation_timeout=10)["orders"].result(15) is None
    _wait(lambda: "orders" not in admin.list_topics(timeout=10).topics, what="orders deleted")


def test_three_controllers_three_brokers(cluster):
    q = cluster
    _admin_round_trip(q, [4, 5, 6])
    # SIGKILL a broker: fenced after broker.session.timeout.ms, gone from Metadata; back on restart
    q.procs[5].kill()
    t0 = time.monotonic()
    _wait(lambda: _brokers(q.broker_ports[4]) == [4, 6], what="broker 5 fenced")
    assert time.monotonic() - t0 >= 1.0      # not before its session could expire
    md = AdminClient({"bootstrap.servers": f"127.0.0.1:{q.broker_ports[6]}"}).list_topics(timeout=10)
    for p in md.topics["events"].partitions.values():
        assert p.leader != 5
    q.start(5)
    _wait(lambda: _brokers(q.broker_ports[4]) == [4, 5, 6], what="broker 5 unfenced again")


def test_three_combined_nodes(combined):
    _admin_round_trip(combined, [1, 2, 3])


def test_a_starting_broker_answers_only_once_it_is_unfenced(tmp_path):
    """Kafka's BrokerServer enables request processing only after the controller has
    unfenced the broker, so its first Metadata answer already lists it. Requests sent the
    moment the listener is bound wait until then: a raw Metadata request lists broker 2, and
    librdkafka's CreateTopics (which took a Metadata answer with no live broker as a partial
    response and stalled for good) completes."""
    import threading

    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.metadata import MetadataRequest
    from kbroker.testing import raw_request

    q = KRaftControllerQuorum(str(tmp_path), n=1, overrides=FAST, brokers=1)
    try:
        q.start(1)
        q.start(2)                   # returns once the broker's listener accepts connections
        port = q.broker_ports[2]
        created: list = []

        def create():
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
            fs = admin.create_topics([NewTopic("early", num_partitions=2, replication_factor=1)],
                                     operation_timeout=10)
            try:
                created.append(fs["early"].result(timeout=20))
            except Exception as e:  # noqa: BLE001 - reported below
                created.append(e)
        t = threading.Thread(target=create)
        t.start()
        md = raw_request(port, ApiKey.METADATA, 12, MetadataRequest(topics=None), timeout_s=20)
        assert [b.node_id for b in md.brokers] == [2]
        t.join(30)
        assert created == [None]
        log = q.procs[2].read_log()
        assert "The broker has been unfenced" in log
    finally:
        q.stop()
