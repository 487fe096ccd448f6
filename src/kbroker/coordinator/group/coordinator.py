"""GroupCoordinator: consumer groups (classic protocol) and committed offsets.

Kafka: ``core/.../coordinator/group/GroupCoordinator.scala`` (the classic
state machine, followed closely) and ``GroupMetadataManager.scala`` (offsets,
loading, expiry); 3.9's ``group-coordinator`` module for the details that
changed since (offset-commit validation, GROUP_ID_NOT_FOUND from OffsetCommit
v9, simple groups, KIP-211 expiry conditions).

Ownership. A group lives in ``__consumer_offsets`` partition
``partition_for(group_id)`` = ``abs(java_hashcode(group_id)) %
offsets.topic.num.partitions``; this coordinator serves the groups of the
partitions it has loaded (all of them on a single node). The partition table,
loading, the append path and the timers are the shared
:class:`~kbroker.coordinator.runtime.CoordinatorRuntime` (``_runtime``); this
class is its state machine (``_load_groups`` / ``_unload_groups``). Loading replays the
partition (:mod:`storage`) into memory; from then on state is served from
memory and every change is appended to the partition before it is
acknowledged. While a partition loads, its groups answer
COORDINATOR_LOAD_IN_PROGRESS; partitions not loaded here answer
NOT_COORDINATOR; a coordinator not started (or shut down) answers
COORDINATOR_NOT_AVAILABLE.

Locking (Kafka's ``group.lock``): each group has one reentrant lock; every
read and write of a group happens under it, including the append of the
group's records (so the log order is the in-memory order) and the delayed
operations' checks and expiry (they use the group lock as their operation
lock). ``_lock`` guards only the group map (the runtime has its own for the
partition table); it is a leaf lock: never held while taking a group lock or calling out. Lock order:
group lock → ``_lock``. Callbacks that answer requests run under the group
lock (``RequestContext.respond`` only encodes and enqueues, it never blocks).

KIP-848 consumer groups (``consumer_group``) share the group map, the
offsets and the log with classic groups: a group id is either a
:class:`ClassicGroup` or a :class:`ConsumerGroup`. A ConsumerGroupHeartbeat
computes the group's records, replays them into memory under the group lock
and answers once they are written; member session and rebalance (revocation)
timeouts are timer tasks on the heartbeat purgatory's timer. Classic APIs
meeting a consumer group answer as Kafka 3.9 does for a member it does not
know (UNKNOWN_MEMBER_ID) or a live group of the other protocol
(INCONSISTENT_GROUP_PROTOCOL for JoinGroup, GROUP_ID_NOT_FOUND for the
heartbeat); an empty group of either protocol is replaced (its offsets kept).

Timers: session timeouts (DelayedHeartbeat), rebalance timeouts (DelayedJoin),
the initial rebalance delay (InitialDelayedJoin), pending SyncGroups
(DelayedSync) and the periodic offset-retention check live in two purgatories
(heartbeat, rebalance) and their timers; no thread ever sleeps on a group.
"""
from __future__ import annotations

import logging
import struct
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from kbroker.coordinator.group import storage
from kbroker.coordinator.runtime import CoordinatorRuntime
from kbroker.coordinator.group.classic_group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, ClassicMember, GroupState
from kbroker.coordinator.group.consumer_group import (
    CONSUMER_GROUP_TYPE, LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH, ConsumerGroup, ConsumerGroupError,
    HeartbeatOutcome, HeartbeatRequest, MemberState, assignor_name, consumer_group_heartbeat, fence_member,
    static_member_temporary_leave, validate_heartbeat,
)
from kbroker.coordinator.group.delayed import (
    DelayedHeartbeat, DelayedJoin, DelayedSync, InitialDelayedJoin, join_key, member_key, sync_key,
)
from kbroker.coordinator.group.offsets import INVALID_OFFSET, OffsetAndMetadata
from kbroker.coordinator.records.group_metadata import MemberMetadata as MemberMetadataRecord
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.consumer_protocol_assignment import ConsumerProtocolAssignment
from kbroker.protocol.messages.consumer_protocol_assignment import TopicPartition as CPATopicPartition
from kbroker.protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription
from kbroker.server.timer import TimerTask

log = logging.getLogger(__name__)

__all__ = ["GroupConfig", "GroupCoordinator", "JoinGroupResult", "SyncGroupResult", "GroupSummary",
           "MemberSummary", "ListedGroup", "OffsetFetchPartition"]

E = ErrorCode
NONE = E.NONE

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000  # Kafka's GroupCoordinator.NewMemberJoinTimeoutMs

# APIs that accept the empty group id (Kafka's isValidGroupId).
_EMPTY_GROUP_ID_OK = frozenset({"offset_commit", "offset_fetch", "describe_groups", "delete_groups"})


@dataclass(frozen=True)
class GroupConfig:
    """The broker settings the coordinator uses (Kafka's names and defaults)."""

    offsets_topic_num_partitions: int = 50
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2147483647
    offsets_retention_ms: int = 10080 * 60_000
    offsets_retention_check_interval_ms: int = 600000
    offset_metadata_max_bytes: int = 4096
    # KIP-848 (group.consumer.*, group.coordinator.rebalance.protocols)
    consumer_group_session_timeout_ms: int = 45000
    consumer_group_heartbeat_interval_ms: int = 5000
    consumer_group_max_size: int = 2147483647
    consumer_group_assignors: tuple = ("uniform", "range")  # the first one is the default
    rebalance_protocols: tuple = ("classic", "consumer")

    @property
    def consumer_protocol_enabled(self) -> bool:
        return "consumer" in self.rebalance_protocols

    @classmethod
    def from_kafka_config(cls, config) -> "GroupConfig":
        """From a :class:`kbroker.server.config.KafkaConfig` (or any ``config[key]`` mapping)."""
        return cls(
            offsets_topic_num_partitions=config["offsets.topic.num.partitions"],
            group_min_session_timeout_ms=config["group.min.session.timeout.ms"],
            group_max_session_timeout_ms=config["group.max.session.timeout.ms"],
            group_initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            group_max_size=config["group.max.size"],
            offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
            offsets_retention_check_interval_ms=config["offsets.retention.check.interval.ms"],
            offset_metadata_max_bytes=config["offset.metadata.max.bytes"],
            consumer_group_session_timeout_ms=_opt(config, "group.consumer.session.timeout.ms", 45000),
            consumer_group_heartbeat_interval_ms=_opt(config, "group.consumer.heartbeat.interval.ms", 5000),
            consumer_group_max_size=_opt(config, "group.consumer.max.size", 2147483647),
            consumer_group_assignors=tuple(assignor_name(a) for a in _opt(
                config, "group.consumer.assignors", ["uniform", "range"])),
            rebalance_protocols=tuple(_opt(config, "group.coordinator.rebalance.protocols", ["classic", "consumer"])),
        )


def _opt(config, key: str, default):
    try:
        v = config[key]
    except KeyError:
        return default
    return default if v is None else v


class JoinGroupResult(NamedTuple):
    """What a JoinGroup answers. ``members`` (leader only): (member_id, group_instance_id, metadata)."""

    members: list
    member_id: str
    generation_id: int
    protocol_type: str | None
    protocol_name: str | None
    leader_id: str
    skip_assignment: bool
    error: ErrorCode

    @classmethod
    def failed(cls, member_id: str, error: ErrorCode) -> "JoinGroupResult":
        return cls([], member_id, -1, None, None, "", False, error)


class SyncGroupResult(NamedTuple):
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class MemberSummary(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupSummary(NamedTuple):
    state: str
    protocol_type: str
    protocol: str
    members: list


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    state: str
    group_type: str


class OffsetFetchPartition(NamedTuple):
    committed_offset: int
    leader_epoch: int
    metadata: str | None
    error: ErrorCode


DEAD_GROUP = GroupSummary(GroupState.DEAD.value, "", "", [])
EMPTY_SUMMARY = GroupSummary("", "", "", [])


def _append_error_for_group(code: int) -> ErrorCode:
    """storeGroup's mapping of append errors (GroupMetadataManager.storeGroup)."""
    code = E(code) if code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
    if code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                E.REQUEST_TIMED_OUT):
        return E.COORDINATOR_NOT_AVAILABLE
    if code in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if code in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_FETCH_SIZE):
        return E.UNKNOWN_SERVER_ERROR
    return code


def _append_error_for_offsets(code: int) -> ErrorCode:
    """storeOffsets' mapping of append errors."""
    code = E(code) if code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
    if code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                E.REQUEST_TIMED_OUT):
        return E.COORDINATOR_NOT_AVAILABLE
    if code in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if code in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_FETCH_SIZE):
        return E.INVALID_COMMIT_OFFSET_SIZE
    return code


class _RetentionTask(TimerTask):
    """Re-arming timer task: offsets.retention.check.interval.ms."""

    def __init__(self, coordinator: "GroupCoordinator", delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator

    def run(self) -> None:
        c = self.coordinator
        try:
            c.cleanup_group_metadata()
        except Exception:
            log.exception("offset retention check failed")
        finally:
            c._schedule_retention()


class _ConsumerGroupTimeout(TimerTask):
    """A KIP-848 member's session ("session") or revocation ("rebalance") timeout.
    Armed and cancelled under the group lock; ``group.timers`` holds the live one."""

    def __init__(self, coordinator: "GroupCoordinator", group: ConsumerGroup, kind: str, member_id: str,
                 epoch: int, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.coordinator = coordinator
        self.group = group
        self.kind = kind
        self.member_id = member_id
        self.epoch = epoch

    def run(self) -> None:
        try:
            self.coordinator._on_consumer_group_timeout(self)
        except Exception:
            log.exception("consumer group %s timeout of %s failed", self.group.group_id, self.member_id)


_CONTROL_ABORT = 0
_CONTROL_COMMIT = 1


class _TxnReplay:
    """Transactional offset commits met while loading a partition (Kafka's
    loadGroupsAndOffsets): a transactional batch's offsets wait for the producer's
    COMMIT (they count) or ABORT (dropped) control batch; those with no marker yet stay
    pending in the group. ``records`` yields the records of the plain batches."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.pending: dict[int, list] = {}      # pid -> [(record, ...)]
        self.committed: list = []              # records of committed transactions
        self.sequences: dict[int, tuple[int, int]] = {}

    def records(self, batches):
        for batch in batches:
            pid = getattr(batch, "producer_id", -1)
            if getattr(batch, "is_control", False):
                kind = None
                for rec in batch:
                    key = bytes(rec.key or b"")
                    if len(key) >= 4:
                        kind = struct.unpack_from(">h", key, 2)[0]
                recs = self.pending.pop(pid, [])
                if kind == _CONTROL_COMMIT:
                    self.committed.extend(recs)
                self.sequences.pop(pid, None)
                continue
            if getattr(batch, "is_transactional", False):
                self.pending.setdefault(pid, []).extend(batch)
                self.sequences[pid] = (batch.producer_epoch, batch.base_sequence + len(batch))
                continue
            yield from batch


class _GroupShard:
    """The group coordinator as the runtime's :class:`CoordinatorShard`."""

    def __init__(self, coordinator: "GroupCoordinator") -> None:
        self.coordinator = coordinator

    def load_batches(self, partition: int, batches) -> int:
        replay = _TxnReplay(partition)
        n = self.coordinator._load_groups(partition, replay.records(batches), replay)
        with self.coordinator._lock:
            for pid, seq in replay.sequences.items():
                self.coordinator._txn_sequences[(partition, pid)] = seq
        return n

    def unload(self, partition: int) -> None:
        self.coordinator._unload_groups(partition)


class GroupCoordinator:
    """See the module docstring. Public methods are thread-safe.

    ``offsets_log``: the broker's :class:`storage.OffsetsLog`.
    ``time_ms``: wall clock for timestamps (commit, state change) — and, when
    given, also the timers' clock (tests inject one fake clock and call
    :meth:`advance_timers`). ``reaper_enabled=False``: nothing runs timers but
    ``advance_timers`` (tests). ``metadata_image``: returns the broker's current
    metadata image (``topics``: name → topic with ``topic_id`` and
    ``num_partitions``; ``epoch``), which KIP-848 groups assign from.
    """

    def __init__(self, config: GroupConfig, offsets_log, *, time_ms: Callable[[], int] | None = None,
                 reaper_enabled: bool = True, broker_id: int = 0, metadata_image: Callable[[], object] | None = None
                 ) -> None:
        self.config = config
        self._metadata_image = metadata_image or (lambda: None)
        self.offsets_log = offsets_log
        self._runtime = CoordinatorRuntime(
            "group-metadata", storage.OFFSETS_TOPIC, config.offsets_topic_num_partitions, offsets_log,
            _GroupShard(self), time_ms=time_ms, reaper_enabled=reaper_enabled, broker_id=broker_id)
        self._time_ms = self._runtime.time_ms
        self._heartbeat_purgatory = self._runtime.new_purgatory("Heartbeat", "group-heartbeat")
        self._rebalance_purgatory = self._runtime.new_purgatory("Rebalance", "group-rebalance")
        self._lock = threading.Lock()
        self._groups: dict[str, ClassicGroup] = {}
        self._retention_task: _RetentionTask | None = None
        #: (partition, producer id) -> (epoch, next sequence) of TxnOffsetCommit batches
        self._txn_sequences: dict[tuple[int, int], tuple[int, int]] = {}

    # ==================================================================================
    # lifecycle and partitions
    # ==================================================================================

    def now_ms(self) -> int:
        """The coordinator's wall clock (commit timestamps)."""
        return self._time_ms()

    def is_serving(self, group_id: str) -> bool:
        """True if this coordinator owns the group's partition (loaded or loading)."""
        return self._runtime.owns(self.partition_for(group_id))

    def partition_for(self, group_id: str) -> int:
        return storage.partition_for(group_id, self.config.offsets_topic_num_partitions)

    @property
    def is_active(self) -> bool:
        return self._runtime.is_active

    def startup(self, partitions: Iterable[int] | None = None, *, background: bool = True,
                enable_retention: bool = True) -> None:
        """Become active and load ``partitions`` (default: all of them).

        ``background``: load on a loader thread (requests for a partition still
        loading get COORDINATOR_LOAD_IN_PROGRESS); else load before returning.
        """
        self._runtime.startup(partitions, background=background)
        if enable_retention:
            self._schedule_retention()

    def wait_loaded(self, timeout_s: float = 30.0) -> bool:
        """Block until no partition is loading (tests, start-up)."""
        return self._runtime.wait_loaded(timeout_s)

    def shutdown(self) -> None:
        """Unload everything (waiters get NOT_COORDINATOR), stop the timers. Idempotent."""
        self._runtime.shutdown()

    def load_partition(self, partition: int) -> int:
        """Replay ``__consumer_offsets-<partition>`` and serve its groups; returns groups loaded.

        Later records win; a null value (tombstone) deletes its key. Groups
        with members come back Stable with their generation (clients keep
        heartbeating it; members that do not are expired after their session
        timeout); groups without metadata but with offsets come back as Empty
        simple groups.
        """
        return self._runtime.load_partition(partition)

    def _load_groups(self, partition: int, records, txn: "_TxnReplay | None" = None) -> int:
        """The runtime's load: replay the partition's records and install its groups.
        ``txn``: the transactional offset commits (committed ones win by record offset as
        any other commit; pending ones stay pending)."""
        offsets: dict[str, dict[tuple, tuple[OffsetAndMetadata, int]]] = {}
        metadata: dict[str, object] = {}
        consumer_groups: dict[str, ConsumerGroup] = {}
        for rec in records:
            try:
                parsed = storage.parse_record(rec.key, rec.value)
            except Exception as e:
                log.warning("__consumer_offsets-%d offset %d: unreadable record skipped (%s)",
                            partition, rec.offset, e)
                continue
            if parsed.kind == "offset":
                k = parsed.key
                tp = (k.topic, k.partition)
                if parsed.value is None:
                    offsets.get(k.group, {}).pop(tp, None)
                else:
                    v = parsed.value
                    offsets.setdefault(k.group, {})[tp] = (OffsetAndMetadata(
                        v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp), rec.offset)
            elif parsed.kind == "group":
                if parsed.value is None:
                    metadata.pop(parsed.key.group, None)
                else:
                    metadata[parsed.key.group] = parsed.value
                    consumer_groups.pop(parsed.key.group, None)
            elif parsed.kind == "consumer_group":
                # KIP-848 records replay into the group exactly as a heartbeat applied them.
                gid = parsed.key.group_id
                cg = consumer_groups.get(gid)
                if cg is None:
                    if parsed.value is None:
                        continue
                    cg = consumer_groups[gid] = ConsumerGroup(gid)
                    metadata.pop(gid, None)
                cg.replay(parsed)
                if cg.dead:
                    del consumer_groups[gid]
        pending_txn: dict[str, list] = {}
        if txn is not None:
            for rec in txn.committed:
                parsed = self._parse_txn_offset(partition, rec)
                if parsed is not None:
                    gid, tp, om = parsed
                    cur = offsets.get(gid, {}).get(tp)
                    if cur is None or cur[1] <= rec.offset:
                        offsets.setdefault(gid, {})[tp] = (om, rec.offset)
            for pid, recs in txn.pending.items():
                for rec in recs:
                    parsed = self._parse_txn_offset(partition, rec)
                    if parsed is not None:
                        pending_txn.setdefault(parsed[0], []).append((pid, parsed[1], parsed[2], rec.offset))
        loaded = []
        for gid in set(offsets) | set(metadata) | set(consumer_groups) | set(pending_txn):
            md = metadata.get(gid)
            cg = consumer_groups.get(gid)
            group_offsets = offsets.get(gid, {})
            if md is None and cg is None and not group_offsets and gid not in pending_txn:
                continue
            if cg is not None:
                group = cg
            else:
                group = self._group_from_record(gid, md) if md is not None else ClassicGroup(gid, GroupState.EMPTY,
                                                                                               -1)
            for tp, (om, rec_off) in group_offsets.items():
                group.offsets.put(tp, om, rec_off)
            for pid, tp, om, rec_off in pending_txn.get(gid, ()):
                group.offsets.put_txn(pid, tp, om, rec_off)
            loaded.append(group)
        with self._lock:
            for group in loaded:
                old = self._groups.get(group.group_id)
                if old is not None:
                    log.warning("group %s already in memory while loading partition %d; replaced",
                                group.group_id, partition)
                self._groups[group.group_id] = group
        for group in loaded:
            with group.lock:
                if isinstance(group, ConsumerGroup):
                    # Kafka's onLoaded: every member gets a fresh session; revocations a fresh timeout.
                    for member in list(group.members.values()):
                        self._schedule_consumer_timer(group, "session", member.member_id, -1,
                                                      self.config.consumer_group_session_timeout_ms)
                        if member.state is MemberState.UNREVOKED_PARTITIONS:
                            self._schedule_consumer_timer(group, "rebalance", member.member_id, member.member_epoch,
                                                          member.rebalance_timeout_ms)
                    continue
                for member in list(group.members.values()):
                    self._complete_and_schedule_next_heartbeat_expiration(group, member)
                if group.size() > self.config.group_max_size and group.can_rebalance():
                    self._prepare_rebalance(group, "group over capacity after loading")
        return len(loaded)

    @staticmethod
    def _parse_txn_offset(partition: int, rec):
        """(group, (topic, partition), OffsetAndMetadata) of a transactional offset record, or None."""
        try:
            parsed = storage.parse_record(rec.key, rec.value)
        except Exception as e:
            log.warning("__consumer_offsets-%d offset %d: unreadable record skipped (%s)", partition, rec.offset, e)
            return None
        if parsed.kind != "offset" or parsed.value is None:
            return None
        k, v = parsed.key, parsed.value
        return k.group, (k.topic, k.partition), OffsetAndMetadata(v.offset, v.leader_epoch, v.metadata,
                                                                  v.commit_timestamp, v.expire_timestamp)

    def _group_from_record(self, group_id: str, md) -> ClassicGroup:
        state = GroupState.STABLE if md.members else GroupState.EMPTY
        group = ClassicGroup(group_id, state, md.current_state_timestamp)
        group.generation_id = md.generation
        group.protocol_type = md.protocol_type or None
        group.protocol_name = md.protocol
        for m in md.members:
            member = ClassicMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                   m.rebalance_timeout if m.rebalance_timeout >= 0 else m.session_timeout,
                                   m.session_timeout, md.protocol_type, [(md.protocol or "", bytes(m.subscription))])
            member.assignment = bytes(m.assignment)
            group.add(member)
        group.leader_id = md.leader if md.members else None
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def unload_partition(self, partition: int) -> None:
        """Stop serving the partition's groups (Kafka's onGroupUnloaded for each)."""
        self._runtime.unload_partition(partition)

    def _unload_groups(self, partition: int) -> None:
        """The runtime's unload: drop the partition's groups, answer their waiters NOT_COORDINATOR."""
        with self._lock:
            for key in [k for k in self._txn_sequences if k[0] == partition]:
                del self._txn_sequences[key]
            groups = [g for gid, g in self._groups.items() if self.partition_for(gid) == partition]
            for g in groups:
                del self._groups[g.group_id]
        for group in groups:
            with group.lock:
                if isinstance(group, ConsumerGroup):
                    group.dead = True
                    for kind, mid in list(group.timers):
                        self._cancel_consumer_timer(group, kind, mid)
                    continue
                previous = group.state
                group.transition_to(GroupState.DEAD, self._time_ms())
                if previous is GroupState.PREPARING_REBALANCE:
                    for m in list(group.members.values()):
                        group.maybe_invoke_join_callback(m, JoinGroupResult.failed(m.member_id, E.NOT_COORDINATOR))
                    self._rebalance_purgatory.check_and_complete(join_key(group.group_id))
                elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                    for m in list(group.members.values()):
                        group.maybe_invoke_sync_callback(m, SyncGroupResult(E.NOT_COORDINATOR))
                        self._heartbeat_purgatory.check_and_complete(member_key(group.group_id, m.member_id))
                self._rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def advance_timers(self) -> None:
        """Run every timer task due by the clock (tests with ``reaper_enabled=False``)."""
        self._runtime.advance_timers()

    # ==================================================================================
    # lookup helpers
    # ==================================================================================

    def _validate_group_status(self, group_id: str | None, api: str) -> ErrorCode | None:
        if group_id is None or (not group_id and api not in _EMPTY_GROUP_ID_OK):
            return E.INVALID_GROUP_ID
        return self._runtime.partition_error(self.partition_for(group_id))

    def _get_group(self, group_id: str) -> ClassicGroup | None:
        with self._lock:
            return self._groups.get(group_id)

    def _get_or_create_group(self, group_id: str, create: bool) -> ClassicGroup | None:
        with self._lock:
            group = self._groups.get(group_id)
            if group is None and create:
                group = self._groups[group_id] = ClassicGroup(group_id, GroupState.EMPTY, self._time_ms())
            return group

    def _remove_group(self, group: ClassicGroup) -> None:
        with self._lock:
            if self._groups.get(group.group_id) is group:
                del self._groups[group.group_id]

    def group(self, group_id: str) -> ClassicGroup | None:
        """The in-memory group (tests and tools; take ``group.lock`` to read it)."""
        return self._get_group(group_id)

    def group_ids(self) -> list[str]:
        with self._lock:
            return list(self._groups)

    # ==================================================================================
    # JoinGroup
    # ==================================================================================

    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None,
                   require_known_member_id: bool, supports_skip_assignment: bool, client_id: str,
                   client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                   protocol_type: str, protocols: list[tuple[str, bytes]], callback: Callable[[JoinGroupResult], None],
                   reason: str | None = None) -> None:
        """Handle a JoinGroup; ``callback`` answers it (now or when the join phase ends)."""
        err = self._validate_group_status(group_id, "join_group")
        if err is not None:
            callback(JoinGroupResult.failed(member_id, err))
            return
        cfg = self.config
        if not cfg.group_min_session_timeout_ms <= session_timeout_ms <= cfg.group_max_session_timeout_ms:
            callback(JoinGroupResult.failed(member_id, E.INVALID_SESSION_TIMEOUT))
            return
        protocols = [(name, bytes(md)) for name, md in protocols]
        is_unknown = member_id == ""
        existing = self._get_group(group_id)
        if isinstance(existing, ConsumerGroup):
            err = self._classic_join_to_consumer_group(existing, is_unknown)
            if err is not None:
                callback(JoinGroupResult.failed(member_id, err))
                return
        group = self._get_or_create_group(group_id, create=is_unknown)
        if group is None:
            callback(JoinGroupResult.failed(member_id, E.UNKNOWN_MEMBER_ID))
            return
        with group.lock:
            if not self._accept_joining_member(group, member_id):
                group.remove(member_id)
                callback(JoinGroupResult.failed("", E.GROUP_MAX_SIZE_REACHED))
            elif is_unknown:
                self._do_new_member_join(group, group_instance_id, require_known_member_id, supports_skip_assignment,
                                         client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                                         protocol_type, protocols, callback, reason)
            else:
                self._do_current_member_join(group, member_id, group_instance_id, client_id, client_host,
                                             rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
                                             callback, reason)
            if group.is_state(GroupState.PREPARING_REBALANCE):
                self._rebalance_purgatory.check_and_complete(join_key(group.group_id))

    def _classic_join_to_consumer_group(self, group: ConsumerGroup, is_unknown: bool) -> ErrorCode | None:
        """A JoinGroup meeting a consumer group. An empty one is replaced by a classic group
        (offsets kept, its records tombstoned: Kafka's ``maybeDeleteEmptyConsumerGroup``);
        a live one refuses: Kafka 3.9 would let a classic member join it
        (``classicGroupJoinToConsumerGroup``), which we do not support."""
        with group.lock:
            if group.dead:
                return None
            if group.members:
                return E.INCONSISTENT_GROUP_PROTOCOL if is_unknown else E.UNKNOWN_MEMBER_ID
            if not is_unknown:
                return E.UNKNOWN_MEMBER_ID
            records = group.tombstones()
            for rec in records:
                group.replay(rec)
            group.dead = True
            classic = ClassicGroup(group.group_id, GroupState.EMPTY, self._time_ms())
            classic.offsets = group.offsets
            with self._lock:
                if self._groups.get(group.group_id) is group:
                    self._groups[group.group_id] = classic
            log.info("[GroupId %s] Converted the empty consumer group to a classic group.", group.group_id)
            self._append(group.group_id, [storage.encode_parsed(r) for r in records], lambda code, _b: None)
        return None

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        max_size = self.config.group_max_size
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_state(GroupState.PREPARING_REBALANCE):
            return (group.has(member_id) and group.get(member_id).is_awaiting_join) or \
                group.num_members_awaiting_join < max_size
        return group.has(member_id) or group.size() < max_size

    def _do_new_member_join(self, group, group_instance_id, require_known_member_id, supports_skip_assignment,
                            client_id, client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type,
                            protocols, callback, reason) -> None:
        if group.is_state(GroupState.DEAD):
            callback(JoinGroupResult.failed("", E.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(protocol_type, [p for p, _ in protocols]):
            callback(JoinGroupResult.failed("", E.INCONSISTENT_GROUP_PROTOCOL))
            return
        prefix = group_instance_id if group_instance_id is not None else client_id
        new_member_id = f"{prefix}-{uuid.uuid4()}"
        if group_instance_id is not None:
            old_member_id = group.static_member_id(group_instance_id)
            if old_member_id is None:
                self._add_member_and_rebalance(group, new_member_id, group_instance_id, client_id, client_host,
                                               rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols,
                                               callback, reason)
            else:
                self._update_static_member_and_rebalance(group, old_member_id, new_member_id, group_instance_id,
                                                         protocols, rebalance_timeout_ms, session_timeout_ms,
                                                         supports_skip_assignment, callback, reason)
        elif require_known_member_id:
            # KIP-394: hand out the member id first; the member rejoins with it.
            group.add_pending_member(new_member_id)
            self._add_pending_member_expiration(group, new_member_id, session_timeout_ms)
            callback(JoinGroupResult([], new_member_id, -1, None, None, "", False, E.MEMBER_ID_REQUIRED))
        else:
            self._add_member_and_rebalance(group, new_member_id, None, client_id, client_host, rebalance_timeout_ms,
                                           session_timeout_ms, protocol_type, protocols, callback, reason)

    def _do_current_member_join(self, group, member_id, group_instance_id, client_id, client_host,
                                rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols, callback,
                                reason) -> None:
        if group.is_state(GroupState.DEAD):
            callback(JoinGroupResult.failed(member_id, E.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(protocol_type, [p for p, _ in protocols]):
            callback(JoinGroupResult.failed(member_id, E.INCONSISTENT_GROUP_PROTOCOL))
            return
        if group.is_pending_member(member_id):
            # A pending member rejoining with the id it was given (never a static member).
            self._add_member_and_rebalance(group, member_id, None, client_id, client_host, rebalance_timeout_ms,
                                           session_timeout_ms, protocol_type, protocols, callback, reason)
            return
        if group.is_static_member_fenced(group_instance_id, member_id):
            callback(JoinGroupResult.failed(member_id, E.FENCED_INSTANCE_ID))
            return
        if not group.has(member_id) or (group_instance_id is not None
                                        and not group.has_static_member(group_instance_id)):
            callback(JoinGroupResult.failed(member_id, E.UNKNOWN_MEMBER_ID))
            return
        member = group.get(member_id)
        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms, session_timeout_ms,
                                              callback, "member joining during PreparingRebalance")
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # It lost the JoinGroup response: answer again for the current generation.
                callback(JoinGroupResult(
                    group.current_member_metadata() if group.is_leader(member_id) else [], member_id,
                    group.generation_id, group.protocol_type, group.protocol_name, group.leader_id or "",
                    False, NONE))
            else:
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                                  session_timeout_ms, callback, "member metadata changed")
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # The leader rejoining forces a rebalance (e.g. for topic metadata changes).
                self._update_member_and_rebalance(group, member, protocols, rebalance_timeout_ms,
                                                  session_timeout_ms, callback, "leader rejoined or metadata changed")
            else:
                callback(JoinGroupResult([], member_id, group.generation_id, group.protocol_type,
                                         group.protocol_name, group.leader_id or "", False, NONE))
        else:  # Empty (a stale member) or Dead: let it reset and rejoin
            callback(JoinGroupResult.failed(member_id, E.UNKNOWN_MEMBER_ID))

    def _add_member_and_rebalance(self, group, member_id, group_instance_id, client_id, client_host,
                                  rebalance_timeout_ms, session_timeout_ms, protocol_type, protocols, callback,
                                  reason) -> None:
        member = ClassicMember(member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
                               session_timeout_ms, protocol_type, protocols)
        member.is_new = True
        if group.is_state(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, callback)
        # A new member cannot heartbeat and its socket is muted while it waits: time its
        # JoinGroup out so defunct members do not pile up (Kafka's NewMemberJoinTimeoutMs).
        self._complete_and_schedule_next_heartbeat_expiration(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id}: {reason}")

    def _update_member_and_rebalance(self, group, member, protocols, rebalance_timeout_ms, session_timeout_ms,
                                     callback, reason) -> None:
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, callback)
        self._maybe_prepare_rebalance(group, reason)

    def _update_static_member_and_rebalance(self, group, old_member_id, new_member_id, group_instance_id,
                                            protocols, rebalance_timeout_ms, session_timeout_ms,
                                            supports_skip_assignment, callback, reason) -> None:
        current_leader = group.leader_id

        def fence(m: ClassicMember) -> None:
            group.maybe_invoke_join_callback(m, JoinGroupResult.failed(old_member_id, E.FENCED_INSTANCE_ID))
            group.maybe_invoke_sync_callback(m, SyncGroupResult(E.FENCED_INSTANCE_ID))

        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id, fence)
        self._heartbeat_purgatory.check_and_complete(member_key(group.group_id, old_member_id))
        self._complete_and_schedule_next_heartbeat_expiration(group, member)
        old_protocols = member.protocols
        old_rebalance, old_session = member.rebalance_timeout_ms, member.session_timeout_ms
        group.update_member(member, protocols, rebalance_timeout_ms, session_timeout_ms, callback)
        state = group.state
        if state is GroupState.STABLE:
            if group.protocol_name == group.select_protocol():
                # Nothing changes for the group: persist the new member id, rejoin without a rebalance.
                generation = group.generation_id

                def on_stored(error: ErrorCode) -> None:
                    with group.lock:
                        if error != NONE:
                            group.update_member(member, old_protocols, old_rebalance, old_session, None)
                            old = group.replace_static_member(group_instance_id, new_member_id, old_member_id,
                                                              lambda m: None)
                            self._complete_and_schedule_next_heartbeat_expiration(group, old)
                            callback(JoinGroupResult([], "", generation, group.protocol_type, group.protocol_name,
                                                     current_leader or "", False, error))
                            return
                        if supports_skip_assignment:
                            # JoinGroup v9+: the leader learns it leads but skips the assignor.
                            is_leader = group.is_leader(new_member_id)
                            result = JoinGroupResult(group.current_member_metadata() if is_leader else [],
                                                     new_member_id, group.generation_id, group.protocol_type,
                                                     group.protocol_name, group.leader_id or "", is_leader, NONE)
                        else:
                            # Return the old leader id so a static leader does not run a trivial
                            # assignment a Stable group would never propagate.
                            result = JoinGroupResult([], new_member_id, group.generation_id, group.protocol_type,
                                                     group.protocol_name, current_leader or "", False, NONE)
                        group.maybe_invoke_join_callback(member, result)

                self._store_group(group, {m.member_id: m.assignment for m in group.members.values()}, on_stored)
            else:
                self._maybe_prepare_rebalance(group, f"static member {group_instance_id} changed protocols")
        elif state is GroupState.COMPLETING_REBALANCE:
            self._maybe_prepare_rebalance(group, f"static member {group_instance_id} rejoined during sync")
        elif state is GroupState.PREPARING_REBALANCE:
            pass  # it takes part in the rebalance under way
        else:
            raise RuntimeError(f"static member rejoin in unexpected state {state}")

    # -- rebalance --------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        with group.lock:
            if group.can_rebalance():
                self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_state(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, E.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        cfg = self.config
        if group.is_state(GroupState.EMPTY):
            delay = cfg.group_initial_rebalance_delay_ms
            op = InitialDelayedJoin(self, self._rebalance_purgatory, group, delay, delay,
                                    max(group.rebalance_timeout_ms() - delay, 0))
        else:
            op = DelayedJoin(self, group, group.rebalance_timeout_ms())
        previous = group.state
        group.transition_to(GroupState.PREPARING_REBALANCE, self._time_ms())
        log.info("preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
                 group.group_id, previous.value, group.generation_id, reason)
        self._rebalance_purgatory.try_complete_else_watch(op, [join_key(group.group_id)])

    def _on_complete_join(self, group: ClassicGroup) -> None:
        """The join phase ended (all joined, or the rebalance timeout): start the next generation."""
        with group.lock:
            for m in group.not_yet_rejoined_members():
                if not m.is_static:
                    group.remove(m.member_id)
                    self._remove_heartbeat_for_leaving_member(group, m)
            if group.is_state(GroupState.DEAD):
                return
            if not group.maybe_elect_new_joined_leader() and group.members:
                # Nobody rejoined (only static members left): wait until their sessions expire.
                log.error("group %s could not complete rebalance because no members rejoined", group.group_id)
                self._rebalance_purgatory.try_complete_else_watch(
                    DelayedJoin(self, group, group.rebalance_timeout_ms()), [join_key(group.group_id)])
                return
            group.init_next_generation(self._time_ms())
            if group.is_state(GroupState.EMPTY):
                log.info("group %s with generation %d is now empty", group.group_id, group.generation_id)
                self._store_group(group, {}, lambda err: err == NONE or log.warning(
                    "failed to write empty metadata for group %s: %s", group.group_id, err.name))
                return
            log.info("stabilized group %s generation %d with %d members", group.group_id, group.generation_id,
                     group.size())
            for m in list(group.members.values()):
                result = JoinGroupResult(
                    group.current_member_metadata() if group.is_leader(m.member_id) else [], m.member_id,
                    group.generation_id, group.protocol_type, group.protocol_name, group.leader_id or "",
                    False, NONE)
                group.maybe_invoke_join_callback(m, result)
                self._complete_and_schedule_next_heartbeat_expiration(group, m)
                m.is_new = False
                group.pending_sync_members.add(m.member_id)
            self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: ClassicGroup) -> None:
        op = DelayedSync(self, group, group.generation_id, group.rebalance_timeout_ms())
        group.delayed_sync = op
        self._rebalance_purgatory.try_complete_else_watch(op, [sync_key(group.group_id)])

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.pending_sync_members.clear()
        self._rebalance_purgatory.check_and_complete(sync_key(group.group_id))
        group.delayed_sync = None

    def _pending_sync_done(self, group: ClassicGroup, generation_id: int) -> bool:
        if generation_id != group.generation_id:
            return True
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return group.has_received_sync_from_all_members()
        return True

    def _on_expire_pending_sync(self, group: ClassicGroup, generation_id: int) -> None:
        with group.lock:
            if generation_id != group.generation_id:
                return
            if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                return
            pending = list(group.pending_sync_members)
            if not pending:
                return
            log.info("group %s removing members that did not send SyncGroup: %s", group.group_id, pending)
            for mid in pending:
                m = group.remove(mid)
                if m is not None:
                    self._remove_heartbeat_for_leaving_member(group, m)
            self._maybe_prepare_rebalance(group, "removing members on pending sync expiration")

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ptype, pname = (group.protocol_type, group.protocol_name) if error == NONE else (None, None)
        for m in list(group.members.values()):
            if group.maybe_invoke_sync_callback(m, SyncGroupResult(error, ptype, pname, m.assignment)):
                # Re-arm the session: a member waiting for its assignment never timed out.
                self._complete_and_schedule_next_heartbeat_expiration(group, m)

    # -- heartbeats / sessions ------------------------------------------------------------------

    def _complete_and_schedule_next_heartbeat_expiration(self, group: ClassicGroup, member: ClassicMember,
                                                         timeout_ms: int | None = None) -> None:
        key = member_key(group.group_id, member.member_id)
        member.heartbeat_satisfied = True
        self._heartbeat_purgatory.check_and_complete(key)
        member.heartbeat_satisfied = False
        op = DelayedHeartbeat(self, group, member.member_id, False,
                              member.session_timeout_ms if timeout_ms is None else timeout_ms)
        self._heartbeat_purgatory.try_complete_else_watch(op, [key])

    def _add_pending_member_expiration(self, group: ClassicGroup, member_id: str, timeout_ms: int) -> None:
        op = DelayedHeartbeat(self, group, member_id, True, timeout_ms)
        self._heartbeat_purgatory.try_complete_else_watch(op, [member_key(group.group_id, member_id)])

    def _remove_heartbeat_for_leaving_member(self, group: ClassicGroup, member: ClassicMember) -> None:
        member.is_leaving = True
        self._heartbeat_purgatory.check_and_complete(member_key(group.group_id, member.member_id))

    def _heartbeat_satisfied(self, group: ClassicGroup, member_id: str, is_pending: bool) -> bool:
        if group.is_state(GroupState.DEAD):
            return True
        if is_pending:
            return group.has(member_id) or not group.is_pending_member(member_id)
        member = group.members.get(member_id)
        return True if member is None else member.has_satisfied_heartbeat()

    def _on_expire_heartbeat(self, group: ClassicGroup, member_id: str, is_pending: bool) -> None:
        with group.lock:
            if group.is_state(GroupState.DEAD):
                return
            if is_pending:
                if group.is_pending_member(member_id):
                    log.info("pending member %s in group %s removed after session timeout", member_id,
                             group.group_id)
                    self._remove_pending_member_and_update_group(group, member_id)
                return
            member = group.members.get(member_id)
            if member is None or member.has_satisfied_heartbeat():
                return
            log.info("member %s in group %s has failed, removing it from the group", member_id, group.group_id)
            self._remove_member_and_update_group(group, member, "session timeout")

    def _remove_pending_member_and_update_group(self, group: ClassicGroup, member_id: str) -> None:
        group.remove(member_id)
        if group.is_state(GroupState.PREPARING_REBALANCE):
            self._rebalance_purgatory.check_and_complete(join_key(group.group_id))

    def _remove_member_and_update_group(self, group: ClassicGroup, member: ClassicMember, reason: str) -> None:
        # A new member may still wait in JoinGroup: tell it to rejoin before it is dropped.
        group.maybe_invoke_join_callback(member, JoinGroupResult.failed("", E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        state = group.state
        if state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif state is GroupState.PREPARING_REBALANCE:
            self._rebalance_purgatory.check_and_complete(join_key(group.group_id))

    # ==================================================================================
    # SyncGroup
    # ==================================================================================

    def sync_group(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes],
                   callback: Callable[[SyncGroupResult], None]) -> None:
        err = self._validate_group_status(group_id, "sync_group")
        if err is not None:
            # While loading, the member will learn the state on its next JoinGroup.
            callback(SyncGroupResult(E.REBALANCE_IN_PROGRESS if err == E.COORDINATOR_LOAD_IN_PROGRESS else err))
            return
        group = self._get_group(group_id)
        if group is None or isinstance(group, ConsumerGroup):
            callback(SyncGroupResult(E.UNKNOWN_MEMBER_ID))
            return
        with group.lock:
            if group.is_state(GroupState.DEAD):
                callback(SyncGroupResult(E.COORDINATOR_NOT_AVAILABLE))
            elif group.is_static_member_fenced(group_instance_id, member_id):
                callback(SyncGroupResult(E.FENCED_INSTANCE_ID))
            elif not group.has(member_id):
                callback(SyncGroupResult(E.UNKNOWN_MEMBER_ID))
            elif generation_id != group.generation_id:
                callback(SyncGroupResult(E.ILLEGAL_GENERATION))
            elif (protocol_type is not None and protocol_type != group.protocol_type) or \
                    (protocol_name is not None and protocol_name != group.protocol_name):
                callback(SyncGroupResult(E.INCONSISTENT_GROUP_PROTOCOL))
            elif group.is_state(GroupState.EMPTY):
                callback(SyncGroupResult(E.UNKNOWN_MEMBER_ID))
            elif group.is_state(GroupState.PREPARING_REBALANCE):
                callback(SyncGroupResult(E.REBALANCE_IN_PROGRESS))
            elif group.is_state(GroupState.COMPLETING_REBALANCE):
                group.get(member_id).awaiting_sync_callback = callback
                self._remove_pending_sync_member(group, member_id)
                if group.is_leader(member_id):
                    self._complete_leader_sync(group, member_id, assignments)
            else:  # Stable: answer with the current assignment
                self._remove_pending_sync_member(group, member_id)
                member = group.get(member_id)
                callback(SyncGroupResult(NONE, group.protocol_type, group.protocol_name, member.assignment))
                self._complete_and_schedule_next_heartbeat_expiration(group, member)

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        self._rebalance_purgatory.check_and_complete(sync_key(group.group_id))

    def _complete_leader_sync(self, group: ClassicGroup, leader_id: str, assignments: dict[str, bytes]) -> None:
        generation = group.generation_id
        assignment = {mid: bytes(assignments.get(mid, b"")) for mid in group.members}
        missing = [mid for mid in group.members if mid not in assignments]
        if missing:
            log.warning("group %s generation %d: empty assignments for members %s", group.group_id,
                        generation, missing)

        def on_stored(error: ErrorCode) -> None:
            with group.lock:
                # A member may have joined meanwhile: act only if nothing moved on.
                if group.is_state(GroupState.COMPLETING_REBALANCE) and generation == group.generation_id:
                    if error != NONE:
                        self._reset_and_propagate_assignment_error(group, error)
                        self._maybe_prepare_rebalance(group, f"error storing assignment: {error.name}")
                    else:
                        for mid, m in group.members.items():
                            m.assignment = assignment.get(mid, b"")
                        self._propagate_assignment(group, NONE)
                        group.transition_to(GroupState.STABLE, self._time_ms())

        self._store_group(group, assignment, on_stored)

    # ==================================================================================
    # Heartbeat / LeaveGroup
    # ==================================================================================

    def heartbeat(self, group_id: str, member_id: str, group_instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        err = self._validate_group_status(group_id, "heartbeat")
        if err is not None:
            return NONE if err == E.COORDINATOR_LOAD_IN_PROGRESS else err
        group = self._get_group(group_id)
        if group is None or isinstance(group, ConsumerGroup):
            return E.UNKNOWN_MEMBER_ID
        with group.lock:
            if group.is_state(GroupState.DEAD):
                return E.COORDINATOR_NOT_AVAILABLE
            if group.is_static_member_fenced(group_instance_id, member_id):
                return E.FENCED_INSTANCE_ID
            if not group.has(member_id):
                return E.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
            if group.is_state(GroupState.EMPTY):
                return E.UNKNOWN_MEMBER_ID
            self._complete_and_schedule_next_heartbeat_expiration(group, group.get(member_id))
            if group.is_state(GroupState.PREPARING_REBALANCE):
                return E.REBALANCE_IN_PROGRESS
            return NONE

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """Remove members ((member_id, group_instance_id); member_id "" = by instance id)."""
        err = self._validate_group_status(group_id, "leave_group")
        if err is not None:
            return err, []
        group = self._get_group(group_id)
        if group is None or isinstance(group, ConsumerGroup):
            # (Kafka 3.9 lets classic members of a consumer group leave; it has none here.)
            return NONE, [(mid, iid, E.UNKNOWN_MEMBER_ID) for mid, iid in members]
        out = []
        with group.lock:
            if group.is_state(GroupState.DEAD):
                return E.COORDINATOR_NOT_AVAILABLE, []
            for mid, iid in members:
                if mid == "":
                    current = group.static_member_id(iid)
                    if current is not None:
                        self._remove_current_member(group, current)
                        out.append((mid, iid, NONE))
                    else:
                        out.append((mid, iid, E.UNKNOWN_MEMBER_ID))
                elif group.is_pending_member(mid):
                    self._remove_pending_member_and_update_group(group, mid)
                    self._heartbeat_purgatory.check_and_complete(member_key(group.group_id, mid))
                    out.append((mid, iid, NONE))
                elif group.is_static_member_fenced(iid, mid):
                    out.append((mid, iid, E.FENCED_INSTANCE_ID))
                elif group.has(mid):
                    self._remove_current_member(group, mid)
                    out.append((mid, iid, NONE))
                else:
                    out.append((mid, iid, E.UNKNOWN_MEMBER_ID))
        return NONE, out

    def _remove_current_member(self, group: ClassicGroup, member_id: str) -> None:
        member = group.get(member_id)
        self._remove_member_and_update_group(group, member, f"member {member_id} left")
        self._remove_heartbeat_for_leaving_member(group, member)

    # ==================================================================================
    # group records
    # ==================================================================================

    def _append(self, group_id: str, kvs: list, callback: Callable[[int, int], None]) -> None:
        self._runtime.append(self.partition_for(group_id), kvs, callback)

    def _group_record(self, group: ClassicGroup, assignment: dict[str, bytes]):
        members = []
        if group.protocol_name is not None:
            for m in group.members.values():
                members.append(MemberMetadataRecord(
                    member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                    client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms, subscription=m.metadata(group.protocol_name),
                    assignment=assignment.get(m.member_id, b"")))
        return storage.group_metadata_record(
            group.group_id, group.protocol_type or "", group.generation_id, group.protocol_name,
            group.leader_id if group.protocol_name is not None else None,
            group.current_state_timestamp_ms, members)

    def _store_group(self, group: ClassicGroup, assignment: dict[str, bytes],
                     callback: Callable[[ErrorCode], None]) -> None:
        """Append the group's metadata record; ``callback(error)`` once it is written."""
        record = self._group_record(group, assignment)
        self._append(group.group_id, [record],
                     lambda code, _base: callback(NONE if code == 0 else _append_error_for_group(code)))

    # ==================================================================================
    # OffsetCommit / OffsetFetch / OffsetDelete
    # ==================================================================================

    def commit_offsets(self, group_id: str, member_id: str, group_instance_id: str | None, generation_id: int,
                       offsets: dict[tuple, OffsetAndMetadata],
                       callback: Callable[[dict[tuple, ErrorCode]], None], api_version: int = 9) -> None:
        """Commit ``offsets`` ((topic, partition) → OffsetAndMetadata); ``callback`` gets per-partition errors."""
        def fail(err: ErrorCode) -> None:
            callback({tp: err for tp in offsets})

        err = self._validate_group_status(group_id, "offset_commit")
        if err is not None:
            fail(err)
            return
        group = self._get_group(group_id)
        if group is None:
            if generation_id < 0:
                # A simple (non-managed) group: created by its first commit.
                group = self._get_or_create_group(group_id, create=True)
            else:
                fail(E.GROUP_ID_NOT_FOUND if api_version >= 9 else E.ILLEGAL_GENERATION)
                return
        if isinstance(group, ConsumerGroup):
            with group.lock:
                err = self._validate_consumer_offset_commit(group, member_id, group_instance_id, generation_id,
                                                            api_version)
                if err is not None:
                    fail(err)
                    return
                self._store_offsets(group, offsets, callback)
            return
        with group.lock:
            err = self._validate_offset_commit(group, member_id, group_instance_id, generation_id)
            if err is not None:
                fail(err)
                return
            member = group.members.get(member_id)
            if member is not None and group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                self._complete_and_schedule_next_heartbeat_expiration(group, member)
            self._store_offsets(group, offsets, callback)

    def _validate_offset_commit(self, group: ClassicGroup, member_id: str, group_instance_id: str | None,
                                generation_id: int) -> ErrorCode | None:
        if group.is_state(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.is_state(GroupState.EMPTY):
            return None  # admin client or a consumer without group management
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group_instance_id is not None:
                current = group.static_member_id(group_instance_id)
                if current is None:
                    return E.UNKNOWN_MEMBER_ID
                if current != member_id:
                    return E.FENCED_INSTANCE_ID
            if not group.has(member_id):
                return E.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
        elif not group.is_state(GroupState.EMPTY):
            return E.UNKNOWN_MEMBER_ID  # only members may commit to a non-empty group
        if group.is_state(GroupState.COMPLETING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        return None

    def _store_offsets(self, group: ClassicGroup, offsets: dict[tuple, OffsetAndMetadata],
                       callback: Callable[[dict[tuple, ErrorCode]], None],
                       producer: tuple[int, int] | None = None, verification_guard=None) -> None:
        """Group lock held. Append the commits; apply them and answer once written.
        ``producer`` (producer id, epoch): a TxnOffsetCommit, written as that producer's
        transactional batch and pending until the transaction's marker."""
        errors: dict[tuple, ErrorCode] = {}
        valid: list[tuple[tuple, OffsetAndMetadata]] = []
        max_md = self.config.offset_metadata_max_bytes
        for tp, om in offsets.items():
            if om.metadata is not None and len(om.metadata.encode("utf-8")) > max_md:
                errors[tp] = E.OFFSET_METADATA_TOO_LARGE
            else:
                valid.append((tp, om))
        if not valid:
            callback(errors)
            return
        kvs = [storage.offset_commit_record(group.group_id, tp[0], tp[1], om.committed_offset, om.leader_epoch,
                                            om.metadata or "", om.commit_timestamp_ms, om.expire_timestamp_ms)
               for tp, om in valid]
        group.offsets.prepare(tp for tp, _ in valid)
        batch_fields = {}
        if producer is not None:
            batch_fields = self._txn_batch_fields(self.partition_for(group.group_id), *producer, len(kvs))

        def on_append(code: int, base_offset: int) -> None:
            with group.lock:
                if code == 0:
                    for i, (tp, om) in enumerate(valid):
                        if group.is_state(GroupState.DEAD):
                            group.offsets.fail(tp)
                        elif producer is not None:
                            group.offsets.fail(tp)  # no longer in flight: pending on the transaction
                            group.offsets.put_txn(producer[0], tp, om, base_offset + i)
                        else:
                            group.offsets.complete(tp, om, base_offset + i)
                    result = NONE
                else:
                    for tp, _ in valid:
                        group.offsets.fail(tp)
                    if producer is not None:
                        with self._lock:
                            self._txn_sequences.pop((self.partition_for(group.group_id), producer[0]), None)
                    result = _append_error_for_offsets(code)
                for tp, _ in valid:
                    errors[tp] = result
            callback(errors)

        self._runtime.append(self.partition_for(group.group_id), kvs, on_append,
                             verification_guard=verification_guard, **batch_fields)

    def _txn_batch_fields(self, partition: int, producer_id: int, producer_epoch: int, count: int) -> dict:
        """The producer fields of a TxnOffsetCommit batch. Its sequence continues the
        producer's earlier batches in this transaction (the partition's leader checks
        sequences of producer batches); a new epoch or transaction starts at 0."""
        with self._lock:
            epoch, seq = self._txn_sequences.get((partition, producer_id), (producer_epoch, 0))
            if epoch != producer_epoch:
                seq = 0
            self._txn_sequences[(partition, producer_id)] = (producer_epoch, (seq + count) & 0x7FFFFFFF)
        return {"producer_id": producer_id, "producer_epoch": producer_epoch, "base_sequence": seq,
                "transactional": True}

    # ==================================================================================
    # TxnOffsetCommit and the end of transactions
    # ==================================================================================

    def commit_transactional_offsets(self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
                                     group_instance_id: str | None, generation_id: int,
                                     offsets: dict[tuple, OffsetAndMetadata],
                                     callback: Callable[[dict[tuple, ErrorCode]], None],
                                     verification_guard=None) -> None:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): write the offsets as the
        producer's transactional batch; they become visible when the transaction's COMMIT
        marker reaches the group's partition (:meth:`on_transaction_completed`).
        ``verification_guard``: the partition's KIP-890 guard taken before the transaction
        coordinator confirmed it (the log refuses the batch if a marker cleared it)."""
        def fail(err: ErrorCode) -> None:
            callback({tp: err for tp in offsets})

        err = self._validate_group_status(group_id, "txn_offset_commit")
        if err is not None:
            return fail(err)
        group = self._get_or_create_group(group_id, create=True)
        with group.lock:
            if isinstance(group, ConsumerGroup):
                err = self._validate_consumer_offset_commit(group, member_id, group_instance_id, generation_id, 9)
                if err == E.STALE_MEMBER_EPOCH:
                    err = E.ILLEGAL_GENERATION  # a transactional commit's answer (ConsumerGroup 3.9)
            else:
                err = self._validate_txn_offset_commit(group, member_id, group_instance_id, generation_id)
            if err is not None:
                return fail(err)
            self._store_offsets(group, offsets, callback, producer=(producer_id, producer_epoch),
                                verification_guard=verification_guard)

    @staticmethod
    def _validate_txn_offset_commit(group: ClassicGroup, member_id: str, group_instance_id: str | None,
                                    generation_id: int) -> ErrorCode | None:
        """validateOffsetCommit with isTransactional: no member needed for a non-empty group."""
        if group.is_state(GroupState.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group_instance_id is not None:
                current = group.static_member_id(group_instance_id)
                if current is not None and current != member_id:
                    return E.FENCED_INSTANCE_ID
            if not group.has(member_id):
                return E.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return E.ILLEGAL_GENERATION
        return None

    def on_transaction_completed(self, producer_id: int, partitions: Iterable[tuple], is_commit: bool) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` was written to these ``__consumer_offsets``
        partitions: its pending transactional offsets there become committed or are
        dropped (Kafka's onTransactionCompleted). Called by the WriteTxnMarkers handler."""
        parts = {p for t, p in partitions if t == storage.OFFSETS_TOPIC}
        with self._lock:
            for p in parts:
                self._txn_sequences.pop((p, producer_id), None)
            groups = [g for gid, g in self._groups.items() if self.partition_for(gid) in parts]
        for group in groups:
            with group.lock:
                if producer_id in group.offsets.pending_txn:
                    n = group.offsets.complete_txn(producer_id, is_commit)
                    log.debug("[GroupId %s] %s %d transactional offsets of producer %d", group.group_id,
                              "committed" if is_commit else "aborted", n, producer_id)

    def fetch_offsets(self, group_id: str, partitions: list[tuple] | None, require_stable: bool = False
                      ) -> tuple[ErrorCode, dict[tuple, OffsetFetchPartition]]:
        """Committed offsets of ``partitions`` (None: all the group has). Unknown ones: offset -1."""
        err = self._validate_group_status(group_id, "offset_fetch")
        if err is not None:
            return err, {}
        group = self._get_group(group_id)
        if group is None:
            if partitions is None:
                return NONE, {}
            return NONE, {tp: OffsetFetchPartition(INVALID_OFFSET, -1, "", NONE) for tp in partitions}
        out: dict[tuple, OffsetFetchPartition] = {}
        with group.lock:
            if group.is_state(GroupState.DEAD):
                if partitions is None:
                    return NONE, {}
                return NONE, {tp: OffsetFetchPartition(INVALID_OFFSET, -1, "", NONE) for tp in partitions}
            store = group.offsets
            tps = list(store.committed) if partitions is None else partitions
            for tp in tps:
                if require_stable and store.has_pending(tp):
                    out[tp] = OffsetFetchPartition(INVALID_OFFSET, -1, "", E.UNSTABLE_OFFSET_COMMIT)
                    continue
                om = store.get(tp)
                if om is None:
                    out[tp] = OffsetFetchPartition(INVALID_OFFSET, -1, "", NONE)
                else:
                    out[tp] = OffsetFetchPartition(om.committed_offset, om.leader_epoch, om.metadata, NONE)
        return NONE, out

    def delete_offsets(self, group_id: str, partitions: list[tuple],
                       callback: Callable[[ErrorCode, dict[tuple, ErrorCode]], None]) -> None:
        """OffsetDelete (KIP-496): only for partitions of topics the group does not consume."""
        err = self._validate_group_status(group_id, "offset_delete")
        if err is not None:
            callback(err, {})
            return
        group = self._get_group(group_id)
        if group is None:
            callback(E.GROUP_ID_NOT_FOUND, {})
            return
        with group.lock:
            state = group.state
            if state is GroupState.DEAD or (isinstance(group, ConsumerGroup) and group.dead):
                callback(E.GROUP_ID_NOT_FOUND, {})
                return
            errors: dict[tuple, ErrorCode] = {}
            if isinstance(group, ConsumerGroup):
                # ConsumerGroup.validateOffsetDelete accepts; subscribed topics are kept.
                eligible = []
                for tp in partitions:
                    if group.is_subscribed_to_topic(tp[0]):
                        errors[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
                    else:
                        eligible.append(tp)
            elif state is GroupState.EMPTY:
                eligible = list(partitions)
            elif group.protocol_type == CONSUMER_PROTOCOL_TYPE:
                eligible = []
                for tp in partitions:
                    if group.is_subscribed_to_topic(tp[0]):
                        errors[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
                    else:
                        eligible.append(tp)
            else:
                callback(E.NON_EMPTY_GROUP, {})
                return
            removed = group.offsets.remove(eligible)
            for tp in eligible:
                errors[tp] = NONE
            if not removed:
                callback(NONE, errors)
                return
            kvs = [storage.offset_commit_tombstone(group.group_id, t, p) for t, p in removed]
            self._append(group.group_id, kvs, lambda code, _b: callback(NONE, errors))
        log.info("deleted %d offsets of group %s", len(removed), group_id)

    # ==================================================================================
    # DescribeGroups / ListGroups / DeleteGroups
    # ==================================================================================

    def describe_group(self, group_id: str) -> tuple[ErrorCode, GroupSummary]:
        err = self._validate_group_status(group_id, "describe_groups")
        if err is not None:
            return err, EMPTY_SUMMARY
        group = self._get_group(group_id)
        if group is None:
            return NONE, DEAD_GROUP
        if isinstance(group, ConsumerGroup):
            with group.lock:
                return NONE, (DEAD_GROUP if group.dead else self._consumer_group_summary(group))
        with group.lock:
            if group.is_state(GroupState.STABLE):
                protocol = group.protocol_name or ""
                members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                         m.metadata(protocol), m.assignment) for m in group.members.values()]
            else:
                protocol = ""
                members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host, b"", b"")
                           for m in group.members.values()]
            return NONE, GroupSummary(group.state.value, group.protocol_type or "", protocol, members)

    def list_groups(self, states_filter: Iterable[str] = (), types_filter: Iterable[str] = ()
                    ) -> tuple[ErrorCode, list[ListedGroup]]:
        """Groups served here; filters are case-insensitive (empty: all)."""
        if not self._runtime.is_active:
            return E.COORDINATOR_NOT_AVAILABLE, []
        states = {s.lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        loading = self._runtime.any_loading()
        with self._lock:
            groups = list(self._groups.values())
        out = []
        for g in groups:
            with g.lock:
                if isinstance(g, ConsumerGroup):
                    state = g.state
                    if g.dead or (states and state.lower() not in states) or (types and "consumer" not in types):
                        continue
                    out.append(ListedGroup(g.group_id, CONSUMER_GROUP_TYPE, state, CONSUMER_GROUP_TYPE))
                    continue
                if g.is_state(GroupState.DEAD):
                    continue
                if states and g.state.value.lower() not in states:
                    continue
                if types and g.group_type not in types:
                    continue
                out.append(ListedGroup(g.group_id, g.protocol_type or "", g.state.value, g.group_type))
        return (E.COORDINATOR_LOAD_IN_PROGRESS if loading else NONE), out

    def delete_groups(self, group_ids: list[str], callback: Callable[[dict[str, ErrorCode]], None]) -> None:
        """Delete Empty groups with their offsets; ``callback`` once the tombstones are written."""
        results: dict[str, ErrorCode] = {}
        eligible: list[ClassicGroup] = []
        for gid in group_ids:
            err = self._validate_group_status(gid, "delete_groups")
            if err is not None:
                results[gid] = err
                continue
            group = self._get_group(gid)
            if group is None:
                results[gid] = E.GROUP_ID_NOT_FOUND
                continue
            with group.lock:
                if isinstance(group, ConsumerGroup):
                    if group.dead:
                        results[gid] = E.GROUP_ID_NOT_FOUND
                    elif group.members:
                        results[gid] = E.NON_EMPTY_GROUP
                    else:
                        eligible.append(group)
                    continue
                if group.is_state(GroupState.DEAD):
                    results[gid] = E.GROUP_ID_NOT_FOUND
                elif group.is_state(GroupState.EMPTY):
                    group.transition_to(GroupState.DEAD, self._time_ms())
                    eligible.append(group)
                else:
                    results[gid] = E.NON_EMPTY_GROUP
        if not eligible:
            callback(results)
            return
        remaining = [len(eligible)]
        lock = threading.Lock()

        def done_one(gid: str) -> None:
            with lock:
                results[gid] = NONE
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                callback(results)

        for group in eligible:
            with group.lock:
                removed = group.offsets.remove_all()
                self._remove_group(group)
                kvs = [storage.offset_commit_tombstone(group.group_id, t, p) for t, p in removed]
                if isinstance(group, ConsumerGroup):
                    recs = group.tombstones()
                    for rec in recs:
                        group.replay(rec)
                    group.dead = True
                    kvs += [storage.encode_parsed(r) for r in recs]
                else:
                    kvs.append(storage.group_tombstone(group.group_id))
                self._append(group.group_id, kvs, lambda code, _b, gid=group.group_id: done_one(gid))
            log.info("group %s deleted with %d offsets", group.group_id, len(removed))

    # ==================================================================================
    # offset retention (KIP-211)
    # ==================================================================================

    def _schedule_retention(self) -> None:
        if not self._runtime.is_active:
            return
        task = _RetentionTask(self, self.config.offsets_retention_check_interval_ms)
        self._retention_task = task
        self._heartbeat_purgatory.timer.add(task)

    def cleanup_group_metadata(self, now_ms: int | None = None) -> int:
        """Expire offsets and delete Empty groups left without offsets; returns offsets removed.

        Expiry base (Kafka 3.9 ``offsetExpirationCondition``): a group with a
        protocol type expires only while Empty, counting from when it became
        Empty (or from each commit if that is unknown); a Stable consumer
        group expires offsets of topics it no longer subscribes to, from each
        commit; a simple group (no protocol type) from each commit.
        """
        now = self._time_ms() if now_ms is None else now_ms
        retention = self.config.offsets_retention_ms
        total = 0
        with self._lock:
            groups = list(self._groups.values())
        for group in groups:
            with group.lock:
                if isinstance(group, ConsumerGroup):
                    total += self._cleanup_consumer_group(group, now, retention)
                    continue
                if group.is_state(GroupState.DEAD):
                    continue
                base = self._expiration_base(group)
                removed = []
                if base is not None:
                    removed = group.offsets.remove(
                        group.offsets.expired(now, retention, base, group.is_subscribed_to_topic))
                kvs = [storage.offset_commit_tombstone(group.group_id, t, p) for t, p in removed]
                if group.is_state(GroupState.EMPTY) and not group.offsets.has_offsets():
                    group.transition_to(GroupState.DEAD, now)
                    self._remove_group(group)
                    kvs.append(storage.group_tombstone(group.group_id))
                    log.info("group %s transitioned to Dead in generation %d", group.group_id, group.generation_id)
                if kvs:
                    self._append(group.group_id, kvs, lambda code, _b: None)
                total += len(removed)
        if total:
            log.info("removed %d expired offsets", total)
        return total

    def _cleanup_consumer_group(self, group: ConsumerGroup, now: int, retention: int) -> int:
        """Group lock held. KIP-211 for a consumer group (``ConsumerGroup.offsetExpirationCondition``:
        from each commit, never for subscribed topics); an Empty group left without offsets is deleted."""
        if group.dead:
            return 0
        removed = group.offsets.remove(group.offsets.expired(now, retention, lambda om: om.commit_timestamp_ms,
                                                             group.is_subscribed_to_topic))
        kvs = [storage.offset_commit_tombstone(group.group_id, t, p) for t, p in removed]
        if not group.members and not group.offsets.has_offsets():
            recs = group.tombstones()
            for rec in recs:
                group.replay(rec)
            group.dead = True
            self._remove_group(group)
            kvs += [storage.encode_parsed(r) for r in recs]
            log.info("consumer group %s is empty and has no offsets: deleted", group.group_id)
        if kvs:
            self._append(group.group_id, kvs, lambda code, _b: None)
        return len(removed)

    @staticmethod
    def _expiration_base(group: ClassicGroup):
        if group.protocol_type is None:
            return lambda om: om.commit_timestamp_ms
        if group.is_state(GroupState.EMPTY):
            ts = group.current_state_timestamp_ms
            return (lambda om: ts) if ts >= 0 else (lambda om: om.commit_timestamp_ms)
        if group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.subscribed_topics is not None \
                and group.is_state(GroupState.STABLE):
            return lambda om: om.commit_timestamp_ms
        return None

    # ==================================================================================
    # KIP-848 consumer groups (Kafka 3.9 GroupMetadataManager, consumer-group half)
    # ==================================================================================

    def consumer_group_heartbeat(self, req: HeartbeatRequest,
                                 callback: Callable[[ErrorCode, str | None, HeartbeatOutcome | None], None]) -> None:
        """Handle a ConsumerGroupHeartbeat; ``callback(error, message, outcome)`` answers it once
        the heartbeat's records are written (outcome None on errors)."""
        try:
            validate_heartbeat(req, self.config.consumer_group_assignors)
        except ConsumerGroupError as e:
            callback(e.code, e.message, None)
            return
        err = self._validate_group_status(req.group_id, "consumer_group_heartbeat")
        if err is not None:
            callback(err, None, None)
            return
        try:
            if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                self._consumer_group_leave(req, callback)
            else:
                self._consumer_group_heartbeat(req, callback)
        except ConsumerGroupError as e:
            callback(e.code, e.message, None)

    def _consumer_group_for_heartbeat(self, group_id: str, create: bool) -> tuple[ConsumerGroup, list]:
        """Kafka's ``getOrMaybeCreateConsumerGroup``: the group, plus records to write first
        (the tombstone of an empty classic group this group id replaces)."""
        for _ in range(10):
            group = self._get_group(group_id)
            if group is None:
                if not create:
                    raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
                with self._lock:
                    if group_id not in self._groups:
                        group = self._groups[group_id] = ConsumerGroup(group_id)
                        return group, []
                continue
            if isinstance(group, ConsumerGroup):
                return group, []
            with group.lock:
                if not create:
                    raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.")
                if group.is_state(GroupState.DEAD):
                    continue
                if not group.is_state(GroupState.EMPTY):
                    # Online upgrade of a live classic group (group.consumer.migration.policy) is
                    # not supported: Kafka's answer with the policy disabled.
                    raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Cannot upgrade classic group {group_id} to "
                                             "consumer group because online upgrade is disabled.")
                # ``maybeDeleteEmptyClassicGroup``: the empty classic group goes, its offsets stay.
                new = ConsumerGroup(group_id)
                new.offsets = group.offsets
                group.transition_to(GroupState.DEAD, self._time_ms())
                with self._lock:
                    self._groups[group_id] = new
                log.info("[GroupId %s] Converted the empty classic group to a consumer group.", group_id)
                return new, [storage.group_tombstone(group_id)]
        raise ConsumerGroupError(E.COORDINATOR_NOT_AVAILABLE)

    def _topics_image(self):
        image = self._metadata_image()
        if image is None:
            return {}, -1
        return image.topics, image.epoch

    def _consumer_group_heartbeat(self, req: HeartbeatRequest, callback) -> None:
        group, pre = self._consumer_group_for_heartbeat(req.group_id, req.member_epoch == 0)
        with group.lock:
            if group.dead:
                callback(E.COORDINATOR_NOT_AVAILABLE, None, None)
                return
            topics, image_epoch = self._topics_image()
            cfg = self.config
            outcome = consumer_group_heartbeat(group, req, topics_image=topics, image_epoch=image_epoch,
                                               max_size=cfg.consumer_group_max_size,
                                               default_assignor=cfg.consumer_group_assignors[0])
            for mid in outcome.cancel_timers:
                self._cancel_consumer_member_timers(group, mid)
            self._schedule_consumer_timer(group, "session", outcome.member_id, -1,
                                          cfg.consumer_group_session_timeout_ms)
            if outcome.rebalance_timeout is not None:
                if outcome.rebalance_timeout[0] == "schedule":
                    _, epoch, timeout_ms = outcome.rebalance_timeout
                    self._schedule_consumer_timer(group, "rebalance", outcome.member_id, epoch, timeout_ms)
                else:
                    self._cancel_consumer_timer(group, "rebalance", outcome.member_id)

            def written(error: ErrorCode) -> None:
                if error != NONE:
                    callback(error, None, None)
                else:
                    callback(NONE, None, outcome)

            self._write_consumer_group(group, outcome.records, written, pre,
                                       metadata_image_epoch=outcome.metadata_image_epoch)

    def _consumer_group_leave(self, req: HeartbeatRequest, callback) -> None:
        group = self._get_group(req.group_id)
        if group is None:
            raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Consumer group {req.group_id} not found.")
        if not isinstance(group, ConsumerGroup):
            raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a consumer group.")
        with group.lock:
            if group.dead:
                raise ConsumerGroupError(E.GROUP_ID_NOT_FOUND, f"Consumer group {req.group_id} not found.")
            if req.instance_id is None:
                member = group.members.get(req.member_id)
                if member is None:
                    raise ConsumerGroupError(E.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of "
                                             f"group {req.group_id}.")
            else:
                member = group.static_member(req.instance_id)
                if member is None:
                    raise ConsumerGroupError(E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
                if member.member_id != req.member_id:
                    raise ConsumerGroupError(E.FENCED_INSTANCE_ID, f"Static member {req.member_id} with instance id "
                                             f"{req.instance_id} was fenced by member {member.member_id}.")
            if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                log.info("[GroupId %s] Static member %s with instance id %s temporarily left the consumer group.",
                         group.group_id, member.member_id, req.instance_id)
                records = static_member_temporary_leave(group, member)
                self._cancel_consumer_timer(group, "rebalance", member.member_id)
            else:
                log.info("[GroupId %s] Member %s left the consumer group.", group.group_id, member.member_id)
                topics, _ = self._topics_image()
                records = fence_member(group, member, topics)
                self._cancel_consumer_member_timers(group, member.member_id)
            outcome = HeartbeatOutcome(records, req.member_id, req.member_epoch)
            self._write_consumer_group(group, records, lambda error: callback(
                error, None, outcome if error == NONE else None))

    def _write_consumer_group(self, group: ConsumerGroup, records: list, callback: Callable[[ErrorCode], None],
                              pre_kvs: list | None = None, metadata_image_epoch: int | None = None) -> None:
        """Group lock held. Replay ``records`` into the group, append them, ``callback(error)`` once
        written. A failed append puts the group back as it was before (Kafka reverts its
        timeline snapshot; a later change already applied is reverted with it)."""
        snap = group.snapshot()
        for rec in records:
            group.replay(rec)
        if metadata_image_epoch is not None:
            group.metadata_image_epoch = metadata_image_epoch
        if group.dead:
            self._remove_group(group)
        kvs = list(pre_kvs or ()) + [storage.encode_parsed(r) for r in records]
        if not kvs:
            callback(NONE)
            return

        def on_append(code: int, _base: int) -> None:
            if code != 0:
                with group.lock:
                    log.warning("[GroupId %s] writing %d records failed (error %d); reverting", group.group_id,
                                len(kvs), code)
                    group.restore(snap)
                callback(_append_error_for_group(code))
            else:
                callback(NONE)

        self._append(group.group_id, kvs, on_append)

    # -- timers -------------------------------------------------------------------------------

    def _schedule_consumer_timer(self, group: ConsumerGroup, kind: str, member_id: str, epoch: int,
                                 delay_ms: int) -> None:
        self._cancel_consumer_timer(group, kind, member_id)
        task = _ConsumerGroupTimeout(self, group, kind, member_id, epoch, delay_ms)
        group.timers[(kind, member_id)] = task
        self._heartbeat_purgatory.timer.add(task)

    def _cancel_consumer_timer(self, group: ConsumerGroup, kind: str, member_id: str) -> None:
        task = group.timers.pop((kind, member_id), None)
        if task is not None:
            self._heartbeat_purgatory.timer.cancel(task)

    def _cancel_consumer_member_timers(self, group: ConsumerGroup, member_id: str) -> None:
        self._cancel_consumer_timer(group, "session", member_id)
        self._cancel_consumer_timer(group, "rebalance", member_id)

    def _on_consumer_group_timeout(self, task: "_ConsumerGroupTimeout") -> None:
        """A member's session or rebalance (revocation) timeout fired: fence it."""
        group = task.group
        with group.lock:
            if group.timers.get((task.kind, task.member_id)) is not task:
                return  # rescheduled or cancelled meanwhile
            del group.timers[(task.kind, task.member_id)]
            if group.dead:
                return
            member = group.members.get(task.member_id)
            if member is None:
                return
            if task.kind == "rebalance":
                if member.member_epoch != task.epoch:
                    return
                log.info("[GroupId %s] Member %s fenced from the group because it failed to transition from "
                         "epoch %d within %dms.", group.group_id, member.member_id, task.epoch, task.delay_ms)
            else:
                log.info("[GroupId %s] Member %s fenced from the group because its session expired.",
                         group.group_id, member.member_id)
            self._cancel_consumer_member_timers(group, member.member_id)
            topics, _ = self._topics_image()
            self._write_consumer_group(group, fence_member(group, member, topics), lambda error: None)

    # -- describe ----------------------------------------------------------------------------

    def consumer_group_describe(self, group_id: str) -> tuple[ErrorCode, str | None, dict | None]:
        """ConsumerGroupDescribe for one group: (error, message, description dict)."""
        err = self._validate_group_status(group_id, "consumer_group_describe")
        if err is not None:
            return err, None, None
        group = self._get_group(group_id)
        if group is None:
            return E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.", None
        if not isinstance(group, ConsumerGroup):
            return E.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group.", None
        with group.lock:
            if group.dead:
                return E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.", None
            return NONE, None, {
                "state": group.state, "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.preferred_server_assignor(self.config.consumer_group_assignors[0]),
                "members": [(m, group.target_for(m.member_id)) for m in group.members.values()],
            }

    def _consumer_group_summary(self, group: ConsumerGroup) -> GroupSummary:
        """DescribeGroups' view of a consumer group: the classic ConsumerProtocol encodings."""
        image_topics, _ = self._topics_image()
        names = {t.topic_id: t.name for t in group.subscription_metadata.values()}
        for t in image_topics.values() if hasattr(image_topics, "values") else ():
            names.setdefault(t.topic_id, t.name)
        members = []
        for m in group.members.values():
            sub = ConsumerProtocolSubscription(topics=sorted(m.subscribed_topic_names), user_data=None,
                                               owned_partitions=[], generation_id=-1, rack_id=m.rack_id)
            assignment = ConsumerProtocolAssignment(assigned_partitions=[
                CPATopicPartition(topic=names.get(tid, str(tid)), partitions=sorted(ps))
                for tid, ps in sorted(m.assigned_partitions.items(), key=lambda kv: names.get(kv[0], str(kv[0])))],
                user_data=None)
            members.append(MemberSummary(m.member_id, m.instance_id, m.client_id, m.client_host,
                                         struct.pack(">h", 3) + sub.encode(3),
                                         struct.pack(">h", 3) + assignment.encode(3)))
        return GroupSummary(group.state, CONSUMER_GROUP_TYPE, "", members)

    def _validate_consumer_offset_commit(self, group: ConsumerGroup, member_id: str, group_instance_id: str | None,
                                         member_epoch: int, api_version: int) -> ErrorCode | None:
        """``ConsumerGroup.validateOffsetCommit`` (3.9)."""
        if group.dead:
            return E.COORDINATOR_NOT_AVAILABLE
        if member_epoch < 0 and not group.members:
            return None  # admin client or a consumer without group management
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        if api_version < 9:
            return E.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return E.STALE_MEMBER_EPOCH
        return None



def build_group_coordinator(broker) -> GroupCoordinator:
    """Create ``__consumer_offsets`` if needed and start a coordinator over it (broker start-up).

    Needs ``broker.config`` (KafkaConfig), ``broker.topic_manager.create_internal``,
    ``broker.replica_manager`` and ``broker.node_id``. Single node: this broker leads
    every partition, so all of them load (in the background: requests for a group whose
    partition is still loading get COORDINATOR_LOAD_IN_PROGRESS and retry).
    """
    cfg = GroupConfig.from_kafka_config(broker.config)
    topic_configs = {
        "cleanup.policy": "compact",
        "compression.type": "producer",
        "segment.bytes": str(broker.config["offsets.topic.segment.bytes"]),
    }
    # a KRaft broker: created through the controller on first FindCoordinator, loaded per partition led
    on_demand = getattr(broker, "offsets_topic_on_demand", False)
    topic = broker.metadata.image.topics.get(storage.OFFSETS_TOPIC) if on_demand else \
        broker.topic_manager.create_internal(storage.OFFSETS_TOPIC, cfg.offsets_topic_num_partitions, topic_configs)
    if topic is not None and topic.num_partitions != cfg.offsets_topic_num_partitions:
        # The topic outlives the setting (Kafka: the existing topic wins).
        cfg = GroupConfig(**{**cfg.__dict__, "offsets_topic_num_partitions": topic.num_partitions})
    offsets_log = storage.ReplicaOffsetsLog(broker.replica_manager, broker.config["offsets.commit.timeout.ms"])
    coordinator = GroupCoordinator(cfg, offsets_log, broker_id=broker.node_id,
                                   metadata_image=lambda: broker.metadata.image)
    coordinator.startup(() if on_demand else range(cfg.offsets_topic_num_partitions), background=True)
    return coordinator
