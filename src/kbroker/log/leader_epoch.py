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
the owning Log's append lock held; queries take no lock (the Log's lock-free
readers call them): the entries are one immutable ``(epochs, offsets)`` pair of
tuples, replaced whole by each mutation. :meth:`flush` runs without the Log's lock:
``_write_lock`` orders file writes, each of the state as of its own start (a mutation
replaces the state before it marks the cache dirty; a flush clears the mark before it
reads the state), so a later write is never older.
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
        self._write_lock = threading.Lock()
        self._dirty = False          # entries may differ from the file
        entries = checkpoint.read() if checkpoint is not None else []
        #: (epochs, offsets): tuples, strictly increasing, replaced together
        self._state: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        epochs: list[int] = []
        offsets: list[int] = []
        for e, o in entries:
            epochs.append(e)
            offsets.append(o)
        self._set(epochs, offsets)
        #: the state the file holds (None: unknown); read and replaced under _write_lock.
        #: A flush of a state equal to it writes nothing: recovery after a crash drops the
        #: entries of the segments it scans and assigns them again from the batches,
        #: mostly the same ones (each write is a file creation and an fsync per log).
        self._persisted = self._state if checkpoint is not None else None

    # -- helpers ----------------------------------------------------------------
    def _set(self, epochs, offsets) -> None:
        self._state = (tuple(epochs), tuple(offsets))

    def _flush(self) -> None:
        """After a mutation (append lock held, state already replaced): write now, or
        (deferred) just mark the cache dirty."""
        if self._checkpoint is None:
            return
        self._dirty = True
        if not self._deferred:
            self._persisted = None
            self._checkpoint.write(self.epoch_entries(), sync=self._sync)
            self._persisted = self._state
            self._dirty = False

    @property
    def dirty(self) -> bool:
        """Entries not yet in the checkpoint file."""
        return self._dirty

    def flush(self, sync: bool = True) -> None:
        """Write the entries to the checkpoint file (fsynced unless ``sync=False``) if
        they changed since the last write. Called by the Log before it moves its
        recovery point and when it closes."""
        with self._write_lock:
            if not self._dirty or self._checkpoint is None:
                return
            self._dirty = False
            state = self._state
            if state == self._persisted:
                return
            self._persisted = None
            entries = list(zip(state[0], state[1]))
            try:
                self._checkpoint.write(entries, sync=self._sync and sync)
            except BaseException:
                self._dirty = True
                raise
            self._persisted = state

    def moved(self, path: str) -> None:
        """The partition directory was renamed: later writes go to ``path``."""
        with self._write_lock:
            if self._checkpoint is not None:
                self._checkpoint = LeaderEpochCheckpointFile(path)
                self._persisted = None

    def discard(self) -> None:
        """The log is being deleted: never write the file again."""
        with self._write_lock:
            self._checkpoint = None
            self._dirty = False

    # -- queries ----------------------------------------------------------------
    def epoch_entries(self) -> list[tuple[int, int]]:
        epochs, offsets = self._state
        return list(zip(epochs, offsets))

    def is_empty(self) -> bool:
        return not self._state[0]

    @property
    def latest_epoch(self) -> int | None:
        epochs = self._state[0]
        return epochs[-1] if epochs else None

    @property
    def earliest_entry(self) -> tuple[int, int] | None:
        epochs, offsets = self._state
        return (epochs[0], offsets[0]) if epochs else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """Epoch of the entry whose range contains ``offset`` (floor by start offset)."""
        epochs, offsets = self._state
        i = bisect.bisect_right(offsets, offset) - 1
        return epochs[i] if i >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch (Kafka's endOffsetFor).

        The end offset of an epoch is the start offset of the next higher
        epoch, or log_end_offset for the latest epoch. An epoch below the
        first entry answers (requested_epoch, first start offset); one
        above the latest (or UNDEFINED_EPOCH) answers (-1, -1).
        """
        epochs, offsets = self._state
        if requested_epoch == UNDEFINED_EPOCH or not epochs:
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if requested_epoch == epochs[-1]:
            return (requested_epoch, log_end_offset)
        hi = bisect.bisect_right(epochs, requested_epoch)  # first epoch > requested
        if hi >= len(epochs):
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        if hi == 0:
            return (requested_epoch, offsets[0])
        return (epochs[hi - 1], offsets[hi])

    # -- mutators (append lock held) ---------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` unless the latest
        entry already is ``epoch`` at or below that offset. Entries it would
        contradict (epoch >= or start offset >= the new one) are removed
        from the end first, as Kafka does."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        epochs, offsets = (list(t) for t in self._state)
        if epochs and epochs[-1] == epoch and offsets[-1] <= start_offset:
            return False  # Kafka's isUpdateNeeded
        while epochs and (epochs[-1] >= epoch or offsets[-1] >= start_offset):
            epochs.pop()
            offsets.pop()
        epochs.append(epoch)
        offsets.append(start_offset)
        self._set(epochs, offsets)
        self._flush()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries with start_offset >= end_offset (log truncated to end_offset)."""
        epochs, offsets = self._state
        if offsets and offsets[-1] >= end_offset:
            i = bisect.bisect_left(offsets, end_offset)
            self._set(epochs[:i], offsets[:i])
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below start_offset; the surviving first entry
        starts at start_offset (log start moved)."""
        epochs, offsets = self._state
        if not offsets or offsets[0] >= start_offset:
            return
        i = bisect.bisect_right(offsets, start_offset) - 1  # entry containing start_offset
        self._set(epochs[i:], (start_offset,) + offsets[i + 1:])
        self._flush()

    def clear(self) -> None:
        self._set((), ())
        self._flush()
