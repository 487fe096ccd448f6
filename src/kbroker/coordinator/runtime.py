"""CoordinatorRuntime: the plumbing every coordinator over an internal topic shares.

Kafka: ``coordinator-common/.../runtime/CoordinatorRuntime.java`` (used by its group,
share and transaction coordinators), in kbroker's threading model. A coordinator
keeps its state in the partitions of one compacted internal topic
(``__consumer_offsets``, ``__transaction_state``); an id belongs to partition
``abs(java hashCode(id)) % num_partitions``. The runtime owns, once for all of them:

* the partition table: each partition this node coordinates is LOADING or ACTIVE
  (absent: not ours). :meth:`partition_error` is the answer a request for a
  partition gets before it reaches the state machine: COORDINATOR_NOT_AVAILABLE
  (runtime not started or shut down), COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR.
* loading: :meth:`startup` / :meth:`load_partition` replay a partition's records
  (control batches skipped) into the :class:`CoordinatorShard`, on a loader thread
  or inline; :meth:`unload_partition` hands the partition back (leadership moved).
  Both are what the broker calls when leadership of the internal topic changes.
* the write path: :meth:`append` encodes records (``(key, value)`` byte pairs, value
  None = tombstone) as one v2 batch and appends it through the :class:`CoordinatorLog`
  (acks=all), calling back with ``(error_code, base_offset)`` once written. A state
  machine turns a request into records and a response, appends, and answers (and
  makes the change visible, or reverts it) in the callback.
* timers and purgatories: :meth:`new_purgatory` makes a purgatory on the runtime's
  clock; :meth:`advance_timers` runs every due task (tests with a fake clock and
  ``reaper_enabled=False``); :meth:`shutdown` closes them all.

Locking: ``_lock`` guards the partition table and the load queue only; it is a leaf
lock, never held while calling the shard or the log. The shard's ``load`` runs
without it (on the loader thread, or the caller's), and its ``unload`` after the
partition left the table.

The log seam (:class:`CoordinatorLog`) and its implementations live here too:
:class:`InMemoryCoordinatorLog` (tests, with failure and delay injection),
:class:`LogCoordinatorLog` (real ``kbroker.log.Log`` objects) and
:class:`ReplicaCoordinatorLog` (through the ReplicaManager: the broker's path).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterable, Iterator, Protocol

from kbroker.kernels import records as _records
from kbroker.protocol import ErrorCode
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.timer import SystemTimer, monotonic_ms

log = logging.getLogger(__name__)

__all__ = ["CoordinatorRuntime", "CoordinatorShard", "CoordinatorLog", "InMemoryCoordinatorLog",
           "LogCoordinatorLog", "ReplicaCoordinatorLog", "encode_records", "java_string_hashcode",
           "partition_for", "LOADING", "ACTIVE"]

LOADING = "loading"
ACTIVE = "active"

AppendCallback = Callable[[int, int], None]  # (error_code, base_offset)


# -- partitioning ---------------------------------------------------------------------

def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, int32 wrap-around)."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def partition_for(key: str, num_partitions: int) -> int:
    """``Utils.abs(key.hashCode) % num_partitions`` (abs(MIN_VALUE) = 0), Kafka's rule for
    both ``__consumer_offsets`` (group id) and ``__transaction_state`` (transactional id)."""
    h = java_string_hashcode(key)
    return (0 if h == -0x80000000 else abs(h)) % num_partitions


def encode_records(kvs: Iterable[tuple[bytes, bytes | None]], timestamp_ms: int, *, producer_id: int = -1,
                   producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False) -> bytes:
    """One uncompressed v2 batch (base offset 0; the log assigns offsets). With a producer
    id: a producer's batch (``transactional``: part of its transaction, e.g. TxnOffsetCommit)."""
    if producer_id < 0:
        return _records.encode_batch([(timestamp_ms, k, v, ()) for k, v in kvs])
    return _records.encode_batch([(timestamp_ms, k, v, ()) for k, v in kvs], producer_id=producer_id,
                                 producer_epoch=producer_epoch, base_sequence=base_sequence,
                                 is_transactional=transactional)


# -- the log ------------------------------------------------------------------------------

class CoordinatorLog(Protocol):
    """What a coordinator needs from the broker's partitions of its internal topic.

    ``append``: append ``batch`` (one v2 batch, offsets unassigned) to the
    partition with acks=all semantics and call ``callback(error_code,
    base_offset)`` exactly once when it is durable (or failed; base_offset
    -1), possibly before returning, possibly later on another thread.
    ``read_batches``: the partition's batches from its log start to its end,
    decoded (objects iterable over records with ``offset``/``key``/``value``).
    """

    def append(self, partition: int, batch: bytes, callback: AppendCallback) -> None: ...

    def read_batches(self, partition: int) -> Iterable: ...


class InMemoryCoordinatorLog:
    """A :class:`CoordinatorLog` in memory, for tests.

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


class LogCoordinatorLog:
    """A :class:`CoordinatorLog` over real ``kbroker.log.Log`` objects, appending inline.

    ``log_for(partition)`` returns the open ``Log`` of the internal topic's partition
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


class ReplicaCoordinatorLog:
    """A :class:`CoordinatorLog` through the broker's ReplicaManager (the production path).

    Appends to ``topic`` go through ``replica_manager.append_records`` with acks=all
    and ``internal_topics_allowed`` (so the high watermark, the produce and fetch
    purgatories and append listeners all see them); reads come straight from the
    partition's log. ``timeout_ms``: offsets.commit.timeout.ms /
    transaction.state.log's request timeout.
    """

    def __init__(self, replica_manager, topic: str, timeout_ms: int = 5000) -> None:
        self._rm = replica_manager
        self.topic = topic
        self._timeout_ms = timeout_ms
        self._reader = LogCoordinatorLog(self._log_for)

    def _log_for(self, partition: int):
        part = self._rm.get_partition((self.topic, partition))
        if part is None:
            raise KeyError(f"{self.topic}-{partition} is not hosted here")
        return part.log

    def append(self, partition: int, batch: bytes, callback: AppendCallback, verification_guard=None) -> None:
        """``verification_guard``: a transactional batch's KIP-890 guard (TxnOffsetCommit)."""
        tp = (self.topic, partition)

        def respond(results) -> None:
            r = results.get(tp)
            if r is None:
                callback(int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), -1)
            else:
                err = int(r.error)
                callback(err, r.base_offset if err == 0 else -1)

        self._rm.append_records(self._timeout_ms, -1, {tp: bytearray(batch)}, respond,
                                internal_topics_allowed=True,
                                verification_guards=None if verification_guard is None else {tp: verification_guard})

    def read_batches(self, partition: int) -> Iterator:
        if self._rm.get_partition((self.topic, partition)) is None:
            return iter(())
        return self._reader.read_batches(partition)


# -- the runtime ------------------------------------------------------------------------------

class CoordinatorShard(Protocol):
    """The state machine a runtime drives (one object for all partitions of its topic).

    ``load(partition, records)``: replay ``records`` (the partition's data records in
    offset order; objects with ``offset``, ``key``, ``value``) into fresh state for
    the partition and install it; returns how many entities (groups, transactional
    ids) it loaded. Called with the partition LOADING; it becomes ACTIVE after.
    ``unload(partition)``: drop the partition's state and answer its waiters
    NOT_COORDINATOR; called after the partition left the table.
    ``on_loaded(partition)`` (optional): called once the partition is ACTIVE, for work
    that needs it served (the transaction coordinator resends pending markers).
    ``load_batches(partition, batches)`` (optional, instead of ``load``): the decoded
    batches themselves, control batches included (the group coordinator replays
    transactional offset commits and the markers that end them).
    """

    def load(self, partition: int, records: Iterator) -> int: ...

    def unload(self, partition: int) -> None: ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class CoordinatorRuntime:
    """See the module docstring. Thread-safe.

    ``topic``: the internal topic (log messages). ``time_ms``: the wall clock for
    record timestamps — and, when given, the timers' clock too (tests inject one fake
    clock and call :meth:`advance_timers`). ``reaper_enabled=False``: nothing runs
    timers but :meth:`advance_timers`.
    """

    def __init__(self, name: str, topic: str, num_partitions: int, coordinator_log: CoordinatorLog,
                 shard: CoordinatorShard, *, time_ms: Callable[[], int] | None = None,
                 reaper_enabled: bool = True, broker_id: int = 0) -> None:
        self.name = name
        self.topic = topic
        self.num_partitions = num_partitions
        self.log = coordinator_log
        self.shard = shard
        self.time_ms = time_ms or _wall_ms
        self._timer_clock = time_ms or monotonic_ms
        self._reaper_enabled = reaper_enabled
        self._broker_id = broker_id
        self._purgatories: list[DelayedOperationPurgatory] = []
        self._lock = threading.Lock()
        self._partitions: dict[int, str] = {}
        self._active = False
        self._loader: threading.Thread | None = None
        self._load_queue: list[int] = []
        self._load_cond = threading.Condition(self._lock)

    # -- timers ---------------------------------------------------------------------------

    def new_purgatory(self, name: str, timer_name: str) -> DelayedOperationPurgatory:
        """A purgatory on the runtime's clock; its timer also serves plain timer tasks."""
        p = DelayedOperationPurgatory(name, SystemTimer(timer_name, clock_ms=self._timer_clock),
                                      broker_id=self._broker_id, reaper_enabled=self._reaper_enabled)
        self._purgatories.append(p)
        return p

    def advance_timers(self) -> None:
        """Run every timer task due by the clock (tests with ``reaper_enabled=False``)."""
        for _ in range(100):
            ran = False
            for p in self._purgatories:
                ran = p.timer.advance_clock(0) or ran
            if not ran:
                return

    # -- partitions --------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self._active

    def partition_for(self, key: str) -> int:
        return partition_for(key, self.num_partitions)

    def partition_state(self, partition: int) -> str | None:
        """LOADING, ACTIVE, or None (not coordinated here)."""
        return self._partitions.get(partition)

    def owns(self, partition: int) -> bool:
        """True if this runtime is started and coordinates ``partition`` (loaded or loading)."""
        return self._active and partition in self._partitions

    def any_loading(self) -> bool:
        with self._lock:
            return any(s == LOADING for s in self._partitions.values())

    def active_partitions(self) -> list[int]:
        with self._lock:
            return sorted(p for p, s in self._partitions.items() if s == ACTIVE)

    def partition_error(self, partition: int) -> ErrorCode | None:
        """None if ``partition`` is loaded here, else what a request for it is answered."""
        if not self._active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        state = self._partitions.get(partition)
        if state == LOADING:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if state != ACTIVE:
            return ErrorCode.NOT_COORDINATOR
        return None

    def startup(self, partitions: Iterable[int] | None = None, *, background: bool = True) -> None:
        """Become active and load ``partitions`` (default: all of them).

        ``background``: load on a loader thread (requests for a partition still
        loading get COORDINATOR_LOAD_IN_PROGRESS); else load before returning.
        """
        if partitions is None:
            partitions = range(self.num_partitions)
        self._active = True
        parts = list(partitions)
        if background:
            with self._lock:
                for p in parts:
                    self._partitions[p] = LOADING
                self._load_queue.extend(parts)
                if self._loader is None:
                    self._loader = threading.Thread(target=self._load_loop, name=f"{self.name}-loader",
                                                    daemon=True)
                    self._loader.start()
                self._load_cond.notify_all()
        else:
            for p in parts:
                self.load_partition(p)

    def schedule_load(self, partition: int) -> None:
        """Load ``partition`` on the loader thread (leadership gained while running)."""
        self.startup([partition], background=True)

    def wait_loaded(self, timeout_s: float = 30.0) -> bool:
        """Block until no partition is loading (tests, start-up)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while any(s == LOADING for s in self._partitions.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._load_cond.wait(min(left, 0.1))
        return True

    def _load_loop(self) -> None:
        while True:
            with self._lock:
                while not self._load_queue and self._active:
                    self._load_cond.wait()     # every queue change and shutdown notify
                if not self._active:
                    self._loader = None
                    return
                p = self._load_queue.pop(0)
                if self._partitions.get(p) != LOADING:
                    continue
            try:
                self.load_partition(p)
            except Exception:
                log.exception("loading %s-%d failed", self.topic, p)
                with self._lock:
                    self._partitions.pop(p, None)
                    self._load_cond.notify_all()

    def _records(self, partition: int) -> Iterator:
        for batch in self.log.read_batches(partition):
            if getattr(batch, "is_control", False):
                continue
            yield from batch

    def load_partition(self, partition: int) -> int:
        """Replay ``<topic>-<partition>`` into the shard and serve it; returns what the shard loaded."""
        with self._lock:
            self._partitions[partition] = LOADING
        start = self.time_ms()
        try:
            load_batches = getattr(self.shard, "load_batches", None)
            if load_batches is not None:
                n = load_batches(partition, self.log.read_batches(partition))
            else:
                n = self.shard.load(partition, self._records(partition))
        except BaseException:
            with self._lock:
                self._partitions.pop(partition, None)
                self._load_cond.notify_all()
            raise
        with self._lock:
            unloaded = self._partitions.get(partition) != LOADING  # unloaded while loading
            if not unloaded:
                self._partitions[partition] = ACTIVE
            self._load_cond.notify_all()
        if unloaded:
            self.shard.unload(partition)
            return 0
        on_loaded = getattr(self.shard, "on_loaded", None)
        if on_loaded is not None:
            on_loaded(partition)
        log.log(logging.INFO if n else logging.DEBUG, "%s: loaded %d from %s-%d in %d ms", self.name, n,
                self.topic, partition, self.time_ms() - start)
        return n

    def unload_partition(self, partition: int) -> None:
        """Stop serving the partition (leadership moved away); the shard drops its state."""
        with self._lock:
            self._partitions.pop(partition, None)
            self._load_cond.notify_all()
        self.shard.unload(partition)

    def shutdown(self) -> None:
        """Unload everything (waiters get NOT_COORDINATOR), stop the timers. Idempotent."""
        self._active = False
        with self._lock:
            self._load_cond.notify_all()
            parts = list(self._partitions)
        for p in parts:
            self.unload_partition(p)
        for p in self._purgatories:
            p.shutdown()

    # -- the write path ----------------------------------------------------------------------

    def append(self, partition: int, kvs: list, callback: AppendCallback, verification_guard=None,
               **producer) -> None:
        """Append ``kvs`` ((key, value) pairs) as one batch; ``callback(error_code, base_offset)``
        exactly once, when written (acks=all) or failed. ``producer``: the batch's producer
        fields (see :func:`encode_records`); ``verification_guard``: its KIP-890 guard."""
        try:
            batch = encode_records(kvs, self.time_ms(), **producer)
            if verification_guard is None:
                self.log.append(partition, batch, callback)
            else:
                self.log.append(partition, batch, callback, verification_guard=verification_guard)
        except Exception:
            log.exception("append to %s-%d failed", self.topic, partition)
            callback(int(ErrorCode.UNKNOWN_SERVER_ERROR), -1)
