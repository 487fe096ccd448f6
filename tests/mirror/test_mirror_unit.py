"""MirrorMaker 2 pieces without a broker: config, naming, filters, record bytes, offset syncs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from kbroker.client import TopicPartition
from kbroker.mirror.config import MirrorConfigError, MirrorMakerConfig, parse_properties
from kbroker.mirror.filters import ConfigPropertyFilter, GroupFilter, TopicFilter
from kbroker.mirror.formats import Checkpoint, FormatError, Heartbeat, OffsetSync
from kbroker.mirror.offset_syncs import SYNCS_PER_PARTITION, OffsetSyncStore, OffsetSyncWriter
from kbroker.mirror.policy import DefaultReplicationPolicy, IdentityReplicationPolicy, is_cycle

BASE = {"clusters": "A, B", "A.bootstrap.servers": "127.0.0.1:1", "B.bootstrap.servers": "127.0.0.1:2",
        "A->B.enabled": "true"}


# -- config ---------------------------------------------------------------------------------
def test_properties_syntax():
    text = "# comment\n! also\nclusters = A, B\nA.bootstrap.servers:h:1\nA->B.topics = a, \\\n   b\nx y\n"
    assert parse_properties(text) == {"clusters": "A, B", "A.bootstrap.servers": "h:1", "A->B.topics": "a, b",
                                      "x": "y"}


def test_flow_setting_precedence_and_defaults():
    mm = MirrorMakerConfig({**BASE, "B->A.enabled": "false", "topics": "t.*", "A->B.topics": "orders",
                            "emit.checkpoints.interval.seconds": "5", "replication.policy.separator": "_"})
    [fc] = mm.flows
    assert str(fc.flow) == "A->B"
    assert fc["topics"] == "orders" and fc["emit.checkpoints.interval.seconds"] == 5
    assert fc["offset.lag.max"] == 100 and fc["replication.factor"] == 2 and fc["sync.group.offsets.enabled"] is False
    assert fc["refresh.topics.interval.seconds"] == 600 and fc["emit.heartbeats.interval.seconds"] == 1
    assert fc.remote_topic("orders") == "A_orders"
    assert fc.offset_syncs_topic == "mm2-offset-syncs_B_internal" and fc.checkpoints_topic == "A_checkpoints_internal"
    # heartbeats run for every pair unless disabled (MM2's clusterPairs)
    assert sorted(str(f.flow) for f in mm.heartbeat_flows) == ["A->B", "B->A"]


def test_offset_syncs_location_names_the_other_cluster():
    fc = MirrorMakerConfig({**BASE, "offset-syncs.topic.location": "target"}).flows[0]
    assert not fc.offset_syncs_on_source and fc.offset_syncs_topic == "mm2-offset-syncs.A.internal"
    assert MirrorMakerConfig(BASE).flows[0].offset_syncs_topic == "mm2-offset-syncs.B.internal"


def test_client_configs_per_cluster_and_role():
    mm = MirrorMakerConfig({**BASE, "A.consumer.max.poll.records": "7", "B.producer.linger.ms": "0",
                            "client.id": "mm2", "A.client.id": "mm2-a"})
    assert mm.client_config("A", "consumer") == {"bootstrap.servers": "127.0.0.1:1", "client.id": "mm2-a",
                                                 "max.poll.records": "7"}
    assert mm.client_config("B", "producer") == {"bootstrap.servers": "127.0.0.1:2", "client.id": "mm2",
                                                 "linger.ms": "0"}


@pytest.mark.parametrize("props, key", [
    ({"A->B.topic": "x"}, "A->B.topic"),
    ({"emit.checkpoint.interval.seconds": "1"}, "emit.checkpoint.interval.seconds"),
    ({"A->C.enabled": "true"}, "A->C.enabled"),
    ({"A.consumer.max.poll.recordz": "1"}, "A.consumer.max.poll.recordz"),
    ({"A.consumer.max.poll.records": "many"}, "max.poll.records"),
    ({"offset.lag.max": "ten"}, "offset.lag.max"),
    ({"A->B.sync.group.offsets.enabled": "yes"}, "A->B.sync.group.offsets.enabled"),
    ({"offset-syncs.topic.location": "middle"}, "offset-syncs.topic.location"),
    ({"replication.policy.class": "com.example.Mine"}, "replication.policy.class"),
    ({"C.bootstrap.servers": "h:1"}, "C.bootstrap.servers"),
])
def test_a_bad_key_or_value_is_named(props, key):
    with pytest.raises(MirrorConfigError, match=key.replace(".", r"\.").replace(">", ">")):
        MirrorMakerConfig({**BASE, **props})


def test_missing_clusters_and_flows():
    with pytest.raises(MirrorConfigError, match="clusters"):
        MirrorMakerConfig({"A.bootstrap.servers": "h:1"})
    with pytest.raises(MirrorConfigError, match="no replication flow"):
        MirrorMakerConfig({k: v for k, v in BASE.items() if k != "A->B.enabled"})
    with pytest.raises(MirrorConfigError, match="B.bootstrap.servers"):
        MirrorMakerConfig({k: v for k, v in BASE.items() if k != "B.bootstrap.servers"})


def test_cli_one_line_error_names_the_key(tmp_path):
    conf = tmp_path / "mm2.properties"
    conf.write_text("".join(f"{k} = {v}\n" for k, v in {**BASE, "A->B.topicz": "x"}.items()))
    r = subprocess.run([sys.executable, "-m", "kbroker", "mirror", "--config", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stdout == "" and r.stderr.count("\n") == 1 and "A->B.topicz" in r.stderr, r.stderr


# -- naming -----------------------------------------------------------------------------------
def test_default_replication_policy():
    p = DefaultReplicationPolicy()
    assert p.format_remote_topic("A", "orders") == "A.orders"
    assert p.topic_source("A.orders") == "A" and p.upstream_topic("A.orders") == "orders"
    assert p.topic_source("orders") is None and p.upstream_topic("orders") is None
    assert p.original_topic("B.A.orders") == "orders"
    assert p.is_heartbeats_topic("heartbeats") and p.is_heartbeats_topic("B.A.heartbeats")
    assert p.is_internal_topic("__consumer_offsets") and p.is_internal_topic("mm2-offset-syncs.B.internal")
    assert p.is_internal_topic("A.checkpoints.internal") and p.is_internal_topic("connect-offsets-internal")
    assert not p.is_internal_topic("A.orders")
    assert p.is_checkpoints_topic("A.checkpoints.internal")
    q = DefaultReplicationPolicy("__", internal_separator_enabled=False)
    assert q.format_remote_topic("A", "orders") == "A__orders" and q.checkpoints_topic("A") == "A.checkpoints.internal"


def test_identity_policy_keeps_names_except_heartbeats():
    p = IdentityReplicationPolicy(source_cluster_alias="A")
    assert p.format_remote_topic("A", "orders") == "orders"
    assert p.format_remote_topic("A", "heartbeats") == "A.heartbeats"
    assert p.topic_source("orders") == "A" and p.upstream_topic("orders") == "orders"


def test_cycles():
    p = DefaultReplicationPolicy()
    assert is_cycle(p, "B.orders", "B") and is_cycle(p, "C.B.orders", "B")
    assert not is_cycle(p, "orders", "B") and not is_cycle(p, "C.orders", "B")
    assert not is_cycle(IdentityReplicationPolicy(source_cluster_alias="A"), "orders", "B")


def test_filters_with_mm2_defaults():
    f = TopicFilter()
    assert f.should_replicate_topic("orders")
    for t in ("__consumer_offsets", "mm2-offset-syncs.B.internal", "x-internal", "orders.replica"):
        assert not f.should_replicate_topic(t), t
    f = TopicFilter("orders, pay.*", "payroll")
    assert f.should_replicate_topic("payments") and not f.should_replicate_topic("payroll")
    assert not f.should_replicate_topic("orders2")          # whole-name match
    assert not TopicFilter("", "").should_replicate_topic("x")     # an empty list matches nothing
    g = GroupFilter()
    assert g.should_replicate_group("app") and not g.should_replicate_group("console-consumer-1")
    assert not g.should_replicate_group("connect-x") and not g.should_replicate_group("__x")
    c = ConfigPropertyFilter()
    assert c.should_replicate_config_property("retention.ms")
    assert not c.should_replicate_config_property("min.insync.replicas")
    assert not c.should_replicate_config_property("message.timestamp.type")
    assert not c.should_replicate_source_default("retention.ms")


# -- record formats ---------------------------------------------------------------------------
def test_offset_sync_bytes():
    s = OffsetSync(TopicPartition("orders", 2), 5, 7)
    assert s.record_key() == b"\x00\x06orders\x00\x00\x00\x02"
    assert s.record_value() == (5).to_bytes(8, "big") + (7).to_bytes(8, "big")
    assert OffsetSync.deserialize(s.record_key(), s.record_value()) == s


def test_checkpoint_bytes():
    c = Checkpoint("g", TopicPartition("A.t", 1), 10, 9, "m")
    assert c.record_key() == b"\x00\x01g\x00\x03A.t\x00\x00\x00\x01"
    assert c.record_value() == b"\x00\x00" + (10).to_bytes(8, "big") + (9).to_bytes(8, "big") + b"\x00\x01m"
    assert Checkpoint.deserialize(c.record_key(), c.record_value()) == c
    with pytest.raises(FormatError):
        Checkpoint.deserialize(c.record_key(), b"\x00\x01" + c.record_value()[2:])     # unknown version
    with pytest.raises(FormatError):
        Checkpoint.deserialize(c.record_key()[:-1], c.record_value())


def test_heartbeat_bytes():
    h = Heartbeat("A", "B", 1234)
    assert h.record_key() == b"\x00\x01A\x00\x01B"
    assert h.record_value() == b"\x00\x00" + (1234).to_bytes(8, "big")
    assert Heartbeat.deserialize(h.record_key(), h.record_value()) == h


# -- offset syncs -----------------------------------------------------------------------------
class _Producer:
    def __init__(self):
        self.sent = []

    def send(self, topic, value, key, partition):
        self.sent.append(OffsetSync.deserialize(key, value))


def test_writer_emits_every_offset_lag_max_and_on_gaps():
    p = _Producer()
    w = OffsetSyncWriter(p, "mm2-offset-syncs.B.internal", 10)
    tp = TopicPartition("t", 0)
    for off in range(25):
        w.maybe_queue(tp, off, off + 100)
    # first record, then whenever the translation (last sync + 1) would be 10 or more behind
    assert [(s.upstream_offset, s.downstream_offset) for s in p.sent] == [(0, 100), (11, 111), (22, 122)]
    w.maybe_queue(tp, 30, 125)             # upstream gap (compaction / a marker): at once
    assert p.sent[-1].upstream_offset == 30
    w.maybe_queue(tp, 31, 126)             # delayed until the next commit
    assert p.sent[-1].upstream_offset == 30
    w.promote_delayed()
    w.fire_pending()
    assert p.sent[-1].upstream_offset == 31


def test_store_translation_rule():
    st = OffsetSyncStore()
    tp = TopicPartition("t", 0)
    for up, down in ((10, 100), (20, 150), (30, 160)):
        st.handle(OffsetSync(tp, up, down))
    assert st.translate_downstream(tp, 20) is None          # not read to the end yet: decline
    st.read_to_end = True
    assert st.translate_downstream(tp, 20) == 150            # exactly at a sync
    assert st.translate_downstream(tp, 25) == 151            # past a sync: only one further
    assert st.translate_downstream(tp, 99) == 161
    assert st.translate_downstream(tp, 5) == -1              # older than every sync
    assert st.translate_downstream(TopicPartition("t", 1), 5) is None
    st.handle(OffsetSync(tp, 3, 500))                        # upstream rewind: older syncs are void
    assert st.translate_downstream(tp, 25) == 501


def test_store_keeps_recent_syncs_exact_and_the_oldest():
    st = OffsetSyncStore()
    st.read_to_end = True
    tp = TopicPartition("t", 0)
    for up in range(0, 100_000, 10):
        st.handle(OffsetSync(tp, up, up))
    syncs = st._syncs[tp]
    assert len(syncs) == SYNCS_PER_PARTITION
    assert syncs[-1].upstream_offset == 0 and syncs[0].upstream_offset == 99_990
    assert [s.upstream_offset for s in syncs[:5]] == [99_990, 99_980, 99_970, 99_960, 99_950]
    for g in (5, 777, 50_003, 99_999):                        # never past the group, always translatable
        d = st.translate_downstream(tp, g)
        assert 0 <= d <= g
    # precision relative to age: a group 1000 behind re-reads well under 1000
    assert 99_000 - st.translate_downstream(tp, 99_000) < 200


# -- exactly-once ---------------------------------------------------------------------------
def test_exactly_once_settings_under_connect_and_mm2_names():
    from kbroker.mirror.config import FLOW_DEFAULTS

    fc = MirrorMakerConfig(BASE).flows[0]
    assert fc.exactly_once is False and FLOW_DEFAULTS["exactly.once.source.support"] == "disabled"
    fc = MirrorMakerConfig({**BASE, "exactly.once.source.support": "enabled",
                            "A.consumer.isolation.level": "read_committed"}).flows[0]
    assert fc.exactly_once and fc.read_committed
    assert fc.offset_storage_topic == "mm2-offsets.A.internal"       # MirrorMakerConfig.workerConfig
    assert fc.transactional_id(0) == "A-mm2-MirrorSourceConnector-0"  # Worker.taskTransactionalId
    assert fc.transaction_boundary_s is None                          # Connect's default: poll
    fc = MirrorMakerConfig({**BASE, "A->B.exactly.once.source.support": "preparing",
                            "transaction.boundary": "interval", "offset.flush.interval.ms": "2500",
                            "offset.storage.topic": "my-offsets"}).flows[0]
    assert not fc.exactly_once and fc.transaction_boundary_s == 2.5 and fc.offset_storage_topic == "my-offsets"
    fc = MirrorMakerConfig({**BASE, "transaction.boundary": "interval",
                            "transaction.boundary.interval.ms": "700"}).flows[0]
    assert fc.transaction_boundary_s == 0.7
    for bad in ({"exactly.once.source.support": "on"}, {"transaction.boundary": "connector"},
                {"A->B.exactly.once.support": "maybe"}):
        with pytest.raises(MirrorConfigError, match=next(iter(bad))):
            MirrorMakerConfig({**BASE, **bad})
    # MirrorSourceConnector.validateExactlyOnceConfigs: required needs a read_committed source consumer
    with pytest.raises(MirrorConfigError, match="isolation.level = read_committed"):
        MirrorMakerConfig({**BASE, "exactly.once.source.support": "enabled", "exactly.once.support": "required"})
    MirrorMakerConfig({**BASE, "exactly.once.source.support": "enabled", "exactly.once.support": "required",
                       "A.consumer.isolation.level": "read_committed"})


def test_source_offsets_in_connects_offsets_topic_layout():
    from kbroker.mirror.exactly_once import offset_key, offset_value, parse_offset_record, task_partitions

    tp = TopicPartition("orders", 2)
    assert offset_key("A", tp) == b'["MirrorSourceConnector",{"cluster":"A","partition":2,"topic":"orders"}]'
    assert offset_value(41) == b'{"offset":41}'
    assert parse_offset_record("A", offset_key("A", tp), b'{"offset":41}') == (tp, 41)
    # Connect's JSON may order the partition's fields differently; tombstones delete
    assert parse_offset_record("A", b'["MirrorSourceConnector", {"topic": "orders", "partition": 2, '
                                    b'"cluster": "A"}]', None) == (tp, None)
    for key in (offset_key("B", tp), b'["MirrorCheckpointConnector",{"cluster":"A"}]', b"junk", None):
        assert parse_offset_record("A", key, b'{"offset":1}') is None
    # MirrorSourceConnector.taskConfigs: sorted partitions dealt round robin
    assert task_partitions({"b": 2, "a": 3}, 2) == [
        [TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1)],
        [TopicPartition("a", 1), TopicPartition("b", 0)]]
    assert task_partitions({"a": 1}, 3) == [[TopicPartition("a", 0)], [], []]
