"""CreateTopics, CreatePartitions, DeleteTopics, AlterPartition, ElectLeaders."""
from __future__ import annotations

import collections
import random

import pytest

from kbroker.controller import ApiError
from kbroker.controller.placement import StripedReplicaPlacer, UsableBroker
from kbroker.metadata import records as R
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import create_partitions as CP
from kbroker.protocol.messages import delete_topics as DT
from kbroker.protocol.messages import elect_leaders as EL
from kbroker.protocol.primitives import ZERO_UUID

from tests.controller.harness import Harness


def test_create_topic_records_and_response():
    h = Harness()
    h.start_brokers([1, 2, 3])
    res = h.create_topic("orders", 6, 3, configs={"cleanup.policy": "compact"})
    assert res.error_code == 0 and res.num_partitions == 6 and res.replication_factor == 3
    assert [(c.name, c.value) for c in res.configs] == [("cleanup.policy", "compact")]
    recs = [r.message for off, r in h.log[-8:]]
    assert isinstance(recs[0], R.TopicRecord) and recs[0].topic_id == res.topic_id
    assert isinstance(recs[1], R.ConfigRecord) and recs[1].value == "compact"
    assert all(isinstance(r, R.PartitionRecord) for r in recs[2:])
    for pid in range(6):
        p = h.partition("orders", pid)
        assert len(set(p.replicas)) == 3 and p.isr == p.replicas and p.leader == p.replicas[0]
        assert p.leader_epoch == 0 and p.partition_epoch == 0
    img = h.broker_image()
    assert img.topic_configs("orders") == {"cleanup.policy": "compact"}
    assert img.topics.by_name["orders"].topic_id == res.topic_id


@pytest.mark.parametrize("name,parts,rf,code", [
    ("", 1, 1, E.INVALID_TOPIC_EXCEPTION),
    ("bad name", 1, 1, E.INVALID_TOPIC_EXCEPTION),
    ("..", 1, 1, E.INVALID_TOPIC_EXCEPTION),
    ("x" * 250, 1, 1, E.INVALID_TOPIC_EXCEPTION),
    ("t", 0, 1, E.INVALID_PARTITIONS),
    ("t", -5, 1, E.INVALID_PARTITIONS),
    ("t", 1, 0, E.INVALID_REPLICATION_FACTOR),
    ("t", 1, 4, E.INVALID_REPLICATION_FACTOR),
])
def test_create_topic_errors(name, parts, rf, code):
    h = Harness()
    h.start_brokers([1, 2, 3])
    n = len(h.log)
    assert h.create_topic(name, parts, rf).error_code == code
    assert len(h.log) == n


def test_create_topic_exists_collides_duplicate_validate_only_defaults():
    h = Harness(default_num_partitions=3, default_replication_factor=2)
    h.start_brokers([1, 2])
    assert h.create_topic("a.b", -1, -1).num_partitions == 3
    assert h.partition("a.b", 2) and len(h.partition("a.b").replicas) == 2
    assert h.create_topic("a.b").error_code == E.TOPIC_ALREADY_EXISTS
    assert h.create_topic("a_b").error_code == E.INVALID_TOPIC_EXCEPTION
    n = len(h.log)
    res = h.create_topic("v", 2, 2, validate_only=True)
    assert res.error_code == 0 and len(h.log) == n and h.c.replication.topic_by_name("v") is None
    from kbroker.protocol.messages import create_topics as CT
    t = CT.CreatableTopic(name="d", num_partitions=1, replication_factor=1)
    r = h.write(h.c.create_topics(CT.CreateTopicsRequest(topics=[t, t])))
    assert [x.error_code for x in r.response.topics] == [E.INVALID_REQUEST] * 2


def test_all_fenced_and_manual_assignment_errors():
    h = Harness()
    h.register(1)
    assert h.create_topic("t", 1, 1).error_code == E.INVALID_REPLICATION_FACTOR       # all fenced
    h.heartbeat(1)
    h.register(2)          # registered, fenced
    assert h.create_topic("m", assignments=[[2]]).error_code == E.INVALID_REPLICATION_FACTOR
    assert h.create_topic("m", assignments=[[1, 1]]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert h.create_topic("m", assignments=[[9]]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert h.create_topic("m", assignments=[[]]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    res = h.create_topic("m", assignments=[[2, 1]])       # fenced replica: not in the ISR
    assert res.error_code == 0
    assert h.partition("m").isr == (1,) and h.partition("m").leader == 1


def test_config_validator_hook_rejects():
    def validator(rtype, name, configs):
        if "bad" in configs:
            raise ApiError(E.INVALID_CONFIG, "no bad")
    h = Harness(config_validator=validator)
    h.start_brokers([1])
    res = h.create_topic("t", 1, 1, configs={"bad": "1"})
    assert res.error_code == E.INVALID_CONFIG and res.error_message == "no bad"


def _placement_ok(assignments, brokers, rf):
    racks = {b.id: b.rack for b in brokers}
    nracks = len(set(racks.values()))
    for replicas in assignments:
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert all(r in racks for r in replicas)
        assert len({racks[r] for r in replicas}) == min(rf, nracks)
    unfenced = [b.id for b in brokers if not b.fenced]
    if nracks <= 1:     # one rack: leaders go round-robin over the brokers
        leaders = collections.Counter(a[0] for a in assignments)
        counts = [leaders.get(b, 0) for b in unfenced]
    else:               # racks: leaders go round-robin over the racks
        leaders = collections.Counter(racks[a[0]] for a in assignments)
        counts = [leaders.get(r, 0) for r in set(racks.values())]
    assert max(counts) - min(counts) <= 1, leaders
    assert all(a[0] in unfenced for a in assignments)


@pytest.mark.parametrize("seed", range(20))
def test_striped_placement_properties(seed):
    rnd = random.Random(seed)
    nracks = rnd.choice([0, 1, 2, 3])
    # racks of equal size: Kafka's placer spreads leaders evenly over racks, then over a
    # rack's brokers, so brokers get equal shares only when the racks are balanced
    nb = rnd.randint(1, 3) * max(nracks, 1) if nracks else rnd.randint(1, 9)
    brokers = [UsableBroker(i, ("r%d" % (i % nracks)) if nracks else None, False) for i in range(nb)]
    rf = rnd.randint(1, nb)
    parts = rnd.randint(1, 40)
    # leaders spread within ±1 for any number of partitions that is a multiple of the broker count
    parts -= parts % nb
    parts = parts or nb
    a = StripedReplicaPlacer(random.Random(seed)).place(parts, rf, brokers)
    _placement_ok(a, brokers, rf)


def test_placement_rack_aware_and_fenced_brokers_only_as_followers():
    brokers = [UsableBroker(i, "r%d" % (i % 3), i == 5) for i in range(6)]
    a = StripedReplicaPlacer(random.Random(3)).place(50, 3, brokers)
    for replicas in a:
        assert len({i % 3 for i in replicas}) == 3 and replicas[0] != 5
    with pytest.raises(ApiError) as ei:
        StripedReplicaPlacer().place(1, 1, [UsableBroker(1, None, True)])
    assert ei.value.code == E.INVALID_REPLICATION_FACTOR


def test_create_partitions():
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 2, 2)

    def grow(count, assignments=None, name="t"):
        req = CP.CreatePartitionsRequest(topics=[CP.CreatePartitionsTopic(
            name=name, count=count, assignments=None if assignments is None else
            [CP.CreatePartitionsAssignment(broker_ids=a) for a in assignments])])
        return h.write(h.c.create_partitions(req)).response.results[0]
    assert grow(5).error_code == 0 and len(h.c.replication.topic_by_name("t").parts) == 5
    assert all(len(h.partition("t", p).replicas) == 2 for p in range(5))
    assert grow(5).error_code == E.INVALID_PARTITIONS
    assert grow(3).error_code == E.INVALID_PARTITIONS
    assert grow(6, [[1, 2], [2, 3]]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert grow(6, [[1]]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert grow(6, [[3, 1]]).error_code == 0 and h.partition("t", 5).replicas == (3, 1)
    assert grow(2, name="nope").error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert h.broker_image().topics.by_name["t"].num_partitions == 6


def test_delete_topics_by_name_and_id():
    h = Harness()
    h.start_brokers([1])
    a = h.create_topic("a", 1, 1, configs={"retention.ms": "1"})
    b = h.create_topic("b", 1, 1)
    req = DT.DeleteTopicsRequest(topics=[DT.DeleteTopicState(name="a", topic_id=ZERO_UUID),
                                         DT.DeleteTopicState(name=None, topic_id=b.topic_id),
                                         DT.DeleteTopicState(name="zz", topic_id=ZERO_UUID),
                                         DT.DeleteTopicState(name=None, topic_id=a.topic_id)])
    r = h.write(h.c.delete_topics(req))
    out = r.response.responses
    assert [o.error_code for o in out] == [0, 0, E.UNKNOWN_TOPIC_OR_PARTITION, E.INVALID_REQUEST]
    assert out[1].name == "b" and out[0].topic_id == a.topic_id
    assert [type(x.message) for x in r.records] == [R.RemoveTopicRecord] * 2
    import uuid
    r = h.write(h.c.delete_topics(DT.DeleteTopicsRequest(topics=[DT.DeleteTopicState(name=None,
                                                                                     topic_id=uuid.UUID(int=77))])))
    assert r.response.responses[0].error_code == E.UNKNOWN_TOPIC_ID
    img = h.broker_image()
    assert not img.topics.by_name and img.topic_configs("a") == {}
    r = h.write(h.c.delete_topics(DT.DeleteTopicsRequest(topic_names=["a"])))
    assert r.response.responses[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert h.create_topic("a", 1, 1).error_code == 0        # the name is free again


def test_alter_partition_shrink_expand_and_errors():
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 1, 3, assignments=[[1, 2, 3]])
    p0 = h.partition("t")
    resp = h.alter_isr("t", 0, [1, 2])
    d = resp.topics[0].partitions[0]
    assert resp.error_code == 0 and d.error_code == 0 and d.isr == [1, 2]
    p1 = h.partition("t")
    assert p1.partition_epoch == p0.partition_epoch + 1 and p1.leader_epoch == p0.leader_epoch
    assert d.partition_epoch == p1.partition_epoch
    # stale partition epoch
    assert h.alter_isr("t", 0, [1, 2, 3], partition_epoch=p0.partition_epoch).topics[0].partitions[0].error_code \
        == E.INVALID_UPDATE_VERSION
    # not the leader
    assert h.alter_isr("t", 0, [1, 2, 3], broker=2).topics[0].partitions[0].error_code == E.INVALID_REQUEST
    # ISR without the leader / outside the replicas
    assert h.alter_isr("t", 0, [2]).topics[0].partitions[0].error_code == E.INVALID_REQUEST
    assert h.alter_isr("t", 0, [1, 7]).topics[0].partitions[0].error_code == E.INVALID_REQUEST
    # wrong broker epoch of the leader
    assert h.alter_isr("t", 0, [1], broker_epoch=12345).error_code == E.STALE_BROKER_EPOCH
    # a fenced broker may not join: INELIGIBLE_REPLICA (v2+), OPERATION_NOT_ATTEMPTED (v0-1)
    h.now = 5000
    h.heartbeat(1)
    h.heartbeat(2)
    h.now = 9000
    h.write(h.c.fence_stale_brokers(h.now))
    assert h.c.cluster.registration(3).fenced
    assert h.alter_isr("t", 0, [1, 2, 3]).topics[0].partitions[0].error_code == E.INELIGIBLE_REPLICA
    assert h.alter_isr("t", 0, [1, 2, 3], version=1).topics[0].partitions[0].error_code == E.OPERATION_NOT_ATTEMPTED
    # broker epoch mismatch of an ISR member
    assert h.alter_isr("t", 0, [1, 2], isr_epochs={2: 1}).topics[0].partitions[0].error_code == E.INELIGIBLE_REPLICA
    # fenced leader epoch
    h.write(h.c.elect_leaders(EL.ElectLeadersRequest(election_type=0, topic_partitions=None)))
    p = h.partition("t")
    assert h.alter_isr("t", 0, [1, 2], leader_epoch=p.leader_epoch - 1).topics[0].partitions[0].error_code \
        == E.FENCED_LEADER_EPOCH
    assert h.alter_isr("t", 0, [1, 2], leader_epoch=p.leader_epoch + 1).topics[0].partitions[0].error_code \
        == E.NOT_CONTROLLER
    assert h.c.state() == h.replayed().state() and h.broker_image() == h.c.image()


def test_alter_partition_whose_leader_cannot_stay_gets_new_leader_elected():
    """A leader that sends an ISR while itself in controlled shutdown: the change elects
    another leader, and the sender hears NEW_LEADER_ELECTED."""
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    # mark 1 as shutting down without moving its leadership (as if the leader moves were pending)
    from dataclasses import replace
    reg = h.c.cluster.brokers[1]
    h.c.cluster.brokers[1] = replace(reg, in_controlled_shutdown=True)
    from kbroker.controller.partition_change import PartitionChangeBuilder
    b = PartitionChangeBuilder(h.partition("t"), h.c.replication.topic_by_name("t").id, 0, h.c.cluster.is_active)
    rec = b.set_target_isr([1, 2]).build()
    assert rec.message.leader == 2
    h.c.cluster.brokers[1] = reg


def test_alter_partition_unknown_topic():
    h = Harness()
    h.start_brokers([1])
    h.create_topic("t", 1, 1)
    import uuid
    from kbroker.protocol.messages import alter_partition as AP
    req = AP.AlterPartitionRequest(broker_id=1, broker_epoch=h.epochs[1], topics=[AP.AlterPartitionRequestTopicData(
        topic_id=uuid.UUID(int=5), partitions=[AP.AlterPartitionRequestPartitionData(partition_index=0)])])
    assert h.write(h.c.alter_partition(req)).response.topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_ID
    assert h.alter_isr("t", 0, [1]).topics[0].partitions[0].error_code == 0


def test_elect_leaders_preferred_and_unclean():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    h.create_topic("u", 1, 2, assignments=[[2, 1]])

    def elect(etype, tps):
        req = EL.ElectLeadersRequest(election_type=etype, topic_partitions=None if tps is None else
                                     [EL.TopicPartitions(topic=t, partitions=ps) for t, ps in tps.items()])
        return h.write(h.c.elect_leaders(req)).response
    r = elect(0, {"t": [0], "nope": [0]})
    assert {x.topic: x.partition_result[0].error_code for x in r.replica_election_results} == \
        {"t": E.ELECTION_NOT_NEEDED, "nope": E.UNKNOWN_TOPIC_OR_PARTITION}
    # fence 1: t's leader moves to 2; a preferred election cannot bring it back while 1 is fenced
    h.now = 5000
    h.heartbeat(2)
    h.now = 9000
    h.write(h.c.fence_stale_brokers(h.now))
    assert h.partition("t").leader == 2
    assert elect(0, {"t": [0]}).replica_election_results[0].partition_result[0].error_code \
        == E.PREFERRED_LEADER_NOT_AVAILABLE
    h.heartbeat(1)
    h.alter_isr("t", 0, [2, 1])
    ep = h.partition("t").leader_epoch
    r = elect(0, None)
    assert [(x.topic, x.partition_result[0].error_code) for x in r.replica_election_results] == [("t", 0)]
    assert h.partition("t").leader == 1 and h.partition("t").leader_epoch == ep + 1
    # unclean: a partition whose only ISR member is fenced
    h.create_topic("x", 1, 2, assignments=[[2, 1]])
    h.alter_isr("x", 0, [2])
    h.now = 14000
    h.heartbeat(1)
    h.now = 18001
    h.write(h.c.fence_stale_brokers(h.now))
    assert h.partition("x").leader == -1 and h.partition("x").isr == (2,)
    assert elect(0, {"x": [0]}).replica_election_results[0].partition_result[0].error_code \
        == E.PREFERRED_LEADER_NOT_AVAILABLE
    assert elect(1, {"t": [0]}).replica_election_results[0].partition_result[0].error_code == E.ELECTION_NOT_NEEDED
    assert elect(1, {"x": [0]}).replica_election_results[0].partition_result[0].error_code == 0
    x = h.partition("x")
    assert x.leader == 1 and x.isr == (1,) and x.leader_recovery_state == 1
    assert h.c.state() == h.replayed().state() and h.broker_image() == h.c.image()


def test_unclean_leader_election_topic_config_elects_an_out_of_sync_replica_on_fencing():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("clean", 1, 2, assignments=[[1, 2]])
    h.create_topic("dirty", 1, 2, assignments=[[1, 2]], configs={"unclean.leader.election.enable": "true"})
    h.alter_isr("clean", 0, [1])
    h.alter_isr("dirty", 0, [1])
    h.now = 5000
    h.heartbeat(2)
    h.now = 9000
    h.write(h.c.fence_stale_brokers(h.now))      # broker 1, the only ISR member, is fenced
    assert h.partition("clean").leader == -1
    d = h.partition("dirty")
    assert d.leader == 2 and d.isr == (2,) and d.leader_recovery_state == 1
    assert h.c.state() == h.replayed().state() and h.broker_image() == h.c.image()


def _reassign(h, topic, pid, replicas):
    from kbroker.protocol.messages import alter_partition_reassignments as M
    req = M.AlterPartitionReassignmentsRequest(topics=[M.ReassignableTopic(name=topic, partitions=[
        M.ReassignablePartition(partition_index=pid, replicas=replicas)])])
    return h.write(h.c.alter_partition_reassignments(req)).response.responses[0].partitions[0]


def _list(h, topics=None):
    from kbroker.protocol.messages import list_partition_reassignments as M
    req = M.ListPartitionReassignmentsRequest(topics=None if topics is None else [
        M.ListPartitionReassignmentsTopics(name=t, partition_indexes=ps) for t, ps in topics.items()])
    return h.c.list_partition_reassignments(req).topics


def test_reassignment_runs_until_the_isr_holds_the_target_then_completes():
    h = Harness()
    h.start_brokers([1, 2, 3, 4])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    ep = h.partition("t").leader_epoch
    assert _reassign(h, "t", 0, [3, 4]).error_code == 0
    p = h.partition("t")
    assert p.replicas == (3, 4, 1, 2) and p.adding_replicas == (3, 4) and p.removing_replicas == (1, 2)
    assert p.leader == 1 and p.leader_epoch == ep         # nothing removed yet
    [ongoing] = _list(h)
    assert ongoing.name == "t" and ongoing.partitions[0].adding_replicas == [3, 4]
    assert _list(h, {"t": [1]}) == [] and _list(h, {"nope": [0]}) == []
    # the leader lets 3 catch up: still reassigning
    r = h.alter_isr("t", 0, [1, 2, 3])
    assert r.topics[0].partitions[0].error_code == 0 and h.partition("t").is_reassigning
    # and 4: complete — replicas become the target, the leader (removed) moves, epoch bumps
    r = h.alter_isr("t", 0, [1, 2, 3, 4])
    assert r.topics[0].partitions[0].error_code == E.NEW_LEADER_ELECTED
    p = h.partition("t")
    assert p.replicas == (3, 4) and p.isr == (3, 4) and p.leader == 3 and not p.is_reassigning
    assert p.leader_epoch == ep + 1 and len(p.directories) == 2
    assert _list(h) == []
    img = h.broker_image()
    assert img == h.c.image() and h.c.state() == h.replayed().state()


def test_reassignment_cancel_and_errors():
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    assert _reassign(h, "t", 0, None).error_code == E.NO_REASSIGNMENT_IN_PROGRESS
    assert _reassign(h, "t", 0, [1, 9]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert _reassign(h, "t", 0, [1, 1]).error_code == E.INVALID_REPLICA_ASSIGNMENT
    assert _reassign(h, "t", 5, [1]).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert _reassign(h, "x", 0, [1]).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert _reassign(h, "t", 0, [1, 3]).error_code == 0
    assert h.partition("t").replicas == (1, 3, 2)
    assert _reassign(h, "t", 0, None).error_code == 0
    p = h.partition("t")
    assert p.replicas == (1, 2) and not p.is_reassigning and p.isr == (1, 2)
    # shrinking the replica set completes at once when the ISR already holds the target
    assert _reassign(h, "t", 0, [2]).error_code == 0
    p = h.partition("t")
    assert p.replicas == (2,) and p.isr == (2,) and p.leader == 2
    assert h.c.state() == h.replayed().state() and h.broker_image() == h.c.image()
