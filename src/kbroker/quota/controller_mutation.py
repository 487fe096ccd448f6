"""The controller mutation quota (KIP-599): partitions created or deleted per second.

Kafka: ``ControllerMutationQuotaManager`` with its ``TokenBucket`` sensor, and the
``StrictControllerMutationQuota`` / ``PermissiveControllerMutationQuota`` a request gets.

The rate a (user, client-id) may mutate at is ``controller_mutation_rate`` (resolved like the
other client quotas, see :mod:`kbroker.quota.manager`). Its sensor is a token bucket holding at
most ``quota x samples x window`` tokens (the burst), refilled at ``quota`` per second; each
partition created (CreateTopics, CreatePartitions) or deleted (DeleteTopics) takes one. The
bucket may go negative; while it is negative the client is over its quota, for
``-tokens / quota`` seconds (the throttle time).

- Strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): a topic whose turn comes
  while the bucket is negative is refused with THROTTLING_QUOTA_EXCEEDED and takes nothing;
  otherwise it takes its partitions even if that makes the bucket negative.
- Permissive (older versions): every topic takes its partitions; the client is only throttled.

Either way the response carries the throttle time (less the time since it was computed) and
the connection is muted for it, as for any quota.

Where it is enforced: Kafka's controller, with the client's principal and client id from the
forwarding Envelope. kbroker forwards admin requests without an Envelope, so the controller
cannot tell clients apart: the broker that receives the request enforces it (the zero-config
node in its own handlers; a KRaft broker around the forward, refunding what the controller then
refused). A client spreading its requests over N brokers thus gets N buckets.

Thread-safety: ``_lock`` guards the buckets; a quota object belongs to one request.
"""
from __future__ import annotations

import threading

from kbroker.quota.entity import CONTROLLER_MUTATION_RATE
from kbroker.quota.manager import ClientQuotaManager, _monotonic_ms
from kbroker.protocol import ApiKey

__all__ = ["TokenBucket", "ControllerMutationQuotaManager", "ControllerMutationQuota",
           "STRICT_SINCE_VERSION", "THROTTLING_QUOTA_EXCEEDED_MESSAGE"]

#: the first version of each API whose quota is strict (Kafka's ControllerApis / KafkaApis)
STRICT_SINCE_VERSION = {ApiKey.CREATE_TOPICS: 6, ApiKey.CREATE_PARTITIONS: 3, ApiKey.DELETE_TOPICS: 5}
THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."


class TokenBucket:
    """Kafka's ``stats.TokenBucket``: starts full; ``tokens`` never above the burst."""

    __slots__ = ("tokens", "last_update_ms")

    def __init__(self):
        self.tokens: float | None = None          # full, once a bound is known
        self.last_update_ms = 0

    def _refill(self, quota: float, burst: float, now_ms: int) -> None:
        if self.tokens is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + quota * (now_ms - self.last_update_ms) / 1000.0)
        self.last_update_ms = now_ms

    def measure(self, quota: float, burst: float, now_ms: int) -> float:
        self._refill(quota, burst, now_ms)
        return self.tokens

    def record(self, value: float, quota: float, burst: float, now_ms: int) -> None:
        self._refill(quota, burst, now_ms)
        self.tokens = min(burst, self.tokens - value)


class ControllerMutationQuotaManager(ClientQuotaManager):
    """``controller_mutation_rate`` quotas: one token bucket per resolved sensor key."""

    def __init__(self, samples: int = 11, window_s: int = 1, clock_ms=_monotonic_ms):
        super().__init__(CONTROLLER_MUTATION_RATE, samples, window_s, clock_ms=clock_ms)
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._bucket_lock = threading.Lock()

    def new_quota_for(self, user: str, client_id: str, api_key: int, api_version: int):
        """The request's quota: strict or permissive by version; None when no quota applies."""
        if not self.enabled:
            return None
        hit = self.quota(user, client_id)
        if hit is None:
            return None
        skey, bound = hit
        with self._bucket_lock:
            bucket = self._buckets.get(skey)
            if bucket is None:
                bucket = self._buckets[skey] = TokenBucket()
        strict = api_version >= STRICT_SINCE_VERSION.get(api_key, 0)
        return ControllerMutationQuota(self, bucket, bound, strict)


class ControllerMutationQuota:
    """One request's view of its client's bucket (Kafka's Strict/PermissiveControllerMutationQuota)."""

    def __init__(self, manager: ControllerMutationQuotaManager, bucket: TokenBucket, bound: float, strict: bool):
        self._m = manager
        self._bucket = bucket
        self.bound = bound
        self.burst = bound * manager.samples * manager.window_ms / 1000.0
        self.strict = strict
        self._throttle_ms = 0
        self._recorded_ms = 0

    def _now(self) -> int:
        return self._m._clock_ms()

    def _update_throttle(self, tokens: float, now: int) -> None:
        self._throttle_ms = round(-tokens / self.bound * 1000) if tokens < 0 else 0
        self._recorded_ms = now

    def check(self) -> bool:
        """Strict: False (and the throttle time set) while the bucket is negative. Permissive:
        True."""
        if not self.strict:
            return True
        now = self._now()
        with self._m._bucket_lock:
            tokens = self._bucket.measure(self.bound, self.burst, now)
        if tokens < 0:
            self._update_throttle(tokens, now)
            return False
        return True

    def record(self, permits: float) -> None:
        """Take ``permits`` tokens (the bucket may go negative); permissive: the throttle
        time follows the bucket."""
        now = self._now()
        with self._m._bucket_lock:
            b = self._bucket
            b.record(permits, self.bound, self.burst, now)
            tokens = b.measure(self.bound, self.burst, now)
        if not self.strict and tokens < 0:
            self._update_throttle(tokens, now)

    def try_record(self, permits: float) -> bool:
        """:meth:`check`, then :meth:`record` if it passed (Kafka's record(permits))."""
        if not self.check():
            return False
        self.record(permits)
        return True

    def refund(self, permits: float) -> None:
        """Give back ``permits`` taken for a mutation that did not happen (a KRaft broker's
        forward the controller refused)."""
        if permits:
            with self._m._bucket_lock:
                self._bucket.record(-permits, self.bound, self.burst, self._now())

    def throttle_time_ms(self) -> int:
        """The throttle time last computed, less the time since (Kafka's throttleTime)."""
        if not self._throttle_ms:
            return 0
        return max(0, self._throttle_ms - (self._now() - self._recorded_ms))
