"""Operator-tool tests: one real ``kbroker serve`` per test module; each tool runs as a process
(``sys.executable -m kbroker <tool>``, PYTHONPATH inherited) and is checked against
confluent-kafka's AdminClient / Consumer."""
import os
import subprocess
import sys
import uuid

import pytest

from kbroker.testing import KBrokerProcess

OVERRIDES = {
    "num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
    "group.consumer.min.session.timeout.ms": 1000, "group.consumer.session.timeout.ms": 6000,
    "group.consumer.min.heartbeat.interval.ms": 100, "group.consumer.heartbeat.interval.ms": 500,
}


@pytest.fixture(scope="module")
def broker():
    b = KBrokerProcess(overrides=OVERRIDES)
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, log[-4000:]
    assert "Traceback" not in log, log[-6000:]


def name(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def tool(broker):
    """``tool("consumer-groups", "--list", ...)`` -> CompletedProcess (text, 60 s cap);
    --bootstrap-server is added unless ``bootstrap=False``."""
    def run(name, *args, bootstrap=True, input=None, binary=False, timeout=60):
        argv = [sys.executable, "-m", "kbroker", name]
        if bootstrap:
            argv += ["--bootstrap-server", broker.bootstrap]
        argv += [str(a) for a in args]
        return subprocess.run(argv, input=input, capture_output=True, text=not binary, timeout=timeout,
                              env=dict(os.environ))
    return run
