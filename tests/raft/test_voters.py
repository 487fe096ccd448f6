"""KIP-853 dynamic quorums in the pure Raft client: the voter set from the bootstrap snapshot
and the VotersRecords of the log, AddRaftVoter / RemoveRaftVoter at the leader with Kafka's
checks and error codes, a leader removing itself, restarts and truncations.

A small deterministic harness: every message goes through its codec, the clock advances in
5 ms steps, nothing is dropped (the seeded fault simulation covers the static protocol)."""
from __future__ import annotations

import base64
import random
import uuid

from kbroker.metadata.bootstrap import DynamicVoter, encode_voters_snapshot
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import add_raft_voter as arv
from kbroker.protocol.messages import remove_raft_voter as rrv
from kbroker.raft import messages as M
from kbroker.raft.client import KafkaRaftClient, Listener, RaftConfig
from kbroker.raft.messages import Inbound, Outbound
from kbroker.raft.quorum_state import Leader, MemoryQuorumStateStore
from kbroker.raft.replicated_log import MemoryLog, OffsetAndEpoch
from kbroker.raft.voter_set import KRAFT_VOTERS, VoterHistory, VoterNode, VoterSet, snapshot_control_records

CLUSTER = "voters-test-cluster-00"
ADMIN = -100
DIRS = {i: uuid.UUID(int=0x1000 + i) for i in range(1, 6)}


def ep(i):
    return (("CONTROLLER", "127.0.0.1", 9000 + i),)


class Recorder(Listener):
    def __init__(self):
        self.control_appends = []

    def handle_control_append(self, last_offset):
        self.control_appends.append(last_offset)


class Net:
    def __init__(self, seed=1):
        self.now = 0
        self.clients: dict[int, KafkaRaftClient] = {}
        self.down: set[int] = set()
        self.queue: list[Outbound] = []      # (source, Outbound)
        self.admin_inbox: dict[int, object] = {}
        self.rng = random.Random(seed)
        self._corr = 10_000

    def node(self, i, voters=(), bootstrap_snapshot=None, bootstrap_ids=(), log=None, store=None):
        lg = log or MemoryLog()
        if bootstrap_snapshot is not None:
            lg.snapshot = (OffsetAndEpoch(0, 0), bootstrap_snapshot)
        c = KafkaRaftClient(i, voters, CLUSTER, lg, store or MemoryQuorumStateStore(), Recorder(),
                            random.Random(self.rng.random()), RaftConfig(), bootstrap_ids=bootstrap_ids,
                            directory_id=DIRS[i], listener_name="CONTROLLER", endpoints=ep(i))
        self.clients[i] = c
        self.down.discard(i)
        self._send(i, c.start(self.now))
        return c

    def _send(self, src, outs):
        for o in outs:
            self.queue.append((src, o))

    def step(self):
        q, self.queue = self.queue, []
        for src, o in q:
            msg = M.decode(type(o.message).API_KEY, o.is_request, M.encode(o.message))
            if o.destination == ADMIN:
                self.admin_inbox[o.correlation_id] = msg
                continue
            if o.destination in self.down or src in self.down or o.destination not in self.clients:
                continue
            self._send(o.destination, self.clients[o.destination].handle(self.now, Inbound(src, o.correlation_id, msg)))
        for i, c in self.clients.items():
            if i not in self.down:
                self._send(i, c.poll(self.now))
        self.now += 5

    def run_until(self, cond, timeout_ms=20_000, what="condition"):
        end = self.now + timeout_ms
        while self.now < end:
            if cond():
                return
            self.step()
        raise AssertionError(f"{what} not reached in {timeout_ms} ms (simulated)")

    def leader(self):
        ls = [i for i, c in self.clients.items() if i not in self.down and isinstance(c.quorum.state, Leader)]
        return ls[0] if len(ls) == 1 else None

    def request(self, dest, msg):
        """Send an admin request; the response when it comes."""
        self._corr += 1
        corr = self._corr
        self._send(dest, self.clients[dest].handle(self.now, Inbound(ADMIN, corr, msg)))
        self.run_until(lambda: corr in self.admin_inbox, what="an answer")
        return self.admin_inbox.pop(corr)


def add_request(i, directory=None):
    return arv.AddRaftVoterRequest(cluster_id=CLUSTER, timeout_ms=30000, voter_id=i,
                                   voter_directory_id=directory or DIRS[i],
                                   listeners=[arv.Listener(name=n, host=h, port=p) for n, h, p in ep(i)])


def remove_request(i, directory=None):
    return rrv.RemoveRaftVoterRequest(cluster_id=CLUSTER, voter_id=i, voter_directory_id=directory or DIRS[i])


def kafka_uuid(u):
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def standalone_snapshot(ids=(1,)):
    return encode_voters_snapshot({i: DynamicVoter(i, "127.0.0.1", 9000 + i, kafka_uuid(DIRS[i])) for i in ids},
                                  "CONTROLLER", 1, 0)


def dynamic_net(observers=(2, 3)):
    net = Net()
    net.node(1, bootstrap_snapshot=standalone_snapshot())
    for i in observers:
        net.node(i, bootstrap_ids=(1,))
    net.run_until(lambda: net.leader() == 1 and net.clients[1].quorum.state.high_watermark is not None,
                  what="node 1 leads")
    return net


def voter_ids(c):
    return sorted(c.voters)


def test_standalone_leader_writes_the_voter_set_into_the_log_and_observers_learn_it():
    net = dynamic_net()
    leader = net.clients[1]
    assert leader.kraft_version == 1 and voter_ids(leader) == [1]
    kinds = [b.control_type for b in leader.log.read(0, 1 << 30)]
    assert kinds[:3] == [2, 5, 6]            # LeaderChange, KRaftVersion, Voters at the epoch start
    net.run_until(lambda: all(voter_ids(net.clients[i]) == [1] for i in (2, 3)), what="observers learn voters")
    assert not net.clients[2].quorum.is_voter


def test_add_two_voters_one_at_a_time_then_the_majority_commits():
    net = dynamic_net()
    net.run_until(lambda: all(net.clients[1].quorum.state.observers.get(i) and
                              net.clients[1].quorum.state.observers[i].last_caught_up_ms >= 0 for i in (2, 3)),
                  what="observers caught up")
    t0 = net.now
    r = net.request(1, add_request(2))
    assert r.error_code == E.NONE, r
    took_ms = net.now - t0
    assert voter_ids(net.clients[1]) == [1, 2]
    net.run_until(lambda: net.clients[2].quorum.is_voter, what="node 2 knows it is a voter")
    r = net.request(1, add_request(3))
    assert r.error_code == E.NONE, r
    net.run_until(lambda: all(voter_ids(c) == [1, 2, 3] for c in net.clients.values()), what="all see 3 voters")
    print("add-voter commit: %d ms simulated" % took_ms)
    assert took_ms < 2000
    # the quorum of three commits without node 1 now: a record appended commits with 2 of 3
    d = net.clients[1].describe_quorum(net.now)
    part = d.topics[0].partitions[0]
    assert [v.replica_id for v in part.current_voters] == [1, 2, 3]
    assert [v.replica_directory_id for v in part.current_voters] == [DIRS[1], DIRS[2], DIRS[3]]
    assert [n.node_id for n in d.nodes] == [1, 2, 3] and d.nodes[1].listeners[0].port == 9002


def test_add_voter_errors_as_kafka():
    net = dynamic_net(observers=(2, 3))
    net.run_until(lambda: 2 in net.clients[1].quorum.state.observers and
                  net.clients[1].quorum.state.observers[2].last_caught_up_ms >= 0, what="2 caught up")
    assert net.request(2, add_request(3)).error_code == E.NOT_LEADER_OR_FOLLOWER
    assert net.request(1, add_request(1)).error_code == E.DUPLICATE_VOTER
    # an unknown node (never fetched) is "lagging behind"
    r = net.request(1, add_request(4))
    assert r.error_code == E.REQUEST_TIMED_OUT and "lagging" in r.error_message
    # the directory id must be the one it fetches with
    assert net.request(1, add_request(2, uuid.UUID(int=99))).error_code == E.REQUEST_TIMED_OUT
    # no endpoint on the controller listener
    bad = add_request(2)
    bad.listeners = [arv.Listener(name="OTHER", host="h", port=1)]
    assert net.request(1, bad).error_code == E.INVALID_REQUEST
    # one change at a time: the second, sent before the first commits, times out at once
    net._corr += 1
    first = net._corr
    net._send(1, net.clients[1].handle(net.now, Inbound(ADMIN, first, add_request(2))))
    net._corr += 1
    second = net._corr
    net._send(1, net.clients[1].handle(net.now, Inbound(ADMIN, second, add_request(3))))
    net.run_until(lambda: first in net.admin_inbox and second in net.admin_inbox, what="both answers")
    assert net.admin_inbox[second].error_code == E.REQUEST_TIMED_OUT
    assert "previous voter change" in net.admin_inbox[second].error_message
    assert net.admin_inbox[first].error_code == E.NONE


def test_static_quorum_refuses_voter_changes():
    net = Net()
    for i in (1, 2, 3):
        net.node(i, voters=(1, 2, 3))
    net.run_until(lambda: net.leader() is not None and
                  net.clients[net.leader()].quorum.state.high_watermark is not None, what="a leader")
    lead = net.leader()
    r = net.request(lead, add_request(4))
    assert r.error_code == E.UNSUPPORTED_VERSION and "kraft.version feature is 0" in r.error_message
    assert net.request(lead, remove_request(1)).error_code == E.UNSUPPORTED_VERSION
    assert all(b.control_type != KRAFT_VOTERS for b in net.clients[lead].log.read(0, 1 << 30))


def _three_voters():
    net = dynamic_net()
    for i in (2, 3):
        net.run_until(lambda: net.clients[1].quorum.state.observers.get(i) is not None and
                      net.clients[1].quorum.state.observers[i].last_caught_up_ms >= 0, what=f"{i} caught up")
        assert net.request(1, add_request(i)).error_code == E.NONE
    net.run_until(lambda: all(voter_ids(c) == [1, 2, 3] for c in net.clients.values()), what="3 voters")
    return net


def test_remove_a_follower_voter_then_it_stays_an_observer():
    net = _three_voters()
    assert net.request(1, remove_request(3, uuid.UUID(int=5))).error_code == E.VOTER_NOT_FOUND
    r = net.request(1, remove_request(3))
    assert r.error_code == E.NONE
    net.run_until(lambda: all(voter_ids(c) == [1, 2] for c in net.clients.values()), what="2 voters")
    assert not net.clients[3].quorum.is_voter
    assert 3 in net.clients[1].quorum.state.observers


def test_leader_removing_itself_resigns_after_commit_and_a_new_leader_takes_over():
    net = _three_voters()
    t0 = net.now
    r = net.request(1, remove_request(1))
    assert r.error_code == E.NONE
    net.run_until(lambda: net.leader() in (2, 3), what="a new leader among 2, 3")
    failover_ms = net.now - t0
    new = net.leader()
    net.run_until(lambda: net.clients[1].quorum.leader_id == new, what="node 1 follows the new leader")
    assert not net.clients[1].quorum.is_voter and voter_ids(net.clients[new]) == [2, 3]
    print("leader removal to new leader: %d ms simulated" % failover_ms)
    assert failover_ms < 3000
    # node 1 goes on replicating as an observer
    net.clients[new].schedule_append(net.clients[new].quorum.epoch, [b"after"], net.now)
    end = net.clients[new].log.end_offset + 1
    net.run_until(lambda: net.clients[1].high_watermark >= end, what="node 1 gets the new record")


def test_restart_keeps_the_voter_set_from_the_log_and_truncation_takes_it_back():
    net = _three_voters()
    c2 = net.clients[2]
    restarted = net.node(2, log=c2.log, store=c2.quorum.store)
    assert voter_ids(restarted) == [1, 2, 3] and restarted.quorum.is_voter
    # a VotersRecord appended but then truncated away no longer counts
    h = VoterHistory(VoterSet.static(()))
    h.voters.append((-1, VoterSet([VoterNode(1, DIRS[1])])))
    h.voters.append((10, VoterSet([VoterNode(1, DIRS[1]), VoterNode(2, DIRS[2])])))
    assert sorted(h.latest().ids) == [1, 2]
    assert h.truncate(10) and sorted(h.latest().ids) == [1]


def test_snapshot_control_records_carry_the_voters():
    net = _three_voters()
    leader = net.clients[1]
    recs = leader.snapshot_control_records(leader.high_watermark)
    from kbroker.metadata.snapshot import decode_snapshot, encode_snapshot
    data = encode_snapshot([], 0, raft_control=recs)
    assert decode_snapshot(data) == []
    assert [t for t, _ in snapshot_control_records(data)] == [5, 6]
    h = VoterHistory(VoterSet.static(()))
    assert h.reset_to_snapshot(leader.high_watermark, data)
    assert sorted(h.latest().ids) == [1, 2, 3] and h.kraft_version() == 1
