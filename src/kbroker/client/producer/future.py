"""Futures for sent records (Kafka's ProduceRequestResult / FutureRecordMetadata).

One ``BatchResult`` per producer batch is completed exactly once by the sender thread
(``complete``) with the batch's base_offset (or an exception). Each record's
``RecordFuture`` is a 5-tuple (batch result, offset delta, timestamp, key size, value
size): ``send`` builds it with one ``tuple.__new__`` (no Python ``__init__``, no lock,
no Event), and the record's offset (base_offset + delta) is computed only when asked.
Completing a batch of N records costs one flag store, not N; a ``threading.Event`` is
made only for a batch somebody actually waits on.

Delivery callbacks live on the BatchResult as a flat list of (future, fn, untracked)
triples in registration order (= append order for ``send(on_delivery=...)``, which
registers in the same Cython call that appends: kbroker/_core/producer_append.pyx says
why that is atomic with completion). They run in the sender thread right after the
batch completes (``producer_append.run_callbacks``: RecordMetadata built in C; a
callback registered by the kernel is off the cyclic GC's lists while in flight, see
producer_append.pyx); a callback that raises is logged and does not stop the others.
``_CB_LOCK`` (one for all batches: waits and late ``add_callback`` calls are rare next
to appends) orders registration, waiting and completion for Python code.
"""
from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from kbroker.client.errors import KafkaTimeoutError
from kbroker.kernels import producer_append

log = logging.getLogger(__name__)

_CB_LOCK = threading.Lock()
_run_callbacks = producer_append.run_callbacks
_CallbackList = producer_append.CallbackList


def _callback_raised() -> None:
    log.exception("delivery callback raised")


class RecordMetadata(NamedTuple):
    """Where a record was written. offset is -1 with acks=0 (unknown, as Java). A failed
    record's callback gets its topic and partition with -1 in every other field (Java's
    Callback contract: the metadata is never null)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int = -1
    serialized_value_size: int = -1


class BatchResult:
    """Completion state of one batch. ``base_offset`` -1 until known.

    ``done`` goes False -> True once, under ``_CB_LOCK``, after base_offset,
    log_append_time and error were stored (so a reader that sees done=True sees them),
    and before ``callbacks`` ((future, fn, untracked) triples, flat, while not done) is
    taken and set to None."""

    __slots__ = ("topic", "partition", "base_offset", "log_append_time", "error", "done",
                 "_event", "callbacks")

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.done = False
        self._event: threading.Event | None = None
        self.callbacks: list | None = _CallbackList()

    def complete(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        with _CB_LOCK:
            self.done = True
            ev, cbs, self.callbacks = self._event, self.callbacks, None
        if ev is not None:
            ev.set()
        if cbs:
            _run_callbacks(cbs, self, RecordMetadata, _callback_raised)

    def is_done(self) -> bool:
        return self.done

    def wait(self, timeout: float | None) -> bool:
        if self.done:
            return True
        with _CB_LOCK:
            if self.done:
                return True
            ev = self._event
            if ev is None:
                ev = self._event = threading.Event()
        return ev.wait(timeout)

    def add_callback(self, fut: "RecordFuture", fn) -> bool:
        """Register fn for fut; False if the batch is already done (caller runs it)."""
        with _CB_LOCK:
            if self.done:
                return False
            self.callbacks.extend((fut, fn, False))
            return True


_new_tuple = tuple.__new__


class RecordFuture(tuple):
    """The future ``Producer.send`` returns; ``get(timeout)`` -> RecordMetadata or raises.

    A tuple (result, delta, timestamp, key_size, value_size); make one with
    ``RecordFuture.of(...)`` (or ``tuple.__new__(RecordFuture, (...))`` on hot paths)."""

    __slots__ = ()

    @classmethod
    def of(cls, result: BatchResult, delta: int, timestamp: int, key_size: int,
           value_size: int) -> "RecordFuture":
        return _new_tuple(cls, (result, delta, timestamp, key_size, value_size))

    def __repr__(self):
        r = self[0]
        state = ("pending" if not r.done else "failed" if r.error is not None
                 else f"offset={r.base_offset + self[1] if r.base_offset >= 0 else -1}")
        return f"<RecordFuture {r.topic}-{r.partition} {state}>"

    def __eq__(self, other):       # identity, like any future (not tuple equality)
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__

    @property
    def _result(self) -> BatchResult:
        """The batch's result (records of one batch share it)."""
        return self[0]

    def done(self) -> bool:
        return self[0].done

    def succeeded(self) -> bool:
        r = self[0]
        return r.done and r.error is None

    def failed(self) -> bool:
        r = self[0]
        return r.done and r.error is not None

    def exception(self, timeout: float | None = None):
        r = self[0]
        if not r.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        return r.error

    def _metadata(self) -> RecordMetadata:
        r, delta, timestamp, key_size, value_size = self
        offset = r.base_offset + delta if r.base_offset >= 0 else -1
        ts = r.log_append_time if r.log_append_time >= 0 else timestamp
        return RecordMetadata(r.topic, r.partition, offset, ts, key_size, value_size)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        r = self[0]
        if not r.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        if r.error is not None:
            raise r.error
        return self._metadata()

    result = get  # concurrent.futures spelling

    def add_callback(self, fn) -> "RecordFuture":
        """fn(err, metadata) once the record completes (runs now if already done)."""
        if not self[0].add_callback(self, fn):
            self._run(fn)
        return self

    def _run(self, fn) -> None:
        r = self[0]
        err = r.error
        try:
            fn(err, RecordMetadata(r.topic, r.partition, -1, -1, -1, -1) if err is not None
               else self._metadata())
        except Exception:
            log.exception("delivery callback raised")
