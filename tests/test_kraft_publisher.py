"""The KRaft broker's metadata view and publisher, without processes: a metadata image's
local changes make the ReplicaManager lead, follow or drop partitions in Kafka's order,
with leader epochs, replicas and ISR from the registrations; handlers' view answers
leaders, offline replicas, alive brokers and configs from the image."""
from __future__ import annotations

import os
import types
import uuid

import pytest

from kbroker.log.manager import LogManager
from kbroker.metadata import records as R
from kbroker.metadata.delta import MetadataDelta, replay_all
from kbroker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE
from kbroker.protocol import ErrorCode
from kbroker.server.kraft_publisher import BrokerMetadataPublisher
from kbroker.server.metadata_cache import KRaftMetadataCache
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_manager import ReplicaManager

T1 = uuid.UUID(int=0x1111 << 64)
T2 = uuid.UUID(int=0x2222 << 64)
ME = 1


def reg(bid, epoch, fenced=False):
    return R.RegisterBrokerRecord(broker_id=bid, incarnation_id=uuid.UUID(int=bid), broker_epoch=epoch,
                                  end_points=[R.register_broker_record.BrokerEndpoint(
                                      name="PLAINTEXT", host="h%d" % bid, port=9000 + bid, security_protocol=0)],
                                  rack="r%d" % bid, fenced=fenced)


def part(pid, replicas, leader, topic=T1, isr=None, leader_epoch=0):
    return R.PartitionRecord(partition_id=pid, topic_id=topic, replicas=replicas, isr=isr or replicas, leader=leader,
                             leader_epoch=leader_epoch, partition_epoch=0)


BASE = [R.FeatureLevelRecord(name="metadata.version", feature_level=21), reg(1, 1), reg(2, 2), reg(3, 3, fenced=True),
        R.TopicRecord(name="a", topic_id=T1), part(0, [1], 1, leader_epoch=4), part(1, [2, 1], 2), part(2, [2], 2),
        part(3, [1, 3], 1, isr=[1, 3]),
        R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="a", name="retention.ms", value="5000"),
        R.ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name="log.retention.ms", value="7000")]


class Node:
    """Just what the publisher and the view need of a KRaftBroker."""

    def __init__(self, tmp_path):
        self.node_id = ME
        self.image = replay_all(BASE, first_offset=0)
        self.metadata_cache = KRaftMetadataCache(lambda: self.image)
        self.log_manager = LogManager([str(tmp_path)], background=False,
                                      topic_overrides=lambda t: dict(self.image.topic_configs(t)))
        self.produce = DelayedOperationPurgatory("Produce")
        self.fetch = DelayedOperationPurgatory("Fetch")
        self.replica_manager = ReplicaManager(None, self.log_manager, ME, self.produce, self.fetch)
        self.replica_manager.metadata_cache = self.metadata_cache
        self.reloads = 0
        self.dynamic_config = types.SimpleNamespace(reload=lambda lm: setattr(self, "reloads", self.reloads + 1))
        self.loaded, self.unloaded = [], []
        self.group_coordinator = types.SimpleNamespace(
            startup=lambda ps, background, enable_retention: self.loaded.extend(ps),
            unload_partition=self.unloaded.append)
        self.deleted_topics = []
        self.topic_deletion_hooks = [self.deleted_topics.append]
        self.publisher = BrokerMetadataPublisher(self)

    def publish(self, *records):
        delta = MetadataDelta(self.image)
        for r in records:
            delta.replay(r)
        self.image = delta.apply()
        self.publisher.publish(delta, self.image)

    def close(self):
        self.produce.shutdown()
        self.fetch.shutdown()
        self.log_manager.shutdown()


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


def test_first_publish_leads_and_follows_what_the_image_places_here(node):
    node.publisher.publish(None, node.image)
    rm = node.replica_manager
    assert sorted(rm.partitions) == [("a", 0), ("a", 1), ("a", 3)]      # a-2 is broker 2's alone
    p0, p1, p3 = rm.get_partition(("a", 0)), rm.get_partition(("a", 1)), rm.get_partition(("a", 3))
    assert p0.is_leader and p0.leader_epoch == 4 and p0.replicas == (1,) and p0.isr == {1}
    assert not p1.is_leader and p1.leader == 2 and p1.replicas == (2, 1)
    assert p3.is_leader and p3.isr == {1, 3}
    assert p0.log.config.retention_ms == 5000                             # the topic's override from the image
    assert node.reloads == 1                                              # the cluster-default broker config
    assert rm.partition_error(("a", 0)) == ErrorCode.NONE
    assert rm.partition_error(("a", 1)) == ErrorCode.NOT_LEADER_OR_FOLLOWER   # a follower here
    assert rm.partition_error(("a", 2)) == ErrorCode.NOT_LEADER_OR_FOLLOWER   # led elsewhere
    assert rm.partition_error(("nope", 0)) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_produce_to_a_follower_is_refused_and_high_watermark_waits_for_unknown_followers(node):
    from kbroker.kernels import records as rec

    node.publisher.publish(None, node.image)
    rm = node.replica_manager
    out = {}
    batch = rec.encode_batch([(0, b"k", b"v", [])])
    rm.append_records(1000, 1, {("a", 0): bytearray(batch), ("a", 1): bytearray(batch), ("a", 3): bytearray(batch)},
                      out.update, produce_version=9)
    assert out[("a", 0)].error == ErrorCode.NONE
    assert out[("a", 1)].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert out[("a", 3)].error == ErrorCode.NONE
    assert rm.get_partition(("a", 0)).log.high_watermark == 1             # ISR = {me}
    assert rm.get_partition(("a", 3)).log.high_watermark == 0             # follower 3 never fetched


def test_leadership_changes_and_deletes_follow_the_deltas(node):
    node.publisher.publish(None, node.image)
    rm = node.replica_manager
    # broker 2 fenced: a-1 moves to me (epoch + 1); a-0 moves away from me
    node.publish(R.PartitionChangeRecord(topic_id=T1, partition_id=1, leader=1, isr=[1]),
                 R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=2, replicas=[1, 2], isr=[1, 2]))
    p1, p0 = rm.get_partition(("a", 1)), rm.get_partition(("a", 0))
    assert p1.is_leader and p1.leader_epoch == 1 and p1.isr == {1}
    assert not p0.is_leader and p0.leader == 2 and p0.leader_epoch == 5
    # __consumer_offsets: loaded when led here, unloaded when not
    node.publish(R.TopicRecord(name="__consumer_offsets", topic_id=T2), part(0, [1], 1, topic=T2),
                 part(1, [2], 2, topic=T2))
    assert node.loaded == [0]
    node.publish(R.PartitionChangeRecord(topic_id=T2, partition_id=0, leader=-1))
    assert node.unloaded == [0]
    # a removed topic: replicas stopped, logs deleted, deletion hooks run
    log_dir = rm.get_partition(("a", 1)).log.dir
    node.publish(R.RemoveTopicRecord(topic_id=T1))
    assert not any(tp[0] == "a" for tp in rm.partitions)
    assert ("a", 1) not in node.log_manager.logs
    assert not os.path.exists(log_dir)
    assert node.deleted_topics == ["a"]


def test_kraft_metadata_cache_answers_from_the_image(node):
    view = node.metadata_cache
    t = view.image.topics["a"]
    assert (t.topic_id, t.num_partitions, dict(t.configs)) == (T1, 4, {"retention.ms": "5000"})
    assert view.image.topics_by_id[T1] is t
    assert dict(view.image.broker_configs[""]) == {"log.retention.ms": "7000"}
    assert view.alive_brokers("PLAINTEXT") == [(1, "h1", 9001, "r1"), (2, "h2", 9002, "r2")]
    assert view.alive_brokers("OTHER") == []
    assert view.endpoint(2, "PLAINTEXT") == ("h2", 9002) and view.endpoint(3, "PLAINTEXT") is None
    assert view.leader_of("a", 0) == (1, 4) and view.leader_of("a", 9) is None
    states = view.partition_states(t)
    md = view.partition_metadata(t, states)
    assert [(p.leader_id, p.leader_epoch, p.offline_replicas) for p in md] == [
        (1, 4, []), (2, 0, []), (2, 0, []), (1, 0, [3])]
    before = view.image
    node.image = replay_all([R.ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="1", name="x", value="1")],
                            node.image, first_offset=node.image.offset + 1)
    assert view.image is not before and view.image.topics["a"] is t       # unchanged topics keep their object
    assert view.states_token(t) is node.image.topics.by_id[T1]
    node.image = replay_all([R.PartitionChangeRecord(topic_id=T1, partition_id=0, leader=-1)],
                            node.image, first_offset=node.image.offset + 1)
    md = view.partition_metadata(t, view.partition_states(t))
    assert (md[0].error_code, md[0].leader_id, md[0].leader_epoch) == (ErrorCode.LEADER_NOT_AVAILABLE, -1, 5)


def test_log_manager_leaves_the_metadata_log_to_the_raft_manager(tmp_path):
    """metadata.log.dir defaults to the first log dir: the broker's LogManager must not open
    ``__cluster_metadata-0`` (Kafka's loadLogs skips it), or it recovers and checkpoints a
    log the raft manager owns."""
    lm = LogManager([str(tmp_path)], background=False)
    lm.startup()
    lm.get_or_create_log(("__cluster_metadata", 0))
    lm.get_or_create_log(("t", 0))
    lm.shutdown()
    again = LogManager([str(tmp_path)], background=False)
    again.startup()
    try:
        assert sorted(again.logs) == [("t", 0)]
    finally:
        again.shutdown()


def test_first_publish_deletes_stray_logs(node):
    """A topic deleted (and re-created under the same name) while this broker was down, or a
    replica moved away: its old log must not be served as the new one's data."""
    lm = node.log_manager
    stale = lm.get_or_create_log(("a", 0), topic_id=uuid.UUID(int=99))   # "a" re-created since: T1 now
    gone = lm.get_or_create_log(("gone", 0), topic_id=uuid.UUID(int=98))
    moved = lm.get_or_create_log(("a", 2), topic_id=T1)                  # a-2 lives on broker 2 only
    kept = lm.get_or_create_log(("a", 1), topic_id=T1)
    node.publisher.publish(None, node.image)
    logs = lm.logs
    assert ("gone", 0) not in logs and ("a", 2) not in logs
    assert logs[("a", 1)] is kept
    assert logs[("a", 0)] is not stale and logs[("a", 0)].topic_id == T1
    assert node.replica_manager.get_partition(("a", 0)).log is logs[("a", 0)]
    assert not os.path.exists(gone.dir) or gone.dir.endswith("-delete")
    assert moved.dir.endswith("-delete") or not os.path.exists(moved.dir)


def test_a_log_without_topic_id_is_kept_and_adopts_the_image_id(node, tmp_path):
    """partition.metadata of a new log is not fsynced: a log whose id cannot be read is not
    proof of an empty one, so it is kept (Kafka would delete it) and takes the image's id."""
    lm = node.log_manager
    lg = lm.get_or_create_log(("a", 1))
    orphan = lm.get_or_create_log(("x", 0))
    assert lg.topic_id is None
    node.publisher.publish(None, node.image)
    assert lm.logs[("a", 1)] is lg and lg.topic_id == T1
    assert lm.logs[("x", 0)] is orphan


def test_no_stray_deletion_when_the_image_skipped_a_snapshot(node):
    """A broker that could not load a metadata snapshot has an image missing whatever the
    snapshot holds: a log of a topic absent from it is not proof of a deleted topic."""
    lm = node.log_manager
    kept = lm.get_or_create_log(("older", 0), topic_id=uuid.UUID(int=97))
    node.metadata_listener = types.SimpleNamespace(incomplete=True)
    node.publisher.publish(None, node.image)
    assert lm.logs[("older", 0)] is kept


def test_scram_credentials_published_to_what_the_sasl_servers_read(node):
    """Kafka's ScramPublisher: the first publish and each delta that changes SCRAM credentials
    replace the image the broker's SASL servers read."""
    from kbroker.security import scram
    from kbroker.security.credentials import PublishedScramCredentials

    c = scram.make_credential("SCRAM-SHA-512", "alice-secret", 4096, b"salt")
    rec = R.UserScramCredentialRecord(name="alice", mechanism=2, salt=c.salt, stored_key=c.stored_key,
                                      server_key=c.server_key, iterations=4096)
    node.image = replay_all(BASE + [rec], first_offset=0)
    node.scram_credentials = src = PublishedScramCredentials()
    node.publisher = BrokerMetadataPublisher(node)
    node.publisher.publish(None, node.image)
    assert src.scram_credential("alice", "SCRAM-SHA-512") == c
    assert src.scram_credential("alice", "SCRAM-SHA-256") is None
    node.publish(R.UserScramCredentialRecord(name="bob", mechanism=1, salt=c.salt, stored_key=c.stored_key,
                                             server_key=c.server_key, iterations=8192))
    assert src.scram_credential("bob", "SCRAM-SHA-256").iterations == 8192
    node.publish(R.RemoveUserScramCredentialRecord(name="alice", mechanism=2))
    assert src.scram_credential("alice", "SCRAM-SHA-512") is None
    assert set(src.scram_credentials()) == {"bob"}
