"""Metadata snapshots: the file format, a controller loaded from one, the generator's
triggers, and the controller host keeping snapshot + tail instead of every record."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from kbroker.controller import QuorumController
from kbroker.kernels import records as _records
from kbroker.metadata.delta import replay_all
from kbroker.metadata.serde import serialize
from kbroker.metadata.snapshot import SnapshotFormatError, decode_snapshot, encode_snapshot
from kbroker.raft.replicated_log import DATA, Batch, OffsetAndEpoch
from kbroker.server.snapshot_generator import SnapshotGenerator
from tests.controller.harness import Harness


def _cluster(n_topics=5):
    h = Harness(seed=3)
    h.start_brokers([1, 2, 3])
    for i in range(n_topics):
        assert h.create_topic(f"t{i}", partitions=3, rf=3).error_code == 0
    h.alter_isr("t0", 0, [h.partition("t0", 0).leader])
    return h


def test_format_header_batches_footer_and_round_trip():
    h = _cluster()
    records = h.broker_image().to_records()
    data = encode_snapshot(records, 1_700_000_000_000, epoch=7, max_batch_records=10)
    batches = list(_records.iter_batches(data))
    assert batches[0].is_control and batches[-1].is_control
    assert [b.base_offset for b in batches][:3] == [0, 1, 11]
    assert all(b.partition_leader_epoch == 7 for b in batches)
    assert sum(len(list(b.records)) for b in batches) == len(records) + 2
    assert [serialize(r) for r in decode_snapshot(data)] == [serialize(r) for r in records]


def test_truncated_or_damaged_snapshots_are_refused():
    data = encode_snapshot(_cluster(2).broker_image().to_records(), 0)
    last = list(_records.iter_batches(data))[-1]
    with pytest.raises(SnapshotFormatError, match="no SnapshotFooter"):
        decode_snapshot(data[:len(data) - last.size_in_bytes])
    damaged = bytearray(data)
    damaged[80] ^= 0xFF
    with pytest.raises(SnapshotFormatError):
        decode_snapshot(bytes(damaged))
    no_header = _records.encode_batch([(0, None, serialize(r), ()) for r in _cluster(1).broker_image().to_records()])
    with pytest.raises(SnapshotFormatError, match="SnapshotHeader"):
        decode_snapshot(no_header)


def test_controller_from_snapshot_equals_the_replayed_one_and_keeps_working():
    h = _cluster()
    last = h.log[-1][0]
    snap = decode_snapshot(encode_snapshot(h.broker_image().to_records(), 0))
    c = QuorumController.from_snapshot(snap, last, h.config, seed=3)
    assert c.image().same_state(h.replayed().image())
    assert c.next_write_offset == last + 1
    # it serves writes from there: a new topic (its id never one in use, although the
    # rebuilt controller's random source starts again from the same seed), heartbeats of
    # brokers registered before the snapshot
    h2 = Harness(seed=3)
    h2.c, h2.log = c, list(h.log)
    h2.epochs = dict(h.epochs)
    assert h2.create_topic("after", partitions=2, rf=2).error_code == 0
    for b in (1, 2, 3):
        r = h2.heartbeat(b)
        assert r.response.error_code == 0 and not r.response.is_fenced
    tail = [r for off, r in h2.log if off > last]
    assert replay_all(tail, replay_all(snap)).same_state(c.image())


class _FakeRaft:
    def __init__(self):
        self.snapshots = []
        self.client = SimpleNamespace(log=SimpleNamespace(start_offset=0, durable_end_offset=10**9,
                                                          flush=lambda: None),
                                      epoch_at=lambda off: 4, create_snapshot=self._create)
        self.done = threading.Event()

    def _create(self, offset, data):
        self.snapshots.append((offset, data))
        self.client.log.start_offset = offset
        return OffsetAndEpoch(offset, 4)

    def submit(self, fn):
        fn()
        self.done.set()


def _batches(h):
    return [Batch(off, 1, (serialize(r),), DATA, b"") for off, r in h.log]


def test_generator_snapshots_after_enough_bytes_and_on_the_interval():
    h = _cluster()
    total = sum(len(serialize(r)) for _, r in h.log)
    now = [0]
    written = []
    g = SnapshotGenerator(1, max_bytes_between=total + 1, max_interval_ms=60_000,
                          on_written=[lambda s, recs: written.append((s, len(recs)))], now_ms=lambda: now[0])
    raft = _FakeRaft()
    g.attach(raft)
    g.handle_commit(_batches(h))
    assert raft.snapshots == []                         # one byte short, interval not passed
    h.create_topic("more", partitions=1, rf=1)
    new = [b for b in _batches(h) if b.base_offset >= g.next_offset]
    g.handle_commit(new)
    assert raft.done.wait(10) and not g.in_flight
    (offset, data), = raft.snapshots
    assert offset == h.log[-1][0] + 1
    assert replay_all(decode_snapshot(data)).same_state(h.broker_image())
    assert written == [(OffsetAndEpoch(offset, 4), len(decode_snapshot(data)))]
    # the time trigger: one new record and the interval passed
    raft.done.clear()
    h.create_topic("later", partitions=1, rf=1)
    g.handle_commit([b for b in _batches(h) if b.base_offset >= g.next_offset])
    assert len(raft.snapshots) == 1
    now[0] = 60_000
    h.create_topic("later2", partitions=1, rf=1)
    g.handle_commit([b for b in _batches(h) if b.base_offset >= g.next_offset])
    assert raft.done.wait(10) and len(raft.snapshots) == 2


def test_generator_loads_a_snapshot_as_its_image():
    h = _cluster()
    g = SnapshotGenerator(1, 10**9, 0)
    g.handle_load_snapshot(OffsetAndEpoch(h.log[-1][0] + 1, 2), encode_snapshot(h.broker_image().to_records(), 0))
    assert g.image.same_state(h.broker_image()) and g.next_offset == h.log[-1][0] + 1


def test_image_delta_turns_the_old_image_into_the_snapshot_one_with_removals():
    """A running broker that installs a snapshot publishes the difference: topics gone from
    the snapshot are deleted, changed partitions become leader/follower changes."""
    from kbroker.metadata.delta import image_delta
    from kbroker.protocol.messages.delete_topics import DeleteTopicsRequest

    h = _cluster(3)
    old = h.broker_image()
    broker = old.topics.by_name["t1"].partitions[0].replicas[0]
    h.write(h.c.delete_topics(DeleteTopicsRequest(topic_names=["t1"])))
    h.create_topic("fresh", partitions=2, rf=3)
    h.alter_isr("t2", 1, [h.partition("t2", 1).leader])
    new = h.broker_image()
    d = image_delta(old, new)
    assert d.apply().same_state(new)
    created, removed, touched = d.changes()
    assert [t.name for t in removed.values()] == ["t1"]
    assert [touched[t].name for t in created] == ["fresh"]
    assert ("t1", 0) in d.local_changes(broker).deletes
    assert set(touched) == set(created) | {old.topics.by_name["t2"].topic_id}
    same = image_delta(new, new)
    assert same.changes() == ([], {}, {}) and same.apply().same_state(new)
