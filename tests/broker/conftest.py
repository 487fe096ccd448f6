"""Fixtures that start a real ``kbroker serve`` process on 127.0.0.1 and a free port."""
import pytest

from kbroker.testing import KBrokerProcess


@pytest.fixture(scope="module")
def broker():
    """One broker process per test module (fast suite); tests use distinct topics."""
    b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, f"broker exited with {rc} on SIGTERM; log tail:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture
def fresh_broker(tmp_path):
    """A broker of its own, on a given data dir, for restart/crash tests."""
    procs = []

    def start(**overrides):
        b = KBrokerProcess(data_dir=str(tmp_path), overrides=overrides,
                           port=procs[-1].port if procs else None)
        b.start()
        procs.append(b)
        return b

    yield start
    for b in procs:
        b.kill()
