"""Pure-Python twin of ``kbroker._core.time_index`` (same API, same file format)."""
from __future__ import annotations

import struct

from kbroker._core.index_errors import CorruptIndexError, IndexFullError, InvalidOffsetError
from kbroker._core.ref.offset_index import MmapIndex, largest_lower_bound_slot, locked

NO_TIMESTAMP = -1
_ENTRY = struct.Struct(">qi")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class TimeIndex(MmapIndex):
    """Sparse timestamp → offset index of one segment (twin)."""

    _entry_size = 12

    def __init__(self, path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        super().__init__(path, base_offset, max_index_size, writable)
        self._last_ts = -1
        self._last_offset = base_offset

    def _after_load(self) -> None:
        if self._entries == 0:
            self._last_ts, self._last_offset = -1, self.base_offset
        else:
            ts, rel = _ENTRY.unpack_from(self._map, (self._entries - 1) * 12)
            self._last_ts, self._last_offset = ts, self.base_offset + rel

    @property
    @locked
    def is_full(self) -> bool:
        self._ensure()
        return self._entries >= self._capacity() - 1

    @property
    @locked
    def last_entry(self) -> tuple[int, int]:
        self._ensure()
        return (self._last_ts, self._last_offset)

    @locked
    def sanity_check(self) -> None:
        self._ensure()
        if self._length % 12 != 0:
            raise CorruptIndexError(
                f"Time index file {self._path} is corrupt, found {self._length} bytes which is "
                f"neither positive nor a multiple of 12.")
        if self._entries != 0:
            first_ts = _I64.unpack_from(self._map, 0)[0]
            if self._last_ts < first_ts:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self._path}) has non-zero size "
                    f"but the last timestamp is {self._last_ts} which is less than the first "
                    f"timestamp {first_ts}")
            if self._last_offset < self.base_offset:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self._path}) has non-zero size "
                    f"but the last offset is {self._last_offset} which is less than the base "
                    f"offset {self.base_offset}")

    @locked
    def entry(self, n: int) -> tuple[int, int]:
        self._ensure()
        if n < 0 or n >= self._entries:
            raise IndexError(f"attempt to fetch the {n}th entry from time index {self._path}, "
                             f"which has size {self._entries}")
        ts, rel = _ENTRY.unpack_from(self._map, n * 12)
        return (ts, self.base_offset + rel)

    @locked
    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        self._ensure()
        slot = largest_lower_bound_slot(self._map, self._entries, 12, 0, True, target_timestamp)
        if slot < 0:
            return (-1, self.base_offset)
        ts, rel = _ENTRY.unpack_from(self._map, slot * 12)
        return (ts, self.base_offset + rel)

    @locked
    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        self._ensure()
        if not skip_full_check:
            self._reserve(2)
        if not skip_full_check and self._entries >= self._max_entries - 1:
            raise IndexFullError(f"Attempt to append to a full time index (size = {self._entries}).")
        if self._entries != 0 and offset < self._last_offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to slot {self._entries} no larger than "
                f"the last offset appended ({self._last_offset}) to {self._path}.")
        if self._entries != 0 and timestamp < self._last_ts:
            raise ValueError(
                f"Attempt to append a timestamp ({timestamp}) to slot {self._entries} no larger "
                f"than the last timestamp appended ({self._last_ts}) to {self._path}.")
        if timestamp <= self._last_ts:
            return False
        rel = offset - self.base_offset
        if rel < 0 or rel > 0x7FFFFFFF:
            raise InvalidOffsetError(f"offset {offset} does not fit in time index {self._path} "
                                     f"with base offset {self.base_offset}")
        if not self.writable:
            raise ValueError(f"time index {self._path} is read-only")
        self._reserve(1, skip_full_check)
        if self._entries >= self._max_entries:
            raise IndexFullError(f"time index {self._path} has no free slot")
        _ENTRY.pack_into(self._map, self._entries * 12, timestamp, rel)
        self._entries += 1
        self._last_ts, self._last_offset = timestamp, offset
        return True

    @locked
    def append_raw(self, data) -> None:
        self._ensure()
        data = bytes(data)
        if len(data) % 12 != 0:
            raise InvalidOffsetError("raw time index data is not a whole number of entries")
        n = len(data) // 12
        if n == 0:
            return
        if not self.writable:
            raise ValueError(f"time index {self._path} is read-only")
        self._reserve(n + 1)
        if self._entries + n > self._max_entries - 1:
            raise IndexFullError(f"{n} entries do not fit in time index {self._path}")
        prev_ts = self._last_ts
        prev_rel = self._last_offset - self.base_offset if self._entries else -1
        for i in range(n):
            ts, rel = _ENTRY.unpack_from(data, i * 12)
            if ts <= prev_ts or rel < prev_rel or rel < 0:
                raise InvalidOffsetError(f"raw time index entry {i} is not increasing")
            prev_ts, prev_rel = ts, rel
        start = self._entries * 12
        self._map[start : start + len(data)] = data
        self._entries += n
        self._after_load()

    @locked
    def truncate_to(self, offset: int) -> None:
        self._ensure()
        rel = offset - self.base_offset
        if rel < 0:
            new_entries = 0
        else:
            rel = min(rel, 0x7FFFFFFF)
            slot = largest_lower_bound_slot(self._map, self._entries, 12, 8, False, rel)
            if slot < 0:
                new_entries = 0
            elif _I32.unpack_from(self._map, slot * 12 + 8)[0] == rel:
                new_entries = slot
            else:
                new_entries = slot + 1
        self._entries = new_entries
        self._after_load()

    def __repr__(self) -> str:
        return f"TimeIndex({self._path!r}, base_offset={self.base_offset})"
