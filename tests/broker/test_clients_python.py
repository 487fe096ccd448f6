"""kafka-python and aiokafka against a real kbroker process."""
import asyncio
import uuid

import pytest

from tests.broker.kafka_helpers import create_topic


def _topic():
    return "py-" + uuid.uuid4().hex[:10]


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_roundtrip(broker, codec):
    import kafka
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=2)
    prod = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec,
                               acks="all", linger_ms=5)
    futs = [prod.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2,
                      headers=[("n", b"%d" % i)]) for i in range(200)]
    prod.flush(30)
    metas = [f.get(timeout=30) for f in futs]
    prod.close()
    assert sorted(m.offset for m in metas if m.partition == 0) == list(range(100))
    cons = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                               consumer_timeout_ms=10000)
    tps = [kafka.TopicPartition(topic, p) for p in (0, 1)]
    cons.assign(tps)
    cons.seek_to_beginning(*tps)
    got = []
    for m in cons:
        got.append(m)
        if len(got) == 200:
            break
    cons.close()
    assert len(got) == 200
    for p in (0, 1):
        part = [m for m in got if m.partition == p]
        assert [m.offset for m in part] == list(range(100))
        assert [m.value for m in part] == [b"v%d" % i for i in range(p, 200, 2)]
        assert [m.headers for m in part] == [[("n", b"%d" % i)] for i in range(p, 200, 2)]


@pytest.mark.parametrize("codec", [None, "gzip", "lz4", "zstd"])
def test_aiokafka_roundtrip(broker, codec):
    import aiokafka
    topic = _topic()
    create_topic(broker.bootstrap, topic)

    async def run():
        prod = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec,
                                         acks="all", linger_ms=5)
        await prod.start()
        try:
            futs = [await prod.send(topic, value=b"a%d" % i, key=None if i % 2 else b"k",
                                    partition=0) for i in range(300)]
            metas = [await f for f in futs]
        finally:
            await prod.stop()
        assert [m.offset for m in metas] == list(range(300))
        cons = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                         auto_offset_reset="earliest")
        await cons.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            cons.assign([tp])
            await cons.seek_to_beginning(tp)
            got = []
            while len(got) < 300:
                batch = await asyncio.wait_for(cons.getmany(tp, timeout_ms=1000), 20)
                got.extend(batch.get(tp, []))
            end = await cons.end_offsets([tp])
            assert end[tp] == 300
        finally:
            await cons.stop()
        assert [m.value for m in got] == [b"a%d" % i for i in range(300)]
        assert [m.key for m in got] == [None if i % 2 else b"k" for i in range(300)]

    asyncio.run(asyncio.wait_for(run(), 60))
