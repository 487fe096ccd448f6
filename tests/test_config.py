"""KafkaConfig: Kafka's names and defaults; bad keys stop start-up naming the key."""
import pytest

from kbroker.config_def import ConfigError, read_properties
from kbroker.server.config import KafkaConfig


def test_embedded_defaults():
    c = KafkaConfig()
    assert [(l.name, l.host, l.port) for l in c.listeners] == [("PLAINTEXT", "127.0.0.1", 9092)]
    assert c.node_id == 1
    assert c.log_dirs == ["./kbroker-data"]
    assert c["num.network.threads"] == 3 and c["num.io.threads"] == 8
    assert c["message.max.bytes"] == 1048588
    assert c.log_retention_ms == 168 * 3600 * 1000


def test_retention_precedence():
    assert KafkaConfig({"log.retention.hours": "1"}).log_retention_ms == 3_600_000
    assert KafkaConfig({"log.retention.hours": "1", "log.retention.minutes": "2"}).log_retention_ms == 120_000
    assert KafkaConfig({"log.retention.minutes": "2", "log.retention.ms": "5"}).log_retention_ms == 5
    assert KafkaConfig({"log.retention.hours": "-1"}).log_retention_ms == -1


@pytest.mark.parametrize("props,key", [
    ({"no.such.key": "1"}, "no.such.key"),
    ({"num.io.threads": "many"}, "num.io.threads"),
    ({"num.io.threads": "0"}, "num.io.threads"),
    ({"auto.create.topics.enable": "yes"}, "auto.create.topics.enable"),
    ({"listeners": "PLAINTEXT//nohost"}, "listeners"),
    ({"listener.security.protocol.map": "PLAINTEXT:FOO"}, "listener.security.protocol.map"),
    # issue #18: an SSL listener without a key store; a SASL one without mechanisms / JAAS
    ({"listener.security.protocol.map": "PLAINTEXT:SSL"}, "ssl.keystore.location"),
    ({"listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT"}, "sasl.enabled.mechanisms"),
    ({"listener.security.protocol.map": "PLAINTEXT:SASL_SSL", "ssl.keystore.type": "PEM",
      "ssl.keystore.location": "/nonexistent.pem"}, "ssl.keystore.location"),
    ({"listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT", "sasl.enabled.mechanisms": "PLAIN"},
     "listener.name.plaintext.plain.sasl.jaas.config"),
    ({"listener.security.protocol.map": "PLAINTEXT:SASL_PLAINTEXT",
      "listener.name.plaintext.sasl.enabled.mechanisms": "GSSAPI"},
     "listener.name.plaintext.sasl.enabled.mechanisms"),
    ({"listener.name.plaintext.ssl.no.such.key": "1"}, "listener.name.plaintext.ssl.no.such.key"),
    ({"listener.name.other.ssl.client.auth": "required"}, "listener.name.other"),
    ({"log.cleanup.policy": "delete,shred"}, "log.cleanup.policy"),
    ({"group.min.session.timeout.ms": "10", "group.max.session.timeout.ms": "5"}, "group.min.session.timeout.ms"),
    # the network layer's memory and connection limits (Kafka's KafkaConfig.validateValues)
    ({"queued.max.request.bytes": "1048576"}, "queued.max.request.bytes"),      # < socket.request.max.bytes
    ({"queued.max.request.bytes": "lots"}, "queued.max.request.bytes"),
    ({"max.connections.per.ip": "0"}, "max.connections.per.ip"),               # 0 needs overrides
    ({"max.connections.per.ip": "-1"}, "max.connections.per.ip"),
    ({"max.connections": "-1"}, "max.connections"),
    ({"max.connections.per.ip.overrides": "127.0.0.1"}, "max.connections.per.ip.overrides"),
    ({"max.connections.per.ip.overrides": "127.0.0.1:many"}, "max.connections.per.ip.overrides"),
    ({"max.connections.per.ip.overrides": ":5"}, "max.connections.per.ip.overrides"),
    ({"max.connections.per.ip.overrides": "bad/host:5"}, "max.connections.per.ip.overrides"),
    ({"max.connections.per.ip.overrides": "no-such-host.invalid:5"}, "max.connections.per.ip.overrides"),
    ({"connections.max.idle.ms": "soon"}, "connections.max.idle.ms"),
])
def test_bad_values_name_the_key(props, key):
    with pytest.raises(ConfigError) as e:
        KafkaConfig(props)
    assert e.value.key == key
    assert str(e.value).startswith(key)


def test_properties_file_and_overrides(tmp_path):
    p = tmp_path / "server.properties"
    p.write_text("# comment\n! other comment\nnode.id=7\nlisteners = PLAINTEXT://127.0.0.1:9999\n"
                 "log.dirs: /tmp/a,/tmp/b\nnum.io.threads 4\nlog.retention.hours=\\\n  24\n")
    assert read_properties(str(p))["log.retention.hours"] == "24"
    c = KafkaConfig.from_sources(str(p), ["num.io.threads=2"])
    assert c.node_id == 7
    assert c.listeners[0].port == 9999
    assert c.log_dirs == ["/tmp/a", "/tmp/b"]
    assert c["num.io.threads"] == 2
    assert c.log_retention_ms == 24 * 3_600_000
    with pytest.raises(ConfigError) as e:
        KafkaConfig.from_sources(None, ["novalue"])
    assert e.value.key == "--override"


def test_network_limits_defaults_and_overrides():
    """Kafka's defaults: no memory pool (-1), no connection limits; overrides are
    "host:count" pairs split at the last colon, hosts resolved to normalised IPs."""
    c = KafkaConfig()
    assert c["queued.max.request.bytes"] == -1
    assert c["max.connections"] == c["max.connections.per.ip"] == 2**31 - 1
    assert c["connections.max.idle.ms"] == 600000
    assert c.max_connections_per_ip_overrides == {}
    c = KafkaConfig({"max.connections.per.ip": "0", "queued.max.request.bytes": "104857600",
                     "max.connections.per.ip.overrides": "127.0.0.1:5 , ::1:7,::ffff:10.1.2.3:0,localhost:2"})
    assert c["queued.max.request.bytes"] == 104857600
    overrides = c.max_connections_per_ip_overrides
    assert overrides["10.1.2.3"] == 0 and overrides["::1"] in (7, 2)
    assert overrides["127.0.0.1"] == 2            # localhost resolves to it, later entry wins
    assert KafkaConfig({"queued.max.request.bytes": "0"})["queued.max.request.bytes"] == 0
    assert KafkaConfig({"queued.max.request.bytes": "1024", "socket.request.max.bytes": "1024"})
