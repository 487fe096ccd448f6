"""Delayed operations and the purgatory that watches and expires them.

Kafka: ``core/.../server/DelayedOperation.scala`` (``DelayedOperation``,
``DelayedOperationPurgatory``; Java since 4.0 in ``server-common/.../purgatory``).

A delayed operation (a produce waiting for acks, a fetch waiting for bytes, a
join waiting for members) is parked under one or more *watch keys*: any
hashable, e.g. a ``(topic, partition)`` tuple today, a group id or
transactional id later. Whoever changes the state an operation waits on calls
``check_and_complete(key)``; the timer completes the rest when their
``delay_ms`` runs out. Nobody blocks: handler threads park the operation and
return, and completion runs on whichever thread completes it.

Completion protocol (``DelayedOperation``):

* ``on_complete()`` runs exactly once, from ``force_complete()``, whoever
  calls it first (a ``try_complete()`` that succeeds, or expiry). The
  completed flag flips under a private lock, so two racing threads cannot
  both pass it (Kafka's ``completed`` AtomicBoolean).
* On expiry, ``run()`` calls ``force_complete()`` and, if that completed the
  operation, ``on_expiration()`` after ``on_complete()``, as Kafka does.
* ``try_complete()`` is always called with ``op.lock`` held (a reentrant
  lock per operation, or a shared one passed in, e.g. a group's lock).
  ``check_and_complete`` only *tries* that lock (Kafka 2.x's
  ``maybeTryComplete``), so it never blocks and cannot deadlock: if another
  thread holds it, that thread is told to re-check after releasing it, and
  this one moves on. Every holder on the purgatory's paths honours that.
  With a shared lock, change the state the operation waits on only while
  holding that lock and call ``check_and_complete`` before releasing it
  (the lock is reentrant, so the try succeeds): a holder outside the
  purgatory does not re-check for others.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterable
from typing import Callable

from kbroker.server.timer import SystemTimer, TimerTask

log = logging.getLogger(__name__)

__all__ = ["DelayedOperation", "DelayedOperationPurgatory"]

_SHARDS = 64  # watcher-map shards, each with its own lock (Kafka: 512)


class DelayedOperation(TimerTask):
    """An operation that completes when ``try_complete()`` says so, or after ``delay_ms``.

    Subclasses implement ``try_complete() -> bool`` (check; if completable,
    ``return self.force_complete()``), ``on_complete()`` and
    ``on_expiration()``. Thread-safety: see the module docstring.
    """

    def __init__(self, delay_ms: int, lock: threading.RLock | threading.Lock | None = None) -> None:
        super().__init__(delay_ms)
        #: Held around every try_complete() and around expiry (Kafka's ``lock``).
        self.lock = threading.RLock() if lock is None else lock
        self._state_lock = threading.Lock()  # guards the two flags only; never held across calls
        self._completed = False
        self._try_complete_pending = False
        self._system_timer: SystemTimer | None = None  # set by the purgatory before timer.add

    # -- subclass API -----------------------------------------------------

    def try_complete(self) -> bool:
        """Complete now if possible (``return self.force_complete()``), else False."""
        raise NotImplementedError

    def on_complete(self) -> None:
        """The completion work (send the response). Runs exactly once."""
        raise NotImplementedError

    def on_expiration(self) -> None:
        """Extra work when completed by expiry (metrics); after on_complete."""
        raise NotImplementedError

    # -- completion ---------------------------------------------------------

    @property
    def is_completed(self) -> bool:
        return self._completed

    def force_complete(self) -> bool:
        """Complete if not yet completed; True iff this call did it.

        Cancels the timeout and runs ``on_complete()`` (in the calling thread).
        """
        with self._state_lock:
            if self._completed:
                return False
            self._completed = True
        self.cancel()
        self.on_complete()
        return True

    def cancel(self) -> bool:
        """Remove the operation from its timer, if any (does not complete it)."""
        timer = self._system_timer
        return timer.cancel(self) if timer is not None else False

    def safe_try_complete(self) -> bool:
        """``try_complete()`` under ``lock`` (blocking); False if already completed."""
        with self.lock:
            done = not self._completed and self.try_complete()
        return self._recheck_if_deferred(done)

    def safe_try_complete_or_else(self, action: Callable[[], None]) -> bool:
        """Under ``lock``: try_complete(); if that fails, action() and try again."""
        with self.lock:
            done = self.try_complete()
            if not done:
                action()
                done = self.try_complete()
        return self._recheck_if_deferred(done)

    def maybe_try_complete(self) -> bool:
        """``try_complete()`` if the lock is free, without ever blocking on it.

        If another thread holds the lock, set the pending flag: every holder
        on the purgatory's paths re-checks after releasing (at most one extra
        round per caller). True iff a try_complete() run here completed it.
        """
        done = False
        while True:
            if self.lock.acquire(blocking=False):
                try:
                    with self._state_lock:
                        self._try_complete_pending = False
                    if not self._completed:
                        done = self.try_complete() or done
                finally:
                    self.lock.release()
                # Someone failed to get the lock while we held it: re-check for them.
                with self._state_lock:
                    retry = self._try_complete_pending
            else:
                # If the flag was already set, the holder will see it; otherwise
                # the holder may be gone already, so retry here once.
                with self._state_lock:
                    retry = not self._try_complete_pending
                    self._try_complete_pending = True
            if self._completed or not retry:
                return done

    def _recheck_if_deferred(self, done: bool) -> bool:
        # After releasing ``lock``: a maybe_try_complete() that found it held
        # left the re-check to us.
        if done or self._completed:
            return done
        with self._state_lock:
            pending = self._try_complete_pending
        return self.maybe_try_complete() if pending else False

    def run(self) -> None:
        """Timer expiry (runs on the reaper thread)."""
        with self.lock:
            if not self._completed and self.force_complete():
                self.on_expiration()


class _Watchers:
    """Operations watched under one key; guarded by its shard's lock."""

    __slots__ = ("key", "ops")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.ops: dict[int, DelayedOperation] = {}  # id(op) -> op, insertion order


class _Shard:
    __slots__ = ("lock", "watchers")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers: dict[Hashable, _Watchers] = {}


class DelayedOperationPurgatory:
    """Watch lists of delayed operations by key, plus the timer that expires them.

    Owns: the watcher map (sharded, one lock per shard; an operation sits in
    the list of every key it watches until completed and purged), the timer
    (closed by ``shutdown``) and the expiration reaper thread, which advances
    the timer and, once more than ``purge_interval`` completed operations may
    still sit in watch lists, purges them.

    Metrics (Kafka's gauges): ``watched()`` = PurgatorySize (entries in watch
    lists, completed ones not yet purged included), ``num_delayed()`` =
    NumDelayedOperations (operations waiting in the timer).

    Thread-safe: any thread may call any method. Shard locks are held only
    for map/list updates, never across try_complete() or on_complete(), so
    operations may call back into the purgatory while completing.
    With ``reaper_enabled=False`` nobody expires anything unless the owner
    calls ``advance_clock`` (tests do, with a fake clock).
    """

    def __init__(
        self,
        name: str,
        timer: SystemTimer | None = None,
        purge_interval: int = 1000,
        broker_id: int = 0,
        reaper_enabled: bool = True,
        timer_enabled: bool = True,
        reaper_poll_ms: int = 200,
    ) -> None:
        self.name = name
        self.broker_id = broker_id
        self.purge_interval = purge_interval
        self._timer = timer if timer is not None else SystemTimer(name)
        self._timer_enabled = timer_enabled
        self._shards = [_Shard() for _ in range(_SHARDS)]
        self._estimated_total = 0  # operations watched since the last purge (estimate)
        self._estimate_lock = threading.Lock()
        self._reaper_poll_ms = reaper_poll_ms
        self._stopping = threading.Event()
        self._reaper: threading.Thread | None = None
        if reaper_enabled:
            self._reaper = threading.Thread(
                target=self._reap, name=f"ExpirationReaper-{broker_id}-{name}", daemon=True)
            self._reaper.start()

    @property
    def timer(self) -> SystemTimer:
        return self._timer

    def _shard(self, key: Hashable) -> _Shard:
        return self._shards[hash(key) % _SHARDS]

    # -- parking and completing ------------------------------------------------

    def try_complete_else_watch(self, operation: DelayedOperation, watch_keys: Iterable[Hashable]) -> bool:
        """Complete ``operation`` now if possible, else watch it under every key.

        Returns True iff it was completed by this call. Otherwise it is in
        the watch list of each key (unless it completed on the way: then the
        remaining keys are skipped) and in the timer.

        The check is try_complete(), watch all keys, try_complete() again,
        all under ``operation.lock``: once watched on every key, a change
        announced by check_and_complete cannot be missed.
        """
        keys = list(watch_keys)
        if not keys:
            raise ValueError("The watch key list can't be empty")

        def watch() -> None:
            for key in keys:
                if operation.is_completed:
                    break
                self._watch_for_operation(key, operation)
            with self._estimate_lock:
                self._estimated_total += 1

        if operation.safe_try_complete_or_else(watch):
            return True
        if not operation.is_completed:
            if self._timer_enabled:
                operation._system_timer = self._timer  # before add: a racing force_complete cancels
                self._timer.add(operation)
            if operation.is_completed:
                operation.cancel()
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete the operations watched under ``key``; how many completed here."""
        shard = self._shards[hash(key) % _SHARDS]
        if key not in shard.watchers:
            # Unlocked peek (a dict lookup is atomic): nothing watched, the common case
            # on every append. An operation being watched right now is not missed: its
            # try_complete_else_watch tries again after watching.
            return 0
        with shard.lock:
            watchers = shard.watchers.get(key)
            if watchers is None:
                return 0
            ops = list(watchers.ops.values())
        completed = 0
        done: list[DelayedOperation] = []
        for op in ops:
            if op.is_completed:
                done.append(op)
            elif op.maybe_try_complete():
                completed += 1
                done.append(op)
            elif op.is_completed:  # completed by the lock holder we deferred to
                done.append(op)
        if done:
            self._remove(shard, watchers, done)
        if completed:
            log.debug("key %r unblocked %d %s operations", key, completed, self.name)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation]:
        """Stop watching ``key``: its operations leave the timer, NOT completed."""
        shard = self._shard(key)
        with shard.lock:
            watchers = shard.watchers.pop(key, None)
        if watchers is None:
            return []
        ops = list(watchers.ops.values())
        for op in ops:
            op.cancel()
        return ops

    def _watch_for_operation(self, key: Hashable, operation: DelayedOperation) -> None:
        shard = self._shard(key)
        with shard.lock:
            watchers = shard.watchers.get(key)
            if watchers is None:
                watchers = shard.watchers[key] = _Watchers(key)
            watchers.ops[id(operation)] = operation

    def _remove(self, shard: _Shard, watchers: _Watchers, ops: list[DelayedOperation]) -> None:
        with shard.lock:
            for op in ops:
                watchers.ops.pop(id(op), None)
            # Drop the key if empty, unless it now maps to another list.
            if not watchers.ops and shard.watchers.get(watchers.key) is watchers:
                del shard.watchers[watchers.key]

    # -- metrics ------------------------------------------------------------------

    def watched(self) -> int:
        """Entries in all watch lists (PurgatorySize); >= live operations."""
        total = 0
        for shard in self._shards:
            with shard.lock:
                total += sum(len(w.ops) for w in shard.watchers.values())
        return total

    def num_delayed(self) -> int:
        """Operations waiting in the timer (NumDelayedOperations)."""
        return self._timer.size

    def watched_keys(self) -> int:
        """Keys with a watch list."""
        return sum(len(s.watchers) for s in self._shards)

    # -- expiry and purge -------------------------------------------------------

    def purge_completed(self) -> int:
        """Drop completed operations from every watch list; how many were dropped."""
        purged = 0
        for shard in self._shards:
            with shard.lock:
                for key, watchers in list(shard.watchers.items()):
                    ops = watchers.ops
                    stale = [k for k, op in ops.items() if op.is_completed]
                    for k in stale:
                        del ops[k]
                    purged += len(stale)
                    if not ops:
                        del shard.watchers[key]
        return purged

    def advance_clock(self, timeout_ms: int, idle: bool = False) -> None:
        """One reaper round: expire what is due (waiting up to timeout_ms), maybe purge.

        Purges once more than ``purge_interval`` operations watched since the
        last purge have left the timer (completed, so maybe still in lists).
        ``idle=True`` (the reaper, with the timer enabled): see SystemTimer.advance_clock;
        an empty timer waits for the next ``add`` (every watched operation is added, so
        no purge can come due before one), a non-empty one at most IDLE_MAX_WAIT_MS.
        """
        self._timer.advance_clock(timeout_ms, idle)
        delayed = self.num_delayed()
        with self._estimate_lock:
            if self._estimated_total - delayed <= self.purge_interval:
                return
            self._estimated_total = delayed
        purged = self.purge_completed()
        log.debug("purgatory %s purged %d completed operations", self.name, purged)

    def _reap(self) -> None:
        while not self._stopping.is_set():
            try:
                self.advance_clock(self._reaper_poll_ms, self._timer_enabled)
            except Exception:
                log.exception("purgatory %s: expiration reaper round failed", self.name)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the reaper (joined) and close the timer. Idempotent."""
        self._stopping.set()
        self._timer.wakeup()
        reaper = self._reaper
        if reaper is not None and reaper is not threading.current_thread():
            reaper.join(timeout_s)
        self._timer.close()
