"""KRaft cluster-mode configuration (process.roles set): Kafka 3.9's KRaftConfigs/QuorumConfig
keys and KafkaConfig.validateValues cross-key rules, each a one-line error naming a key."""
import pytest

from kbroker.config_def import ConfigError
from kbroker.server.config import KafkaConfig

VOTERS = "1@127.0.0.1:19093,2@127.0.0.1:29093,3@127.0.0.1:39093"

COMBINED = {
    "process.roles": "broker,controller", "node.id": "1", "controller.quorum.voters": VOTERS,
    "listeners": "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
}
CONTROLLER = {
    "process.roles": "controller", "node.id": "2", "controller.quorum.voters": VOTERS,
    "listeners": "CONTROLLER://127.0.0.1:29093", "controller.listener.names": "CONTROLLER",
}
BROKER = {
    "process.roles": "broker", "node.id": "4", "controller.quorum.voters": VOTERS,
    "listeners": "PLAINTEXT://127.0.0.1:49092", "controller.listener.names": "CONTROLLER",
}


def _with(base, **changes):
    props = dict(base)
    for k, v in changes.items():
        k = k.replace("_", ".")
        if v is None:
            props.pop(k, None)
        else:
            props[k] = v
    return props


def test_kafka_defaults_of_the_kraft_keys():
    c = KafkaConfig()
    assert c["process.roles"] == [] and not c.cluster_mode
    assert c.node_id == 1                               # zero-config mode
    for key, default in {
        "broker.session.timeout.ms": 9000, "broker.heartbeat.interval.ms": 2000,
        "controller.quorum.election.timeout.ms": 1000, "controller.quorum.fetch.timeout.ms": 2000,
        "controller.quorum.election.backoff.max.ms": 1000, "controller.quorum.request.timeout.ms": 2000,
        "metadata.log.segment.bytes": 1073741824, "metadata.max.retention.ms": 604800000,
        "metadata.max.retention.bytes": 104857600,
        "metadata.log.max.record.bytes.between.snapshots": 20971520,
        "metadata.log.max.snapshot.interval.ms": 3600000, "metadata.log.dir": None,
        "controller.quorum.voters": [], "controller.quorum.bootstrap.servers": [], "broker.rack": None,
    }.items():
        assert c[key] == default, key
    assert c.metadata_log_dir == c.log_dirs[0]
    assert KafkaConfig({"broker.id": "5"}).node_id == 5


@pytest.mark.parametrize("props", [COMBINED, CONTROLLER, BROKER], ids=["combined", "controller", "broker"])
def test_valid_cluster_configs(props):
    c = KafkaConfig(props)
    assert c.cluster_mode and c.node_id == int(props["node.id"])
    assert c.voters[1] == ("127.0.0.1", 19093)
    assert all(l.name != "CONTROLLER" for l in c.advertised_listeners)


def test_bootstrap_servers_instead_of_voters_and_metadata_log_dir():
    c = KafkaConfig(_with(COMBINED, controller_quorum_voters=None,
                          **{"controller_quorum_bootstrap_servers": "127.0.0.1:19093,[::1]:29093"},
                          metadata_log_dir="/tmp/meta"))
    assert c.voters == {} and c.metadata_log_dir == "/tmp/meta"


@pytest.mark.parametrize("props,key,text", [
    (_with(COMBINED, process_roles="broker,zookeeper"), "process.roles", "broker, controller"),
    (_with(COMBINED, process_roles="broker,broker"), "process.roles", "Duplicate role names"),
    (_with(COMBINED, node_id=None), "node.id", "required when `process.roles` is defined"),
    (_with(COMBINED, broker_id="2"), "broker.id", "same value"),
    (_with(COMBINED, controller_quorum_voters=None), "controller.quorum.voters", "either"),
    (_with(BROKER, controller_quorum_voters=None), "controller.quorum.voters", "either"),
    (_with(COMBINED, controller_quorum_voters="1@127.0.0.1"), "controller.quorum.voters", "{id}@{host}:{port}"),
    (_with(COMBINED, controller_quorum_voters="one@127.0.0.1:9093"), "controller.quorum.voters", "voter ID"),
    (_with(COMBINED, controller_quorum_voters="1-127.0.0.1:9093"), "controller.quorum.voters", "{id}@{host}:{port}"),
    (_with(COMBINED, controller_quorum_voters=None, **{"controller_quorum_bootstrap_servers": "nohostport"}),
     "controller.quorum.bootstrap.servers", "{host}:{port}"),
    # a controller must be a voter, on a port one of its controller listeners binds
    (_with(COMBINED, node_id="7"), "controller.quorum.voters", "must be included in the set of voters"),
    (_with(CONTROLLER, node_id="7"), "controller.quorum.voters", "must be included in the set of voters"),
    (_with(COMBINED, listeners="PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19999"),
     "controller.quorum.voters", "port"),
    # a broker-only node must not be a voter
    (_with(BROKER, node_id="1"), "controller.quorum.voters", "must not be included"),
    # controller.listener.names: set, and a listener of a controller
    (_with(COMBINED, controller_listener_names=None), "controller.listener.names", "at least one value"),
    (_with(CONTROLLER, controller_listener_names=None, listener_security_protocol_map="CONTROLLER:PLAINTEXT"),
     "listeners", "must only contain KRaft controller listeners"),     # Kafka checks this one first
    (_with(CONTROLLER, controller_listener_names=None), "listener.security.protocol.map", "CONTROLLER"),
    (_with(BROKER, controller_listener_names=None), "controller.listener.names", "at least one value"),
    (_with(COMBINED, controller_listener_names="CONTROLLER,OTHER"), "controller.listener.names",
     "must only contain values appearing in the 'listeners'"),
    (_with(CONTROLLER, listeners="CONTROLLER://127.0.0.1:29093,PLAINTEXT://127.0.0.1:29092"), "listeners",
     "must only contain KRaft controller listeners"),
    # a broker-only node neither listens on nor advertises a controller listener
    (_with(BROKER, listeners="PLAINTEXT://127.0.0.1:49092,CONTROLLER://127.0.0.1:49093"), "listeners",
     "must not contain a value appearing in the 'listeners'"),
    (_with(BROKER, advertised_listeners="PLAINTEXT://127.0.0.1:49092,CONTROLLER://127.0.0.1:49093"),
     "advertised.listeners", "must not contain KRaft controller listeners"),
    (_with(BROKER, listener_security_protocol_map="PLAINTEXT:PLAINTEXT"), "listener.security.protocol.map",
     "Controller listener with name CONTROLLER"),
    # the broker role: an advertised broker listener, the inter-broker one among them
    (_with(COMBINED, listeners="CONTROLLER://127.0.0.1:19093"), "listeners", "at least one broker advertised"),
    (_with(COMBINED, inter_broker_listener_name="INTERNAL"), "inter.broker.listener.name",
     "not found in listener.security.protocol.map"),
    (_with(COMBINED, inter_broker_listener_name="INTERNAL",
           listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT"),
     "inter.broker.listener.name", "must be a listener name defined in advertised.listeners"),
    (_with(COMBINED, advertised_listeners="OTHER://127.0.0.1:1",
           listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,OTHER:PLAINTEXT",
           inter_broker_listener_name="OTHER"),
     "advertised.listeners", "subset"),
    (_with(COMBINED, advertised_listeners="PLAINTEXT://0.0.0.0:19092"), "advertised.listeners", "0.0.0.0"),
    (_with(COMBINED, listeners="PLAINTEXT://127.0.0.1:19092,CONTROLLER://0.0.0.0:19093",
           advertised_listeners="PLAINTEXT://127.0.0.1:19092"), "advertised.listeners", "0.0.0.0"),
    # an SSL inter-broker listener needs its key store like any SSL listener
    (_with(COMBINED, listener_security_protocol_map="PLAINTEXT:SSL,CONTROLLER:PLAINTEXT"),
     "ssl.keystore.location", "key store"),
    # a SASL controller listener needs a mechanism kbroker serves (the default is GSSAPI)
    (_with(COMBINED, listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"),
     "sasl.enabled.mechanisms", "not supported"),
    (_with(COMBINED, listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL"),
     "ssl.keystore.location", "key store"),
    (_with(COMBINED, listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:TLS"),
     "listener.security.protocol.map", "Invalid security protocol `TLS`"),
    # the metadata log's own limits
    (_with(COMBINED, metadata_log_segment_bytes="11"), "metadata.log.segment.bytes", "at least 12"),
    (_with(COMBINED, **{"metadata_log_max_record_bytes_between_snapshots": "0"}),
     "metadata.log.max.record.bytes.between.snapshots", "at least 1"),
    (_with(COMBINED, **{"metadata_log_max_snapshot_interval_ms": "-1"}),
     "metadata.log.max.snapshot.interval.ms", "at least 0"),
    (_with(COMBINED, broker_session_timeout_ms="soon"), "broker.session.timeout.ms", "soon"),
    (_with(COMBINED, **{"controller_quorum_election_timeout_ms": "x"}), "controller.quorum.election.timeout.ms", "x"),
])
def test_each_rule_names_its_key(props, key, text):
    with pytest.raises(ConfigError) as e:
        KafkaConfig(props)
    assert e.value.key == key, str(e.value)
    assert str(e.value).startswith(key + ": ")
    assert text in str(e.value)
    assert "\n" not in str(e.value)


def test_unused_non_plaintext_mappings_are_accepted():
    """Kafka's own default map (and its sample server.properties) lists SSL and SASL protocols;
    only a listener that would use one is refused."""
    c = KafkaConfig(_with(COMBINED, listener_security_protocol_map=(
        "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL")))
    assert c.security_protocols["SSL"] == "SSL"
    # left at Kafka's default, each controller listener name maps to PLAINTEXT
    c = KafkaConfig(_with(COMBINED, listener_security_protocol_map=None))
    assert c.security_protocols["CONTROLLER"] == "PLAINTEXT"
    with pytest.raises(ConfigError) as e:
        KafkaConfig(_with(COMBINED, listener_security_protocol_map=None,
                          listeners="SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
                          inter_broker_listener_name="SSL"))
    assert e.value.key == "listener.security.protocol.map"


def test_zero_config_mode_is_unchanged():
    """process.roles unset: the single node accepts what it did before (its own voter entry, a
    CONTROLLER listener that is never advertised) and refuses other voters."""
    c = KafkaConfig({"controller.quorum.voters": "1@127.0.0.1:9093",
                     "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"})
    assert not c.cluster_mode
    assert [l.name for l in c.advertised_listeners] == ["PLAINTEXT"]
    with pytest.raises(ConfigError) as e:
        KafkaConfig({"controller.quorum.voters": "1@h:9093,2@h:9093"})
    assert e.value.key == "controller.quorum.voters"
    with pytest.raises(ConfigError) as e:   # would be silently ignored: zero-config has no metadata log
        KafkaConfig({"metadata.log.dir": "/tmp/meta"})
    assert e.value.key == "metadata.log.dir"


JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret";')


def test_secure_controller_and_client_listeners_and_the_inter_node_client_settings():
    """SSL / SASL on a KRaft node's controller listener and its client listeners (not the
    inter-broker one): the node connects to the controllers with the listener's protocol,
    truststore and sasl.mechanism.controller.protocol, logging in as the JAAS username."""
    c = KafkaConfig(_with(BROKER, listener_security_protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL",
                          **{"sasl_mechanism_controller_protocol": "PLAIN",
                             "ssl_truststore_location": "/ca.pem", "ssl_truststore_type": "PEM"},
                          ) | {"listener.name.controller.plain.sasl.jaas.config": JAAS})
    cc = c.inter_node_client_config("CONTROLLER", "sasl.mechanism.controller.protocol")
    assert cc == {"security.protocol": "SASL_SSL", "ssl.truststore.location": "/ca.pem",
                  "ssl.endpoint.identification.algorithm": "https", "sasl.mechanism": "PLAIN",
                  "sasl.jaas.config": JAAS}
    assert c.inter_node_client_config("PLAINTEXT", "sasl.mechanism.inter.broker.protocol") == {
        "security.protocol": "PLAINTEXT"}


def test_inter_broker_client_settings_for_ssl_mutual_tls_and_sasl(tmp_path):
    """The replica fetchers, the transaction markers and KIP-890 verifications connect to
    inter.broker.listener.name with its protocol, TLS settings (the key store only when the
    listener asks for client certificates) and sasl.mechanism.inter.broker.protocol."""
    from tests.security.certs import TestPKI
    pki = TestPKI(str(tmp_path))
    tls = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
           "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file}
    base = _with(BROKER, listeners="PLAINTEXT://127.0.0.1:49092,REPL://127.0.0.1:49093",
                 inter_broker_listener_name="REPL", **{"sasl_enabled_mechanisms": "PLAIN,SCRAM-SHA-512"}) | tls
    c = KafkaConfig(base | {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REPL:SSL"})
    assert c.inter_broker_client_config() == {
        "security.protocol": "SSL", "ssl.truststore.location": pki.ca_file,
        "ssl.endpoint.identification.algorithm": "https"}
    c = KafkaConfig(base | {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REPL:SSL",
                            "listener.name.repl.ssl.client.auth": "required"})
    assert c.inter_broker_client_config()["ssl.keystore.location"] == pki.server["keystore"]
    broker_jaas = JAAS.replace('username="admin"', 'username="broker"')
    c = KafkaConfig(base | {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REPL:SASL_SSL",
                            "sasl.mechanism.inter.broker.protocol": "PLAIN",
                            "listener.name.repl.plain.sasl.jaas.config": broker_jaas})
    cc = c.inter_broker_client_config()
    assert (cc["security.protocol"], cc["sasl.mechanism"], cc["sasl.jaas.config"]) == ("SASL_SSL", "PLAIN", broker_jaas)
    assert "ssl.keystore.location" not in cc
    c = KafkaConfig(base | {"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REPL:SASL_PLAINTEXT",
                            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512", "sasl.jaas.config": JAAS})
    assert c.inter_broker_client_config() == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                              "sasl.jaas.config": JAAS}
