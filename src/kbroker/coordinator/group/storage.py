"""The group coordinator's records in ``__consumer_offsets`` and the log they live in.

Kafka: ``group-coordinator/.../GroupCoordinatorRecordHelpers.java`` (3.9,
``CoordinatorRecordHelpers``) and the older ``core/.../coordinator/group/
GroupMetadataManager.scala`` (``offsetCommitKey``, ``groupMetadataValue``).

Record layout (every record of every batch; both parts big-endian)::

    key   = int16 key_version  | key struct at that version
    value = int16 value_version | value struct at that version   (null = tombstone)

    key_version  record                                   key / value schema
    0, 1         offset commit (0 = pre-0.10 layout)      OffsetCommitKey / OffsetCommitValue
    2            classic group metadata                   GroupMetadataKey / GroupMetadataValue
    3            consumer group epoch (KIP-848)           ConsumerGroupMetadataKey / Value
    4            consumer group subscription metadata     ConsumerGroupPartitionMetadataKey / Value
    5            consumer group member subscription       ConsumerGroupMemberMetadataKey / Value
    6            consumer group target assignment epoch   ConsumerGroupTargetAssignmentMetadataKey / Value
    7            consumer group member target assignment  ConsumerGroupTargetAssignmentMemberKey / Value
    8            consumer group member current assignment ConsumerGroupCurrentMemberAssignmentKey / Value
    9..          share-group records                      (skipped)

The KIP-848 records (key versions 3..8) all have value version 0; they are
built by the ``consumer_group_*`` helpers below as :class:`ParsedRecord` objects
(kind "consumer_group"), which the coordinator both replays into memory and
encodes with :func:`encode_parsed` (what Kafka 3.9's ``GroupCoordinatorRecordHelpers``
writes, byte for byte the same schemas).

We write key version 1 + value version 3 for offsets (value version 1 when the
commit carries an expire timestamp, OffsetCommit v2-v4 ``retention_time_ms``)
and key version 2 + value version 3 for group metadata: what Kafka 3.9
writes with a current metadata.version, so a Kafka tool reading our log
decodes it and vice versa.

:class:`OffsetsLog` is the seam to the broker: appends go to one
``__consumer_offsets`` partition with acks=all and report back through a
callback (possibly later, from another thread); ``read_batches`` replays a
partition at load time. It is the coordinator runtime's :class:`CoordinatorLog`
(:mod:`kbroker.coordinator.runtime`); :class:`InMemoryOffsetsLog` (tests; with
failure and delay injection), :class:`LogOffsetsLog` (a real ``kbroker.log.Log``
per partition) and :class:`ReplicaOffsetsLog` are its implementations under the
names the group coordinator always used.
"""
from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

from kbroker.coordinator.records import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from kbroker.coordinator import runtime as _runtime
from kbroker.coordinator.records.group_metadata import MemberMetadata as MemberMetadataRecord

__all__ = [
    "OFFSETS_TOPIC", "OffsetsLog", "InMemoryOffsetsLog", "LogOffsetsLog", "ParsedRecord",
    "offset_commit_record", "offset_commit_tombstone", "group_metadata_record", "group_tombstone",
    "parse_record", "encode_records", "java_string_hashcode", "partition_for",
    "encode_parsed", "consumer_group_epoch_record", "consumer_group_epoch_tombstone",
    "consumer_group_subscription_metadata_record", "consumer_group_subscription_metadata_tombstone",
    "consumer_group_member_subscription_record", "consumer_group_member_subscription_tombstone",
    "consumer_group_target_assignment_epoch_record", "consumer_group_target_assignment_epoch_tombstone",
    "consumer_group_target_assignment_record", "consumer_group_target_assignment_tombstone",
    "consumer_group_current_assignment_record", "consumer_group_current_assignment_tombstone",
    "CONSUMER_GROUP_KEY_VERSIONS",
]

OFFSETS_TOPIC = "__consumer_offsets"

_S_h = struct.Struct(">h")

OFFSET_COMMIT_KEY_VERSION = 1
OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3


# -- partitioning ---------------------------------------------------------------------

java_string_hashcode = _runtime.java_string_hashcode


def partition_for(group_id: str, num_partitions: int) -> int:
    """``Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`` (abs(MIN_VALUE) = 0)."""
    return _runtime.partition_for(group_id, num_partitions)


# -- records ----------------------------------------------------------------------------

def _versioned(version: int, struct_obj) -> bytes:
    return _S_h.pack(version) + struct_obj.encode(version)


def offset_commit_record(group: str, topic: str, partition: int, committed_offset: int,
                         leader_epoch: int, metadata: str, commit_timestamp_ms: int,
                         expire_timestamp_ms: int = -1) -> tuple[bytes, bytes]:
    key = _versioned(OFFSET_COMMIT_KEY_VERSION, OffsetCommitKey(group=group, topic=topic, partition=partition))
    version = OFFSET_COMMIT_VALUE_VERSION if expire_timestamp_ms < 0 else OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
    value = _versioned(version, OffsetCommitValue(
        offset=committed_offset, leader_epoch=leader_epoch, metadata=metadata,
        commit_timestamp=commit_timestamp_ms, expire_timestamp=expire_timestamp_ms))
    return key, value


def offset_commit_tombstone(group: str, topic: str, partition: int) -> tuple[bytes, None]:
    return _versioned(OFFSET_COMMIT_KEY_VERSION, OffsetCommitKey(group=group, topic=topic, partition=partition)), None


def group_metadata_record(group: str, protocol_type: str, generation: int, protocol: str | None,
                          leader: str | None, current_state_timestamp_ms: int,
                          members: Iterable[MemberMetadataRecord]) -> tuple[bytes, bytes]:
    key = _versioned(GROUP_METADATA_KEY_VERSION, GroupMetadataKey(group=group))
    value = _versioned(GROUP_METADATA_VALUE_VERSION, GroupMetadataValue(
        protocol_type=protocol_type, generation=generation, protocol=protocol, leader=leader,
        current_state_timestamp=current_state_timestamp_ms, members=list(members)))
    return key, value


def group_tombstone(group: str) -> tuple[bytes, None]:
    return _versioned(GROUP_METADATA_KEY_VERSION, GroupMetadataKey(group=group)), None


class ParsedRecord(NamedTuple):
    """One decoded ``__consumer_offsets`` record. ``kind``: "offset", "group", "consumer_group"
    (KIP-848, key versions 3..8; ``key_version`` says which) or "other"."""

    kind: str
    key_version: int
    key: object           # OffsetCommitKey / GroupMetadataKey / None for "other"
    value: object | None  # OffsetCommitValue / GroupMetadataValue; None = tombstone


def parse_record(key: bytes | memoryview | None, value: bytes | memoryview | None) -> ParsedRecord:
    """Decode a record; raises ValueError on a key or value we cannot read."""
    if key is None or len(key) < 2:
        raise ValueError("__consumer_offsets record without a versioned key")
    kv = _S_h.unpack_from(key, 0)[0]
    if kv in (0, 1):
        k = OffsetCommitKey.decode(memoryview(key)[2:], kv)
        v = None
        if value is not None:
            vv = _S_h.unpack_from(value, 0)[0]
            v = OffsetCommitValue.decode(memoryview(value)[2:], vv)
        return ParsedRecord("offset", kv, k, v)
    if kv == 2:
        k = GroupMetadataKey.decode(memoryview(key)[2:], kv)
        v = None
        if value is not None:
            vv = _S_h.unpack_from(value, 0)[0]
            v = GroupMetadataValue.decode(memoryview(value)[2:], vv)
        return ParsedRecord("group", kv, k, v)
    codec = _CONSUMER_GROUP_CODECS.get(kv)
    if codec is not None:
        key_cls, value_cls = codec
        k = key_cls.decode(memoryview(key)[2:], kv)
        v = None
        if value is not None:
            vv = _S_h.unpack_from(value, 0)[0]
            v = value_cls.decode(memoryview(value)[2:], vv)
        return ParsedRecord("consumer_group", kv, k, v)
    return ParsedRecord("other", kv, None, None)


# -- KIP-848 consumer group records (Kafka: GroupCoordinatorRecordHelpers) -------------------

CONSUMER_GROUP_METADATA_KEY_VERSION = 3
CONSUMER_GROUP_PARTITION_METADATA_KEY_VERSION = 4
CONSUMER_GROUP_MEMBER_METADATA_KEY_VERSION = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA_KEY_VERSION = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER_KEY_VERSION = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT_KEY_VERSION = 8
CONSUMER_GROUP_VALUE_VERSION = 0

_CONSUMER_GROUP_CODECS = {
    3: (ConsumerGroupMetadataKey, ConsumerGroupMetadataValue),
    4: (ConsumerGroupPartitionMetadataKey, ConsumerGroupPartitionMetadataValue),
    5: (ConsumerGroupMemberMetadataKey, ConsumerGroupMemberMetadataValue),
    6: (ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupTargetAssignmentMetadataValue),
    7: (ConsumerGroupTargetAssignmentMemberKey, ConsumerGroupTargetAssignmentMemberValue),
    8: (ConsumerGroupCurrentMemberAssignmentKey, ConsumerGroupCurrentMemberAssignmentValue),
}
CONSUMER_GROUP_KEY_VERSIONS = frozenset(_CONSUMER_GROUP_CODECS)


def encode_parsed(rec: "ParsedRecord") -> tuple[bytes, bytes | None]:
    """(key, value) bytes of a KIP-848 record built by the helpers below (value None: tombstone)."""
    key = _versioned(rec.key_version, rec.key)
    return key, (None if rec.value is None else _versioned(CONSUMER_GROUP_VALUE_VERSION, rec.value))


def _cg(kv: int, key, value) -> "ParsedRecord":
    return ParsedRecord("consumer_group", kv, key, value)


def _record_topic_partitions(cls, assignment) -> list:
    """``{topic_id: partitions}`` as a list of ``cls(topic_id, partitions)``, sorted for a stable encoding."""
    return [cls(topic_id=tid, partitions=sorted(parts)) for tid, parts in sorted(assignment.items(), key=lambda kv: str(kv[0]))
            if parts]


def consumer_group_epoch_record(group_id: str, epoch: int) -> "ParsedRecord":
    return _cg(3, ConsumerGroupMetadataKey(group_id=group_id), ConsumerGroupMetadataValue(epoch=epoch))


def consumer_group_epoch_tombstone(group_id: str) -> "ParsedRecord":
    return _cg(3, ConsumerGroupMetadataKey(group_id=group_id), None)


def consumer_group_subscription_metadata_record(group_id: str, topics: Iterable) -> "ParsedRecord":
    """``topics``: objects with ``topic_id``, ``name``, ``num_partitions`` (no rack information: empty lists)."""
    from kbroker.coordinator.records.consumer_group_partition_metadata import TopicMetadata as _TM
    value = ConsumerGroupPartitionMetadataValue(topics=[
        _TM(topic_id=t.topic_id, topic_name=t.name, num_partitions=t.num_partitions, partition_metadata=[])
        for t in sorted(topics, key=lambda t: t.name)])
    return _cg(4, ConsumerGroupPartitionMetadataKey(group_id=group_id), value)


def consumer_group_subscription_metadata_tombstone(group_id: str) -> "ParsedRecord":
    return _cg(4, ConsumerGroupPartitionMetadataKey(group_id=group_id), None)


def consumer_group_member_subscription_record(group_id: str, member) -> "ParsedRecord":
    """``member``: a :class:`kbroker.coordinator.group.consumer_group.ConsumerGroupMember`."""
    value = ConsumerGroupMemberMetadataValue(
        instance_id=member.instance_id, rack_id=member.rack_id, client_id=member.client_id,
        client_host=member.client_host, subscribed_topic_names=list(member.subscribed_topic_names),
        subscribed_topic_regex=member.subscribed_topic_regex, rebalance_timeout_ms=member.rebalance_timeout_ms,
        server_assignor=member.server_assignor, classic_member_metadata=None)
    return _cg(5, ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member.member_id), value)


def consumer_group_member_subscription_tombstone(group_id: str, member_id: str) -> "ParsedRecord":
    return _cg(5, ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id), None)


def consumer_group_target_assignment_epoch_record(group_id: str, assignment_epoch: int) -> "ParsedRecord":
    return _cg(6, ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id),
               ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=assignment_epoch))


def consumer_group_target_assignment_epoch_tombstone(group_id: str) -> "ParsedRecord":
    return _cg(6, ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id), None)


def consumer_group_target_assignment_record(group_id: str, member_id: str, assignment) -> "ParsedRecord":
    from kbroker.coordinator.records.consumer_group_target_assignment_member import TopicPartition as _TP
    return _cg(7, ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id),
               ConsumerGroupTargetAssignmentMemberValue(topic_partitions=_record_topic_partitions(_TP, assignment)))


def consumer_group_target_assignment_tombstone(group_id: str, member_id: str) -> "ParsedRecord":
    return _cg(7, ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id), None)


def consumer_group_current_assignment_record(group_id: str, member) -> "ParsedRecord":
    from kbroker.coordinator.records.consumer_group_current_member_assignment import TopicPartitions as _TPs
    value = ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=member.member_epoch, previous_member_epoch=member.previous_member_epoch,
        state=int(member.state), assigned_partitions=_record_topic_partitions(_TPs, member.assigned_partitions),
        partitions_pending_revocation=_record_topic_partitions(_TPs, member.partitions_pending_revocation))
    return _cg(8, ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member.member_id), value)


def consumer_group_current_assignment_tombstone(group_id: str, member_id: str) -> "ParsedRecord":
    return _cg(8, ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id), None)


encode_records = _runtime.encode_records


# -- the log ------------------------------------------------------------------------------
# The log seam is the coordinator runtime's (kbroker.coordinator.runtime); these are its
# __consumer_offsets names.

AppendCallback = _runtime.AppendCallback
OffsetsLog = _runtime.CoordinatorLog
InMemoryOffsetsLog = _runtime.InMemoryCoordinatorLog
LogOffsetsLog = _runtime.LogCoordinatorLog


class ReplicaOffsetsLog(_runtime.ReplicaCoordinatorLog):
    """The runtime's ReplicaCoordinatorLog over ``__consumer_offsets``."""

    def __init__(self, replica_manager, timeout_ms: int = 5000) -> None:
        super().__init__(replica_manager, OFFSETS_TOPIC, timeout_ms)
