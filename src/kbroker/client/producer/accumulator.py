"""RecordAccumulator: per-partition queues of open batches (Kafka's RecordAccumulator).

Each TopicPartition has a deque of ``ProducerBatch``; the application thread appends to
the last one (a Cython ``BatchBuilder``), the sender thread ``drain``s the first one.
A batch is *ready* to send when it is full (or a later batch exists), when linger.ms
has passed since it was created, when a flush or close is in progress, or when
appenders are blocked on buffer.memory. Drained batches are built (compressed) once;
a retried batch is put back at the head of its deque with its bytes unchanged, so
retries stay in order ahead of newer batches.

buffer.memory: each open batch reserves max(batch.size, first record's size) bytes
from a pool (Kafka's BufferPool); the reservation is returned when the batch
completes. An append that needs a new batch while the pool is empty blocks up to
max.block.ms, then raises BufferExhaustedError.

Locking: one lock (``self._lock``) guards every deque, the ``open`` map and the pool. An
append to a partition's open batch takes no lock: ``producer_append.append`` (Cython) looks
up ``open[tp]`` and appends, atomically with respect to ``drain``, which closes a batch's
appender (under the lock) before building it; a record is therefore in the built batch
iff its append returned a future; the same call registers the record's delivery
callback. Only appends that need a new batch take the lock. The sender takes it once
per ready()/drain() pass. Batch completion (result and callbacks) happens outside the
lock in the sender thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from kbroker.client.errors import BufferExhaustedError, KafkaTimeoutError, RecordTooLargeError
from kbroker.client.metadata import TopicPartition
from kbroker.client.producer.future import BatchResult, RecordFuture
from kbroker.kernels import producer_append, records

_fast_append = producer_append.append

CODECS = {"none": records.NO_COMPRESSION, "gzip": records.GZIP, "snappy": records.SNAPPY,
          "lz4": records.LZ4, "zstd": records.ZSTD}

#: bytes a record adds beyond key and value at most (varints, attributes, deltas)
RECORD_OVERHEAD_MAX = 21


class ProducerBatch:
    """One record batch for one partition, from first append to completion.

    Open while its ``appender`` (a producer_append.OpenBatch over the Cython
    BatchBuilder) takes records: it is then the last batch of its partition's deque
    and the accumulator's ``open[tp]``. Closed for appends when full or drained
    (``appender.close()``, under the accumulator lock); owned by the sender thread once
    drained. ``buffer`` holds the built wire bytes after the first drain."""

    __slots__ = ("tp", "builder", "appender", "result", "created", "attempts", "last_attempt",
                 "buffer", "reserved", "drained", "producer_id", "producer_epoch", "base_sequence")

    def __init__(self, tp: TopicPartition, builder, created: float, reserved: int):
        self.tp = tp
        self.builder = builder
        self.result = BatchResult(tp.topic, tp.partition)
        self.appender = producer_append.OpenBatch(builder, self.result, RecordFuture)
        self.created = created
        self.attempts = 0
        self.last_attempt = created
        self.buffer: bytes | None = None
        self.reserved = reserved
        self.drained = 0.0
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1

    @property
    def record_count(self) -> int:
        return self.appender.record_count

    @property
    def full(self) -> bool:
        """No more appends (full, drained, expired or aborted)."""
        return self.appender.closed

    def close(self) -> bytes:
        """Build the batch (once); appends must be closed already."""
        if self.buffer is None:
            self.appender.close()
            self.buffer = self.builder.build()
            self.builder = None
        return self.buffer

    def complete(self, base_offset: int, log_append_time: int, error) -> None:
        self.result.complete(base_offset, log_append_time, error)


class RecordAccumulator:
    def __init__(self, config, wakeup):
        self.batch_size = config["batch.size"]
        self.linger_s = config["linger.ms"] / 1000.0
        self.retry_backoff_s = config["retry.backoff.ms"] / 1000.0
        self.delivery_timeout_s = config["delivery.timeout.ms"] / 1000.0
        self.compression = CODECS[config["compression.type"]]
        self.total_memory = config["buffer.memory"]
        self.max_request_size = config["max.request.size"]
        self._available = self.total_memory
        self._wakeup = wakeup
        self._lock = threading.Lock()
        self._memory_cond = threading.Condition(self._lock)
        self._waiters = 0
        #: the queued batches of each partition that has any: a partition whose deque
        #: empties leaves the map, so the sender's passes (ready, drain, expiry) cost what
        #: is queued, not every partition ever written (10,000 partitions round-robin)
        self.batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        #: the appender of each partition's open batch (the last of its deque). Read
        #: without the lock by the fast path; changed only under the lock.
        self.open: dict[TopicPartition, producer_append.OpenBatch] = {}
        self.incomplete: set[ProducerBatch] = set()
        self._flushes = 0
        self.closed = False
        self._drain_index = 0
        self._muted: set[TopicPartition] = set()

    # -- application thread -------------------------------------------------------------
    def append(self, tp: TopicPartition, timestamp: int, key, value, headers, max_block_s: float,
               callback=None) -> RecordFuture:
        """Append one record; returns its future.

        key and value are bytes or None, headers a list/tuple of (str, bytes|None).
        Raises BufferExhaustedError after max_block_s, RecordTooLargeError for a record
        above max.request.size or buffer.memory. The common case (room in the
        partition's open batch) is one Cython call and takes no lock."""
        f = _fast_append(self.open, tp, timestamp, key, value, headers, callback)
        if f is not None:
            return f
        return self._append_locked(tp, timestamp, key, value, headers, max_block_s, callback)

    def _append_locked(self, tp, timestamp, key, value, headers, max_block_s, callback):
        if type(tp) is not TopicPartition:
            tp = TopicPartition(*tp)
        with self._lock:
            ob = self.open.get(tp)
            if ob is not None:
                f = ob.try_append(timestamp, key, value, headers, callback)
                if f is not None:
                    return f
                del self.open[tp]            # full
            ks = len(key) if key is not None else -1
            vs = len(value) if value is not None else -1
            size = max(ks, 0) + max(vs, 0) + RECORD_OVERHEAD_MAX + records.RECORD_BATCH_OVERHEAD
            if headers:
                size += sum(len(h[0]) + (len(h[1]) if h[1] is not None else 0) + 10 for h in headers)
            if size > self.max_request_size:
                raise RecordTooLargeError(
                    f"The message is {size} bytes when serialized which is larger than "
                    f"{self.max_request_size}, which is the value of the max.request.size configuration.")
            if size > self.total_memory:
                raise RecordTooLargeError(
                    f"The message is {size} bytes when serialized which is larger than the total "
                    f"memory buffer you have configured with the buffer.memory configuration.")
            reserve = max(self.batch_size, size)
            self._reserve(reserve, max_block_s)
            # another thread may have opened a batch while we waited for memory
            ob = self.open.get(tp)
            f = ob.try_append(timestamp, key, value, headers, callback) if ob is not None else None
            if f is not None:
                self._available += reserve
                self._memory_cond.notify_all()
            else:
                if ob is not None:
                    del self.open[tp]
                builder = records.BatchBuilder(compression=self.compression, batch_size=self.batch_size)
                b = ProducerBatch(tp, builder, time.monotonic(), reserve)
                ob = b.appender
                f = ob.try_append(timestamp, key, value, headers, callback)  # the first record always fits
                # the deque is looked up after _reserve: its wait releases the lock, and a
                # drain may have emptied the partition's deque and dropped it meanwhile
                dq = self.batches.get(tp)
                if dq is None:
                    dq = self.batches[tp] = deque()
                dq.append(b)
                self.open[tp] = ob
                self.incomplete.add(b)
        # a new batch (and, if there was one, a full one before it): let the sender look
        self._wakeup()
        return f

    def _reserve(self, n: int, max_block_s: float) -> None:
        """Take n bytes from the pool (lock held); blocks up to max_block_s."""
        if self._available >= n:
            self._available -= n
            return
        deadline = time.monotonic() + max_block_s
        self._waiters += 1
        try:
            self._wakeup()
            while self._available < n:
                if self.closed:
                    from kbroker.client.errors import IllegalStateError
                    raise IllegalStateError("Producer closed while allocating memory")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BufferExhaustedError(
                        f"Failed to allocate {n} bytes within the configured max blocking time "
                        f"{int(max_block_s * 1000)} ms. Total memory: {self.total_memory} bytes. "
                        f"Available memory: {self._available} bytes.")
                self._memory_cond.wait(left)
            self._available -= n
        finally:
            self._waiters -= 1

    def begin_flush(self) -> None:
        with self._lock:
            self._flushes += 1
        self._wakeup()

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    def await_flush(self, timeout_s: float | None) -> bool:
        """Wait until every batch existing now completed; False on timeout."""
        with self._lock:
            pending = [b.result for b in self.incomplete]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for r in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not r.wait(left):
                return False
        return True

    def has_incomplete(self) -> bool:
        return bool(self.incomplete)

    # -- sender thread ------------------------------------------------------------------
    def ready(self, cluster, now: float):
        """(ready leader node ids, seconds until the next batch may become ready,
        topics whose leader is unknown)."""
        ready_nodes = set()
        unknown = set()
        next_check = self.linger_s if self.linger_s > 0 else 0.1
        with self._lock:
            exhausted = self._waiters > 0
            drain_all = exhausted or self._flushes > 0 or self.closed
            for tp, dq in self.batches.items():
                if not dq:
                    continue
                leader = cluster.leader_for(tp)
                if leader < 0:
                    unknown.add(tp.topic)
                    continue
                if leader in ready_nodes or tp in self._muted:
                    continue
                b = dq[0]
                if b.attempts > 0:
                    wait = b.last_attempt + self.retry_backoff_s - now
                    if wait > 0:
                        next_check = min(next_check, wait)
                        continue
                    ready_nodes.add(leader)
                    continue
                if drain_all or b.full or len(dq) > 1:
                    ready_nodes.add(leader)
                    continue
                wait = b.created + self.linger_s - now
                if wait <= 0:
                    ready_nodes.add(leader)
                else:
                    next_check = min(next_check, wait)
        return ready_nodes, next_check, unknown

    def drain(self, cluster, capacity: dict[int, int], now: float,
              mute: bool) -> dict[int, list[list[ProducerBatch]]]:
        """Batches for up to ``capacity[node]`` ProduceRequests to each ready node.

        Each request holds at most one batch per partition (a v3+ ProduceRequest carries
        one batch per partition) and at most max.request.size bytes. The first request
        to a node takes every partition's head batch, as Kafka's drain does; the next
        ones only batches ready on their own (full, lingered, flushing, retried) so an
        open batch is not cut short. Draining several requests in one pass lets the
        sender keep max.in.flight.requests.per.connection requests in flight with one
        GIL acquisition and one socket write. Batches are built (compressed) outside the
        lock. With ``mute`` (max.in.flight=1) a drained partition is muted until its
        batch completes."""
        out: dict[int, list[list[ProducerBatch]]] = {}
        with self._lock:
            tps = list(self.batches)
            if not tps:
                return out
            start = self._drain_index % len(tps)
            self._drain_index += 1
            order = [(tp, cluster.leader_for(tp)) for tp in tps[start:] + tps[:start]]
            order = [(tp, leader) for tp, leader in order if capacity.get(leader, 0) > 0]
            drain_all = self._waiters > 0 or self._flushes > 0 or self.closed
            linger_s, backoff_s, max_size = self.linger_s, self.retry_backoff_s, self.max_request_size
            rounds = max(capacity.values(), default=0)
            for r in range(rounds):
                this_round: dict[int, list[ProducerBatch]] = {}
                size_by_node: dict[int, int] = {}
                for tp, leader in order:
                    if capacity[leader] <= r:
                        continue
                    dq = self.batches.get(tp)
                    if not dq or tp in self._muted:
                        continue
                    b = dq[0]
                    if b.attempts > 0 and now < b.last_attempt + backoff_s:
                        continue
                    if r and not (drain_all or b.full or len(dq) > 1 or b.attempts > 0
                                  or now - b.created >= linger_s):
                        continue
                    est = b.builder.size_in_bytes() if b.builder is not None else len(b.buffer)
                    used = size_by_node.get(leader, 0)
                    if used and used + est > max_size:
                        continue
                    size_by_node[leader] = used + est
                    dq.popleft()
                    if not dq:
                        del self.batches[tp]
                    b.appender.close()
                    if self.open.get(tp) is b.appender:
                        del self.open[tp]
                    this_round.setdefault(leader, []).append(b)
                    if mute:
                        self._muted.add(tp)
                if not this_round:
                    break
                for node, bs in this_round.items():
                    out.setdefault(node, []).append(bs)
        # building (and compressing) happens outside the lock so appenders keep going
        for reqs in out.values():
            for bs in reqs:
                for b in bs:
                    b.close()
                    b.drained = now
        return out

    def unmute(self, tp: TopicPartition) -> None:
        with self._lock:
            self._muted.discard(tp)

    def reenqueue(self, b: ProducerBatch, now: float) -> None:
        """Put a batch to retry back at the head of its deque (Kafka's reenqueue). A batch
        with a sequence number goes in sequence order among the retries already at the
        head (Kafka's insertInSequenceOrder): batches failed together (a dropped
        connection fails every in-flight request of it, oldest first) are sent again in
        their original order, so the leader sees no gap in the producer's sequences."""
        b.attempts += 1
        b.last_attempt = now
        with self._lock:
            dq = self.batches.setdefault(b.tp, deque())
            if b.base_sequence < 0:
                dq.appendleft(b)
                return
            ahead = []
            while dq and dq[0].base_sequence >= 0 and dq[0].base_sequence < b.base_sequence:
                ahead.append(dq.popleft())
            dq.appendleft(b)
            for x in reversed(ahead):
                dq.appendleft(x)

    def expired_batches(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches older than delivery.timeout.ms."""
        out = []
        with self._lock:
            emptied = []
            for tp, dq in self.batches.items():
                while dq and now - dq[0].created >= self.delivery_timeout_s:
                    b = dq.popleft()
                    b.appender.close()
                    if self.open.get(tp) is b.appender:
                        del self.open[tp]
                    out.append(b)
                if not dq:
                    emptied.append(tp)
            for tp in emptied:
                del self.batches[tp]
        return out

    def abort_all(self) -> list[ProducerBatch]:
        with self._lock:
            out = [b for dq in self.batches.values() for b in dq]
            self.batches.clear()
            for b in out:
                b.appender.close()
            self.open.clear()
        return out

    def deallocate(self, b: ProducerBatch) -> None:
        """Return a completed batch's memory to the pool."""
        with self._lock:
            self.incomplete.discard(b)
            self._available += b.reserved
            b.reserved = 0
            if self._waiters:
                self._memory_cond.notify_all()

    def complete(self, b: ProducerBatch, base_offset: int, log_append_time: int, error) -> None:
        self.deallocate(b)
        b.complete(base_offset, log_append_time, error)

    def expire_error(self, b: ProducerBatch, now: float) -> KafkaTimeoutError:
        return KafkaTimeoutError(
            f"Expiring {b.record_count} record(s) for {b.tp.topic}-{b.tp.partition}: "
            f"{int((now - b.created) * 1000)} ms has passed since batch creation")
