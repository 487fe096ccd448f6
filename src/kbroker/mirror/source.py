"""MirrorSourceTask: copy the flow's topics from the source cluster to the target.

Each record of source partition ``orders-p`` goes to partition p of the remote topic
(``A.orders``) with its key, value, headers and timestamp. Instances of one flow share
the consumer group ``mm2-<source>-><target>`` on the source cluster, so running several
splits the partitions between them.

Delivery is at least once: the committed source offset of a partition is only ever the
offset after a *contiguous* run of acknowledged records (``_committable``). Records
polled but not yet acknowledged are the in-flight set; after a crash a restarted
instance re-sends at most what was in flight plus what was acknowledged since the last
commit (``offset.flush.interval.ms``). A failed send re-seeks the partition to its first
unacknowledged record on a fresh producer.

Threading: everything here runs on the task's thread, which owns the consumer, the
producer and the OffsetSyncWriter; ``set_topics`` (from the control thread) only swaps
one attribute, and the metrics collector reads counters (single writer).
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from kbroker.client import Consumer, Producer, TopicPartition
from kbroker.client import errors as E
from kbroker.mirror.offset_syncs import OffsetSyncWriter

log = logging.getLogger(__name__)


class PartitionStats:
    """Counters of one source partition (written by the task thread only)."""

    __slots__ = ("records", "bytes", "latency_sum_ms", "latency_max_ms", "committed", "lag")

    def __init__(self):
        self.records = self.bytes = 0
        self.latency_sum_ms = 0
        self.latency_max_ms = 0
        self.committed = -1
        self.lag = 0


class MirrorSourceTask:
    def __init__(self, fc, stop: threading.Event):
        self.fc = fc
        self.stop = stop
        self._consumer_cfg = {**fc.source_clients["consumer"], "group.id": fc.mirror_group_id,
                              "enable.auto.commit": False}
        self._consumer_cfg.setdefault("auto.offset.reset", "earliest")
        self._producer_cfg = dict(fc.target_clients["producer"])
        self.consumer = Consumer(self._consumer_cfg)
        self.producer = Producer(self._producer_cfg)
        self.sync_writer = None
        if fc["emit.offset-syncs.enabled"]:
            clients = fc.source_clients if fc.offset_syncs_on_source else fc.target_clients
            self._sync_producer = Producer(clients["producer"])
            self.sync_writer = OffsetSyncWriter(self._sync_producer, fc.offset_syncs_topic, fc["offset.lag.max"])
        self._pending_topics: dict | None = None
        self._topics: dict = {}
        self._remote: dict[str, str] = {}
        #: tp -> deque of (upstream offset, RecordFuture, source timestamp, size)
        self._inflight: dict[TopicPartition, collections.deque] = {}
        #: tp -> the next offset to commit (everything before it acknowledged)
        self._committable: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self.stats: dict[TopicPartition, PartitionStats] = {}
        self.assigned: frozenset = frozenset()
        self._flush_s = fc["offset.flush.interval.ms"] / 1000.0
        self._last_commit = time.monotonic()
        self.failures = 0

    # -- control thread -----------------------------------------------------------------
    def set_topics(self, topics: dict[str, int]) -> None:
        """The source topics to mirror and their partition counts (remote topics exist)."""
        self._pending_topics = dict(topics)

    # -- task thread --------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._apply_topics()
                if not self._topics:
                    self.stop.wait(0.1)
                    continue
                try:
                    self._poll_once()
                except E.KafkaError as e:
                    log.warning("%s: %s; retrying", self.fc.flow, e)
                    self.stop.wait(0.5)
            self._finish()
        finally:
            self.close()

    def _apply_topics(self) -> None:
        pending, self._pending_topics = self._pending_topics, None
        if pending is None or pending == self._topics:
            return
        self._topics = pending
        self._remote = {t: self.fc.remote_topic(t) for t in pending}
        if pending:
            self.consumer.subscribe(sorted(pending), on_assign=self._on_assign, on_revoke=self._on_revoke)
            try:   # a fresh view, so the group leader assigns added partitions too
                self.consumer.client.await_metadata(5.0)
            except E.KafkaTimeoutError:
                pass
        else:
            self._on_revoke(self.consumer, sorted(self.assigned))
            self.consumer.unsubscribe()

    def _poll_once(self) -> None:
        records = self.consumer.poll(0.1)
        send, remote = self.producer.send, self._remote
        inflight = self._inflight
        for tp in records.partitions():
            dq = inflight.get(tp)
            if dq is None:
                dq = inflight[tp] = collections.deque()
            topic = remote[tp.topic]
            for r in records.records(tp):
                try:   # a record without a timestamp (-1, message format v0) gets the send time
                    fut = send(topic, r.value, r.key, r.partition, r.timestamp if r.timestamp >= 0 else None,
                               r.headers or None)
                except E.KafkaError as e:
                    log.warning("%s: send to %s-%d failed: %s", self.fc.flow, topic, r.partition, e)
                    self._recover({tp: r.offset})
                    return
                dq.append((r.offset, fut, r.timestamp,
                           (len(r.value) if r.value else 0) + (len(r.key) if r.key else 0)))
        self._drain()
        if self.sync_writer is not None:
            self.sync_writer.fire_pending()
        if time.monotonic() - self._last_commit >= self._flush_s:
            self._commit()

    def _drain(self) -> None:
        """Retire acknowledged records in order; emit offset syncs; on a failure, re-seek."""
        now_ms = time.time_ns() // 1_000_000
        failed = {}
        queue_sync = self.sync_writer.maybe_queue if self.sync_writer is not None else None
        for tp, dq in self._inflight.items():
            if not dq:
                continue
            st = self.stats.get(tp)
            if st is None:
                st = self.stats[tp] = PartitionStats()
            last = None
            n = nbytes = lat_sum = 0
            lat_max = st.latency_max_ms
            while dq:
                upstream, fut, ts, size = dq[0]
                r = fut[0]
                if not r.done:
                    break
                if r.error is not None:
                    log.warning("%s: record %s-%d@%d was not written: %s", self.fc.flow, tp.topic,
                                tp.partition, upstream, r.error)
                    failed[tp] = upstream
                    break
                dq.popleft()
                if queue_sync is not None:
                    queue_sync(tp, upstream, r.base_offset + fut[1])
                n += 1
                nbytes += size
                lat = now_ms - ts
                lat_sum += lat
                if lat > lat_max:
                    lat_max = lat
                last = upstream
            if last is not None:
                st.records += n
                st.bytes += nbytes
                st.latency_sum_ms += lat_sum
                st.latency_max_ms = lat_max
                self._committable[tp] = last + 1
        if failed:
            self._recover(failed)

    def _recover(self, failed: dict) -> None:
        """Re-send from the first unacknowledged record of every partition on a new producer."""
        self.failures += 1
        old = self.producer
        self.producer = Producer(self._producer_cfg)
        old.close(0)
        starts = dict(failed)
        for tp, dq in self._inflight.items():
            if dq:
                starts[tp] = min(starts.get(tp, dq[0][0]), dq[0][0])
            dq.clear()
        for tp, start in starts.items():
            if tp in self.assigned:
                self.consumer.seek(tp, start)
        self.stop.wait(0.5)

    def _commit(self, tps=None) -> None:
        self._last_commit = time.monotonic()
        offsets = {tp: o for tp, o in self._committable.items()
                   if (tps is None or tp in tps) and self._committed.get(tp) != o}
        if self.sync_writer is not None:
            self.sync_writer.promote_delayed()
            self.sync_writer.fire_pending()
        if not offsets:
            return
        try:
            self.consumer.commit(offsets, timeout=10.0)
        except E.KafkaError as e:
            log.warning("%s: offset commit failed (the records will be re-read): %s", self.fc.flow, e)
            return
        self._committed.update(offsets)
        for tp, o in offsets.items():
            st = self.stats.get(tp)
            if st is not None:
                st.committed = o

    def _on_assign(self, consumer, tps) -> None:
        self.assigned = frozenset(tps)
        log.info("%s: assigned %s", self.fc.flow, ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "nothing")

    def _on_revoke(self, consumer, tps) -> None:
        """Before giving partitions up: finish their in-flight records and commit them."""
        try:
            self.producer.flush(30.0)
        except E.KafkaError as e:
            log.warning("%s: flush before a rebalance failed: %s", self.fc.flow, e)
        self._drain()
        self._commit(set(tps))
        for tp in tps:
            self._inflight.pop(tp, None)
            self._committable.pop(tp, None)
            self._committed.pop(tp, None)
        if self.sync_writer is not None:
            self.sync_writer.forget(tps)
        self.assigned = frozenset()

    def lag(self) -> dict[TopicPartition, int]:
        """Source high watermark minus the next offset to commit, per assigned partition."""
        out = {}
        for tp in list(self.assigned):
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            done = self._committable.get(tp)
            if done is None:
                done = self._committed.get(tp, 0)
            out[tp] = max(0, hw - done)
        return out

    def _finish(self) -> None:
        """Clean stop: deliver what is in flight, commit it (within Connect's
        ``task.shutdown.graceful.timeout.ms``; what is not delivered by then is mirrored
        again after a restart, as it was never committed)."""
        try:
            self.producer.flush(self.fc["task.shutdown.graceful.timeout.ms"] / 1000.0)
        except E.KafkaError:
            pass
        self._drain()
        self._commit()

    def close(self) -> None:
        for c in (self.producer, getattr(self, "_sync_producer", None)):
            if c is not None:
                try:
                    c.close(5.0)
                except Exception:
                    pass
        try:
            self.consumer.close()
        except Exception:
            pass
