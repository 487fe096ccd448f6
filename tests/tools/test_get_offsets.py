"""kbroker get-offsets (kafka-get-offsets.sh) against a real broker, checked with confluent-kafka's
watermarks and offsets_for_times."""
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.kafka_helpers import create_topic
from tests.tools.conftest import name

TS0 = (int(time.time()) - 3600) * 1000


def test_get_offsets(broker, tool):
    t, other = name("go"), name("go")
    create_topic(broker.bootstrap, t, partitions=3)
    create_topic(broker.bootstrap, other, partitions=1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for part, n in enumerate([4, 0, 7]):
        for i in range(n):
            p.produce(t, value=b"x", partition=part, timestamp=TS0 + i * 1000)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": name("g")})
    try:
        marks = {i: c.get_watermark_offsets(TopicPartition(t, i), timeout=10) for i in range(3)}
        at = c.offsets_for_times([TopicPartition(t, i, TS0 + 2500) for i in range(3)], timeout=10)
    finally:
        c.close()

    r = tool("get-offsets", "--topic", t)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"{t}:{i}:{marks[i][1]}" for i in range(3)] == [f"{t}:0:4", f"{t}:1:0", f"{t}:2:7"]
    r = tool("get-offsets", "--topic", t, "--time", "-2")
    assert r.stdout.split() == [f"{t}:{i}:{marks[i][0]}" for i in range(3)]
    r = tool("get-offsets", "--topic", t, "--time", "earliest", "--partitions", "0,2")
    assert r.stdout.split() == [f"{t}:0:0", f"{t}:2:0"]
    # a timestamp: the first offset at or after it; none for an empty partition (no line)
    r = tool("get-offsets", "--topic", t, "--time", TS0 + 2500)
    expect = {tp.partition: tp.offset for tp in at if tp.offset >= 0}
    assert r.stdout.split() == [f"{t}:{p_}:{o}" for p_, o in sorted(expect.items())] == [f"{t}:0:3", f"{t}:2:3"]
    r = tool("get-offsets", "--topic", t, "--time", "-3")     # the record with the largest timestamp
    assert r.stdout.split() == [f"{t}:0:3", f"{t}:2:6"]
    # --topic is a regular expression; --topic-partitions takes patterns with ranges
    r = tool("get-offsets", "--topic", f"{t}|{other}")
    assert r.stdout.split() == sorted([f"{t}:0:4", f"{t}:1:0", f"{t}:2:7", f"{other}:0:0"],
                                      key=lambda s: s.rsplit(":", 1)[0].replace(":", "-"))
    r = tool("get-offsets", "--topic-partitions", f"{t}:1-,{other}")
    assert sorted(r.stdout.split()) == sorted([f"{t}:1:0", f"{t}:2:7", f"{other}:0:0"])
    # errors: one line, exit 1
    r = tool("get-offsets", "--topic", "no-such-topic-.*")
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: Could not match any topic-partitions with the specified filters"
    r = tool("get-offsets", "--topic", t, "--time", "yesterday")
    assert r.returncode == 1 and r.stderr.startswith("Error: Malformed time argument yesterday.")
    r = tool("get-offsets", "--topic-partitions", t, "--topic", t)
    assert r.returncode == 1 and "cannot be used with --topic" in r.stderr
    r = tool("get-offsets", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("An interactive shell for getting topic-partition offsets.")
