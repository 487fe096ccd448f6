"""One kbroker broker and one ``kbroker schema-registry`` per test module, on free ports."""
import pytest

from kbroker.schema_registry.testing import SchemaRegistryProcess
from kbroker.testing import KBrokerProcess


@pytest.fixture(scope="module")
def broker():
    b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, f"broker exited with {rc} on SIGTERM; log tail:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def registry(broker):
    r = SchemaRegistryProcess(broker.bootstrap)
    r.start()
    yield r
    rc = r.terminate()
    log = r.read_log()
    r.__exit__(None, None, None)
    assert rc == 0, f"registry exited with {rc} on SIGTERM; log tail:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture
def client(registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    c = SchemaRegistryClient({"url": registry.url})
    yield c
    c.close()
