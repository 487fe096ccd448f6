"""KIP-853 dynamic quorums with real processes: one controller formatted ``--standalone``
grows to three with ``kbroker metadata-quorum add-controller`` while a broker keeps serving
a producer; a follower voter and then the leader are removed (the leader resigns and the
others elect a new one); every controller restarted keeps the voter set it had."""
from __future__ import annotations

import contextlib
import io
import os
import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KBrokerProcess, free_port
from kbroker.tools import metadata_quorum, storage
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


class DynamicCluster:
    def __init__(self, base: str, controllers=(1, 2, 3), broker=4, overrides=None, initial=False):
        self.base = base
        self.cports = {i: free_port() for i in controllers}
        self.bport = free_port()
        self.broker_id = broker
        self.procs: dict[int, KBrokerProcess] = {}
        self.confs: dict[int, str] = {}
        first = controllers[0]
        from kbroker.log.checkpoints import random_uuid
        self.dirs = {i: random_uuid() for i in controllers}
        everyone = ",".join(f"{i}@127.0.0.1:{self.cports[i]}:{self.dirs[i]}" for i in controllers)
        for i in controllers:
            if initial:      # every controller a voter from the start (--initial-controllers)
                fmt = ["--initial-controllers", everyone]
            else:
                fmt = ["--standalone"] if i == first else ["--no-initial-controllers"]
            props = {"process.roles": "controller", "node.id": i,
                     "controller.quorum.bootstrap.servers": ",".join(
                         f"127.0.0.1:{self.cports[j]}" for j in (controllers if initial else (first,))),
                     "listeners": f"CONTROLLER://127.0.0.1:{self.cports[i]}",
                     "controller.listener.names": "CONTROLLER", **FAST, **(overrides or {})}
            self._node(i, props, self.cports[i], fmt)
        props = {"process.roles": "broker", "node.id": broker,
                 "controller.quorum.bootstrap.servers": ",".join(f"127.0.0.1:{p}" for p in self.cports.values()),
                 "listeners": f"PLAINTEXT://127.0.0.1:{self.bport}",
                 "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.bport}",
                 "controller.listener.names": "CONTROLLER", **FAST, **(overrides or {})}
        self._node(broker, props, self.bport, [])

    def _node(self, i, props, port, fmt_args):
        d = os.path.join(self.base, f"n{i}")
        os.makedirs(d, exist_ok=True)
        props["log.dirs"] = os.path.join(d, "logs")
        conf = os.path.join(d, "node.properties")
        with open(conf, "w", encoding="utf-8") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        with contextlib.redirect_stdout(io.StringIO()):
            assert storage.main(["format", "-c", conf, "-t", CLUSTER_ID] + fmt_args) == 0
        self.confs[i] = conf
        self.procs[i] = KBrokerProcess(data_dir=d, overrides=props, port=port)

    @property
    def bootstrap_controllers(self):
        return ",".join(f"127.0.0.1:{p}" for i, p in self.cports.items() if self.procs[i].proc is not None)

    def tool(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        rc = metadata_quorum.main(["--bootstrap-controller", self.bootstrap_controllers, *argv], out, err)
        return rc, out.getvalue(), err.getvalue()

    def status(self):
        rc, out, err = self.tool("describe", "--status")
        assert rc == 0, err
        return dict(line.split(":", 1) for line in out.splitlines())

    def voters(self):
        try:
            text = self.status()["CurrentVoters"]
        except (AssertionError, ValueError):
            return None
        import json
        return sorted(v["id"] for v in json.loads(text))

    def stop(self):
        for p in self.procs.values():
            p.kill()


def _directory_id(c, i):
    with open(os.path.join(os.path.dirname(c.confs[i]), "logs", "meta.properties"), encoding="utf-8") as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)["directory.id"]


def _add(c, i, timeout_s=30.0):
    """add-controller, retried while the new controller is still catching up as an observer."""
    deadline = time.monotonic() + timeout_s
    while True:
        t0 = time.monotonic()
        rc, out, err = c.tool("--command-config", c.confs[i], "add-controller")
        if rc == 0:
            return out, time.monotonic() - t0
        assert "REQUEST_TIMED_OUT" in err or "NOT_LEADER" in err, err
        assert time.monotonic() < deadline, err
        time.sleep(0.2)


def test_grow_one_to_three_controllers_then_remove_the_leader(tmp_path):
    c = DynamicCluster(str(tmp_path))
    stop = threading.Event()
    delivered, failed = [], []
    try:
        c.procs[1].start()
        c.procs[4].start()
        _wait(lambda: _brokers(c.bport) == [4], timeout_s=30, what="broker 4 registered and unfenced")
        assert c.voters() == [1]
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{c.bport}"})
        admin.create_topics([NewTopic("t", num_partitions=1, replication_factor=1)],
                            operation_timeout=10)["t"].result(timeout=30)

        def produce():
            p = Producer({"bootstrap.servers": f"127.0.0.1:{c.bport}", "linger.ms": 5,
                          "message.timeout.ms": 60000})
            n = 0
            while not stop.is_set() and n < 20000:
                p.produce("t", str(n).encode(), on_delivery=lambda e, m: (failed if e else delivered).append(e))
                p.poll(0)
                n += 1
                time.sleep(0.005)
            p.flush(60)
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()

        c.procs[2].start()
        c.procs[3].start()
        out, took2 = _add(c, 2)
        assert out.startswith(f"Added controller 2 with directory id {_directory_id(c, 2)} and endpoints: "
                              f"CONTROLLER://127.0.0.1:{c.cports[2]}")
        _, took3 = _add(c, 3)
        print(f"add-controller commit: {took2 * 1000:.0f} ms, {took3 * 1000:.0f} ms")
        _wait(lambda: c.voters() == [1, 2, 3], what="three voters")
        st = c.status()
        assert st["ClusterId"].strip() == CLUSTER_ID and '"endpoints": ["CONTROLLER://127.0.0.1:' in st["CurrentVoters"]
        rc, out, _ = c.tool("describe", "--replication")
        assert rc == 0 and out.splitlines()[0].split() == ["NodeId", "DirectoryId", "LogEndOffset", "Lag",
                                                            "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status"]
        assert sorted(l.split()[-1] for l in out.splitlines()[1:]) == ["Follower", "Follower", "Leader", "Observer"]

        # remove a follower voter, then the leader itself
        leader = int(c.status()["LeaderId"])
        follower = next(i for i in (1, 2, 3) if i != leader)
        rc, out, err = c.tool("remove-controller", "--controller-id", str(follower),
                              "--controller-directory-id", _directory_id(c, follower))
        assert rc == 0, err
        assert out.strip() == f"Removed  KRaft controller {follower} with directory id {_directory_id(c, follower)}"
        remaining = sorted({1, 2, 3} - {follower})
        _wait(lambda: c.voters() == remaining, what="two voters")
        _add(c, follower)                                                   # back to three
        _wait(lambda: c.voters() == [1, 2, 3], what="three voters again")
        t0 = time.monotonic()
        rc, out, err = c.tool("remove-controller", "--controller-id", str(leader),
                              "--controller-directory-id", _directory_id(c, leader))
        assert rc == 0, err
        _wait(lambda: (c.status()["LeaderId"].strip() not in (str(leader), "-1")) and c.voters() is not None
              and leader not in c.voters(), what="a new leader without the old one")
        print(f"remove the leader -> new leader: {(time.monotonic() - t0) * 1000:.0f} ms")
        admin.create_topics([NewTopic("after", num_partitions=1, replication_factor=1)],
                            operation_timeout=10)["after"].result(timeout=30)
        n_before = len(delivered)
        _wait(lambda: len(delivered) > n_before + 50, what="the producer keeps going")

        # every controller restarted keeps the voter set it had (from its log)
        voters = c.voters()
        for i in (1, 2, 3):
            c.procs[i].terminate()
        for i in (1, 2, 3):
            c.procs[i].start()
        _wait(lambda: c.voters() == voters, timeout_s=30, what="the same voters after restarts")
        stop.set()
        producer.join(90)
        assert not failed, failed[:3]
        assert len(delivered) > 100
    finally:
        stop.set()
        c.stop()


def test_voters_survive_restarts_from_a_snapshot_after_the_log_before_it_is_gone(tmp_path):
    """Snapshots carry KRaftVersionRecord and VotersRecord in their header batch (as Kafka's
    RecordsSnapshotWriter): once the log holding the VotersRecords is deleted below a
    snapshot, restarted controllers still know the voters."""
    from kbroker.raft.kafka_log import KafkaMetadataLog
    from kbroker.raft.voter_set import KRAFT_VOTERS, snapshot_control_records

    c = DynamicCluster(str(tmp_path), controllers=(1, 2), overrides={
        "metadata.log.max.record.bytes.between.snapshots": 2048})
    try:
        c.procs[1].start()
        c.procs[4].start()
        c.procs[2].start()
        _add(c, 2)
        _wait(lambda: c.voters() == [1, 2], what="two voters")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{c.bport}"})
        for k in range(4):      # enough records for snapshots past the VotersRecord
            name = f"s{k}"
            admin.create_topics([NewTopic(name, num_partitions=8, replication_factor=1)],
                                operation_timeout=10)[name].result(timeout=30)
        mdir = {i: os.path.join(os.path.dirname(c.confs[i]), "logs") for i in (1, 2)}

        def snapshotted(i):
            names = [f for f in os.listdir(os.path.join(mdir[i], "__cluster_metadata-0")) if f.endswith(".checkpoint")]
            return [n for n in names if not n.startswith("00000000000000000000-")]
        _wait(lambda: all(snapshotted(i) for i in (1, 2)), timeout_s=30, what="snapshots on both controllers")
        for i in (1, 2):
            c.procs[i].terminate()
        for i in (1, 2):
            lg = KafkaMetadataLog.open(mdir[i])
            try:
                snap = lg.latest_snapshot_id()
                assert snap.offset > 3 and lg.start_offset == snap.offset
                kinds = [t for t, _ in snapshot_control_records(lg.read_snapshot(snap))]
                assert KRAFT_VOTERS in kinds
                assert all(b.control_type != KRAFT_VOTERS for b in lg.read(lg.start_offset, 1 << 30))
            finally:
                lg.log.close()
        for i in (1, 2):
            c.procs[i].start()
        _wait(lambda: c.voters() == [1, 2], timeout_s=30, what="the same voters after restarts")
    finally:
        c.stop()


def test_initial_controllers_form_a_quorum_that_fails_over(tmp_path):
    """Three controllers formatted with the same --initial-controllers start as one dynamic
    quorum (kraft.version 1, the voters with their directory ids); killing the leader elects
    another, and the broker follows it."""
    c = DynamicCluster(str(tmp_path), initial=True)
    try:
        for i in (1, 2, 3, 4):
            c.procs[i].start()
        _wait(lambda: c.voters() == [1, 2, 3], timeout_s=30, what="three voters")
        import json
        voters = json.loads(c.status()["CurrentVoters"])
        assert {v["id"]: v["directoryId"] for v in voters} == c.dirs
        _wait(lambda: _brokers(c.bport) == [4], timeout_s=30, what="broker 4 registered and unfenced")
        leader = int(c.status()["LeaderId"])
        c.procs[leader].kill()
        _wait(lambda: c.status()["LeaderId"].strip() not in (str(leader), "-1"), timeout_s=30, what="a new leader")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{c.bport}"})
        admin.create_topics([NewTopic("t", num_partitions=1, replication_factor=1)],
                            operation_timeout=10)["t"].result(timeout=30)
        # a static-quorum-only request stays refused: kraft.version 1 accepts voter changes
        rc, _, err = c.tool("remove-controller", "--controller-id", "9", "--controller-directory-id", c.dirs[1])
        assert rc == 1 and "VOTER_NOT_FOUND" in err
    finally:
        c.stop()


def test_static_quorum_refuses_voter_changes_and_describes_itself(tmp_path):
    """controller.quorum.voters (kraft.version 0): DescribeQuorum v2 lists the voters without
    directory ids; AddRaftVoter / RemoveRaftVoter answer UNSUPPORTED_VERSION."""
    from kbroker.testing import KRaftControllerQuorum

    q = KRaftControllerQuorum(str(tmp_path), n=3, overrides=FAST)
    try:
        q.start()
        q.leader()
        boot = ",".join(f"127.0.0.1:{p}" for p in q.ports.values())
        out, err = io.StringIO(), io.StringIO()
        assert metadata_quorum.main(["--bootstrap-controller", boot, "describe", "--status"], out, err) == 0, \
            err.getvalue()
        st = dict(line.split(":", 1) for line in out.getvalue().splitlines())
        assert st["CurrentVoters"].strip() == ", ".join(
            '{"id": %d, "directoryId": null, "endpoints": ["CONTROLLER://127.0.0.1:%d"]}' % (i, q.ports[i])
            for i in (1, 2, 3)).join("[]")
        out, err = io.StringIO(), io.StringIO()
        rc = metadata_quorum.main(["--bootstrap-controller", boot, "remove-controller", "--controller-id", "1",
                                   "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAQ"], out, err)
        assert rc == 1
        assert err.getvalue().strip() == ("Error: UNSUPPORTED_VERSION: Cluster doesn't support removing voter "
                                          "because the kraft.version feature is 0")
    finally:
        q.stop()
