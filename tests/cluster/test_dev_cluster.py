"""`kbroker dev-cluster start|status|stop`: a local KRaft cluster in one command, stopped by
the PIDs it wrote."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from confluent_kafka.admin import AdminClient, NewTopic


def _free_base() -> int:
    """A base port whose node ports (base + 10*i + 2/3, i = 1..3) are all free."""
    for base in range(30000, 60000, 137):
        ok = True
        for i in (1, 2, 3):
            for off in (2, 3):
                with socket.socket() as s:
                    try:
                        s.bind(("127.0.0.1", base + 10 * i + off))
                    except OSError:
                        ok = False
        if ok:
            return base
    raise RuntimeError("no free ports")


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "kbroker", "dev-cluster", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_start_use_stop(tmp_path):
    d = str(tmp_path / "cluster")
    base = _free_base()
    r = _run("start", "--dir", d, "--base-port", str(base))
    try:
        assert r.returncode == 0, r.stderr + r.stdout
        boot = r.stdout.strip().split("bootstrap.servers=")[1]
        assert boot == ",".join(f"127.0.0.1:{base + 10 * i + 2}" for i in (1, 2, 3))
        pids = [int(open(os.path.join(d, f"node-{i}.pid")).read()) for i in (1, 2, 3)]
        assert _run("status", "--dir", d).returncode == 0
        again = _run("start", "--dir", d, "--base-port", str(base))
        assert again.returncode == 1 and "already running" in again.stderr
        admin = AdminClient({"bootstrap.servers": boot})
        assert admin.create_topics([NewTopic("dev", num_partitions=3, replication_factor=3)])["dev"].result(15) is None
        assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
    finally:
        s = _run("stop", "--dir", d)
    assert s.returncode == 0 and "stopped 3 node(s)" in s.stdout
    for p in pids:
        assert not os.path.exists(f"/proc/{p}") or b"serve" not in open(f"/proc/{p}/cmdline", "rb").read()
    assert _run("status", "--dir", d).returncode == 1
    # a second start reuses the formatted storage: the topic is still there
    r = _run("start", "--dir", d, "--base-port", str(base))
    try:
        assert r.returncode == 0, r.stderr
        md = AdminClient({"bootstrap.servers": boot}).list_topics(timeout=10)
        assert "dev" in md.topics
    finally:
        assert _run("stop", "--dir", d).returncode == 0
