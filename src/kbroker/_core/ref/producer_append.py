"""Pure-Python twin of :mod:`kbroker._core.producer_append` (the producer's per-record
append path and a completed batch's callback run); same API and results. ``try_append``
and ``close`` are made atomic with respect to each other by one lock per batch, and a
callback is registered through ``result.add_callback`` (which takes the result's lock)
where the compiled kernel relies on the GIL."""
from __future__ import annotations

import threading
import time

__all__ = ["CallbackList", "OpenBatch", "SendPath", "append", "run_callbacks"]


class CallbackList(list):
    """A batch's (future, callback, untracked) triples; the twin untracks nothing."""

    __slots__ = ()


def _check_tuple_type(tp, what):
    if (not isinstance(tp, type) or not issubclass(tp, tuple)
            or tp.__basicsize__ != tuple.__basicsize__ or tp.__itemsize__ != tuple.__itemsize__):
        raise TypeError(f"{what} must be a plain tuple subclass (__slots__ = ())")


class OpenBatch:
    """The appendable side of one producer batch (see the kernel's docstring)."""

    __slots__ = ("builder", "result", "record_count", "closed", "_future_type", "_lock")

    def __init__(self, builder, result, future_type):
        _check_tuple_type(future_type, "future_type")
        if future_type.__new__ is not tuple.__new__:
            raise TypeError("future_type must be a plain tuple subclass (no __new__, __slots__ = ())")
        self.builder = builder
        self.result = result
        self.record_count = 0
        self.closed = False
        self._future_type = future_type
        self._lock = threading.Lock()

    def try_append(self, timestamp, key, value, headers, callback=None):
        with self._lock:
            if self.closed:
                return None
            if not self.builder.append(timestamp, key, value, headers):
                self.closed = True
                return None
            n = self.record_count
            self.record_count = n + 1
        fut = tuple.__new__(self._future_type, (
            self.result, n, timestamp, -1 if key is None else len(key),
            -1 if value is None else len(value)))
        if callback is not None and not self.result.add_callback(fut, callback):
            fut._run(callback)
        return fut

    def close(self):
        with self._lock:
            self.closed = True


def append(open_batches, tp, timestamp, key, value, headers, callback=None):
    b = open_batches.get(tp)
    if b is None:
        return None
    return b.try_append(timestamp, key, value, headers, callback)


def run_callbacks(callbacks, result, metadata_type, on_error):
    if not isinstance(callbacks, list):
        raise TypeError("callbacks must be a list")
    _check_tuple_type(metadata_type, "metadata_type")
    if len(callbacks) % 3:
        raise ValueError("callbacks must be (future, callback, untracked) triples")
    for fut in callbacks[::3]:
        if not isinstance(fut, tuple) or len(fut) < 5:
            raise TypeError("a future is a 5-tuple (result, delta, timestamp, key_size, value_size)")
    err = result.error
    base, append_time = result.base_offset, result.log_append_time
    failed_md = None
    if err is not None:
        failed_md = tuple.__new__(metadata_type, (result.topic, result.partition, -1, -1, -1, -1))
    for i in range(0, len(callbacks), 3):
        fut, fn = callbacks[i], callbacks[i + 1]
        try:
            if err is not None:
                fn(err, failed_md)
                continue
            md = tuple.__new__(metadata_type, (
                result.topic, result.partition, base + fut[1] if base >= 0 else -1,
                append_time if append_time >= 0 else fut[2], fut[3], fut[4]))
            fn(None, md)
        except Exception:
            on_error()


class SendPath:
    """``Producer.send``'s common case (see the kernel's docstring)."""

    __slots__ = ("metadata", "open_batches", "sticky", "sticky_batch_size", "ignore_keys",
                 "partition_for_key", "on_sticky_full")

    def __init__(self, metadata, open_batches, sticky, sticky_batch_size, ignore_keys,
                 partition_for_key, on_sticky_full):
        self.metadata = metadata
        self.open_batches = open_batches
        self.sticky = sticky
        self.sticky_batch_size = sticky_batch_size
        self.ignore_keys = ignore_keys
        self.partition_for_key = partition_for_key
        self.on_sticky_full = on_sticky_full

    def send(self, topic, value, key, partition, timestamp_ms, callback):
        if ((value is not None and type(value) is not bytes)
                or (key is not None and type(key) is not bytes)
                or type(topic) is not str
                or (timestamp_ms is not None and type(timestamp_ms) is not int)):
            return None
        cluster = self.metadata.cluster
        parts = cluster.topics.get(topic)
        if parts is None:
            return None
        nparts = len(parts)
        st = None
        if partition is None:
            if key is not None and not self.ignore_keys:
                partition = self.partition_for_key(key, nparts)
            else:
                st = self.sticky.get(topic)
                if st is None:
                    return None
                partition = st.partition
                if type(partition) is not int:
                    return None
        elif type(partition) is not int:
            return None
        if partition < 0 or partition >= nparts:
            return None
        ts = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        b = self.open_batches.get((topic, partition))
        if b is None:
            return None
        fut = b.try_append(ts, key, value, (), callback)
        if fut is not None and st is not None:
            st.produced_bytes += (len(value) if value is not None else 0) + 20
            if st.produced_bytes >= self.sticky_batch_size:
                self.on_sticky_full(topic, partition, 0, cluster, False)
        return fut
