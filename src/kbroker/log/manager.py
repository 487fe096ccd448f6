"""LogManager: the log directories, the logs in them, and their background tasks.

Model: Kafka's ``LogManager`` (core/.../log/LogManager.scala).

Each log dir holds ``<topic>-<partition>/`` directories plus Kafka's
checkpoint files (checkpoints.py): ``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``, ``replication-offset-checkpoint`` (high
watermarks), ``meta.properties`` and, after a clean shutdown,
``.kafka_cleanshutdown``.

Start-up (``startup`` / ``load_logs``): for each dir, read the checkpoints,
open every partition directory (recovery.py decides what to scan: nothing
after a clean shutdown), drop ``*-delete`` directories, then remove the
clean-shutdown marker so a later crash is not mistaken for a clean stop.

Background tasks (one daemon thread; all are also callable directly, with an
injected clock, for tests): retention every ``log.retention.check.interval.ms``,
flush of logs older than their ``flush.ms`` every
``log.flush.scheduler.interval.ms``, recovery-point and log-start
checkpoints every ``log.flush.offset.checkpoint.interval.ms`` /
``log.flush.start.offset.checkpoint.interval.ms``, completion of delayed
segment deletions, expiry of idle producer ids (``producer.id.expiration.ms``)
every ``producer.id.expiration.check.interval.ms``, and one-off roll flushes
handed over by the logs.

Shutdown (``shutdown``): stop the thread, flush and close every log (on
``num.recovery.threads.per.data.dir`` threads per dir; on a local file system
without per-file fsyncs, then one ``syncfs`` per dir), write all checkpoints
with recovery point = log end offset, then write the clean-shutdown marker in
each dir.

Compaction: ``cleaner`` is a LogCleaner (kbroker/log/cleaner.py; None with
``log.cleaner.enable=false``), started and stopped with the background
tasks; the retention pass calls its ``maybe_clean(log)`` for every log
whose cleanup.policy includes ``compact`` (it wakes the cleaner threads).

Thread-safety: the logs map is guarded by ``_lock``; each Log guards itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import itertools
import logging
import os
import shutil
import threading
import time
import uuid
from typing import Callable, Iterable, Mapping

from kbroker.log import checkpoints
from kbroker.log.checkpoints import (
    LOG_START_OFFSET_CHECKPOINT, META_PROPERTIES, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError, OffsetCheckpointFile, fsync_dir, has_clean_shutdown, read_meta_properties,
    remove_clean_shutdown,
    write_clean_shutdown, write_meta_properties,
)
from kbroker.log.config import LONG_MAX, LogConfig, LogManagerConfig
from kbroker.log.errors import KafkaStorageError
from kbroker.log.log import Log, parse_topic_partition_name
from kbroker.log.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from kbroker.log.segment import LOG_SUFFIX as LOG_FILE_SUFFIX

log = logging.getLogger(__name__)

DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
STRAY_DIR_SUFFIX = "-stray"

TopicPartition = tuple  # (topic: str, partition: int)

#: an unclean start-up loads a log on a recovery thread if it has this much to scan
#: (LogManager._load_dir); less is interpreter work, done on the loading thread
_PARALLEL_RECOVERY_BYTES = 1 << 20


def _recovery_bytes(path: str, recovery_point: int) -> int:
    """The bytes an unclean load of the partition directory ``path`` scans: its
    segments from the one holding ``recovery_point`` on (recovery.py); as many as
    _PARALLEL_RECOVERY_BYTES if the directory cannot be read (the load will say why)."""
    try:
        bases = []
        for name in os.listdir(path):
            if name.endswith(LOG_FILE_SUFFIX):
                try:
                    bases.append(int(name[:-len(LOG_FILE_SUFFIX)]))
                except ValueError:
                    continue
        below = [b for b in bases if b <= recovery_point]
        first = max(below) if below else min(bases, default=0)
        return sum(os.stat(os.path.join(path, f"{b:020d}{LOG_FILE_SUFFIX}")).st_size
                   for b in bases if b >= first)
    except OSError:
        return _PARALLEL_RECOVERY_BYTES


#: how often the deletion tick looks at every log (see LogManager._delete_pending_tick)
FULL_DELETE_SWEEP_MS = 60000

#: producer.id.expiration.check.interval.ms (Kafka's internal default: 10 minutes)
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT = 600000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Scheduler:
    """A tiny single-thread scheduler: periodic tasks plus one-off jobs."""

    def __init__(self, name: str, time_ms: Callable[[], int]):
        self._name = name
        self._time_ms = time_ms
        self._cv = threading.Condition()
        self._heap: list = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def schedule(self, fn: Callable[[], None], delay_ms: int = 0, period_ms: int | None = None) -> None:
        with self._cv:
            if self._stopped:
                return
            heapq.heappush(self._heap, (self._time_ms() + delay_ms, next(self._seq), fn, period_ms))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped:
                    now = self._time_ms()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    wait = (self._heap[0][0] - now) / 1000 if self._heap else None
                    self._cv.wait(min(wait, 1.0) if wait is not None else 1.0)
                if self._stopped:
                    return
                due, _, fn, period = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # a failing task must not kill the scheduler
                log.exception("background task %r failed", fn)
            if period is not None and period < LONG_MAX:
                self.schedule(fn, period, period)

    def shutdown(self) -> None:
        with self._cv:
            self._stopped = True
            self._heap.clear()
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


class LogManager:
    """All logs of this broker (see module docstring)."""

    def __init__(self, log_dirs: Iterable[str] | None = None, default_config: LogConfig | None = None, *,
                 manager_config: LogManagerConfig | None = None, time_ms: Callable[[], int] | None = None,
                 topic_overrides: Callable[[str], Mapping] | None = None, broker_epoch: int = -1,
                 background: bool = True, producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
                 producer_id_expiration_check_interval_ms: int = PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT):
        self.manager_config = manager_config or LogManagerConfig(
            log_dirs=tuple(log_dirs) if log_dirs is not None else LogManagerConfig().log_dirs)
        if log_dirs is not None:
            self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        else:
            self.log_dirs = [os.path.abspath(d) for d in self.manager_config.log_dirs]
        self.default_config = default_config or LogConfig()
        self._time_ms = time_ms or _now_ms
        self._topic_overrides = topic_overrides
        self._broker_epoch = broker_epoch
        self._background = background
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producer_id_expiration_check_interval_ms = producer_id_expiration_check_interval_ms
        self._lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._logs: dict[TopicPartition, Log] = {}
        self._dir_counts: dict[str, int] = {}   # log dir -> logs in it (guarded by _lock)
        self._last_checkpoints: dict[str, dict] = {}   # file path -> offsets last written
        #: bumped by every log's high-watermark change and by every log added or removed
        #: (Log.hw_changes); the HW checkpoint task scans the logs only when it moved
        self._hw_changes = [0]
        self._hw_checkpointed = -1     # _hw_changes[0] as of the last HW checkpoint
        self._loading = False
        self._pending_logs: set = set()    # logs the retention pass left deletions in (guarded by _lock)
        self._last_full_delete_sweep_ms = self._time_ms()
        self._dir_sync_batch: dict[int, set] = {}    # thread id -> log dirs to fsync (batched_dir_sync)
        self._topic_configs: dict[str, LogConfig] = {}
        self._logs_to_delete: list[tuple[int, Log]] = []
        self._scheduler = _Scheduler("kbroker-log-manager", self._time_ms)
        self.cleaner = None  # LogCleaner (kbroker/log/cleaner.py), unless log.cleaner.enable=false
        mc = self.manager_config
        if mc.cleaner_enable and mc.cleaner_threads > 0:
            from kbroker.log.cleaner import CleanerConfig, LogCleaner
            self.cleaner = LogCleaner(self.log_dirs, lambda: self.logs, CleanerConfig(
                num_threads=mc.cleaner_threads, dedupe_buffer_size=mc.cleaner_dedupe_buffer_size,
                dedupe_buffer_load_factor=mc.cleaner_io_buffer_load_factor,
                io_buffer_size=mc.cleaner_io_buffer_size, backoff_ms=mc.cleaner_backoff_ms,
                max_io_buffer_size=max(self.default_config.max_message_bytes, mc.cleaner_io_buffer_size)),
                time_ms=self._time_ms)
        self._started = False
        self._shut_down = False
        self.load_stats: dict[str, float] = {}

    # -- configuration ---------------------------------------------------------------
    @classmethod
    def from_broker_config(cls, props: Mapping, **kw) -> "LogManager":
        mc = LogManagerConfig.from_broker(props)
        for key, name in (("producer.id.expiration.ms", "producer_id_expiration_ms"),
                          ("producer.id.expiration.check.interval.ms", "producer_id_expiration_check_interval_ms")):
            if key in props and name not in kw:
                value = int(props[key])
                if value < 1:
                    raise KafkaStorageError(f"{key} must be at least 1, got {value}")
                kw[name] = value
        return cls(mc.log_dirs, LogConfig.from_broker(props), manager_config=mc, **kw)

    def config_for(self, topic: str) -> LogConfig:
        cfg = self._topic_configs.get(topic)
        if cfg is None:
            overrides = self._topic_overrides(topic) if self._topic_overrides else None
            cfg = self.default_config.with_overrides(overrides) if overrides else self.default_config
        return cfg

    def update_topic_config(self, topic: str, overrides: Mapping | None) -> LogConfig:
        """Apply new topic-level overrides to the topic's logs (AlterConfigs).
        Segment-shape settings take effect for new segments."""
        cfg = self.default_config.with_overrides(overrides or {})
        with self._lock:
            self._topic_configs[topic] = cfg
            logs = [lg for (t, _), lg in self._logs.items() if t == topic]
        for lg in logs:
            lg.config = cfg
            lg.set_fsync_every_append(self._fsync_mode(cfg))
        return cfg

    def update_broker_defaults(self, default_config: LogConfig, fsync_every_append: bool) -> None:
        """Dynamic broker configs: a new broker-wide default LogConfig (and broker fsync
        mode) for every live log; each topic keeps its own overrides on top."""
        with self._lock:
            self.default_config = default_config
            self.manager_config = dataclasses.replace(self.manager_config, fsync_every_append=fsync_every_append)
            self._topic_configs = {t: default_config.with_overrides(c.originals)
                                   for t, c in self._topic_configs.items()}
            logs = list(self._logs.values())
        for lg in logs:
            cfg = self.config_for(lg.topic)
            lg.config = cfg
            lg.set_fsync_every_append(self._fsync_mode(cfg))

    def _fsync_mode(self, cfg: LogConfig) -> bool:
        return self.manager_config.fsync_every_append or cfg.kbroker_fsync_every_append

    # -- start-up -----------------------------------------------------------------------
    def ensure_meta_properties(self, node_id: int, cluster_id: str) -> None:
        """Write a KRaft meta.properties in each dir that lacks one; check the
        cluster id of those that have one."""
        for d in self.log_dirs:
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, META_PROPERTIES)
            if os.path.exists(path):
                props = read_meta_properties(path)
                if props.get("cluster.id") != cluster_id:
                    raise KafkaStorageError(
                        f"The cluster id {cluster_id} doesn't match stored cluster id "
                        f"{props.get('cluster.id')} in {path}")
                if props.get("node.id") not in (None, str(node_id)):
                    raise KafkaStorageError(
                        f"Stored node id {props.get('node.id')} doesn't match node.id {node_id} in {path}")
            else:
                write_meta_properties(path, node_id=node_id, cluster_id=cluster_id, directory_id=uuid.uuid4())

    def startup(self) -> None:
        """Load every log, then start the background tasks."""
        self.load_logs()
        if self._background:
            self._start_background()
            if self.cleaner is not None:
                self.cleaner.startup()
        self._started = True

    def load_logs(self) -> None:
        """Open every partition directory of every log dir: on this thread, but after an
        unclean stop the logs with much to scan on ``num.recovery.threads.per.data.dir``
        threads per dir meanwhile (Kafka's recovery threads: the CRC scans run without
        the GIL; see _load_dir)."""
        t0 = time.perf_counter()
        clean_dirs = 0
        self._loading = True
        # Every object the load makes lives as long as its log: a cyclic garbage
        # collection finds nothing to free, and the growing heap made the automatic ones
        # a third of a 10,000-log load (seven full passes). The collections after the
        # load look at them once (``kbroker serve`` then freezes its start-up objects).
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            for d in self.log_dirs:
                clean_dirs += self._load_dir(d)
        finally:
            self._loading = False
            if gc_enabled:
                gc.enable()
        self.load_stats = {"seconds": time.perf_counter() - t0, "logs": len(self._logs),
                           "clean_dirs": clean_dirs}
        log.info("Loaded %d logs in %.0f ms (%d of %d log dirs shut down cleanly)", len(self._logs),
                 1000 * self.load_stats["seconds"], clean_dirs, len(self.log_dirs))

    def _load_dir(self, d: str) -> bool:
        os.makedirs(d, exist_ok=True)
        clean = has_clean_shutdown(d)
        recovery_points = self._read_checkpoint(d, RECOVERY_POINT_CHECKPOINT)
        log_starts = self._read_checkpoint(d, LOG_START_OFFSET_CHECKPOINT)
        hws = self._read_checkpoint(d, REPLICATION_OFFSET_CHECKPOINT)
        jobs = []
        with os.scandir(d) as it:
            entries = sorted((e for e in it if e.is_dir()), key=lambda e: e.name)  # d_type: no stat
        for e in entries:
            name, path = e.name, e.path
            if name.endswith(DELETE_DIR_SUFFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            if name.endswith(FUTURE_DIR_SUFFIX) or name.endswith(STRAY_DIR_SUFFIX):
                continue
            try:
                tp = parse_topic_partition_name(name)
            except ValueError:
                continue
            if tp[0] == "__cluster_metadata":
                continue  # a KRaft node's metadata log (Kafka's loadLogs skips it): the raft manager's
            jobs.append((tp, path))

        def load(job):
            tp, path = job
            cfg = self.config_for(tp[0])
            lg = Log.open(path, cfg, log_start_offset=log_starts.get(tp, 0),
                          recovery_point=recovery_points.get(tp, 0), high_watermark=hws.get(tp),
                          had_clean_shutdown=clean, time_ms=self._time_ms,
                          fsync_every_append=self._fsync_mode(cfg), scheduler=self._schedule_job,
                          producer_id_expiration_ms=self.producer_id_expiration_ms)
            with self._lock:
                if tp in self._logs:
                    raise KafkaStorageError(f"Duplicate log directories for {tp} found: "
                                            f"{self._logs[tp].dir}, {path}")
                self._logs[tp] = lg
                self._count(lg, 1)

        # A log whose load scans little (nothing after a clean shutdown, a small active
        # segment after a crash) is a few small reads and interpreter work: with the GIL
        # a second thread only adds hand-offs (10,000 logs: ~15% more CPU and wall time
        # clean, ~25% after a crash). Those load on this thread; the recovery threads
        # take the logs with at least _PARALLEL_RECOVERY_BYTES to scan, whose CRC scans
        # run without the GIL (log_scan), meanwhile.
        big = [] if clean else [j for j in jobs if _recovery_bytes(
            j[1], recovery_points.get(j[0], 0)) >= _PARALLEL_RECOVERY_BYTES]
        if big:
            on_threads = {tp for tp, _ in big}
            small = [j for j in jobs if j[0] not in on_threads]
            self._run_parallel(load, big, caller_items=small)
        else:
            self._run_parallel(load, jobs, threads=1)
        # Kafka deletes the marker once every log of the dir is loaded.
        remove_clean_shutdown(d)
        return clean

    def _run_parallel(self, fn, items, threads: int | None = None, caller_items=()) -> list:
        """``fn(item)`` for every item on ``threads`` threads (default
        ``num.recovery.threads.per.data.dir`` per log dir; 1: on the calling thread), and
        for every one of ``caller_items`` on the calling thread meanwhile; waits for all,
        then raises the first error. Returns the errors."""
        items = list(items)
        if threads is None:
            threads = max(1, self.manager_config.recovery_threads_per_data_dir) * len(self.log_dirs)
        if threads == 1 or len(items) + (1 if caller_items else 0) < 2:
            for item in itertools.chain(items, caller_items):
                fn(item)
            return []
        # Each thread takes the next item from one shared iterator (its next() runs under
        # the GIL): no Future per item for the calling thread to build (10,000 of them
        # competed for the GIL with the workers at a clean stop).
        it = iter(items)
        errors: list = []

        def work() -> None:
            for item in it:
                try:
                    fn(item)
                except BaseException as e:
                    errors.append(e)

        workers = [threading.Thread(target=work, name=f"kbroker-log-recovery-{i}", daemon=True)
                   for i in range(min(threads, len(items)))]
        for t in workers:
            t.start()
        caller_error = None
        for item in caller_items:
            try:
                fn(item)
            except Exception as e:
                caller_error = e
                break
        for t in workers:
            t.join()
        if caller_error is not None:
            raise caller_error
        if errors:
            raise errors[0]
        return errors

    @staticmethod
    def _read_checkpoint(d: str, name: str) -> dict:
        try:
            return OffsetCheckpointFile(os.path.join(d, name)).read()
        except (CheckpointError, OSError) as e:
            log.warning("Error reading %s in %s (%s); ignoring it", name, d, e)
            return {}

    def _start_background(self) -> None:
        mc = self.manager_config
        s = self._scheduler
        s.start()
        s.schedule(self._safe(self.cleanup_logs), 30000, mc.retention_check_interval_ms)
        if mc.flush_check_interval_ms < LONG_MAX:
            s.schedule(self._safe(self.flush_dirty_logs), 30000, mc.flush_check_interval_ms)
        s.schedule(self._safe(self.checkpoint_recovery_offsets), 30000,
                   max(mc.flush_recovery_offset_checkpoint_interval_ms, 1))
        s.schedule(self._safe(self.checkpoint_log_start_offsets), 30000,
                   max(mc.flush_start_offset_checkpoint_interval_ms, 1))
        s.schedule(self._safe(self._delete_pending_tick), 1000, 1000)
        s.schedule(self._safe(self.remove_expired_producers), self.producer_id_expiration_check_interval_ms,
                   self.producer_id_expiration_check_interval_ms)

    def schedule(self, fn: Callable[[], None], delay_ms: int, period_ms: int | None = None) -> None:
        """Run ``fn`` on the log manager's scheduler thread (errors are logged)."""
        self._scheduler.schedule(self._safe(fn), delay_ms, period_ms)

    @staticmethod
    def _safe(fn):
        def run():
            try:
                fn()
            except Exception:
                log.exception("log manager task %s failed", fn.__name__)
        run.__name__ = fn.__name__
        return run

    def _schedule_job(self, fn: Callable[[], None]) -> bool:
        """Given to each Log: queue a roll flush for the background thread.
        False (the log then runs it itself, outside its lock) without one."""
        if self._background and (self._started or self._loading) and not self._shut_down:
            self._scheduler.schedule(self._safe(fn))
            return True
        return False

    # -- logs -------------------------------------------------------------------------------
    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tuple(tp))

    @property
    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def all_logs(self) -> list[Log]:
        with self._lock:
            return list(self._logs.values())

    def _next_log_dir(self) -> str:
        """The dir with the fewest logs (Kafka's nextLogDirs). Lock held; O(dirs)."""
        if len(self.log_dirs) == 1:
            return self.log_dirs[0]
        counts = self._dir_counts
        return min(self.log_dirs, key=lambda d: (counts.get(d, 0), self.log_dirs.index(d)))

    def _count(self, lg: Log, delta: int) -> None:
        """A log added (+1) or removed (-1), lock held."""
        parent = os.path.dirname(lg.dir)
        self._dir_counts[parent] = self._dir_counts.get(parent, 0) + delta
        lg.hw_changes = self._hw_changes
        self._hw_changes[0] += 1

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None, *, topic_id=None) -> Log:
        """The log of ``tp``, created (in the dir with the fewest logs) if absent."""
        tp = (tp[0], int(tp[1]))
        with self._lock:
            lg = self._logs.get(tp)
            if lg is not None:
                if topic_id is not None and lg.topic_id is None:
                    lg.set_topic_id(topic_id)
                return lg
            if not tp[0] or "/" in tp[0] or tp[0] in (".", ".."):
                raise ValueError(f"invalid topic name {tp[0]!r}")
            cfg = config or self.config_for(tp[0])
            parent = self._next_log_dir()
            path = os.path.join(parent, f"{tp[0]}-{tp[1]}")
            batch = self._dir_sync_batch.get(threading.get_ident())
            fsync_mode = self._fsync_mode(cfg)
            lg = Log.open(path, cfg, had_clean_shutdown=True, time_ms=self._time_ms, topic_id=topic_id,
                          fsync_every_append=fsync_mode, scheduler=self._schedule_job,
                          producer_id_expiration_ms=self.producer_id_expiration_ms,
                          sync_parent_dir=batch is None)
            if batch is not None and fsync_mode:
                batch.add(parent)     # other new logs sync their log dir at their first flush
            self._logs[tp] = lg
            self._count(lg, 1)
            return lg

    create_log = get_or_create_log

    @contextlib.contextmanager
    def batched_dir_sync(self):
        """Logs with fsync-every-append this thread creates inside the block fsync their
        own directory but not their log dir; each log dir that got one is fsynced once
        when the block ends (CreateTopics: one fsync per topic instead of one per
        partition). Nothing may rely on those logs' durability before the block ends.
        (Other new logs fsync nothing at creation: their first flush does, Log.open.)"""
        tid = threading.get_ident()
        if tid in self._dir_sync_batch:
            yield
            return
        dirs: set[str] = set()
        self._dir_sync_batch[tid] = dirs
        try:
            yield
        finally:
            del self._dir_sync_batch[tid]
            for d in sorted(dirs):
                fsync_dir(d)

    def delete_log(self, tp: TopicPartition) -> Log | None:
        """Remove ``tp``: its directory is renamed ``<topic>-<p>.<uuid>-delete``
        at once and removed after file.delete.delay.ms (or at next start-up)."""
        tp = (tp[0], int(tp[1]))
        with self._lock:
            lg = self._logs.pop(tp, None)
            if lg is not None:
                self._count(lg, -1)
        if lg is None:
            return None
        if self.cleaner is not None:
            self.cleaner.abort_cleaning(tp, os.path.dirname(lg.dir))
        new_dir = os.path.join(os.path.dirname(lg.dir),
                               f"{tp[0]}-{tp[1]}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        lg.rename_dir(new_dir)
        due = self._time_ms() + lg.config.file_delete_delay_ms
        with self._lock:
            self._logs_to_delete.append((due, lg))
        if lg.config.file_delete_delay_ms == 0:
            self.delete_pending()
        return lg

    # -- background tasks (callable synchronously) --------------------------------------------
    def cleanup_logs(self, now_ms: int | None = None) -> int:
        """One retention pass over every log; returns segments deleted."""
        total = 0
        for lg in self.all_logs():
            if lg.closed:
                continue
            if lg.config.compact and self.cleaner is not None:
                self.cleaner.maybe_clean(lg)
            deleted = lg.delete_old_segments(now_ms)
            if deleted:
                with self._lock:
                    self._pending_logs.add(lg)
            total += deleted
        return total

    def remove_expired_producers(self, now_ms: int | None = None) -> int:
        """Drop producer ids idle for producer.id.expiration.ms from every log's
        producer state (Kafka's PeriodicProducerExpirationCheck). Returns how many."""
        n = 0
        for lg in self.all_logs():
            if not lg.closed:
                n += len(lg.remove_expired_producers(now_ms))
        return n

    def flush_dirty_logs(self, now_ms: int | None = None) -> int:
        """Flush every log whose last flush is at least its flush.ms ago."""
        now = self._time_ms() if now_ms is None else now_ms
        n = 0
        for lg in self.all_logs():
            if lg.closed:
                continue
            if now - lg.last_flush_time_ms >= lg.config.flush_ms and lg.unflushed_messages > 0:
                lg.flush()
                n += 1
        return n

    def delete_pending(self, now_ms: int | None = None, *, logs=None) -> int:
        """Complete delayed deletions of segments (of ``logs``, default every log) and
        of deleted logs."""
        now = self._time_ms() if now_ms is None else now_ms
        n = 0
        still = set()
        for lg in self.all_logs() if logs is None else logs:
            if lg.pending_deletes:    # no lock taken for the (many) logs with none
                n += lg.delete_pending_segments(now)
                if lg.pending_deletes:
                    still.add(lg)
        with self._lock:
            if logs is None:
                self._pending_logs = still
            else:
                self._pending_logs.difference_update(lg for lg in logs if lg not in still)
        with self._lock:
            ready = [lg for due, lg in self._logs_to_delete if due <= now]
            self._logs_to_delete = [(d, lg) for d, lg in self._logs_to_delete if d > now]
        for lg in ready:
            lg.delete()
            n += 1
        return n

    def _delete_pending_tick(self) -> None:
        """The once-a-second deletion task: the logs the retention pass left deletions
        in, and every log only each FULL_DELETE_SWEEP_MS (deletions from truncation
        or compaction wait at most that much longer than file.delete.delay.ms)."""
        now = self._time_ms()
        if now - self._last_full_delete_sweep_ms >= FULL_DELETE_SWEEP_MS:
            self._last_full_delete_sweep_ms = now
            self.delete_pending(now)
        else:
            with self._lock:
                logs = list(self._pending_logs)
            self.delete_pending(now, logs=logs)

    def _offsets_by_dir(self, fn) -> dict[str, dict]:
        out: dict[str, dict] = {d: {} for d in self.log_dirs}
        if len(self.log_dirs) == 1:
            out[self.log_dirs[0]] = {tp: fn(lg) for tp, lg in self.logs.items()}
            return out
        for tp, lg in self.logs.items():
            parent = os.path.dirname(lg.dir)
            if parent in out:
                out[parent][tp] = fn(lg)
        return out

    def _write_checkpoints(self, name: str, fn) -> None:
        """Write one checkpoint file per log dir, unless its offsets are those it was
        last written with (an idle broker rewrites nothing)."""
        with self._checkpoint_lock:
            for d, offsets in self._offsets_by_dir(fn).items():
                path = os.path.join(d, name)
                if self._last_checkpoints.get(path) == offsets:
                    continue
                OffsetCheckpointFile(path).write(offsets)
                self._last_checkpoints[path] = offsets

    def checkpoint_recovery_offsets(self) -> None:
        self._write_checkpoints(RECOVERY_POINT_CHECKPOINT, lambda lg: lg.recovery_point)

    def checkpoint_log_start_offsets(self) -> None:
        # Kafka writes only logs whose start offset is above their first segment's base.
        self._write_checkpoints(LOG_START_OFFSET_CHECKPOINT, lambda lg: lg.log_start_offset)

    def checkpoint_high_watermarks(self) -> None:
        """replication-offset-checkpoint (Kafka: ReplicaManager's HW checkpoint, every
        replica.high.watermark.checkpoint.interval.ms). Nothing is scanned unless a high
        watermark moved or a log came or went since the last one (an idle broker with
        10,000 partitions spent most of its idle CPU here)."""
        changes = self._hw_changes[0]        # read first: a later change is seen next time
        if changes == self._hw_checkpointed:
            return
        self._write_checkpoints(REPLICATION_OFFSET_CHECKPOINT, lambda lg: lg.high_watermark)
        self._hw_checkpointed = changes

    # -- shutdown ------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Clean shutdown (see module docstring). Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        if self.cleaner is not None:
            self.cleaner.shutdown()
        self._scheduler.shutdown()
        logs = self.all_logs()
        errors = []
        # One syncfs per log dir after every log is written replaces an fsync per file
        # (segments, indexes, snapshots, epoch checkpoints, directories) where the file
        # system makes that equivalent (checkpoints.SYNCFS_FILE_SYSTEMS); the
        # clean-shutdown marker is written only after it.
        barrier = bool(logs) and all(
            checkpoints.file_system_type(d) in checkpoints.SYNCFS_FILE_SYSTEMS for d in self.log_dirs)

        def flush_and_close(lg: Log) -> None:
            try:
                lg.flush(sync=not barrier)
            except Exception as e:  # keep closing it, and the others
                errors.append(e)
            try:
                lg.close(sync=not barrier)
            except Exception as e:
                errors.append(e)

        # Kafka flushes and closes the logs of each dir on num.recovery.threads.per.data.dir
        # threads: the time goes to file-system calls, which run without the GIL.
        self._run_parallel(flush_and_close, logs)
        if barrier:
            for d in self.log_dirs:
                try:
                    if not checkpoints.syncfs(d):
                        raise KafkaStorageError(f"could not sync the file system of {d}")
                except (OSError, KafkaStorageError) as e:
                    errors.append(e)
        self.checkpoint_recovery_offsets()
        self.checkpoint_log_start_offsets()
        self.checkpoint_high_watermarks()
        self.delete_pending(now_ms=LONG_MAX)
        if errors:
            log.error("errors during log shutdown: %s; not writing the clean shutdown marker", errors)
            return
        for d in self.log_dirs:
            write_clean_shutdown(d, self._broker_epoch)
