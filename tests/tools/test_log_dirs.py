"""kbroker log-dirs (kafka-log-dirs.sh) against a real broker: the replica sizes it reports
are the bytes of the partition's files on disk."""
import json
import os

from confluent_kafka import Producer

from tests.broker.kafka_helpers import create_topic
from tests.tools.conftest import name


def test_log_dirs(broker, tool):
    t, other = name("ld"), name("ld")
    create_topic(broker.bootstrap, t, partitions=2)
    create_topic(broker.bootstrap, other)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(50):
        p.produce(t, value=b"x" * 100, partition=i % 2)
    assert p.flush(30) == 0
    r = tool("log-dirs", "--describe", "--topic-list", t)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["Querying brokers for log directories information",
                         "Received log directory information from brokers 1"]
    doc = json.loads(lines[2])
    assert doc["version"] == 1 and [b["broker"] for b in doc["brokers"]] == [1]
    (d,) = doc["brokers"][0]["logDirs"]
    assert d["error"] is None and os.path.isdir(d["logDir"])
    parts = {x["partition"]: x for x in d["partitions"]}
    assert sorted(parts) == [f"{t}-0", f"{t}-1"]
    for pname, x in parts.items():
        on_disk = sum(os.path.getsize(os.path.join(d["logDir"], pname, f))
                      for f in os.listdir(os.path.join(d["logDir"], pname)) if f.endswith(".log"))
        assert x["size"] == on_disk > 25 * 100
        assert x["offsetLag"] == 0 and x["isFuture"] is False
    r = tool("log-dirs", "--describe")
    names = {x["partition"] for x in json.loads(r.stdout.splitlines()[2])["brokers"][0]["logDirs"][0]["partitions"]}
    assert {f"{t}-0", f"{t}-1", f"{other}-0"} <= names
    r = tool("log-dirs", "--describe", "--broker-list", "1,7")
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: The given brokers do not exist from --broker-list: 7. "
                                "Current existent brokers: 1")
    r = tool("log-dirs", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("This tool helps to query log directory usage")
