"""The chaos cluster harness itself (kbroker.chaos.cluster), before any replication:
/proc finds who owns a socket; a broker cut off from its peers and the controller is
fenced while clients still reach it, and comes back when healed; kill/restart and
SIGSTOP/SIGCONT act on one broker by PID; RF 1 records survive a restart; ``stop``
leaves no process and no proxy behind."""
from __future__ import annotations

import os
import socket
import threading
import time

from confluent_kafka import Producer

from kbroker.chaos.cluster import ChaosCluster, ClusterNemesis, listening_ports, owner_of
from kbroker.chaos.workload import read_all


def test_owner_of_finds_the_process_holding_the_client_end():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    try:
        port = cli.getsockname()[1]
        assert owner_of(port, srv.getsockname()[1], {"other": 1, "me": os.getpid()}) == "me"
        assert owner_of(port, srv.getsockname()[1], {"other": 1}) is None
        assert srv.getsockname()[1] in listening_ports(os.getpid())
    finally:
        cli.close()
        srv.close()


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_isolate_kill_pause_and_cleanup(tmp_path):
    c = ChaosCluster(str(tmp_path))
    pids = []
    try:
        c.start()
        c.wait_ready()
        pids = [c.pid(i) for i in c.nodes]
        # every broker reaches the controller through its proxy, never directly
        assert c.links[1].connections >= 3

        # RF 1 on each broker: records survive a SIGKILL and restart of their broker
        c.create_topic("rf1", 3, replication_factor=1)
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True})
        for i in range(30):
            p.produce("rf1", value=b"%d" % i, partition=i % 3)
        assert p.flush(20) == 0
        victim = c.leader("rf1", 0)
        c.kill(victim)
        assert c.pid(victim) is None
        c.start(victim)
        c.wait(lambda: c.metadata("rf1")[0][0] == victim, 30, "partition 0 back on its broker")
        reads = read_all(c.bootstrap, "rf1", 3, timeout_s=30)
        assert sorted(int(v) for rows in reads.values() for _, v in rows) == list(range(30))

        # cut off: fenced by the controller (session timeout), yet its client listener answers
        c.isolate(2)
        c.wait(lambda: c.registered_brokers() == [3, 4], 20, "broker 2 fenced")
        assert c.metadata("rf1", via=2)        # clients still reach it
        c.heal()
        c.wait_ready(20)

        # SIGSTOP: fenced after the session timeout; SIGCONT: back
        c.pause(3)
        try:
            c.wait(lambda: c.registered_brokers() == [2, 4], 20, "paused broker 3 fenced")
        finally:
            c.resume(3)
        c.wait_ready(20)

        # a seeded nemesis over the cluster applies its faults and heals them all
        nem = ClusterNemesis(c, topic="rf1", partitions=3, seed=1, faults=("pause", "isolate"),
                             gap_s=(0.1, 0.2), fault_s=(0.3, 0.6), max_faults=2)
        nem.run(threading.Event())
        assert [f for _, f, _ in nem.log if f != "healed"] and "not settled" not in [f for _, f, _ in nem.log]
        assert all(c.pid(i) is not None for i in c.broker_ids) and not c.isolated
    finally:
        c.stop()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    for link in c.links.values():
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", link.port)) != 0     # proxies closed
