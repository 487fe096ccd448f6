"""Exactly-once mirroring: MM2 with ``exactly.once.source.support = enabled`` (KIP-618, KIP-656).

Task t of flow ``A->B`` owns a fixed share of the source partitions (sorted by topic and
partition, dealt round robin over ``tasks.max``, as MirrorSourceConnector.taskConfigs) and
one transactional producer on B with Connect's task id ``A-mm2-MirrorSourceConnector-t``.
Each transaction holds the mirrored records and, for every source partition in it, one
source-offset record in the Connect worker's offsets topic on B (``mm2-offsets.A.internal``)
in Connect's layout::

    key   ["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"orders"}]
    value {"offset":41}        (the last mirrored upstream offset; the task resumes at 42)

Invariant: a source record is on B for a read_committed reader iff its offset is covered by
the store. A (re)started task first calls init_transactions (fencing the earlier producer of
its id and aborting whatever transaction it left open), then reads the store read_committed
to its end and resumes after it. A partition the store does not know starts at the flow's
source group offset (``mm2-A->B``, e.g. left by an at-least-once run), else per
``auto.offset.reset``.

Boundaries: ``transaction.boundary = poll`` (Connect's default: a transaction per poll) or
``interval`` (``transaction.boundary.interval.ms``, default ``offset.flush.interval.ms``).
Source side: only with ``A.consumer.isolation.level = read_committed`` are aborted source
transactions left out (MirrorSourceConnector.exactlyOnceSupport is SUPPORTED only then;
``exactly.once.support = required`` makes it a configuration error otherwise).

Offset syncs go out after the commit on the non-transactional sync producer (never naming
an aborted downstream offset); the source group's offsets are committed best effort every
``offset.flush.interval.ms`` for lag tools, always at or behind the store.

Failures: fenced (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH) means a newer instance runs the
task: it stops for good, as Connect fails a fenced task. Anything else restarts the task in
place (new producer, reread the store, seek after it), which is correct whatever the fate
of the failed transaction was.

Threading: one thread per flow runs every task of the flow in turn (so a reassignment
happens between transactions of all tasks); ``set_topics`` from the control thread swaps
one attribute; metrics read counters with a single writer.
"""
from __future__ import annotations

import json
import logging
import threading
import time

from kbroker.client import Consumer, Producer, TopicPartition
from kbroker.client import errors as E
from kbroker.mirror.offset_syncs import OffsetSyncWriter
from kbroker.mirror.source import PartitionStats
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)
CONNECTOR = "MirrorSourceConnector"
_FENCED = frozenset((ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH))
_TIMEOUT_S = 60.0


# -- the offsets store (Connect's offsets topic layout) -------------------------------------
def offset_key(source: str, tp: TopicPartition) -> bytes:
    """Connect's key: [connector name, MirrorUtils.wrapPartition] as compact JSON."""
    return json.dumps([CONNECTOR, {"cluster": source, "partition": tp.partition, "topic": tp.topic}],
                      separators=(",", ":")).encode()


def offset_value(offset: int) -> bytes:
    return b'{"offset":%d}' % offset


def parse_offset_record(source: str, key: bytes | None, value: bytes | None):
    """(TopicPartition, offset or None for a tombstone) of a record of this flow's source
    task, or None for anything else (other connectors, other source clusters, garbage)."""
    try:
        name, part = json.loads(key)
        if name != CONNECTOR or part.get("cluster") != source:
            return None
        tp = TopicPartition(str(part["topic"]), int(part["partition"]))
        return tp, (None if value is None else int(json.loads(value)["offset"]))
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def read_offsets(consumer_cfg: dict, topic: str, source: str, timeout_s: float = _TIMEOUT_S) -> dict:
    """{source TopicPartition: last mirrored offset} from the store, read_committed to its
    end (the last stable offset: nothing of an open transaction is taken)."""
    cfg = {k: v for k, v in consumer_cfg.items() if k not in ("group.id", "group.instance.id")}
    cfg.update({"isolation.level": "read_committed", "enable.auto.commit": False,
                "allow.auto.create.topics": False, "auto.offset.reset": "earliest"})
    c = Consumer(cfg)
    try:
        tps = [TopicPartition(topic, p) for p in c.partitions_for_topic(topic, timeout=timeout_s)]
        c.assign(tps)
        ends = c.end_offsets(tps, timeout=timeout_s)
        c.seek_to_beginning(tps)
        out: dict[TopicPartition, int] = {}
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp, timeout=timeout_s) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise E.KafkaTimeoutError(f"could not read {topic} to its end in {timeout_s}s")
            for r in c.poll(0.2):
                parsed = parse_offset_record(source, r.key, r.value)
                if parsed is not None:
                    if parsed[1] is None:
                        out.pop(parsed[0], None)
                    else:
                        out[parsed[0]] = parsed[1]
        return out
    finally:
        c.close()


def task_partitions(topics: dict[str, int], tasks: int) -> list[list[TopicPartition]]:
    """Every source partition dealt round robin over ``tasks``, in (topic, partition) order."""
    out: list[list[TopicPartition]] = [[] for _ in range(tasks)]
    for i, tp in enumerate(TopicPartition(t, p) for t in sorted(topics) for p in range(topics[t])):
        out[i % tasks].append(tp)
    return out


def is_fenced(producer, exc: BaseException) -> bool:
    txn = getattr(producer, "_txn", None) if producer is not None else None
    codes = {getattr(exc, "code", None), getattr(getattr(txn, "last_error", None), "code", None)}
    return bool(codes & _FENCED)


class _Task:
    """One source task: its partitions, its transactional producer, its consumer."""

    def __init__(self, owner: "ExactlyOnceSourceTask", task_id: int):
        self.owner, self.fc, self.id = owner, owner.fc, task_id
        self.transactional_id = owner.fc.transactional_id(task_id)
        self.consumer = Consumer(owner.consumer_cfg)
        self.producer = None
        self.partitions: list[TopicPartition] = []
        self.offsets: dict[TopicPartition, int] = {}     # last upstream offset committed on B
        self.start: dict[TopicPartition, int] = {}       # where a partition unknown to the store began
        self.txn: dict[TopicPartition, list] = {}        # open transaction: tp -> [(upstream, fut, ts, size)]
        self.began: float | None = None
        self.fenced = False
        self.broken = False
        self.committed_transactions = 0

    # -- lifecycle ----------------------------------------------------------------------
    def start_producer(self) -> None:
        if self.producer is not None:
            try:
                self.producer.close(0)
            except Exception:    # noqa: BLE001 - the old producer is being thrown away
                pass
            self.producer = None
        self.txn.clear()
        self.began = None
        p = Producer({**self.owner.producer_cfg, "transactional.id": self.transactional_id})
        try:
            p.init_transactions(_TIMEOUT_S)
        except BaseException:
            p.close(0)
            raise
        self.producer = p

    def assign(self, partitions: list[TopicPartition], store: dict) -> None:
        """Take ``partitions`` (no transaction open), positioned after the store."""
        self.partitions = list(partitions)
        self.consumer.assign(self.partitions)
        self.offsets = {tp: store[tp] for tp in self.partitions if tp in store}
        self.start = {tp: o for tp, o in self.start.items() if tp in partitions}
        for tp in self.partitions:
            if tp in self.offsets:
                self.consumer.seek(tp, self.offsets[tp] + 1)
            elif tp in self.start:
                self.consumer.seek(tp, self.start[tp])
            else:
                self.start[tp] = self.consumer.position(tp, timeout=_TIMEOUT_S)

    def close(self) -> None:
        for c in (self.producer, self.consumer):
            if c is not None:
                try:
                    c.close(5.0) if c is self.producer else c.close()
                except Exception:   # noqa: BLE001
                    pass
        self.producer = None

    # -- the loop -----------------------------------------------------------------------
    def poll_once(self, timeout_s: float) -> None:
        records = self.consumer.poll(timeout_s)
        if records:
            if self.began is None:
                self.producer.begin_transaction()
                self.began = time.monotonic()
            send, remote = self.producer.send, self.owner.remote
            for tp in records.partitions():
                topic = remote[tp.topic]
                dq = self.txn.get(tp)
                if dq is None:
                    dq = self.txn[tp] = []
                for r in records.records(tp):
                    fut = send(topic, r.value, r.key, r.partition, r.timestamp if r.timestamp >= 0 else None,
                               r.headers or None)
                    dq.append((r.offset, fut, r.timestamp,
                               (len(r.value) if r.value else 0) + (len(r.key) if r.key else 0)))
        if self.began is not None:
            boundary = self.owner.boundary_s
            if boundary is None or time.monotonic() - self.began >= boundary:
                self.commit()

    def commit(self) -> None:
        """Write the source offsets into the transaction and commit it."""
        if self.began is None:
            return
        fc, store, send = self.fc, self.fc.offset_storage_topic, self.producer.send
        for tp, dq in self.txn.items():
            if dq:
                send(store, offset_value(dq[-1][0]), offset_key(fc.source, tp))
        self.producer.commit_transaction(_TIMEOUT_S)
        self.committed_transactions += 1
        now_ms = time.time_ns() // 1_000_000
        writer, stats = self.owner.sync_writer, self.owner.stats
        for tp, dq in self.txn.items():
            if not dq:
                continue
            st = stats.get(tp)
            if st is None:
                st = stats[tp] = PartitionStats()
            lat_sum, lat_max, nbytes = 0, st.latency_max_ms, 0
            for upstream, fut, ts, size in dq:
                if writer is not None:
                    writer.maybe_queue(tp, upstream, fut[0].base_offset + fut[1])
                lat = now_ms - ts
                lat_sum += lat
                lat_max = max(lat_max, lat)
                nbytes += size
            st.records += len(dq)
            st.bytes += nbytes
            st.latency_sum_ms += lat_sum
            st.latency_max_ms = lat_max
            st.committed = dq[-1][0] + 1
            self.offsets[tp] = dq[-1][0]
        self.txn.clear()
        self.began = None

    def commit_group_offsets(self) -> None:
        """Best effort: the source group's offsets follow the store (lag tools read them)."""
        offsets = {tp: o + 1 for tp, o in self.offsets.items() if tp in self.partitions}
        if offsets:
            try:
                self.consumer.commit(offsets, timeout=10.0)
            except E.KafkaError as e:
                log.debug("%s task %d: source group commit failed: %s", self.fc.flow, self.id, e)

    def lag(self) -> dict[TopicPartition, int]:
        out = {}
        for tp in list(self.partitions):
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            done = self.offsets[tp] + 1 if tp in self.offsets else self.start.get(tp, 0)
            out[tp] = max(0, hw - done)
        return out


class ExactlyOnceSourceTask:
    """The flow's source side under exactly-once: ``tasks.max`` tasks run by one thread.
    Same surface as MirrorSourceTask (run, set_topics, stats, lag, failures)."""

    def __init__(self, fc, stop: threading.Event):
        self.fc = fc
        self.stop = stop
        self.consumer_cfg = {**fc.source_clients["consumer"], "group.id": fc.mirror_group_id,
                             "enable.auto.commit": False}
        self.consumer_cfg.setdefault("auto.offset.reset", "earliest")
        self.producer_cfg = {**fc.target_clients["producer"], "enable.idempotence": True,
                             "transaction.timeout.ms": fc["transaction.timeout.ms"]}
        self.producer_cfg.setdefault("acks", "all")
        self.boundary_s = fc.transaction_boundary_s
        self._flush_s = fc["offset.flush.interval.ms"] / 1000.0
        self._last_flush = time.monotonic()
        self.tasks = [_Task(self, i) for i in range(max(1, fc["tasks.max"]))]
        self.sync_writer = None
        self._sync_producer = None
        if fc["emit.offset-syncs.enabled"]:
            clients = fc.source_clients if fc.offset_syncs_on_source else fc.target_clients
            self._sync_producer = Producer(clients["producer"])
            self.sync_writer = OffsetSyncWriter(self._sync_producer, fc.offset_syncs_topic, fc["offset.lag.max"])
        self._pending_topics: dict | None = None
        self._topics: dict | None = None
        self.remote: dict[str, str] = {}
        self.stats: dict[TopicPartition, PartitionStats] = {}
        self.failures = 0
        self.initialized = False
        if not fc.read_committed:
            log.warning("%s: exactly-once with %s.consumer.isolation.level = read_uncommitted: records of "
                        "aborted or open source transactions are mirrored too (MM2: exactly-once UNSUPPORTED)",
                        fc.flow, fc.source)

    @property
    def assigned(self) -> frozenset:
        return frozenset(tp for t in self.tasks if not t.fenced for tp in t.partitions)

    def set_topics(self, topics: dict[str, int]) -> None:
        self._pending_topics = dict(topics)

    # -- the flow's source thread ---------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self._apply_topics()
                except E.KafkaError as e:
                    log.warning("%s: assigning the source partitions: %s; retrying", self.fc.flow, e)
                    self.stop.wait(1.0)
                    continue
                live = [t for t in self.tasks if t.partitions and not t.fenced]
                if not live:
                    self.stop.wait(0.1)
                    continue
                for t in live:
                    if t.broken and not self._restart(t):
                        continue
                    try:
                        t.poll_once(0.1 / len(live))
                    except E.KafkaError as e:
                        self._failed(t, e)
                if time.monotonic() - self._last_flush >= self._flush_s:
                    self._flush()
            for t in self.tasks:      # clean stop: commit what is open
                if t.began is not None and not t.fenced and not t.broken:
                    try:
                        t.commit()
                    except E.KafkaError as e:
                        log.warning("%s task %d: final commit failed (it is aborted): %s", self.fc.flow, t.id, e)
            self._flush()
        finally:
            self.close()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        for t in self.tasks:
            if not t.fenced and not t.broken:
                t.commit_group_offsets()
        if self.sync_writer is not None:
            self.sync_writer.promote_delayed()
            self.sync_writer.fire_pending()

    def _apply_topics(self) -> None:
        pending = self._pending_topics
        if pending is None:
            return
        if pending == self._topics:
            self._pending_topics = None
            return
        if not self.initialized:   # fence every zombie of this flow's task ids first (Connect's round)
            for t in self.tasks:
                if t.producer is None and not t.fenced:
                    t.start_producer()
            self.initialized = True
        shares = task_partitions(pending, len(self.tasks))
        changed = [(t, share) for t, share in zip(self.tasks, shares) if share != t.partitions and not t.fenced]
        for t, _ in changed:
            if t.began is not None:
                t.commit()
        store = read_offsets(self.fc.target_clients["consumer"], self.fc.offset_storage_topic, self.fc.source) \
            if changed else {}
        self.remote = {topic: self.fc.remote_topic(topic) for topic in pending}
        moved = [tp for t, share in changed for tp in t.partitions if tp not in share]
        for t, share in changed:
            t.assign(share, store)
            if share:
                log.info("%s task %d (%s): %s", self.fc.flow, t.id, t.transactional_id,
                         ", ".join(f"{tp.topic}-{tp.partition}" for tp in share))
        if self.sync_writer is not None:     # a partition's next owner starts a new sync lifetime
            self.sync_writer.forget(moved)
        self._topics = pending
        self._pending_topics = None

    def _failed(self, t: _Task, e: BaseException) -> None:
        if is_fenced(t.producer, e):
            log.error("%s task %d: fenced: another instance now runs %s; this task stops: %s",
                      self.fc.flow, t.id, t.transactional_id, e)
            t.fenced = True
            t.close()
            return
        self.failures += 1
        log.warning("%s task %d: %s; restarting the task from the committed source offsets",
                    self.fc.flow, t.id, e)
        t.broken = True
        self._restart(t)

    def _restart(self, t: _Task) -> bool:
        """New producer (fences the old one, resolves its transaction), reread the store,
        seek after it. Other tasks commit first so that no open transaction of ours holds
        the store's last stable offset back."""
        try:
            for other in self.tasks:
                if other is not t and other.began is not None and not other.broken and not other.fenced:
                    try:
                        other.commit()
                    except E.KafkaError as e:
                        log.warning("%s task %d: %s; it restarts next", self.fc.flow, other.id, e)
                        other.broken = True
            t.start_producer()
            store = read_offsets(self.fc.target_clients["consumer"], self.fc.offset_storage_topic, self.fc.source)
            t.assign(t.partitions, store)
            t.broken = False
            return True
        except E.KafkaError as e:
            if is_fenced(t.producer, e):
                self._failed(t, e)
                return False
            log.warning("%s task %d: restart failed: %s; retrying", self.fc.flow, t.id, e)
            self.stop.wait(1.0)
            return False

    def lag(self) -> dict[TopicPartition, int]:
        out = {}
        for t in self.tasks:
            if not t.fenced:
                out.update(t.lag())
        return out

    def close(self) -> None:
        for t in self.tasks:
            t.close()
        if self._sync_producer is not None:
            try:
                self._sync_producer.close(5.0)
            except Exception:   # noqa: BLE001
                pass
