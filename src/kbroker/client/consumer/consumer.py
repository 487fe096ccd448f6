"""Consumer: the public consumer API (Kafka's classic KafkaConsumer).

``assign([TopicPartition])`` for manual assignment, or ``subscribe([topics])`` with a
``group.id`` for the classic group protocol (kbroker/client/consumer/coordinator.py).
``poll(timeout)`` returns ``ConsumerRecords`` in offset order per partition. Before it
returns records it already sends the next Fetch for partitions whose buffer it emptied,
so the broker works on the next fetch while the application processes this one.

Positions: a partition with no position takes its committed offset (group.id set),
else auto.offset.reset (earliest / latest via ListOffsets; "none" raises
NoOffsetForPartitionError from poll). OFFSET_OUT_OF_RANGE on fetch resets the same way.

Thread-safety: not thread-safe (like KafkaConsumer): one application thread calls it;
the group heartbeat thread shares only the NetworkClient (under its lock). ``wakeup``
may be called from any thread.
"""
from __future__ import annotations

import time
from typing import Iterable

from kbroker.client import errors as E
from kbroker.client.config import CONSUMER, ClientConfig
from kbroker.client.consumer.coordinator import GroupCoordinator, OffsetAndMetadata
from kbroker.client.consumer.fetcher import (
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ConsumerRecord, Fetcher, OffsetAndTimestamp,
)
from kbroker.client.metadata import Metadata, TopicPartition
from kbroker.client.network_client import NetworkClient


class ConsumerRecords:
    """What poll returns: records grouped by partition, offset order within each."""

    __slots__ = ("_by_tp",)

    def __init__(self, by_tp: dict):
        self._by_tp = by_tp

    def records(self, tp: TopicPartition) -> list[ConsumerRecord]:
        return self._by_tp.get(tp, [])

    def partitions(self) -> set[TopicPartition]:
        return set(self._by_tp)

    def __iter__(self):
        for lst in self._by_tp.values():
            yield from lst

    def __len__(self):
        return sum(len(v) for v in self._by_tp.values())

    def count(self) -> int:
        return len(self)

    def is_empty(self) -> bool:
        return not self._by_tp

    def __bool__(self):
        return bool(self._by_tp)


class Consumer:
    def __init__(self, config: dict | None = None, **kwargs):
        self.config = cfg = ClientConfig(CONSUMER, config, **kwargs)
        self.metadata = Metadata(cfg)
        self.metadata.allow_auto_topic_creation = cfg["allow.auto.create.topics"]
        self.client = NetworkClient(cfg, self.metadata)
        self.fetcher = Fetcher(cfg, self.client, self.metadata)
        self.default_timeout_s = cfg["default.api.timeout.ms"] / 1000.0
        self.max_poll_records = cfg["max.poll.records"]
        self.group_id = cfg["group.id"]
        self.coordinator = GroupCoordinator(cfg, self.client, self.metadata, self) if self.group_id else None
        self._subscribed: list[str] | None = None
        self._manual = False
        self._closed = False
        self._last_auto_commit = time.monotonic()
        self.auto_commit = cfg["enable.auto.commit"] and self.group_id is not None
        self.auto_commit_interval_s = cfg["auto.commit.interval.ms"] / 1000.0

    # -- assignment ---------------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._check_open()
        if self._subscribed:
            raise E.IllegalStateError("Subscription to topics, partitions and pattern are mutually exclusive")
        tps = [TopicPartition(*tp) for tp in partitions]
        self._manual = bool(tps)
        self.fetcher.assign(tps)
        self.metadata.set_topics({tp.topic for tp in tps})

    def assignment(self) -> set[TopicPartition]:
        return set(self.fetcher.assignment)

    def subscribe(self, topics: Iterable[str], on_assign=None, on_revoke=None) -> None:
        self._check_open()
        if self._manual:
            raise E.IllegalStateError("Subscription to topics, partitions and pattern are mutually exclusive")
        if self.coordinator is None:
            raise E.KafkaError("subscribe() requires group.id", E.ErrorCode.INVALID_GROUP_ID)
        self._subscribed = sorted(set(topics))
        self.metadata.set_topics(self._subscribed)
        self.coordinator.subscribe(self._subscribed, on_assign, on_revoke)

    def subscription(self) -> set[str]:
        return set(self._subscribed or ())

    def unsubscribe(self) -> None:
        if self.coordinator is not None and self._subscribed:
            self.coordinator.leave_group()
        self._subscribed = None
        self._manual = False
        self.fetcher.assign([])
        self.metadata.set_topics(set())

    # -- positions ----------------------------------------------------------------------
    def seek(self, partition: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"seek offset must not be a negative number: {offset}")
        self.fetcher.seek(partition, offset)
        self._drop_buffered(partition)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for tp in (partitions if partitions is not None else list(self.fetcher.assignment)):
            self.fetcher.request_reset(tp, EARLIEST_TIMESTAMP)
            self._drop_buffered(tp)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for tp in (partitions if partitions is not None else list(self.fetcher.assignment)):
            self.fetcher.request_reset(tp, LATEST_TIMESTAMP)
            self._drop_buffered(tp)

    def _drop_buffered(self, tp) -> None:
        self.fetcher.drop_buffered(tp)

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record poll would return (resolving resets, blocking)."""
        deadline = time.monotonic() + (self.default_timeout_s if timeout is None else timeout)
        st = self.fetcher.state(partition)
        while st.position is None:
            self._update_positions(deadline)
            if st.position is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise E.KafkaTimeoutError(f"Timeout while getting the position of {partition}")
            self.client.poll(min(left, 0.05))
            self._raise_pending()
        return st.position

    def pause(self, partitions) -> None:
        for tp in partitions:
            self.fetcher.state(tp).paused = True
            self._drop_buffered(tp)

    def resume(self, partitions) -> None:
        for tp in partitions:
            self.fetcher.state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self.fetcher.assignment.items() if st.paused}

    def highwater(self, partition: TopicPartition) -> int | None:
        hw = self.fetcher.state(partition).high_watermark
        return hw if hw >= 0 else None

    # -- offset lookups -----------------------------------------------------------------
    def _list_offsets(self, timestamps: dict, timeout: float | None) -> dict:
        deadline = time.monotonic() + (self.default_timeout_s if timeout is None else timeout)
        timestamps = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        self.metadata.add_topics(*{tp.topic for tp in timestamps})
        results: dict = {}
        pending = dict(timestamps)
        while pending:
            errs = {}

            def cb(tp, oat, exc):
                if exc is None:
                    results[tp] = oat
                    pending.pop(tp, None)
                elif not getattr(exc, "retriable", False):
                    errs[tp] = exc
            in_flight = dict(pending)
            for tp in self.fetcher.send_list_offsets(in_flight, cb):
                del in_flight[tp]
            while any(tp in pending for tp in in_flight) and not errs:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise E.KafkaTimeoutError(f"Failed to get offsets by times in {timeout}s")
                self.client.poll(min(left, 0.05))
                if self.client.in_flight_count() == 0:
                    break
            if errs:
                raise next(iter(errs.values()))
            if pending:
                if time.monotonic() >= deadline:
                    raise E.KafkaTimeoutError(f"Failed to get offsets by times in {timeout}s")
                self.client.poll(0.05)
        return results

    def offsets_for_times(self, timestamps: dict, timeout: float | None = None) -> dict:
        """{tp: OffsetAndTimestamp or None}: the earliest offset whose timestamp is >= ts."""
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"The target time for partition {tp} is {ts}. The target time cannot be negative.")
        return self._list_offsets(timestamps, timeout)

    def beginning_offsets(self, partitions, timeout: float | None = None) -> dict:
        r = self._list_offsets({tp: EARLIEST_TIMESTAMP for tp in partitions}, timeout)
        return {tp: oat.offset for tp, oat in r.items()}

    def end_offsets(self, partitions, timeout: float | None = None) -> dict:
        r = self._list_offsets({tp: LATEST_TIMESTAMP for tp in partitions}, timeout)
        return {tp: oat.offset for tp, oat in r.items()}

    def list_topics(self, timeout: float | None = None):
        """The cluster metadata for all topics (a Cluster snapshot)."""
        self.metadata.set_topics(None)
        try:
            self.client.await_metadata(self.default_timeout_s if timeout is None else timeout)
            return self.metadata.cluster
        finally:
            self.metadata.set_topics(self._current_topics())

    def partitions_for_topic(self, topic: str, timeout: float | None = None) -> list[int]:
        deadline = time.monotonic() + (self.default_timeout_s if timeout is None else timeout)
        self.metadata.add_topics(topic)
        while topic not in self.metadata.cluster.topics:
            self.client.await_metadata(max(0.0, deadline - time.monotonic()))
            err = self.metadata.cluster.topic_errors.get(topic)
            if err is not None and not E.for_code(err).retriable:
                raise E.for_code(err, f"topic {topic}")
        return [p.partition for p in self.metadata.cluster.topics[topic]]

    def _current_topics(self):
        return set(self._subscribed or ()) | {tp.topic for tp in self.fetcher.assignment}

    # -- commits ------------------------------------------------------------------------
    def _require_group(self):
        if self.coordinator is None:
            raise E.KafkaError("committing offsets requires group.id (configuration group.id)",
                               E.ErrorCode.INVALID_GROUP_ID)
        return self.coordinator

    def _consumed_offsets(self) -> dict:
        return {tp: OffsetAndMetadata(st.position, "") for tp, st in self.fetcher.assignment.items()
                if st.position is not None}

    def commit(self, offsets: dict | None = None, timeout: float | None = None) -> None:
        """Commit offsets (default: current positions) and wait for the result."""
        coord = self._require_group()
        offsets = self._consumed_offsets() if offsets is None else _normalize_offsets(offsets)
        if offsets:
            coord.commit_sync(offsets, self.default_timeout_s if timeout is None else timeout)

    def commit_async(self, offsets: dict | None = None, callback=None) -> None:
        """Commit without waiting; callback(offsets, exc) runs inside a later poll/commit."""
        coord = self._require_group()
        offsets = self._consumed_offsets() if offsets is None else _normalize_offsets(offsets)
        coord.commit_async(offsets, callback)

    def group_metadata(self):
        """Kafka's Consumer.groupMetadata(): what a transactional producer's
        send_offsets_to_transaction needs to commit for this member (generation, member id)."""
        from kbroker.client.producer.transaction_manager import ConsumerGroupMetadata

        coord = self._require_group()
        return ConsumerGroupMetadata(self.group_id, coord.generation, coord.member_id, coord.group_instance_id)

    def committed(self, partitions, timeout: float | None = None) -> dict:
        """{tp: OffsetAndMetadata or None} from the group coordinator."""
        coord = self._require_group()
        return coord.fetch_committed([TopicPartition(*tp) for tp in partitions],
                                     self.default_timeout_s if timeout is None else timeout)

    # -- poll ---------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> ConsumerRecords:
        """Records fetched since the last poll (up to max.poll.records); waits up to
        ``timeout`` seconds for some. Raises broker errors for a partition by name."""
        self._check_open()
        if not self.fetcher.assignment and not self._subscribed:
            raise E.IllegalStateError("Consumer is not subscribed to any topics or assigned any partitions")
        max_records = max_records or self.max_poll_records
        deadline = time.monotonic() + timeout
        while True:
            if self.coordinator is not None:
                self.coordinator.poll(deadline)
                self._maybe_auto_commit()
            self._update_positions(deadline)
            self._raise_pending()
            recs = self.fetcher.fetched_records(max_records)
            if recs:
                # pipelining: the next fetch goes out before the application sees these
                self.fetcher.send_fetches()
                self.client.poll(0)
                return ConsumerRecords(recs)
            self.fetcher.send_fetches()
            left = deadline - time.monotonic()
            if left <= 0:
                self.client.poll(0)
                recs = self.fetcher.fetched_records(max_records)
                return ConsumerRecords(recs)
            self.client.poll(min(left, self._poll_slice()))

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[ConsumerRecord]:
        """confluent-kafka style: a flat list of up to num_messages records."""
        return list(self.poll(max(timeout, 0) if timeout >= 0 else self.default_timeout_s,
                              max_records=num_messages))

    def _poll_slice(self) -> float:
        if self.coordinator is not None:
            return min(0.1, self.coordinator.time_to_next_heartbeat())
        return 1.0 if not self.fetcher.resets_in_flight else 0.05

    def _update_positions(self, deadline: float) -> None:
        missing = self.fetcher.missing_positions()
        if missing:
            if self.coordinator is not None:
                try:
                    committed = self.coordinator.fetch_committed(
                        missing, max(0.05, deadline - time.monotonic()))
                except E.KafkaTimeoutError:
                    return          # try again on the next poll
                for tp, om in committed.items():
                    if om is not None and om.offset >= 0:
                        self.fetcher.seek(tp, om.offset)
                missing = self.fetcher.missing_positions()
            self.fetcher.apply_default_reset(missing)
        self.fetcher.reset_positions()

    def _raise_pending(self) -> None:
        err = self.fetcher.pending_error
        if err is not None:
            self.fetcher.pending_error = None
            raise err

    def _maybe_auto_commit(self) -> None:
        if not self.auto_commit:
            return
        now = time.monotonic()
        if now - self._last_auto_commit >= self.auto_commit_interval_s:
            self._last_auto_commit = now
            offsets = self._consumed_offsets()
            if offsets:
                self.coordinator.commit_async(offsets, None)

    # -- close --------------------------------------------------------------------------
    def wakeup(self) -> None:
        self.client.wakeup()

    def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        try:
            if self.coordinator is not None:
                if self.auto_commit and self.fetcher.assignment:
                    try:
                        self.commit(timeout=min(5.0, self.default_timeout_s if timeout is None else timeout))
                    except E.KafkaError:
                        pass
                self.coordinator.close()
        finally:
            self._closed = True
            self.client.close()

    def _check_open(self) -> None:
        if self._closed:
            raise E.IllegalStateError("This consumer has already been closed.")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _normalize_offsets(offsets: dict) -> dict:
    out = {}
    for tp, v in offsets.items():
        tp = TopicPartition(*tp)
        out[tp] = v if isinstance(v, OffsetAndMetadata) else OffsetAndMetadata(int(v), "")
    return out


__all__ = ["Consumer", "ConsumerRecords", "ConsumerRecord", "OffsetAndTimestamp", "OffsetAndMetadata"]
