"""Idempotent producers against a real kbroker process (issue 8).

Real clients with idempotence on (kafka-python 3.x's default, confluent-kafka,
aiokafka) deliver every record exactly once and in order; raw ProduceRequests
get Kafka's exact answers for duplicates and bad sequences / epochs; a TCP
proxy that kills connections mid-flight and a broker SIGKILL + restart make
producers retry batches the broker already wrote, and those are not written
twice. InitProducerId never repeats an id across restarts.
"""
import asyncio
import os
import socket
import struct
import time
import uuid

import pytest

from kbroker.chaos.proxy import FaultProxy
from kbroker.kernels import records
from kbroker.protocol import ApiKey, ErrorCode, decode_response, encode_request
from kbroker.protocol.messages.api_versions import ApiVersionsRequest
from kbroker.protocol.messages.init_producer_id import InitProducerIdRequest
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData

import confluent_kafka as ck  # noqa: E402
from tests.broker.kafka_helpers import consume_assigned, create_topic  # noqa: E402

INT32_MAX = 0x7FFFFFFF


def _topic(prefix="idem"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- a raw Kafka connection ------------------------------------------------------------------
def _read_frame(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return buf
    (n,) = struct.unpack(">i", exact(4))
    return exact(n)


class Raw:
    """One blocking connection: request in, response out (one in flight)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation_id = 0

    def call(self, api_key, version, body):
        self.correlation_id += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation_id, "idem-test", body))
        header, resp = decode_response(_read_frame(self.sock), api_key, version)
        assert header.correlation_id == self.correlation_id
        return resp

    def init_producer_id(self, version=4, transactional_id=None, timeout_ms=60000, producer_id=-1,
                         producer_epoch=-1):
        req = InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=timeout_ms,
                                    producer_id=producer_id, producer_epoch=producer_epoch)
        r = self.call(ApiKey.INIT_PRODUCER_ID, version, req)
        return r.error_code, r.producer_id, r.producer_epoch

    def produce(self, topic, partition, batch, version=9, acks=-1):
        """-> (error_code, base_offset) of the one partition."""
        req = ProduceRequest(transactional_id=None, acks=acks, timeout_ms=10000, topic_data=[
            TopicProduceData(name=topic, partition_data=[PartitionProduceData(index=partition, records=batch)])])
        r = self.call(ApiKey.PRODUCE, version, req)
        p = r.responses[0].partition_responses[0]
        return p.error_code, p.base_offset

    def close(self):
        self.sock.close()


def ibatch(pid, epoch, seq, n=1, tag=b"r"):
    now = int(time.time() * 1000)
    return records.encode_batch([(now, b"k", tag + b"-%d" % i, []) for i in range(n)],
                                producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def plain_batch(n=1):
    return records.encode_batch([(int(time.time() * 1000), b"k", b"plain", [])] * n)


@pytest.fixture
def raw(broker):
    r = Raw(broker.port)
    yield r
    r.close()


# -- InitProducerId ------------------------------------------------------------------------------
def test_init_producer_id_is_advertised_and_answers_every_version(raw):
    versions = raw.call(ApiKey.API_VERSIONS, 3, ApiVersionsRequest(client_software_name="t",
                                                                    client_software_version="1"))
    adv = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert adv[ApiKey.INIT_PRODUCER_ID] == (0, 5)
    ids = []
    for v in range(6):
        err, pid, epoch = raw.init_producer_id(version=v)
        assert (err, epoch) == (ErrorCode.NONE, 0)
        ids.append(pid)
    assert ids == sorted(set(ids)) and ids[0] >= 0
    # v3+: an idempotent producer asking again with its current id gets a fresh one (Kafka's blind accept)
    err, pid, epoch = raw.init_producer_id(version=5, producer_id=ids[-1], producer_epoch=0)
    assert (err, epoch) == (ErrorCode.NONE, 0) and pid > ids[-1]


def test_init_producer_id_request_errors(raw):
    # half-set (producer_id, producer_epoch)
    assert raw.init_producer_id(version=4, producer_id=7)[0] == ErrorCode.INVALID_REQUEST
    assert raw.init_producer_id(version=4, transactional_id="")[0] == ErrorCode.INVALID_REQUEST
    assert raw.init_producer_id(version=4, transactional_id="tx", timeout_ms=0)[0] == \
        ErrorCode.INVALID_TRANSACTION_TIMEOUT
    # a transactional id goes to the transaction coordinator: one producer id, the epoch bumped each time
    answers = [raw.init_producer_id(version=v, transactional_id="tx") for v in (0, 2, 5)]
    assert [(err, epoch) for err, _, epoch in answers] == [(ErrorCode.NONE, 0), (ErrorCode.NONE, 1),
                                                          (ErrorCode.NONE, 2)]
    assert len({pid for _, pid, _ in answers}) == 1


# -- raw produce: Kafka's answers ---------------------------------------------------------------------
def test_duplicates_of_the_last_five_batches_answer_their_original_offsets(broker, raw):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    _, pid, epoch = raw.init_producer_id()
    offsets = []
    for i in range(8):
        err, base = raw.produce(topic, 0, ibatch(pid, epoch, 3 * i, n=3))
        assert err == ErrorCode.NONE
        offsets.append(base)
    assert offsets == [3 * i for i in range(8)]
    for i in range(3, 8):   # each of the last 5, in any order, any number of times
        for _ in range(2):
            assert raw.produce(topic, 0, ibatch(pid, epoch, 3 * i, n=3)) == (ErrorCode.NONE, offsets[i])
    # the 6th-newest is out of the window: out of sequence
    assert raw.produce(topic, 0, ibatch(pid, epoch, 6, n=3))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # nothing was appended by any of that: the next new batch lands right after the 8th
    assert raw.produce(topic, 0, ibatch(pid, epoch, 24)) == (ErrorCode.NONE, 24)
    assert raw.produce(topic, 0, plain_batch()) == (ErrorCode.NONE, 25)


def test_sequence_and_epoch_errors(broker, raw):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    _, pid, _ = raw.init_producer_id()
    assert raw.produce(topic, 0, ibatch(pid, 0, 0, n=2)) == (ErrorCode.NONE, 0)
    assert raw.produce(topic, 0, ibatch(pid, 0, 3))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER    # gap
    assert raw.produce(topic, 0, ibatch(pid, 1, 5))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER    # new epoch, seq != 0
    assert raw.produce(topic, 0, ibatch(pid, 1, 0)) == (ErrorCode.NONE, 2)                          # KIP-360 bump
    assert raw.produce(topic, 0, ibatch(pid, 0, 2))[0] == ErrorCode.INVALID_PRODUCER_EPOCH          # fenced epoch
    # a producer id with a negative sequence is an invalid record (Kafka's LogValidator)
    assert raw.produce(topic, 0, ibatch(pid, 1, -1))[0] == ErrorCode.INVALID_RECORD
    # unknown producer starting at sequence 7: accepted (Kafka >= 2.5, KIP-360: no UNKNOWN_PRODUCER_ID)
    _, pid2, _ = raw.init_producer_id()
    assert raw.produce(topic, 0, ibatch(pid2, 0, 7)) == (ErrorCode.NONE, 3)
    assert raw.produce(topic, 0, ibatch(pid2, 0, 9))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert raw.produce(topic, 0, ibatch(pid2, 0, 8)) == (ErrorCode.NONE, 4)
    assert raw.produce(topic, 0, plain_batch()) == (ErrorCode.NONE, 5)


def test_sequence_wraps_around_at_int32_max(broker, raw):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    _, pid, _ = raw.init_producer_id()
    assert raw.produce(topic, 0, ibatch(pid, 0, INT32_MAX - 2, n=2)) == (ErrorCode.NONE, 0)  # MAX-2, MAX-1
    assert raw.produce(topic, 0, ibatch(pid, 0, INT32_MAX, n=3)) == (ErrorCode.NONE, 2)      # MAX, 0, 1
    assert raw.produce(topic, 0, ibatch(pid, 0, INT32_MAX, n=3)) == (ErrorCode.NONE, 2)      # duplicate
    assert raw.produce(topic, 0, ibatch(pid, 0, 0))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert raw.produce(topic, 0, ibatch(pid, 0, 2)) == (ErrorCode.NONE, 5)


def test_produce_versions_3_to_11_and_acks_1_answer_duplicates(broker, raw):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    _, pid, _ = raw.init_producer_id()
    for seq, v in enumerate(range(3, 12)):
        b = ibatch(pid, 0, seq)
        assert raw.produce(topic, 0, b, version=v, acks=1) == (ErrorCode.NONE, seq)
        assert raw.produce(topic, 0, b, version=v, acks=-1) == (ErrorCode.NONE, seq)


# -- real clients ---------------------------------------------------------------------------------------
N_PARTS = 3


def _check_exactly_once(bootstrap, topic, per_partition):
    """Every partition p holds exactly b"p:0" .. b"p:{n-1}", in order, at offsets 0..n-1."""
    total = N_PARTS * per_partition
    msgs = consume_assigned(bootstrap, topic, range(N_PARTS), total, timeout_s=30)
    by_part = {p: [] for p in range(N_PARTS)}
    for m in msgs:
        by_part[m.partition()].append((m.offset(), m.value()))
    for p in range(N_PARTS):
        got = by_part[p]
        assert [o for o, _ in got] == list(range(len(got))), f"partition {p} offsets have gaps"
        assert [v for _, v in got] == [b"%d:%d" % (p, i) for i in range(per_partition)], \
            f"partition {p}: {len(got)} records, first differences: " \
            f"{[(i, v) for i, (_, v) in enumerate(got) if v != b'%d:%d' % (p, i)][:5]}"
    assert len(msgs) == total


def test_kafka_python_default_producer_is_idempotent(broker):
    import kafka
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=N_PARTS)
    p = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=2)
    try:
        assert p.config["enable_idempotence"] is True   # the default since kafka-python 3 (KIP-679)
        futs = [p.send(topic, value=b"%d:%d" % (i % N_PARTS, i // N_PARTS), partition=i % N_PARTS)
                for i in range(N_PARTS * 200)]
        p.flush(30)
        metas = [f.get(10) for f in futs]
        assert [m.offset for m in metas[:N_PARTS * 2]] == [0] * N_PARTS + [1] * N_PARTS
        assert p._transaction_manager.producer_id_and_epoch.producer_id >= 0
    finally:
        p.close(10)
    _check_exactly_once(broker.bootstrap, topic, 200)


def test_confluent_idempotent_producer(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=N_PARTS)
    reports = []
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for i in range(N_PARTS * 300):
        p.produce(topic, value=b"%d:%d" % (i % N_PARTS, i // N_PARTS), partition=i % N_PARTS,
                  on_delivery=lambda err, m: reports.append(err))
        p.poll(0)
    assert p.flush(30) == 0
    assert reports == [None] * (N_PARTS * 300)
    _check_exactly_once(broker.bootstrap, topic, 300)


def test_aiokafka_idempotent_producer(broker):
    import aiokafka
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=N_PARTS)

    async def run():
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, linger_ms=2)
        await asyncio.wait_for(p.start(), 20)
        try:
            futs = [await p.send(topic, value=b"%d:%d" % (i % N_PARTS, i // N_PARTS), partition=i % N_PARTS)
                    for i in range(N_PARTS * 200)]
            metas = await asyncio.wait_for(asyncio.gather(*futs), 30)
            assert metas[0].offset == 0
        finally:
            await asyncio.wait_for(p.stop(), 10)

    asyncio.run(run())
    _check_exactly_once(broker.bootstrap, topic, 200)


def test_transactional_clients_init_within_their_timeout(broker):
    # The transaction coordinator answers FindCoordinator(TRANSACTION) and InitProducerId at once.
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-" + uuid.uuid4().hex})
    t0 = time.monotonic()
    p.init_transactions(10)
    assert time.monotonic() - t0 < 10


# -- faults: a proxy that kills connections mid-flight --------------------------------------------------
def _broker_behind(fresh_broker, proxy, **overrides):
    b = fresh_broker(**{"num.partitions": 1, "advertised.listeners": f"PLAINTEXT://{proxy.bootstrap}",
                        **overrides})
    proxy.upstream_port = b.port
    return b


def _confluent_through(proxy, **extra):
    return ck.Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                        "batch.num.messages": 10, "message.timeout.ms": 40000, "retry.backoff.ms": 20,
                        "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                        "topic.metadata.refresh.interval.ms": 1000, **extra})


def test_proxy_kills_and_delays_replies_records_arrive_exactly_once(fresh_broker):
    proxy = FaultProxy(seed=8).start()
    per_partition = 400
    errors = []
    try:
        _broker_behind(fresh_broker, proxy)
        topic = _topic()
        create_topic(proxy.bootstrap, topic, partitions=N_PARTS)
        p = _confluent_through(proxy)
        proxy.kill_probability, proxy.delay_probability, proxy.max_faults = 0.1, 0.2, 12
        for i in range(N_PARTS * per_partition):
            p.produce(topic, value=b"%d:%d" % (i % N_PARTS, i // N_PARTS), partition=i % N_PARTS,
                      on_delivery=lambda err, m: err and errors.append(err))
            p.poll(0)
            if i % 30 == 29:
                time.sleep(0.03)   # spread the batches over many requests, so over many faults
        assert p.flush(45) == 0
        proxy.kill_probability = proxy.delay_probability = 0.0
        assert errors == []
        assert proxy.kills >= 3, (proxy.kills, proxy.delays)   # the producer really had to retry
        _check_exactly_once(proxy.bootstrap, topic, per_partition)
    finally:
        proxy.stop()


# -- crash and restart ---------------------------------------------------------------------------------
def _restart_overrides():
    return {"num.partitions": 1, "kbroker.log.fsync.every.append": "true", "log.segment.bytes": 4096}


def test_sigkill_restart_rebuilds_state_and_deduplicates_retries(fresh_broker):
    b = fresh_broker(**_restart_overrides())
    topic = _topic()
    create_topic(b.bootstrap, topic, config={"segment.bytes": "4096"})
    raw = Raw(b.port)
    _, pid, _ = raw.init_producer_id()
    sent = []
    for i in range(40):    # ~170 bytes each: several rolls, so a snapshot plus a replay after it
        batch = ibatch(pid, 0, 2 * i, n=2, tag=b"x" * 40)
        err, base = raw.produce(topic, 0, batch)
        assert (err, base) == (ErrorCode.NONE, 2 * i)
        sent.append(batch)
    raw.close()
    part_dir = os.path.join(b.data_dir, "logs", f"{topic}-0")
    assert any(n.endswith(".snapshot") for n in os.listdir(part_dir))
    b.kill()
    b = fresh_broker(**_restart_overrides())
    raw = Raw(b.port)
    for i in range(35, 40):   # retries of the last 5 in-flight batches after the crash
        assert raw.produce(topic, 0, sent[i]) == (ErrorCode.NONE, 2 * i)
    assert raw.produce(topic, 0, ibatch(pid, 0, 81))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert raw.produce(topic, 0, ibatch(pid, 0, 80)) == (ErrorCode.NONE, 80)
    # a clean restart keeps (at least) the last batch of the producer
    raw.close()
    assert b.terminate() == 0
    b = fresh_broker(**_restart_overrides())
    raw = Raw(b.port)
    assert raw.produce(topic, 0, ibatch(pid, 0, 80)) == (ErrorCode.NONE, 80)
    assert raw.produce(topic, 0, ibatch(pid, 0, 81)) == (ErrorCode.NONE, 81)
    raw.close()


def test_producer_ids_never_repeat_across_restarts(fresh_broker):
    b = fresh_broker(**{"num.partitions": 1})
    seen = []
    for stop in ("kill", "terminate", "kill"):
        raw = Raw(b.port)
        for _ in range(3):
            err, pid, epoch = raw.init_producer_id()
            assert (err, epoch) == (ErrorCode.NONE, 0)
            seen.append(pid)
        raw.close()
        assert getattr(b, stop)() is not None
        b = fresh_broker(**{"num.partitions": 1})
    raw = Raw(b.port)
    seen.append(raw.init_producer_id()[1])
    raw.close()
    assert seen == sorted(set(seen)), seen


def test_sigkill_with_unacknowledged_batches_in_flight(fresh_broker):
    """confluent-kafka through the proxy: replies are blackholed (the broker wrote the batches,
    the producer does not know), the broker is SIGKILLed and restarted, the producer retries:
    the rebuilt producer state turns every retry of a written batch into a duplicate."""
    proxy = FaultProxy().start()
    per_partition = 300
    errors = []
    try:
        b = _broker_behind(fresh_broker, proxy, **_restart_overrides())
        topic = _topic()
        create_topic(proxy.bootstrap, topic, partitions=N_PARTS, config={"segment.bytes": "4096"})
        p = _confluent_through(proxy)

        def send(lo, hi):
            for i in range(lo, hi):
                p.produce(topic, value=b"%d:%d" % (i % N_PARTS, i // N_PARTS), partition=i % N_PARTS,
                          on_delivery=lambda err, m: err and errors.append(err))
                p.poll(0)

        half = N_PARTS * per_partition // 2
        send(0, half)
        assert p.flush(20) == 0
        proxy.blackhole.set()
        send(half, half + 90)
        deadline = time.monotonic() + 10
        while proxy.dropped < 3 and time.monotonic() < deadline:
            p.poll(0.05)
        assert proxy.dropped >= 3
        time.sleep(0.3)
        b.kill()
        proxy.blackhole.clear()
        b = _broker_behind(fresh_broker, proxy, **_restart_overrides())
        send(half + 90, N_PARTS * per_partition)
        assert p.flush(40) == 0
        assert errors == []
        _check_exactly_once(proxy.bootstrap, topic, per_partition)
    finally:
        proxy.stop()
