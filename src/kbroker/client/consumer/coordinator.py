"""GroupCoordinator: the consumer side of Kafka's classic group protocol and offsets
(Kafka's ConsumerCoordinator / AbstractCoordinator).

Coordinator discovery: FindCoordinator(key=group.id) to any broker; the coordinator gets
its own connection under node id 2**31-1-node_id (group traffic never queues behind
fetches). Joining: JoinGroup (retried once with the member id the broker hands out,
MEMBER_ID_REQUIRED, KIP-394) -> the leader runs the assignor (range / roundrobin) over
every member's ConsumerProtocolSubscription -> SyncGroup -> our
ConsumerProtocolAssignment -> Fetcher.assign. Heartbeats go out every
heartbeat.interval.ms from poll() and from a daemon thread while poll is not called;
REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID trigger a rejoin.
LeaveGroup on close/unsubscribe.

Consumer protocol payloads are ``int16 version`` + the struct at that version
(Kafka's ConsumerProtocol); we write version 0 and read any version (decoding newer ones
at 3, the highest we know, which Kafka's format allows).

Offsets: OffsetCommit with the current generation/member (generation -1 and member ""
for assign()-only consumers) and OffsetFetch; retriable coordinator errors rediscover
the coordinator and retry until the timeout.

Thread-safety: called from the consumer's thread; the heartbeat thread only sends
heartbeats and reads ``self`` flags, using the NetworkClient's lock.
"""
from __future__ import annotations

import struct
import threading
import time
from typing import NamedTuple

from kbroker.client import errors as E
from kbroker.client.consumer.assignors import ASSIGNORS
from kbroker.client.metadata import BrokerMetadata, TopicPartition
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import consumer_protocol_assignment as cpa
from kbroker.protocol.messages import consumer_protocol_subscription as cps
from kbroker.protocol.messages.find_coordinator import FindCoordinatorRequest
from kbroker.protocol.messages.heartbeat import HeartbeatRequest
from kbroker.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
from kbroker.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity
from kbroker.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from kbroker.protocol.messages.offset_fetch import OffsetFetchRequest, OffsetFetchRequestTopic
from kbroker.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment

_I16 = struct.Struct(">h")
_COORDINATOR_ERRORS = frozenset((ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE))
_REJOIN_ERRORS = frozenset((ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION,
                            ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID))


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


def encode_subscription(topics) -> bytes:
    return _I16.pack(0) + cps.ConsumerProtocolSubscription(topics=list(topics), user_data=None).encode(0)


def decode_subscription(buf) -> list[str]:
    v = _I16.unpack_from(buf, 0)[0]
    return list(cps.ConsumerProtocolSubscription.decode(memoryview(buf)[2:], min(max(v, 0), 3)).topics)


def encode_assignment(assigned: dict[str, list[int]]) -> bytes:
    return _I16.pack(0) + cpa.ConsumerProtocolAssignment(
        assigned_partitions=[cpa.TopicPartition(topic=t, partitions=p) for t, p in sorted(assigned.items())],
        user_data=None).encode(0)


def decode_assignment(buf) -> list[TopicPartition]:
    if not buf:
        return []
    v = _I16.unpack_from(buf, 0)[0]
    a = cpa.ConsumerProtocolAssignment.decode(memoryview(buf)[2:], min(max(v, 0), 3))
    return [TopicPartition(t.topic, p) for t in a.assigned_partitions for p in t.partitions]


class GroupCoordinator:
    def __init__(self, config, client, metadata, consumer):
        self.client = client
        self.metadata = metadata
        self.consumer = consumer
        self.group_id = config["group.id"]
        self.group_instance_id = config["group.instance.id"]
        self.session_timeout_ms = config["session.timeout.ms"]
        self.rebalance_timeout_ms = config["max.poll.interval.ms"]
        self.heartbeat_interval_s = config["heartbeat.interval.ms"] / 1000.0
        self.retry_backoff_s = config["retry.backoff.ms"] / 1000.0
        self.assignors = config["partition.assignment.strategy"]
        self.coordinator_id: int | None = None
        self.member_id = ""
        self.generation = -1
        self.protocol = None
        self.topics: list[str] = []
        self.need_rejoin = False
        self._revoking = False          # inside on_revoke during _join
        self.on_assign = self.on_revoke = None
        self.last_heartbeat = 0.0
        self.heartbeat_in_flight = False
        self._async_results: list = []
        self._closed = False
        self._last_poll = time.monotonic()
        self._hb_thread: threading.Thread | None = None

    # -- coordinator --------------------------------------------------------------------
    def ensure_coordinator(self, deadline: float) -> int:
        while self.coordinator_id is None or self.client.connection_failed(self.coordinator_id):
            node = self.client.least_loaded_node()
            left = deadline - time.monotonic()
            if left <= 0:
                raise E.KafkaTimeoutError(f"Timeout while finding the coordinator of group {self.group_id}")
            if node is None:
                self.client.poll(min(left, 0.1))
                continue
            try:
                resp = self.client.request(node, ApiKey.FIND_COORDINATOR,
                                           FindCoordinatorRequest(key=self.group_id, key_type=0), left)
            except E.KafkaConnectionError:
                continue
            if resp.error_code:
                err = E.for_code(resp.error_code, resp.error_message)
                if not err.retriable:
                    raise err
                self.client.poll(min(self.retry_backoff_s, max(0.0, deadline - time.monotonic())))
                continue
            cid = (1 << 31) - 1 - resp.node_id
            self.metadata.extra_nodes[cid] = BrokerMetadata(cid, resp.host, resp.port, None)
            old = self.client.conns.get(cid)
            if old is not None and (old.host, old.port) != (resp.host, resp.port):
                self.client._close(old, E.KafkaConnectionError("coordinator moved"))
                del self.client.conns[cid]
            self.coordinator_id = cid
        return self.coordinator_id

    def _coordinator_request(self, api_key, build, deadline: float):
        """Send to the coordinator, rediscovering it on NOT_COORDINATOR-style errors.
        ``build()`` makes the request; returns the response (top-level errors are the
        caller's)."""
        while True:
            node = self.ensure_coordinator(deadline)
            left = deadline - time.monotonic()
            if left <= 0:
                raise E.KafkaTimeoutError(f"{ApiKey(api_key).name} to the group coordinator timed out")
            try:
                return self.client.request(node, api_key, build(), left)
            except E.KafkaConnectionError:
                self.coordinator_id = None

    def mark_coordinator_dead(self) -> None:
        self.coordinator_id = None

    # -- offsets ------------------------------------------------------------------------
    def _commit_request(self, offsets: dict) -> OffsetCommitRequest:
        topics: dict[str, list] = {}
        for tp, om in offsets.items():
            topics.setdefault(tp.topic, []).append(OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=om.offset,
                committed_leader_epoch=om.leader_epoch, committed_metadata=om.metadata))
        stable = self.generation >= 0 and (not self.need_rejoin or self._revoking)
        return OffsetCommitRequest(group_id=self.group_id,
                                   generation_id_or_member_epoch=self.generation if stable else -1,
                                   member_id=self.member_id if stable else "",
                                   group_instance_id=self.group_instance_id if stable else None,
                                   topics=[OffsetCommitRequestTopic(name=t, partitions=p)
                                           for t, p in topics.items()])

    def _commit_errors(self, resp) -> tuple[Exception | None, bool]:
        """(first error, retriable-by-rediscovery)."""
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    code = ErrorCode(p.error_code)
                    if code in _COORDINATOR_ERRORS:
                        self.coordinator_id = None
                        return E.for_code(code), True
                    if code in _REJOIN_ERRORS:
                        self.need_rejoin = True
                        return E.CommitFailedError(
                            "Commit cannot be completed since the group has already rebalanced "
                            "and assigned the partitions to another member.", code), False
                    return E.for_code(code), code.retriable
        return None, False

    def commit_sync(self, offsets: dict, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            resp = self._coordinator_request(ApiKey.OFFSET_COMMIT, lambda: self._commit_request(offsets), deadline)
            err, retry = self._commit_errors(resp)
            if err is None:
                return
            if not retry or time.monotonic() >= deadline:
                raise err
            self.client.poll(self.retry_backoff_s)

    def commit_async(self, offsets: dict, callback) -> None:
        node = self.coordinator_id
        if node is None or not self.client.is_ready(node):
            try:
                node = self.ensure_coordinator(time.monotonic() + 5.0)
                self.client.await_ready(node, time.monotonic() + 5.0)
            except E.KafkaError as e:
                if callback is not None:
                    callback(offsets, e)
                return

        def done(resp, exc):
            if exc is None:
                exc, _ = self._commit_errors(resp)
            else:
                self.coordinator_id = None
            if callback is not None:
                self._async_results.append((callback, offsets, exc))
        self.client.send(node, ApiKey.OFFSET_COMMIT, self._commit_request(offsets), done)

    def fetch_committed(self, tps, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        topics: dict[str, list] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)
        build = lambda: OffsetFetchRequest(group_id=self.group_id, require_stable=False, topics=[
            OffsetFetchRequestTopic(name=t, partition_indexes=p) for t, p in topics.items()])
        while True:
            resp = self._coordinator_request(ApiKey.OFFSET_FETCH, build, deadline)
            code = resp.error_code
            if code in _COORDINATOR_ERRORS or code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                if code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                    self.coordinator_id = None
                if time.monotonic() >= deadline:
                    raise E.for_code(code)
                self.client.poll(self.retry_backoff_s)
                continue
            if code:
                raise E.for_code(code)
            out = {}
            for t in resp.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    if p.error_code:
                        if p.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                            out[tp] = None
                            continue
                        raise E.for_code(p.error_code)
                    out[tp] = (OffsetAndMetadata(p.committed_offset, p.metadata or "",
                                                 getattr(p, "committed_leader_epoch", -1))
                               if p.committed_offset >= 0 else None)
            return {tp: out.get(tp) for tp in tps}

    # -- membership ---------------------------------------------------------------------
    def subscribe(self, topics, on_assign, on_revoke) -> None:
        self.topics = list(topics)
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.need_rejoin = True

    def time_to_next_heartbeat(self) -> float:
        if self.generation < 0:
            return self.retry_backoff_s
        return max(0.0, self.last_heartbeat + self.heartbeat_interval_s - time.monotonic())

    def poll(self, deadline: float) -> None:
        """Called from Consumer.poll: deliver async commit results, join if needed,
        heartbeat when due."""
        self._last_poll = time.monotonic()
        results, self._async_results = self._async_results, []
        for cb, offsets, exc in results:
            cb(offsets, exc)
        if not self.topics:
            return
        if self.need_rejoin or self.generation < 0:
            self._join(max(deadline, time.monotonic() + self.session_timeout_ms / 1000.0))
        self._maybe_heartbeat()
        if self._hb_thread is None:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                               name=f"kbroker-heartbeat-thread | {self.group_id}")
            self._hb_thread.start()

    def _metadata_partitions(self, topics, deadline) -> dict[str, int]:
        self.metadata.add_topics(*topics)
        if any(t not in self.metadata.cluster.topics for t in topics):
            try:
                self.client.await_metadata(max(0.1, min(5.0, deadline - time.monotonic())))
            except E.KafkaTimeoutError:
                pass
        return {t: len(self.metadata.cluster.topics[t]) for t in topics if t in self.metadata.cluster.topics}

    def _join(self, deadline: float) -> None:
        if self.on_revoke is not None and self.consumer.fetcher.assignment:
            # the generation we hold stays valid until JoinGroup completes: commits made in
            # on_revoke use it (Kafka's onJoinPrepare), else the coordinator refuses them
            self._revoking = True
            try:
                self.on_revoke(self.consumer, sorted(self.consumer.fetcher.assignment))
            finally:
                self._revoking = False
        meta = encode_subscription(self.topics)
        while True:
            resp = self._coordinator_request(ApiKey.JOIN_GROUP, lambda: JoinGroupRequest(
                group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
                group_instance_id=self.group_instance_id, protocol_type="consumer",
                protocols=[JoinGroupRequestProtocol(name=a, metadata=meta) for a in self.assignors]),
                deadline)
            code = resp.error_code
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            if code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if code in _COORDINATOR_ERRORS or code in (ErrorCode.REBALANCE_IN_PROGRESS,
                                                         ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
                if code in _COORDINATOR_ERRORS:
                    self.coordinator_id = None
                if time.monotonic() >= deadline:
                    raise E.for_code(code)
                self.client.poll(self.retry_backoff_s)
                continue
            if code:
                raise E.for_code(code)
            self.member_id = resp.member_id
            self.generation = resp.generation_id
            self.protocol = resp.protocol_name
            assignments = []
            if resp.leader == resp.member_id:
                members = {m.member_id: decode_subscription(m.metadata) for m in resp.members}
                all_topics = sorted({t for ts in members.values() for t in ts})
                parts = self._metadata_partitions(all_topics, deadline)
                result = ASSIGNORS[self.protocol](members, parts)
                assignments = [SyncGroupRequestAssignment(member_id=m, assignment=encode_assignment(a))
                               for m, a in result.items()]
            sresp = self._coordinator_request(ApiKey.SYNC_GROUP, lambda: SyncGroupRequest(
                group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
                group_instance_id=self.group_instance_id, protocol_type="consumer",
                protocol_name=self.protocol, assignments=assignments), deadline)
            if sresp.error_code:
                code = ErrorCode(sresp.error_code)
                if code in _REJOIN_ERRORS or code in _COORDINATOR_ERRORS:
                    if code in _COORDINATOR_ERRORS:
                        self.coordinator_id = None
                    if code == ErrorCode.UNKNOWN_MEMBER_ID:
                        self.member_id = ""
                    if time.monotonic() >= deadline:
                        raise E.for_code(code)
                    continue
                raise E.for_code(code)
            tps = decode_assignment(sresp.assignment)
            self.need_rejoin = False
            self.last_heartbeat = time.monotonic()
            self.consumer.fetcher.assign(tps)
            self.metadata.set_topics(set(self.topics))
            if self.on_assign is not None:
                self.on_assign(self.consumer, tps)
            return

    def _maybe_heartbeat(self) -> None:
        if self.generation < 0 or self.need_rejoin or self.heartbeat_in_flight:
            return
        if time.monotonic() < self.last_heartbeat + self.heartbeat_interval_s:
            return
        node = self.coordinator_id
        if node is None or not self.client.is_ready(node):
            if node is not None:
                self.client.maybe_connect(node)
            return
        self.heartbeat_in_flight = True
        self.last_heartbeat = time.monotonic()

        def done(resp, exc):
            self.heartbeat_in_flight = False
            if exc is not None:
                self.coordinator_id = None
                return
            code = resp.error_code
            if code in _REJOIN_ERRORS:
                if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                    self.member_id = ""
                    self.generation = -1
                self.need_rejoin = True
            elif code in _COORDINATOR_ERRORS:
                self.coordinator_id = None
        self.client.send(node, ApiKey.HEARTBEAT, HeartbeatRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.group_instance_id), done)

    def _heartbeat_loop(self) -> None:
        while not self._closed:
            time.sleep(min(self.heartbeat_interval_s, 1.0))
            if self._closed:
                return
            if time.monotonic() - self._last_poll < self.heartbeat_interval_s:
                continue   # the application is polling; poll() heartbeats
            try:
                with self.client.lock:
                    if self.client.closed or self._closed:
                        return
                    self._maybe_heartbeat()
                    self.client.poll(0)
            except Exception:
                pass

    def leave_group(self) -> None:
        if self.generation < 0 or self.coordinator_id is None or not self.member_id:
            self._reset()
            return
        try:
            v = self.client.api_version(self.coordinator_id, ApiKey.LEAVE_GROUP) or 0
            if v >= 3:
                req = LeaveGroupRequest(group_id=self.group_id, members=[MemberIdentity(
                    member_id=self.member_id, group_instance_id=self.group_instance_id)])
            else:
                req = LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id)
            self.client.request(self.coordinator_id, ApiKey.LEAVE_GROUP, req, 5.0)
        except E.KafkaError:
            pass
        self._reset()

    def _reset(self) -> None:
        self.member_id = ""
        self.generation = -1
        self.need_rejoin = bool(self.topics)

    def close(self) -> None:
        if self.topics:
            self.leave_group()
        self._closed = True
