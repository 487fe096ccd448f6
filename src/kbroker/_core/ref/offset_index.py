"""Pure-Python twin of ``kbroker._core.offset_index`` (same API, same file format).

Uses the ``mmap`` module instead of raw mmap(2); see the compiled kernel's
docstring for the format, laziness and locking rules (here: a
``threading.RLock`` per index around every public method). Unlike the kernel,
a mapped twin index holds one fd (the ``mmap`` object keeps a dup()ed fd on
Python < 3.13).
"""
from __future__ import annotations

import functools
import mmap
import os
import struct
import threading

from kbroker._core.index_errors import CorruptIndexError, IndexClosedError, IndexFullError, InvalidOffsetError

_WARM_BYTES = 8192
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFF = struct.Struct(">ii")


def locked(fn):
    """Run the method under the index's lock (the kernel's ``_lock`` / ``_unlock``)."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        with self._mutex:
            return fn(self, *args, **kwargs)
    return wrapper


def largest_lower_bound_slot(m, entries: int, entry_size: int, key_pos: int, key64: bool, target: int) -> int:
    """Slot of the largest entry whose key <= target, or -1 (warm section first)."""
    if entries == 0:
        return -1
    unpack = (_I64 if key64 else _I32).unpack_from

    def key(n: int) -> int:
        return unpack(m, n * entry_size + key_pos)[0]

    first_hot = max(0, entries - 1 - _WARM_BYTES // entry_size)
    if key(first_hot) < target:
        lo, hi = first_hot, entries - 1
    else:
        if key(0) > target:
            return -1
        lo, hi = 0, first_hot
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        k = key(mid)
        if k > target:
            hi = mid - 1
        elif k < target:
            lo = mid
        else:
            return mid
    return lo


class MmapIndex:
    """Base of the offset and time index (twin)."""

    _entry_size = 8

    def __init__(self, path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        self._path = os.fspath(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable
        self._map = None
        self._length = 0
        self._entries = 0
        self._max_entries = 0
        self._loaded = False
        self._closed = False
        self._anon = False          # mapped as anonymous memory, no file yet
        #: an active segment's index: extended to max_index_size when an entry needs room
        self.growable = False
        self._mutex = threading.RLock()

    # -- mapping -------------------------------------------------------------
    def _ensure(self) -> None:
        if self._loaded:
            return
        if self._closed:
            raise IndexClosedError(f"index {self._path} is closed")
        created = False
        if not os.path.exists(self._path):
            if not self.writable:
                raise FileNotFoundError(self._path)
            if self.max_index_size < self._entry_size:
                raise ValueError(f"invalid max index size {self.max_index_size}")
            created = True
            length = self.max_index_size - self.max_index_size % self._entry_size
            if self.growable:
                # an active segment's new index: anonymous memory until it must be on disk
                self._unmap()
                self._map = mmap.mmap(-1, length)
                self._anon = True
                self._length = length
                self._max_entries = length // self._entry_size
                self._entries = 0
                self._loaded = True
                self._after_load()
                return
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, length)
            finally:
                os.close(fd)
        else:
            length = os.stat(self._path).st_size
        self._remap(length)
        self._entries = 0 if created else self._length // self._entry_size
        self._loaded = True
        self._after_load()

    def _materialize(self, new_length: int) -> None:
        """An anonymous index gets its file: ``new_length`` bytes, the valid entries
        that fit written (the caller then maps it)."""
        valid = min(self._entries * self._entry_size, new_length)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, new_length)
            data = self._map[:valid]
            done = 0
            while done < valid:
                done += os.pwrite(fd, data[done:], done)
        finally:
            os.close(fd)
        self._unmap()

    def _remap(self, new_length: int) -> None:
        if self._anon:
            self._materialize(new_length)
        self._unmap()
        fd = os.open(self._path, os.O_RDWR if self.writable else os.O_RDONLY)
        try:
            if self.writable and os.fstat(fd).st_size != new_length:
                os.ftruncate(fd, new_length)
            if new_length > 0:
                access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
                self._map = mmap.mmap(fd, new_length, access=access)
                self._map.madvise(mmap.MADV_RANDOM)   # as the kernel: no read-around on faults
        finally:
            os.close(fd)
        self._length = new_length
        self._max_entries = new_length // self._entry_size
        if self._entries > self._max_entries:
            self._entries = self._max_entries

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        self._anon = False

    def _after_load(self) -> None:
        pass

    def _capacity(self) -> int:
        """Entries the index can hold: its mapping's, or max_index_size's if growable."""
        if self.growable and self.writable:
            return max(self._max_entries, (self.max_index_size - self.max_index_size % self._entry_size)
                       // self._entry_size)
        return self._max_entries

    def _reserve(self, n: int, exact: bool = False) -> None:
        """Room for ``n`` more entries: a growable index whose mapping lacks it is
        extended (to max_index_size, or with ``exact`` to just those entries)."""
        if not self.growable or not self.writable or self._entries + n <= self._max_entries:
            return
        want = ((self._entries + n) * self._entry_size if exact
                else self.max_index_size - self.max_index_size % self._entry_size)
        if want > self._length:
            self._remap(want)

    @locked
    def free_slots(self, reserve: int) -> int:
        """Slots still free for appends, ``reserve`` of them kept back (the writer's check)."""
        self._ensure()
        if self._capacity() > self._max_entries:
            self._reserve(self._capacity() - self._entries)
        return self._max_entries - reserve - self._entries

    def _check_capacity(self) -> None:
        if not self.writable:
            raise ValueError(f"index {self._path} is read-only")
        self._reserve(1)
        if self._entries >= self._max_entries:
            raise IndexFullError(f"attempt to append to a full index (size = {self._entries}) {self._path}")

    # -- properties ------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._path

    @property
    def entry_size(self) -> int:
        return self._entry_size

    @property
    def is_loaded(self) -> bool:
        return self._loaded

    @property
    @locked
    def entries(self) -> int:
        self._ensure()
        return self._entries

    @property
    @locked
    def max_entries(self) -> int:
        self._ensure()
        return self._max_entries

    @property
    @locked
    def length(self) -> int:
        self._ensure()
        return self._length

    @property
    @locked
    def size_in_bytes(self) -> int:
        self._ensure()
        return self._entries * self._entry_size

    @property
    @locked
    def is_full(self) -> bool:
        self._ensure()
        return self._entries >= self._capacity()

    # -- maintenance -----------------------------------------------------------
    @locked
    def resize(self, new_size: int) -> bool:
        self._ensure()
        rounded = new_size - new_size % self._entry_size
        if rounded == self._length:
            if self._anon:
                self._remap(rounded)        # same length, but now on disk
            return False
        self._remap(rounded)
        return True

    @locked
    def trim_to_valid_size(self) -> bool:
        if not self._loaded:
            return False
        return self.resize(self._entries * self._entry_size)

    @locked
    def truncate(self) -> None:
        self._ensure()
        self._entries = 0
        self._after_load()

    @locked
    def reset(self) -> None:
        self.truncate()
        self.resize(self.max_index_size)

    @locked
    def flush(self) -> None:
        if self._anon:
            self._remap(self._length)       # the file, as it would have been
        if self._loaded and self._map is not None and self.writable:
            self._map.flush()

    @locked
    def close(self) -> None:
        if self._loaded and self.writable and (self._anon or os.path.exists(self._path)):
            self.trim_to_valid_size()
        self.close_handler()

    @locked
    def close_handler(self) -> None:
        self._unmap()
        self._loaded = False
        self._closed = True

    @locked
    def rename_to(self, new_path) -> None:
        new_path = os.fspath(new_path)
        if os.path.exists(self._path):
            os.replace(self._path, new_path)
        self._path = new_path

    @locked
    def delete_if_exists(self) -> bool:
        self.close_handler()
        try:
            os.unlink(self._path)
            return True
        except FileNotFoundError:
            return False

    @locked
    def raw_entries(self) -> bytes:
        self._ensure()
        if self._entries == 0:
            return b""
        return bytes(self._map[: self._entries * self._entry_size])


class OffsetIndex(MmapIndex):
    """Sparse offset → position index of one segment (twin)."""

    _entry_size = 8

    def __init__(self, path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        super().__init__(path, base_offset, max_index_size, writable)
        self._last_offset = base_offset

    def _after_load(self) -> None:
        if self._entries == 0:
            self._last_offset = self.base_offset
        else:
            self._last_offset = self.base_offset + _I32.unpack_from(self._map, (self._entries - 1) * 8)[0]

    @property
    @locked
    def last_offset(self) -> int:
        self._ensure()
        return self._last_offset

    @locked
    def sanity_check(self) -> None:
        self._ensure()
        if self._length % 8 != 0:
            raise CorruptIndexError(
                f"Index file {self._path} is corrupt, found {self._length} bytes which is "
                f"neither positive nor a multiple of 8.")
        if self._entries != 0 and self._last_offset < self.base_offset:
            raise CorruptIndexError(
                f"Corrupt index found, index file ({self._path}) has non-zero size but the last "
                f"offset is {self._last_offset} which is less than the base offset {self.base_offset}.")

    @locked
    def lookup(self, target_offset: int) -> tuple[int, int]:
        self._ensure()
        rel = target_offset - self.base_offset
        if rel < 0:
            return (self.base_offset, 0)
        rel = min(rel, 0x7FFFFFFF)
        slot = largest_lower_bound_slot(self._map, self._entries, 8, 0, False, rel)
        if slot < 0:
            return (self.base_offset, 0)
        r, pos = _OFF.unpack_from(self._map, slot * 8)
        return (self.base_offset + r, pos)

    @locked
    def entry(self, n: int) -> tuple[int, int]:
        self._ensure()
        if n < 0 or n >= self._entries:
            raise IndexError(f"attempt to fetch the {n}th entry from index {self._path}, "
                             f"which has size {self._entries}")
        r, pos = _OFF.unpack_from(self._map, n * 8)
        return (self.base_offset + r, pos)

    def _append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self._entries != 0 and offset <= self._last_offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to position {self._entries} no larger "
                f"than the last offset appended ({self._last_offset}) to {self._path}.")
        if rel < 0 or rel > 0x7FFFFFFF:
            raise InvalidOffsetError(f"offset {offset} does not fit in index {self._path} "
                                     f"with base offset {self.base_offset}")
        if position < 0 or position > 0x7FFFFFFF:
            raise InvalidOffsetError(f"position {position} out of int32 range")
        _OFF.pack_into(self._map, self._entries * 8, rel, position)
        self._entries += 1
        self._last_offset = offset

    @locked
    def append(self, offset: int, position: int) -> None:
        self._ensure()
        self._check_capacity()
        self._append(offset, position)

    @locked
    def append_raw(self, data) -> None:
        self._ensure()
        data = bytes(data)
        if len(data) % 8 != 0:
            raise InvalidOffsetError("raw index data is not a whole number of entries")
        n = len(data) // 8
        if n == 0:
            return
        if not self.writable:
            raise ValueError(f"index {self._path} is read-only")
        self._reserve(n)
        if self._entries + n > self._max_entries:
            raise IndexFullError(f"{n} entries do not fit in index {self._path}")
        if self._entries == 0:
            prev_rel = prev_pos = -1
        else:
            prev_rel = self._last_offset - self.base_offset
            prev_pos = _I32.unpack_from(self._map, (self._entries - 1) * 8 + 4)[0]
        for i in range(n):
            rel, pos = _OFF.unpack_from(data, i * 8)
            if rel <= prev_rel or pos <= prev_pos:
                raise InvalidOffsetError(f"raw index entry {i} is not increasing")
            prev_rel, prev_pos = rel, pos
        start = self._entries * 8
        self._map[start : start + len(data)] = data
        self._entries += n
        self._last_offset = self.base_offset + prev_rel

    @locked
    def truncate_to(self, offset: int) -> None:
        self._ensure()
        rel = offset - self.base_offset
        if rel < 0:
            new_entries = 0
        else:
            rel = min(rel, 0x7FFFFFFF)
            slot = largest_lower_bound_slot(self._map, self._entries, 8, 0, False, rel)
            if slot < 0:
                new_entries = 0
            elif _I32.unpack_from(self._map, slot * 8)[0] == rel:
                new_entries = slot
            else:
                new_entries = slot + 1
        self._entries = new_entries
        self._after_load()

    def __repr__(self) -> str:
        return f"OffsetIndex({self._path!r}, base_offset={self.base_offset})"
