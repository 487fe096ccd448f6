"""kbroker console-producer / console-consumer (kafka-console-*.sh) against a real broker:
what the producer tool writes is what confluent-kafka reads (keys, values, headers), what
confluent-kafka writes the consumer tool prints in Kafka's formatter layout, and the two
tools round-trip arbitrary bytes with the base64/hex encodings."""
import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.kafka_helpers import create_topic
from tests.tools.conftest import name


def read_all(bootstrap, topic, n, partitions=1, timeout_s=30):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": name("rd"), "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < n:
            assert time.monotonic() < deadline, f"read {len(out)} of {n}"
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append((m.key(), m.value(), m.headers() or []))
    finally:
        c.close()
    return out


def test_producer_lines_with_keys_and_headers(broker, tool):
    t = name("cp")
    create_topic(broker.bootstrap, t)
    lines = "h1:v1,h2:v2\tk1\thello world\nh3:\tk2\tsecond\t with tab\nNULL\tk3\tNULL\n"
    r = tool("console-producer", "--topic", t, "--property", "parse.key=true", "--property", "parse.headers=true",
             "--property", "null.marker=NULL", input=lines)
    assert r.returncode == 0, r.stderr
    assert read_all(broker.bootstrap, t, 3) == [
        (b"k1", b"hello world", [("h1", b"v1"), ("h2", b"v2")]),
        (b"k2", b"second\t with tab", [("h3", b"")]),
        (b"k3", None, []),
    ]
    # the consumer prints them in Kafka's layout, from a given partition and offset
    r = tool("console-consumer", "--topic", t, "--partition", 0, "--offset", 1, "--max-messages", 2,
             "--property", "print.key=true", "--property", "print.headers=true", "--property", "print.offset=true",
             "--property", "print.partition=true", "--property", "key.separator=|")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Partition:0|Offset:1|h3:|k2|second\t with tab\nPartition:0|Offset:2|NO_HEADERS|k3|null\n"
    assert r.stderr.strip().endswith("Processed a total of 2 messages")
    # a line without the key separator: one-line error, exit 1
    r = tool("console-producer", "--topic", t, "--property", "parse.key=true", input="a\tb\nno-separator\n")
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: No key separator found on line number 2: 'no-separator'"


def test_consumer_prints_what_confluent_wrote(broker, tool):
    t = name("cc")
    create_topic(broker.bootstrap, t, partitions=2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(6):
        p.produce(t, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, timestamp=1_700_000_000_000 + i,
                  headers=[("n", b"%d" % i)])
    assert p.flush(30) == 0
    g = name("g")
    r = tool("console-consumer", "--topic", t, "--group", g, "--from-beginning", "--max-messages", 6,
             "--property", "print.timestamp=true", "--property", "print.key=true", "--property", "print.headers=true")
    assert r.returncode == 0, r.stderr
    got = sorted(r.stdout.splitlines(), key=lambda ln: ln.split("\t")[2])
    assert got == [f"CreateTime:{1_700_000_000_000 + i}\tn:{i}\tk{i}\tv{i}" for i in range(6)]
    # --group commits what it consumed (auto commit on close)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": g})
    try:
        committed = c.committed([TopicPartition(t, 0), TopicPartition(t, 1)], timeout=10)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [3, 3]
    # --timeout-ms ends a read with nothing new (exit 0); --max-messages stops early
    r = tool("console-consumer", "--topic", t, "--group", g, "--timeout-ms", 1500)
    assert r.returncode == 0 and r.stdout == "" and "Processed a total of 0 messages" in r.stderr
    r = tool("console-consumer", "--include", t.replace("-", "."), "--from-beginning", "--max-messages", 4)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 4


def test_binary_round_trip(broker, tool):
    """confluent -> console-consumer (base64 value, hex key and header) -> console-producer
    (same encodings) -> confluent: every byte survives, newlines and NULs included."""
    src, dst = name("bin"), name("bin")
    create_topic(broker.bootstrap, src)
    create_topic(broker.bootstrap, dst)
    rnd = [os.urandom(n) for n in (0, 1, 17, 300)] + [b"line1\nline2\r\n", b"\x00\xff\t,:"]
    msgs = [(os.urandom(8), v, [("h", os.urandom(5))]) for v in rnd]
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for k, v, h in msgs:
        p.produce(src, key=k, value=v, headers=h)
    assert p.flush(30) == 0
    enc = ["--property", "key.encoding=hex", "--property", "value.encoding=base64",
           "--property", "headers.encoding=base64"]
    r = tool("console-consumer", "--topic", src, "--from-beginning", "--max-messages", len(msgs),
             "--property", "print.key=true", "--property", "print.headers=true", *enc, binary=True)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(msgs)
    r = tool("console-producer", "--topic", dst, "--property", "parse.key=true", "--property", "parse.headers=true",
             *enc, input=r.stdout, binary=True)
    assert r.returncode == 0, r.stderr
    assert read_all(broker.bootstrap, dst, len(msgs)) == msgs
    # without an encoding, bytes pass through unchanged (a value without newlines)
    r = tool("console-consumer", "--topic", src, "--partition", 0, "--offset", 5, "--max-messages", 1, binary=True)
    assert r.stdout == b"\x00\xff\t,:\n"


def test_console_usage_errors(tool):
    r = tool("console-producer", "--property", "parse.key=true")
    assert r.returncode == 1 and r.stderr.strip() == 'Error: Missing required argument "[topic]"'
    r = tool("console-consumer", "--topic", "t", "--offset", "5")
    assert r.returncode == 1 and r.stderr.strip() == "Error: The partition is required when offset is specified."
    r = tool("console-consumer", "--topic", "t", "--partition", "0", "--offset", "-3")
    assert r.returncode == 1 and "The provided offset value '-3' is incorrect" in r.stderr
    r = tool("console-consumer", "--topic", "t", "--group", "a", "--consumer-property", "group.id=b")
    assert r.returncode == 1 and "do not match" in r.stderr
    r = tool("console-producer", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("This tool helps to read data from standard input")
    r = tool("console-consumer", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("This tool helps to read data from Kafka topics")
