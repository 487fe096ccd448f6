"""Issue 16's proof: the Jepsen-style queue workload against a KRaft cluster of 1 controller
and 3 brokers (kbroker.chaos.cluster), RF 3, min.insync.replicas=2, idempotent acks=all
producers (confluent-kafka and kbroker.client) while a seeded nemesis SIGKILLs partition
leaders, pauses brokers (SIGSTOP), cuts one off from its peers and the controller, and
shuts one down (SIGTERM); after healing, a reader reads every partition to its end.
Verdict: no acknowledged record lost, none duplicated, each producer's records in
order, every record at the offset it was acknowledged with.

Also: ``unclean.leader.election.enable=false`` keeps a partition offline rather than
electing a replica that is out of sync, and brings it back, nothing lost, when the last
ISR member returns; set to true (dynamically), the out-of-sync replica is elected and the
partition is online again, the records only the dead leader had lost. And kcat (the
Debian package tools/test.sh installs) produces and consumes through a leader kill."""
from __future__ import annotations

import subprocess
import time

import pytest

from kbroker.chaos.checker import check
from kbroker.chaos.cluster import ChaosCluster, ClusterNemesis
from kbroker.chaos.workload import read_all, run_queue_workload
from tests.broker.kafka_helpers import needs_kcat

RF3 = {"min.insync.replicas": 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ChaosCluster(str(tmp_path_factory.mktemp("chaos")), overrides={"default.replication.factor": 3})
    try:
        c.start()
        c.wait_ready(60)
        yield c
    finally:
        c.stop()


def _run(c, topic, seed, faults, *, partitions=4, max_faults=3, duration_s=8.0, per_producer=400,
         clients=("confluent", "confluent", "kbroker")):
    c.create_topic(topic, partitions, 3, configs=RF3)
    nem = ClusterNemesis(c, topic=topic, partitions=partitions, seed=seed, faults=faults, gap_s=(0.5, 1.0),
                         fault_s=(1.0, 2.5), max_faults=max_faults)
    sends, reads, log = run_queue_workload(c.bootstrap, topic, partitions, producers=len(clients),
                                           records_per_producer=per_producer, duration_s=duration_s, seed=seed,
                                           nemesis=nem, clients=clients)
    v = check(sends, reads)
    assert v.ok, f"{v.summary()}; faults: {log}\n{c.log_tails(1500)}"
    assert len([f for _, f, _ in log if f != "healed"]) >= 1, log
    # liveness: most sends were acknowledged despite the faults
    assert v.acknowledged >= 0.8 * len(clients) * per_producer, f"{v.summary()}; faults: {log}"
    c.wait_ready(30)
    return v, log


def test_leader_kills_pauses_and_a_cut_off_broker_lose_nothing(cluster):
    v, log = _run(cluster, "q-mixed", 17, ("kill-leader", "pause", "isolate"))
    assert {f for _, f, _ in log} >= {"kill-leader", "pause", "isolate"}, log


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_seeded_runs(cluster, seed):
    _run(cluster, f"q-seed-{seed}", seed, ("kill-leader", "pause-leader", "isolate-leader", "kill", "pause", "isolate",
                                          "terminate-leader"),
         max_faults=5, duration_s=15.0, per_producer=800)


def test_unclean_leader_election_disabled_keeps_the_partition_offline(cluster):
    """Replicas [a, b, c]: b and c die, a alone takes more records (min ISR 1 for this
    topic), a dies; b and c return but are out of sync: the partition stays without a
    leader. When a returns, it leads again and every acknowledged record is there."""
    from confluent_kafka import Producer

    c = cluster
    topic = "unclean"
    md = c.create_topic(topic, 1, 3, configs={"min.insync.replicas": 1, "unclean.leader.election.enable": "false"})
    a = md[0][0]
    b, cc = [x for x in c.broker_ids if x != a]
    acked = []

    def produce(values):
        p = Producer({"bootstrap.servers": c.bootstrap_of(a), "acks": "all", "enable.idempotence": True,
                      "message.timeout.ms": 20000})
        for v in values:
            p.produce(topic, value=v, partition=0,
                      on_delivery=lambda e, m: acked.append((m.offset(), m.value())) if e is None else None)
        assert p.flush(30) == 0

    produce([b"before-%d" % i for i in range(20)])
    try:
        c.kill(b)
        c.kill(cc)
        c.wait(lambda: c.metadata(topic, via=a)[0][3] == [a], 30, "ISR shrunk to the leader")
        produce([b"alone-%d" % i for i in range(20)])
        assert len(acked) == 40
        c.kill(a)
        c.start([b, cc])
        c.wait(lambda: c.registered_brokers(b) == sorted([b, cc]), 30, "b and c unfenced")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:      # a while later: still no leader
            leader = c.metadata(topic, via=b)[0][0]
            assert leader == -1, f"out-of-sync replica {leader} elected leader"
            time.sleep(0.2)
        c.start(a)
        c.wait(lambda: c.metadata(topic)[0][0] == a, 30, "the last ISR member leads again")
    finally:
        c.start([x for x in (a, b, cc) if c.pid(x) is None])
    c.wait_ready(30)
    reads = read_all(c.bootstrap, topic, 1, timeout_s=30)
    assert sorted(acked) == [(o, v) for o, v in reads[0] if (o, v) in set(acked)]
    assert {v for _, v in acked} <= {v for _, v in reads[0]}


def test_unclean_leader_election_enabled_elects_an_out_of_sync_replica(cluster):
    """Replicas [a, b, c]: b and c die, a alone takes more records, the topic's
    unclean.leader.election.enable is set to true (dynamically), a dies; b returns, out of
    sync, and is elected: the partition is online again (produce and consume work), and the
    records only a had are lost, as Kafka documents. When a returns it follows b and
    truncates them."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    c = cluster
    topic = "unclean-on"
    md = c.create_topic(topic, 1, 3, configs={"min.insync.replicas": 1, "unclean.leader.election.enable": "false"})
    a = md[0][0]
    b, cc = [x for x in c.broker_ids if x != a]
    acked = []

    def produce(via, values):
        p = Producer({"bootstrap.servers": c.bootstrap_of(via), "acks": "all", "enable.idempotence": True,
                      "message.timeout.ms": 20000})
        for v in values:
            p.produce(topic, value=v, partition=0,
                      on_delivery=lambda e, m: acked.append((m.offset(), m.value())) if e is None else None)
        assert p.flush(30) == 0

    produce(a, [b"before-%d" % i for i in range(20)])
    # the before-* records are on every replica (the high watermark passed them with a full ISR)
    try:
        c.kill(b)
        c.kill(cc)
        c.wait(lambda: c.metadata(topic, via=a)[0][3] == [a], 30, "ISR shrunk to the leader")
        produce(a, [b"alone-%d" % i for i in range(20)])
        assert len(acked) == 40
        admin = AdminClient({"bootstrap.servers": c.bootstrap_of(a)})
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
            "unclean.leader.election.enable", "true", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(15)
        c.kill(a)
        c.start(b)
        c.wait(lambda: c.metadata(topic, via=b)[0][0] == b, 30, "the out-of-sync replica elected")
        produce(b, [b"after-%d" % i for i in range(10)])        # online again
        c.start([a, cc])
        c.wait(lambda: sorted(c.metadata(topic, via=b)[0][3]) == sorted([a, b, cc]), 60,
               "the old leader truncated and back in the ISR")
    finally:
        c.start([x for x in (a, b, cc) if c.pid(x) is None])
    c.wait_ready(30)
    reads = read_all(c.bootstrap, topic, 1, timeout_s=30)[0]
    values = [v for _, v in reads]
    assert values == [b"before-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(10)]
    # the old leader's log is the new leader's: its alone-* records are gone there too
    cons = Consumer({"bootstrap.servers": c.bootstrap_of(a), "group.id": "unclean-on", "enable.auto.commit": False})
    try:
        low, high = cons.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert high == 30
    finally:
        cons.close()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["pause-leader", "isolate-leader"])
def test_a_leader_paused_or_cut_off_past_its_session_comes_back_stale(cluster, fault):
    """The leader is frozen (SIGSTOP) or cut off for longer than broker.session.timeout.ms:
    the controller fences it and elects another; when it comes back it still believes it
    leads, takes writes it can never commit, and must truncate them as a follower."""
    c = cluster
    topic = f"q-{fault}"
    c.create_topic(topic, 2, 3, configs=RF3)
    nem = ClusterNemesis(c, topic=topic, partitions=2, seed=5, faults=(fault,), gap_s=(0.5, 1.0),
                         fault_s=(4.0, 6.0), max_faults=2)
    sends, reads, log = run_queue_workload(c.bootstrap, topic, 2, producers=2, records_per_producer=500,
                                           duration_s=12.0, seed=5, nemesis=nem, clients=("confluent", "kbroker"))
    v = check(sends, reads)
    assert v.ok, f"{v.summary()}; faults: {log}"
    assert len([f for _, f, _ in log if f == fault]) == 2, log
    c.wait_ready(30)


@needs_kcat
def test_kcat_produces_and_consumes_through_a_leader_kill(cluster):
    """kcat -P (idempotent, acks=all) writes lines to an RF 3 topic while its leader is
    SIGKILLed: kcat exits 0 only when every line was acknowledged, and kcat -C reads all
    of them back, once each and in order, from the new leader."""
    c = cluster
    topic = "kcat-failover"
    md = c.create_topic(topic, 1, 3, configs=RF3)
    leader = md[0][0]
    n = 1500
    lines = [b"line-%05d" % i for i in range(n)]
    producer = subprocess.Popen(
        ["kcat", "-b", c.bootstrap, "-P", "-E", "-t", topic, "-p", "0", "-X", "acks=all",
         "-X", "enable.idempotence=true", "-X", "message.timeout.ms=60000", "-X", "linger.ms=5",
         "-X", "retry.backoff.ms=50", "-X", "topic.metadata.refresh.interval.ms=1000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    killed_at = n // 3
    try:
        for i, line in enumerate(lines):
            producer.stdin.write(line + b"\n")
            if i % 50 == 49:
                producer.stdin.flush()
                time.sleep(0.2)               # ~250 lines/s: the kill lands mid-stream
            if i == killed_at:
                c.kill(leader)
        out, err = producer.communicate(timeout=120)      # closes stdin: kcat flushes and exits
        assert producer.returncode == 0, err.decode(errors="replace")[-3000:]
        new_leader = c.wait(lambda: (lambda m: m[0][0] if m[0][0] not in (-1, leader) else None)(
            c.metadata(topic)), 30, "a new leader")
        consumed = subprocess.run(
            ["kcat", "-b", c.bootstrap_of(new_leader), "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
             "-f", "%s\n"], capture_output=True, timeout=60, check=True).stdout
        assert consumed.splitlines() == lines
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(10)
        c.start([x for x in c.broker_ids if c.pid(x) is None])
    c.wait_ready(30)
