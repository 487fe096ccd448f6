"""Start-up load and crash recovery of one partition directory (Kafka's ``LogLoader``).

Steps, in order:

1. Leftovers of interrupted operations:
   ``*.deleted`` files are removed (their deletion was already decided);
   ``*.cleaned`` files are removed (a cleaner run that did not reach the swap
   phase); ``*.swap`` files whose base offset is >= the smallest ``.cleaned``
   base offset are removed (their swap never completed); remaining ``.log.swap``
   files replace the segments they cover (those are deleted and the swap is
   renamed, its indexes rebuilt); index ``.swap`` files are removed.
   ``*.tmp`` checkpoint leftovers are removed. Index files without a
   ``.log`` are removed (orphans).
2. Every ``.log`` becomes a LogSegment; one whose index files are missing is
   recovered (indexes rebuilt) at once, unless both are missing and it holds at
   most ``index.interval.bytes``: its indexes are empty (a clean close creates
   no files for them, LogSegment.close).
3. Without a clean-shutdown marker, every segment from the one holding the
   recovery point on is recovered: CRC + structure scan with the log_scan
   kernel, truncation at the first invalid byte, indexes rebuilt, and the
   leader-epoch entries from that segment's base offset on rebuilt from the
   batches (the checkpoint file may lag: it is written asynchronously). If a
   segment was truncated, every later segment is deleted (it cannot follow
   a hole). With the marker, nothing is scanned: only the active segment's
   tail is read to find the log end offset.
4. An empty directory gets a first segment at the log start offset; a log
   that ends below the checkpointed log start offset is emptied and
   restarted there (Kafka does the same).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from kbroker.log.config import LogConfig
from kbroker.log.segment import (
    CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX, LogSegment, offset_from_filename,
)

log = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    segments: list
    log_start_offset: int
    next_offset: int
    recovery_point: int
    truncated_bytes: int
    recovered_segments: int
    #: the directory's names as load_log listed them (its snapshot files are still
    #: there); None when not listed
    names: list | None = None


def _is_index(name: str) -> bool:
    return name.endswith(INDEX_SUFFIX) or name.endswith(TIME_INDEX_SUFFIX) or name.endswith(TXN_INDEX_SUFFIX)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


_LEFTOVER_TAILS = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, ".tmp")


def _resolve_leftovers(dir: str, config: LogConfig, time_ms, names: list[str]) -> list[str] | None:
    """Step 1 over the directory's ``names``; returns them when it changed nothing (None
    if it did)."""
    changed = False
    swaps: list[str] = []
    min_cleaned = None
    for name in names:
        if not name.endswith(_LEFTOVER_TAILS):
            continue
        path = os.path.join(dir, name)
        if name.endswith(DELETED_SUFFIX):
            _remove(path)
            changed = True
        elif name.endswith(CLEANED_SUFFIX):
            changed = True
            try:
                base = offset_from_filename(name)
                min_cleaned = base if min_cleaned is None else min(min_cleaned, base)
            except ValueError:
                pass
            _remove(path)
        elif name.endswith(SWAP_SUFFIX):
            swaps.append(name)
        elif name.endswith(".tmp"):
            _remove(path)
            changed = True
    if not swaps:
        return None if changed else names
    for name in swaps:
        path = os.path.join(dir, name)
        try:
            base = offset_from_filename(name)
        except ValueError:
            _remove(path)
            continue
        if min_cleaned is not None and base >= min_cleaned:
            log.info("Deleting invalid swap file %s (min cleaned offset %d)", path, min_cleaned)
            _remove(path)
        elif name.endswith(TXN_INDEX_SUFFIX + SWAP_SUFFIX):
            # aborted transactions cannot be rebuilt from a cleaned segment: kept; completed
            # with its .log swap below, or now if that one is already live
            log_swap = name[: -len(TXN_INDEX_SUFFIX + SWAP_SUFFIX)] + LOG_SUFFIX + SWAP_SUFFIX
            if log_swap not in swaps and not os.path.exists(os.path.join(dir, log_swap)):
                os.replace(path, path[: -len(SWAP_SUFFIX)])
        elif not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            _remove(path)  # index swaps: indexes are rebuilt
    for name in sorted(os.listdir(dir)):
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            continue
        base = offset_from_filename(name)
        swap = LogSegment(dir, base, config, time_ms, file_suffix=SWAP_SUFFIX)
        try:
            swap.recover()
            end = swap.read_next_offset()
        finally:
            swap.close_handlers()
        # Delete every segment the swap replaces: base offsets in [base, end).
        for other in os.listdir(dir):
            if other.endswith(LOG_SUFFIX):
                ob = offset_from_filename(other)
                if base <= ob < end:
                    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                        _remove(os.path.join(dir, f"{ob:020d}{suffix}"))
        prefix = os.path.join(dir, f"{base:020d}")
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            _remove(prefix + suffix + SWAP_SUFFIX)
            _remove(prefix + suffix)
        if os.path.exists(prefix + TXN_INDEX_SUFFIX + SWAP_SUFFIX):
            os.replace(prefix + TXN_INDEX_SUFFIX + SWAP_SUFFIX, prefix + TXN_INDEX_SUFFIX)
        os.replace(prefix + LOG_SUFFIX + SWAP_SUFFIX, prefix + LOG_SUFFIX)
        log.info("Completed swap of %s", prefix + LOG_SUFFIX)
    return None


def load_log(dir: str, config: LogConfig, *, log_start_offset: int, recovery_point: int,
             had_clean_shutdown: bool, time_ms: Callable[[], int], leader_epoch_cache=None,
             fsync_every_append: bool = False, segment_factory=None) -> LoadedLog:
    """Load (and if needed recover) the segments of ``dir``; see the module docstring."""
    try:
        names = os.listdir(dir)
    except FileNotFoundError:
        os.makedirs(dir, exist_ok=True)
        names = []
    listed = _resolve_leftovers(dir, config, time_ms, names)
    make = segment_factory or (lambda base, create=False: LogSegment(
        dir, base, config, time_ms, create=create, fsync_every_append=fsync_every_append,
        preallocate_bytes=config.segment_bytes if create and config.preallocate else 0))

    listing = listed if listed is not None else os.listdir(dir)
    names = set(listing)
    logs = set()
    for name in names:
        if name.endswith(LOG_SUFFIX):
            try:
                logs.add(offset_from_filename(name))
            except ValueError:
                continue
    for name in names:
        if _is_index(name):
            try:
                base = offset_from_filename(name)
            except ValueError:
                continue
            if base not in logs:
                log.warning("Found an orphaned index file %s, with no corresponding log file.", name)
                _remove(os.path.join(dir, name))

    if not had_clean_shutdown and leader_epoch_cache is not None and logs:
        # The epoch checkpoint is written asynchronously (leader_epoch.py): entries at or
        # above the recovery point may be missing or stale. The segments from the one
        # holding the recovery point on are scanned below; their entries are rebuilt
        # from the batches' epochs, so drop what the file says about them first.
        below = [b for b in logs if b <= recovery_point]
        leader_epoch_cache.truncate_from_end(max(below) if below else min(logs))

    segments = []
    done = set()
    recovered = 0
    truncated_total = 0
    for base in sorted(logs):
        seg = make(base)
        prefix = f"{base:020d}"
        if prefix + TXN_INDEX_SUFFIX not in names:
            seg.txn_index.known_absent()
        if (prefix + INDEX_SUFFIX not in names and prefix + TIME_INDEX_SUFFIX not in names
                and seg.size <= config.index_interval_bytes):
            seg.mark_index_files_absent()      # empty indexes: see LogSegment.close
        elif prefix + INDEX_SUFFIX not in names or prefix + TIME_INDEX_SUFFIX not in names:
            log.info("Could not find index files of %s, rebuilding them", seg.log_path)
            t, _ = seg.recover(leader_epoch_cache if not had_clean_shutdown else None)
            truncated_total += t
            recovered += 1
            done.add(base)
            if t > 0:
                log.warning("Found invalid bytes at the end of %s while rebuilding its indexes; "
                            "truncated %d bytes", seg.log_path, t)
        segments.append(seg)

    if not had_clean_shutdown and segments:
        # Segments from the one containing the recovery point on.
        first = 0
        for i, seg in enumerate(segments):
            if seg.base_offset <= recovery_point:
                first = i
        i = first
        while i < len(segments):
            seg = segments[i]
            if seg.base_offset in done:
                truncated, r = 0, None
            else:
                truncated, r = seg.recover(leader_epoch_cache)
                recovered += 1
            truncated_total += truncated
            if truncated > 0:
                log.warning("Found invalid bytes at the end of %s (%s); truncated %d bytes",
                            seg.log_path, r.error, truncated)
                for later in segments[i + 1:]:
                    log.warning("Deleting segment %s after a truncated one", later.log_path)
                    later.delete_if_exists()
                del segments[i + 1:]
                break
            i += 1

    next_offset = None
    if segments:
        next_offset = segments[-1].read_next_offset()
        if next_offset < log_start_offset:
            log.warning("Log end offset %d is below the log start offset %d in %s: deleting all segments",
                        next_offset, log_start_offset, dir)
            for seg in segments:
                seg.delete_if_exists()
            segments = []
    if not segments:
        for name in os.listdir(dir):
            if name.endswith(LOG_SUFFIX) or _is_index(name):
                _remove(os.path.join(dir, name))
        segments = [make(log_start_offset, create=True)]
        next_offset = log_start_offset

    log_start = max(log_start_offset, segments[0].base_offset)
    if had_clean_shutdown:
        new_recovery_point = next_offset
    else:
        new_recovery_point = min(recovery_point, next_offset)
    if leader_epoch_cache is not None:
        leader_epoch_cache.truncate_from_end(next_offset)
        leader_epoch_cache.truncate_from_start(log_start)
    # the listing, for the producer state's snapshot scan, unless files came or went
    # besides the indexes and segments (snapshots are only removed by their manager)
    return LoadedLog(segments, log_start, next_offset, new_recovery_point, truncated_total, recovered,
                     listing)
