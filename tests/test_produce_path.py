"""The client produce path of ReplicaManager (one records-kernel walk per partition,
``validate_batches(produce_version=...)``) keeps Kafka's order of answers: the request's
records checks (ProduceRequest.validateRecords, in KafkaApis) come before the internal-topic
and min.insync.replicas checks, which come before the base offset and size checks."""
import uuid

import pytest

from kbroker.kernels import records as rec
from kbroker.log.manager import LogManager
from kbroker.protocol import ErrorCode as E
from kbroker.server.metadata import TopicImage
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_manager import ProducePartitionResult, ReplicaManager

ONE = rec.encode_batch([(1_700_000_000_000, b"k", b"v", [])])


@pytest.fixture
def rm(tmp_path):
    lm = LogManager([str(tmp_path)], background=False)
    lm.startup()
    lm.update_topic_config("strict", {"min.insync.replicas": "2"})
    lm.update_topic_config("small", {"max.message.bytes": str(len(ONE) - 1)})
    m = ReplicaManager(None, lm, 0, DelayedOperationPurgatory("Produce", reaper_enabled=False),
                       DelayedOperationPurgatory("Fetch", reaper_enabled=False))
    for name in ("plain", "strict", "small", "__consumer_offsets"):
        m.apply_topic(TopicImage(name, uuid.uuid4(), 1))
    yield m
    lm.shutdown()


def _produce(rm, topic, records, acks=1, version=9) -> ProducePartitionResult:
    out = []
    rm.append_records(10000, acks, {(topic, 0): records}, out.append, produce_version=version)
    return out[0][(topic, 0)]


def _moved(base_offset):
    b = bytearray(ONE)
    rec.set_base_offset(b, 0, base_offset)
    return bytes(b)


def test_request_checks_come_before_the_internal_topic_check(rm):
    assert _produce(rm, "__consumer_offsets", ONE + ONE).error == E.INVALID_RECORD
    assert _produce(rm, "__consumer_offsets", b"").error == E.INVALID_RECORD
    r = _produce(rm, "__consumer_offsets", _moved(5))   # the base offset check comes after it
    assert (r.error, r.error_message) == (E.INVALID_TOPIC_EXCEPTION, "Cannot append to internal topic __consumer_offsets")


def test_request_checks_come_before_min_insync_replicas(rm):
    assert _produce(rm, "strict", None, acks=-1).error == E.INVALID_RECORD
    assert _produce(rm, "strict", ONE + ONE, acks=-1).error == E.INVALID_RECORD
    assert _produce(rm, "strict", _moved(5), acks=-1).error == E.NOT_ENOUGH_REPLICAS
    assert _produce(rm, "strict", _moved(5), acks=1).error == E.INVALID_RECORD


def test_base_offset_then_size_then_batch_checks(rm):
    r = _produce(rm, "small", _moved(5))
    assert r.error == E.INVALID_RECORD and r.error_message.endswith("should be 0, but it is 5")
    assert r.log_start_offset == 0
    r = _produce(rm, "small", ONE)
    assert r.error == E.MESSAGE_TOO_LARGE and f"is {len(ONE)} bytes" in r.error_message
    bad_crc = ONE[:-1] + bytes([ONE[-1] ^ 1])
    assert _produce(rm, "small", bad_crc).error == E.MESSAGE_TOO_LARGE
    assert _produce(rm, "plain", bad_crc).error == E.CORRUPT_MESSAGE
    # a request refusal carries no message, as ProduceRequest.validateRecords' answer
    r = _produce(rm, "plain", ONE + ONE)
    assert (r.error, r.error_message, r.log_start_offset) == (E.INVALID_RECORD, None, -1)


def test_appends_answer_offsets_and_move_the_high_watermark(rm):
    for i in range(3):
        r = _produce(rm, "plain", bytearray(ONE), acks=-1)
        assert (r.error, r.base_offset, r.last_offset, list(r.record_errors)) == (E.NONE, i, i, [])
    assert rm.get_partition(("plain", 0)).log.high_watermark == 3


def test_the_produce_plan_follows_a_config_change(rm):
    assert _produce(rm, "plain", bytearray(ONE)).error == E.NONE
    rm.log_manager.update_topic_config("plain", {"max.message.bytes": "10"})
    assert _produce(rm, "plain", bytearray(ONE)).error == E.MESSAGE_TOO_LARGE


def test_a_single_replica_append_moves_the_high_watermark_under_the_append_lock(rm, monkeypatch):
    """Zero-config (no followers): the log moves the high watermark with the append, in
    the same view, so the replica manager neither takes the log's lock a second time
    (Log.maybe_increment_high_watermark) nor parks acks=all in the purgatory; fetches
    waiting on the partition are still completed once per append."""
    from kbroker.log.log import Log

    moves, fetch_checks = [], []
    monkeypatch.setattr(Log, "maybe_increment_high_watermark", lambda self, meta: moves.append(meta))
    real = rm.fetch_purgatory.check_and_complete
    monkeypatch.setattr(rm.fetch_purgatory, "check_and_complete", lambda tp: fetch_checks.append(tp) or real(tp))
    out = []
    rm.append_records(10000, -1, {("plain", 0): bytearray(ONE), ("strict", 0): bytearray(ONE)}, out.append,
                      produce_version=9)
    (res,) = out
    assert (res[("plain", 0)].error, res[("plain", 0)].base_offset) == (E.NONE, 0)
    assert res[("strict", 0)].error == E.NOT_ENOUGH_REPLICAS      # min.insync.replicas 2: not appended
    assert moves == [] and fetch_checks == [("plain", 0)]
    assert rm.get_partition(("plain", 0)).log.high_watermark == 1
    assert rm.produce_purgatory.watched() == 0
