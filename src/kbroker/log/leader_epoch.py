"""LeaderEpochFileCache: leader epoch -> first offset written in that epoch.

Model: Kafka's ``LeaderEpochFileCache``. Entries ``(epoch, start_offset)``
are strictly increasing in both fields. Persisted to the partition's
``leader-epoch-checkpoint`` (see checkpoints.py, tmp + fsync + rename).

When the file is written (KAFKA-15046: no fsync on the request path):

* not ``deferred`` (a bare Log, tools, tests): synchronously on every change;
* ``deferred`` (logs of a LogManager): a change only marks the cache dirty; the
  owning Log calls :meth:`flush` before its recovery point moves (roll flushes on
  the scheduler thread, flush.ms / flush.messages, shutdown) and when it closes.
  So **every entry whose start offset is below the recovery point is in the
  file**; entries at or above it may be missing or stale after a crash, and
  recovery (recovery.py) rebuilds them from the batches it scans, which start at
  the segment holding the recovery point.

Used for OffsetForLeaderEpoch (``end_offset_for``) and kept consistent with
the log by truncation from both ends. Thread-safety: mutators are called with
the owning Log's lock held; ``_lock`` guards the entries against a concurrent
:meth:`flush` (which runs without the Log's lock), and ``_write_lock`` orders
file writes (each write holds the entries as of its own start, so a later
write is never older).
"""
from __future__ import annotations

import bisect
import threading

from kbroker.log.checkpoints import LeaderEpochCheckpointFile

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochFileCache:
    def __init__(self, checkpoint: LeaderEpochCheckpointFile | None, *, sync: bool = True, deferred: bool = False):
        self._checkpoint = checkpoint
        self._sync = sync
        self._deferred = deferred
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._dirty = False          # entries differ from the file
        entries = checkpoint.read() if checkpoint is not None else []
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for e, o in entries:
            self._append(e, o)

    # -- helpers ----------------------------------------------------------------
    def _append(self, epoch: int, offset: int) -> None:
        self._epochs.append(epoch)
        self._offsets.append(offset)

    def _changed(self) -> None:
        """After a mutation (caller holds ``_lock``): write now, or just mark dirty."""
        if self._checkpoint is None:
            return
        self._dirty = True
        if not self._deferred:
            # synchronous mode: the caller holds _lock, so writes are already ordered
            self._checkpoint.write(self.epoch_entries(), sync=self._sync)
            self._dirty = False

    @property
    def dirty(self) -> bool:
        """Entries not yet in the checkpoint file."""
        return self._dirty

    def flush(self, sync: bool = True) -> None:
        """Write the entries to the checkpoint file (fsynced) if they changed since the
        last write. Called by the Log before it moves its recovery point and when it
        closes. Never called with the entries' ``_lock`` held."""
        with self._write_lock:
            with self._lock:
                if not self._dirty or self._checkpoint is None:
                    return
                entries = self.epoch_entries()
                self._dirty = False
            try:
                self._checkpoint.write(entries, sync=self._sync and sync)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise

    def moved(self, path: str) -> None:
        """The partition directory was renamed: later writes go to ``path``."""
        with self._write_lock:
            if self._checkpoint is not None:
                self._checkpoint = LeaderEpochCheckpointFile(path)

    def discard(self) -> None:
        """The log is being deleted: never write the file again."""
        with self._write_lock:
            self._checkpoint = None
            self._dirty = False

    # -- queries ----------------------------------------------------------------
    def epoch_entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets))

    def is_empty(self) -> bool:
        return not self._epochs

    @property
    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        return (self._epochs[0], self._offsets[0]) if self._epochs else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """Epoch of the entry whose range contains ``offset`` (floor by start offset)."""
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch (Kafka's endOffsetFor).

        The end offset of an epoch is the start offset of the next higher
        epoch, or log_end_offset for the latest epoch. An epoch below the
        first entry answers (requested_epoch, first start offset); one
        above the latest (or UNDEFINED_EPOCH) answers (-1, -1).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if requested_epoch == self._epochs[-1]:
            return (requested_epoch, log_end_offset)
        hi = bisect.bisect_right(self._epochs, requested_epoch)  # first epoch > requested
        if hi >= len(self._epochs):
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if hi == 0:
            return (requested_epoch, self._offsets[0])
        return (self._epochs[hi - 1], self._offsets[hi])

    # -- mutators ---------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` unless the latest
        entry already is ``epoch`` at or below that offset. Entries it would
        contradict (epoch >= or start offset >= the new one) are removed
        from the end first, as Kafka does."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._epochs and self._epochs[-1] == epoch and self._offsets[-1] <= start_offset:
            return False  # Kafka's isUpdateNeeded
        with self._lock:
            while self._epochs and (self._epochs[-1] >= epoch or self._offsets[-1] >= start_offset):
                self._epochs.pop()
                self._offsets.pop()
            self._append(epoch, start_offset)
            self._changed()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries with start_offset >= end_offset (log truncated to end_offset)."""
        if self._offsets and self._offsets[-1] >= end_offset:
            with self._lock:
                i = bisect.bisect_left(self._offsets, end_offset)
                del self._epochs[i:]
                del self._offsets[i:]
                self._changed()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below start_offset; the surviving first entry
        starts at start_offset (log start moved)."""
        if not self._offsets or self._offsets[0] >= start_offset:
            return
        with self._lock:
            i = bisect.bisect_right(self._offsets, start_offset) - 1  # entry containing start_offset
            del self._epochs[:i]
            del self._offsets[:i]
            self._offsets[0] = start_offset
            self._changed()

    def clear(self) -> None:
        with self._lock:
            self._epochs.clear()
            self._offsets.clear()
            self._changed()
