"""BrokerLifecycle: a broker's registration and heartbeats with the active controller.

Kafka: ``core/.../server/BrokerLifecycleManager.scala``. The broker registers once per
incarnation (BrokerRegistration; the controller answers the broker epoch), then sends a
BrokerHeartbeat every ``broker.heartbeat.interval.ms`` carrying its highest metadata
offset, ``want_fence`` until it is ready to serve, ``want_shut_down`` during controlled
shutdown. Its state follows the answers:

    NOT_RUNNING -> STARTING (registering, catching up with the metadata log)
      -> RECOVERY (the controller says it is caught up; log recovery may run)
      -> RUNNING (the controller unfenced it)
      -> PENDING_CONTROLLED_SHUTDOWN (asked to stop; leaders being moved away)
      -> SHUTTING_DOWN (the controller says it may go, or registration timed out)

:class:`BrokerLifecycle` is the pure state machine: no threads, no sockets, a clock
passed in. ``poll(now_ms)`` returns the request to send (at most one in flight) and
``on_response(now_ms, response)`` takes the answer (None for a failed or timed-out
request); a simulation drives it directly. :class:`BrokerLifecycleManager` hosts it on a
thread and sends through a :class:`~kbroker.server.inter_node.ControllerChannel`.
"""
from __future__ import annotations

import enum
import logging
import random
import threading
import time
import uuid
from typing import Callable

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.broker_heartbeat import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from kbroker.protocol.messages.broker_registration import (
    BrokerRegistrationRequest, BrokerRegistrationResponse, Feature, Listener,
)

log = logging.getLogger(__name__)


class BrokerState(enum.IntEnum):
    """Kafka's org.apache.kafka.metadata.BrokerState values (the broker-state metric)."""
    NOT_RUNNING = 0
    STARTING = 1
    RECOVERY = 2
    RUNNING = 3
    PENDING_CONTROLLED_SHUTDOWN = 6
    SHUTTING_DOWN = 7
    UNKNOWN = 127


class ExponentialBackoff:
    """Kafka's ExponentialBackoff: initial * multiplier**attempts, capped, with +-jitter."""

    def __init__(self, initial_ms: int, multiplier: float, max_ms: int, jitter: float, rng: random.Random):
        self.initial_ms, self.multiplier, self.max_ms, self.jitter = initial_ms, multiplier, max_ms, jitter
        self.rng = rng

    def backoff(self, attempts: int) -> int:
        if self.max_ms <= self.initial_ms:
            return self.max_ms
        term = min(self.initial_ms * self.multiplier ** attempts, self.max_ms)
        rand = 1.0 + self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 1.0
        return int(term * rand)


class BrokerLifecycle:
    """The lifecycle state machine; every method is called from one thread (the owner's).

    ``metadata_offset()`` gives the broker's highest applied metadata offset. The
    ``caught_up`` / ``unfenced`` / ``shut_down`` events are set once each, for waiters on
    other threads."""

    def __init__(self, *, node_id: int, cluster_id: str, listeners: list[tuple[str, str, int, int]],
                 features: dict[str, tuple[int, int]], rack: str | None = None,
                 log_dirs: list[uuid.UUID] = (), heartbeat_interval_ms: int = 2000,
                 session_timeout_ms: int = 9000, initial_registration_timeout_ms: int = 60000,
                 previous_broker_epoch: int = -1, incarnation_id: uuid.UUID | None = None,
                 metadata_offset: Callable[[], int] = lambda: -1, rng: random.Random | None = None):
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.listeners = listeners          # (name, host, port, security protocol id)
        self.features = features            # name -> (min, max) supported
        self.rack = rack
        self.log_dirs = sorted(log_dirs)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.initial_registration_timeout_ms = initial_registration_timeout_ms
        self.previous_broker_epoch = previous_broker_epoch
        self.incarnation_id = incarnation_id or uuid.uuid4()
        self.metadata_offset = metadata_offset
        self.backoff = ExponentialBackoff(100, 2, session_timeout_ms, 0.02, rng or random.Random())
        self.state = BrokerState.NOT_RUNNING
        self.broker_epoch = -1
        self.registered = False
        self.ready_to_unfence = False
        self.failed_attempts = 0
        self.in_flight: int | None = None     # api key of the request in flight
        self.next_send_ms: int | None = None  # when to send next (None: nothing scheduled)
        self._immediate_after_in_flight = False
        self._got_shutdown_response = False
        self._registration_deadline_ms = 0
        self._initial_registration_succeeded = False
        self.caught_up = threading.Event()
        self.unfenced = threading.Event()
        #: called once, on the thread that drives this machine, as the controller unfences
        #: the broker (the KRaft broker enables request processing then, as Kafka's)
        self.on_unfenced = None
        self.shut_down = threading.Event()

    # -- inputs ---------------------------------------------------------------------------
    def start(self, now_ms: int) -> None:
        self.state = BrokerState.STARTING
        self._registration_deadline_ms = now_ms + self.initial_registration_timeout_ms
        self.next_send_ms = now_ms
        log.info("Incarnation %s of broker %d in cluster %s is now STARTING.",
                 self.incarnation_id, self.node_id, self.cluster_id)

    def set_ready_to_unfence(self, now_ms: int) -> None:
        self.ready_to_unfence = True
        self._schedule(now_ms, 0)

    def begin_controlled_shutdown(self, now_ms: int) -> None:
        if self.state == BrokerState.RUNNING:
            log.info("Beginning controlled shutdown.")
            self.state = BrokerState.PENDING_CONTROLLED_SHUTDOWN
            self._schedule(now_ms, 0)
        elif self.state != BrokerState.PENDING_CONTROLLED_SHUTDOWN:
            log.info("Skipping controlled shutdown because we are in state %s.", self.state.name)
            self._shutdown()

    def poll(self, now_ms: int):
        """The request to send now as (api key, request), or None."""
        if self.state in (BrokerState.NOT_RUNNING, BrokerState.SHUTTING_DOWN):
            return None
        if not self._initial_registration_succeeded and now_ms >= self._registration_deadline_ms:
            log.error("Shutting down because we were unable to register with the controller quorum.")
            self._shutdown()
            return None
        if self.next_send_ms is None or now_ms < self.next_send_ms:
            return None
        if self.in_flight is not None:
            self._immediate_after_in_flight = True
            self.next_send_ms = None
            return None
        self.next_send_ms = None
        if self.registered:
            req = BrokerHeartbeatRequest(
                broker_id=self.node_id, broker_epoch=self.broker_epoch,
                current_metadata_offset=self.metadata_offset(), want_fence=not self.ready_to_unfence,
                want_shut_down=self.state == BrokerState.PENDING_CONTROLLED_SHUTDOWN)
            self.in_flight = ApiKey.BROKER_HEARTBEAT
        else:
            req = BrokerRegistrationRequest(
                broker_id=self.node_id, cluster_id=self.cluster_id, incarnation_id=self.incarnation_id,
                listeners=[Listener(name=n, host=h, port=p, security_protocol=sp)
                           for n, h, p, sp in self.listeners],
                features=[Feature(name=k, min_supported_version=lo, max_supported_version=hi)
                          for k, (lo, hi) in sorted(self.features.items())],
                rack=self.rack, is_migrating_zk_broker=False, log_dirs=list(self.log_dirs),
                previous_broker_epoch=self.previous_broker_epoch)
            self.in_flight = ApiKey.BROKER_REGISTRATION
        return self.in_flight, req

    def on_response(self, now_ms: int, response) -> None:
        """The answer to the request in flight; None when it failed or timed out."""
        sent, self.in_flight = self.in_flight, None
        if self.state == BrokerState.SHUTTING_DOWN:
            return
        if response is None:
            self._after_failure(now_ms)
        elif sent == ApiKey.BROKER_REGISTRATION and isinstance(response, BrokerRegistrationResponse):
            self._on_registration(now_ms, response)
        elif sent == ApiKey.BROKER_HEARTBEAT and isinstance(response, BrokerHeartbeatResponse):
            self._on_heartbeat(now_ms, response)
        else:
            log.error("Unexpected response type %s to %s", type(response).__name__, sent)
            self._after_failure(now_ms)

    def next_deadline_ms(self) -> int | None:
        if self.state in (BrokerState.NOT_RUNNING, BrokerState.SHUTTING_DOWN):
            return None
        if not self._initial_registration_succeeded:
            if self.next_send_ms is None:
                return self._registration_deadline_ms
            return min(self.next_send_ms, self._registration_deadline_ms)
        return self.next_send_ms

    # -- transitions ----------------------------------------------------------------------
    def _on_registration(self, now_ms: int, resp: BrokerRegistrationResponse) -> None:
        if resp.error_code != ErrorCode.NONE:
            log.info("Unable to register broker %d because the controller returned error %s",
                     self.node_id, ErrorCode(resp.error_code).name)
            self._after_failure(now_ms)
            return
        self.failed_attempts = 0
        self.broker_epoch = resp.broker_epoch
        self.registered = True
        self._initial_registration_succeeded = True
        log.info("Successfully registered broker %d with broker epoch %d", self.node_id, self.broker_epoch)
        self._schedule(now_ms, 0)

    def _on_heartbeat(self, now_ms: int, resp: BrokerHeartbeatResponse) -> None:
        if resp.error_code != ErrorCode.NONE:
            log.warning("Broker %d sent a heartbeat request but received error %s.", self.node_id,
                        ErrorCode(resp.error_code).name)
            self._after_failure(now_ms)
            return
        self.failed_attempts = 0
        st = self.state
        if st == BrokerState.STARTING:
            if resp.is_caught_up:
                log.info("The broker has caught up. Transitioning from STARTING to RECOVERY.")
                self.state = BrokerState.RECOVERY
                self.caught_up.set()
            self._schedule(now_ms, 10)
        elif st == BrokerState.RECOVERY:
            if not resp.is_fenced:
                log.info("The broker has been unfenced. Transitioning from RECOVERY to RUNNING.")
                self.state = BrokerState.RUNNING
                self.unfenced.set()
                if self.on_unfenced is not None:
                    self.on_unfenced()
            self._schedule(now_ms, self.heartbeat_interval_ms)
        elif st == BrokerState.RUNNING:
            self._schedule(now_ms, self.heartbeat_interval_ms)
        elif st == BrokerState.PENDING_CONTROLLED_SHUTDOWN:
            if resp.should_shut_down:
                log.info("The controller has asked us to exit controlled shutdown.")
                self._shutdown()
                return
            self._schedule(now_ms, self.heartbeat_interval_ms if self._got_shutdown_response else 50)
            self._got_shutdown_response = True

    def _after_failure(self, now_ms: int) -> None:
        delay = self.backoff.backoff(self.failed_attempts)
        self.failed_attempts += 1
        self._immediate_after_in_flight = False
        self._schedule(now_ms, delay)

    def _schedule(self, now_ms: int, delay_ms: int) -> None:
        """Send the next request ``delay_ms`` from now. Asked for "at once" while a request
        is in flight, the next one goes as soon as its answer is handled (Kafka's
        nextSchedulingShouldBeImmediate); the answer's handler schedules the rest."""
        if self.in_flight is not None:
            if delay_ms == 0:
                self._immediate_after_in_flight = True
            return
        if self._immediate_after_in_flight:
            delay_ms = 0
            self._immediate_after_in_flight = False
        self.next_send_ms = now_ms + delay_ms

    def _shutdown(self) -> None:
        log.info("Transitioning from %s to SHUTTING_DOWN.", self.state.name)
        self.state = BrokerState.SHUTTING_DOWN
        self.next_send_ms = None
        self.shut_down.set()


class BrokerLifecycleManager:
    """Hosts a BrokerLifecycle on its own thread; requests go through ``channel``
    (a ControllerChannel). Public methods may be called from any thread."""

    def __init__(self, lifecycle: BrokerLifecycle, channel, request_timeout_s: float = 5.0):
        self.lifecycle = lifecycle
        self.channel = channel
        self.request_timeout_s = request_timeout_s
        self._cond = threading.Condition()
        self._inbox: list = []          # callables run on the lifecycle thread
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"broker-{lifecycle.node_id}-lifecycle",
                                        daemon=True)

    @staticmethod
    def _now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    def start(self) -> None:
        self._submit(lambda: self.lifecycle.start(self._now_ms()))
        self._thread.start()

    def set_ready_to_unfence(self) -> None:
        self._submit(lambda: self.lifecycle.set_ready_to_unfence(self._now_ms()))

    def begin_controlled_shutdown(self) -> None:
        self._submit(lambda: self.lifecycle.begin_controlled_shutdown(self._now_ms()))

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _submit(self, fn) -> None:
        with self._cond:
            self._inbox.append(fn)
            self._cond.notify_all()

    def _run(self) -> None:
        lc = self.lifecycle
        while True:
            with self._cond:
                if self._closed:
                    return
                work, self._inbox = self._inbox, []
            for fn in work:
                fn()
            now = self._now_ms()
            out = lc.poll(now)
            if out is not None:
                api_key, req = out

                def done(resp, exc, _key=api_key):
                    if exc is not None:
                        log.info("%s to the controller failed: %s", ApiKey(_key).name, exc)
                    self._submit(lambda: lc.on_response(self._now_ms(), None if exc is not None else resp))

                self.channel.send(api_key, req, done, timeout_s=self.request_timeout_s,
                                  per_try_timeout_s=self.request_timeout_s)
                continue
            deadline = lc.next_deadline_ms()
            with self._cond:
                if self._inbox or self._closed:
                    continue
                wait = 1.0 if deadline is None else max(0.0, (deadline - self._now_ms()) / 1000.0)
                self._cond.wait(min(wait, 1.0))
