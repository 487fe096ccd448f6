"""KafkaStore: the registry's state kept in the compacted ``_schemas`` topic.

One partition, ``cleanup.policy=compact``. A reader thread (the only user of its
``Consumer``) reads the topic from the beginning and applies every record to the
``RegistryState`` in offset order; ``applied`` is the next offset it will apply. At
start-up ``start`` returns once the reader has applied everything up to the end offset it
saw, so a restarted registry serves the same ids and versions.

``write`` produces one record (acks=all) and waits until the reader has applied it, so a
write's effect is visible to the caller when ``write`` returns, on this instance and (as
soon as their readers catch up) on others.
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from kbroker.client.errors import KafkaError
from kbroker.schema_registry import errors
from kbroker.schema_registry.state import RegistryState

log = logging.getLogger(__name__)

TOPIC_ALREADY_EXISTS = 36


class KafkaStore:
    def __init__(self, bootstrap_servers: str, state: RegistryState, topic: str = "_schemas",
                 timeout_s: float = 30.0):
        self.bootstrap = bootstrap_servers
        self.state = state
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        self.timeout_s = timeout_s
        self.applied = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self.reader_error: BaseException | None = None

    def start(self) -> None:
        admin = Admin({"bootstrap.servers": self.bootstrap})
        try:
            res = admin.create_topics([NewTopic(self.topic, 1, 1, {"cleanup.policy": "compact"})],
                                      timeout=self.timeout_s, raise_on_error=False)
            err = res.get(self.topic)
            if err is not None and getattr(err, "code", None) != TOPIC_ALREADY_EXISTS:
                raise err
        finally:
            admin.close()
        self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "auto.offset.reset": "earliest",
                                   "enable.auto.commit": False, "fetch.max.wait.ms": 100})
        self._consumer.assign([self.tp])
        self._consumer.seek_to_beginning([self.tp])
        end = self._consumer.end_offsets([self.tp], timeout=self.timeout_s)[self.tp]
        self._producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0})
        self._thread = threading.Thread(target=self._read_loop, name="schemas-reader", daemon=True)
        self._thread.start()
        self.wait_applied(end, self.timeout_s)
        log.info("schema registry state loaded from %s up to offset %d", self.topic, end)

    def _read_loop(self) -> None:
        c = self._consumer
        try:
            while not self._stop.is_set():
                recs = c.poll(0.2)
                last = None
                for r in recs.records(self.tp) if not recs.is_empty() else ():
                    self.state.apply(r.key, r.value)
                    last = r.offset
                if last is not None:
                    with self._cond:
                        self.applied = last + 1
                        self._cond.notify_all()
                else:  # a compacted tail or an empty topic: the position is the truth
                    pos = c.position(self.tp, timeout=self.timeout_s)
                    if pos > self.applied:
                        with self._cond:
                            self.applied = pos
                            self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - surfaced to writers and to /v1/metadata
            log.exception("the _schemas reader stopped")
            self.reader_error = e
            with self._cond:
                self._cond.notify_all()

    def wait_applied(self, offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.applied < offset:
                if self.reader_error is not None:
                    raise errors.store_error(f"the {self.topic} reader failed: {self.reader_error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise errors.operation_timeout(
                        f"timed out waiting for the {self.topic} reader to reach offset {offset}")
                self._cond.wait(left)

    def write(self, key: bytes, value: bytes | None) -> int:
        """Append one record and wait until this instance has applied it; its offset."""
        try:
            md = self._producer.send(self.topic, value=value, key=key, partition=0).get(self.timeout_s)
        except KafkaError as e:
            raise errors.store_error(str(e)) from None
        self.wait_applied(md.offset + 1, self.timeout_s)
        return md.offset

    def sync(self) -> None:
        """Wait until every record written so far (by any instance) is applied here."""
        end = self._producer_end_offset()
        self.wait_applied(end, self.timeout_s)

    def _producer_end_offset(self) -> int:
        admin = Admin({"bootstrap.servers": self.bootstrap})
        try:
            from kbroker.client.consumer.fetcher import LATEST_TIMESTAMP
            return admin.list_offsets({self.tp: LATEST_TIMESTAMP}, timeout=self.timeout_s)[self.tp].offset
        finally:
            admin.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._producer is not None:
            self._producer.close(5.0)
        if self._consumer is not None:
            self._consumer.close()
