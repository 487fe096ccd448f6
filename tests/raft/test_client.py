"""KafkaRaftClient, driven by hand: elections, replication, commit, and each RPC's error paths."""
import random

import pytest

from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import fetch as fm
from kbroker.protocol.messages.leader_change_message import LeaderChangeMessage
from kbroker.raft import messages as M
from kbroker.raft.client import KafkaRaftClient, Listener, NotLeaderError
from kbroker.raft.quorum_state import ElectionState, Candidate, Follower, Leader, MemoryQuorumStateStore, Resigned, Unattached
from kbroker.raft.replicated_log import LEADER_CHANGE, MemoryLog, build_batch

CID = "test-cluster"


class Recorder(Listener):
    def __init__(self):
        self.committed = []
        self.leaders = []

    def handle_commit(self, batches):
        for b in batches:
            self.committed.extend((b.base_offset + i, b.epoch, v) for i, v in enumerate(b.records))

    def handle_leader_change(self, leader_id, epoch):
        self.leaders.append((leader_id, epoch))


class Cluster:
    """Clients wired by a perfect network that delivers through the codecs, in order."""

    def __init__(self, voters=(1, 2, 3), observers=(), seed=0, setup=None):
        self.now = 0
        self.clients = {}
        self.listeners = {}
        self.queue = []
        self.down = set()
        for i in list(voters) + list(observers):
            self.listeners[i] = Recorder()
            log, store = MemoryLog(), MemoryQuorumStateStore()
            if setup:
                setup(i, log, store)
            self.clients[i] = KafkaRaftClient(i, voters, CID, log, store,
                                              self.listeners[i], random.Random(seed * 100 + i))
            self.queue.extend((i, o) for o in self.clients[i].start(0))

    def deliver(self, limit=10000):
        n = 0
        while self.queue and n < limit:
            src, o = self.queue.pop(0)
            n += 1
            if o.destination in self.down or src in self.down:
                continue
            msg = M.decode(o.message.API_KEY, o.is_request, M.encode(o.message))
            outs = self.clients[o.destination].handle(self.now, M.Inbound(src, o.correlation_id, msg))
            self.queue.extend((o.destination, x) for x in outs)

    def advance(self, ms, step=10):
        end = self.now + ms
        while self.now < end:
            self.now += step
            for i, c in self.clients.items():
                if i not in self.down and c.next_deadline() <= self.now:
                    self.queue.extend((i, o) for o in c.poll(self.now))
            self.deliver()

    def leader(self):
        ls = [c for i, c in self.clients.items() if c.is_leader and i not in self.down]
        return ls[0] if len(ls) == 1 else None


def elect(cluster, ms=5000):
    for _ in range(ms // 100):
        cluster.advance(100)
        if cluster.leader() is not None:
            return cluster.leader()
    raise AssertionError("no leader")


def test_a_leader_is_elected_writes_leader_change_and_commits_it():
    c = Cluster()
    lead = elect(c)
    c.advance(200)
    b = lead.log.batches[0]
    assert b.control_type == LEADER_CHANGE and b.epoch == lead.quorum.epoch == 1
    assert LeaderChangeMessage.decode(b.records[0], 0).leader_id == lead.node_id
    for i, cl in c.clients.items():
        assert cl.high_watermark == 1, i
        assert cl.leader_and_epoch == (lead.node_id, 1)
        assert c.listeners[i].leaders[-1] == (lead.node_id, 1)


def test_appends_commit_on_every_voter_and_observer_in_order():
    c = Cluster(observers=(100,))
    lead = elect(c)
    offs = [lead.schedule_append(lead.quorum.epoch, [b"a%d" % i, b"b%d" % i], c.now) for i in range(5)]
    assert offs == list(range(2, 12, 2))
    c.advance(300)
    for i, lst in c.listeners.items():
        data = [v for _, _, v in lst.committed[1:]]
        assert data == [x for i in range(5) for x in (b"a%d" % i, b"b%d" % i)], i
    with pytest.raises(NotLeaderError):
        c.clients[[i for i in (1, 2, 3) if i != lead.node_id][0]].schedule_append(1, [b"x"], c.now)
    with pytest.raises(NotLeaderError):
        lead.schedule_append(lead.quorum.epoch + 1, [b"x"], c.now)


def test_a_follower_that_hears_nothing_becomes_candidate_and_a_new_leader_takes_over():
    c = Cluster()
    lead = elect(c)
    lead.schedule_append(lead.quorum.epoch, [b"x"], c.now)
    c.advance(200)
    c.down.add(lead.node_id)
    c.advance(4000)
    new = c.leader()
    assert new is not None and new.node_id != lead.node_id and new.quorum.epoch > 1
    # the old leader, back, learns the new epoch and follows (its uncommitted tail goes)
    c.down.discard(lead.node_id)
    c.advance(3000)
    assert isinstance(lead.quorum.state, Follower) and lead.quorum.state.leader_id == new.node_id
    assert [v for _, _, v in c.listeners[lead.node_id].committed if v == b"x"] == [b"x"]


def test_leader_resigns_without_a_majority_check_quorum():
    c = Cluster()
    lead = elect(c)
    others = [i for i in (1, 2, 3) if i != lead.node_id]
    c.down.update(others)
    c.advance(2900)
    assert isinstance(lead.quorum.state, Leader)
    c.advance(700)                         # 1.5 x fetch timeout after the last fetch
    assert isinstance(lead.quorum.state, Resigned)


def test_graceful_shutdown_resigns_and_the_preferred_successor_is_elected_at_once():
    c = Cluster()
    lead = elect(c)
    c.advance(100)
    c.queue.extend((lead.node_id, o) for o in lead.shutdown(c.now))
    assert any(type(o.message).__name__ == "EndQuorumEpochRequest" for _, o in c.queue)
    c.deliver()
    c.advance(100)
    new = c.leader()
    assert new is not None and new.node_id != lead.node_id and c.now < 1500


def test_follower_truncates_on_diverging_epoch():
    def setup(i, log, store):
        # everyone saw epoch 1; node 3 holds an uncommitted epoch-1 batch no one else has
        store.write(ElectionState(1, voters=frozenset({1, 2, 3})))
        if i == 3:
            log.append_as_leader([b"ghost", b"ghost2"], 1)
            log.flush()
    c = Cluster(setup=setup)
    c.down.add(3)
    lead = elect(c)
    assert lead.quorum.epoch == 2 and lead.node_id != 3
    lead.schedule_append(2, [b"real"], c.now)
    c.down.discard(3)
    c.advance(300)
    f = c.clients[3]
    assert [r for b in f.log.batches for r in b.records][1:] == [b"real"]
    assert [v for _, _, v in c.listeners[3].committed][1:] == [b"real"]


def test_hw_needs_an_entry_of_the_current_epoch():
    from kbroker.raft.quorum_state import Leader as L
    st = L(epoch=3, local_id=1, voters=frozenset({1, 2, 3}), epoch_start_offset=10, granting=frozenset({1, 2}))
    st.update_end_offset(1, 10, 0)
    assert not st.update_end_offset(2, 10, 0)          # a majority holds 10, all from older epochs
    assert st.high_watermark is None
    assert st.update_end_offset(2, 11, 0) and st.high_watermark == 10 or st.high_watermark is None
    st.update_end_offset(1, 11, 0)
    assert st.high_watermark == 11
    assert not st.update_end_offset(2, 10, 0)          # never goes back
    assert st.high_watermark == 11
    st.commit_requires_current_epoch = False           # the classic bug the hook injects
    st2 = L(epoch=3, local_id=1, voters=frozenset({1, 2, 3}), epoch_start_offset=10, granting=frozenset({1, 2}))
    st2.commit_requires_current_epoch = False
    st2.update_end_offset(1, 10, 0)
    st2.update_end_offset(2, 10, 0)
    assert st2.high_watermark == 10


# -- error paths: rejected, logged, quorum undisturbed ----------------------------------------------

@pytest.fixture
def settled():
    c = Cluster()
    lead = elect(c)
    c.advance(200)
    follower = c.clients[[i for i in (1, 2, 3) if i != lead.node_id][0]]
    return c, lead, follower


def snapshot(cl):
    return (cl.quorum.epoch, cl.quorum.leader_id, type(cl.quorum.state), cl.quorum.store.writes)


def ask(c, target, src, msg):
    msg = M.decode(msg.API_KEY, True, M.encode(msg))
    outs = target.handle(c.now, M.Inbound(src, 4242, msg))
    resp = [o for o in outs if o.correlation_id == 4242 and o.destination == src]
    return resp[0].message if resp else None


def part(resp):
    return resp.topics[0].partitions[0]


def vote(cluster_id=CID, epoch=5, cand=2, last_epoch=1, last_offset=1, voter=-1):
    return M.vote_request(cluster_id, voter, epoch, cand, last_epoch, last_offset)


@pytest.mark.parametrize("msg,top,err", [
    (vote(cluster_id="other"), E.INCONSISTENT_CLUSTER_ID, None),
    (vote(epoch=3), E.NONE, E.FENCED_LEADER_EPOCH),
    (vote(cand=7), E.NONE, E.INCONSISTENT_VOTER_SET),
    (vote(last_epoch=5), E.NONE, E.INVALID_REQUEST),
    (vote(last_offset=-1), E.NONE, E.INVALID_REQUEST),
    (vote(voter=3), E.NONE, E.INVALID_VOTER_KEY),
])
def test_vote_errors(settled, msg, top, err):
    c, lead, f = settled
    target = c.clients[1] if 1 != lead.node_id else c.clients[2]
    if err == E.INVALID_VOTER_KEY:
        target = c.clients[[i for i in (1, 2, 3) if i != 3][0]]
    if err == E.FENCED_LEADER_EPOCH:
        target.quorum.to_unattached(4, c.now + 10000)     # the voter is at epoch 4 already
    before = snapshot(target)
    resp = ask(c, target, 2 if err != E.INCONSISTENT_VOTER_SET else 7, msg)
    assert resp.error_code == top
    if err is not None:
        assert part(resp).error_code == err and not part(resp).vote_granted
    if err != E.INVALID_VOTER_KEY:
        assert snapshot(target) == before


def test_vote_from_a_non_voter_leaves_an_unattached_voter_alone():
    c = Cluster()
    v = c.clients[1]
    before = snapshot(v)
    resp = ask(c, v, 9, vote(epoch=10, cand=9, last_epoch=0, last_offset=0))
    assert part(resp).error_code == E.INCONSISTENT_VOTER_SET and v.quorum.epoch == 0
    assert snapshot(v) == before


def test_vote_granted_once_per_epoch_and_only_to_an_up_to_date_log():
    c = Cluster()
    v = c.clients[1]
    v.log.append_as_leader([b"x"], 1)
    r = ask(c, v, 2, vote(epoch=2, cand=2, last_epoch=0, last_offset=0))
    assert part(r).error_code == E.NONE and not part(r).vote_granted       # log behind ours
    r = ask(c, v, 2, vote(epoch=2, cand=2, last_epoch=1, last_offset=1))
    assert part(r).vote_granted and v.quorum.state.voted_id == 2
    assert part(ask(c, v, 2, vote(epoch=2, cand=2, last_epoch=1, last_offset=1))).vote_granted   # same again
    r = ask(c, v, 3, vote(epoch=2, cand=3, last_epoch=1, last_offset=5))
    assert not part(r).vote_granted                                         # one vote per epoch
    assert v.quorum.store.state.voted_id == 2


def test_begin_quorum_epoch_errors(settled):
    c, lead, f = settled
    before = snapshot(f)
    r = ask(c, f, 9, M.begin_quorum_epoch_request("other", -1, lead.node_id, 9))
    assert r.error_code == E.INCONSISTENT_CLUSTER_ID
    r = ask(c, f, 9, M.begin_quorum_epoch_request(CID, -1, 9, 9))
    assert part(r).error_code == E.INCONSISTENT_VOTER_SET
    r = ask(c, f, lead.node_id, M.begin_quorum_epoch_request(CID, -1, lead.node_id, 0))
    assert part(r).error_code == E.FENCED_LEADER_EPOCH and part(r).leader_epoch == 1
    assert snapshot(f) == before


def test_end_quorum_epoch_errors(settled):
    c, lead, f = settled
    before = snapshot(f)
    assert ask(c, f, 9, M.end_quorum_epoch_request("x", 9, 1, [])).error_code == E.INCONSISTENT_CLUSTER_ID
    assert part(ask(c, f, 9, M.end_quorum_epoch_request(CID, 9, 1, []))).error_code == E.INCONSISTENT_VOTER_SET
    assert part(ask(c, f, 2, M.end_quorum_epoch_request(CID, lead.node_id, 0, []))).error_code == \
        E.FENCED_LEADER_EPOCH
    assert snapshot(f) == before


def fetch(epoch=1, offset=0, last_epoch=0, cluster_id=CID, replica=100, max_wait=0):
    return M.fetch_request(cluster_id, replica, epoch, offset, last_epoch, max_wait)


def fpart(resp):
    return resp.responses[0].partitions[0]


def test_fetch_errors(settled):
    c, lead, f = settled
    before = snapshot(lead)
    assert ask(c, lead, 100, fetch(cluster_id="x")).error_code == E.INCONSISTENT_CLUSTER_ID
    r = ask(c, lead, 100, fetch(epoch=0))
    assert fpart(r).error_code == E.FENCED_LEADER_EPOCH
    assert (fpart(r).current_leader.leader_id, fpart(r).current_leader.leader_epoch) == (lead.node_id, 1)
    assert fpart(ask(c, lead, 100, fetch(epoch=2))).error_code == E.UNKNOWN_LEADER_EPOCH
    assert fpart(ask(c, lead, 100, fetch(last_epoch=3))).error_code == E.INVALID_REQUEST
    assert fpart(ask(c, lead, 100, fetch(offset=-1))).error_code == E.INVALID_REQUEST
    assert fpart(ask(c, f, 100, fetch())).error_code == E.NOT_LEADER_OR_FOLLOWER
    wrong = fetch()
    wrong.topics[0].topic_id = M.METADATA_TOPIC_ID.__class__(int=7)
    assert ask(c, lead, 100, wrong).error_code == E.INVALID_REQUEST
    assert snapshot(lead) == before


def test_fetch_answers_records_or_the_diverging_epoch(settled):
    c, lead, f = settled
    r = fpart(ask(c, lead, 100, fetch()))
    assert r.error_code == 0 and r.high_watermark == 1 and r.records
    r = fpart(ask(c, lead, 100, fetch(offset=5, last_epoch=1)))
    assert (r.diverging_epoch.epoch, r.diverging_epoch.end_offset) == (1, 1) and not r.records


def test_fetch_long_poll_parks_until_data_or_max_wait(settled):
    c, lead, f = settled
    req = fetch(offset=1, last_epoch=1, max_wait=500)
    msg = M.decode(req.API_KEY, True, M.encode(req))
    outs = lead.handle(c.now, M.Inbound(100, 76, msg))
    assert [o for o in outs if o.correlation_id == 76]       # a high watermark it has not seen
    outs = lead.handle(c.now, M.Inbound(100, 77, msg))
    assert not [o for o in outs if o.correlation_id == 77]   # nothing new: parked
    lead.schedule_append(1, [b"x"], c.now)
    outs = lead.poll(c.now + 30)
    got = [o for o in outs if o.correlation_id == 77]
    assert got and fpart(got[0].message).records
    # with nothing new it is answered, empty, after max wait
    outs = lead.handle(c.now + 40, M.Inbound(100, 78, M.decode(req.API_KEY, True, M.encode(
        fetch(offset=2, last_epoch=1, max_wait=500)))))
    outs = [o for o in outs if o.correlation_id == 78]
    if not outs:
        assert lead.next_deadline() <= c.now + 540
        outs = [o for o in lead.poll(c.now + 540) if o.correlation_id == 78]
    assert outs and not fpart(outs[0].message).records


# -- the current-epoch commit rule (Raft's "Figure 8"), scripted --------------------------------------

def agree(listeners):
    """The committed prefixes of all replicas agree (what the simulation's oracle checks)."""
    seen = {}
    for lst in listeners:
        for off, epoch, v in lst.committed:
            if seen.setdefault(off, (epoch, v)) != (epoch, v):
                return False
    return True


def figure_8(bugs=frozenset()):
    """Node 1 holds an old-epoch record X no one else has; it wins an election and copies X
    to node 3 (one batch per fetch), then crashes before node 3 gets its new epoch's first
    record. Node 2, whose log ends in a newer epoch than X's, then wins and overwrites X.
    X was safe to overwrite only if it was never committed: a leader must not count X
    as committed before an entry of its own epoch is on a majority."""
    lc = bytes(LeaderChangeMessage(version=0, leader_id=1).encode(0))

    def setup(i, log, store):
        log.append_as_leader([lc], 1, LEADER_CHANGE)           # committed everywhere
        if i == 1:
            log.append_as_leader([b"X"], 1)                     # never replicated
        if i == 2:
            log.append_as_leader([lc], 2, LEADER_CHANGE)       # node 2 led epoch 2, alone
        log.flush()
        store.write(ElectionState(2, 2 if i == 2 else -1, 2 if i in (2, 3) else -1, frozenset({1, 2, 3})))

    c = Cluster(setup=setup, seed=3)
    for cl in c.clients.values():
        cl.bugs = frozenset(bugs)
        cl.config.fetch_max_bytes = 1
    c.down.add(2)
    one = c.clients[1]
    # elect node 1 (node 3's log is behind its own, so only node 1 can win), step by step so
    # that node 1 crashes the moment its high watermark covers X
    crashed = False
    for _ in range(2000):
        c.now += 5
        for i, cl in c.clients.items():
            if i not in c.down and cl.next_deadline() <= c.now:
                c.queue.extend((i, o) for o in cl.poll(c.now))
        while c.queue and not crashed:
            c.deliver(limit=1)
            if one.high_watermark >= 2 and c.clients[3].log.end_offset <= 2:
                c.down.add(1)          # crash: its answer to node 3 is lost with it
                crashed = True
        if crashed or one.high_watermark >= 3:
            break
    c.queue.clear()
    # node 2 comes back (from what it fsynced) and is elected with node 3's vote
    c.down.add(1)
    c.down.discard(2)
    c.clients[2] = KafkaRaftClient(2, (1, 2, 3), CID, c.clients[2].log.crash(), c.clients[2].quorum.store,
                                   c.listeners[2], random.Random(7))
    c.clients[2].start(c.now)
    c.advance(6000)
    assert c.clients[2].is_leader or c.clients[3].is_leader
    return crashed, agree(c.listeners.values()), c


def test_leader_commits_only_after_an_entry_of_its_own_epoch():
    crashed, ok, c = figure_8()
    assert not crashed and ok           # node 1 never counted X as committed too early
    assert (1, 1, b"X") in c.listeners[3].committed    # X commits once node 1's epoch record did


def test_figure_8_bug_is_caught():
    crashed, ok, _ = figure_8({"commit_without_current_epoch"})
    assert crashed and not ok           # X was committed by node 1, then overwritten by node 2


def test_describe_quorum(settled):
    c, lead, f = settled
    lead.schedule_append(1, [b"x"], c.now)
    c.advance(100)
    r = ask(c, lead, 50, M.describe_quorum_request())
    p = r.topics[0].partitions[0]
    assert (p.error_code, p.leader_id, p.leader_epoch, p.high_watermark) == (0, lead.node_id, 1, 2)
    assert [v.replica_id for v in p.current_voters] == [1, 2, 3]
    assert all(v.log_end_offset == 2 and v.last_caught_up_timestamp > 0 for v in p.current_voters)
    assert p.observers == []
    r = ask(c, f, 50, M.describe_quorum_request())
    assert r.topics[0].partitions[0].error_code == E.NOT_LEADER_OR_FOLLOWER
    bad = M.describe_quorum_request()
    bad.topics[0].topic_name = "other"
    assert ask(c, lead, 50, bad).topics[0].partitions[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION


def test_observers_replicate_but_do_not_count():
    c = Cluster(observers=(100,))
    lead = elect(c)
    others = [i for i in (1, 2, 3) if i != lead.node_id]
    c.down.update(others)                      # only the leader and the observer are up
    lead.schedule_append(lead.quorum.epoch, [b"x"], c.now)
    c.advance(300)
    assert c.clients[100].log.end_offset == lead.log.end_offset == 2
    assert lead.high_watermark == 1            # the observer's copy does not commit it
    p = ask(c, lead, 50, M.describe_quorum_request()).topics[0].partitions[0]
    assert [o.replica_id for o in p.observers] == [100]


def test_fetch_snapshot_and_its_errors(settled):
    from kbroker.raft.replicated_log import OffsetAndEpoch
    c, lead, f = settled
    for k in range(5):
        lead.schedule_append(1, [b"r%d" % k], c.now)
        c.advance(30)
    c.advance(200)
    snap = lead.create_snapshot(lead.high_watermark, b"S" * 2500)
    assert snap == OffsetAndEpoch(6, 1) and lead.log.start_offset == 6
    # a fetch from below the snapshot is told to fetch the snapshot
    r = fpart(ask(c, lead, 100, fetch(offset=0, last_epoch=0)))
    assert (r.snapshot_id.end_offset, r.snapshot_id.epoch) == (6, 1) and not r.records

    def fsreq(epoch=1, sid=snap, pos=0, cid=CID):
        return M.fetch_snapshot_request(cid, 100, epoch, sid, pos, 1000)
    rp = ask(c, lead, 100, fsreq()).topics[0].partitions[0]
    assert (rp.error_code, rp.size, rp.position, len(rp.unaligned_records)) == (0, 2500, 0, 1000)
    rp = ask(c, lead, 100, fsreq(pos=2000)).topics[0].partitions[0]
    assert len(rp.unaligned_records) == 500
    assert ask(c, lead, 100, fsreq(pos=2501)).topics[0].partitions[0].error_code == E.POSITION_OUT_OF_RANGE
    assert ask(c, lead, 100, fsreq(sid=OffsetAndEpoch(5, 1))).topics[0].partitions[0].error_code == \
        E.SNAPSHOT_NOT_FOUND
    assert ask(c, lead, 100, fsreq(epoch=0)).topics[0].partitions[0].error_code == E.FENCED_LEADER_EPOCH
    assert ask(c, lead, 100, fsreq(epoch=2)).topics[0].partitions[0].error_code == E.UNKNOWN_LEADER_EPOCH
    assert ask(c, f, 100, fsreq()).topics[0].partitions[0].error_code == E.NOT_LEADER_OR_FOLLOWER
    assert ask(c, lead, 100, fsreq(cid="x")).error_code == E.INCONSISTENT_CLUSTER_ID


def test_a_new_observer_catches_up_from_the_snapshot():
    c = Cluster(observers=(100,))
    c.down.add(100)
    lead = elect(c)
    for k in range(5):
        lead.schedule_append(lead.quorum.epoch, [b"r%d" % k], c.now)
        c.advance(30)
    c.advance(200)
    loaded = []
    c.listeners[100].handle_load_snapshot = lambda sid, data: loaded.append((sid, data))
    lead.create_snapshot(lead.high_watermark, b"state-at-6")
    lead.schedule_append(lead.quorum.epoch, [b"after"], c.now)
    c.down.discard(100)
    c.advance(500)
    o = c.clients[100]
    assert loaded == [((6, 1), b"state-at-6")]
    assert o.log.start_offset == 6 and o.high_watermark == 7
    assert [v for _, _, v in c.listeners[100].committed] == [b"after"]
