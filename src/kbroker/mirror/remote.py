"""Application-side helpers (MM2's RemoteClusterUtils / MirrorClient): read the target
cluster's checkpoints to fail a consumer group over.

``translate_offsets(config, "A", "orders-app")`` returns {TopicPartition on the target
(e.g. ``A.orders``-0): OffsetAndMetadata}: the latest checkpoint of each partition, ready
for ``Consumer.commit`` or ``seek`` on the target cluster. ``config`` is a kbroker.client
config for the *target* cluster (bootstrap.servers ...).
"""
from __future__ import annotations

from kbroker.client import Consumer, TopicPartition
from kbroker.client.consumer import OffsetAndMetadata
from kbroker.mirror.formats import Checkpoint, FormatError, Heartbeat
from kbroker.mirror.policy import DefaultReplicationPolicy


def _read_all(config: dict, topic: str, timeout_s: float):
    from kbroker.mirror.checkpoint import read_to_end

    out = []
    c = Consumer({**config, "group.id": None, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        tp = TopicPartition(topic, 0)
        if topic not in c.list_topics(timeout=timeout_s).topics:
            return out
        c.assign([tp])
        read_to_end(c, tp, out.append, timeout_s)
    finally:
        c.close()
    return out


def translate_offsets(config: dict, remote_cluster_alias: str, group_id: str, timeout_s: float = 30.0,
                      policy: DefaultReplicationPolicy | None = None) -> dict:
    """RemoteClusterUtils.translateOffsets: the group's offsets on this (target) cluster,
    from ``<remote_cluster_alias>.checkpoints.internal``."""
    policy = policy or DefaultReplicationPolicy()
    offsets = {}
    for r in _read_all(config, policy.checkpoints_topic(remote_cluster_alias), timeout_s):
        try:
            cp = Checkpoint.deserialize(r.key, r.value)
        except FormatError:
            continue
        if cp.group_id == group_id:
            offsets[cp.topic_partition] = OffsetAndMetadata(cp.downstream_offset, cp.metadata)
    return offsets


def heartbeats(config: dict, timeout_s: float = 30.0, topic: str = "heartbeats") -> list[Heartbeat]:
    """Every Heartbeat record in ``topic`` (``heartbeats`` or a replicated ``A.heartbeats``)."""
    out = []
    for r in _read_all(config, topic, timeout_s):
        try:
            out.append(Heartbeat.deserialize(r.key, r.value))
        except FormatError:
            continue
    return out
