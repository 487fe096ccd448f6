"""FetchSessionCache: incremental fetch sessions (KIP-227).

Kafka: ``core/.../server/FetchSession.scala``. A session remembers, per
partition, what the client fetches (offset, max bytes, ...) and what the last
response said (high watermark, log start offset, last stable offset), so an
incremental request only lists changed partitions and an incremental response
only carries partitions with news.

Epochs: session_id 0 + epoch -1 = sessionless full fetch; session_id 0 + epoch 0
= full fetch that opens a session; session_id N + epoch -1 = close N, full
fetch; session_id N + epoch E > 0 = incremental fetch, E must be the session's
next epoch. Thread-safety: the cache and every session are guarded by
``_lock`` (sessions are small; handler threads serialise on it briefly).

Followers' sessions (a replica's Fetch) are *privileged*, consumers' are not: when the
cache is full, a new session evicts an idle one (unused for ``eviction_ms``) first,
else the least recently used unprivileged one; only a privileged session may evict a
privileged one (Kafka's tryEvict, without its size rule). A session that can evict
nothing is not created (the fetch is answered sessionless, session id 0).

Keys (Kafka's CachedPartition equality): a session opened by Fetch v13+ uses topic
ids and keys its partitions by ``(topic_id, partition)``; an older one keys them by
``(topic name, partition)``. A session never mixes the two: an incremental request
of the other kind is answered FETCH_SESSION_TOPIC_ID_ERROR. Keyed by id, a topic
deleted and re-created under the same name is a different partition, never served
under the old id. A cached partition whose id was unknown when it was added has no
name (``topic`` None) and is resolved again on every request (maybeResolveUnknownName).
"""
from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from kbroker.protocol import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INVALID_SESSION_ID = 0


@dataclass
class CachedPartition:
    """One partition of a session: what the client asks for and what it was last told.
    ``topic`` is the name (None while a topic id is unresolved); ``topic_id`` is None
    in sessions without topic ids."""
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1
    last_fetched_epoch: int = -1
    topic_id: object = None
    topic: str | None = None
    # what the client was last told
    high_watermark: int = -1
    last_stable_offset: int = -1
    leader_log_start_offset: int = -1


class FetchSession:
    def __init__(self, session_id: int, partitions: "OrderedDict[tuple, CachedPartition]", now_ms: int,
                 uses_topic_ids: bool = False, privileged: bool = False):
        self.session_id = session_id
        self.partitions = partitions
        self.uses_topic_ids = uses_topic_ids
        self.privileged = privileged      # a follower's
        self.epoch = 1  # the next epoch the client must send
        self.last_used_ms = now_ms


class FetchSessionError(Exception):
    def __init__(self, code: int):
        super().__init__(ErrorCode(code).name)
        self.code = code


class FetchSessionCache:
    def __init__(self, max_entries: int = 1000, eviction_ms: int = 120_000):
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self._sessions: "OrderedDict[int, FetchSession]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def stats(self) -> tuple[int, int]:
        """(sessions, partitions cached): Kafka's NumIncrementalFetchSessions and
        NumIncrementalFetchPartitionsCached."""
        with self._lock:
            return len(self._sessions), sum(len(s.partitions) for s in self._sessions.values())

    def count(self, privileged: bool) -> int:
        """Sessions of followers (True) or of consumers (False)."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.privileged == privileged)

    @staticmethod
    def _now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    def new_context(self, session_id: int, epoch: int, requested: "OrderedDict[tuple, CachedPartition]",
                    forgotten: list[tuple], is_follower: bool, uses_topic_ids: bool = False) -> "FetchContext":
        """Resolve the request's session. ``requested`` and ``forgotten`` are keyed by
        ``(topic_id, partition)`` when ``uses_topic_ids`` (Fetch v13+), else by
        ``(topic, partition)``. Raises FetchSessionError for unknown sessions, wrong
        epochs and a switch between ids and names (the response's top-level error code).
        ``is_follower``: a replica's fetch, whose new session is privileged."""
        now = self._now_ms()
        with self._lock:
            if epoch == FINAL_EPOCH:
                if session_id != INVALID_SESSION_ID:
                    self._sessions.pop(session_id, None)
                return FetchContext(self, None, requested, full=True)
            if epoch == INITIAL_EPOCH:
                if session_id != INVALID_SESSION_ID:
                    self._sessions.pop(session_id, None)
                session = self._create(requested, now, uses_topic_ids, is_follower)
                return FetchContext(self, session, requested, full=True)
            session = self._sessions.get(session_id)
            if session is None:
                raise FetchSessionError(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if session.epoch != epoch:
                raise FetchSessionError(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            if session.uses_topic_ids != uses_topic_ids:
                raise FetchSessionError(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
            for tp in forgotten:
                session.partitions.pop(tp, None)
            for tp, cp in requested.items():
                old = session.partitions.get(tp)
                if old is None:
                    session.partitions[tp] = cp
                else:
                    old.fetch_offset = cp.fetch_offset
                    old.max_bytes = cp.max_bytes
                    old.current_leader_epoch = cp.current_leader_epoch
                    old.log_start_offset = cp.log_start_offset
                    old.last_fetched_epoch = cp.last_fetched_epoch
                    if old.topic is None:
                        old.topic = cp.topic
            session.epoch = _next_epoch(session.epoch)
            session.last_used_ms = now
            self._sessions.move_to_end(session_id)
            return FetchContext(self, session, session.partitions, full=False)

    def _create(self, partitions, now: int, uses_topic_ids: bool, privileged: bool = False) -> FetchSession | None:
        # evict idle sessions first, then one the new session may evict if still full
        while self._sessions:
            sid, s = next(iter(self._sessions.items()))
            if now - s.last_used_ms > self.eviction_ms:
                del self._sessions[sid]
            else:
                break
        if self.max_entries <= 0:
            return None
        if len(self._sessions) >= self.max_entries:
            victim = next((sid for sid, s in self._sessions.items() if not s.privileged), None)
            if victim is None and privileged:
                victim = next(iter(self._sessions))
            if victim is None:
                return None
            del self._sessions[victim]
        while True:
            sid = random.randint(1, 2**31 - 1)
            if sid not in self._sessions:
                break
        s = FetchSession(sid, OrderedDict((tp, cp) for tp, cp in partitions.items()), now, uses_topic_ids,
                         privileged)
        self._sessions[sid] = s
        return s


def _next_epoch(e: int) -> int:
    return 1 if e >= 2**31 - 1 else e + 1


class FetchContext:
    """What to read for one request and which partitions go in the response."""

    def __init__(self, cache: FetchSessionCache, session: FetchSession | None, partitions, full: bool):
        self.cache = cache
        self.session = session
        self.partitions = partitions
        self.full = full

    @property
    def session_id(self) -> int:
        return self.session.session_id if self.session is not None else INVALID_SESSION_ID

    def fetch_list(self, resolve_name=None) -> list[tuple]:
        """[(key, CachedPartition)] to read. ``resolve_name(topic_id)`` names the partitions
        whose topic id was unknown so far (None: still unknown)."""
        with self.cache._lock:
            if resolve_name is not None:
                for cp in self.partitions.values():
                    if cp.topic is None and cp.topic_id is not None:
                        cp.topic = resolve_name(cp.topic_id)
            return list(self.partitions.items())

    def include(self, tp, cp: CachedPartition, error: int, hw: int, lso: int, log_start: int,
                has_records: bool, must_respond: bool = False) -> bool:
        """Record what the client is told; say whether ``tp`` goes in this response
        (Kafka's maybeUpdateResponseData). ``must_respond``: news the cache does not track
        (a follower's diverging epoch). An error is always answered and resets the cached
        high watermark, so the partition is answered again once the error is gone."""
        with self.cache._lock:
            changed = (must_respond or error != ErrorCode.NONE or has_records or cp.high_watermark != hw
                       or cp.last_stable_offset != lso or cp.leader_log_start_offset != log_start)
            cp.high_watermark, cp.last_stable_offset, cp.leader_log_start_offset = hw, lso, log_start
            if error != ErrorCode.NONE:
                cp.high_watermark = -1
            if self.session is not None and not self.full and has_records:
                # rotate partitions that returned data to the back, for fairness
                self.session.partitions.move_to_end(tp)
            return self.full or changed
