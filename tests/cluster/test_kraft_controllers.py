"""Three real controller processes (`kbroker serve`, process.roles=controller) form a KRaft
quorum on 127.0.0.1; a broker's lifecycle manager registers with them and is unfenced; the
active controller creates topics; SIGKILL of the active controller elects another one and
CreateTopics works again; a paused leader (SIGSTOP) steps down without split brain; bad
requests are refused with Kafka's error codes and leave the quorum undisturbed."""
from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import broker_registration as BR
from kbroker.protocol.messages import create_topics as CT
from kbroker.server.broker_lifecycle import BrokerLifecycle, BrokerLifecycleManager, BrokerState
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes
from kbroker.testing import KRaftControllerQuorum
from tests.broker.raw_client import RawClient

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"
FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600}


@pytest.fixture
def quorum(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), cluster_id=CLUSTER, overrides=FAST)
    try:
        yield q.start()
    finally:
        q.stop()


def _broker(q, node_id=4):
    sender = InterNodeSendThread(f"broker-{node_id}-to-controller",
                                 StaticNodes({i: ("127.0.0.1", p) for i, p in q.ports.items()}),
                                 {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200})
    lc = BrokerLifecycle(node_id=node_id, cluster_id=CLUSTER, listeners=[("PLAINTEXT", "127.0.0.1", 9092, 0)],
                         features={"metadata.version": (7, 21), "transaction.version": (0, 2)}, log_dirs=[uuid.uuid4()],  # every finalized feature (a new cluster finalizes transaction.version 2)
                         heartbeat_interval_ms=200, session_timeout_ms=9000, metadata_offset=lambda: 1 << 40)
    mgr = BrokerLifecycleManager(lc, ControllerChannel(sender, retry_backoff_s=0.05), request_timeout_s=2.0)
    mgr.start()
    return lc, mgr, sender


def _create(q, name, **kw):
    req = CT.CreateTopicsRequest(topics=[CT.CreatableTopic(name=name, num_partitions=3, replication_factor=1)],
                                 timeout_ms=5000)
    return q.to_controller(ApiKey.CREATE_TOPICS, 7, req, **kw)


def test_quorum_broker_registration_topics_and_failover(quorum):
    q = quorum
    leader, epoch = q.leader()
    p = q.describe(leader)
    assert sorted(v.replica_id for v in p.current_voters) == [1, 2, 3]
    # a follower says who leads
    follower = next(i for i in q.ports if i != leader)
    fp = q.describe(follower)
    assert fp.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and fp.leader_id == leader

    lc, mgr, sender = _broker(q)
    try:
        assert lc.caught_up.wait(20)
        mgr.set_ready_to_unfence()
        assert lc.unfenced.wait(20) and lc.state == BrokerState.RUNNING
        by, r = _create(q, "t-before")
        assert by == leader and r.topics[0].error_code == ErrorCode.NONE and r.topics[0].num_partitions == 3
        again = _create(q, "t-before")[1]
        assert again.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS

        # SIGKILL the active controller: another is elected; CreateTopics works again there
        t0 = time.monotonic()
        q.procs[leader].kill()
        by, r = _create(q, "t-after", exclude=(leader,), timeout_s=30)
        failover_s = time.monotonic() - t0
        assert by != leader and r.topics[0].error_code == ErrorCode.NONE
        new_leader, new_epoch = q.leader(exclude=(leader,))
        assert new_leader == by and new_epoch > epoch
        print("controller failover (SIGKILL -> CreateTopics ok): %.3fs" % failover_s)
        assert failover_s < 15, failover_s
        assert lc.state == BrokerState.RUNNING          # the broker kept its session

        # the killed controller comes back as a follower and catches up
        q.start(leader)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lp = q.describe(new_leader)
            ends = {v.replica_id: v.log_end_offset for v in lp.current_voters}
            if ends[leader] == ends[new_leader]:
                break
            time.sleep(0.1)
        assert ends[leader] == ends[new_leader], ends
        assert q.leader()[0] == new_leader
    finally:
        mgr.close()
        sender.close()


def test_a_paused_leader_steps_down_without_split_brain(quorum):
    q = quorum
    leader, epoch = q.leader()
    os.kill(q.procs[leader].pid, signal.SIGSTOP)
    try:
        new_leader, new_epoch = q.leader(exclude=(leader,))
        assert new_leader != leader and new_epoch > epoch
    finally:
        os.kill(q.procs[leader].pid, signal.SIGCONT)
    # the old leader hears of the newer epoch and follows; one leader, the newest epoch
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        p = q.describe(leader)
        if p.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and p.leader_id == new_leader:
            break
        time.sleep(0.1)
    assert p.leader_id == new_leader and p.leader_epoch >= new_epoch
    assert q.leader()[0] == new_leader


def test_bad_requests_are_refused_and_the_quorum_stays(quorum):
    q = quorum
    leader, epoch = q.leader()
    reg = BR.BrokerRegistrationRequest(
        broker_id=7, cluster_id="AAAAAAAAAAAAAAAAAAAAAQ", incarnation_id=uuid.uuid4(),
        listeners=[BR.Listener(name="PLAINTEXT", host="127.0.0.1", port=9999, security_protocol=0)],
        features=[BR.Feature(name="metadata.version", min_supported_version=7, max_supported_version=21)],
        rack=None, log_dirs=[uuid.uuid4()], previous_broker_epoch=-1)
    _, r = q.to_controller(ApiKey.BROKER_REGISTRATION, 3, reg)
    assert r.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    # a Vote from a node that is not a voter, for a far future epoch
    from kbroker.protocol.messages import vote as V
    vote = V.VoteRequest(cluster_id=CLUSTER, topics=[V.VoteRequestTopicData(topic_name="__cluster_metadata", partitions=[
        V.VoteRequestPartitionData(partition_index=0, candidate_epoch=epoch + 100, candidate_id=99,
                                   last_offset_epoch=epoch + 99, last_offset=1 << 30)])])
    with RawClient(q.ports[leader]) as c:
        vr = c.call(ApiKey.VOTE, 1, vote)
    assert vr.error_code == ErrorCode.NONE
    assert vr.topics[0].partitions[0].error_code == ErrorCode.INCONSISTENT_VOTER_SET
    assert not vr.topics[0].partitions[0].vote_granted
    assert q.leader() == (leader, epoch)
    # a Vote with the wrong cluster id
    vote.cluster_id = "AAAAAAAAAAAAAAAAAAAAAQ"
    with RawClient(q.ports[leader]) as c:
        assert c.call(ApiKey.VOTE, 1, vote).error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert q.leader() == (leader, epoch)
