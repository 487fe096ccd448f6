"""kbroker.client adapters (our own client; Kafka property names pass straight through).
Delivery callbacks ``on_delivery(err, metadata)`` run on the client's sender thread; the
send time is taken just before ``send`` (``time.perf_counter``)."""
from __future__ import annotations

import time
from functools import partial

_perf = time.perf_counter


class KBrokerProducer:
    name = "kbroker"

    def __init__(self, bootstrap: str, settings: dict, sink):
        from kbroker.client import Producer
        self._p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, **settings})
        ok, error = sink.ok, sink.error

        def on_delivery(t0, nbytes, err, _md):
            if err is None:
                ok(_perf() - t0, nbytes)
            else:
                error()

        self._cb = on_delivery
        self._send = self._p.send

    def send(self, topic, value, key=None, partition=None, deadline=float("inf")) -> bool:
        nbytes = len(value) + (len(key) if key else 0)
        self._send(topic, value, key, partition, on_delivery=partial(self._cb, _perf(), nbytes))
        return True

    def poll(self, timeout: float) -> None:
        if timeout > 0:
            time.sleep(timeout)

    def flush(self, timeout: float) -> int:
        from kbroker.client import KafkaTimeoutError
        try:
            self._p.flush(timeout)
        except KafkaTimeoutError:
            return 1
        return 0

    def close(self) -> None:
        self._p.close(10)


class KBrokerConsumer:
    name = "kbroker"

    def __init__(self, bootstrap: str, settings: dict):
        from kbroker.client import Consumer
        conf = {"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                "auto.offset.reset": "earliest", **settings}
        self._c = Consumer(conf)

    def assign(self, topic: str, partitions: int, from_beginning: bool = True) -> None:
        from kbroker.client import TopicPartition
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        self._c.assign(tps)
        if from_beginning:
            self._c.seek_to_beginning(tps)
        else:
            self._c.seek_to_end(tps)

    def assign_tps(self, tps: list[tuple[str, int]]) -> None:
        from kbroker.client import TopicPartition
        tps = [TopicPartition(t, p) for t, p in tps]
        self._c.assign(tps)
        self._c.seek_to_beginning(tps)

    def subscribe(self, topics: list[str]) -> None:
        self._c.subscribe(list(topics))

    def assigned_count(self) -> int:
        return len(self._c.assignment())

    def poll_batch(self, max_records: int, timeout: float, want_values: bool = False):
        recs = self._c.poll(timeout, max_records=max_records)
        n = nbytes = 0
        values = [] if want_values else None
        for r in recs:
            n += 1
            v, k = r.value, r.key
            nbytes += (len(v) if v is not None else 0) + (len(k) if k is not None else 0)
            if values is not None:
                values.append(v)
        return n, nbytes, 0, values

    def commit_async(self) -> None:
        self._c.commit_async()

    def close(self) -> None:
        self._c.close()
