"""Leader election among registry instances through a Kafka consumer group.

Every instance runs a ``Consumer`` in the group (default ``schema-registry``) subscribed
to the one-partition ``_schemas`` topic, with ``client.id`` = ``schema-registry|<its
URL>``. The group's assignor gives partition 0 to exactly one member: that instance is
the leader and the only writer. The partition is paused at once (the instance's reader
reads the topic on its own). Followers find the leader's URL by describing the group
(the member whose assignment holds partition 0) and forward writes to it.

On becoming leader an instance first waits until it has applied every record in the
topic (``KafkaStore.sync``), so the ids and versions it allocates follow the previous
leader's. Like Confluent's election, this has no fencing: during a rebalance an old
leader may finish a write it had started.

Thread: one ``leader-elector`` thread owns the consumer; ``leader_url`` is read by
request threads (an atomic attribute read).
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.client import Admin, Consumer, TopicPartition
from kbroker.schema_registry import errors

log = logging.getLogger(__name__)

CLIENT_ID_PREFIX = "schema-registry|"


class LeaderElector:
    def __init__(self, store, url: str, group_id: str = "schema-registry"):
        self.store = store
        self.url = url
        self.group_id = group_id
        self.tp = TopicPartition(store.topic, 0)
        self.is_leader = False
        self.leader_url: str | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None

    def start(self) -> None:
        self._consumer = Consumer({
            "bootstrap.servers": self.store.bootstrap, "group.id": self.group_id,
            "client.id": CLIENT_ID_PREFIX + self.url, "enable.auto.commit": False,
            "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000})
        self._consumer.subscribe([self.store.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._thread = threading.Thread(target=self._run, name="leader-elector", daemon=True)
        self._thread.start()

    def _on_assign(self, consumer, tps) -> None:
        if self.tp in tps:
            consumer.pause([self.tp])
            self.store.sync()  # allocate after the previous leader's last write
            self._set(True, self.url)
            log.info("this schema registry (%s) is the leader", self.url)
        else:
            self._set(False, None)

    def _on_revoke(self, consumer, tps) -> None:
        if self.is_leader:
            log.info("this schema registry (%s) is no longer the leader", self.url)
        self._set(False, None)

    def _set(self, leader: bool, url: str | None) -> None:
        with self._changed:
            self.is_leader = leader
            self.leader_url = url
            self._changed.notify_all()

    def _run(self) -> None:
        last_lookup = 0.0
        while not self._stop.is_set():
            try:
                self._consumer.poll(0.2)
                if not self.is_leader and self.leader_url is None and time.monotonic() - last_lookup > 0.5:
                    last_lookup = time.monotonic()
                    url = self._find_leader()
                    if url is not None and not self.is_leader:
                        self._set(False, url)
            except Exception:  # noqa: BLE001 - the election retries; requests see "no leader"
                log.exception("leader election poll failed")
                self._stop.wait(1.0)

    def _find_leader(self) -> str | None:
        admin = Admin({"bootstrap.servers": self.store.bootstrap})
        try:
            g = admin.describe_consumer_groups([self.group_id], timeout=5.0, raise_on_error=False).get(self.group_id)
        finally:
            admin.close()
        for m in getattr(g, "members", None) or ():
            if m.client_id.startswith(CLIENT_ID_PREFIX) and any(
                    (tp.topic, tp.partition) == (self.tp.topic, 0) for tp in m.assignment):
                return m.client_id[len(CLIENT_ID_PREFIX):]
        return None

    def forget_leader(self) -> None:
        """After a failed forward: look the leader up again."""
        if not self.is_leader:
            self._set(False, None)

    def await_leader(self, timeout_s: float) -> tuple[bool, str]:
        """(this instance leads, leader URL); raises 50004 when none is known in time."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.leader_url is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.RestError(500, 50004, "Unknown leader: no schema registry instance "
                                                       "is elected yet")
                self._changed.wait(min(left, 0.2))
            return self.is_leader, self.leader_url

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001
                log.debug("closing the elector consumer", exc_info=True)
