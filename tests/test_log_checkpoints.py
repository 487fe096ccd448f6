"""Checkpoint file formats (byte for byte) and LogConfig."""
import os
import uuid

import pytest

from kbroker.log.checkpoints import (
    CheckpointError, LeaderEpochCheckpointFile, OffsetCheckpointFile, PartitionMetadataFile,
    has_clean_shutdown, read_meta_properties, remove_clean_shutdown, topic_id_from_str, topic_id_to_str,
    write_clean_shutdown, write_meta_properties,
)
from kbroker.log.config import LONG_MAX, LogConfig, LogManagerConfig
from kbroker.log.errors import ConfigError
from kbroker.log.leader_epoch import LeaderEpochFileCache


def test_offset_checkpoint_bytes(tmp_path):
    p = str(tmp_path / "recovery-point-offset-checkpoint")
    f = OffsetCheckpointFile(p)
    f.write({("orders", 0): 1234, ("my-topic", 12): 0})
    assert open(p, "rb").read() == b"0\n2\norders 0 1234\nmy-topic 12 0\n"
    assert f.read() == {("orders", 0): 1234, ("my-topic", 12): 0}
    assert not os.path.exists(p + ".tmp")
    f.write({})
    assert open(p, "rb").read() == b"0\n0\n"


@pytest.mark.parametrize("content", [b"1\n0\n", b"0\n2\na 0 1\n", b"0\n1\na b c\n", b"x\n", b"0\n1\na 0 1\nb 0 2\n"])
def test_offset_checkpoint_malformed(tmp_path, content):
    p = tmp_path / "cp"
    p.write_bytes(content)
    with pytest.raises(CheckpointError):
        OffsetCheckpointFile(str(p)).read()


def test_leader_epoch_checkpoint_and_cache(tmp_path):
    p = str(tmp_path / "leader-epoch-checkpoint")
    cache = LeaderEpochFileCache(LeaderEpochCheckpointFile(p))
    cache.assign(0, 0)
    cache.assign(0, 5)          # same epoch, higher offset: no change
    cache.assign(3, 100)
    cache.assign(5, 250)
    assert open(p, "rb").read() == b"0\n3\n0 0\n3 100\n5 250\n"
    assert cache.end_offset_for(0, 300) == (0, 100)
    assert cache.end_offset_for(2, 300) == (0, 100)
    assert cache.end_offset_for(4, 300) == (3, 250)
    assert cache.end_offset_for(5, 300) == (5, 300)
    assert cache.end_offset_for(6, 300) == (-1, -1)
    assert cache.end_offset_for(-1, 300) == (-1, -1)
    cache.truncate_from_end(250)
    assert cache.epoch_entries() == [(0, 0), (3, 100)]
    cache.truncate_from_start(150)
    assert cache.epoch_entries() == [(3, 150)]
    assert LeaderEpochFileCache(LeaderEpochCheckpointFile(p)).epoch_entries() == [(3, 150)]
    cache.assign(2, 120)        # lower epoch and offset: Kafka truncates the later entries
    assert cache.epoch_entries() == [(2, 120)]


def test_partition_metadata(tmp_path):
    p = str(tmp_path / "partition.metadata")
    tid = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    PartitionMetadataFile(p).write(tid)
    assert open(p, "rb").read() == b"version: 0\ntopic_id: a6e4EJ2tEdGAtADAT9QwyA"
    assert PartitionMetadataFile(p).read() == tid
    assert topic_id_from_str(topic_id_to_str(tid)) == tid


def test_meta_properties_and_clean_shutdown(tmp_path):
    p = str(tmp_path / "meta.properties")
    write_meta_properties(p, node_id=1, cluster_id="MkU3OEVBNTcwNTJENDM2Qg",
                          directory_id="J8aAPcfLQt2bqs1JT_rMgQ", now=0)
    assert open(p, "rb").read() == (b"#\n#Thu Jan 01 00:00:00 UTC 1970\nnode.id=1\n"
                                    b"directory.id=J8aAPcfLQt2bqs1JT_rMgQ\nversion=1\n"
                                    b"cluster.id=MkU3OEVBNTcwNTJENDM2Qg\n")
    assert read_meta_properties(p) == {"node.id": "1", "directory.id": "J8aAPcfLQt2bqs1JT_rMgQ",
                                       "version": "1", "cluster.id": "MkU3OEVBNTcwNTJENDM2Qg"}
    d = str(tmp_path)
    assert not has_clean_shutdown(d)
    write_clean_shutdown(d, 7)
    assert open(os.path.join(d, ".kafka_cleanshutdown"), "rb").read() == b'{"version":0,"brokerEpoch":7}'
    assert has_clean_shutdown(d)
    remove_clean_shutdown(d)
    assert not has_clean_shutdown(d)


def test_log_config_defaults():
    c = LogConfig()
    assert (c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes) == (
        1073741824, 604800000, 10485760, 4096)
    assert (c.retention_ms, c.retention_bytes, c.cleanup_policy, c.flush_messages, c.flush_ms) == (
        604800000, -1, ["delete"], LONG_MAX, LONG_MAX)
    assert (c.file_delete_delay_ms, c.max_message_bytes, c.message_timestamp_type) == (60000, 1048588, "CreateTime")
    assert (c.min_cleanable_dirty_ratio, c.delete_retention_ms, c.min_compaction_lag_ms) == (0.5, 86400000, 0)
    assert c.delete and not c.compact and c.string_value("cleanup.policy") == "delete"


def test_log_config_broker_names_and_overrides():
    b = LogConfig.from_broker({"log.segment.bytes": "1048576", "log.retention.hours": "1",
                               "log.retention.minutes": "30", "log.roll.hours": "2",
                               "log.cleanup.policy": "compact,delete", "message.max.bytes": 500000,
                               "log.flush.interval.messages": "1", "unrelated.key": "x"})
    assert b.segment_bytes == 1048576 and b.retention_ms == 30 * 60000 and b.segment_ms == 7200000
    assert b.compact and b.delete and b.max_message_bytes == 500000 and b.flush_messages == 1
    assert LogConfig.from_broker({"log.retention.ms": "-5"}).retention_ms == -1
    t = b.with_overrides({"retention.ms": "1000", "cleanup.policy": "delete"})
    assert t.retention_ms == 1000 and not t.compact and t.segment_bytes == 1048576
    assert t.originals == {"retention.ms": 1000, "cleanup.policy": ["delete"]}


@pytest.mark.parametrize("key,value", [
    ("segment.bytes", "13"), ("segment.bytes", "abc"), ("retention.ms", -2), ("cleanup.policy", "shred"),
    ("cleanup.policy", ""), ("min.cleanable.dirty.ratio", 1.5), ("message.timestamp.type", "Now"),
    ("flush.messages", 0), ("preallocate", "yes"), ("no.such.config", 1), ("segment.index.bytes", 3),
    ("segment.bytes", 1 << 31),
])
def test_log_config_validation_names_key(key, value):
    with pytest.raises(ConfigError) as e:
        LogConfig({key: value})
    assert e.value.key == key and key in str(e.value)


def test_broker_level_validation_names_broker_key():
    with pytest.raises(ConfigError) as e:
        LogConfig.from_broker({"log.segment.bytes": "5"})
    assert e.value.key == "log.segment.bytes"
    mc = LogManagerConfig.from_broker({"log.dirs": "/a,/b", "kbroker.log.fsync.every.append": "true"})
    assert mc.log_dirs == ("/a", "/b") and mc.fsync_every_append
    with pytest.raises(ConfigError):
        LogManagerConfig.from_broker({"log.retention.check.interval.ms": "0"})
