"""Produce checks as Kafka's: ProduceRequest.validateRecords, UnifiedLog.analyzeAndValidateRecords
and LogValidator (per-record errors, the batch header's max_timestamp recomputed from the
records, compression.type and its levels), against a real broker over the raw protocol and
with librdkafka.
"""
from __future__ import annotations

import struct
import time

import pytest
from confluent_kafka import KafkaError, Producer

from kbroker._core import compression
from kbroker.kernels import records as rec
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import init_producer_id as ipi, produce as pr
from kbroker.server.apis.produce import validate_records
from tests.broker.raw_client import advertised
from tests.broker.test_api_matrix import Env, decode_records, fetch_parts, fetch_request

E = ErrorCode
K = ApiKey
YEAR_3000 = 32_503_680_000_000
HOUR = 3_600_000

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def env(broker):
    e = Env(broker, advertised(broker.port))
    yield e
    e.close()


def _now() -> int:
    return int(time.time() * 1000)


def _produce_raw(env, topic, records, version=None, partition=0):
    """One partition's ProduceResponse entry for ``records`` (the raw records field)."""
    v = env.top(K.PRODUCE) if version is None else version
    r = env.call(K.PRODUCE, v, pr.ProduceRequest(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[
        pr.TopicProduceData(name=topic, partition_data=[pr.PartitionProduceData(index=partition, records=records)])]))
    (p,) = r.responses[0].partition_responses
    return p


def _stored_batches(env, topic):
    v = env.top(K.FETCH)
    tid = env.topic_id(topic) if v >= 13 else None
    r = env.call(K.FETCH, v, fetch_request(v, [(topic, tid, [(0, 0)])]))
    data = fetch_parts(v, r, {tid: topic})[(topic, 0)]
    assert data.error_code == E.NONE, data
    return rec.decode_batches(bytes(data.records)) if data.records else []


def _end_offset(env, topic):
    return env.list_offset(topic, 0, -1).offset


def _lying_batch(records, max_timestamp, **kw) -> bytes:
    """A batch whose header claims ``max_timestamp`` (CRC correct for the lie)."""
    b = bytearray(rec.encode_batch(records, **kw))
    rec.set_max_timestamp(b, 0, (struct.unpack_from(">h", b, 21)[0] >> 3) & 1, max_timestamp)
    return bytes(b)


# -- 1. the header's max_timestamp -------------------------------------------------------------

@pytest.mark.parametrize("codec", [rec.NO_COMPRESSION, rec.LZ4])
def test_header_max_timestamp_is_recomputed_from_the_records(env, codec):
    """A header claiming year 3000 over records stamped now: Kafka's LogValidator writes the
    records' max back (setMaxTimestamp, new CRC), so retention, time-based roll and
    ListOffsets(MAX_TIMESTAMP) see the truth."""
    topic, _ = env.new_topic(f"lv-maxts-{codec}")
    now = _now()
    records = [(now - 5, b"k0", b"a", []), (now, b"k1", b"b", []), (now - 9, b"k2", b"c", [])]
    p = _produce_raw(env, topic, _lying_batch(records, YEAR_3000, compression=codec))
    assert (p.error_code, p.base_offset) == (E.NONE, 0)
    (b,) = _stored_batches(env, topic)
    assert b.is_valid() and (b.max_timestamp, b.timestamp_type) == (now, 0)
    assert [r.timestamp for r in b.records] == [now - 5, now, now - 9]
    mx = env.list_offset(topic, 0, -3)  # MAX_TIMESTAMP (ListOffsets v7+)
    assert (mx.timestamp, mx.offset) == (now, 1)


def test_log_append_time_bit_from_a_producer_on_a_create_time_topic(env):
    """A producer batch with the LogAppendTime bit on a CreateTime topic: its records'
    timestamps are the header's max_timestamp (checked against the window); the stored
    batch is made CreateTime (Kafka's setMaxTimestamp(CREATE_TIME, max))."""
    topic, _ = env.new_topic("lv-latbit")
    now = _now()
    raw = _lying_batch([(now, b"k", b"v", []), (now, b"k", b"w", [])], now + 7, timestamp_type=1)
    assert _produce_raw(env, topic, raw).error_code == E.NONE
    (b,) = _stored_batches(env, topic)
    assert b.is_valid() and (b.timestamp_type, b.max_timestamp) == (0, now + 7)
    # with no max_timestamp at all, every record is "LogAppendTime set by a producer"
    raw = _lying_batch([(now, b"k", b"v", []), (now, b"k", b"w", [])], -1, timestamp_type=1)
    p = _produce_raw(env, topic, raw)
    assert p.error_code == E.INVALID_TIMESTAMP
    assert [e.batch_index for e in p.record_errors] == [0, 1]
    assert p.record_errors[0].batch_index_error_message == (
        "Invalid timestamp type in message DefaultRecord(offset=0, timestamp=-1, key=1 bytes, value=1 bytes). "
        "Producer should not set timestamp type to LogAppendTime.")
    assert _end_offset(env, topic) == 2


def test_log_append_time_topic_rejects_the_bit_and_stamps_batches(env):
    topic, _ = env.new_topic("lv-lat", configs={"message.timestamp.type": "LogAppendTime"})
    before = _now()
    p = _produce_raw(env, topic, _lying_batch([(5, b"k", b"v", [])], YEAR_3000))
    assert p.error_code == E.NONE and p.log_append_time_ms >= before
    (b,) = _stored_batches(env, topic)
    assert b.is_valid() and (b.timestamp_type, b.max_timestamp) == (1, p.log_append_time_ms)
    p = _produce_raw(env, topic, rec.encode_batch([(5, b"k", b"v", [])], timestamp_type=1))
    assert p.error_code == E.INVALID_TIMESTAMP and [e.batch_index for e in p.record_errors] == [0]


# -- 1. message.timestamp.before/after.max.ms, per record --------------------------------------

def test_timestamp_window_fails_each_bad_record_by_its_index(env):
    topic, _ = env.new_topic("lv-window", configs={"message.timestamp.before.max.ms": "60000",
                                                   "message.timestamp.after.max.ms": "60000"})
    now = _now()
    records = [(now, b"k", b"0", []), (now - HOUR, b"k", b"1", []), (-1, b"k", b"2", []),
               (now + HOUR, b"k", b"3", []), (now, b"k", b"4", [])]
    for codec in (rec.NO_COMPRESSION, rec.GZIP):
        p = _produce_raw(env, topic, rec.encode_batch(records, compression=codec, base_timestamp=now))
        assert p.error_code == E.INVALID_TIMESTAMP
        assert [e.batch_index for e in p.record_errors] == [1, 3]
        msg = p.record_errors[0].batch_index_error_message
        assert msg.startswith(f"Timestamp {now - HOUR} of message with offset 1 is out of range. "
                              "The timestamp should be within [")
        assert p.error_message == "One or more records have been rejected due to invalid timestamp"
        assert (p.base_offset, p.log_start_offset) == (-1, 0)
    assert _end_offset(env, topic) == 0
    # a record without a timestamp skips only itself
    p = _produce_raw(env, topic, rec.encode_batch([(now, b"k", b"a", []), (-1, b"k", b"b", [])]))
    assert (p.error_code, p.base_offset) == (E.NONE, 0)


def test_timestamp_difference_max_ms_is_the_fallback(env):
    """Kafka 3.6+ (KIP-937): while message.timestamp.before/after.max.ms are at their default,
    the deprecated message.timestamp.difference.max.ms bounds both sides."""
    topic, _ = env.new_topic("lv-diff", configs={"message.timestamp.difference.max.ms": "60000"})
    now = _now()
    for ts in (now - HOUR, now + HOUR):
        p = _produce_raw(env, topic, rec.encode_batch([(ts, b"k", b"v", [])]))
        assert (p.error_code, [e.batch_index for e in p.record_errors]) == (E.INVALID_TIMESTAMP, [0])
    assert _produce_raw(env, topic, rec.encode_batch([(now, b"k", b"v", [])])).error_code == E.NONE
    topic, _ = env.new_topic("lv-diff2", configs={"message.timestamp.difference.max.ms": "60000",
                                                  "message.timestamp.before.max.ms": str(2 * HOUR)})
    assert _produce_raw(env, topic, rec.encode_batch([(now - HOUR, b"k", b"v", [])])).error_code == E.NONE
    assert _produce_raw(env, topic, rec.encode_batch([(now + HOUR, b"k", b"v", [])])).error_code == \
        E.INVALID_TIMESTAMP


# -- 2. ProduceRequest.validateRecords ---------------------------------------------------------

def test_one_batch_per_partition(env):
    topic, _ = env.new_topic("lv-onebatch")
    one = rec.encode_batch([(_now(), b"k", b"v", [])])
    for v in range(3, env.top(K.PRODUCE) + 1):
        assert _produce_raw(env, topic, one + one, version=v).error_code == E.INVALID_RECORD, v
        assert _produce_raw(env, topic, b"", version=v).error_code == E.INVALID_RECORD, v
        assert _produce_raw(env, topic, None, version=v).error_code == E.INVALID_RECORD, v
        # a first batch cut short is "no batch at all"; a second one is not looked at
        assert _produce_raw(env, topic, one[:-1], version=v).error_code == E.INVALID_RECORD, v
    assert _end_offset(env, topic) == 0
    zstd = rec.encode_batch([(_now(), b"k", b"v", [])], compression=rec.ZSTD)
    assert _produce_raw(env, topic, zstd, version=6).error_code == E.UNSUPPORTED_COMPRESSION_TYPE
    assert _produce_raw(env, topic, zstd, version=7).error_code == E.NONE
    # a client's batch must start at offset 0 (UnifiedLog.analyzeAndValidateRecords)
    b = bytearray(one)
    rec.set_base_offset(b, 0, 5)
    assert _produce_raw(env, topic, bytes(b)).error_code == E.INVALID_RECORD
    assert _produce_raw(env, topic, one).base_offset == 1


def test_validate_records_walks_headers_as_kafka():
    """ProduceRequest.validateRecords over MemoryRecords.batches(): a batch cut short ends the
    walk; a bad size or magic in a header that is read is CORRUPT_MESSAGE."""
    one = rec.encode_batch([(1, b"k", b"v", [])])
    magic = lambda b, m: b[:16] + bytes([m & 0xFF]) + b[17:]  # noqa: E731
    cases = [
        (b"", E.INVALID_RECORD), (one, E.NONE), (one + one, E.INVALID_RECORD),
        (one + b"\0" * 11, E.NONE),                                   # less than a size field
        (one + struct.pack(">qi", 0, 1000) + b"\0\0\0\0\2", E.NONE),  # a second batch cut short
        (one + struct.pack(">qi", 0, 3), E.CORRUPT_MESSAGE),           # size below the minimum
        (magic(one, 1), E.INVALID_RECORD), (magic(one, 0), E.INVALID_RECORD),
        (magic(one, 3), E.CORRUPT_MESSAGE), (magic(one, -1), E.CORRUPT_MESSAGE),
        (one + magic(one, 3), E.CORRUPT_MESSAGE),
    ]
    for records, want in cases:
        for wrap in (bytes, memoryview):
            assert validate_records(11, wrap(records)) == want, (records.hex(), want)
    zstd = rec.encode_batch([(1, b"k", b"v", [])], compression=rec.ZSTD)
    assert [validate_records(v, zstd) for v in (3, 6, 7, 11)] == [E.UNSUPPORTED_COMPRESSION_TYPE] * 2 + [E.NONE] * 2
    assert validate_records(3, None) == E.INVALID_RECORD


# -- 3. keyless records to a compacted topic -----------------------------------------------------

def test_compacted_topic_names_each_keyless_record(env):
    topic, _ = env.new_topic("lv-compact", configs={"cleanup.policy": "compact"})
    now = _now()
    records = [(now, None if i % 10 == 0 else b"k%d" % i, b"v%d" % i, []) for i in range(100)]
    p = _produce_raw(env, topic, rec.encode_batch(records))
    assert p.error_code == E.INVALID_RECORD
    assert [e.batch_index for e in p.record_errors] == list(range(0, 100, 10))
    want = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
    assert {e.batch_index_error_message for e in p.record_errors} == {want}
    assert p.error_message == (
        "One or more records have been rejected due to 10 record errors in total, and only showing the first "
        "three errors at most: [" + ", ".join(f"RecordError(batchIndex={i}, message='{want}')" for i in (0, 10, 20))
        + "]")
    assert _end_offset(env, topic) == 0


@pytest.mark.parametrize("one_per_batch", [False, True], ids=["one-batch", "batch.size=1"])
def test_librdkafka_fails_exactly_the_keyless_records(broker, env, one_per_batch):
    """librdkafka test 0011 (test_message_single_partition_record_fail): 100 records, every
    10th keyless, to a compacted topic. In one batch, the 10 keyless fail INVALID_RECORD and
    the other 90 _INVALID_DIFFERENT_RECORD (librdkafka maps RecordErrors by batch index); one
    record per batch, the 90 keyed ones are delivered."""
    topic, _ = env.new_topic(f"lv-rdk-{int(one_per_batch)}", configs={"cleanup.policy": "compact"})
    conf = {"bootstrap.servers": broker.bootstrap, "linger.ms": 100, "message.timeout.ms": 20000,
            "retries": 0, "enable.idempotence": False}
    if one_per_batch:
        conf["batch.size"] = 1
    p = Producer(conf)
    results = {}

    def on_delivery(err, msg, i):
        results[i] = None if err is None else err.code()

    for i in range(100):
        p.produce(topic, partition=0, key=None if i % 10 == 0 else b"key-%d" % i, value=b"value-%d" % i,
                  on_delivery=lambda err, msg, i=i: on_delivery(err, msg, i))
    assert p.flush(30) == 0
    assert len(results) == 100
    assert {i for i, c in results.items() if c == KafkaError.INVALID_RECORD} == set(range(0, 100, 10))
    others = {results[i] for i in range(100) if i % 10}
    assert others == ({None} if one_per_batch else {KafkaError._INVALID_DIFFERENT_RECORD})
    assert _end_offset(env, topic) == (90 if one_per_batch else 0)


# -- compression.type: the batch rebuilt with the topic's codec and level ----------------------

def _payload_codec_level_check(raw_stored, codec, level, default_level_differs=True):
    """The stored batch's records section is exactly ``codec`` at ``level`` of its records."""
    section = bytes(raw_stored[rec.RECORD_BATCH_OVERHEAD:])
    plain = compression.decompress(codec, section)
    assert section == compression.compress(codec, plain, level)
    if default_level_differs:
        assert section != compression.compress(codec, plain), "pick data where the level shows"


def _stored_raw(env, topic):
    v = env.top(K.FETCH)
    tid = env.topic_id(topic) if v >= 13 else None
    r = env.call(K.FETCH, v, fetch_request(v, [(topic, tid, [(0, 0)])]))
    return bytes(fetch_parts(v, r, {tid: topic})[(topic, 0)].records)


#: text that compresses differently at each level
TEXT = b" ".join(b"record-%d-%s" % (i, b"abcdefghij"[: i % 10] * (i % 7)) for i in range(3000))


@pytest.mark.parametrize("name,codec,level_key,level", [
    ("gzip", rec.GZIP, "compression.gzip.level", 1),
    ("lz4", rec.LZ4, "compression.lz4.level", 12),
    ("zstd", rec.ZSTD, "compression.zstd.level", 19),
])
def test_compression_type_recompresses_with_the_topic_level(env, name, codec, level_key, level):
    topic, _ = env.new_topic(f"lv-ct-{name}", configs={"compression.type": name, level_key: str(level)})
    now = _now()
    records = [(now - 3, b"k1", TEXT, [("h", b"x")]), (now, None, b"v2", []), (now - 9, b"k3", None, [("a", None)])]
    sent = _lying_batch(records, YEAR_3000, compression=rec.SNAPPY)
    p = _produce_raw(env, topic, sent)
    assert (p.error_code, p.base_offset) == (E.NONE, 0)
    raw = _stored_raw(env, topic)
    (b,) = rec.decode_batches(raw)
    assert b.is_valid() and (b.compression, b.timestamp_type, b.max_timestamp) == (codec, 0, now)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in b.records] == [
        (i, t, k, v, list(h)) for i, (t, k, v, h) in enumerate(records)]
    _payload_codec_level_check(raw, codec, level)


def test_compression_type_same_codec_is_kept_as_sent_and_uncompressed_unpacks(env):
    gz, _ = env.new_topic("lv-ct-same", configs={"compression.type": "gzip", "compression.gzip.level": "1"})
    sent = rec.encode_batch([(_now(), b"k", TEXT, [])], compression=rec.GZIP, compression_level=9)
    assert _produce_raw(env, gz, sent).error_code == E.NONE
    assert _stored_raw(env, gz)[rec.RECORD_BATCH_OVERHEAD:] == sent[rec.RECORD_BATCH_OVERHEAD:]
    plain, _ = env.new_topic("lv-ct-none", configs={"compression.type": "uncompressed"})
    assert _produce_raw(env, plain, rec.encode_batch([(_now(), b"k", TEXT, [])], compression=rec.LZ4)) \
        .error_code == E.NONE
    (b,) = rec.decode_batches(_stored_raw(env, plain))
    assert b.compression == rec.NO_COMPRESSION and b.is_valid() and b.records[0].value == TEXT


def test_compression_type_with_log_append_time_and_the_size_limit(env):
    topic, _ = env.new_topic("lv-ct-lat", configs={"compression.type": "lz4",
                                                   "message.timestamp.type": "LogAppendTime"})
    p = _produce_raw(env, topic, rec.encode_batch([(5, b"k", b"v", [])]))
    (b,) = rec.decode_batches(_stored_raw(env, topic))
    assert (b.compression, b.timestamp_type, b.max_timestamp) == (rec.LZ4, 1, p.log_append_time_ms)
    # a batch that grows past max.message.bytes once rebuilt (UnifiedLog re-checks the size)
    small, _ = env.new_topic("lv-ct-big", configs={"compression.type": "uncompressed",
                                                   "max.message.bytes": "5000"})
    zeros = rec.encode_batch([(_now(), b"k", bytes(20000), [])], compression=rec.ZSTD)
    assert len(zeros) < 5000
    p = _produce_raw(env, small, zeros)
    assert p.error_code == E.MESSAGE_TOO_LARGE
    assert _end_offset(env, small) == 0


def test_compression_type_keeps_the_idempotent_producer_state(env):
    """The rebuilt batch keeps producer id, epoch and sequence: a retry is still a duplicate."""
    topic, _ = env.new_topic("lv-ct-idem", configs={"compression.type": "zstd"})
    pid = env.call(K.INIT_PRODUCER_ID, 0, ipi.InitProducerIdRequest(
        transactional_id=None, transaction_timeout_ms=60000)).producer_id
    first = rec.encode_batch([(_now(), b"k", b"v", [])], producer_id=pid, producer_epoch=0, base_sequence=0)
    assert _produce_raw(env, topic, first).base_offset == 0
    again = _produce_raw(env, topic, first)
    assert (again.error_code, again.base_offset) == (E.NONE, 0)
    nxt = rec.encode_batch([(_now(), b"k", b"w", [])], producer_id=pid, producer_epoch=0, base_sequence=1)
    assert _produce_raw(env, topic, nxt).base_offset == 1
    (b0, b1) = rec.decode_batches(_stored_raw(env, topic))
    assert (b1.compression, b1.producer_id, b1.producer_epoch, b1.base_sequence) == (rec.ZSTD, pid, 0, 1)
    assert _end_offset(env, topic) == 2
