"""Transaction version 2 (KIP-890 part 2) in the transaction coordinator: every EndTxn v5
bumps the epoch, the markers carry the bumped epoch, a retry of the last EndTxn is
recognised, a late EndTxn of an earlier transaction is fenced, and the last epoch moves
the producer to a new id (Kafka 4.0's TransactionCoordinator / TransactionMetadata)."""
from __future__ import annotations

import pytest

from kbroker.coordinator.runtime import InMemoryCoordinatorLog
from kbroker.coordinator.transaction.metadata import TransactionState as S
from kbroker.protocol import ErrorCode as E
from tests.test_transaction_coordinator import T0, T1, TID, Env


class Env2(Env):
    def add(self, pid, epoch, parts=(T0,), tid=TID, tv=2):
        out = []
        self.c.handle_add_partitions(tid, pid, epoch, parts, out.append, tv)
        return out[0]

    def end(self, pid, epoch, commit=True, tid=TID, tv=2):
        out = []
        self.c.handle_end_transaction(tid, pid, epoch, commit, lambda *a: out.append(a), tv, with_producer=True)
        assert len(out) == 1
        return out[0]


@pytest.fixture
def env():
    e = Env2()
    yield e
    e.c.shutdown()


def test_end_txn_v5_bumps_the_epoch_and_the_markers_carry_it(env):
    _, pid, epoch = env.init()
    assert env.add(pid, epoch, (T0, T1)) == E.NONE
    assert env.end(pid, epoch) == (E.NONE, pid, epoch + 1)
    (m_pid, m_epoch, commit, _, parts, _), = env.markers.sent
    assert (m_pid, m_epoch, commit, parts) == (pid, epoch + 1, True, {T0, T1})
    assert env.end(pid, epoch) == (E.CONCURRENT_TRANSACTIONS, -1, -1)   # a retry while the markers go out
    env.markers.ack_all()
    md = env.md()
    assert (md.state, md.producer_epoch, md.last_producer_epoch) == (S.COMPLETE_COMMIT, epoch + 1, epoch + 1)
    assert env.end(pid, epoch) == (E.NONE, pid, epoch + 1)              # a retry of the completed commit
    assert env.end(pid, epoch, commit=False) == (E.INVALID_TXN_STATE, -1, -1)
    # the next transaction runs at the bumped epoch; the old epoch can no longer join or end it
    assert env.add(pid, epoch) == E.PRODUCER_FENCED
    assert env.add(pid, epoch + 1, (T1,)) == E.NONE
    assert env.end(pid, epoch) == (E.PRODUCER_FENCED, -1, -1)           # the late EndTxn of the first
    assert env.md().state is S.ONGOING
    assert env.end(pid, epoch + 1, commit=False) == (E.NONE, pid, epoch + 2)
    assert env.markers.sent[-1][:3] == (pid, epoch + 2, False)


def test_transaction_version_1_clients_keep_their_epoch(env):
    _, pid, epoch = env.init()
    assert env.add(pid, epoch, tv=0) == E.NONE
    assert env.end(pid, epoch, tv=0) == (E.NONE, pid, epoch)
    assert env.markers.sent[0][:2] == (pid, epoch)


def test_the_last_epoch_moves_the_producer_to_a_new_id(env):
    _, pid, _ = env.init()
    env.md().producer_epoch = 32766
    assert env.add(pid, 32766) == E.NONE
    err, new_pid, new_epoch = env.end(pid, 32766)
    assert err == E.NONE and new_pid != pid and new_epoch == 0
    assert env.markers.sent[0][:2] == (pid, 32767)      # the markers: the old id at its last epoch
    env.markers.ack_all()
    md = env.md()
    assert (md.producer_id, md.producer_epoch, md.previous_producer_id, md.state) == \
        (new_pid, 0, pid, S.COMPLETE_COMMIT)
    assert env.end(pid, 32766) == (E.NONE, new_pid, 0)   # the retry of that EndTxn
    assert env.add(new_pid, 0) == E.NONE


def test_a_reload_keeps_the_transaction_version_2_state():
    log = InMemoryCoordinatorLog()
    e = Env2(log=log)
    _, pid, epoch = e.init()
    e.add(pid, epoch)
    assert e.end(pid, epoch)[0] == E.NONE        # PrepareCommit at epoch + 1, markers pending
    e.c.shutdown()
    e2 = Env2(log=log)
    try:
        md = e2.md()
        assert (md.state, md.producer_epoch, md.client_transaction_version) == (S.PREPARE_COMMIT, epoch + 1, 2)
        assert e2.markers.sent[0][:3] == (pid, epoch + 1, True)    # resent with the bumped epoch
        assert e2.end(pid, epoch) == (E.CONCURRENT_TRANSACTIONS, -1, -1)
        e2.markers.ack_all()
        assert e2.end(pid, epoch) == (E.NONE, pid, epoch + 1)
    finally:
        e2.c.shutdown()


def test_an_empty_abort_bumps_the_epoch_so_its_late_produce_is_fenced(env):
    """Nothing of the transaction reached the coordinator (its produce is late): the abort
    still bumps the epoch, and the late produce's add is refused."""
    _, pid, epoch = env.init()
    assert env.end(pid, epoch, commit=False) == (E.NONE, pid, epoch + 1)
    assert env.md().state is S.COMPLETE_ABORT and not env.markers.sent
    assert env.add(pid, epoch) == E.PRODUCER_FENCED                     # the late produce of that transaction
    # right after a commit (its markers still out) the empty abort waits (KAFKA-18464)
    assert env.add(pid, epoch + 1) == E.NONE
    assert env.end(pid, epoch + 1) == (E.NONE, pid, epoch + 2)
    assert env.end(pid, epoch + 2, commit=False) == (E.CONCURRENT_TRANSACTIONS, -1, -1)
    env.markers.ack_all()
    assert env.end(pid, epoch + 2, commit=False) == (E.NONE, pid, epoch + 3)
