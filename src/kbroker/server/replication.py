"""A KRaft broker's replication plumbing around the pure state machines of kbroker.cluster.

- :class:`MetadataBrokerRegistry`: what a PartitionLeader asks about other brokers
  (alive broker epoch, fenced, in controlled shutdown), read from the published
  metadata image (Kafka's KRaftMetadataCache.getAliveBrokerEpoch / isBrokerFenced /
  isBrokerShuttingDown).
- :class:`AlterPartitionSender`: drives an :class:`~kbroker.cluster.alter_partition.AlterPartitionManager`
  over the broker's ControllerChannel (Kafka's DefaultAlterPartitionManager with its
  NodeToControllerChannelManager): one AlterPartition (v3) in flight carrying every
  queued proposal, the answers' completions run on the controller channel's send thread
  (outside the sender's lock), a failed request sent again after the backoff.
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.cluster.alter_partition import AlterPartitionManager
from kbroker.protocol import ApiKey, ErrorCode

log = logging.getLogger(__name__)

ALTER_PARTITION_VERSION = 3


class MetadataBrokerRegistry:
    """BrokerRegistry over the latest published image (``image()`` returns it)."""

    def __init__(self, image):
        self._image = image

    def _reg(self, broker_id: int):
        return self._image().cluster.brokers.get(broker_id)

    def alive_broker_epoch(self, broker_id: int) -> int | None:
        reg = self._reg(broker_id)
        return None if reg is None or reg.fenced else reg.epoch

    def is_fenced(self, broker_id: int) -> bool:
        reg = self._reg(broker_id)
        return reg is None or reg.fenced

    def is_shutting_down(self, broker_id: int) -> bool:
        reg = self._reg(broker_id)
        return reg is not None and reg.in_controlled_shutdown


class AlterPartitionSender:
    """ISR proposals to the active controller. ``submit`` from any thread; ``on_done``
    callbacks run on the controller channel's thread (or the submitter's, for a refused
    duplicate) and must not block."""

    def __init__(self, broker_id: int, broker_epoch, controller_channel, retry_backoff_ms: int = 50):
        self.manager = AlterPartitionManager(broker_id, broker_epoch, retry_backoff_ms)
        self.channel = controller_channel
        self.retry_backoff_ms = retry_backoff_ms
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._closed = False

    @staticmethod
    def _now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    def submit(self, topic: str, topic_id, partition: int, leader_and_isr, on_done) -> None:
        with self._lock:
            queued = not self._closed and self.manager.submit(topic, topic_id, partition, leader_and_isr, on_done)
        if not queued:
            on_done(None, ErrorCode.OPERATION_NOT_ATTEMPTED)
            return
        self._pump()

    def _pump(self) -> None:
        with self._lock:
            if self._closed:
                return
            now = self._now_ms()
            req = self.manager.poll(now)
            if req is None:
                deadline = self.manager.next_deadline_ms()
                if deadline is not None and deadline > now and self._timer is None:
                    self._timer = threading.Timer((deadline - now) / 1000.0, self._on_timer)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.channel.send(ApiKey.ALTER_PARTITION, req, self._on_response, timeout_s=30.0,
                          per_try_timeout_s=5.0, version=ALTER_PARTITION_VERSION)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
        self._pump()

    def _on_response(self, resp, exc) -> None:
        if exc is not None:
            log.info("AlterPartition request failed: %s", exc)
            resp = None
        with self._lock:
            done = self.manager.on_response(self._now_ms(), resp)
        for cb, result, err in done:
            try:
                cb(result, err)
            except Exception:
                log.exception("AlterPartition completion failed")
        self._pump()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
