"""Futures for sent records (Kafka's ProduceRequestResult / FutureRecordMetadata).

One ``BatchResult`` per producer batch is completed exactly once by the sender thread
(``complete``) with the batch's base_offset (or an exception). Each record's
``RecordFuture`` points at its batch's result plus its offset delta, so completing a
batch of N records costs one Event.set(), not N. Per-record delivery callbacks run in
the sender thread, in append order, right after the batch completes; a callback that
raises is logged and does not stop the others.
"""
from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from kbroker.client.errors import KafkaTimeoutError

log = logging.getLogger(__name__)


class RecordMetadata(NamedTuple):
    """Where a record was written. offset is -1 with acks=0 (unknown, as Java)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int = -1
    serialized_value_size: int = -1


class BatchResult:
    """Completion state of one batch. ``base_offset`` -1 until known."""

    __slots__ = ("topic", "partition", "base_offset", "log_append_time", "error", "_event")

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._event = threading.Event()

    def complete(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        self._event.set()

    def is_done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)


class RecordFuture:
    """The future ``Producer.send`` returns; ``get(timeout)`` -> RecordMetadata or raises."""

    __slots__ = ("_result", "_delta", "_timestamp", "_key_size", "_value_size", "_callbacks")

    def __init__(self, result: BatchResult, delta: int, timestamp: int, key_size: int, value_size: int):
        self._result = result
        self._delta = delta
        self._timestamp = timestamp
        self._key_size = key_size
        self._value_size = value_size
        self._callbacks = None

    def done(self) -> bool:
        return self._result.is_done()

    def succeeded(self) -> bool:
        return self._result.is_done() and self._result.error is None

    def failed(self) -> bool:
        return self._result.is_done() and self._result.error is not None

    def exception(self, timeout: float | None = None):
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        return self._result.error

    def _metadata(self) -> RecordMetadata:
        r = self._result
        offset = r.base_offset + self._delta if r.base_offset >= 0 else -1
        ts = r.log_append_time if r.log_append_time >= 0 else self._timestamp
        return RecordMetadata(r.topic, r.partition, offset, ts, self._key_size, self._value_size)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        if self._result.error is not None:
            raise self._result.error
        return self._metadata()

    result = get  # concurrent.futures spelling

    def add_callback(self, fn) -> "RecordFuture":
        """fn(err, metadata) once the record completes (runs now if already done)."""
        if self._result.is_done():
            self._run(fn)
        else:
            if self._callbacks is None:
                self._callbacks = []
            self._callbacks.append(fn)
            if self._result.is_done() and self._callbacks:   # raced with completion
                cbs, self._callbacks = self._callbacks, None
                for f in cbs:
                    self._run(f)
        return self

    def _run(self, fn) -> None:
        err = self._result.error
        try:
            fn(err, None if err is not None else self._metadata())
        except Exception:
            log.exception("delivery callback raised")

    def _fire(self) -> None:
        cbs, self._callbacks = self._callbacks, None
        if cbs:
            for f in cbs:
                self._run(f)
