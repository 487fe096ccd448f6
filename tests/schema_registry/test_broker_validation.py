"""Broker-side schema id validation (kbroker.key/value.schema.validation) against a real
broker and a real ``kbroker schema-registry``: Confluent's AvroSerializer is accepted; raw
bytes, unknown ids and ids of another subject are refused with INVALID_RECORD and
per-record errors, nothing appended; an unreachable registry answers a retriable error
and librdkafka's retry succeeds once it is back."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kbroker.kernels import records as rec
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import produce as pr
from kbroker.schema_registry.testing import SchemaRegistryProcess
from kbroker.testing import KBrokerProcess, free_port
from tests.broker.raw_client import advertised
from tests.broker.test_api_matrix import Env

E = ErrorCode
pytestmark = pytest.mark.timeout(180)

USER = {"type": "record", "name": "User", "namespace": "kbroker.test",
        "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
OTHER = {"type": "record", "name": "Other", "namespace": "kbroker.test",
         "fields": [{"name": "x", "type": "long"}]}


@pytest.fixture(scope="module")
def sr_port():
    return free_port()


@pytest.fixture(scope="module")
def broker(sr_port):
    """Overrides the package's broker: this one knows the registry's (future) URL."""
    b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
                                  "kbroker.schema.registry.url": f"http://127.0.0.1:{sr_port}",
                                  "kbroker.schema.registry.negative.cache.ms": 500})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, f"broker exited with {rc} on SIGTERM; log tail:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture(scope="module")
def registry(broker, sr_port):
    r = SchemaRegistryProcess(broker.bootstrap, port=sr_port)
    r.start()
    yield r
    r.terminate()
    r.__exit__(None, None, None)


@pytest.fixture(scope="module")
def env(broker):
    e = Env(broker, advertised(broker.port))
    yield e
    e.close()


def _framed(schema_id: int, payload: bytes = b"\x02a\x02") -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + payload


def _validated_topic(env, key=False, value=True):
    configs = {}
    if key:
        configs["kbroker.key.schema.validation"] = "true"
    if value:
        configs["kbroker.value.schema.validation"] = "true"
    name, _ = env.new_topic("srv", configs=configs)
    return name


def _produce_raw(env, topic, records):
    """``records`` [(key, value)] as one batch; the partition's ProduceResponse entry."""
    now = int(time.time() * 1000)
    batch = rec.encode_batch([(now, k, v, []) for k, v in records])
    r = env.call(ApiKey.PRODUCE, env.top(ApiKey.PRODUCE), pr.ProduceRequest(
        transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[pr.TopicProduceData(
            name=topic, partition_data=[pr.PartitionProduceData(index=0, records=batch)])]))
    (p,) = r.responses[0].partition_responses
    return p


def _end(env, topic) -> int:
    return env.list_offset(topic, 0, -1).offset


def _register(url, subject, schema, compatibility=None) -> int:
    c = SchemaRegistryClient({"url": url})
    try:
        if compatibility:
            c.set_compatibility(subject_name=subject, level=compatibility)
        return c.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    finally:
        c.close()


def test_avro_serializer_producer_is_accepted(broker, registry, env):
    topic = _validated_topic(env)
    client = SchemaRegistryClient({"url": registry.url})
    ser = AvroSerializer(client, json.dumps(USER))
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    errors = []
    for i in range(50):
        p.produce(topic, value=ser({"name": f"u{i}", "age": i}, SerializationContext(topic, MessageField.VALUE)),
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
    p.produce(topic, value=None)  # a tombstone passes, as in Confluent Server
    assert p.flush(30) == 0 and errors == []
    assert _end(env, topic) == 51
    client.close()


def test_raw_bytes_are_refused_record_by_record(registry, env):
    topic = _validated_topic(env)
    sid = _register(registry.url, f"{topic}-value", USER)
    before = _end(env, topic)
    p = _produce_raw(env, topic, [(None, _framed(sid)), (b"k", b'{"name": "x"}'), (None, None),
                                  (None, b"\x00\x00"), (None, _framed(sid))])
    assert p.error_code == E.INVALID_RECORD
    assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
        (1, "Record 1: value has no schema-registry header (its first byte is 0x7b, not the magic byte 0)"),
        (3, "Record 3: value has no schema-registry header (it is 2 bytes, shorter than the 5-byte header)")]
    assert p.error_message.startswith("One or more records have been rejected due to 2 record errors")
    assert _end(env, topic) == before


def test_librdkafka_surfaces_invalid_record(broker, registry, env):
    topic = _validated_topic(env)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    got = []
    p.produce(topic, value=b"no header here", on_delivery=lambda err, msg: got.append(err))
    p.flush(30)
    assert len(got) == 1 and got[0] is not None and got[0].code() == KafkaError.INVALID_RECORD, got
    assert not got[0].retriable()
    assert _end(env, topic) == 0


def test_ids_of_another_subject_or_unknown_are_refused(registry, env):
    topic = _validated_topic(env)
    own = _register(registry.url, f"{topic}-value", USER)
    other = _register(registry.url, f"elsewhere-{uuid.uuid4().hex[:8]}-value", OTHER)
    assert other != own
    before = _end(env, topic)
    p = _produce_raw(env, topic, [(None, _framed(own)), (None, _framed(other)), (None, _framed(987654))])
    assert p.error_code == E.INVALID_RECORD
    assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
        (1, f"Record 1: value schema id {other} is not registered under subject {topic}-value"),
        (2, f"Record 2: value schema id 987654 is not registered under subject {topic}-value")]
    assert _end(env, topic) == before
    # registering the schema under the topic's subject too makes the id valid there (after the
    # broker's short negative cache: kbroker.schema.registry.negative.cache.ms=500 here)
    assert _register(registry.url, f"{topic}-value", OTHER, compatibility="NONE") == other
    deadline = time.monotonic() + 20
    while (p := _produce_raw(env, topic, [(None, _framed(other))])).error_code != E.NONE:
        assert p.error_code == E.INVALID_RECORD and time.monotonic() < deadline, p
        time.sleep(0.1)
    assert _end(env, topic) == before + 1


def test_key_validation_is_independent_of_value_validation(registry, env):
    topic = _validated_topic(env, key=True, value=False)
    kid = _register(registry.url, f"{topic}-key", OTHER)
    p = _produce_raw(env, topic, [(_framed(kid), b"any value"), (None, b"null key passes")])
    assert p.error_code == E.NONE, p
    p = _produce_raw(env, topic, [(_framed(kid), b"v"), (b"plain-key", b"v")])
    assert p.error_code == E.INVALID_RECORD
    assert [e.batch_index_error_message for e in p.record_errors] == [
        "Record 1: key has no schema-registry header (its first byte is 0x70, not the magic byte 0)"]
    # the value's id is checked against <topic>-key's subject only for keys
    p = _produce_raw(env, topic, [(_framed(kid), _framed(12345))])
    assert p.error_code == E.NONE, p
    assert _end(env, topic) == 3


def test_describe_configs_shows_the_validation_keys(broker, env):
    topic = _validated_topic(env, key=True)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    (fut,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    cfg = fut.result(20)
    assert cfg["kbroker.value.schema.validation"].value == "true"
    assert cfg["kbroker.key.schema.validation"].value == "true"
    assert cfg["kbroker.value.subject.name.strategy"].value == "TopicNameStrategy"
    # a subject strategy kbroker does not implement is refused
    (fut,) = admin.create_topics([NewTopic(f"srv-bad-{uuid.uuid4().hex[:6]}", 1, 1, config={
        "kbroker.value.subject.name.strategy": "RecordNameStrategy"})]).values()
    with pytest.raises(Exception) as ei:
        fut.result(20)
    assert ei.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_unreachable_registry_is_retriable_then_succeeds(broker, registry, env, sr_port):
    topic = _validated_topic(env)
    sid = _register(registry.url, f"{topic}-value", {**USER, "name": "Fresh"})  # an id the broker has not seen
    registry.terminate()
    try:
        started = time.monotonic()
        p = _produce_raw(env, topic, [(None, _framed(sid))])
        assert p.error_code == E.REQUEST_TIMED_OUT and "Schema Registry unavailable" in p.error_message, p
        assert time.monotonic() - started < 5  # bounded by kbroker.schema.registry.request.timeout.ms
        assert _end(env, topic) == 0
        # librdkafka retries REQUEST_TIMED_OUT: its record is delivered once the registry is back
        prod = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retry.backoff.ms": 200,
                         "message.timeout.ms": 60000})
        got = []
        prod.produce(topic, value=_framed(sid), on_delivery=lambda err, msg: got.append(err))
        prod.poll(1.0)
        assert got == []
    finally:
        restarted = SchemaRegistryProcess(broker.bootstrap, port=sr_port)
        restarted.start()
        registry.__dict__.update(restarted.__dict__)  # the module fixture stops it at the end
    assert prod.flush(60) == 0 and got == [None], got
    assert _end(env, topic) == 1
    assert broker.read_log().count("Schema Registry unreachable") == 1  # logged once per interval


def _avro(schema, datum) -> bytes:
    import io

    import fastavro

    bio = io.BytesIO()
    fastavro.schemaless_writer(bio, fastavro.parse_schema(schema), datum)
    return bio.getvalue()


def test_payload_validation_decodes_avro_and_json(registry, env):
    payload = {"kbroker.value.schema.validation": "true", "kbroker.value.schema.validation.payload": "true"}
    topic, _ = env.new_topic("srvp", configs=payload)
    sid = _register(registry.url, f"{topic}-value", USER)
    good = _avro(USER, {"name": "ann", "age": 7})
    before = _end(env, topic)
    p = _produce_raw(env, topic, [(None, _framed(sid, good)), (None, _framed(sid, good[:2])),
                                  (None, _framed(sid, good + b"\x00")), (None, None)])
    assert p.error_code == E.INVALID_RECORD, p
    msgs = [(e.batch_index, e.batch_index_error_message) for e in p.record_errors]
    assert [i for i, _ in msgs] == [1, 2]
    assert msgs[0][1].startswith(f"Record 1: value does not decode with schema id {sid}: ")
    assert msgs[1][1] == f"Record 2: value does not decode with schema id {sid}: 1 bytes left after the Avro datum"
    assert _end(env, topic) == before
    assert _produce_raw(env, topic, [(None, _framed(sid, good)), (None, None)]).error_code == E.NONE
    # JSON Schema: the value must be JSON and satisfy the schema
    jtopic, _ = env.new_topic("srvp", configs=payload)
    c = SchemaRegistryClient({"url": registry.url})
    jid = c.register_schema(f"{jtopic}-value", Schema(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}), "JSON"))
    c.close()
    p = _produce_raw(env, jtopic, [(None, _framed(jid, b'{"n": 1}')), (None, _framed(jid, b'{"n": "x"}')),
                                   (None, _framed(jid, b"{nope"))])
    assert p.error_code == E.INVALID_RECORD, p
    assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
        (1, f"Record 1: value does not decode with schema id {jid}: 'x' is not of type 'integer'"),
        (2, f"Record 2: value does not decode with schema id {jid}: not JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)")]
    assert _produce_raw(env, jtopic, [(None, _framed(jid, b'{"n": 2}'))]).error_code == E.NONE
    assert _end(env, jtopic) == 1
    # keys likewise, on their own subject
    ktopic, _ = env.new_topic("srvp", configs={"kbroker.key.schema.validation": "true",
                                               "kbroker.key.schema.validation.payload": "true"})
    kid = _register(registry.url, f"{ktopic}-key", USER)
    p = _produce_raw(env, ktopic, [(_framed(kid, good), b"v"), (_framed(kid, b"\x07"), b"v")])
    assert [e.batch_index for e in p.record_errors] == [1], p
    assert p.record_errors[0].batch_index_error_message.startswith(f"Record 1: key does not decode with schema id {kid}")


def test_validation_needs_a_registry_url():
    """Without kbroker.schema.registry.url a topic cannot turn validation on (INVALID_CONFIG
    naming the key); a malformed URL stops start-up with one line naming the key."""
    from kbroker.server.topics import TopicError, validate_topic_configs
    with pytest.raises(TopicError) as ei:
        validate_topic_configs({"kbroker.value.schema.validation": "true"}, schema_registry=False)
    assert ei.value.code == E.INVALID_CONFIG and "kbroker.value.schema.validation" in str(ei.value)
    assert validate_topic_configs({"kbroker.value.schema.validation": "false"}, schema_registry=False)
    with pytest.raises(TopicError) as ei:  # the payload check needs the id check
        validate_topic_configs({"kbroker.value.schema.validation.payload": "true"})
    assert ei.value.code == E.INVALID_CONFIG and "kbroker.value.schema.validation=true" in str(ei.value)
    r = subprocess.run([sys.executable, "-m", "kbroker", "serve", "--override",
                        "kbroker.schema.registry.url=localhost:8081"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "kbroker.schema.registry.url" in lines[0], r.stderr


def test_bench_produce_validation_runs(capsys):
    """``python -m bench.schema_registry --produce-validation``, bounded to a few thousand records."""
    from bench import schema_registry as bench_sr

    assert bench_sr.main(["--produce-validation", "--produce-count", "2000", "--rounds", "1",
                          "--sizes", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in out] == ["produce 100 B Avro, validation off", "produce 100 B Avro, validation on"]
    assert out[1]["ratio_on_off"] > 0 and out[1]["kernel_us"] > 0
