"""TxnOffsetCommit in the group coordinator: transactional offsets written as the producer's
transactional batch, pending (UNSTABLE_OFFSET_COMMIT for require_stable) until the COMMIT
or ABORT marker reaches __consumer_offsets, and replayed the same way on load."""
from __future__ import annotations

import struct

from kbroker.coordinator.group.coordinator import GroupConfig, GroupCoordinator
from kbroker.coordinator.group.offsets import OffsetAndMetadata
from kbroker.coordinator.group.storage import OFFSETS_TOPIC, InMemoryOffsetsLog
from kbroker.kernels import records as rec
from kbroker.protocol import ErrorCode as E

CFG = GroupConfig(offsets_topic_num_partitions=4, group_initial_rebalance_delay_ms=0)
PID, EPOCH = 4242, 3
G = "txg"
TP = ("t", 0)
TP1 = ("t", 1)


class Env:
    def __init__(self, log=None):
        self.now = 1_700_000_000_000
        self.log = log if log is not None else InMemoryOffsetsLog()
        self.c = GroupCoordinator(CFG, self.log, time_ms=lambda: self.now, reaper_enabled=False)
        self.c.startup(background=False, enable_retention=False)

    def txn_commit(self, offsets, pid=PID, epoch=EPOCH, group=G, member="", gen=-1):
        out = []
        oms = {tp: OffsetAndMetadata(o, -1, "", self.now) for tp, o in offsets.items()}
        self.c.commit_transactional_offsets(group, pid, epoch, member, None, gen, oms, out.append)
        assert len(out) == 1
        return out[0]

    def fetch(self, tps, stable=False, group=G):
        err, got = self.c.fetch_offsets(group, tps, require_stable=stable)
        assert err == E.NONE
        return {tp: (p.committed_offset, p.error) for tp, p in got.items()}

    def marker(self, commit, pid=PID, epoch=EPOCH, group=G):
        """What the partition leader does: the control batch in the log, then the hook."""
        p = self.c.partition_for(group)
        batch = rec.encode_batch([(self.now, struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 0),
                                   ())], producer_id=pid, producer_epoch=epoch, is_transactional=True,
                                 is_control=True)
        self.log.append(p, batch, lambda code, base: None)
        self.c.on_transaction_completed(pid, [(OFFSETS_TOPIC, p)], commit)


def test_offsets_are_pending_until_the_commit_marker():
    e = Env()
    assert e.txn_commit({TP: 10, TP1: 20}) == {TP: E.NONE, TP1: E.NONE}
    assert e.fetch([TP]) == {TP: (-1, E.NONE)}
    assert e.fetch([TP, TP1], stable=True) == {TP: (-1, E.UNSTABLE_OFFSET_COMMIT),
                                               TP1: (-1, E.UNSTABLE_OFFSET_COMMIT)}
    e.marker(commit=True)
    assert e.fetch([TP, TP1], stable=True) == {TP: (10, E.NONE), TP1: (20, E.NONE)}


def test_abort_marker_drops_them():
    e = Env()
    e.txn_commit({TP: 10})
    e.marker(commit=False)
    assert e.fetch([TP], stable=True) == {TP: (-1, E.NONE)}
    # another producer's marker on the partition changes nothing
    e.txn_commit({TP: 11})
    e.marker(commit=True, pid=PID + 1)
    assert e.fetch([TP], stable=True) == {TP: (-1, E.UNSTABLE_OFFSET_COMMIT)}


def test_batches_are_the_producers_transactional_batches_in_sequence():
    e = Env()
    e.txn_commit({TP: 1, TP1: 2})
    e.txn_commit({TP: 3})
    p = e.c.partition_for(G)
    batches = list(e.log.read_batches(p))
    assert [(b.producer_id, b.producer_epoch, b.base_sequence, b.is_transactional) for b in batches] == \
        [(PID, EPOCH, 0, True), (PID, EPOCH, 2, True)]
    e.marker(commit=True)
    e.txn_commit({TP: 4})                       # the next transaction starts over at sequence 0
    assert list(e.log.read_batches(p))[-1].base_sequence == 0


def test_loading_replays_committed_aborted_and_open_transactions():
    e = Env()
    e.txn_commit({TP: 10})
    e.marker(commit=True)
    e.txn_commit({TP: 20}, pid=PID + 1)
    e.marker(commit=False, pid=PID + 1)
    e.txn_commit({TP1: 30}, pid=PID + 2)      # no marker yet
    e2 = Env(log=e.log)
    assert e2.fetch([TP]) == {TP: (10, E.NONE)}
    assert e2.fetch([TP1], stable=True) == {TP1: (-1, E.UNSTABLE_OFFSET_COMMIT)}
    # the open transaction's producer continues its sequence after the reload
    e2.txn_commit({TP1: 31}, pid=PID + 2)
    assert list(e.log.read_batches(e2.c.partition_for(G)))[-1].base_sequence == 1
    e2.marker(commit=True, pid=PID + 2)
    assert e2.fetch([TP1], stable=True) == {TP1: (31, E.NONE)}


def test_a_later_plain_commit_wins_over_an_earlier_transactional_one():
    e = Env()
    e.txn_commit({TP: 10})
    out = []
    e.c.commit_offsets(G, "", None, -1, {TP: OffsetAndMetadata(99, -1, "", e.now)}, out.append)
    assert out == [{TP: E.NONE}]
    e.marker(commit=True)
    assert e.fetch([TP]) == {TP: (99, E.NONE)}


def test_member_checks():
    e = Env()
    assert e.txn_commit({TP: 1}, member="nobody", gen=3) == {TP: E.UNKNOWN_MEMBER_ID}
    assert e.txn_commit({TP: 1}) == {TP: E.NONE}          # no group management: accepted
    assert e.txn_commit({TP: 1}, group="") == {TP: E.INVALID_GROUP_ID}


def test_a_guard_cleared_by_a_marker_refuses_the_txn_offset_commit(tmp_path):
    """KIP-890 part 1 for TxnOffsetCommit: the guard of __consumer_offsets taken before the
    transaction coordinator confirmed the partition; an ABORT marker written meanwhile
    clears it, so the commit's batch is refused instead of opening a transaction that
    would keep the group's offsets unstable for good."""
    import uuid

    from kbroker.coordinator.group.storage import ReplicaOffsetsLog
    from kbroker.log.manager import LogManager
    from kbroker.server.metadata import TopicImage
    from kbroker.server.purgatory import DelayedOperationPurgatory
    from kbroker.server.replica_manager import ReplicaManager

    lm = LogManager([str(tmp_path)], background=False)
    lm.startup()
    rm = ReplicaManager(None, lm, 0, DelayedOperationPurgatory("Produce", reaper_enabled=False),
                        DelayedOperationPurgatory("Fetch", reaper_enabled=False))
    rm.apply_topic(TopicImage(OFFSETS_TOPIC, uuid.uuid4(), 1))
    c = GroupCoordinator(GroupConfig(offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0),
                         ReplicaOffsetsLog(rm, 5000), reaper_enabled=False)
    c.startup(background=False, enable_retention=False)
    lg = rm.get_partition((OFFSETS_TOPIC, 0)).log
    try:
        def commit(guard, pid):
            out = []
            c.commit_transactional_offsets(G, pid, EPOCH, "", None, -1, {TP: OffsetAndMetadata(5, -1, "", 0)},
                                           out.append, verification_guard=guard)
            return out[0]

        guard = lg.maybe_start_transaction_verification(PID, 0x7FFFFFFF, EPOCH)
        lg.append_end_txn_marker(PID, EPOCH, 0, False)      # the transaction is aborted meanwhile
        assert commit(guard, PID) == {TP: E.INVALID_TXN_STATE}
        assert not lg.has_ongoing_transaction(PID)
        # a guard still current: written, the producer's transaction open in the partition
        guard = lg.maybe_start_transaction_verification(PID + 1, 0x7FFFFFFF, EPOCH)
        assert commit(guard, PID + 1) == {TP: E.NONE}
        assert lg.has_ongoing_transaction(PID + 1)
    finally:
        c.shutdown()
        lm.shutdown()
