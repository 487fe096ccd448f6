"""Metadata snapshots with real processes: with a small
``metadata.log.max.record.bytes.between.snapshots`` every node writes
``<offset>-<epoch>.checkpoint`` files and its log start moves to the newest one; a broker
that was down while the log before that was deleted catches up through FetchSnapshot and
serves the whole metadata; a restarted quorum loads its snapshots and keeps every topic;
``kbroker dump-log`` decodes a snapshot file."""
from __future__ import annotations

import glob
import io
import os
import re
import time
from contextlib import redirect_stdout

from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KRaftControllerQuorum
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait

SNAP = re.compile(r"(\d{20})-(\d{10})\.checkpoint$")


def _snapshots(base, node):
    out = []
    for path in glob.glob(os.path.join(base, f"c{node}", "**", "__cluster_metadata-0", "*.checkpoint"),
                          recursive=True):
        m = SNAP.search(path)
        if m:
            out.append((int(m.group(1)), path))
    return sorted(out)


def _topics(port):
    try:
        return set(AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=5).topics)
    except Exception:
        return set()


def _create(q, port, names):
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    for f in admin.create_topics([NewTopic(n, num_partitions=2, replication_factor=1) for n in names],
                                 operation_timeout=30).values():
        f.result(timeout=60)      # generous: after a whole-quorum restart on a loaded machine


def test_snapshots_are_written_fetched_by_a_lagging_broker_and_loaded_on_restart(tmp_path):
    base = str(tmp_path)
    overrides = {**FAST, "metadata.log.max.record.bytes.between.snapshots": 4096}
    q = KRaftControllerQuorum(base, n=3, overrides=overrides, brokers=2)
    try:
        q.start()
        _wait(lambda: all(_brokers(p) == [4, 5] for p in q.broker_ports.values()), what="brokers unfenced")
        p4, p5 = q.broker_ports[4], q.broker_ports[5]
        _create(q, p4, [f"early-{i}" for i in range(10)])
        q.procs[5].terminate()                       # broker 5 misses what follows
        names = [f"late-{i}" for i in range(40)]
        _create(q, p4, names)
        # every controller and the live broker snapshot past broker 5's position
        for node in (1, 2, 3, 4):
            _wait(lambda: _snapshots(base, node), what=f"a snapshot on node {node}")
        offset, path = _snapshots(base, 1)[-1]
        assert offset > 0
        out = io.StringIO()
        from kbroker.tools import dump_log
        with redirect_stdout(out):
            dump_log.main(["--cluster-metadata-decoder", "--files", path], out=out)
        text = out.getvalue()
        assert "SNAPSHOT_HEADER" in text or "SnapshotHeader" in text
        assert "late-" in text or "early-" in text
        # the leader's log starts at its newest snapshot: broker 5 must fetch a snapshot
        q.procs[5].start()
        want = {f"early-{i}" for i in range(10)} | set(names)
        _wait(lambda: want <= _topics(p5), timeout_s=30, what="broker 5 sees every topic")
        assert _snapshots(base, 5) and "installed snapshot" in q.procs[5].read_log()
        # the whole quorum restarts: snapshots + tail give back the same topics
        for i in (1, 2, 3):
            q.procs[i].terminate()
        for i in (1, 2, 3):
            q.procs[i].start()
        q.leader(timeout_s=30)
        _create(q, p4, ["after-restart"])
        _wait(lambda: want | {"after-restart"} <= _topics(p4), timeout_s=30, what="topics after restart")
        _wait(lambda: want | {"after-restart"} <= _topics(p5), timeout_s=30, what="topics on broker 5")
    finally:
        q.stop()
