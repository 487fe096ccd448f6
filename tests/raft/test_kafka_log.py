"""KafkaMetadataLog: the Raft log on our on-disk Kafka-format Log, and a quorum running on it."""
import os
import random

from kbroker.kernels import load
from kbroker.raft.client import KafkaRaftClient
from kbroker.raft.kafka_log import KafkaMetadataLog
from kbroker.raft.quorum_state import FileQuorumStateStore
from kbroker.raft.replicated_log import LEADER_CHANGE, OffsetAndEpoch, build_batch, decode_batches

from .test_client import CID, Cluster, Recorder, elect

records = load("records")


def test_appends_epochs_truncation_and_reopen(tmp_path):
    log = KafkaMetadataLog.open(str(tmp_path))
    assert os.path.isdir(tmp_path / "__cluster_metadata-0")
    log.append_as_leader([b"lc"], 1, LEADER_CHANGE)
    log.append_as_leader([b"a", b"b"], 1)
    log.append_as_follower([build_batch(3, 3, [b"c"]), build_batch(4, 3, [b"d"])])
    assert log.end_offset == 5 and log.last_fetched_epoch == 3
    assert log.epoch_entries() == [(0, 1), (3, 3)]
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(3, 1)
    assert log.validate_offset_and_epoch(5, 2).kind == "diverging"
    got = log.read(1, 1 << 20)
    assert [b.records for b in got] == [(b"a", b"b"), (b"c",), (b"d",)]
    assert [b.epoch for b in got] == [1, 3, 3]
    log.flush()
    assert log.durable_end_offset == 5
    assert log.truncate_to_end_offset(OffsetAndEpoch(3, 1)) == 3
    assert log.end_offset == 3 and log.last_fetched_epoch == 1
    log.append_as_leader([b"e"], 4)
    log.flush()
    log.close()
    again = KafkaMetadataLog.open(str(tmp_path))
    assert again.end_offset == 4 and again.epoch_entries() == [(0, 1), (3, 4)]
    raw = records.decode_batches(b"".join(b.data for b in again.read(0, 1 << 20)))
    assert raw[0].is_control and [r.partition_leader_epoch for r in raw] == [1, 1, 4]
    again.close()


def test_a_read_cut_inside_a_batch_yields_the_whole_batches():
    a, b = build_batch(0, 1, [b"x" * 100]), build_batch(1, 1, [b"y" * 100])
    assert decode_batches(a.data + b.data[:50]) == [a]


def test_a_three_node_quorum_on_disk_logs(tmp_path):
    c = Cluster()
    # rebuild the clients on on-disk logs and quorum-state files
    for i in (1, 2, 3):
        d = str(tmp_path / ("node%d" % i))
        os.makedirs(d)
        c.clients[i] = KafkaRaftClient(i, (1, 2, 3), CID, KafkaMetadataLog.open(d),
                                       FileQuorumStateStore(os.path.join(d, "quorum-state")),
                                       c.listeners[i], random.Random(i))
        c.clients[i].start(0)
    c.queue.clear()
    lead = elect(c)
    for k in range(20):
        lead.schedule_append(lead.quorum.epoch, [b"rec%d" % k], c.now)
        c.advance(10)
    c.advance(300)
    for i in (1, 2, 3):
        vals = [v for _, _, v in c.listeners[i].committed][1:]
        assert vals == [b"rec%d" % k for k in range(20)], i
        assert c.clients[i].log.durable_end_offset == c.clients[i].log.end_offset
    # a follower restarts from its directory: same log, same epoch, follows again
    f = [i for i in (1, 2, 3) if i != lead.node_id][0]
    c.clients[f].log.close()
    d = str(tmp_path / ("node%d" % f))
    c.listeners[f] = Recorder()
    c.clients[f] = KafkaRaftClient(f, (1, 2, 3), CID, KafkaMetadataLog.open(d),
                                   FileQuorumStateStore(os.path.join(d, "quorum-state")),
                                   c.listeners[f], random.Random(9))
    c.clients[f].start(c.now)
    assert c.clients[f].quorum.epoch == lead.quorum.epoch
    lead.schedule_append(lead.quorum.epoch, [b"after"], c.now)
    c.advance(500)
    assert [v for _, _, v in c.listeners[f].committed][-1] == b"after"
    assert len(c.listeners[f].committed) == 22
    for cl in c.clients.values():
        cl.log.close()


def test_snapshot_files(tmp_path):
    log = KafkaMetadataLog.open(str(tmp_path))
    log.append_as_leader([b"lc"], 1, LEADER_CHANGE)
    log.append_as_leader([b"a", b"b"], 1)
    log.append_as_leader([b"c"], 2)
    log.flush()
    log.create_snapshot(OffsetAndEpoch(3, 1), b"state@3")
    d = tmp_path / "__cluster_metadata-0"
    assert (d / "00000000000000000003-0000000001.checkpoint").read_bytes() == b"state@3"
    assert log.start_offset == 3 and log.latest_snapshot_id() == (3, 1)
    assert log.validate_offset_and_epoch(1, 1) == ("snapshot", OffsetAndEpoch(3, 1))
    assert [b.records for b in log.read(3, 1 << 20)] == [(b"c",)]
    log.create_snapshot(OffsetAndEpoch(4, 2), b"state@4")
    assert not (d / "00000000000000000003-0000000001.checkpoint").exists()
    log.close()
    (d / "00000000000000000009-0000000002.checkpoint.part").write_bytes(b"torn")
    again = KafkaMetadataLog.open(str(tmp_path))
    assert again.latest_snapshot_id() == (4, 2) and again.read_snapshot(OffsetAndEpoch(4, 2)) == b"state@4"
    assert again.start_offset == 4 and again.end_offset == 4 and again.last_fetched_epoch == 2
    assert not (d / "00000000000000000009-0000000002.checkpoint.part").exists()
    # a follower installs a snapshot from the leader: its log restarts there
    again.install_snapshot(OffsetAndEpoch(10, 3), b"state@10")
    assert (again.start_offset, again.end_offset, again.last_fetched_epoch) == (10, 10, 3)
    again.append_as_follower([build_batch(10, 3, [b"x"])])
    again.flush()
    again.close()
    third = KafkaMetadataLog.open(str(tmp_path))
    assert (third.start_offset, third.end_offset, third.latest_snapshot_id()) == (10, 11, (10, 3))
    third.close()
