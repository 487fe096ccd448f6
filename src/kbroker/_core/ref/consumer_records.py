"""Pure-Python twin of :mod:`kbroker._core.consumer_records`: decoded records ->
ConsumerRecord tuples (same API and results)."""
from __future__ import annotations

__all__ = ["build"]

_new = tuple.__new__


def build(record_type, recs, start, stop, topic, partition, timestamp_type, leader_epoch):
    if not isinstance(record_type, type) or not issubclass(record_type, tuple):
        raise TypeError("record_type must be a tuple subclass")
    start = max(0, start)
    stop = max(start, min(stop, len(recs)))
    return [_new(record_type, (topic, partition, r.offset, r.timestamp, timestamp_type, r.key,
                               r.value, r.headers, leader_epoch))
            for r in recs[start:stop]]
