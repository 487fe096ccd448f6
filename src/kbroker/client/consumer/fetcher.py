"""Fetcher: Fetch requests, buffered responses, and positions (Kafka's Fetcher /
SubscriptionState, classic consumer).

Every assigned partition has a ``PartitionState``: ``position`` (the offset of the next
record to hand to the application; None until reset or seek), a pending reset strategy,
``paused``, and the last high_watermark seen. ``send_fetches`` sends one FetchRequest
(sessionless: session_id 0, epoch -1) to each leader that has fetchable partitions and
no fetch in flight; a partition is fetchable when it has a position, is not paused and
has fewer than ``MAX_BUFFERED_FETCHES`` buffered responses; it asks for the offset after
its buffered data, so the next fetch is in flight while the application works through
the previous one (librdkafka-style prefetch, bounded to 2 x max.partition.fetch.bytes
per partition). Responses are buffered as ``CompletedFetch``es and turned into
ConsumerRecords lazily by ``fetched_records``, which advances positions; a buffered fetch
whose fetch offset no longer equals the position (after a seek) is dropped.

Control batches (transaction markers) are skipped; their offsets still advance the
position. ``isolation.level=read_committed``: the broker returns data below the last
stable offset plus the aborted transactions (producer id, first offset) in range;
batches of an aborted transaction are skipped as Kafka's CompletedFetch does (a
producer is aborted from its transaction's first offset until its ABORT marker), their
offsets still advancing the position. OFFSET_OUT_OF_RANGE resets the position by auto.offset.reset (or raises
OffsetOutOfRangeError when it is "none"); leader errors refresh metadata.

Not thread-safe: the application thread that calls Consumer.poll owns it.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from kbroker.client import errors as E
from kbroker.client.metadata import TopicPartition
from kbroker.kernels import consumer_records, records
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from kbroker.protocol.messages.list_offsets import (
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
_REFRESH_CODES = frozenset((ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH,
                            ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR,
                            ErrorCode.REPLICA_NOT_AVAILABLE))


#: completed fetches buffered per partition before we stop fetching it
MAX_BUFFERED_FETCHES = 2


class ConsumerRecord(NamedTuple):
    """One record handed to the application. timestamp_type: 0 CreateTime, 1 LogAppendTime."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: object
    value: object
    headers: list
    leader_epoch: int = -1


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int = -1


class PartitionState:
    __slots__ = ("position", "next_fetch", "reset_strategy", "paused", "high_watermark",
                 "log_start_offset", "last_stable_offset", "leader_epoch")

    def __init__(self):
        self.position: int | None = None
        #: offset the next Fetch asks for: the end of the buffered data, None = position
        self.next_fetch: int | None = None
        self.reset_strategy: int | None = None   # EARLIEST_TIMESTAMP / LATEST_TIMESTAMP
        self.paused = False
        self.high_watermark = -1
        self.log_start_offset = -1
        self.last_stable_offset = -1
        self.leader_epoch = -1


class CompletedFetch:
    """One partition's records from one FetchResponse; ``batch_index`` / ``record_index``
    point at the next record to hand out (so max.poll.records slices cost O(slice))."""

    __slots__ = ("tp", "fetch_offset", "batches", "batch_index", "record_index", "error", "skip")

    def __init__(self, tp, fetch_offset, batches, error=None, skip=None):
        self.tp = tp
        self.fetch_offset = fetch_offset
        self.batches = batches
        self.batch_index = 0
        self.record_index = -1    # -1: not positioned inside the current batch yet
        self.error = error
        #: read_committed: indexes of the batches of aborted transactions (None: none)
        self.skip = skip


def aborted_batch_indexes(batches, aborted) -> set | None:
    """Kafka's CompletedFetch filter for read_committed: the indexes of ``batches`` that
    belong to an aborted transaction. ``aborted``: the response's (producer_id,
    first_offset) list. A producer counts as aborted from the first offset of one of its
    aborted transactions until its ABORT marker."""
    if not aborted:
        return None
    pending = sorted((a.first_offset, a.producer_id) for a in aborted)
    k = 0
    aborting: set = set()
    skip = set()
    for i, b in enumerate(batches):
        if not b.is_transactional:
            continue
        last = b.next_offset - 1
        while k < len(pending) and pending[k][0] <= last:
            aborting.add(pending[k][1])
            k += 1
        pid = b.producer_id
        if b.is_control:
            recs = b.records
            if recs and _is_abort_marker(recs[0].key):
                aborting.discard(pid)
        elif pid in aborting:
            skip.add(i)
    return skip or None


def _is_abort_marker(key) -> bool:
    return key is not None and len(key) >= 4 and key[2] == 0 and key[3] == 0   # ControlRecordType ABORT


_new_tuple = tuple.__new__
_build_records = consumer_records.build


class Fetcher:
    def __init__(self, config, client, metadata):
        self.client = client
        self.metadata = metadata
        self.min_bytes = config["fetch.min.bytes"]
        self.max_bytes = config["fetch.max.bytes"]
        self.max_wait_ms = config["fetch.max.wait.ms"]
        self.partition_max_bytes = config["max.partition.fetch.bytes"]
        self.check_crcs = config["check.crcs"]
        self.isolation_level = 1 if config["isolation.level"] == "read_committed" else 0
        self.request_timeout_s = config["request.timeout.ms"] / 1000.0
        reset = config["auto.offset.reset"]
        self.default_reset = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}.get(reset)
        self.key_deserializer = config["key.deserializer"]
        self.value_deserializer = config["value.deserializer"]
        self.assignment: dict[TopicPartition, PartitionState] = {}
        self.completed: deque[CompletedFetch] = deque()
        self.nodes_in_flight: set[int] = set()
        self.resets_in_flight: set[TopicPartition] = set()
        self.pending_error: Exception | None = None

    # -- assignment / positions ---------------------------------------------------------
    def assign(self, tps) -> None:
        new = {}
        for tp in tps:
            new[tp] = self.assignment.get(tp) or PartitionState()
        self.assignment = new
        self.completed = deque(c for c in self.completed if c.tp in new)

    def state(self, tp) -> PartitionState:
        st = self.assignment.get(tp)
        if st is None:
            raise E.IllegalStateError(f"No current assignment for partition {tp.topic}-{tp.partition}")
        return st

    def seek(self, tp, offset: int) -> None:
        st = self.state(tp)
        st.position = offset
        st.next_fetch = None
        st.reset_strategy = None
        self.drop_buffered(tp)

    def request_reset(self, tp, strategy: int) -> None:
        st = self.state(tp)
        st.position = None
        st.next_fetch = None
        st.reset_strategy = strategy
        self.drop_buffered(tp)

    def drop_buffered(self, tp) -> None:
        if any(c.tp == tp for c in self.completed):
            self.completed = deque(c for c in self.completed if c.tp != tp)

    def missing_positions(self) -> list[TopicPartition]:
        return [tp for tp, st in self.assignment.items() if st.position is None and st.reset_strategy is None]

    def apply_default_reset(self, tps) -> None:
        for tp in tps:
            if self.default_reset is None:
                raise E.NoOffsetForPartitionError(
                    f"Undefined offset with no reset policy for partitions: {tp.topic}-{tp.partition}")
            self.assignment[tp].reset_strategy = self.default_reset

    # -- offset lookups (ListOffsets) ---------------------------------------------------
    def send_list_offsets(self, timestamps: dict, callback) -> list:
        """ListOffsets to each partition's leader; callback(tp, OffsetAndTimestamp|None, exc)
        per partition. Returns the partitions skipped (leader unknown or not connected
        yet); the caller retries those after a poll."""
        cluster = self.metadata.cluster
        by_node: dict[int, dict[str, list]] = {}
        tps_by_node: dict[int, list] = {}
        missing = []
        for tp, ts in timestamps.items():
            leader = cluster.leader_for(tp)
            if leader < 0 or not self.client.is_ready(leader):
                if leader >= 0:
                    self.client.maybe_connect(leader)
                else:
                    self.metadata.add_topics(tp.topic)
                    self.metadata.request_update()
                missing.append(tp)
                continue
            by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(
                ListOffsetsPartition(partition_index=tp.partition, current_leader_epoch=-1, timestamp=ts))
            tps_by_node.setdefault(leader, []).append(tp)
        for node, topics in by_node.items():
            v = self.client.api_version(node, ApiKey.LIST_OFFSETS)
            req = ListOffsetsRequest(replica_id=-1, isolation_level=self.isolation_level if v >= 2 else 0,
                                     topics=[ListOffsetsTopic(name=t, partitions=p) for t, p in topics.items()])
            tps = tps_by_node[node]

            def done(resp, exc, tps=tps):
                if exc is not None:
                    for tp in tps:
                        callback(tp, None, exc)
                    return
                seen = set()
                for t in resp.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        seen.add(tp)
                        if p.error_code:
                            if p.error_code in _REFRESH_CODES:
                                self.metadata.request_update()
                            callback(tp, None, E.for_code(p.error_code))
                        elif p.offset < 0:
                            callback(tp, None, None)    # no record at/after that timestamp
                        else:
                            callback(tp, OffsetAndTimestamp(p.offset, p.timestamp, p.leader_epoch), None)
                for tp in tps:
                    if tp not in seen:
                        callback(tp, None, E.KafkaError(f"no ListOffsets result for {tp}",
                                                        ErrorCode.UNKNOWN_SERVER_ERROR))
            self.client.send(node, ApiKey.LIST_OFFSETS, req, done)
        return missing

    def reset_positions(self) -> None:
        """Send ListOffsets for partitions awaiting a reset (asynchronous)."""
        todo = {tp: st.reset_strategy for tp, st in self.assignment.items()
                if st.reset_strategy is not None and tp not in self.resets_in_flight}
        if not todo:
            return

        def done(tp, oat, exc):
            self.resets_in_flight.discard(tp)
            st = self.assignment.get(tp)
            if st is None or st.reset_strategy is None:
                return
            if exc is not None:
                if not getattr(exc, "retriable", False):
                    self.pending_error = exc
                return
            if oat is not None:
                st.position = oat.offset
                st.reset_strategy = None
        for tp in todo:
            self.resets_in_flight.add(tp)
        for tp in self.send_list_offsets(todo, done):   # skipped: retried on a later poll
            self.resets_in_flight.discard(tp)

    # -- fetching -----------------------------------------------------------------------
    def _fetchable(self):
        buffered: dict = {}
        for c in self.completed:
            buffered[c.tp] = buffered.get(c.tp, 0) + 1
        for tp, st in self.assignment.items():
            if st.position is not None and not st.paused and buffered.get(tp, 0) < MAX_BUFFERED_FETCHES:
                yield tp, st

    def send_fetches(self) -> int:
        cluster = self.metadata.cluster
        by_node: dict[int, dict[str, list]] = {}
        offsets: dict[int, dict] = {}
        for tp, st in self._fetchable():
            fo = st.position if st.next_fetch is None else st.next_fetch
            leader = cluster.leader_for(tp)
            if leader < 0:
                self.metadata.add_topics(tp.topic)
                self.metadata.request_update()
                continue
            if leader in self.nodes_in_flight:
                continue
            if not self.client.is_ready(leader):
                self.client.maybe_connect(leader)
                continue
            by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(
                FetchPartition(partition=tp.partition, current_leader_epoch=-1, fetch_offset=fo,
                               last_fetched_epoch=-1, log_start_offset=-1,
                               partition_max_bytes=self.partition_max_bytes))
            offsets.setdefault(leader, {})[tp] = fo
        for node, topics in by_node.items():
            req = FetchRequest(replica_id=-1, max_wait_ms=self.max_wait_ms, min_bytes=self.min_bytes,
                               max_bytes=self.max_bytes, isolation_level=self.isolation_level,
                               session_id=0, session_epoch=-1,
                               topics=[FetchTopic(topic=t, partitions=p) for t, p in topics.items()],
                               forgotten_topics_data=[], rack_id="")
            self.nodes_in_flight.add(node)
            fetch_offsets = offsets[node]

            def done(resp, exc, node=node, fetch_offsets=fetch_offsets):
                self.nodes_in_flight.discard(node)
                if exc is not None:
                    return      # the connection was closed; metadata refresh is requested
                self._on_fetch_response(resp, fetch_offsets)
            self.client.send(node, ApiKey.FETCH, req, done,
                             timeout_s=self.request_timeout_s + self.max_wait_ms / 1000.0)
        return len(by_node)

    def _on_fetch_response(self, resp, fetch_offsets) -> None:
        if resp.error_code:
            if resp.error_code in _REFRESH_CODES:
                self.metadata.request_update()
            return
        for t in resp.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition_index)
                fo = fetch_offsets.get(tp)
                st = self.assignment.get(tp)
                if fo is None or st is None or st.position is None or \
                        fo != (st.position if st.next_fetch is None else st.next_fetch):
                    continue   # seeked / reset / unassigned since the fetch was sent
                code = p.error_code
                if code == ErrorCode.NONE:
                    st.high_watermark = p.high_watermark
                    st.log_start_offset = p.log_start_offset
                    st.last_stable_offset = p.last_stable_offset
                    recs = p.records
                    if recs is not None and len(recs):
                        try:
                            batches = records.decode_batches(recs, check_crc=self.check_crcs)
                        except Exception as e:   # CorruptRecordError and friends
                            self.completed.append(CompletedFetch(tp, fo, None, E.CorruptMessageError(
                                f"corrupt records for {tp.topic}-{tp.partition} at offset {fo}: {e}",
                                ErrorCode.CORRUPT_MESSAGE)))
                            continue
                        if batches:
                            skip = (aborted_batch_indexes(batches, p.aborted_transactions)
                                    if self.isolation_level == 1 else None)
                            self.completed.append(CompletedFetch(tp, fo, batches, skip=skip))
                            st.next_fetch = batches[-1].next_offset
                        elif len(recs) >= self.partition_max_bytes:
                            self.completed.append(CompletedFetch(tp, fo, None, E.RecordTooLargeError(
                                f"a record batch at offset {fo} of {tp.topic}-{tp.partition} is larger "
                                f"than max.partition.fetch.bytes={self.partition_max_bytes}")))
                elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    if self.default_reset is None:
                        self.completed.append(CompletedFetch(tp, fo, None, E.for_code(
                            code, f"offset {fo} is out of range for {tp.topic}-{tp.partition}")))
                    elif fo == st.position:
                        self.request_reset(tp, self.default_reset)
                    else:
                        st.next_fetch = None    # prefetch ran past the end; refetch at position
                elif code in _REFRESH_CODES:
                    self.metadata.request_update()
                else:
                    self.completed.append(CompletedFetch(tp, fo, None, E.for_code(code)))

    def has_completed(self) -> bool:
        return bool(self.completed)

    def fetched_records(self, max_records: int) -> dict[TopicPartition, list]:
        """Hand out up to max_records buffered records, advancing positions."""
        out: dict[TopicPartition, list] = {}
        n = 0
        kd, vd = self.key_deserializer, self.value_deserializer
        while self.completed and n < max_records:
            cf = self.completed[0]
            st = self.assignment.get(cf.tp)
            if st is None or st.position is None or st.paused:
                self.completed.popleft()
                continue
            if cf.error is not None:
                self.completed.popleft()
                if out:
                    self.completed.appendleft(CompletedFetch(cf.tp, cf.fetch_offset, None, cf.error))
                    break
                raise cf.error
            topic, part = cf.tp
            lst = out.get(cf.tp)
            if lst is None:
                lst = out[cf.tp] = []
            batches = cf.batches
            skip = cf.skip
            while cf.batch_index < len(batches) and n < max_records:
                b = batches[cf.batch_index]
                pos = st.position
                if b.next_offset <= pos or b.is_control or (skip is not None and cf.batch_index in skip):
                    cf.batch_index += 1
                    cf.record_index = -1
                    if b.next_offset > pos:
                        st.position = b.next_offset
                    continue
                recs = b.records
                i = cf.record_index
                if i < 0:
                    # first visit: skip records below the position (compressed batches
                    # are fetched whole, so a batch may start before it)
                    i = 0
                    while i < len(recs) and recs[i].offset < pos:
                        i += 1
                j = min(len(recs), i + (max_records - n))
                if kd is None and vd is None:
                    if j > i:     # ConsumerRecord tuples built in C, no slice copy
                        lst.extend(_build_records(ConsumerRecord, recs, i, j, topic, part,
                                                  b.timestamp_type, b.partition_leader_epoch))
                        n += j - i
                        last_offset = recs[j - 1].offset
                else:
                    if i or j < len(recs):
                        recs = recs[i:j]
                    tstype = b.timestamp_type
                    ple = b.partition_leader_epoch
                    if recs:
                        last_offset = recs[-1].offset
                        for r in recs:
                            k = kd(r.key) if kd is not None else r.key
                            v = vd(r.value) if vd is not None else r.value
                            lst.append(_new_tuple(ConsumerRecord, (topic, part, r.offset, r.timestamp,
                                                                   tstype, k, v, r.headers, ple)))
                        n += len(recs)
                if j >= len(b.records):
                    cf.batch_index += 1
                    cf.record_index = -1
                    st.position = b.next_offset
                else:
                    cf.record_index = j
                    st.position = last_offset + 1
            if cf.batch_index >= len(batches):
                self.completed.popleft()
            if not lst:
                del out[cf.tp]
        return out
