"""Replica operator tools against a KRaft cluster (1 controller + 3 brokers, real
processes): ``kbroker topics --describe`` with kafka-topics.sh's partition filters,
``kbroker reassign-partitions`` (execute / list / verify / cancel, generate) and
``kbroker leader-election``, their admin requests forwarded by a broker to the controller.

Without replication yet (issue 16) a newly added replica never joins the ISR, so a
reassignment that adds a broker stays in progress; a reassignment that only reorders the
replicas completes at once and lets a preferred-leader election move the leader."""
from __future__ import annotations

import io
import json

import pytest

from kbroker.client.admin import Admin, NewTopic
from kbroker.testing import KRaftControllerQuorum
from kbroker.tools import leader_election, reassign_partitions, topics
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    q = KRaftControllerQuorum(str(tmp_path_factory.mktemp("replica-tools")), n=1, overrides=FAST, brokers=3)
    try:
        q.start()
        _wait(lambda: all(_brokers(p) == [2, 3, 4] for p in q.broker_ports.values()), what="brokers unfenced")
        yield q
    finally:
        q.stop()


#: brokers a test has stopped: tools and admin clients bootstrap from the others
DOWN: set = set()


def _bootstrap(q) -> str:
    return ",".join(f"127.0.0.1:{p}" for i, p in q.broker_ports.items() if i not in DOWN)


def _run(mod, q, *argv):
    out = io.StringIO()
    rc = mod.main(["--bootstrap-server", _bootstrap(q).split(",")[0], *map(str, argv)], out=out)
    return rc, out.getvalue()


def _replicas(q, topic):
    with Admin({"bootstrap.servers": _bootstrap(q)}) as a:
        return {p.partition: (list(p.replicas), p.leader, list(p.isr)) for p in a.describe_topics([topic])[topic]}


def test_reassign_reorder_then_preferred_election_then_an_unfinished_move_cancelled(cluster, tmp_path):
    q = cluster
    with Admin({"bootstrap.servers": q.bootstrap}) as a:
        a.create_topics([NewTopic("moves", 2, 2)], timeout=20)
    before = _replicas(q, "moves")
    (r0, leader0, _) = before[0]
    assert leader0 == r0[0]
    rc, out = _run(topics, q, "--describe", "--topic", "moves", "--under-replicated-partitions")
    assert rc == 0 and out == ""

    # 1. reorder partition 0's replicas: completes at once, the leader stays
    plan = tmp_path / "reorder.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "moves", "partition": 0, "replicas": [r0[1], r0[0]], "log_dirs": ["any", "any"]}]}))
    rc, out = _run(reassign_partitions, q, "--execute", "--reassignment-json-file", plan)
    assert rc == 0, out
    assert "Successfully started partition reassignment for moves-0" in out
    assert '"replicas":[%d,%d]' % (r0[0], r0[1]) in out          # the rollback plan
    _wait(lambda: _replicas(q, "moves")[0][0] == [r0[1], r0[0]], what="reordered replicas")
    rc, out = _run(reassign_partitions, q, "--verify", "--reassignment-json-file", plan)
    assert rc == 0 and "Reassignment of partition moves-0 is completed." in out

    # 2. the preferred replica is now r0[1]: a preferred election moves leadership to it
    rc, out = _run(leader_election, q, "--election-type", "preferred", "--topic", "moves", "--partition", 0)
    assert rc == 0, out
    assert out.strip() == "Successfully completed leader election (PREFERRED) for partitions moves-0"
    _wait(lambda: _replicas(q, "moves")[0][1] == r0[1], what="preferred leader")
    rc, out = _run(leader_election, q, "--election-type", "preferred", "--all-topic-partitions")
    assert rc == 0 and "Successfully completed" not in out            # nothing left to elect

    # 3. moving partition 1 onto the third broker while that broker is down (SIGKILL, still
    # registered): the new replica cannot catch up, so the move is in progress, listed, then
    # cancelled back to the old set; 4. once the broker runs again the same move completes:
    # the new replica catches up and joins the ISR before the old one leaves
    (r1, _, _) = before[1]
    third = ({2, 3, 4} - set(r1)).pop()
    move = tmp_path / "move.json"
    move.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "moves", "partition": 1, "replicas": [r1[0], third]}]}))
    q.procs[third].kill()
    DOWN.add(third)
    try:
        _unfinished_move_cancelled(q, move, r1, third)
    finally:
        q.procs[third].start()
        DOWN.discard(third)
    _wait(lambda: all(_brokers(p) == [2, 3, 4] for p in q.broker_ports.values()), timeout_s=60,
          what="the broker back and unfenced")
    rc, out = _run(reassign_partitions, q, "--execute", "--reassignment-json-file", move)
    assert rc == 0, out
    _wait(lambda: sorted(_replicas(q, "moves")[1][0]) == sorted([r1[0], third]), timeout_s=60,
          what="move completed")
    rc, out = _run(reassign_partitions, q, "--list")
    assert rc == 0 and out.strip() == "No partition reassignments found."


def _unfinished_move_cancelled(q, move, r1, third):
    rc, out = _run(reassign_partitions, q, "--execute", "--reassignment-json-file", move)
    assert rc == 0, out
    rc, out = _run(reassign_partitions, q, "--list")
    assert rc == 0 and "Current partition reassignments:" in out
    assert f"moves-1: replicas: " in out and f"adding: {third}." in out and f"removing: {r1[1]}." in out
    rc, out = _run(reassign_partitions, q, "--verify", "--reassignment-json-file", move)
    assert rc == 1 and "Reassignment of partition moves-1 is still in progress." in out
    rc, out = _run(reassign_partitions, q, "--execute", "--reassignment-json-file", move)
    assert rc == 1                                                   # an existing reassignment, no --additional
    rc, out = _run(topics, q, "--describe", "--topic", "moves", "--under-replicated-partitions")
    assert rc == 0 and "Partition: 1" in out and "Partition: 0" not in out
    rc, out = _run(reassign_partitions, q, "--cancel", "--reassignment-json-file", move)
    assert rc == 0 and "Successfully cancelled partition reassignment for: moves-1" in out
    _wait(lambda: sorted(_replicas(q, "moves")[1][0]) == sorted(r1), what="cancelled move")
    rc, out = _run(reassign_partitions, q, "--list")
    assert rc == 0 and out.strip() == "No partition reassignments found."


def test_generate_proposes_every_partition_on_the_given_brokers(cluster, tmp_path):
    q = cluster
    with Admin({"bootstrap.servers": q.bootstrap}) as a:
        a.create_topics([NewTopic("gen", 6, 2)], timeout=20)
    f = tmp_path / "topics.json"
    f.write_text(json.dumps({"version": 1, "topics": [{"topic": "gen"}]}))
    rc, out = _run(reassign_partitions, q, "--generate", "--topics-to-move-json-file", f, "--broker-list", "2,3")
    assert rc == 0, out
    proposed = json.loads(out.split("Proposed partition reassignment configuration\n")[1])
    parts = {p["partition"]: p["replicas"] for p in proposed["partitions"]}
    assert sorted(parts) == list(range(6))
    assert all(sorted(r) == [2, 3] for r in parts.values())
    assert {r[0] for r in parts.values()} == {2, 3}                   # leaders spread
    rc, out = _run(reassign_partitions, q, "--generate", "--topics-to-move-json-file", f, "--broker-list", "2,9")
    assert rc == 1


def test_bad_input_is_refused_with_one_line(cluster, tmp_path):
    q = cluster
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "x", "partition": 0, "replicas": [2, 2]}]}))
    for mod, argv in ((reassign_partitions, ["--execute", "--reassignment-json-file", dup]),
                      (reassign_partitions, ["--list", "--verify"]),
                      (leader_election, ["--election-type", "preferred"]),
                      (leader_election, ["--election-type", "sideways", "--all-topic-partitions"]),
                      (leader_election, ["--election-type", "preferred", "--topic", "x"])):
        rc, _ = _run(mod, q, *argv)
        assert rc == 1, argv
    rc, out = _run(leader_election, q, "--election-type", "preferred", "--topic", "nope", "--partition", 0)
    assert rc == 1 and "Error completing leader election (PREFERRED) for partition: nope-0: " \
                       "UNKNOWN_TOPIC_OR_PARTITION" in out
