"""confluent-kafka (librdkafka) adapters.

Delivery latency is librdkafka's own ``Message.latency()``: produce() -> delivery report,
microsecond clock, read when the report is served by ``poll``/``flush`` (so it includes
the wait for the next poll, which the producer loop keeps short).
"""
from __future__ import annotations

import time

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic

_QUIET = {"log.connection.close": False}


def _str_settings(settings: dict) -> dict:
    return {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in settings.items()}


class ConfluentProducer:
    name = "confluent"

    def __init__(self, bootstrap: str, settings: dict, sink):
        ok, error = sink.ok, sink.error

        def on_delivery(err, msg):
            if err is None:
                lat = msg.latency()
                key = msg.key()
                ok(lat if lat is not None else 0.0, len(msg) + (len(key) if key else 0))
            else:
                error()

        conf = {"bootstrap.servers": bootstrap, "enable.idempotence": False, **_QUIET,
                **_str_settings(settings), "on_delivery": on_delivery}
        self._p = confluent_kafka.Producer(conf)
        self._produce = self._p.produce
        self._poll = self._p.poll

    def poll(self, timeout: float) -> None:
        """Serve delivery reports, waiting up to ``timeout`` s. librdkafka's timeout has
        millisecond resolution (a sub-ms wait would be 0 = busy spinning), so shorter waits
        serve what is ready and then sleep."""
        if timeout >= 0.001:
            self._poll(timeout)
        else:
            self._poll(0)
            if timeout > 0:
                time.sleep(timeout)

    def send(self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None,
             deadline: float = float("inf")) -> bool:
        """Queue one record; on a full local queue serve delivery reports and retry
        until ``deadline`` (time.monotonic); False if it never fit."""
        while True:
            try:
                if partition is None:
                    self._produce(topic, value, key)
                else:
                    self._produce(topic, value, key, partition)
                return True
            except BufferError:
                if time.monotonic() >= deadline:
                    return False
                self._p.poll(0.005)

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for outstanding deliveries; returns how many remain."""
        return self._p.flush(timeout)

    def close(self) -> None:
        # librdkafka has no close(); dropping the handle destroys it (after a final flush)
        self._p.flush(0)
        self._p = self._produce = self._poll = None


class ConfluentConsumer:
    name = "confluent"

    def __init__(self, bootstrap: str, settings: dict):
        # fetch.queue.backoff.ms: librdkafka (2.2+) stops fetching for this long, 1000 ms by
        # default, whenever its local queue holds more than queued.min.messages (100k).
        # A broker that answers a 1 MiB fetch in ~1.5 ms fills that queue faster than a
        # Python loop drains it, and the run then measures the client's sleeps (one full
        # second per ~100k records) instead of the broker. Both brokers of a --vs run get
        # the same setting; --consumer-config fetch.queue.backoff.ms=1000 restores it.
        conf = {"bootstrap.servers": bootstrap, "group.id": "bench-consume",
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "fetch.queue.backoff.ms": 10, **_QUIET,
                **_str_settings(settings)}
        self._c = confluent_kafka.Consumer(conf)

    def assign(self, topic: str, partitions: int, from_beginning: bool = True) -> None:
        off = confluent_kafka.OFFSET_BEGINNING if from_beginning else confluent_kafka.OFFSET_END
        self._c.assign([confluent_kafka.TopicPartition(topic, p, off) for p in range(partitions)])

    def assign_tps(self, tps: list[tuple[str, int]]) -> None:
        """assign() these (topic, partition)s from the beginning."""
        self._c.assign([confluent_kafka.TopicPartition(t, p, confluent_kafka.OFFSET_BEGINNING)
                        for t, p in tps])

    def subscribe(self, topics: list[str]) -> None:
        self._c.subscribe(list(topics))

    def assigned_count(self) -> int:
        """Partitions currently assigned (subscribe: after the group rebalance)."""
        return len(self._c.assignment())

    def poll_batch(self, max_records: int, timeout: float, want_values: bool = False):
        """``(records, bytes, errors, values or None)``: waits up to ``timeout`` s for the
        first record only, then takes what is already queued (``consume(n, timeout)``
        alone would hold records back until n arrived or the timeout passed, which
        inflates e2e latency by up to the timeout)."""
        first = self._c.poll(timeout)
        if first is None:
            return 0, 0, 0, [] if want_values else None
        msgs = [first]
        if max_records > 1:
            msgs += self._c.consume(max_records - 1, 0)
        n = nbytes = errors = 0
        values = [] if want_values else None
        for m in msgs:
            if m.error() is not None:
                errors += 1
                continue
            n += 1
            k = m.key()
            nbytes += len(m) + (len(k) if k is not None else 0)      # len(Message) = value bytes
            if values is not None:
                values.append(m.value())
        return n, nbytes, errors, values

    def commit_async(self) -> None:
        """Commit consumed positions without waiting (OMB's consumer does this after
        every poll when enable.auto.commit=false); nothing consumed yet is not an error."""
        try:
            self._c.commit(asynchronous=True)
        except confluent_kafka.KafkaException:
            pass

    def close(self) -> None:
        self._c.close()


class ConfluentAdmin:
    def __init__(self, bootstrap: str):
        self._bootstrap = bootstrap
        self._a = AdminClient({"bootstrap.servers": bootstrap, **_QUIET})

    def create_topics(self, topics: dict[str, int], timeout: float = 30.0,
                      configs: dict | None = None) -> None:
        """Create ``{name: partitions}``; an existing topic is not an error."""
        if not topics:
            return
        fs = self._a.create_topics([NewTopic(t, n, 1, config=dict(configs or {}))
                                    for t, n in topics.items()], request_timeout=timeout)
        for name, f in fs.items():
            try:
                f.result(timeout)
            except confluent_kafka.KafkaException as e:
                if e.args[0].code() != confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
        self._await_leaders(list(topics), timeout)

    def _await_leaders(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            md = self._a.list_topics(timeout=max(0.1, deadline - time.monotonic()))
            if all(n in md.topics and md.topics[n].error is None and md.topics[n].partitions
                   and all(p.leader >= 0 for p in md.topics[n].partitions.values()) for n in names):
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topics {names} have no leaders after {timeout}s")
            time.sleep(0.05)

    def partitions(self, topic: str, timeout: float = 10.0) -> int:
        md = self._a.list_topics(topic, timeout=timeout)
        t = md.topics.get(topic)
        return len(t.partitions) if t is not None and t.error is None else 0

    def delete_topics(self, names: list[str], timeout: float = 30.0) -> None:
        if not names:
            return
        for f in self._a.delete_topics(list(names), request_timeout=timeout).values():
            f.result(timeout)

    def end_offsets(self, topic: str, partitions: int, timeout: float = 10.0) -> dict[int, int]:
        """``{partition: high_watermark}`` (via a throwaway consumer's watermark query)."""
        c = confluent_kafka.Consumer({"bootstrap.servers": self._bootstrap, "group.id": "bench-admin",
                                      **_QUIET})
        try:
            out = {}
            for p in range(partitions):
                _, hi = c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout)
                out[p] = hi
            return out
        finally:
            c.close()

    def close(self) -> None:
        self._a = None
