"""Two zero-config kbroker brokers (clusters A and B) per module and a ``kbroker mirror``
child process per test, stopped by its own PID."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kbroker.client import Admin, Consumer, TopicPartition
from kbroker.testing import KBrokerProcess, free_port

BROKER = {"num.partitions": 1, "group.initial.rebalance.delay.ms": 0}
#: fast cadences so a test sees every periodic job within a couple of seconds
FAST = {
    "replication.factor": 1, "offset-syncs.topic.replication.factor": 1,
    "checkpoints.topic.replication.factor": 1, "heartbeats.topic.replication.factor": 1,
    "refresh.topics.interval.seconds": 1, "sync.topic.configs.interval.seconds": 1,
    "emit.checkpoints.interval.seconds": 1, "sync.group.offsets.interval.seconds": 1,
    "offset.flush.interval.ms": 300,
}


def wait_until(cond, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


@pytest.fixture(scope="module")
def cluster_a():
    with KBrokerProcess(overrides=BROKER).start() as a:
        yield a


@pytest.fixture(scope="module")
def cluster_b():
    with KBrokerProcess(overrides=BROKER).start() as b:
        yield b


class MirrorProcess:
    """``python -m kbroker mirror`` on a written mm2.properties."""

    def __init__(self, tmp_path, props: dict):
        self.dir = tmp_path
        self.config = os.path.join(tmp_path, "mm2.properties")
        with open(self.config, "w", encoding="utf-8") as f:
            f.write("".join(f"{k} = {v}\n" for k, v in props.items()))
        self.metrics_port = free_port()
        self.log_path = os.path.join(tmp_path, "mirror.log")
        self.proc = None

    def start(self) -> "MirrorProcess":
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(root, "src"), env.get("PYTHONPATH")]))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "kbroker", "mirror", "--config", self.config,
                                      "--metrics-port", str(self.metrics_port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def terminate(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc, self.proc = self.proc.returncode, None
        return rc

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()


@pytest.fixture
def mirror(tmp_path):
    started = []

    def make(props: dict) -> MirrorProcess:
        d = tmp_path / f"m{len(started)}"
        d.mkdir()
        m = MirrorProcess(str(d), props)
        started.append(m)
        return m.start()
    yield make
    for m in started:
        m.terminate()


def mm2_props(a, b, flows=("A->B",), **extra) -> dict:
    props = {"clusters": "A, B", "A.bootstrap.servers": a.bootstrap, "B.bootstrap.servers": b.bootstrap}
    props.update({f"{f}.enabled": "true" for f in flows})
    props.update(FAST)
    props.update({k.replace("_", "."): v for k, v in extra.items()})
    return props


def topics(bootstrap: str) -> set[str]:
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        return set(admin.list_topics())


def read_partitions(bootstrap: str, topic: str, timeout_s: float = 10.0) -> dict[int, list]:
    """Every record of every partition of ``topic`` (to the end offsets now)."""
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                  "allow.auto.create.topics": False})
    try:
        parts = c.partitions_for_topic(topic, timeout=timeout_s)
        tps = [TopicPartition(topic, p) for p in parts]
        c.assign(tps)
        ends = c.end_offsets(tps, timeout=timeout_s)
        out = {p: [] for p in parts}
        deadline = time.monotonic() + timeout_s
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end")
            for r in c.poll(0.2):
                out[r.partition].append(r)
        return out
    finally:
        c.close()


def count(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    try:
        cl = c.list_topics(timeout=5)
        if topic not in cl.topics:
            return -1
        tps = [TopicPartition(topic, p.partition) for p in cl.topics[topic]]
        return sum(c.end_offsets(tps, timeout=5).values())
    finally:
        c.close()
