"""kafka-python adapters. Delivery callbacks run on kafka-python's I/O thread; the send
time is taken just before ``send`` (``time.perf_counter``)."""
from __future__ import annotations

import time

import kafka
from kafka.structs import TopicPartition

_perf = time.perf_counter


def _producer_kwargs(settings: dict) -> dict:
    out: dict = {}
    for k, v in settings.items():
        if k == "acks":
            v = "all" if str(v) in ("all", "-1") else int(v)
        elif k == "compression.type":
            v = None if v in (None, "none") else v
        out[k.replace(".", "_")] = v
    return out


class KafkaPythonProducer:
    name = "kafka-python"

    def __init__(self, bootstrap: str, settings: dict, sink):
        kw = {"enable_idempotence": False, **_producer_kwargs(settings)}
        self._p = kafka.KafkaProducer(bootstrap_servers=bootstrap, **kw)
        self._sink = sink
        ok, error = sink.ok, sink.error

        def on_ok(t0, nbytes, _md):
            ok(_perf() - t0, nbytes)

        def on_err(_exc):
            error()

        self._on_ok, self._on_err = on_ok, on_err

    def send(self, topic, value, key=None, partition=None, deadline=float("inf")) -> bool:
        nbytes = len(value) + (len(key) if key else 0)
        t0 = _perf()
        fut = self._p.send(topic, value=value, key=key, partition=partition)
        fut.add_callback(self._on_ok, t0, nbytes)
        fut.add_errback(self._on_err)
        return True

    def poll(self, timeout: float) -> None:
        if timeout > 0:
            time.sleep(timeout)

    def flush(self, timeout: float) -> int:
        try:
            self._p.flush(timeout)
        except kafka.errors.KafkaTimeoutError:
            return 1
        return 0

    def close(self) -> None:
        self._p.close(timeout=10)


class KafkaPythonConsumer:
    name = "kafka-python"

    def __init__(self, bootstrap: str, settings: dict):
        kw = {k.replace(".", "_"): v for k, v in settings.items()}
        kw.setdefault("group_id", None)
        kw.setdefault("enable_auto_commit", False)
        kw.setdefault("auto_offset_reset", "earliest")
        self._c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, **kw)

    def assign(self, topic: str, partitions: int, from_beginning: bool = True) -> None:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        self._c.assign(tps)
        if from_beginning:
            self._c.seek_to_beginning(*tps)
        else:
            self._c.seek_to_end(*tps)

    def assign_tps(self, tps: list[tuple[str, int]]) -> None:
        tps = [TopicPartition(t, p) for t, p in tps]
        self._c.assign(tps)
        self._c.seek_to_beginning(*tps)

    def subscribe(self, topics: list[str]) -> None:
        self._c.subscribe(list(topics))

    def assigned_count(self) -> int:
        return len(self._c.assignment())

    def poll_batch(self, max_records: int, timeout: float, want_values: bool = False):
        got = self._c.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        n = nbytes = 0
        values = [] if want_values else None
        for recs in got.values():
            n += len(recs)
            for r in recs:
                v, k = r.value, r.key
                nbytes += (len(v) if v is not None else 0) + (len(k) if k is not None else 0)
                if values is not None:
                    values.append(v)
        return n, nbytes, 0, values

    def commit_async(self) -> None:
        self._c.commit_async()

    def close(self) -> None:
        self._c.close()
