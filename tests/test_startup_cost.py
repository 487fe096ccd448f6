"""What a broker start-up must not pay for (issue 23: 10,000 partitions restart in
seconds): the client's producer, consumer and admin modules (and numpy) are not imported
by the broker, whose inter-node senders only need ``kbroker.client.errors`` and the
network client; the names of ``kbroker.client`` still resolve, on first use."""
import os
import subprocess
import sys
import textwrap

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _run(code: str, tmp_path) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_started_broker_has_not_imported_the_client_producer_consumer_admin(tmp_path):
    out = _run(f"""
        import sys
        from kbroker.server.config import KafkaConfig
        from kbroker.server.broker import KafkaBroker
        cfg = KafkaConfig.from_sources(None, ["listeners=PLAINTEXT://127.0.0.1:0",
                                              "log.dirs={tmp_path / 'logs'}"])
        b = KafkaBroker(cfg)
        b.startup()
        try:
            print(sorted(m for m in sys.modules if m == "numpy" or m.startswith((
                "kbroker.client.producer", "kbroker.client.consumer", "kbroker.client.admin"))))
        finally:
            b.shutdown()
    """, tmp_path)
    assert out.strip().splitlines()[-1] == "[]"


def test_the_client_package_names_resolve_on_first_use(tmp_path):
    out = _run("""
        import kbroker.client as c
        from kbroker.client import Producer, TopicPartition, KafkaError, NewTopic
        from kbroker.client.producer import Producer as P2
        assert Producer is P2 and c.Producer is P2
        ns = {}
        exec("from kbroker.client import *", ns)
        missing = [n for n in c.__all__ if n not in ns]
        assert not missing, missing
        assert "Consumer" in dir(c)
        try:
            c.NoSuchThing
        except AttributeError:
            print("ok")
    """, tmp_path)
    assert out.strip() == "ok"
