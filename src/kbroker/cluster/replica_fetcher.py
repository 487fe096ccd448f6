"""ReplicaFetcher: a follower's fetch loop towards one source broker, as a pure state machine.

Kafka: ``AbstractFetcherThread`` + ``ReplicaFetcherThread`` with truncation on fetch
(KIP-320/KIP-595's diverging epoch, Fetch v12+). No thread, no socket, no clock: the
caller passes ``now_ms`` to every call, sends what :meth:`ReplicaFetcher.poll` returns
and feeds the answer to :meth:`on_fetch_response` (``None`` for a failed request).
One Fetch in flight at a time, in an incremental fetch session (KIP-227) as Kafka's
ReplicaFetcherThread (its FetchSessionHandler): the first Fetch is full and opens a
session on the leader (session id 0, epoch 0); the leader answers its id; each next
Fetch (that id, the next epoch) lists only the partitions whose fetch data changed
(offset, epochs, log start offset, max bytes) and forgets the ones not fetched any
more (removed, or delayed by a backoff); the leader answers only partitions with news
(records, a new high watermark or log start offset, an error, a diverging epoch) and
keeps reading the others at their last fetch offsets. A failed request or a
session error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, ...) makes
the next Fetch full again, closing the old session; a leader that answers session
id 0 (its cache full) is fetched sessionless, a full Fetch each time.

Per partition (:class:`PartitionFetchState`): the fetch offset (always the local log
end offset while fetching), the leader epoch the follower knows (sent as
``current_leader_epoch`` so a leader of another epoch answers FENCED/UNKNOWN_LEADER_EPOCH),
the epoch of the last batch fetched (``last_fetched_epoch``: the leader answers a
``diverging_epoch`` if its log disagrees), and a delay after errors
(``replica.fetch.backoff.ms``). States:

* ``FETCHING``: included in the next Fetch unless delayed.
* ``OUT_OF_RANGE``: the leader answered OFFSET_OUT_OF_RANGE; the follower needs the
  leader's log start and end offsets (:meth:`offset_queries`, answered by
  :meth:`on_leader_offsets`; ListOffsets with the replica id in the server), then
  truncates to the leader's end when it is below ours (an unclean election) or
  restarts empty at the leader's log start offset when ours is below it.
* ``FENCED``: the leader has a newer leader epoch than ours; nothing is fetched until
  the caller re-adds the partition with new metadata (Kafka removes the partition).

Errors: UNKNOWN_LEADER_EPOCH and NOT_LEADER_OR_FOLLOWER (the source broker has not
learned the new state yet) and every other error delay the partition by the backoff
and fetch again (Kafka's partitionsWithError); a failed request delays all of its
partitions.

The local log is only touched through :class:`FollowerLog` (kbroker.log.Log has these
methods): append the leader's batches as they are, truncate, and set the high
watermark to min(leader's high watermark, own log end offset) and the log start offset
up to the leader's (bounded by the own high watermark).
"""
from __future__ import annotations

import enum
import logging
import struct
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.fetch import (
    FetchPartition, FetchRequest, FetchTopic, ForgottenTopic, ReplicaState as FetchReplicaState,
)

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
#: top-level Fetch errors that only concern the session: the next Fetch is full, at once
_SESSION_ERRORS = frozenset({ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH,
                             ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR})


class FollowerLog(Protocol):
    """What the fetcher needs of a local log (kbroker.log.Log)."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def latest_epoch(self) -> int | None: ...
    def append_as_follower(self, buf): ...
    def truncate_to(self, offset: int) -> bool: ...
    def truncate_fully_and_start_at(self, offset: int) -> None: ...
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...
    def update_high_watermark(self, offset: int) -> int: ...
    def delete_records(self, offset: int) -> int: ...


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    """The broker's replica.fetch.* settings (Kafka's defaults)."""
    wait_max_ms: int = 500                    # replica.fetch.wait.max.ms
    min_bytes: int = 1                        # replica.fetch.min.bytes
    response_max_bytes: int = 10 * 1024 * 1024  # replica.fetch.response.max.bytes
    max_bytes: int = 1024 * 1024              # replica.fetch.max.bytes (per partition)
    backoff_ms: int = 1000                    # replica.fetch.backoff.ms


class FetchStateKind(enum.Enum):
    FETCHING = "fetching"
    OUT_OF_RANGE = "out_of_range"
    FENCED = "fenced"


TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionFetchState:
    topic_id: uuid.UUID
    fetch_offset: int
    current_leader_epoch: int
    last_fetched_epoch: int = UNDEFINED_EPOCH
    state: FetchStateKind = FetchStateKind.FETCHING
    delayed_until_ms: int = 0

    def ready(self, now_ms: int) -> bool:
        return self.state is FetchStateKind.FETCHING and now_ms >= self.delayed_until_ms


@dataclass(frozen=True, slots=True)
class _Sent:
    """One partition of the Fetch in flight: what it asked for."""
    fetch_offset: int
    current_leader_epoch: int


_LENGTH = struct.Struct(">qi")
_BASE = struct.Struct(">q")
_DELTA = struct.Struct(">i")     # last_offset_delta, at byte 23 of a v2 batch


def complete_batches(buf) -> memoryview:
    """``buf`` without a trailing partial batch (a fetch response may end mid-batch)."""
    mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or buf.format != "B" else buf
    n = len(mv)
    pos = 0
    while n - pos >= 12:
        size = 12 + _LENGTH.unpack_from(mv, pos)[1]
        if size > n - pos or size < 12:
            break
        pos += size
    return mv[:pos]


class ReplicaFetcher:
    """Fetches the partitions led by ``source_broker_id`` for replica ``replica_id``."""

    def __init__(self, replica_id: int, source_broker_id: int, broker_epoch: Callable[[], int],
                 config: FetcherConfig = FetcherConfig()):
        self.replica_id = replica_id
        self.source_broker_id = source_broker_id
        self.broker_epoch = broker_epoch
        self.config = config
        self.partitions: dict[TopicPartition, PartitionFetchState] = {}
        self.logs: dict[TopicPartition, FollowerLog] = {}
        self._in_flight: dict[TopicPartition, _Sent] | None = None
        #: the fetch session (KIP-227): its id (0: none) and the epoch of the next Fetch
        #: (INITIAL_EPOCH: a full one), and what the leader's session holds per
        #: partition: (topic id, the fetch data last sent)
        self.session_id = INVALID_SESSION_ID
        self.session_epoch = INITIAL_EPOCH
        self._session: dict[TopicPartition, tuple] = {}
        self._in_flight_session: tuple | None = None     # (full?, the session if the Fetch succeeds)

    # -- membership (the caller applies metadata) --------------------------------------
    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID, leader_epoch: int, local_log: FollowerLog) -> None:
        """Fetch ``tp`` from the source broker in ``leader_epoch`` (the leader epoch of the
        metadata that made this broker a follower). A partition already fetched in that
        epoch keeps its state, unless it was fenced; otherwise it starts at the local log
        end offset with the log's latest epoch as the last fetched epoch (the leader
        then answers a diverging epoch if the logs disagree: no truncation up front)."""
        cur = self.partitions.get(tp)
        if (cur is not None and cur.current_leader_epoch >= leader_epoch and cur.state is not FetchStateKind.FENCED
                and self.logs.get(tp) is local_log):
            return
        if cur is not None and cur.current_leader_epoch > leader_epoch:
            return      # stale metadata
        self.logs[tp] = local_log
        self.partitions[tp] = self._initial_state(topic_id, leader_epoch, local_log)

    @staticmethod
    def _initial_state(topic_id, leader_epoch: int, local_log: FollowerLog) -> PartitionFetchState:
        epoch = local_log.latest_epoch
        return PartitionFetchState(topic_id, local_log.log_end_offset, leader_epoch,
                                   UNDEFINED_EPOCH if epoch is None else epoch)

    def remove_partition(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)
        self.logs.pop(tp, None)

    def state(self, tp: TopicPartition) -> PartitionFetchState | None:
        return self.partitions.get(tp)

    # -- requests -------------------------------------------------------------------------
    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def poll(self, now_ms: int) -> FetchRequest | None:
        """The Fetch to send now (v17 fields), or None (one in flight, or nothing ready):
        full, or incremental in the session (module docstring)."""
        if self._in_flight is not None:
            return None
        ready = [(tp, st) for tp, st in self.partitions.items() if st.ready(now_ms)]
        if not ready:
            return None
        cfg = self.config
        wanted: dict[TopicPartition, tuple] = {}
        sent: dict[TopicPartition, _Sent] = {}
        for tp, st in sorted(ready, key=lambda x: x[0]):
            wanted[tp] = (st.topic_id, (st.fetch_offset, st.current_leader_epoch, st.last_fetched_epoch,
                                        self.logs[tp].log_start_offset, cfg.max_bytes))
            sent[tp] = _Sent(st.fetch_offset, st.current_leader_epoch)
        full = self.session_id == INVALID_SESSION_ID or self.session_epoch == INITIAL_EPOCH
        session = self._session
        by_topic: dict[uuid.UUID, list[FetchPartition]] = {}
        for tp, (tid, data) in wanted.items():
            if full or session.get(tp) != (tid, data):
                offset, leader_epoch, last_epoch, log_start, max_bytes = data
                by_topic.setdefault(tid, []).append(FetchPartition(
                    partition=tp[1], current_leader_epoch=leader_epoch, fetch_offset=offset,
                    last_fetched_epoch=last_epoch, log_start_offset=log_start, partition_max_bytes=max_bytes))
        forgotten: dict[uuid.UUID, list[int]] = {}
        if not full:
            for tp, (tid, _) in session.items():
                if wanted.get(tp, (None,))[0] != tid:
                    forgotten.setdefault(tid, []).append(tp[1])
        self._in_flight = sent
        self._in_flight_session = (full, wanted)
        return FetchRequest(
            replica_state=FetchReplicaState(replica_id=self.replica_id, replica_epoch=self.broker_epoch()),
            max_wait_ms=cfg.wait_max_ms, min_bytes=cfg.min_bytes, max_bytes=cfg.response_max_bytes,
            isolation_level=0, session_id=self.session_id,
            session_epoch=INITIAL_EPOCH if full else self.session_epoch,
            topics=[FetchTopic(topic_id=tid, partitions=parts) for tid, parts in by_topic.items()],
            forgotten_topics_data=[ForgottenTopic(topic_id=tid, partitions=ps) for tid, ps in forgotten.items()])

    def _update_session(self, response) -> None:
        """After an answer without a top-level error: adopt the session the leader
        opened (or kept), else fetch full next time."""
        full, wanted = self._in_flight_session or (True, {})
        sid = getattr(response, "session_id", INVALID_SESSION_ID)
        if sid == INVALID_SESSION_ID or (not full and sid != self.session_id):
            self._reset_session(close=False)
            return
        self.session_id = sid
        self.session_epoch = 1 if full else (1 if self.session_epoch >= 2**31 - 1 else self.session_epoch + 1)
        self._session = wanted

    def _reset_session(self, close: bool = True) -> None:
        """The next Fetch is full; ``close``: it names the old session so the leader drops it."""
        if not close:
            self.session_id = INVALID_SESSION_ID
        self.session_epoch = INITIAL_EPOCH
        self._session = {}

    def next_deadline_ms(self) -> int | None:
        """When :meth:`poll` may next return a request (None: not before a response or
        new partitions)."""
        if self._in_flight is not None:
            return None
        times = [st.delayed_until_ms for st in self.partitions.values() if st.state is FetchStateKind.FETCHING]
        return min(times) if times else None

    def offset_queries(self) -> list[tuple[TopicPartition, int]]:
        """Partitions waiting for the leader's log start / end offsets: (tp, leader epoch)."""
        return [(tp, st.current_leader_epoch) for tp, st in sorted(self.partitions.items())
                if st.state is FetchStateKind.OUT_OF_RANGE]

    # -- responses ------------------------------------------------------------------------
    def _topic_name(self, topic_id: uuid.UUID, partition: int) -> TopicPartition | None:
        for tp, st in self.partitions.items():
            if st.topic_id == topic_id and tp[1] == partition:
                return tp
        return None

    def on_fetch_response(self, now_ms: int, response) -> dict[TopicPartition, str]:
        """Apply the answer to the Fetch in flight (``None``: the request failed).
        Returns what happened per partition ('appended', 'empty', 'truncated',
        'out_of_range', 'fenced', 'backoff', 'stale', 'session': a session error, the
        next Fetch is full), for logs and tests."""
        sent, self._in_flight = self._in_flight or {}, None
        outcome: dict[TopicPartition, str] = {}
        if response is not None and response.error_code in _SESSION_ERRORS:
            # only the session is wrong: a full Fetch at once (Kafka's FetchSessionHandler)
            self._reset_session(close=response.error_code != ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            self._in_flight_session = None
            return {tp: "session" for tp in sent}
        if response is None or response.error_code != ErrorCode.NONE:
            self._reset_session()
            self._in_flight_session = None
            for tp in sent:
                self._delay(tp, now_ms)
                outcome[tp] = "backoff"
            return outcome
        self._update_session(response)
        self._in_flight_session = None
        answered = set()
        for t in response.responses:
            for p in t.partitions:
                tp = self._topic_name(t.topic_id, p.partition_index)
                if tp is None or tp not in sent:
                    continue
                answered.add(tp)
                outcome[tp] = self._on_partition(now_ms, tp, sent[tp], p)
        for tp in sent:
            if tp not in answered and tp in self.partitions:
                # Left out of the response: nothing new in the session, or its max bytes
                # reached; fetched again next time.
                outcome[tp] = "empty"
        return outcome

    def _on_partition(self, now_ms: int, tp: TopicPartition, sent: _Sent, p) -> str:
        st = self.partitions.get(tp)
        # The partition was removed, re-added or truncated meanwhile: the answer is stale.
        if (st is None or st.state is not FetchStateKind.FETCHING or st.fetch_offset != sent.fetch_offset
                or st.current_leader_epoch != sent.current_leader_epoch):
            return "stale"
        err = p.error_code
        lg = self.logs[tp]
        if err == ErrorCode.NONE:
            div = p.diverging_epoch
            if div is not None and div.epoch >= 0:
                return self._truncate_on_diverging_epoch(tp, st, lg, div.epoch, div.end_offset)
            try:
                return self._process_partition_data(tp, st, lg, p)
            except Exception as e:       # corrupt batch, offset mismatch, storage error
                log.warning("Error appending the fetched data of %s at offset %d: %r", tp, st.fetch_offset, e)
                self.partitions[tp] = replace(st, fetch_offset=lg.log_end_offset,
                                              delayed_until_ms=now_ms + self.config.backoff_ms)
                return "backoff"
        if err == ErrorCode.OFFSET_OUT_OF_RANGE:
            self.partitions[tp] = replace(st, state=FetchStateKind.OUT_OF_RANGE)
            return "out_of_range"
        if err == ErrorCode.FENCED_LEADER_EPOCH:
            log.info("Partition %s has an older epoch (%d) than the current leader; waiting for new "
                     "metadata", tp, st.current_leader_epoch)
            self.partitions[tp] = replace(st, state=FetchStateKind.FENCED)
            return "fenced"
        self._delay(tp, now_ms)
        return "backoff"

    def _delay(self, tp: TopicPartition, now_ms: int) -> None:
        st = self.partitions.get(tp)
        if st is not None and st.state is FetchStateKind.FETCHING:
            self.partitions[tp] = replace(st, delayed_until_ms=now_ms + self.config.backoff_ms)

    def _process_partition_data(self, tp: TopicPartition, st: PartitionFetchState, lg: FollowerLog, p) -> str:
        """Kafka's ReplicaFetcherThread.processPartitionData."""
        if st.fetch_offset != lg.log_end_offset:
            raise RuntimeError(f"offset mismatch for {tp}: fetched {st.fetch_offset}, "
                               f"log end offset {lg.log_end_offset}")
        outcome = "empty"
        records = p.records
        if records is not None:
            data = complete_batches(records)
            if len(data):
                self._maybe_start_at_first_batch(tp, lg, data)
                lg.append_as_follower(data)
                outcome = "appended"
        lg.update_high_watermark(min(p.high_watermark, lg.log_end_offset))
        if p.log_start_offset > lg.log_start_offset:
            target = min(p.log_start_offset, lg.high_watermark)
            if target > lg.log_start_offset:
                lg.delete_records(target)
        epoch = lg.latest_epoch
        self.partitions[tp] = replace(st, fetch_offset=lg.log_end_offset,
                                      last_fetched_epoch=st.last_fetched_epoch if epoch is None else epoch,
                                      delayed_until_ms=0)
        return outcome

    @staticmethod
    def _maybe_start_at_first_batch(tp, lg: FollowerLog, data) -> None:
        """An empty log whose start (the leader's log start offset, moved by DeleteRecords)
        falls inside the first batch fetched restarts at that batch's base offset, so the
        batch can be appended whole (Kafka: Partition.doAppendRecordsToFollowerOrFutureReplica
        on UnexpectedAppendOffsetException); the next fetches move the log start back up."""
        end = lg.log_end_offset
        if end != lg.log_start_offset or len(data) < 27:
            return
        base = _BASE.unpack_from(data, 0)[0]
        last = base + _DELTA.unpack_from(data, 23)[0]
        if base < end <= last:
            log.info("Restarting the empty log of %s at %d: the first batch fetched holds %d..%d", tp, base,
                     base, last)
            lg.truncate_fully_and_start_at(base)

    def _truncate_on_diverging_epoch(self, tp, st, lg: FollowerLog, leader_epoch: int, leader_end: int) -> str:
        """Kafka's getOffsetTruncationState: the leader says our last fetched epoch ends at
        ``leader_end`` in its log (its epoch ``leader_epoch`` being the largest at or below ours)."""
        end = lg.log_end_offset
        if leader_end == UNDEFINED_OFFSET:
            target = lg.high_watermark
        else:
            follower_epoch, follower_end = lg.end_offset_for_epoch(leader_epoch)
            if follower_end == UNDEFINED_OFFSET:
                target = min(leader_end, end)
            elif follower_epoch != leader_epoch:
                # we never had the leader's epoch: cut to the end of our largest epoch below
                # it; the next fetch carries that epoch and the leader answers again if needed
                target = min(follower_end, end)
            else:
                target = min(follower_end, leader_end, end)
        if target < lg.high_watermark:
            log.warning("Truncating %s to offset %d below the high watermark %d", tp, target, lg.high_watermark)
        log.info("Truncating %s to %d after a diverging epoch (%d, %d)", tp, target, leader_epoch, leader_end)
        lg.truncate_to(target)
        epoch = lg.latest_epoch
        self.partitions[tp] = replace(st, fetch_offset=lg.log_end_offset,
                                      last_fetched_epoch=UNDEFINED_EPOCH if epoch is None else epoch)
        return "truncated"

    def on_leader_offsets(self, now_ms: int, tp: TopicPartition, leader_epoch: int, log_start_offset: int,
                          log_end_offset: int, error: int = ErrorCode.NONE) -> str:
        """The leader's log start and end offsets for an OUT_OF_RANGE partition (Kafka's
        fetchOffsetAndTruncate): truncate to the leader's end if ours is past it, restart
        empty at the leader's log start if ours is below it, then fetch again."""
        st = self.partitions.get(tp)
        if st is None or st.state is not FetchStateKind.OUT_OF_RANGE or st.current_leader_epoch != leader_epoch:
            return "stale"
        if error != ErrorCode.NONE:
            if error == ErrorCode.FENCED_LEADER_EPOCH:
                self.partitions[tp] = replace(st, state=FetchStateKind.FENCED)
                return "fenced"
            self.partitions[tp] = replace(st, state=FetchStateKind.FETCHING,
                                          delayed_until_ms=now_ms + self.config.backoff_ms)
            return "backoff"
        lg = self.logs[tp]
        end = lg.log_end_offset
        if log_end_offset < end:
            log.warning("Truncating %s from %d to the leader's log end offset %d (an unclean election?)",
                        tp, end, log_end_offset)
            lg.truncate_to(log_end_offset)
        elif log_start_offset > end:
            log.info("Restarting %s at the leader's log start offset %d (local log end %d)", tp,
                     log_start_offset, end)
            lg.truncate_fully_and_start_at(log_start_offset)
        epoch = lg.latest_epoch
        self.partitions[tp] = replace(st, state=FetchStateKind.FETCHING, fetch_offset=lg.log_end_offset,
                                      last_fetched_epoch=UNDEFINED_EPOCH if epoch is None else epoch,
                                      delayed_until_ms=0)
        return "truncated"
