"""LeaderEpochFileCache: leader epoch -> first offset written in that epoch.

Model: Kafka's ``LeaderEpochFileCache``. Entries ``(epoch, start_offset)``
are strictly increasing in both fields. Persisted to the partition's
``leader-epoch-checkpoint`` (see checkpoints.py) on every change.

Used for OffsetForLeaderEpoch (``end_offset_for``) and kept consistent with
the log by truncation from both ends. Thread-safety: guarded by the owning
Log's lock (all mutators are called with it held).
"""
from __future__ import annotations

import bisect

from kbroker.log.checkpoints import LeaderEpochCheckpointFile

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochFileCache:
    def __init__(self, checkpoint: LeaderEpochCheckpointFile | None, *, sync: bool = True):
        self._checkpoint = checkpoint
        self._sync = sync
        entries = checkpoint.read() if checkpoint is not None else []
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for e, o in entries:
            self._append(e, o)

    # -- helpers ----------------------------------------------------------------
    def _append(self, epoch: int, offset: int) -> None:
        self._epochs.append(epoch)
        self._offsets.append(offset)

    def _flush(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.write(self.epoch_entries(), sync=self._sync)

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
        while self._epochs and (self._epochs[-1] >= epoch or self._offsets[-1] >= start_offset):
            self._epochs.pop()
            self._offsets.pop()
        self._append(epoch, start_offset)
        self._flush()
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries with start_offset >= end_offset (log truncated to end_offset)."""
        if self._offsets and self._offsets[-1] >= end_offset:
            i = bisect.bisect_left(self._offsets, end_offset)
            del self._epochs[i:]
            del self._offsets[i:]
            self._flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below start_offset; the surviving first entry
        starts at start_offset (log start moved)."""
        if not self._offsets or self._offsets[0] >= start_offset:
            return
        i = bisect.bisect_right(self._offsets, start_offset) - 1  # entry containing start_offset
        del self._epochs[:i]
        del self._offsets[:i]
        self._offsets[0] = start_offset
        self._flush()

    def clear(self) -> None:
        self._epochs.clear()
        self._offsets.clear()
        self._flush()
