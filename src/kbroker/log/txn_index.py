"""The aborted-transaction index of one segment, ``<base offset>.txnindex`` (Kafka's
``TransactionIndex`` and ``AbortedTxn``).

One 34-byte big-endian entry per transaction whose ABORT marker is in the segment,
in marker order::

    version             int16  = 0
    producer_id         int64
    first_offset        int64  the transaction's first offset (may be in an earlier segment)
    last_offset         int64  the ABORT marker's offset
    last_stable_offset  int64  the LSO when the marker was written (the first offset of
                               the earliest other ongoing transaction, else last_offset + 1)

A read_committed fetch from offset F with upper bound U gets every entry with
``last_offset >= F and first_offset < U``, scanning segments from F's on until an
entry has ``last_stable_offset >= U`` (:func:`collect_aborted`): no transaction
aborted later can have data below U.

The file is created on the first entry (none for segments without aborts). Entries
are kept in memory once read (the file is small: 34 bytes per abort) and replaced
copy-on-write, so lock-free readers see a consistent tuple. Writers (append,
truncate, reset, rename, delete) run under the owning log's append lock.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import Iterable, NamedTuple

from kbroker.log.errors import CorruptIndexError

__all__ = ["ABORTED_TXN_SIZE", "AbortedTxn", "TransactionIndex", "collect_aborted"]

_ENTRY = struct.Struct(">hqqqq")
ABORTED_TXN_SIZE = _ENTRY.size     # 34
ABORTED_TXN_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entries(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(_ENTRY.pack(ABORTED_TXN_VERSION, *e) for e in entries)


def decode_entries(data, path: str = "") -> tuple[AbortedTxn, ...]:
    """Parse ``.txnindex`` bytes; a trailing partial entry is ignored (a torn append),
    an unknown version is CorruptIndexError (Kafka's AbortedTxn check)."""
    n = len(data) // ABORTED_TXN_SIZE * ABORTED_TXN_SIZE
    out = []
    for version, pid, first, last, lso in _ENTRY.iter_unpack(memoryview(data)[:n]):
        if version != ABORTED_TXN_VERSION:
            raise CorruptIndexError(f"Unexpected aborted transaction version {version} in {path}")
        out.append(AbortedTxn(pid, first, last, lso))
    return tuple(out)


class TransactionIndex:
    """The ``.txnindex`` of one segment; see the module docstring."""

    __slots__ = ("path", "_entries", "_lock")

    def __init__(self, path: str):
        self.path = path
        self._entries: tuple[AbortedTxn, ...] | None = None   # None: not read yet
        self._lock = threading.Lock()                          # the lazy first read

    @property
    def entries(self) -> tuple[AbortedTxn, ...]:
        e = self._entries
        if e is None:
            with self._lock:
                e = self._entries
                if e is None:
                    try:
                        with open(self.path, "rb") as f:
                            e = decode_entries(f.read(), self.path)
                    except FileNotFoundError:
                        e = ()
                    self._entries = e
        return e

    def known_absent(self) -> None:
        """The caller just listed the directory and found no file: no entries, and no
        read on first use (a restart after a crash truncates every active segment's
        index, mostly of logs without transactions)."""
        if self._entries is None:
            self._entries = ()

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry (its last offset must be above every entry's: markers come in
        offset order). Appended to the file, created if needed."""
        entries = self.entries
        if entries and txn.last_offset <= entries[-1].last_offset:
            raise ValueError(f"The last offset of appended transaction {txn} is no larger than the last "
                             f"offset {entries[-1].last_offset} of {self.path}")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, _ENTRY.pack(ABORTED_TXN_VERSION, *txn))
        finally:
            os.close(fd)
        self._entries = entries + (txn,)

    def append_if_absent(self, txn: AbortedTxn) -> bool:
        """Recovery's rebuild: add ``txn`` unless an entry for the same marker is there."""
        for e in self.entries:
            if e.last_offset == txn.last_offset and e.producer_id == txn.producer_id:
                return False
        if self.entries and txn.last_offset < self.entries[-1].last_offset:
            # keep the file in marker order: rewrite it whole
            self._rewrite(tuple(sorted(self.entries + (txn,), key=lambda e: e.last_offset)))
            return True
        self.append(txn)
        return True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or above ``offset`` (the segment was truncated)."""
        entries = self.entries
        keep = tuple(e for e in entries if e.last_offset < offset)
        if len(keep) != len(entries):
            self._rewrite(keep)

    def reset(self) -> None:
        """Remove every entry (and the file)."""
        self._unlink()
        self._entries = ()

    def _rewrite(self, entries: tuple[AbortedTxn, ...]) -> None:
        if not entries:
            self.reset()
            return
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(encode_entries(entries))
        os.replace(tmp, self.path)
        self._entries = entries

    def flush(self) -> None:
        """fsync the file, if there is one."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename_to(self, path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def delete_if_exists(self) -> None:
        self._unlink()

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Kafka's collectAbortedTxns: entries overlapping [fetch_offset, upper_bound_offset),
        and whether the search is complete (an entry's LSO reached the upper bound)."""
        out = []
        for e in self.entries:
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound_offset:
                out.append(e)
            if e.last_stable_offset >= upper_bound_offset:
                return out, True
        return out, False

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path!r}, entries={self._entries!r})"


def collect_aborted(segments, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
    """The aborted transactions a read_committed fetch of ``[fetch_offset,
    upper_bound_offset)`` needs, from the ``.txnindex`` of ``segments`` (the one holding
    ``fetch_offset`` first, then the later ones, as Kafka's LocalLog.collectAbortedTransactions)."""
    out: list[AbortedTxn] = []
    for seg in segments:
        found, complete = seg.txn_index.collect(fetch_offset, upper_bound_offset)
        out.extend(found)
        if complete:
            break
    return out
