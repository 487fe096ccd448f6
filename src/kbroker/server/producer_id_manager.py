"""Durable producer-id allocator (Kafka's ProducerIdManager, ZooKeeper flavour).

Ids are handed out from blocks of ``block_size`` (Kafka's
``ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE`` = 1000) consecutive ids. A block
is recorded durably *before* its first id is handed out, so no restart —
clean or crash — ever hands out an id twice; a crash only skips the unused
rest of the current block (at most ``block_size - 1`` ids).

File ``<first log dir>/producer-id-block``: the last reserved block, as the
JSON Kafka kept in ZooKeeper's ``/latest_producer_id_block``::

    {"version":1,"broker":0,"block_start":"1000","block_end":"1999"}

(``block_start`` / ``block_end`` are inclusive, decimal strings as in Kafka.)
It is replaced atomically (``.tmp`` + fsync + rename + directory fsync). A
missing file means no id was ever handed out: the first block starts at 0.
A file that cannot be parsed stops the allocator (ProducerIdFileError)
rather than risk repeating ids.

Thread-safety: ``generate_producer_id`` is safe from any thread; one lock
guards the current block, and the (rare) reservation of the next block,
fsyncs included, happens while holding it.
"""
from __future__ import annotations

import json
import os
import threading
from typing import NamedTuple

from kbroker.log.checkpoints import atomic_write

__all__ = ["PRODUCER_ID_BLOCK_FILE", "PRODUCER_ID_BLOCK_SIZE", "ProducerIdFileError", "ProducerIdManager",
           "RPCProducerIdManager",
           "ProducerIdsBlock", "ProducerIdsExhaustedError"]

PRODUCER_ID_BLOCK_SIZE = 1000
PRODUCER_ID_BLOCK_FILE = "producer-id-block"
LONG_MAX = (1 << 63) - 1
_VERSION = 1


class ProducerIdFileError(IOError):
    """``producer-id-block`` exists but cannot be parsed."""


class ProducerIdsExhaustedError(RuntimeError):
    """The next block would pass Long.MAX_VALUE (Kafka: "Exhausted all producerIds")."""


class ProducerIdsBlock(NamedTuple):
    """``size`` ids from ``first_producer_id``, reserved by broker ``assigned_broker_id``."""

    assigned_broker_id: int
    first_producer_id: int
    size: int

    @property
    def last_producer_id(self) -> int:
        return self.first_producer_id + self.size - 1

    @property
    def next_block_first_id(self) -> int:
        return self.first_producer_id + self.size

    def encode(self) -> bytes:
        return json.dumps({"version": _VERSION, "broker": self.assigned_broker_id,
                           "block_start": str(self.first_producer_id),
                           "block_end": str(self.last_producer_id)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "ProducerIdsBlock":
        try:
            obj = json.loads(data.decode("utf-8"))
            if obj["version"] != _VERSION:
                raise ValueError(f"unknown version {obj['version']!r}")
            start, end = int(obj["block_start"]), int(obj["block_end"])
            broker = int(obj["broker"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ProducerIdFileError(f"malformed producer id block {data[:200]!r}: {e}") from None
        if start < 0 or end < start:
            raise ProducerIdFileError(f"invalid producer id block [{start}, {end}]")
        return cls(broker, start, end - start + 1)


class ProducerIdManager:
    """Hands out unique producer ids for this cluster (a single broker owns the file).

    Invariant: every id returned is ``<= last_producer_id`` of the block recorded in
    the file at the time it was returned, and ids only increase.
    """

    def __init__(self, log_dir: str, *, broker_id: int = 0, block_size: int = PRODUCER_ID_BLOCK_SIZE,
                 sync: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.path = os.path.join(log_dir, PRODUCER_ID_BLOCK_FILE)
        self.broker_id = broker_id
        self.block_size = block_size
        self._sync = sync
        self._lock = threading.Lock()
        self._block: ProducerIdsBlock | None = None   # the current block; None until the first id
        self._next_id = 0
        self._last_reserved = self._read()          # last block on disk (None: never reserved)

    def _read(self) -> ProducerIdsBlock | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return ProducerIdsBlock.decode(data)

    def _reserve_next_block(self) -> None:
        # caller holds self._lock
        first = 0 if self._last_reserved is None else self._last_reserved.next_block_first_id
        if first > LONG_MAX - self.block_size:
            raise ProducerIdsExhaustedError(
                "Exhausted all producerIds as the next block's end producerId would exceed the long type limit")
        block = ProducerIdsBlock(self.broker_id, first, self.block_size)
        atomic_write(self.path, block.encode(), sync=self._sync)   # durable BEFORE any id is used
        self._last_reserved = self._block = block
        self._next_id = first

    def generate_producer_id(self) -> int:
        """The next unused producer id. Raises OSError if a new block cannot be recorded
        (no id is handed out then; a later call retries), ProducerIdsExhaustedError."""
        with self._lock:
            if self._block is None or self._next_id > self._block.last_producer_id:
                self._reserve_next_block()
            pid = self._next_id
            self._next_id = pid + 1
            return pid

    @property
    def current_block(self) -> ProducerIdsBlock | None:
        with self._lock:
            return self._block


class RPCProducerIdManager:
    """A KRaft broker's producer ids (Kafka's RPCProducerIdManager): blocks handed out by
    the active controller through AllocateProducerIds, so ids are unique cluster-wide; the
    controller records each block in the metadata log before answering, so nothing here
    is stored. The next block is asked for when the current one is 90% used, and waited for
    (up to ``timeout_s``) only when it is used up.

    Thread-safety: ``_lock`` guards the blocks and the one request in flight."""

    def __init__(self, broker_id: int, controller_channel, broker_epoch=lambda: -1, timeout_s: float = 10.0):
        self.broker_id = broker_id
        self.channel = controller_channel
        self.broker_epoch = broker_epoch
        self.timeout_s = timeout_s
        self._lock = threading.Condition()
        self._block: ProducerIdsBlock | None = None
        self._next_id = 0
        self._prefetched: ProducerIdsBlock | None = None
        self._in_flight = False
        self._last_error: str | None = None

    def _request_block(self) -> None:
        # caller holds self._lock
        if self._in_flight:
            return
        self._in_flight = True
        from kbroker.protocol import ApiKey
        from kbroker.protocol.messages.allocate_producer_ids import AllocateProducerIdsRequest

        def done(resp, exc):
            with self._lock:
                self._in_flight = False
                if exc is not None:
                    self._last_error = str(exc)
                elif resp.error_code != 0:
                    self._last_error = f"AllocateProducerIds answered error {resp.error_code}"
                else:
                    self._prefetched = ProducerIdsBlock(self.broker_id, resp.producer_id_start, resp.producer_id_len)
                    self._last_error = None
                self._lock.notify_all()
        self.channel.send(ApiKey.ALLOCATE_PRODUCER_IDS,
                          AllocateProducerIdsRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch()),
                          done, timeout_s=self.timeout_s, version=0)

    def generate_producer_id(self) -> int:
        """The next id of the current block; raises TimeoutError (no id handed out) when no
        block could be had from the controller in time."""
        import time

        deadline = time.monotonic() + self.timeout_s
        with self._lock:
            while True:
                b = self._block
                if b is not None and self._next_id <= b.last_producer_id:
                    pid = self._next_id
                    self._next_id += 1
                    if self._prefetched is None and (pid - b.first_producer_id + 1) * 10 >= b.size * 9:
                        self._request_block()
                    return pid
                if self._prefetched is not None:
                    self._block, self._prefetched = self._prefetched, None
                    self._next_id = self._block.first_producer_id
                    continue
                self._request_block()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no producer id block from the controller within {self.timeout_s}s"
                                       + (f": {self._last_error}" if self._last_error else ""))
                self._lock.wait(left)
