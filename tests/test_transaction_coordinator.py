"""The transaction coordinator's state machine (kbroker/coordinator/transaction/), with a
fake clock, an in-memory __transaction_state and a fake marker channel.

Error codes per case are Kafka 3.9's (TransactionCoordinator.scala / TransactionMetadata.scala).
"""
from __future__ import annotations

import itertools

import pytest

from kbroker.coordinator.runtime import InMemoryCoordinatorLog
from kbroker.coordinator.transaction import log as txnlog
from kbroker.coordinator.transaction.coordinator import TransactionConfig, TransactionCoordinator
from kbroker.coordinator.transaction.metadata import (
    IllegalTransitionError, TransactionMetadata, TransactionState as S, TxnTransitMetadata,
)
from kbroker.protocol import ErrorCode as E

TID = "txn-1"
T0 = ("t", 0)
T1 = ("t", 1)
U0 = ("u", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


class FakeMarkers:
    """Records every write_markers call; the test answers them."""

    def __init__(self) -> None:
        self.sent = []   # [(pid, epoch, commit, coordinator_epoch, partitions, callback)]
        self.auto = None  # error code to answer at once (None: hold)

    def write_markers(self, producer_id, producer_epoch, commit, coordinator_epoch, partitions, callback):
        self.sent.append((producer_id, producer_epoch, commit, coordinator_epoch, set(partitions), callback))
        if self.auto is not None:
            callback({tp: int(self.auto) for tp in partitions})

    def ack_all(self, code=E.NONE):
        sent, self.sent = self.sent, []
        for *_, parts, cb in sent:
            cb({tp: int(code) for tp in parts})
        return len(sent)


class Env:
    def __init__(self, log=None, num_partitions=4, **cfg):
        self.clock = Clock()
        self.log = log if log is not None else InMemoryCoordinatorLog()
        self.markers = FakeMarkers()
        self.pids = itertools.count(1000)
        cfg.setdefault("transaction_state_log_num_partitions", num_partitions)
        self.c = TransactionCoordinator(TransactionConfig(**cfg), self.log, lambda: next(self.pids), self.markers,
                                        time_ms=self.clock, reaper_enabled=False)
        self.c.startup(background=False)

    def init(self, tid=TID, timeout=60000, expected=None):
        out = []
        self.c.handle_init_producer_id(tid, timeout, expected, out.append)
        assert len(out) == 1
        r = out[0]
        return E(r.error_code), r.producer_id, r.producer_epoch

    def add(self, pid, epoch, parts=(T0,), tid=TID):
        out = []
        self.c.handle_add_partitions(tid, pid, epoch, parts, out.append)
        assert len(out) == 1
        return out[0]

    def end(self, pid, epoch, commit=True, tid=TID):
        out = []
        self.c.handle_end_transaction(tid, pid, epoch, commit, out.append)
        assert len(out) == 1
        return out[0]

    def md(self, tid=TID) -> TransactionMetadata:
        return self.c.metadata(tid)

    def advance(self, ms):
        self.clock.now += ms
        self.c.advance_timers()


@pytest.fixture
def env():
    e = Env()
    yield e
    e.c.shutdown()


# -- InitProducerId ------------------------------------------------------------------------

def test_init_new_id_then_bump_epoch(env):
    err, pid, epoch = env.init()
    assert (err, epoch) == (E.NONE, 0) and pid == 1000
    assert env.md().state is S.EMPTY
    assert env.init() == (E.NONE, pid, 1)      # a new producer instance: epoch bump
    assert env.log.record_count(env.c.partition_for(TID)) == 2


def test_kip360_retry_with_the_old_epoch_gets_the_current_one_again(env):
    _, pid, _ = env.init()                                 # epoch 0
    assert env.init(expected=(pid, 0)) == (E.NONE, pid, 1)  # bump from the expected epoch
    # the response was lost: the producer retries with epoch 0 again, which is now the last epoch
    assert env.init(expected=(pid, 0)) == (E.NONE, pid, 1)
    # another producer bumped (last epoch cleared): the old one is fenced
    assert env.init() == (E.NONE, pid, 2)
    assert env.init(expected=(pid, 0))[0] == E.PRODUCER_FENCED
    assert env.init(expected=(pid + 77, 2))[0] == E.PRODUCER_FENCED  # another producer id


def test_epoch_exhaustion_rotates_the_producer_id(env):
    _, pid, _ = env.init()
    md = env.md()
    md.producer_epoch = 32766
    err, new_pid, epoch = env.init(expected=(pid, 32766))
    assert err == E.NONE and new_pid != pid and epoch == 0
    assert env.md().previous_producer_id == pid
    # a retry from the exhausted epoch of the previous producer id is not fenced
    assert env.init(expected=(pid, 32766))[0] == E.NONE


def test_init_while_ongoing_fences_and_aborts(env):
    _, pid, epoch = env.init()
    assert env.add(pid, epoch, (T0, T1)) == E.NONE
    assert env.init() == (E.CONCURRENT_TRANSACTIONS, -1, -1)
    md = env.md()
    assert md.state is S.PREPARE_ABORT and md.producer_epoch == epoch + 1
    (m_pid, m_epoch, commit, _, parts, _), = env.markers.sent
    assert (m_pid, m_epoch, commit, parts) == (pid, epoch + 1, False, {T0, T1})
    # the fenced producer is refused everywhere
    assert env.add(pid, epoch) == E.PRODUCER_FENCED
    assert env.end(pid, epoch) == E.PRODUCER_FENCED
    # the new producer retries until the abort completes, then gets a second bump
    assert env.init()[0] == E.CONCURRENT_TRANSACTIONS
    env.markers.ack_all()
    assert env.md().state is S.COMPLETE_ABORT
    assert env.init() == (E.NONE, pid, epoch + 2)


def test_failed_fence_write_does_not_bump_the_epoch_twice(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0,))
    env.log.fail_appends(E.NOT_LEADER_OR_FOLLOWER)
    assert env.init()[0] == E.NOT_COORDINATOR
    md = env.md()
    assert md.state is S.ONGOING and md.pending_state is None and md.has_failed_epoch_fence
    assert env.init()[0] == E.CONCURRENT_TRANSACTIONS     # the fence again, with the same bumped epoch
    assert env.md().state is S.PREPARE_ABORT and env.md().producer_epoch == epoch + 1
    env.markers.ack_all()
    assert env.init() == (E.NONE, pid, epoch + 2)


def test_init_errors_before_the_coordinator(env):
    other = Env(num_partitions=4)
    other.c.shutdown()
    assert other.init()[0] == E.COORDINATOR_NOT_AVAILABLE
    p = env.c.partition_for(TID)
    env.c.unload_partition(p)
    assert env.init()[0] == E.NOT_COORDINATOR


def test_failed_write_answers_mapped_error_and_clears_the_pending_state(env):
    env.log.fail_appends(E.NOT_LEADER_OR_FOLLOWER)
    assert env.init()[0] == E.NOT_COORDINATOR
    assert env.md().pending_state is None
    env.log.fail_appends(E.REQUEST_TIMED_OUT)
    assert env.init()[0] == E.COORDINATOR_NOT_AVAILABLE
    assert env.init()[0] == E.NONE


def test_concurrent_init_while_a_write_is_in_flight(env):
    env.log.hold_callbacks(True)
    out = []
    env.c.handle_init_producer_id(TID, 60000, None, out.append)
    assert out == []
    assert env.init()[0] == E.CONCURRENT_TRANSACTIONS
    env.log.hold_callbacks(False)
    env.log.release_callbacks()
    assert out[0].error_code == 0 and out[0].producer_epoch == 0


# -- AddPartitionsToTxn ----------------------------------------------------------------------

def test_add_partitions_checks(env):
    assert env.add(5, 0) == E.INVALID_PRODUCER_ID_MAPPING        # unknown id
    _, pid, epoch = env.init()
    assert env.add(pid + 1, epoch) == E.INVALID_PRODUCER_ID_MAPPING
    assert env.add(pid, epoch + 1) == E.PRODUCER_FENCED
    assert env.add(pid, epoch, tid="") == E.INVALID_REQUEST
    appends = env.log.appends
    assert env.add(pid, epoch, (T0,)) == E.NONE
    md = env.md()
    assert md.state is S.ONGOING and md.topic_partitions == {T0}
    assert md.txn_start_timestamp == env.clock.now
    assert env.add(pid, epoch, (T0,)) == E.NONE and env.log.appends == appends + 1  # already in: nothing written
    env.clock.now += 5
    assert env.add(pid, epoch, (T1, U0)) == E.NONE
    assert env.md().topic_partitions == {T0, T1, U0}
    assert env.md().txn_start_timestamp == env.clock.now - 5


def test_verify_partitions(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0,))
    assert env.c.handle_verify_partitions(TID, pid, epoch, [T0, T1]) == {T0: E.NONE, T1: E.TRANSACTION_ABORTABLE}
    assert env.c.handle_verify_partitions(TID, pid, epoch + 1, [T0]) == {T0: E.PRODUCER_FENCED}
    assert env.c.handle_verify_partitions("nope", pid, epoch, [T0]) == {T0: E.INVALID_PRODUCER_ID_MAPPING}
    env.end(pid, epoch)
    assert env.c.handle_verify_partitions(TID, pid, epoch, [T0]) == {T0: E.CONCURRENT_TRANSACTIONS}


# -- EndTxn and markers ------------------------------------------------------------------------

def test_commit_writes_prepare_then_markers_then_complete(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0, U0))
    assert env.end(pid, epoch, commit=True) == E.NONE
    md = env.md()
    assert md.state is S.PREPARE_COMMIT and md.pending_state is S.COMPLETE_COMMIT
    (m_pid, m_epoch, commit, c_epoch, parts, _), = env.markers.sent
    assert (m_pid, m_epoch, commit, c_epoch, parts) == (pid, epoch, True, 0, {T0, U0})
    # while the markers are out: retriable for a retry of the same EndTxn, refused for the other
    assert env.end(pid, epoch, commit=True) == E.CONCURRENT_TRANSACTIONS
    assert env.add(pid, epoch) == E.CONCURRENT_TRANSACTIONS
    assert env.init()[0] == E.CONCURRENT_TRANSACTIONS
    env.markers.ack_all()
    md = env.md()
    assert md.state is S.COMPLETE_COMMIT and md.pending_state is None and not md.topic_partitions
    assert env.end(pid, epoch, commit=True) == E.NONE            # a retry after completion
    assert env.end(pid, epoch, commit=False) == E.INVALID_TXN_STATE
    # the next transaction starts from CompleteCommit
    assert env.add(pid, epoch, (T1,)) == E.NONE
    assert env.md().state is S.ONGOING


def test_end_txn_errors(env):
    assert env.end(1, 0) == E.INVALID_PRODUCER_ID_MAPPING
    _, pid, epoch = env.init()
    assert env.end(pid, epoch) == E.INVALID_TXN_STATE               # Empty: nothing to end
    env.add(pid, epoch)
    assert env.end(pid + 1, epoch) == E.INVALID_PRODUCER_ID_MAPPING
    assert env.end(pid, epoch - 1 if epoch else 5) == E.PRODUCER_FENCED
    assert env.end(pid, epoch, commit=False) == E.NONE
    # markers out (CompleteAbort pending): anything is retriable until it completes
    assert env.end(pid, epoch, commit=True) == E.CONCURRENT_TRANSACTIONS
    assert env.end(pid, epoch, commit=False) == E.CONCURRENT_TRANSACTIONS
    env.markers.ack_all()
    assert env.end(pid, epoch, commit=True) == E.INVALID_TXN_STATE   # CompleteAbort, then commit
    assert env.end(pid, epoch, commit=False) == E.NONE


def test_marker_errors_retry_skip_or_cancel(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0, T1, U0))
    env.end(pid, epoch)
    (*_, cb), = env.markers.sent
    env.markers.sent.clear()
    cb({T0: int(E.NONE), T1: int(E.NOT_LEADER_OR_FOLLOWER), U0: int(E.UNSUPPORTED_FOR_MESSAGE_FORMAT)})
    assert env.md().topic_partitions == {T1}
    assert env.markers.sent == []                 # retried after the backoff, not at once
    env.advance(100)
    (*_, parts, cb2), = env.markers.sent
    assert parts == {T1}
    env.markers.sent.clear()
    cb2({T1: int(E.NONE)})
    assert env.md().state is S.COMPLETE_COMMIT


def test_marker_cancel_on_coordinator_fenced(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0,))
    env.end(pid, epoch)
    env.markers.ack_all(E.TRANSACTION_COORDINATOR_FENCED)
    env.advance(1000)
    assert env.markers.sent == [] and env.md().state is S.PREPARE_COMMIT


def test_completion_write_is_retried_until_written(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0,))
    env.end(pid, epoch)
    env.log.fail_appends(E.REQUEST_TIMED_OUT, 2)
    env.markers.ack_all()
    assert env.md().state is S.PREPARE_COMMIT and env.md().pending_state is S.COMPLETE_COMMIT
    env.advance(100)
    env.advance(100)
    assert env.md().state is S.COMPLETE_COMMIT


def test_markers_not_sent_after_unload(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0,))
    env.end(pid, epoch)
    env.c.unload_partition(env.c.partition_for(TID))
    env.markers.ack_all()  # answered after the partition moved: ignored
    assert env.c.metadata(TID) is None


# -- loading --------------------------------------------------------------------------------------

def _snapshot(md: TransactionMetadata):
    return (md.producer_id, md.producer_epoch, md.txn_timeout_ms, md.state, frozenset(md.topic_partitions),
            md.txn_start_timestamp, md.txn_last_update_timestamp)


def test_loading_replays_to_the_same_state(env):
    _, pid, epoch = env.init("a")
    env.add(pid, epoch, (T0, U0), tid="a")
    _, pid_b, epoch_b = env.init("b")
    env.add(pid_b, epoch_b, (T1,), tid="b")
    env.end(pid_b, epoch_b, tid="b")
    env.markers.ack_all()
    env.init("c")
    before = {t: _snapshot(env.md(t)) for t in ("a", "b", "c")}
    env2 = Env(log=env.log)
    assert {t: _snapshot(env2.md(t)) for t in ("a", "b", "c")} == before
    assert env2.md("a").state is S.ONGOING and env2.md("b").state is S.COMPLETE_COMMIT
    env2.c.shutdown()


def test_loading_a_prepared_transaction_resends_its_markers_and_completes(env):
    _, pid, epoch = env.init()
    env.add(pid, epoch, (T0, T1))
    env.end(pid, epoch, commit=False)
    assert env.md().state is S.PREPARE_ABORT       # markers never answered: the broker "died"
    env2 = Env(log=env.log)
    (m_pid, m_epoch, commit, c_epoch, parts, _), = env2.markers.sent
    assert (m_pid, m_epoch, commit, parts) == (pid, epoch, False, {T0, T1})
    env2.markers.ack_all()
    assert env2.md().state is S.COMPLETE_ABORT
    # and a third load sees it complete
    env3 = Env(log=env.log)
    assert env3.md().state is S.COMPLETE_ABORT and env3.markers.sent == []
    for e in (env2, env3):
        e.c.shutdown()


def test_reload_bumps_the_coordinator_epoch(env):
    p = env.c.partition_for(TID)
    _, pid, epoch = env.init()
    env.add(pid, epoch)
    env.c.unload_partition(p)
    env.c.load_partition(p)
    env.end(pid, epoch)
    assert env.markers.sent[0][3] == 1
    env.c.unload_partition(p)
    env.c.load_partition(p, coordinator_epoch=7)
    assert env.markers.sent[-1][3] == 7    # the reload resent the prepared markers with the new epoch


def test_coordinator_epoch_is_the_partition_leader_epoch():
    epochs = {}
    env = Env()
    env.c._coordinator_epoch_for = lambda p: epochs.get(p)
    p = env.c.partition_for(TID)
    _, pid, epoch = env.init()
    env.add(pid, epoch)
    epochs[p] = 41
    env.c.unload_partition(p)
    env.c.load_partition(p)
    env.end(pid, epoch)
    assert env.markers.sent[0][3] == 41
    env.c.shutdown()


# -- timeouts and expiry ----------------------------------------------------------------------------

def test_timed_out_transaction_is_aborted_with_a_bumped_epoch():
    env = Env(abort_timed_out_transaction_cleanup_interval_ms=1000)
    _, pid, epoch = env.init(timeout=5000)
    env.add(pid, epoch, (T0,))
    env.advance(1000)
    assert env.md().state is S.ONGOING
    env.advance(5000)
    md = env.md()
    assert md.state is S.PREPARE_ABORT and md.producer_epoch == epoch + 1
    assert env.end(pid, epoch, commit=True) == E.PRODUCER_FENCED
    env.markers.ack_all()
    assert env.md().state is S.COMPLETE_ABORT
    # the producer restarts: InitProducerId bumps again
    assert env.init() == (E.NONE, pid, epoch + 2)
    env.c.shutdown()


def test_idle_transactional_id_expires_with_a_tombstone():
    env = Env(transactional_id_expiration_ms=60_000, remove_expired_transaction_cleanup_interval_ms=10_000)
    _, pid, epoch = env.init()
    env.add(pid, epoch)
    env.end(pid, epoch)
    env.markers.ack_all()
    env.init("other")
    env.advance(50_000)
    assert env.md() is not None
    env.advance(20_000)
    assert env.md() is None and env.md("other") is None
    env2 = Env(log=env.log)
    assert env2.md() is None                                      # the tombstone replays
    assert env2.c.describe_transaction(TID).error == E.TRANSACTIONAL_ID_NOT_FOUND
    env2.pids = itertools.count(5000)
    assert env2.init() == (E.NONE, 5000, 0)                        # a fresh start: a new producer id
    for e in (env, env2):
        e.c.shutdown()


def test_ongoing_transaction_does_not_expire():
    env = Env(transactional_id_expiration_ms=60_000, remove_expired_transaction_cleanup_interval_ms=10_000,
              abort_timed_out_transaction_cleanup_interval_ms=10 ** 9)
    _, pid, epoch = env.init(timeout=10 ** 8)
    env.add(pid, epoch)
    env.advance(200_000)
    assert env.md().state is S.ONGOING
    env.c.shutdown()


# -- Describe / List --------------------------------------------------------------------------------

def test_describe_and_list(env):
    _, pid, epoch = env.init("a")
    env.add(pid, epoch, (T0, U0), tid="a")
    env.init("b")
    d = env.c.describe_transaction("a")
    assert d.error == E.NONE and d.state == "Ongoing" and d.partitions == (T0, U0) and d.producer_id == pid
    assert env.c.describe_transaction("zzz").error == E.TRANSACTIONAL_ID_NOT_FOUND
    assert env.c.describe_transaction("").error == E.INVALID_REQUEST
    err, unknown, txns = env.c.list_transactions()
    assert err == E.NONE and unknown == [] and sorted(t.transactional_id for t in txns) == ["a", "b"]
    err, unknown, txns = env.c.list_transactions(["Ongoing", "Bogus"])
    assert unknown == ["Bogus"] and [t.transactional_id for t in txns] == ["a"]
    assert [t.transactional_id for t in env.c.list_transactions(producer_id_filters=[pid])[2]] == ["a"]
    assert env.c.list_transactions(["Bogus"]) == (E.NONE, ["Bogus"], [])   # unknown filters match nothing
    env.clock.now += 1000
    # Kafka's duration rule: now - start > duration; "b" has no transaction (start -1), so it passes
    assert sorted(t.transactional_id for t in env.c.list_transactions(duration_filter_ms=500)[2]) == ["a", "b"]
    assert [t.transactional_id for t in env.c.list_transactions(duration_filter_ms=5000)[2]] == ["b"]


# -- the state machine itself -----------------------------------------------------------------------

def test_transitions_follow_kafkas_valid_previous_states():
    md = TransactionMetadata("x", 1, -1, 0, -1, 1000, S.EMPTY, txn_last_update_timestamp=0)
    with pytest.raises(IllegalTransitionError):
        md.prepare_abort_or_commit(S.PREPARE_COMMIT, 1)              # Empty -> PrepareCommit
    t = md.prepare_add_partitions({T0}, 5)
    with pytest.raises(IllegalTransitionError):
        md.prepare_add_partitions({T1}, 6)                           # a transition is pending
    md.complete_transition_to(t)
    assert md.state is S.ONGOING and md.txn_start_timestamp == 5
    with pytest.raises(IllegalTransitionError):
        md.prepare_dead()                                            # Ongoing -> Dead
    md.complete_transition_to(md.prepare_abort_or_commit(S.PREPARE_COMMIT, 7))
    with pytest.raises(IllegalTransitionError):
        md.prepare_add_partitions({T1}, 8)                           # PrepareCommit -> Ongoing
    md.remove_partition(T0)
    md.complete_transition_to(md.prepare_complete(9))
    assert md.state is S.COMPLETE_COMMIT and not md.topic_partitions
    with pytest.raises(IllegalTransitionError):
        md.remove_partition(T0)
    assert S.from_name("PrepareEpochFence") is S.PREPARE_EPOCH_FENCE and S.from_id(5) is S.COMPLETE_ABORT


def test_log_records_round_trip():
    for state, parts in ((S.EMPTY, frozenset()), (S.ONGOING, frozenset({T0, T1, U0})),
                         (S.COMPLETE_ABORT, frozenset())):
        t = TxnTransitMetadata(42, -1, 3, -1, 60000, state, parts, 10 if parts else -1, 20)
        key, value = txnlog.record("id", t)
        r = txnlog.read_record(key, value)
        assert r.transactional_id == "id" and r.transit == t
    assert txnlog.read_record(*txnlog.tombstone("id")) == ("id", None)
    # Kafka's layout: int16 version 0 + string; the value of an Empty id has null partitions
    assert txnlog.key_bytes("ab") == b"\x00\x00\x00\x02ab"
    v = txnlog.value_bytes(TxnTransitMetadata(1, -1, 0, -1, 100, S.EMPTY, frozenset(), -1, 5))
    assert v[:2] == b"\x00\x00" and v[2 + 8 + 2 + 4 + 1:2 + 8 + 2 + 4 + 1 + 4] == b"\xff\xff\xff\xff"


# -- the wire marker channel ----------------------------------------------------------------------------

def test_wire_marker_channel_groups_by_leader_and_reads_the_answers():
    from kbroker.coordinator.transaction.markers import WireMarkerChannel
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages import write_txn_markers as w

    leaders = {T0: 1, T1: 2, U0: 1, ("gone", 0): None, ("t", 9): -1}
    sent = []

    class Sender:
        def send(self, node, api_key, req, callback, timeout_s=None):
            sent.append((node, api_key, req, callback))

    ch = WireMarkerChannel(leaders.get, lambda: {1: ("h", 1), 2: ("h", 2)})
    ch._sender_for_send = lambda: Sender()
    got = []
    ch.write_markers(7, 3, True, 5, set(leaders), got.append)
    assert got == [{("gone", 0): 0}, {("t", 9): int(E.NOT_LEADER_OR_FOLLOWER)}]
    by_node = {node: req for node, _, req, _ in sent}
    assert {n for n, k, _, _ in sent if k == ApiKey.WRITE_TXN_MARKERS} == {1, 2}
    (m,) = by_node[1].markers
    assert (m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch) == (7, 3, True, 5)
    assert sorted((t.name, list(t.partition_indexes)) for t in m.topics) == [("t", [0]), ("u", [0])]
    got.clear()
    cb1 = next(cb for node, _, _, cb in sent if node == 1)
    cb2 = next(cb for node, _, _, cb in sent if node == 2)
    cb1(w.WriteTxnMarkersResponse(markers=[w.WritableTxnMarkerResult(producer_id=7, topics=[
        w.WritableTxnMarkerTopicResult(name="t", partitions=[
            w.WritableTxnMarkerPartitionResult(partition_index=0, error_code=0)])])]), None)
    cb2(None, OSError("connection refused"))
    # a partition the answer left out, and a failed request, are retriable
    assert got == [{T0: 0, U0: int(E.REQUEST_TIMED_OUT)}, {T1: int(E.REQUEST_TIMED_OUT)}]
