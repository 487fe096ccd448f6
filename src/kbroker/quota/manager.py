"""Client quota managers: per user/client-id rates, their bounds, and throttle times.

Kafka: ``ClientQuotaManager`` (produce and fetch byte rates), ``ClientRequestQuotaManager``
(request handler time as a percentage of one thread) and ``DefaultQuotaCallback``.

Which quota applies to a request of (user, client-id) is the first configured one of, in
Kafka's order::

    user=U,client-id=C   user=U,client-id=<default>   user=U
    user=<default>,client-id=C   user=<default>,client-id=<default>   user=<default>
    client-id=C   client-id=<default>

and the level that matched decides who shares one sensor (a rate): a quota set for user U
is shared by all of U's clients; one set for client-id <default> is per client-id. With no
quota configured for a type nothing is recorded for it (Kafka's quotasEnabled).

A violation (the rate, measured right after recording, above the bound) gives the throttle
time Kafka computes: ``(rate - bound) / bound * window`` ms, where window is the rate's
elapsed window (:meth:`SampledRate.window_size_ms`); the request quota caps it at one
quota window. The broker answers at once with ``throttle_time_ms`` and mutes the
connection for that long after the response (KIP-219).

Thread-safety: ``_lock`` guards the sensor map and every sensor; the quota map is replaced
whole by :meth:`update_quotas` (readers take it without a lock).
"""
from __future__ import annotations

import threading
import time
from typing import Mapping

from kbroker.quota.entity import (
    CLIENT_ID, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, USER,
)
from kbroker.quota.rate import SampledRate

#: sensors idle this long are dropped (Kafka: quota sensors expire after an hour)
INACTIVE_SENSOR_EXPIRATION_MS = 3600 * 1000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class _Sensor:
    __slots__ = ("rate", "bound", "last_record_ms", "throttle_ms_total")

    def __init__(self, rate: SampledRate, bound: float, now_ms: int):
        self.rate = rate
        self.bound = bound
        self.last_record_ms = now_ms
        self.throttle_ms_total = 0


class ClientQuotaManager:
    """One quota type (``producer_byte_rate``, ``consumer_byte_rate`` or
    ``request_percentage``)."""

    def __init__(self, quota_key: str, samples: int = 11, window_s: int = 1,
                 max_throttle_ms: int | None = None, clock_ms=_monotonic_ms):
        self.quota_key = quota_key
        self.samples = samples
        self.window_ms = window_s * 1000
        self.max_throttle_ms = max_throttle_ms
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._sensors: dict[tuple[str, str], _Sensor] = {}
        self._quotas: Mapping = {}
        self.enabled = False
        self._last_expiry_ms = 0

    # -- configuration --------------------------------------------------------------------------
    def update_quotas(self, quotas: Mapping) -> None:
        """``quotas``: entity key ((type, name | None), ...) -> {quota key: value}. Only this
        manager's key is kept. Existing sensors take the new bounds at once."""
        mine = {}
        for key, values in quotas.items():
            v = values.get(self.quota_key)
            if v is None:
                continue
            d = dict(key)
            if set(d) - {USER, CLIENT_ID}:
                continue
            mine[(d.get(USER, _ABSENT), d.get(CLIENT_ID, _ABSENT))] = float(v)
        with self._lock:
            # Sensors are kept (Kafka's updateQuotaMetricConfigs updates the bound of the existing
            # metric): a client's recorded rate survives any quota change. A sensor is keyed by the
            # level that matched, so a client whose quota now comes from another level starts a new
            # one; sensors no longer matched expire with the idle ones.
            self._quotas = mine
            self.enabled = bool(mine)

    def quota(self, user: str, client_id: str) -> tuple[tuple[str, str], float] | None:
        """(sensor key, bound) of the quota that applies, or None (unlimited)."""
        q = self._quotas
        if not q:
            return None
        for (u, c), skey in (
                ((user, client_id), (user, client_id)), ((user, None), (user, client_id)),
                ((user, _ABSENT), (user, "")),
                ((None, client_id), (user, client_id)), ((None, None), (user, client_id)),
                ((None, _ABSENT), (user, "")),
                ((_ABSENT, client_id), ("", client_id)), ((_ABSENT, None), ("", client_id))):
            bound = q.get((u, c))
            if bound is not None:
                return skey, bound
        return None

    # -- recording ------------------------------------------------------------------------------
    def record_and_get_throttle_ms(self, user: str, client_id: str, value: float,
                                   now_ms: int | None = None) -> int:
        """Record ``value`` for (user, client-id); the throttle time in ms if that puts the
        rate above its bound, else 0."""
        if not self.enabled:
            return 0
        hit = self.quota(user, client_id)
        if hit is None:
            return 0
        skey, bound = hit
        now = self._clock_ms() if now_ms is None else now_ms
        with self._lock:
            s = self._sensors.get(skey)
            if s is None:
                s = self._sensors[skey] = _Sensor(SampledRate(self.samples, self.window_ms), bound, now)
            s.bound = bound
            s.last_record_ms = now
            s.rate.record(value, now)
            rate = s.rate.measure(now)
            throttle = 0
            if rate > bound:
                throttle = round((rate - bound) / bound * s.rate.window_size_ms(now))
                if self.max_throttle_ms is not None:
                    throttle = min(throttle, self.max_throttle_ms)
                s.throttle_ms_total += throttle
            if now - self._last_expiry_ms > 60_000:
                self._last_expiry_ms = now
                for k in [k for k, v in self._sensors.items()
                          if now - v.last_record_ms > INACTIVE_SENSOR_EXPIRATION_MS]:
                    del self._sensors[k]
            return throttle

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int | None = None) -> None:
        """Take back a recorded value (Kafka's unrecordQuotaSensor: a fetch answered empty
        because it is throttled does not count its bytes)."""
        hit = self.quota(user, client_id) if self.enabled else None
        if hit is None:
            return
        now = self._clock_ms() if now_ms is None else now_ms
        with self._lock:
            s = self._sensors.get(hit[0])
            if s is not None:
                s.rate.record(-value, now)

    def max_value_in_window(self, user: str, client_id: str) -> int:
        """Kafka's getMaxValueInQuotaWindow: the bound times the ``samples - 1`` full windows a
        rate is measured over (a fetch is capped to it); unlimited: 2**31 - 1."""
        hit = self.quota(user, client_id) if self.enabled else None
        if hit is None:
            return 2**31 - 1
        return max(1, min(2**31 - 1, int(hit[1] * (self.samples - 1) * self.window_ms / 1000)))

    def rate(self, user: str, client_id: str, now_ms: int | None = None) -> float | None:
        hit = self.quota(user, client_id) if self.enabled else None
        if hit is None:
            return None
        now = self._clock_ms() if now_ms is None else now_ms
        with self._lock:
            s = self._sensors.get(hit[0])
            return None if s is None else s.rate.measure(now)


class _Absent:
    """The entity type is not part of the quota's entity (distinct from its default, None)."""
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


_ABSENT = _Absent()


class QuotaManagers:
    """The broker's client quota managers (Kafka's QuotaFactory.QuotaManagers)."""

    def __init__(self, samples: int = 11, window_s: int = 1, clock_ms=_monotonic_ms):
        self.produce = ClientQuotaManager(PRODUCER_BYTE_RATE, samples, window_s, clock_ms=clock_ms)
        self.fetch = ClientQuotaManager(CONSUMER_BYTE_RATE, samples, window_s, clock_ms=clock_ms)
        self.request = ClientQuotaManager(REQUEST_PERCENTAGE, samples, window_s,
                                          max_throttle_ms=window_s * 1000, clock_ms=clock_ms)
        from kbroker.quota.controller_mutation import ControllerMutationQuotaManager
        self.controller_mutation = ControllerMutationQuotaManager(samples, window_s, clock_ms=clock_ms)
        #: any quota set (read per request by KafkaApis: a plain attribute, not a property)
        self.any_enabled = False
        #: the socket server's ConnectionQuotas: takes the ip entities' connection_creation_rate
        self._connection_quotas = None
        self._last: Mapping = {}

    @classmethod
    def from_config(cls, config) -> "QuotaManagers":
        return cls(config["quota.window.num"], config["quota.window.size.seconds"])

    def update_quotas(self, quotas: Mapping) -> None:
        self._last = quotas
        for m in (self.produce, self.fetch, self.request, self.controller_mutation):
            m.update_quotas(quotas)
        self.any_enabled = (self.produce.enabled or self.fetch.enabled or self.request.enabled
                            or self.controller_mutation.enabled)
        if self._connection_quotas is not None:
            self._connection_quotas.update_ip_quotas(quotas)

    def bind_connection_quotas(self, connection_quotas) -> None:
        """Send the per-IP ``connection_creation_rate`` quotas (now and on every update) to
        ``connection_quotas`` (kbroker.network.acceptor.ConnectionQuotas)."""
        self._connection_quotas = connection_quotas
        connection_quotas.update_ip_quotas(self._last)
