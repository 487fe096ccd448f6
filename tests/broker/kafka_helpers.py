"""Small confluent-kafka helpers shared by the real-client broker tests."""
import os
import shutil
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


#: kcat is a Debian package (tools/test.sh installs it): a developer's run without it
#: skips the kcat tests; in CI (CI set) a missing kcat is a failure.
needs_kcat = pytest.mark.skipif(shutil.which("kcat") is None and not os.environ.get("CI"),
                                reason="kcat not installed (tools/test.sh installs it; in CI this fails)")


def _topic(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap, name, partitions=1, config=None):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                        config=config or {})], operation_timeout=10)[name]
    fut.result(timeout=15)
    return admin


def produce(bootstrap, topic, messages, **conf):
    """messages: list of (partition, key, value, headers). Returns delivery reports."""
    reports = []
    p = Producer({"bootstrap.servers": bootstrap, **conf})

    def cb(err, msg):
        reports.append((err, msg.partition(), msg.offset(), msg.key(), msg.value()))

    for part, key, value, headers in messages:
        kw = {"partition": part} if part is not None else {}
        p.produce(topic, value=value, key=key, headers=headers, on_delivery=cb, **kw)
        p.poll(0)
    assert p.flush(30) == 0
    return reports


def consume_assigned(bootstrap, topic, partitions, expected, offset=ck.OFFSET_BEGINNING, timeout_s=30):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, offset) for p in partitions])
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        out.append(m)
    c.close()
    return out
