"""The controller's replay invariant over a seeded random workload.

1. The active controller's state after handling requests equals the state of a fresh
   controller that replayed the records it emitted (QuorumController.state()).
2. A broker's MetadataImage, built by MetadataDelta from the committed records (through
   the log's byte format), equals the controller's own view (QuorumController.image()),
   and applying each delta's local_changes leaves a broker's replica roles equal to
   what the image says.
3. Along the way: every leader is an active broker in the ISR (or -1), the ISR is a
   non-empty subset of the replicas, leader and partition epochs never go back, and
   the leader epoch grows on every leadership change.
And the checker is shown to fail on corrupted record streams.
"""
from __future__ import annotations

import random
import uuid

import pytest

from kbroker.controller import QuorumController
from kbroker.controller.features import IBP_3_3_IV0, IBP_3_3_IV3, LATEST
from kbroker.metadata import records as R
from kbroker.metadata.delta import MetadataDelta, MetadataReplayError
from kbroker.metadata.image import BROKER_RESOURCE, NO_LEADER, TOPIC_RESOURCE, MetadataImage
from kbroker.metadata.serde import ApiMessageAndVersion, deserialize, serialize
from kbroker.protocol.messages import alter_client_quotas as ACQ
from kbroker.protocol.messages import alter_user_scram_credentials as AUSC
from kbroker.protocol.messages import create_partitions as CP
from kbroker.protocol.messages import delete_topics as DT
from kbroker.protocol.messages import elect_leaders as EL
from kbroker.protocol.messages import incremental_alter_configs as IAC
from kbroker.protocol.messages.allocate_producer_ids import AllocateProducerIdsRequest
from kbroker.protocol.messages.unregister_broker import UnregisterBrokerRequest
from kbroker.protocol.primitives import ZERO_UUID

from tests.controller.harness import Harness

BROKERS = (1, 2, 3, 4, 5)
TOPICS = tuple("t%d" % i for i in range(12))
LOCAL = 1      # the broker whose replica roles are followed through local_changes


class Follower:
    """A broker following the committed log: decodes bytes, replays deltas, applies
    local changes to a model of its ReplicaManager ((topic, partition) -> role)."""

    def __init__(self):
        self.image = MetadataImage()
        self.roles: dict = {}
        self.applied = -1

    def catch_up(self, log) -> None:
        delta = MetadataDelta(self.image)
        n = 0
        for off, rec in log[self.applied + 1:]:
            delta.replay(deserialize(serialize(rec)), off)
            n += 1
        if not n:
            return
        self.applied = delta.offset
        lc = delta.local_changes(LOCAL)
        for tp in lc.deletes:
            self.roles.pop(tp, None)
        for tp in lc.leaders:
            self.roles[tp] = "leader"
        for tp in lc.followers:
            self.roles[tp] = "follower"
        assert set(lc.elected_leaders) <= set(lc.leaders)
        self.image = delta.apply()

    def expected_roles(self) -> dict:
        out = {}
        for t in self.image.topics.by_id.values():
            for pid, p in t.partitions.items():
                if LOCAL in p.replicas:
                    out[(t.name, pid)] = "leader" if p.leader == LOCAL else "follower"
        return out


def check_partitions(c: QuorumController, prev: dict) -> dict:
    now = {}
    for t in c.replication.topics.values():
        for pid, p in t.parts.items():
            assert p.isr and set(p.isr) <= set(p.replicas) and len(set(p.replicas)) == len(p.replicas)
            if p.leader != NO_LEADER:
                assert p.leader in p.isr, (t.name, pid, p)
                assert c.cluster.is_active(p.leader), (t.name, pid, p, c.cluster.registration(p.leader))
            key = (t.id, pid)
            old = prev.get(key)
            if old is not None:
                assert p.partition_epoch >= old.partition_epoch and p.leader_epoch >= old.leader_epoch
                if p.leader != old.leader:
                    assert p.leader_epoch > old.leader_epoch
            now[key] = p
    return now


def run_workload(seed: int, ops: int, checks: int = 4, metadata_version: int = LATEST):
    rnd = random.Random(seed)
    h = Harness(seed=seed, default_replication_factor=2, metadata_version=metadata_version)
    incarnation = {b: uuid.UUID(int=b << 64 | 1) for b in BROKERS}
    follower = Follower()
    prev: dict = {}
    stats = {}

    def some_topic():
        names = list(h.c.replication.by_name)
        return rnd.choice(names) if names else None

    for i in range(ops):
        op = rnd.choices(["tick", "register", "heartbeat", "create", "delete", "grow", "alter", "elect",
                          "config", "pids", "unregister", "reassign", "quota", "scram"],
                         [10, 4, 30, 8, 3, 3, 15, 3, 5, 2, 0.5, 3, 2, 2])[0]
        stats[op] = stats.get(op, 0) + 1
        b = rnd.choice(BROKERS)
        if op == "tick":
            h.now += rnd.randrange(0, 4000)
            h.write(h.c.fence_stale_brokers(h.now))
        elif op == "register":
            if rnd.random() < 0.3:
                incarnation[b] = uuid.UUID(int=rnd.getrandbits(128))
            h.register(b, incarnation=incarnation[b], rack="r%d" % (b % 2),
                       log_dirs=None if metadata_version == LATEST else [])
        elif op == "heartbeat":
            if b not in h.epochs:
                continue
            lag = rnd.choice([0, 0, 0, 1, 5])
            h.heartbeat(b, offset=max(-1, h.c.last_committed_offset - lag),
                        want_fence=rnd.random() < 0.02, want_shut_down=rnd.random() < 0.03,
                        epoch=h.epochs[b] if rnd.random() < 0.97 else h.epochs[b] + 1)
        elif op == "create":
            name = rnd.choice(TOPICS)
            cfg = {"retention.ms": str(rnd.randrange(1000))} if rnd.random() < 0.3 else None
            h.create_topic(name, rnd.randint(1, 4), rnd.choice([-1, 1, 2, 3]), configs=cfg,
                           validate_only=rnd.random() < 0.1)
        elif op == "delete":
            name = some_topic()
            if name is None:
                continue
            if rnd.random() < 0.5:
                req = DT.DeleteTopicsRequest(topic_names=[name])
            else:
                tid = h.c.replication.by_name[name]
                req = DT.DeleteTopicsRequest(topics=[DT.DeleteTopicState(name=None, topic_id=tid)])
            h.write(h.c.delete_topics(req))
        elif op == "grow":
            name = some_topic()
            if name is None:
                continue
            n = len(h.c.replication.topic_by_name(name).parts)
            h.write(h.c.create_partitions(CP.CreatePartitionsRequest(topics=[CP.CreatePartitionsTopic(
                name=name, count=n + rnd.randint(0, 2))])))
        elif op == "alter":
            name = some_topic()
            if name is None:
                continue
            t = h.c.replication.topic_by_name(name)
            pid = rnd.choice(list(t.parts))
            p = t.parts[pid]
            if p.leader == NO_LEADER:
                continue
            others = [r for r in p.replicas if r != p.leader]
            isr = [p.leader] + [r for r in others if rnd.random() < 0.6]
            stale = rnd.random() < 0.1
            h.alter_isr(name, pid, isr, partition_epoch=p.partition_epoch - 1 if stale else None,
                        version=rnd.choice([1, 2, 3]))
        elif op == "elect":
            h.write(h.c.elect_leaders(EL.ElectLeadersRequest(election_type=rnd.choice([0, 0, 1]),
                                                             topic_partitions=None)))
        elif op == "config":
            if rnd.random() < 0.5:
                name = some_topic()
                rtype = TOPIC_RESOURCE
            else:
                name = rnd.choice(["", str(b)])
                rtype = BROKER_RESOURCE
            if name is None:
                continue
            req = IAC.IncrementalAlterConfigsRequest(resources=[IAC.AlterConfigsResource(
                resource_type=rtype, resource_name=name, configs=[IAC.AlterableConfig(
                    name=rnd.choice(["retention.ms", "segment.ms", "cleanup.policy"]),
                    config_operation=rnd.choice([0, 0, 1, 2, 3]), value=rnd.choice(["1", "2", "compact"]))])])
            h.write(h.c.incremental_alter_configs(req))
        elif op == "pids":
            if b in h.epochs:
                h.write(h.c.allocate_producer_ids(AllocateProducerIdsRequest(broker_id=b, broker_epoch=h.epochs[b])))
        elif op == "quota":
            ent = rnd.choice([[("user", "u")], [("client-id", None)], [("user", None), ("client-id", "c")],
                              [("ip", "127.0.0.1")]])
            key = "connection_creation_rate" if ent[0][0] == "ip" else rnd.choice(
                ["producer_byte_rate", "request_percentage"])
            remove = rnd.random() < 0.3
            h.write(h.c.alter_client_quotas(ACQ.AlterClientQuotasRequest(validate_only=False, entries=[
                ACQ.AlterClientQuotasRequestEntryData(
                    entity=[ACQ.AlterClientQuotasRequestEntityData(entity_type=t, entity_name=n) for t, n in ent],
                    ops=[ACQ.OpData(key=key, value=float(rnd.randint(1, 3)), remove=remove)])])))
        elif op == "scram":
            user, mech = rnd.choice(["alice", "bob", ""]), rnd.choice([1, 2, 2, 3])
            if rnd.random() < 0.3:
                req = AUSC.AlterUserScramCredentialsRequest(deletions=[AUSC.ScramCredentialDeletion(
                    name=user, mechanism=mech)], upsertions=[])
            else:
                req = AUSC.AlterUserScramCredentialsRequest(deletions=[], upsertions=[AUSC.ScramCredentialUpsertion(
                    name=user, mechanism=mech, iterations=rnd.choice([4096, 8192, 100]), salt=b"s%d" % i,
                    salted_password=b"p%d" % i)])
            h.write(h.c.alter_user_scram_credentials(req))
        elif op == "unregister":
            r = h.write(h.c.unregister_broker(UnregisterBrokerRequest(broker_id=b)))
            if r.response.error_code == 0:
                h.epochs.pop(b, None)
        elif op == "reassign":
            name = some_topic()
            if name is None:
                continue
            from kbroker.protocol.messages import alter_partition_reassignments as M
            pid = rnd.choice(list(h.c.replication.topic_by_name(name).parts))
            target = None if rnd.random() < 0.2 else rnd.sample(BROKERS, rnd.randint(1, 3))
            h.write(h.c.alter_partition_reassignments(M.AlterPartitionReassignmentsRequest(topics=[
                M.ReassignableTopic(name=name, partitions=[M.ReassignablePartition(partition_index=pid,
                                                                                   replicas=target)])])))
        prev = check_partitions(h.c, prev)
        if (i + 1) % max(1, ops // checks) == 0 or i == ops - 1:
            follower.catch_up(h.log)
            assert follower.image == h.c.image()
            assert follower.roles == follower.expected_roles()
    assert h.c.state() == h.replayed().state()
    return h, stats


@pytest.mark.parametrize("seed", range(8))
def test_replay_invariant_random_workload(seed):
    h, stats = run_workload(seed, 1200)
    # the workload really exercised the interesting paths
    kinds = {type(r.message) for _, r in h.log}
    assert {R.RegisterBrokerRecord, R.BrokerRegistrationChangeRecord, R.TopicRecord, R.PartitionRecord,
            R.PartitionChangeRecord, R.RemoveTopicRecord, R.ConfigRecord, R.ProducerIdsRecord} <= kinds
    changes = [r.message for _, r in h.log if isinstance(r.message, R.PartitionChangeRecord)]
    assert any(m.adding_replicas for m in changes) and any(m.replicas is not None and m.adding_replicas == []
                                                         for m in changes)   # started and completed
    assert len(h.log) > 300


@pytest.mark.parametrize("mv", [IBP_3_3_IV0, IBP_3_3_IV3])
def test_replay_invariant_older_metadata_versions(mv):
    """Older record versions (Fence/UnfenceBrokerRecord, no controlled-shutdown state, no
    log dirs) through the same checks, the log's byte format included."""
    h, _ = run_workload(100 + mv, 800, metadata_version=mv)
    kinds = {type(r.message) for _, r in h.log}
    if mv < 6:
        assert R.FenceBrokerRecord in kinds and R.BrokerRegistrationChangeRecord not in kinds


def replay_mismatch(log, controller: QuorumController) -> str | None:
    """None when replaying ``log`` (into a fresh controller and into a broker image)
    reproduces ``controller``; else what differs."""
    try:
        fresh = QuorumController.from_records(log, controller.config)
        delta = MetadataDelta(MetadataImage())
        for off, r in log:
            delta.replay(r, off)
        image = delta.apply()
    except (MetadataReplayError, ValueError, KeyError, AttributeError) as e:
        return "replay failed: %r" % e
    if fresh.state() != controller.state():
        return "controller state differs"
    if image != controller.image():
        return "broker image differs"
    return None


def test_checker_detects_corrupted_streams():
    h, _ = run_workload(11, 400, checks=1)
    log = list(h.log)
    assert replay_mismatch(log, h.c) is None
    rnd = random.Random(5)
    # the last change of partitions that still exist: a corrupt one must show in the end state
    last_change = {}
    for i, (_, r) in enumerate(log):
        if isinstance(r.message, R.PartitionChangeRecord):
            last_change[(r.message.topic_id, r.message.partition_id)] = i
    pc = sorted(i for (tid, _), i in last_change.items() if tid in h.c.replication.topics)
    assert len(pc) >= 5
    detected = 0
    cases = 0
    for i in rnd.sample(pc, min(10, len(pc))):
        # 1. drop one record (offsets after it shift down by one)
        bad = [(o if j < i else o - 1, r) for j, (o, r) in enumerate(log) if j != i]
        cases += 1
        detected += replay_mismatch(bad, h.c) is not None
        # 2. change the leader it sets
        off, r = log[i]
        m = r.message
        changed = R.PartitionChangeRecord(partition_id=m.partition_id, topic_id=m.topic_id, isr=m.isr,
                                          leader=(m.leader + 1) if m.leader >= 0 else 3, replicas=m.replicas)
        bad = log[:i] + [(off, ApiMessageAndVersion(changed, r.version))] + log[i + 1:]
        cases += 1
        detected += replay_mismatch(bad, h.c) is not None
    # 3. a fence with a wrong broker epoch and 4. an unknown topic are rejected outright
    last = log[-1][0]
    for extra in (R.FenceBrokerRecord(id=1, epoch=10 ** 9), R.PartitionChangeRecord(topic_id=uuid.UUID(int=9),
                                                                                     partition_id=0, leader=1)):
        cases += 1
        detected += replay_mismatch(log + [(last + 1, ApiMessageAndVersion(extra, 0))], h.c) is not None
    assert detected == cases


def test_broker_image_and_snapshot_round_trip():
    h, _ = run_workload(3, 300, checks=1)
    img = h.broker_image()
    # MetadataImage.to_records() rebuilds the same image (a snapshot's content)
    d = MetadataDelta(MetadataImage())
    for i, r in enumerate(img.to_records()):
        d.replay(deserialize(serialize(r)), i)
    assert d.apply().same_state(img)
    assert not img.same_state(MetadataImage())
    assert ZERO_UUID not in img.topics.by_id
