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
partition at load time. :class:`InMemoryOffsetsLog` (tests; with failure and
delay injection) and :class:`LogOffsetsLog` (a real ``kbroker.log.Log`` per
partition) implement it.
"""
from __future__ import annotations

import struct
import threading
from typing import Callable, Iterable, Iterator, NamedTuple, Protocol

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
from kbroker.coordinator.records.group_metadata import MemberMetadata as MemberMetadataRecord
from kbroker.kernels import records as _records
from kbroker.protocol import ErrorCode

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

def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, int32 wrap-around)."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """``Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`` (abs(MIN_VALUE) = 0)."""
    h = java_string_hashcode(group_id)
    return (0 if h == -0x80000000 else abs(h)) % num_partitions


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


def encode_records(kvs: Iterable[tuple[bytes, bytes | None]], timestamp_ms: int) -> bytes:
    """One uncompressed v2 batch (base offset 0; the log assigns offsets)."""
    return _records.encode_batch([(timestamp_ms, k, v, ()) for k, v in kvs])


# -- the log ------------------------------------------------------------------------------

AppendCallback = Callable[[int, int], None]  # (error_code, base_offset)


class OffsetsLog(Protocol):
    """What the coordinator needs from the broker's ``__consumer_offsets`` partitions.

    ``append``: append ``batch`` (one v2 batch, offsets unassigned) to the
    partition with acks=all semantics and call ``callback(error_code,
    base_offset)`` exactly once when it is durable (or failed; base_offset
    -1), possibly before returning, possibly later on another thread.
    ``read_batches``: the partition's batches from its log start to its end,
    decoded (objects iterable over records with ``offset``/``key``/``value``).
    """

    def append(self, partition: int, batch: bytes, callback: AppendCallback) -> None: ...

    def read_batches(self, partition: int) -> Iterable: ...


class InMemoryOffsetsLog:
    """An :class:`OffsetsLog` in memory, for tests.

    Thread-safe (one lock). ``fail_appends(code, n)`` makes the next ``n``
    appends fail with ``code``; ``hold_callbacks(True)`` queues callbacks
    until ``release_callbacks()`` (an acks=all append still in flight).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, list[bytes]] = {}
        self._next_offset: dict[int, int] = {}
        self._fail: list[int] = []
        self._hold = False
        self._held: list[tuple[AppendCallback, int, int]] = []
        self.appends = 0

    def fail_appends(self, error_code: int, n: int = 1) -> None:
        with self._lock:
            self._fail.extend([int(error_code)] * n)

    def hold_callbacks(self, hold: bool = True) -> None:
        with self._lock:
            self._hold = hold

    def release_callbacks(self) -> int:
        with self._lock:
            held, self._held = self._held, []
        for cb, err, off in held:
            cb(err, off)
        return len(held)

    def append(self, partition: int, batch: bytes, callback: AppendCallback) -> None:
        with self._lock:
            self.appends += 1
            if self._fail:
                err, off = self._fail.pop(0), -1
            else:
                base = self._next_offset.get(partition, 0)
                buf = bytearray(batch)
                _records.set_base_offset(buf, 0, base)
                decoded = _records.decode_batches(buf)
                self._next_offset[partition] = decoded[-1].next_offset
                self._batches.setdefault(partition, []).append(bytes(buf))
                err, off = int(ErrorCode.NONE), base
            if self._hold:
                self._held.append((callback, err, off))
                return
        callback(err, off)

    def read_batches(self, partition: int) -> Iterator:
        with self._lock:
            raw = list(self._batches.get(partition, ()))
        for buf in raw:
            yield from _records.decode_batches(buf)

    def partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._batches)

    def record_count(self, partition: int) -> int:
        return sum(len(b) for b in self.read_batches(partition))


class LogOffsetsLog:
    """An :class:`OffsetsLog` over real ``kbroker.log.Log`` objects, appending inline.

    ``log_for(partition)`` returns the open ``Log`` of ``__consumer_offsets-<partition>``
    (the broker creates it). Single node: a leader append is acks=all once it is
    in the log (fsynced first when the log is configured so), and the high
    watermark moves with it. The callback runs before ``append`` returns.
    """

    READ_CHUNK_BYTES = 1 << 20

    def __init__(self, log_for: Callable[[int], object]) -> None:
        self._log_for = log_for

    def append(self, partition: int, batch: bytes, callback: AppendCallback) -> None:
        from kbroker.log import KafkaStorageError, RecordBatchTooLargeError, RecordTooLargeError
        try:
            log = self._log_for(partition)
            info = log.append_as_leader(bytearray(batch))
            log.maybe_increment_high_watermark(log.log_end_offset_metadata)
        except (RecordTooLargeError, RecordBatchTooLargeError):
            callback(int(ErrorCode.RECORD_LIST_TOO_LARGE), -1)
            return
        except KafkaStorageError:
            callback(int(ErrorCode.KAFKA_STORAGE_ERROR), -1)
            return
        except Exception:
            callback(int(ErrorCode.UNKNOWN_SERVER_ERROR), -1)
            return
        callback(int(ErrorCode.NONE), info.first_offset)

    def read_batches(self, partition: int) -> Iterator:
        log = self._log_for(partition)
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            info = log.read(offset, self.READ_CHUNK_BYTES, None, True)
            recs = info.records
            data = recs.read_bytes() if hasattr(recs, "read_bytes") else bytes(recs)
            if not data:
                break
            batches = _records.decode_batches(data)
            if not batches:
                break
            for b in batches:
                if b.next_offset > offset:  # the first batch may start before ``offset``
                    yield b
            offset = batches[-1].next_offset


class ReplicaOffsetsLog:
    """An :class:`OffsetsLog` through the broker's ReplicaManager (the production path).

    Appends go through ``replica_manager.append_records`` with acks=all and
    ``internal_topics_allowed`` (so the high watermark, the produce and fetch
    purgatories and append listeners all see them); reads come straight from
    the partition's log. ``timeout_ms``: offsets.commit.timeout.ms.
    """

    def __init__(self, replica_manager, timeout_ms: int = 5000) -> None:
        self._rm = replica_manager
        self._timeout_ms = timeout_ms
        self._reader = LogOffsetsLog(self._log_for)

    def _log_for(self, partition: int):
        part = self._rm.get_partition((OFFSETS_TOPIC, partition))
        if part is None:
            raise KeyError(f"{OFFSETS_TOPIC}-{partition} is not hosted here")
        return part.log

    def append(self, partition: int, batch: bytes, callback: AppendCallback) -> None:
        tp = (OFFSETS_TOPIC, partition)

        def respond(results) -> None:
            r = results.get(tp)
            if r is None:
                callback(int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), -1)
            else:
                err = int(r.error)
                callback(err, r.base_offset if err == 0 else -1)

        self._rm.append_records(self._timeout_ms, -1, {tp: bytearray(batch)}, respond,
                                internal_topics_allowed=True)

    def read_batches(self, partition: int) -> Iterator:
        if self._rm.get_partition((OFFSETS_TOPIC, partition)) is None:
            return iter(())
        return self._reader.read_batches(partition)
