"""Every accepted config does what it says.

Walks every topic config (kbroker/log/config.py CONFIG_DEFS) and every broker config
(kbroker/server/config.py BROKER_CONFIG), enumerated from the definitions, so a key added
without an entry here or in the product's no-op tables fails ``test_every_*_config_is_accounted_for``.

Topic configs: each one is either in ``NO_OP_CONFIGS`` (product code, with the reason), or has
an effect checked here against a real broker (``LIVE``), or in the named test (``ELSEWHERE``,
whose function must exist and name the key).

Broker configs: each one is either in ``BROKER_NO_OP_CONFIGS`` (product code), or a broker-wide
default of a topic config (its effect is the topic config's; checked here to change the
default LogConfig), or read by the broker outside the definitions (a static check over
src/kbroker), or shown to act through KafkaConfig's cross-key checks (``CROSS_CHECKED``).
"""
import ast
import os
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import kbroker
from kbroker.config_def import ConfigError
from kbroker.log.config import BROKER_TO_TOPIC, CONFIG_DEFS, NO_OP_CONFIGS, LogConfig
from kbroker.server.config import BROKER_CONFIG, BROKER_NO_OP_CONFIGS, KafkaConfig

TIMEOUT = 15
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.dirname(os.path.abspath(kbroker.__file__))


#: topic config -> "tests/<file>.py::<test function>" that shows its effect
ELSEWHERE = {
    "cleanup.policy": "tests/broker/test_compaction.py::test_compacted_topic_keeps_latest_value_per_key",
    "compression.type": "tests/broker/test_produce_validation.py",
    "compression.gzip.level": "tests/broker/test_produce_validation.py",
    "compression.lz4.level": "tests/broker/test_produce_validation.py",
    "compression.zstd.level": "tests/broker/test_produce_validation.py",
    "message.timestamp.difference.max.ms": "tests/broker/test_produce_validation.py",
    "delete.retention.ms": "tests/test_log_cleaner.py::test_tombstones_survive_until_delete_retention",
    "file.delete.delay.ms": "tests/test_log.py::test_delete_records_and_retention",
    "flush.messages": "tests/test_log.py::test_flush_messages_moves_recovery_point",
    "flush.ms": "tests/test_log_manager.py::test_background_retention_and_flush",
    "index.interval.bytes": "tests/test_log.py::test_time_index_file_bytes",
    "max.compaction.lag.ms": "tests/test_log_cleaner.py::test_dirty_ratio_and_compaction_lags",
    "min.cleanable.dirty.ratio": "tests/test_log_cleaner.py::test_dirty_ratio_and_compaction_lags",
    "min.compaction.lag.ms": "tests/test_log_cleaner.py::test_dirty_ratio_and_compaction_lags",
    "min.insync.replicas": "tests/broker/test_dynamic_config.py::test_min_insync_replicas_refuses_acks_all_only",
    "remote.storage.enable": "tests/broker/test_dynamic_config.py::test_unhonourable_topic_config_is_refused",
    "retention.bytes": "tests/test_log.py::test_retention_ms_and_bytes",
    "retention.ms": "tests/test_log.py::test_retention_ms_and_bytes",
    "segment.index.bytes": "tests/test_log.py::test_roll_on_full_index",
    "segment.jitter.ms": "tests/test_log_config_effects.py::test_segment_jitter_ms_rolls_segments_earlier",
    "segment.ms": "tests/test_log.py::test_roll_on_segment_ms_uses_batch_timestamps",
    "kbroker.fsync.every.append": "tests/test_log_config_effects.py::test_fsync_every_append_changed_on_a_live_log",
    "preallocate": "tests/test_log_config_effects.py::test_preallocated_tail_is_recovered_after_a_crash",
    "kbroker.key.schema.validation": "tests/schema_registry/test_broker_validation.py",
    "kbroker.value.schema.validation": "tests/schema_registry/test_broker_validation.py",
    "kbroker.value.schema.validation.payload": "tests/schema_registry/test_broker_validation.py",
    "kbroker.key.schema.validation.payload": "tests/schema_registry/test_broker_validation.py",
}

#: broker keys whose effect is KafkaConfig refusing a combination: key -> props that are refused
CROSS_CHECKED = {
    "group.consumer.min.session.timeout.ms": {"group.consumer.min.session.timeout.ms": 50000},
    "group.consumer.max.session.timeout.ms": {"group.consumer.max.session.timeout.ms": 44000},
    "group.consumer.min.heartbeat.interval.ms": {"group.consumer.min.heartbeat.interval.ms": 6000},
    "group.consumer.max.heartbeat.interval.ms": {"group.consumer.max.heartbeat.interval.ms": 4000},
}


# -- live effects against a real broker --------------------------------------------------------

def _topic():
    return f"walk-{uuid.uuid4().hex[:10]}"


def _create(bootstrap, config):
    t = _topic()
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the future resolves
    admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1, config=config)],
                        operation_timeout=10)[t].result(timeout=TIMEOUT)
    return t


def _produce(bootstrap, topic, records, **conf):
    """Produce ``records`` [(key, value, timestamp_ms | None)]; the delivery errors (None = ok)."""
    p = Producer({"bootstrap.servers": bootstrap, "retries": 0, "enable.idempotence": False,
                  "message.timeout.ms": 10000, "linger.ms": 0, **conf})
    errors = []
    for key, value, ts in records:
        kw = {"timestamp": ts} if ts is not None else {}
        p.produce(topic, key=key, value=value, on_delivery=lambda err, msg: errors.append(err), **kw)
        p.flush(30)
    assert p.flush(30) == 0
    return errors


def _consume_one(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": _topic(), "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return m
        raise AssertionError(f"nothing consumed from {topic}")
    finally:
        c.close()


def _code(err):
    return None if err is None else err.code()


def _segment_files(broker, topic, suffix=".log"):
    d = os.path.join(broker.data_dir, "logs", f"{topic}-0")
    return {n: os.path.getsize(os.path.join(d, n)) for n in sorted(os.listdir(d)) if n.endswith(suffix)}


def live_cleanup_policy(b):
    t_compact, t_delete = _create(b.bootstrap, {"cleanup.policy": "compact"}), _create(b.bootstrap, {})
    assert _code(_produce(b.bootstrap, t_compact, [(None, b"v", None)])[0]) == KafkaError.INVALID_RECORD
    assert _produce(b.bootstrap, t_delete, [(None, b"v", None)]) == [None]


def live_max_message_bytes(b):
    t = _create(b.bootstrap, {"max.message.bytes": "1000"})
    assert _code(_produce(b.bootstrap, t, [(None, b"x" * 2000, None)])[0]) == KafkaError.MSG_SIZE_TOO_LARGE
    assert _produce(b.bootstrap, t, [(None, b"x" * 100, None)]) == [None]


def live_message_timestamp_type(b):
    t = _create(b.bootstrap, {"message.timestamp.type": "LogAppendTime"})
    _produce(b.bootstrap, t, [(None, b"v", 1_000_000)])
    ts_type, ts = _consume_one(b.bootstrap, t).timestamp()
    assert ts_type == 2 and ts > 1_000_000  # TIMESTAMP_LOG_APPEND_TIME, the broker's clock


def live_message_timestamp_before_max_ms(b):
    t = _create(b.bootstrap, {"message.timestamp.before.max.ms": "60000"})
    old = int(time.time() * 1000) - 3_600_000
    assert _code(_produce(b.bootstrap, t, [(None, b"v", old)])[0]) == KafkaError.INVALID_TIMESTAMP
    assert _produce(b.bootstrap, t, [(None, b"v", None)]) == [None]


def live_message_timestamp_after_max_ms(b):
    t = _create(b.bootstrap, {"message.timestamp.after.max.ms": "60000"})
    future = int(time.time() * 1000) + 3_600_000
    assert _code(_produce(b.bootstrap, t, [(None, b"v", future)])[0]) == KafkaError.INVALID_TIMESTAMP
    assert _produce(b.bootstrap, t, [(None, b"v", None)]) == [None]


def live_segment_bytes(b):
    t = _create(b.bootstrap, {"segment.bytes": "1024"})
    _produce(b.bootstrap, t, [(None, b"x" * 400, None)] * 6)
    assert len(_segment_files(b, t)) >= 3


def live_preallocate(b):
    t = _create(b.bootstrap, {"preallocate": "true", "segment.bytes": "1048576"})
    _produce(b.bootstrap, t, [(None, b"v", None)])
    assert list(_segment_files(b, t).values()) == [1048576]
    assert list(_segment_files(b, _create(b.bootstrap, {"segment.bytes": "1048576"})).values()) == [0]


def live_segment_index_bytes(b):
    t = _create(b.bootstrap, {"segment.index.bytes": "4096", "flush.messages": "1"})
    # The active segment's offset index is mapped, at segment.index.bytes, when its first
    # entry is due (the batch after index.interval.bytes (4096) of log), in memory; the
    # flush after each append (flush.messages 1) puts it on disk at that size.
    _produce(b.bootstrap, t, [(None, b"v" * 5000, None), (None, b"v", None)])
    assert list(_segment_files(b, t, ".index").values()) == [4096]


LIVE = {
    "cleanup.policy": live_cleanup_policy,
    "max.message.bytes": live_max_message_bytes,
    "message.timestamp.type": live_message_timestamp_type,
    "message.timestamp.before.max.ms": live_message_timestamp_before_max_ms,
    "message.timestamp.after.max.ms": live_message_timestamp_after_max_ms,
    "segment.bytes": live_segment_bytes,
    "preallocate": live_preallocate,
    "segment.index.bytes": live_segment_index_bytes,
}


# -- the walk -------------------------------------------------------------------------------

def test_every_topic_config_is_accounted_for():
    keys = set(CONFIG_DEFS)
    covered = set(NO_OP_CONFIGS) | set(LIVE) | set(ELSEWHERE)
    assert keys - covered == set(), "topic configs with no effect check and not in NO_OP_CONFIGS"
    assert covered - keys == set(), "entries for configs that no longer exist"
    assert not set(NO_OP_CONFIGS) & (set(LIVE) | set(ELSEWHERE)), "a no-op cannot also have an effect"
    assert all(len(reason) > 20 for reason in NO_OP_CONFIGS.values())


@pytest.mark.parametrize("key", sorted(ELSEWHERE))
def test_effect_is_tested_elsewhere(key):
    path, _, func = ELSEWHERE[key].partition("::")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        src = f.read()
    if not func:
        assert f'"{key}"' in src, f"{path} does not exercise {key}"
        return
    fn = next((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == func), None)
    assert fn is not None, f"{path} has no {func}"
    body = ast.get_source_segment(src, fn)
    assert f'"{key}"' in body, f"{path}::{func} does not set {key}"


@pytest.mark.parametrize("key", sorted(LIVE))
def test_topic_config_has_a_live_effect(broker, key):
    LIVE[key](broker)


def _broker_sources() -> str:
    """src/kbroker text that reads config keys, minus the definitions and the generic
    describe/alter tables (which name every key without using it)."""
    skip = {os.path.join("server", "apis", "configs.py"), os.path.join("server", "dynamic_config.py")}
    out = []
    for root, dirs, files in os.walk(SRC):
        dirs[:] = [d for d in dirs if d not in ("messages", "specs", "__pycache__")]
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, SRC)
            if not name.endswith(".py") or rel in skip:
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if rel == os.path.join("server", "config.py"):
                text = text[text.index("class KafkaConfig"):]
            out.append(text)
    return "\n".join(out)


#: valid non-default values of topic-config broker synonyms whose default a generic rule cannot vary
_SAMPLES = {"compression.type": "gzip", "log.cleanup.policy": "compact", "log.message.timestamp.type": "LogAppendTime",
            "log.message.format.version": "2.8", "log.cleaner.min.cleanable.ratio": "0.25"}


def _sample(name):
    key = BROKER_CONFIG.keys[name]
    if name in _SAMPLES:
        return _SAMPLES[name]
    if key.type == "boolean":
        return str(not key.default).lower()
    if key.type in ("int", "long"):
        if key.default is None or key.default >= 2**30:  # unset, or "no limit"
            return "5000"
        return str(max(key.default, 1) + 1)
    raise AssertionError(f"no sample value for {name}: add one to _SAMPLES")


def test_every_broker_config_is_accounted_for():
    keys = set(BROKER_CONFIG.keys)
    assert set(BROKER_NO_OP_CONFIGS) <= keys, "BROKER_NO_OP_CONFIGS names keys that no longer exist"
    assert all(len(reason) > 20 for reason in BROKER_NO_OP_CONFIGS.values())
    synonyms = {k for k in keys if k in BROKER_TO_TOPIC} | {
        "log.retention.hours", "log.retention.minutes", "log.roll.hours", "log.roll.jitter.hours"}
    src = _broker_sources()
    unaccounted = []
    for name in sorted(keys - set(BROKER_NO_OP_CONFIGS)):
        if name in synonyms:
            # the broker-wide default of a topic config: setting it changes the default LogConfig
            base = LogConfig.from_broker({})
            changed = LogConfig.from_broker({name: _sample(name)})
            assert changed != base, f"{name}={_sample(name)} does not change the default topic config"
        elif name in CROSS_CHECKED:
            with pytest.raises(ConfigError):
                KafkaConfig(CROSS_CHECKED[name])
        elif not re.search(rf"""["']{re.escape(name)}["']""", src):
            unaccounted.append(name)
    assert unaccounted == [], ("broker configs never read by the broker and not in BROKER_NO_OP_CONFIGS "
                               "(kbroker/server/config.py)")


def test_broker_configs_a_single_node_cannot_honour_stop_start_up():
    """Zero-config mode (process.roles unset) is one node: other voters and a replicated
    __consumer_offsets are refused. (process.roles set is KRaft cluster mode: tests/test_kraft_config.py.)"""
    for props, key in (({"process.roles": "broker"}, "node.id"),   # cluster mode: node.id is required
                       ({"controller.quorum.voters": "1@h:9093,2@h:9093"}, "controller.quorum.voters"),
                       ({"offsets.topic.replication.factor": "3"}, "offsets.topic.replication.factor"),
                       ({"log.message.format.version": "banana"}, "log.message.format.version")):
        with pytest.raises(ConfigError) as ei:
            KafkaConfig(props)
        assert ei.value.key == key
    KafkaConfig({"controller.quorum.voters": "1@h:9093",
                 "offsets.topic.replication.factor": "1", "log.message.format.version": "0.10.0.0"})
