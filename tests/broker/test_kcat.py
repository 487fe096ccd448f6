"""kcat (Debian package) lists metadata, produces and consumes."""
import subprocess
import uuid

from tests.broker.kafka_helpers import needs_kcat

pytestmark = needs_kcat


def kcat(*args, input=None, timeout=30):
    return subprocess.run(["kcat", *args], input=input, capture_output=True, timeout=timeout, check=True)


def test_kcat_metadata_produce_consume(broker):
    topic = "kcat-" + uuid.uuid4().hex[:8]
    lines = b"".join(b"line-%d\n" % i for i in range(50))
    kcat("-b", broker.bootstrap, "-P", "-t", topic, "-p", "0", input=lines)
    md = kcat("-b", broker.bootstrap, "-L").stdout.decode()
    assert f'topic "{topic}" with 1 partitions' in md
    assert "broker 1 at 127.0.0.1" in md
    out = kcat("-b", broker.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-f", "%o:%s\n").stdout
    assert out == b"".join(b"%d:line-%d\n" % (i, i) for i in range(50))
