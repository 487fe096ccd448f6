"""ReplicatedLog rules (epoch cache, divergence, truncation) on the in-memory log."""
import pytest

from kbroker.kernels import load
from kbroker.protocol.messages.leader_change_message import LeaderChangeMessage, Voter
from kbroker.raft.replicated_log import (DATA, LEADER_CHANGE, MemoryLog, OffsetAndEpoch, build_batch,
                                         decode_batches, encode_batches)

records = load("records")


def make_log(spec):
    """spec: list of (epoch, n records) batches."""
    log = MemoryLog()
    for epoch, n in spec:
        log.append_as_leader([b"v%d" % i for i in range(n)], epoch)
    return log


def test_end_offset_for_epoch():
    log = make_log([(1, 2), (1, 1), (3, 2), (5, 1)])   # epoch 1: 0-2, epoch 3: 3-4, epoch 5: 5
    assert log.end_offset == 6 and log.last_fetched_epoch == 5
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(3, 1)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(3, 1)      # largest epoch <= 2
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(5, 3)
    assert log.end_offset_for_epoch(9) == OffsetAndEpoch(6, 5)
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)
    assert MemoryLog().end_offset_for_epoch(4) == OffsetAndEpoch(0, 0)


def test_validate_offset_and_epoch():
    log = make_log([(1, 3), (3, 2)])
    assert log.validate_offset_and_epoch(0, 0).kind == "valid"
    assert log.validate_offset_and_epoch(3, 1).kind == "valid"
    assert log.validate_offset_and_epoch(5, 3).kind == "valid"
    # the follower has epoch 2 records the leader does not: diverges at the end of epoch 1
    assert log.validate_offset_and_epoch(4, 2) == ("diverging", OffsetAndEpoch(3, 1))
    # the follower has more epoch 1 records than the leader
    assert log.validate_offset_and_epoch(4, 1) == ("diverging", OffsetAndEpoch(3, 1))


def test_truncate_to_end_offset_as_kafka():
    f = make_log([(1, 3), (2, 2)])           # the follower: epoch 2 at 3-4
    assert f.truncate_to_end_offset(OffsetAndEpoch(3, 1)) == 3
    assert f.end_offset == 3 and f.last_fetched_epoch == 1
    f = make_log([(1, 2), (1, 2)])           # more epoch 1 than the leader has
    assert f.truncate_to_end_offset(OffsetAndEpoch(2, 1)) == 2
    f = make_log([(2, 2)])                   # leader knows nothing below epoch 2 that we have
    assert f.truncate_to_end_offset(OffsetAndEpoch(0, 0)) == 0 and f.end_offset == 0


def test_truncation_inside_a_batch_is_refused():
    log = make_log([(1, 3)])
    with pytest.raises(ValueError):
        log.truncate_to(1)


def test_crash_keeps_the_flushed_prefix_only():
    log = make_log([(1, 2)])
    log.flush()
    log.append_as_leader([b"x"], 1)
    assert log.durable_end_offset == 2 and log.end_offset == 3
    after = log.crash()
    assert after.end_offset == 2 and after.durable_end_offset == 2
    log.truncate_to(2)
    log.append_as_leader([b"y"], 2)
    assert log.crash().end_offset == 2      # truncation lowers what is durable


def test_batches_are_kafka_v2_batches_with_leader_epochs_and_control_records():
    msg = LeaderChangeMessage(version=0, leader_id=2, voters=[Voter(voter_id=1), Voter(voter_id=2)],
                              granting_voters=[Voter(voter_id=2)])
    a = build_batch(0, 4, [bytes(msg.encode(0))], LEADER_CHANGE)
    b = build_batch(1, 4, [b"r1", b"r2"])
    raw = encode_batches([a, b])
    decoded = records.decode_batches(raw)
    assert [x.partition_leader_epoch for x in decoded] == [4, 4]
    assert decoded[0].is_control and not decoded[1].is_control
    assert bytes(decoded[0].records[0].key) == b"\x00\x00\x00\x02"   # version 0, LEADER_CHANGE
    back = decode_batches(raw)
    assert back == [a, b]
    assert back[0].control_type == LEADER_CHANGE and back[1].control_type == DATA
    assert LeaderChangeMessage.decode(back[0].records[0], 0).leader_id == 2


def test_a_corrupt_batch_is_refused():
    raw = bytearray(build_batch(0, 1, [b"abc"]).data)
    raw[-1] ^= 0xFF
    with pytest.raises(Exception):
        decode_batches(bytes(raw))


def test_append_rules():
    log = make_log([(2, 1)])
    with pytest.raises(ValueError):
        log.append_as_follower([build_batch(5, 2, [b"x"])])     # gap
    with pytest.raises(ValueError):
        log.append_as_follower([build_batch(1, 1, [b"x"])])     # epoch going back
    log.append_as_follower([build_batch(0, 2, [b"v0"]), build_batch(1, 2, [b"x"])])   # duplicate skipped
    assert log.end_offset == 2
    assert [b.base_offset for b in log.read(0, 1)] == [0]
    assert [b.base_offset for b in log.read(0, 1 << 20)] == [0, 1]
    assert log.read(2, 100) == []


def test_snapshot_moves_the_start_and_fetches_below_it_get_the_snapshot():
    log = make_log([(1, 2), (2, 3), (4, 1)])        # epoch 1: 0-1, epoch 2: 2-4, epoch 4: 5
    log.flush()
    with pytest.raises(ValueError):
        log.create_snapshot(OffsetAndEpoch(3, 2), b"s")     # inside a batch
    log.create_snapshot(OffsetAndEpoch(5, 2), b"state")
    assert log.start_offset == 5 and log.latest_snapshot_id() == (5, 2)
    assert log.read_snapshot(OffsetAndEpoch(5, 2)) == b"state"
    assert log.epoch_entries() == [(5, 4)]
    assert log.validate_offset_and_epoch(0, 0) == ("snapshot", OffsetAndEpoch(5, 2))
    assert log.validate_offset_and_epoch(3, 2) == ("snapshot", OffsetAndEpoch(5, 2))
    assert log.validate_offset_and_epoch(5, 1) == ("snapshot", OffsetAndEpoch(5, 2))
    assert log.validate_offset_and_epoch(5, 2).kind == "valid"
    assert log.validate_offset_and_epoch(6, 4).kind == "valid"
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(5, 2)
    after = log.crash()
    assert after.start_offset == 5 and after.end_offset == 6 and after.latest_snapshot_id() == (5, 2)


def test_install_snapshot_replaces_the_follower_log():
    log = make_log([(1, 3)])
    log.install_snapshot(OffsetAndEpoch(10, 3), b"s")
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch) == (10, 10, 3)
    log.append_as_follower([build_batch(10, 4, [b"x"])])
    assert log.end_offset == 11 and log.crash().end_offset == 10
