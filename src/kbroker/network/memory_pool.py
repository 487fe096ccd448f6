"""MemoryPool: the broker-wide budget of request bytes in flight (``queued.max.request.bytes``).

Modelled on Kafka's ``org.apache.kafka.common.memory.SimpleMemoryPool`` in its non-strict
mode, which is how Kafka's ``SocketServer`` builds it
(``new SimpleMemoryPool(queued.max.request.bytes, socket.request.max.bytes, false, ...)``);
``queued.max.request.bytes <= 0`` means no pool at all (Kafka's ``MemoryPool.NONE``), and
the :class:`~kbroker.network.socket_server.SocketServer` then passes ``None``.

Ownership and life of a grant:

* The SocketServer owns the one pool; every processor of every listener shares it.
* A processor *takes* a request's size from the pool as soon as it knows it (the 4-byte
  size prefix has been read), before it reads the rest of the frame (Kafka's
  ``NetworkReceive.readFrom``). The grant belongs to the connection while the frame is
  read, then to the :class:`~kbroker.network.channel.Request` (``Request.pool_bytes``).
* The bytes are *returned* when the request is done: its response has been written, a
  no-op response or a close was processed, or its connection closed (mid-frame or with
  the request in flight, which also covers requests dropped at shutdown). That is when
  the network layer drops its reference to the frame. (Kafka returns them when the
  handler returns; a Python handler that parks a request in the purgatory keeps its
  frame alive until the response, so kbroker counts it until then.)
  :meth:`release_request` is idempotent, so every one of those paths may call it.

Non-strict: a grant succeeds whenever *any* memory is available (``available > 0``), even
if the request is larger than what is left, so ``available`` can dip to
``-(max_single - 1)`` and the bytes in flight never exceed ``size + max_single - 1``. A
single request larger than the whole pool cannot happen: the constructor refuses
``max_single > size`` (the broker refuses ``queued.max.request.bytes`` below
``socket.request.max.bytes`` at start-up, as Kafka's KafkaConfig does), and frames larger
than ``socket.request.max.bytes`` are refused before the pool is asked.

Back-pressure, not allocation: when a grant is refused (the pool is out of memory,
``available <= 0``) the processor keeps the few bytes it already read, stops reading that
connection (it is *paused for memory*, Kafka's mute on "memory pressure") and registers as
a waiter; the release that makes memory available again wakes every waiter
(``waiter.wakeup()``), and each resumes its paused connections, in random order (Kafka
shuffles under memory pressure so that no connection starves).

Thread-safety: every method may be called from any thread; ``_lock`` guards
``_available`` and ``_waiters``. ``available`` may be read without the lock (a hint).
"""
from __future__ import annotations

import threading


class MemoryPool:
    """``size`` bytes shared by all in-flight requests; one request takes at most ``max_single``."""

    __slots__ = ("size", "max_single", "available", "_lock", "_waiters")

    def __init__(self, size: int, max_single: int) -> None:
        if size <= 0 or max_single <= 0 or max_single > size:
            raise ValueError(f"a memory pool needs a positive size and a max single allocation no larger "
                             f"than it, got {size} and {max_single}")
        self.size = size
        self.max_single = max_single
        self.available = size
        self._lock = threading.Lock()
        self._waiters: list = []

    def try_allocate(self, n: int, waiter=None) -> bool:
        """Take ``n`` bytes if any memory is available (non-strict). On refusal ``waiter``
        (an object with ``wakeup()``) is woken once memory is available again."""
        if n < 1 or n > self.max_single:
            raise ValueError(f"requested size {n} is not within [1, {self.max_single}]")
        with self._lock:
            if self.available > 0:
                self.available -= n
                return True
            if waiter is not None and waiter not in self._waiters:
                self._waiters.append(waiter)
            return False

    def wait_for_memory(self, waiter) -> bool:
        """True if the pool is out of memory, with ``waiter`` registered to be woken when it
        is not; False (nothing registered) if memory is available now."""
        with self._lock:
            if self.available > 0:
                return False
            if waiter not in self._waiters:
                self._waiters.append(waiter)
            return True

    def release(self, n: int) -> None:
        """Return ``n`` bytes taken by :meth:`try_allocate`."""
        if n > 0:
            with self._lock:
                waiters = self._add_locked(n)
            for waiter in waiters:
                waiter.wakeup()

    def release_request(self, request) -> None:
        """Return the bytes ``request.pool_bytes`` holds, once (any thread, idempotent)."""
        with self._lock:
            n = request.pool_bytes
            if n <= 0:
                return
            request.pool_bytes = 0
            waiters = self._add_locked(n)
        for waiter in waiters:
            waiter.wakeup()

    def _add_locked(self, n: int) -> list:
        """Count ``n`` bytes back in; the waiters to wake (outside the lock) if memory is
        available again."""
        self.available += n
        if self._waiters and self.available > 0:
            waiters, self._waiters = self._waiters, []
            return waiters
        return []

    def is_out_of_memory(self) -> bool:
        return self.available <= 0

    @property
    def used(self) -> int:
        return self.size - self.available

    def __repr__(self) -> str:
        return f"MemoryPool({self.used}/{self.size} bytes used)"
