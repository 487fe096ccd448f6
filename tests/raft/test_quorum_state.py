"""QuorumState transitions and the quorum-state file (Kafka's QuorumState, FileQuorumStateStore)."""
import json
import os

import pytest

from kbroker.raft.quorum_state import (Candidate, ElectionState, FileQuorumStateStore, Follower,
                                       IllegalTransition, Leader, MemoryQuorumStateStore, QuorumState, Resigned,
                                       Unattached, from_json, to_json)
from kbroker.raft.records import QuorumStateData


def new_state(local=1, voters=(1, 2, 3), store=None):
    q = QuorumState(local, voters, store or MemoryQuorumStateStore())
    q.initialize(1000)
    return q


def test_fresh_start_is_unattached_at_epoch_0_and_persisted():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    assert isinstance(q.state, Unattached) and q.epoch == 0
    assert store.state == ElectionState(0, voters=frozenset({1, 2, 3}))


def test_candidate_votes_for_itself_in_the_next_epoch_persisted_first():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    c = q.to_candidate(2000, 1)
    assert isinstance(c, Candidate) and c.epoch == 1 and c.granted == {1}
    assert store.state.epoch == 1 and store.state.voted_id == 1
    c.granted.add(2)
    lead = q.to_leader(0, 0, 3000)
    assert isinstance(lead, Leader) and store.state.leader_id == 1


def test_leader_needs_a_majority():
    q = new_state(voters=(1, 2, 3, 4, 5))
    c = q.to_candidate(2000, 1)
    c.granted.add(2)
    with pytest.raises(IllegalTransition):
        q.to_leader(0, 0, 3000)
    c.granted.add(3)
    q.to_leader(0, 0, 3000)


def test_never_votes_twice_in_an_epoch():
    q = new_state()
    q.to_unattached(5, 2000)
    q.to_voted(5, 2, 2000)
    with pytest.raises(IllegalTransition):
        q.to_voted(5, 3, 2000)


def test_never_votes_twice_across_a_restart():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    q.to_unattached(5, 2000)
    q.to_voted(5, 2, 2000)
    q2 = new_state(store=store)           # restart: the vote is remembered
    assert q2.epoch == 5 and q2.state.voted_id == 2
    with pytest.raises(IllegalTransition):
        q2.to_voted(5, 3, 2000)


def test_epoch_never_goes_back_even_after_restart():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    q.to_unattached(7, 2000)
    q2 = new_state(store=store)
    assert q2.epoch == 7
    with pytest.raises(IllegalTransition):
        q2.to_unattached(6, 2000)
    with pytest.raises(IllegalTransition):
        q2.to_follower(6, 2, 2000)


def test_one_leader_per_epoch_as_far_as_a_replica_knows():
    q = new_state()
    q.to_follower(3, 2, 2000)
    with pytest.raises(IllegalTransition):
        q.to_follower(3, 3, 2000)
    q.to_follower(4, 3, 2000)
    assert q.state.leader_id == 3


def test_follower_keeps_its_vote_of_the_same_epoch():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    q.to_unattached(2, 2000)
    q.to_voted(2, 3, 2000)
    q.to_follower(2, 3, 4000)
    assert store.state == ElectionState(2, 3, 3, frozenset({1, 2, 3}))


def test_observer_never_becomes_candidate():
    q = new_state(local=9)
    with pytest.raises(IllegalTransition):
        q.to_candidate(2000, 1)


def test_unattached_keeps_the_running_election_timer():
    q = new_state()                       # its election timer runs out at 1000
    q.to_unattached(2, 1234)
    q.to_unattached(3, 9999)
    assert q.state.election_deadline == 1000
    q.to_candidate(5000, 1)
    q.to_unattached(5, 9999)
    assert q.state.election_deadline == 5000


def test_restart_as_leader_is_resigned_and_as_candidate_keeps_its_vote():
    store = MemoryQuorumStateStore()
    q = new_state(store=store)
    c = q.to_candidate(2000, 1)
    q2 = new_state(store=store)
    assert isinstance(q2.state, Unattached) and q2.state.voted_id == 1 and q2.epoch == 1
    c.granted.add(3)
    q.to_leader(0, 0, 3000)
    q3 = new_state(store=store)
    assert isinstance(q3.state, Resigned) and q3.epoch == 1


def test_resign_only_from_leader():
    q = new_state()
    with pytest.raises(IllegalTransition):
        q.to_resigned(100)


# -- the file ---------------------------------------------------------------------------------

def test_json_is_kafkas_form_version_0():
    text = to_json(ElectionState(7, 2, 2, frozenset({1, 2, 3})))
    assert text == ('{"clusterId":"","leaderId":2,"leaderEpoch":7,"votedId":2,"appliedOffset":0,'
                    '"currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}')
    # the same fields, by Kafka's names, as the generated QuorumStateData at version 0
    names = {f.name for f in QuorumStateData._fields}
    obj = json.loads(text)
    assert {k[0].upper() + k[1:] for k in obj if k != "data_version"} == names - {"VotedDirectoryId"}
    assert from_json(text) == ElectionState(7, 2, 2, frozenset({1, 2, 3}))


def test_json_version_1_and_bad_versions():
    e = ElectionState(3, -1, 1)
    assert json.loads(to_json(e, 1)) == {"leaderId": -1, "leaderEpoch": 3, "votedId": 1,
                                         "votedDirectoryId": "AAAAAAAAAAAAAAAAAAAAAA", "data_version": 1}
    assert from_json(to_json(e, 1)) == e
    with pytest.raises(ValueError, match="data_version"):
        from_json('{"leaderId":1,"leaderEpoch":1,"votedId":-1}')
    with pytest.raises(ValueError, match="supported version"):
        from_json('{"leaderId":1,"leaderEpoch":1,"votedId":-1,"data_version":2}')
    with pytest.raises(ValueError):
        from_json("")


def test_file_store_writes_atomically_and_reads_back(tmp_path):
    path = str(tmp_path / FileQuorumStateStore.FILE_NAME)
    store = FileQuorumStateStore(path)
    assert store.read() is None
    q = new_state(store=store)
    q.to_unattached(4, 1000)
    q.to_voted(4, 2, 1000)
    assert not os.path.exists(path + ".tmp")
    assert json.loads(open(path).read())["votedId"] == 2
    q2 = new_state(store=FileQuorumStateStore(path))
    assert q2.epoch == 4 and q2.state.voted_id == 2
    with pytest.raises(IllegalTransition):
        q2.to_voted(4, 3, 1000)


def test_file_store_ignores_a_torn_tmp_file(tmp_path):
    path = str(tmp_path / "quorum-state")
    store = FileQuorumStateStore(path)
    store.write(ElectionState(2, 1, 1, frozenset({1})))
    with open(path + ".tmp", "w") as f:
        f.write('{"leaderId":')           # a crash in the middle of the next write
    assert store.read() == ElectionState(2, 1, 1, frozenset({1}))
    store.write(ElectionState(3, -1, -1, frozenset({1})))
    assert store.read().epoch == 3


def test_follower_state_transition_from_candidate_same_epoch():
    q = new_state()
    q.to_candidate(2000, 1)
    f = q.to_follower(1, 2, 3000)
    assert isinstance(f, Follower) and f.voted_id == 1
