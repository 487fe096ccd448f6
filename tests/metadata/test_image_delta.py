"""MetadataImage / MetadataDelta: Kafka's replay semantics, equality by value, local changes."""
from __future__ import annotations

import uuid

import pytest

from kbroker.metadata import records as R
from kbroker.metadata.delta import MetadataDelta, MetadataReplayError, replay_all
from kbroker.metadata.image import (
    BROKER_RESOURCE, DIR_MIGRATING, TOPIC_RESOURCE, PartitionRegistration,
)
from kbroker.metadata.serde import ApiMessageAndVersion, deserialize, serialize

T1 = uuid.UUID(int=0x1111 << 64)
T2 = uuid.UUID(int=0x2222 << 64)


def reg(bid, epoch, fenced=True):
    return R.RegisterBrokerRecord(broker_id=bid, incarnation_id=uuid.UUID(int=bid), broker_epoch=epoch,
                                  end_points=[R.register_broker_record.BrokerEndpoint(
                                      name="PLAINTEXT", host="h", port=9000 + bid, security_protocol=0)],
                                  rack="r%d" % bid, fenced=fenced)


def part(pid, replicas, leader, topic=T1, isr=None):
    return R.PartitionRecord(partition_id=pid, topic_id=topic, replicas=replicas, isr=isr or replicas, leader=leader,
                             leader_epoch=0, partition_epoch=0)


BASE = [R.FeatureLevelRecord(name="metadata.version", feature_level=21), reg(1, 1), reg(2, 2), reg(3, 3),
        R.TopicRecord(name="a", topic_id=T1), part(0, [1, 2, 3], 1), part(1, [2, 3, 1], 2),
        R.TopicRecord(name="b", topic_id=T2), part(0, [3, 1], 3, topic=T2),
        R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="a", name="retention.ms", value="5"),
        R.ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name="x", value="1")]


def base_image():
    return replay_all(BASE, first_offset=0)


def test_image_contents_and_compatibility_properties():
    img = base_image()
    assert img.offset == len(BASE) - 1
    assert img.features.metadata_version == 21
    assert sorted(img.cluster.brokers) == [1, 2, 3] and img.cluster.brokers[2].rack == "r2"
    assert img.cluster.brokers[1].listener("PLAINTEXT").port == 9001
    a = img.topics.by_name["a"]
    assert a is img.topics.by_id[T1] and a.num_partitions == 2 and not a.is_internal
    assert a.partitions[1] == PartitionRegistration((2, 3, 1), (2, 3, 1), leader=2,
                                                    directories=(DIR_MIGRATING,) * 3)
    assert img.topic_configs("a") == {"retention.ms": "5"}
    assert img.broker_configs == {"": {"x": "1"}}


def test_partition_change_absent_fields_mean_unchanged():
    img = base_image()
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, isr=[1, 2]), 100)
    p = d.apply().topics.by_name["a"].partitions[0]
    assert p.isr == (1, 2) and p.leader == 1 and p.replicas == (1, 2, 3)
    assert p.leader_epoch == 0 and p.partition_epoch == 1            # leader -2: no change
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=1), 100)
    p = d.apply().topics.by_name["a"].partitions[0]
    assert p.leader == 1 and p.leader_epoch == 1                     # set, even to the same: bump
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=-1), 100)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=3, isr=[3],
                                     leader_recovery_state=1), 101)
    p = d.apply().topics.by_name["a"].partitions[0]
    assert (p.leader, p.leader_epoch, p.partition_epoch, p.isr, p.leader_recovery_state) == (3, 2, 2, (3,), 1)
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, replicas=[1, 2], isr=[1, 2]), 100)
    p = d.apply().topics.by_name["a"].partitions[0]
    assert p.replicas == (1, 2) and len(p.directories) == 2


def test_broker_records_check_the_epoch():
    img = base_image()
    d = MetadataDelta(img)
    d.replay(R.UnfenceBrokerRecord(id=1, epoch=1), 50)
    d.replay(R.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, fenced=-1), 51)
    d.replay(R.BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=2, in_controlled_shutdown=1), 52)
    d.replay(R.FenceBrokerRecord(id=1, epoch=1), 53)
    new = d.apply()
    assert new.cluster.brokers[1].fenced
    b2 = new.cluster.brokers[2]
    assert not b2.fenced and b2.in_controlled_shutdown and not b2.is_active
    assert [b.id for b in new.cluster.alive_brokers()] == [2]
    for bad in (R.FenceBrokerRecord(id=1, epoch=7), R.UnfenceBrokerRecord(id=9, epoch=1),
                R.UnregisterBrokerRecord(broker_id=3, broker_epoch=4),
                R.BrokerRegistrationChangeRecord(broker_id=3, broker_epoch=1, fenced=1)):
        with pytest.raises(MetadataReplayError):
            MetadataDelta(img).replay(bad, 60)
    d = MetadataDelta(img)
    d.replay(R.UnregisterBrokerRecord(broker_id=3, broker_epoch=3), 60)
    assert 3 not in d.apply().cluster.brokers


def test_topic_errors_and_removal():
    img = base_image()
    for bad in (R.TopicRecord(name="a", topic_id=uuid.UUID(int=5)), R.TopicRecord(name="z", topic_id=T1),
                R.PartitionRecord(topic_id=uuid.UUID(int=5), partition_id=0),
                R.PartitionChangeRecord(topic_id=T1, partition_id=9, leader=1)):
        with pytest.raises(MetadataReplayError):
            MetadataDelta(img).replay(bad, 60)
    d = MetadataDelta(img)
    d.replay(R.RemoveTopicRecord(topic_id=T1), 60)
    new = d.apply()
    assert "a" not in new.topics.by_name and T1 not in new.topics.by_id
    assert new.topic_configs("a") == {} and new.broker_configs == {"": {"x": "1"}}
    # the name can be reused in the same delta, with fresh configs
    d.replay(R.TopicRecord(name="a", topic_id=uuid.UUID(int=77)), 61)
    d.replay(R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="a", name="segment.ms", value="1"), 62)
    new = d.apply()
    assert new.topics.by_name["a"].topic_id == uuid.UUID(int=77) and new.topic_configs("a") == {"segment.ms": "1"}


def test_configs_delete_and_producer_ids():
    img = base_image()
    d = MetadataDelta(img)
    d.replay(R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="a", name="retention.ms", value=None), 60)
    d.replay(R.ProducerIdsRecord(broker_id=1, broker_epoch=1, next_producer_id=1000), 61)
    new = d.apply()
    assert (TOPIC_RESOURCE, "a") not in new.configs.resources
    assert new.producer_ids.next_producer_id == 1000
    with pytest.raises(MetadataReplayError):
        MetadataDelta(new).replay(R.ProducerIdsRecord(broker_id=1, broker_epoch=1, next_producer_id=0), 62)


def test_equality_by_value_and_sharing():
    a, b = base_image(), base_image()
    assert a == b and a is not b
    d = MetadataDelta(a)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, isr=[1, 3]), 100)
    c = d.apply()
    assert c != a and c.topics.by_id[T2] is a.topics.by_id[T2]      # unchanged topics are shared
    assert c.cluster is a.cluster and c.configs is a.configs
    assert not c.same_state(a)
    assert MetadataDelta(a).apply() == a


def test_offsets_must_increase():
    d = MetadataDelta(base_image())
    with pytest.raises(MetadataReplayError):
        d.replay(R.NoOpRecord(), 3)


def test_local_changes():
    img = base_image()
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=2, isr=[2, 3]), 100)    # 2 leads a-0
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=1, isr=[2, 3]), 101)              # same leader
    d.replay(R.RemoveTopicRecord(topic_id=T2), 102)
    d.replay(R.TopicRecord(name="c", topic_id=uuid.UUID(int=99)), 103)
    d.replay(part(0, [1, 2], 1, topic=uuid.UUID(int=99)), 104)
    lc2 = d.local_changes(2)
    assert set(lc2.leaders) == {("a", 0), ("a", 1)} and set(lc2.elected_leaders) == {("a", 0)}
    assert set(lc2.followers) == {("c", 0)} and not lc2.deletes
    assert lc2.leaders[("a", 0)].partition.leader_epoch == 1 and lc2.topic_ids["a"] == T1
    lc1 = d.local_changes(1)
    assert set(lc1.followers) == {("a", 0), ("a", 1)} and set(lc1.leaders) == {("c", 0)}
    assert lc1.deletes == {("b", 0)}
    lc3 = d.local_changes(3)
    assert lc3.deletes == {("b", 0)} and set(lc3.followers) == {("a", 0), ("a", 1)}
    # a replica moved off a broker is a delete for it
    d = MetadataDelta(img)
    d.replay(R.PartitionChangeRecord(topic_id=T1, partition_id=0, replicas=[1, 2], isr=[1, 2]), 100)
    assert d.local_changes(3).deletes == {("a", 0)}


def test_replay_through_the_log_format_and_snapshot_records():
    recs = [ApiMessageAndVersion(m, 1 if isinstance(m, R.PartitionRecord) else 0) for m in BASE]
    img = replay_all([deserialize(serialize(r)) for r in recs], first_offset=0)
    assert img == base_image()
    again = replay_all([deserialize(serialize(r)) for r in img.to_records()], first_offset=0)
    assert again.same_state(img)
