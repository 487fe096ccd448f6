"""KIP-853 discovery: a broker configured with only ``controller.quorum.bootstrap.servers``
(no ``controller.quorum.voters``) finds the quorum leader through any bootstrap controller
(Fetch answers name the leader and its endpoint), registers, is unfenced, forwards admin
requests to the active controller, and follows a new leader after the old one is killed."""
from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KRaftControllerQuorum
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait


def _create(port, name):
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)],
                        operation_timeout=10)[name].result(timeout=30)
    return _wait(lambda: name in admin.list_topics(timeout=5).topics, what=f"{name} visible")


def test_broker_with_only_bootstrap_servers_joins_and_follows_leader_changes(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), n=3, overrides=FAST, brokers=1, brokers_bootstrap_only=True)
    try:
        q.start()
        port = q.broker_ports[4]
        _wait(lambda: _brokers(port) == [4], timeout_s=30, what="broker 4 registered and unfenced")
        assert _create(port, "before")
        assert "quorum node" in q.procs[4].read_log()          # learnt the leader's endpoint
        leader, _ = q.leader()
        q.procs[leader].kill()
        q.leader(timeout_s=30, exclude=(leader,))
        assert _create(port, "after")
        _wait(lambda: _brokers(port) == [4], timeout_s=30, what="broker 4 still unfenced")
    finally:
        q.stop()
