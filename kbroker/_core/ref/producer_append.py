"""Pure-Python twin of :mod:`kbroker._core.producer_append` (the producer's per-record
append path); same API and results. ``try_append`` and ``close`` are made atomic with
respect to each other by one lock per batch (the compiled kernel relies on the GIL)."""
from __future__ import annotations

import threading

__all__ = ["OpenBatch", "append"]


class OpenBatch:
    """The appendable side of one producer batch (see the kernel's docstring)."""

    __slots__ = ("builder", "result", "record_count", "closed", "_future_type", "_lock")

    def __init__(self, builder, result, future_type):
        if (not isinstance(future_type, type) or not issubclass(future_type, tuple)
                or future_type.__new__ is not tuple.__new__):
            raise TypeError("future_type must be a plain tuple subclass (no __new__, __slots__ = ())")
        self.builder = builder
        self.result = result
        self.record_count = 0
        self.closed = False
        self._future_type = future_type
        self._lock = threading.Lock()

    def try_append(self, timestamp, key, value, headers):
        with self._lock:
            if self.closed:
                return None
            if not self.builder.append(timestamp, key, value, headers):
                self.closed = True
                return None
            n = self.record_count
            self.record_count = n + 1
        return tuple.__new__(self._future_type, (
            self.result, n, timestamp, -1 if key is None else len(key),
            -1 if value is None else len(value)))

    def close(self):
        with self._lock:
            self.closed = True


def append(open_batches, tp, timestamp, key, value, headers):
    b = open_batches.get(tp)
    if b is None:
        return None
    return b.try_append(timestamp, key, value, headers)
