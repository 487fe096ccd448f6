"""KafkaConfig: the broker's configuration, with Apache Kafka's key names and defaults.

Sources, lowest precedence first: built-in defaults (an embedded single-node
set-up: 127.0.0.1:9092, ``./kbroker-data``, node.id 1, combined
broker+controller), a ``server.properties`` file, ``--override key=value``.
Unknown keys and invalid values stop start-up with a :class:`ConfigError`
naming the key. Keys prefixed ``kbroker.`` are ours (no Kafka equivalent).
"""
from __future__ import annotations

import ipaddress
import logging
import re
import socket
from typing import Any, Mapping

from kbroker.network.acceptor import normalise_ip
from kbroker.network.socket_server import Listener
from kbroker.config_def import (
    INT_MAX,
    LONG_MAX,
    ConfigDef,
    ConfigError,
    at_least,
    between,
    one_of,
    read_properties,
)

__all__ = ["KafkaConfig", "ConfigError", "Listener", "BROKER_CONFIG", "BROKER_NO_OP_CONFIGS"]
_log = logging.getLogger(__name__)
_VALID_HOST = re.compile(r"[0-9a-zA-Z\-%._:]*")   # Kafka's Utils.validHostPattern
_HOST_PORT = re.compile(r"^\[?(.+?)\]?:(\d+)$")   # Kafka's Utils.getHost / getPort


def _registry_urls(urls: list[str]) -> str | None:
    """kbroker.schema.registry.url: each entry an absolute http(s) URL with a host."""
    from urllib.parse import urlsplit
    for u in urls:
        try:
            parts = urlsplit(u)
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError as e:
            return f"{u!r} is not a URL ({e})"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"{u!r} is not an http:// or https:// URL with a host"
    return None


def parse_host_port(entry: str) -> tuple[str, int] | None:
    """``host:port`` (IPv6 hosts in brackets or bare) -> (host, port), or None if malformed."""
    m = _HOST_PORT.match(entry.strip())
    if not m or not _VALID_HOST.fullmatch(m.group(1)):
        return None
    return m.group(1), int(m.group(2))


def parse_voters(entries: list[str]) -> dict[int, tuple[str, int]]:
    """``controller.quorum.voters`` -> {id: (host, port)} (Kafka's QuorumConfig.parseVoterConnections);
    ConfigError naming the key, with Kafka's text, if an entry is malformed."""
    key = "controller.quorum.voters"
    voters: dict[int, tuple[str, int]] = {}
    for entry in entries:
        parts = entry.split("@")
        if len(parts) != 2:
            raise ConfigError(key, "Invalid configuration value for controller.quorum.voters. "
                              "Each entry should be in the form `{id}@{host}:{port}`.")
        try:
            voter_id = int(parts[0].strip())
        except ValueError:
            raise ConfigError(key, f"Failed to parse voter ID as an integer from {parts[0]}") from None
        m = _HOST_PORT.match(parts[1].strip())
        if not m or not _VALID_HOST.fullmatch(m.group(1)):
            what = "host port" if m is None and parts[1].strip().rpartition(":")[0] else "host name"
            raise ConfigError(key, f"Failed to parse {what} from entry {entry} for the configuration "
                              "controller.quorum.voters. Each entry should be in the form `{id}@{host}:{port}`.")
        voters[voter_id] = (m.group(1), int(m.group(2)))
    return voters


def _check_voters(value: list[str]) -> str | None:
    parse_voters(value)
    return None


def _check_bootstrap_servers(value: list[str]) -> str | None:
    for entry in value:
        if parse_host_port(entry) is None:
            raise ConfigError("controller.quorum.bootstrap.servers",
                              f"Failed to parse host name and port from {entry} for the configuration "
                              "controller.quorum.bootstrap.servers. Each entry should be in the form "
                              '"{host}:{port}"')
    return None


BROKER_CONFIG = (
    ConfigDef()
    # --- identity and roles (KRaft: Kafka's KRaftConfigs and QuorumConfig) ---
    .define("process.roles", "list", [], one_of("broker", "controller"),
            "broker, controller or both: a node of a KRaft cluster (storage must be formatted with "
            "`kbroker storage format`). Empty: kbroker's zero-config single node (broker and controller, "
            "formats its own storage on first start).")
    .define("node.id", "int", -1, None,
            "This node's id; required when process.roles is set (zero-config mode: broker.id, else 1).")
    .define("broker.id", "int", -1, None, "Legacy synonym of node.id (-1: use node.id).")
    .define("controller.quorum.voters", "list", [], _check_voters,
            "Static quorum: comma-separated {id}@{host}:{port} of every controller.")
    .define("controller.quorum.bootstrap.servers", "list", [], _check_bootstrap_servers,
            "KIP-853 dynamic quorum: {host}:{port} endpoints used to discover the controllers.")
    .define("controller.listener.names", "list", None, None,
            "Listener names the controllers use; the first is the one brokers connect to.")
    .define("controller.quorum.election.timeout.ms", "int", 1000)
    .define("controller.quorum.fetch.timeout.ms", "int", 2000)
    .define("controller.quorum.election.backoff.max.ms", "int", 1000)
    .define("controller.quorum.request.timeout.ms", "int", 2000)
    .define("controller.quorum.retry.backoff.ms", "int", 20)
    .define("controller.quorum.append.linger.ms", "int", 25)
    .define("broker.session.timeout.ms", "int", 9000)
    .define("broker.heartbeat.interval.ms", "int", 2000)
    .define("initial.broker.registration.timeout.ms", "int", 60000)
    .define("metadata.log.dir", "string", None, None,
            "Where the __cluster_metadata log lives; default: the first of log.dirs.")
    .define("metadata.log.segment.bytes", "int", 1073741824, at_least(12))
    .define("metadata.log.segment.ms", "long", 604800000)
    .define("metadata.max.retention.bytes", "long", 104857600)
    .define("metadata.max.retention.ms", "long", 604800000)
    .define("metadata.log.max.record.bytes.between.snapshots", "long", 20971520, at_least(1))
    .define("metadata.log.max.snapshot.interval.ms", "long", 3600000, at_least(0))
    .define("metadata.max.idle.interval.ms", "int", 500, at_least(0))
    .define("cluster.id", "string", None, None,
            "kbroker's own: zero-config mode's cluster id (generated and stored in meta.properties when absent).")
    .define("broker.rack", "string", None)
    # --- listeners and the network layer ---
    .define("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"])
    .define("advertised.listeners", "list", None)
    .define("listener.security.protocol.map", "list",
            ["SASL_SSL:SASL_SSL", "PLAINTEXT:PLAINTEXT", "SSL:SSL", "SASL_PLAINTEXT:SASL_PLAINTEXT"], None,
            "listener name -> security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL; a KRaft node "
            "serves PLAINTEXT only for now).")
    .define("inter.broker.listener.name", "string", None, None,
            "The listener brokers use to reach each other (default: the PLAINTEXT listener).")
    .define("num.network.threads", "int", 3, between(1, 64))
    .define("num.io.threads", "int", 8, between(1, 256))
    .define("queued.max.requests", "int", 500, at_least(1))
    .define("queued.max.request.bytes", "long", -1, None,
            "Bytes of requests in flight (read, not yet answered) the broker allows before it stops "
            "reading from connections; <= 0: unbounded. At least socket.request.max.bytes when set.")
    .define("socket.send.buffer.bytes", "int", 102400)
    .define("socket.receive.buffer.bytes", "int", 102400)
    .define("socket.request.max.bytes", "int", 104857600, at_least(1))
    .define("socket.listen.backlog.size", "int", 50, at_least(1))
    .define("connections.max.idle.ms", "long", 600000, at_least(-1))
    .define("max.connections", "int", INT_MAX, at_least(0))
    .define("max.connections.per.ip", "int", INT_MAX, at_least(0),
            "Connections allowed from each IP address; 0 only with max.connections.per.ip.overrides.")
    .define("max.connection.creation.rate", "int", INT_MAX, at_least(0),
            "New connections accepted per second broker-wide (not counting the inter-broker listener "
            "when there are others); listener.name.<l>.max.connection.creation.rate bounds one listener.")
    .define("max.connections.per.ip.overrides", "string", "", None,
            "Per-IP or per-hostname limits overriding max.connections.per.ip, e.g. 'hostName:100,127.0.0.1:200'.")
    .define("message.max.bytes", "int", 1048588, at_least(0))
    .define("replica.fetch.max.bytes", "int", 1048576, at_least(0))
    # --- replication (a KRaft broker's followers and leaders; Kafka's ReplicationConfigs) ---
    .define("num.replica.fetchers", "int", 1, at_least(1),
            "Fetcher threads per source broker replicating its partitions to this broker.")
    .define("replica.fetch.backoff.ms", "int", 1000, at_least(0))
    .define("replica.fetch.response.max.bytes", "int", 10485760, at_least(0))
    .define("replica.fetch.wait.max.ms", "int", 500, at_least(0))
    .define("replica.fetch.min.bytes", "int", 1, at_least(0))
    .define("replica.lag.time.max.ms", "long", 30000, at_least(1),
            "A follower that has not caught up with the leader's log end for this long leaves the ISR "
            "(checked every half of it).")
    .define("replica.socket.timeout.ms", "int", 30000, at_least(1),
            "The request timeout of a replica fetcher's Fetch and ListOffsets to the leader.")
    .define("replica.high.watermark.checkpoint.interval.ms", "long", 5000, at_least(1))
    .define("fetch.max.bytes", "int", 57671680, at_least(1024))
    .define("max.incremental.fetch.session.cache.slots", "int", 1000, at_least(0),
            "Incremental fetch sessions (KIP-227) the broker keeps; 0: every fetch is sessionless.")
    .define("request.timeout.ms", "int", 30000, at_least(0))
    .define("sasl.kerberos.min.time.before.relogin", "long", 60000, None,
            "Kafka's GSSAPI relogin interval; kbroker has no GSSAPI mechanism (see BROKER_NO_OP_CONFIGS).")
    # --- client quotas ---
    .define("quota.window.num", "int", 11, at_least(1),
            "Samples kept for client quota rates (producer_byte_rate, consumer_byte_rate, request_percentage).")
    .define("quota.window.size.seconds", "int", 1, at_least(1), "The time span of each client quota sample.")
    # --- topics ---
    .define("auto.create.topics.enable", "boolean", True)
    .define("num.partitions", "int", 1, at_least(1))
    .define("default.replication.factor", "int", 1, at_least(1))
    .define("min.insync.replicas", "int", 1, at_least(1))
    .define("delete.topic.enable", "boolean", True)
    .define("unclean.leader.election.enable", "boolean", False)
    .define("compression.type", "string", "producer",
            one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"))
    # --- the log (broker-wide defaults of the topic-level configs) ---
    .define("log.dirs", "list", None)
    .define("log.dir", "string", "./kbroker-data")
    .define("log.segment.bytes", "int", 1073741824, at_least(14))
    .define("log.roll.ms", "long", None, at_least(1))
    .define("log.roll.hours", "int", 168, at_least(1))
    .define("log.roll.jitter.ms", "long", None, at_least(0))
    .define("log.roll.jitter.hours", "int", 0, at_least(0))
    .define("log.index.size.max.bytes", "int", 10485760, at_least(4))
    .define("log.index.interval.bytes", "int", 4096, at_least(0))
    .define("log.retention.ms", "long", None, at_least(-1))
    .define("log.retention.minutes", "int", None, at_least(-1))
    .define("log.retention.hours", "int", 168, at_least(-1))
    .define("log.retention.bytes", "long", -1)
    .define("log.retention.check.interval.ms", "long", 300000, at_least(1))
    .define("log.cleanup.policy", "list", ["delete"], one_of("delete", "compact"))
    .define("log.cleaner.enable", "boolean", True)
    .define("log.cleaner.threads", "int", 1, at_least(0))
    .define("log.cleaner.backoff.ms", "long", 15000, at_least(0))
    .define("log.cleaner.dedupe.buffer.size", "long", 134217728)
    .define("log.cleaner.io.buffer.size", "int", 524288, at_least(0))
    .define("log.cleaner.io.buffer.load.factor", "double", 0.9)
    .define("log.cleaner.min.cleanable.ratio", "double", 0.5, between(0, 1))
    .define("log.cleaner.delete.retention.ms", "long", 86400000, at_least(0))
    .define("log.cleaner.min.compaction.lag.ms", "long", 0, at_least(0))
    .define("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, at_least(1))
    .define("log.flush.interval.messages", "long", LONG_MAX, at_least(1))
    .define("log.flush.interval.ms", "long", None, at_least(0))
    .define("log.flush.scheduler.interval.ms", "long", LONG_MAX)
    .define("log.flush.offset.checkpoint.interval.ms", "int", 60000, at_least(0))
    .define("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, at_least(0))
    .define("log.segment.delete.delay.ms", "long", 60000, at_least(0))
    .define("log.message.timestamp.type", "string", "CreateTime", one_of("CreateTime", "LogAppendTime"))
    .define("log.message.timestamp.before.max.ms", "long", LONG_MAX, at_least(0))
    .define("log.message.timestamp.after.max.ms", "long", LONG_MAX, at_least(0))
    .define("log.preallocate", "boolean", False)
    .define("log.message.downconversion.enable", "boolean", True)
    .define("log.message.format.version", "string", "3.0-IV1",
            lambda v: None if re.fullmatch(r"\d+(\.\d+){1,3}(-IV\d+)?", v) else "must be a Kafka version such as 2.8",
            "Deprecated since Kafka 3.0 and ignored (record batches are always v2); accepted with a warning.")
    .define("log.local.retention.ms", "long", -2, at_least(-2))
    .define("log.local.retention.bytes", "long", -2, at_least(-2))
    .define("num.recovery.threads.per.data.dir", "int", 2, at_least(1))  # Kafka 4.0 default (3.x: 1)
    .define("kbroker.log.fsync.every.append", "boolean", False, None,
            "fsync the segment before an append is acknowledged (single-node durability).")
    # --- consumer groups and offsets ---
    .define("offsets.topic.num.partitions", "int", 50, at_least(1))
    .define("offsets.topic.replication.factor", "int", 3, at_least(1),
            "Replicas of __consumer_offsets (Kafka's default 3), enforced when set or once the KRaft cluster "
            "has that many brokers registered (down ones too: FindCoordinator answers COORDINATOR_NOT_AVAILABLE "
            "until the controller can place them); the default on a cluster with fewer registered brokers is "
            "clamped to them, with a warning. A zero-config node has one replica and refuses a value set above 1.")
    .define("offsets.topic.segment.bytes", "int", 104857600, at_least(1))
    .define("offsets.retention.minutes", "int", 10080, at_least(1))
    .define("offsets.retention.check.interval.ms", "long", 600000, at_least(1))
    .define("offsets.commit.timeout.ms", "int", 5000, at_least(1))
    .define("offset.metadata.max.bytes", "int", 4096)
    .define("group.initial.rebalance.delay.ms", "int", 3000, at_least(0))
    .define("group.min.session.timeout.ms", "int", 6000)
    .define("group.max.session.timeout.ms", "int", 1800000)
    .define("group.max.size", "int", INT_MAX, at_least(1))
    .define("group.coordinator.rebalance.protocols", "list", ["classic", "consumer"],
            one_of("classic", "consumer"))
    # KIP-848 consumer groups (Kafka's GroupCoordinatorConfig group.consumer.*)
    .define("group.consumer.session.timeout.ms", "int", 45000, at_least(1))
    .define("group.consumer.min.session.timeout.ms", "int", 45000, at_least(1))
    .define("group.consumer.max.session.timeout.ms", "int", 60000, at_least(1))
    .define("group.consumer.heartbeat.interval.ms", "int", 5000, at_least(1))
    .define("group.consumer.min.heartbeat.interval.ms", "int", 5000, at_least(1))
    .define("group.consumer.max.heartbeat.interval.ms", "int", 15000, at_least(1))
    .define("group.consumer.max.size", "int", INT_MAX, at_least(1))
    .define("group.consumer.assignors", "list",
            ["org.apache.kafka.coordinator.group.assignor.UniformAssignor",
             "org.apache.kafka.coordinator.group.assignor.RangeAssignor"],
            one_of("uniform", "range", "org.apache.kafka.coordinator.group.assignor.UniformAssignor",
                   "org.apache.kafka.coordinator.group.assignor.RangeAssignor"),
            "Server-side assignors, the first is the default (Kafka class names or uniform/range).")
    # --- producers and transactions ---
    .define("producer.id.expiration.ms", "int", 86400000, at_least(1))
    .define("producer.id.expiration.check.interval.ms", "int", 600000, at_least(1))
    .define("transactional.id.expiration.ms", "int", 604800000, at_least(1))
    .define("transaction.max.timeout.ms", "int", 900000, at_least(1))
    .define("transaction.state.log.num.partitions", "int", 50, at_least(1))
    .define("transaction.state.log.replication.factor", "int", 3, at_least(1),
            "Replicas of __transaction_state on a KRaft cluster (enforced or clamped as "
            "offsets.topic.replication.factor); the zero-config single node has one.")
    .define("transaction.state.log.min.isr", "int", 1, at_least(1))
    .define("transaction.state.log.segment.bytes", "int", 104857600, at_least(1))
    .define("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000, at_least(1))
    .define("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000, at_least(1))
    .define("transaction.partition.verification.enable", "boolean", True, None,
            "KIP-890: before appending a transactional batch of a producer with no ongoing transaction in the "
            "partition, the leader verifies with the transaction coordinator that the partition is in it "
            "(dynamic).")
    # --- purgatory ---
    .define("fetch.purgatory.purge.interval.requests", "int", 1000)
    .define("producer.purgatory.purge.interval.requests", "int", 1000)
    # --- kbroker operations ---
    .define("kbroker.metrics.port", "int", -1, between(-1, 65535),
            "Port of the Prometheus /metrics HTTP endpoint on the first listener's host; -1 = off, 0 = any.")
    # --- broker-side schema id validation (Confluent Server's confluent.schema.registry.url) ---
    .define("kbroker.schema.registry.url", "list", [], _registry_urls,
            "Schema Registry base URLs (http/https, comma-separated, tried in turn) that topics with "
            "kbroker.key/value.schema.validation=true check schema ids against; empty = no validation.")
    .define("kbroker.schema.registry.request.timeout.ms", "int", 2000, at_least(1),
            "Longest a produce waits for one Schema Registry lookup; an unreachable registry answers "
            "the produce REQUEST_TIMED_OUT (retriable), nothing appended.")
    .define("kbroker.schema.registry.negative.cache.ms", "int", 5000, at_least(0),
            "How long a schema id found not registered under a topic's subject stays refused without "
            "asking the registry again (a registered id is cached for the life of the process).")
)

# --- security (issue #18): Kafka's ssl.* / sasl.* keys, defined in kbroker.security.config;
# listener.name.<listener>.<key> overrides are split off before parsing (see KafkaConfig) ---
from kbroker.security.config import (  # noqa: E402
    SECURITY_KEYS, SecurityConfigError, build_listener_security, split_listener_overrides,
)

for _name, _type, _default, _doc in SECURITY_KEYS:
    BROKER_CONFIG.define(_name, _type, _default, None, _doc)

# --- authorization (kbroker.security.authorizer): Kafka's keys and defaults ---
(BROKER_CONFIG
    .define("authorizer.class.name", "string", "", None,
            "Empty: no authorization (Kafka's default); org.apache.kafka.metadata.authorizer.StandardAuthorizer "
            "(or kbroker.security.authorizer.StandardAuthorizer): ACLs with Kafka's StandardAuthorizer semantics.")
    .define("super.users", "string", "", None, "Principals allowed everything, separated by ';' (User:admin;User:ops).")
    .define("allow.everyone.if.no.acl.found", "boolean", False, None,
            "With an authorizer: a resource with no ACL at all is open to everyone."))


#: Broker-only keys kbroker accepts but that change nothing today, with the reason (topic-config
#: synonyms such as ``log.retention.ms`` act through their topic config; kbroker/log/config.py
#: NO_OP_CONFIGS lists the topic configs without effect). Every other key is read by the broker
#: (tests/broker/test_config_walk.py checks both). Values kbroker cannot honour are refused at
#: start-up instead (``KafkaConfig``): in zero-config mode a quorum naming other nodes and
#: offsets.topic.replication.factor set above 1 (its default, 3, is Kafka's, for KRaft clusters).
_NOT_WIRED = ("read by a node of a KRaft cluster (process.roles set: kbroker.server.kraft_node); the "
              "zero-config single node has no quorum to tune")

BROKER_NO_OP_CONFIGS: dict[str, str] = {
    "controller.quorum.bootstrap.servers": "single node: there is no other controller to find (in cluster mode a "
        "broker without controller.quorum.voters finds the quorum leader through these, KIP-853)",
    "controller.quorum.election.timeout.ms": _NOT_WIRED,
    "controller.quorum.fetch.timeout.ms": _NOT_WIRED,
    "controller.quorum.election.backoff.max.ms": _NOT_WIRED,
    "controller.quorum.request.timeout.ms": _NOT_WIRED,
    "controller.quorum.retry.backoff.ms": _NOT_WIRED,
    "controller.quorum.append.linger.ms": _NOT_WIRED,
    "broker.session.timeout.ms": _NOT_WIRED,
    "broker.heartbeat.interval.ms": _NOT_WIRED,
    "initial.broker.registration.timeout.ms": _NOT_WIRED,
    "metadata.log.segment.bytes": _NOT_WIRED,
    "metadata.log.segment.ms": _NOT_WIRED,
    "metadata.max.retention.bytes": _NOT_WIRED,
    "metadata.max.retention.ms": _NOT_WIRED,
    "metadata.max.idle.interval.ms": _NOT_WIRED,
    "transaction.state.log.replication.factor": "read by a KRaft broker (kbroker.server.kraft_broker: the "
        "replication factor of __transaction_state created through the controller); the zero-config single "
        "node's __transaction_state has one replica",
    "log.message.format.version": "deprecated in Kafka 3.0 and ignored there too; accepted with a warning",
    "sasl.kerberos.min.time.before.relogin":
        "no GSSAPI mechanism: no Kerberos login to refresh (a Kafka broker without GSSAPI ignores it "
        "too); dynamic, as in Kafka, so librdkafka's AlterConfigs test 0081 can set it",
}


def parse_ip_overrides(key: str, text: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``"host:count,host:count"`` (Kafka's
    ``Csv.parseCsvMap``: entries split at their last colon, so ``::1:5`` is IPv6 ``::1``)
    -> normalised IP -> count. Host names are resolved now, to every address they have
    (Kafka: ``InetAddress.getByName``, the first); one that does not resolve is an error."""
    overrides: dict[str, int] = {}
    text = text.strip()
    if not text:
        return overrides
    for entry in re.split(r"\s*,\s*", text):
        host, sep, count = entry.rpartition(":")
        host = host.strip()
        if not sep or not host:
            raise ConfigError(key, f"invalid entry {entry!r}: expected host:count")
        if not _VALID_HOST.fullmatch(host):
            raise ConfigError(key, f"contains an invalid address: {host!r}")
        try:
            limit = int(count.strip())
        except ValueError:
            raise ConfigError(key, f"invalid entry {entry!r}: the count is not an integer") from None
        for ip in _resolve(key, host):
            overrides[ip] = limit
    return overrides


def _resolve(key: str, host: str) -> list[str]:
    try:
        return [normalise_ip(str(ipaddress.ip_address(host)))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ConfigError(key, f"cannot resolve host {host!r}: {e}") from None
    return sorted({normalise_ip(info[4][0]) for info in infos})


def parse_listener(key: str, text: str) -> Listener:
    """One ``NAME://host:port`` entry of ``key``; ConfigError naming ``key`` if malformed."""
    try:
        listener = Listener.parse(text)
    except ValueError as e:
        raise ConfigError(key, f"invalid listener {text!r}: {e}") from None
    if not 0 <= listener.port <= 65535:
        raise ConfigError(key, f"invalid port in {text!r}")
    return listener


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")   # Kafka's SecurityProtocol


class KafkaConfig:
    """Parsed broker configuration. ``values`` maps every key to its value.

    Two modes. ``process.roles`` empty (the default): kbroker's zero-config single node, a
    combined broker and controller that formats its own storage (``node.id`` defaults to
    broker.id, else 1). ``process.roles`` set: a node of a KRaft cluster, checked with Kafka's
    ``KafkaConfig.validateValues`` rules for KRaft; its storage must be formatted first
    (``kbroker storage format``). Every problem is a one-line ConfigError naming a key.
    """

    def __init__(self, props: Mapping[str, Any] | None = None):
        self.originals = dict(props or {})
        props, self.listener_overrides = split_listener_overrides(
            self.originals, lambda k, raw: BROKER_CONFIG.keys[k].parse(raw))
        self.values = BROKER_CONFIG.parse(props)
        v = self.values
        roles = v["process.roles"]
        if len(set(roles)) != len(roles):
            raise ConfigError("process.roles", f"Duplicate role names found in `process.roles`: {roles}")
        self.process_roles = frozenset(roles)
        # Kafka's populateSynonyms: either of node.id / broker.id supplies the other.
        if v["node.id"] == -1:
            v["node.id"] = v["broker.id"]
        elif v["broker.id"] == -1:
            v["broker.id"] = v["node.id"]
        if v["node.id"] != v["broker.id"]:
            raise ConfigError("broker.id", "You must set `node.id` to the same value as `broker.id`.")
        if not self.cluster_mode and v["node.id"] == -1:
            v["node.id"] = 1
        if v["node.id"] < 0:
            if self.cluster_mode:
                raise ConfigError("node.id", "Missing configuration `node.id` which is required when "
                                  "`process.roles` is defined (i.e. when running in KRaft mode).")
            raise ConfigError("node.id", f"invalid value {v['node.id']}: must be at least 0")
        self.voters = parse_voters(v["controller.quorum.voters"])
        self.listeners = [parse_listener("listeners", s) for s in v["listeners"]]
        if not self.listeners:
            raise ConfigError("listeners", "at least one listener is required")
        names = [l.name for l in self.listeners]
        if len(set(names)) != len(names):
            raise ConfigError("listeners", "listener names must be unique")
        self.security_protocols = self._security_protocol_map(v)
        for l in self.listeners:
            if l.name not in self.security_protocols:
                raise ConfigError("listener.security.protocol.map", f"no security protocol for listener {l.name}")
        controller_names = set(self.controller_listener_names)
        adv = v["advertised.listeners"]
        if adv:
            advertised = [parse_listener("advertised.listeners", s) for s in adv]
        else:
            advertised = [Listener(l.name, l.host, l.port) for l in self.listeners]
        #: what the broker role advertises to clients (controller listeners are never advertised there)
        self.advertised_listeners = [Listener(l.name, l.host or "127.0.0.1", l.port) for l in advertised
                                     if l.name not in controller_names]
        self._advertised = advertised
        #: listener name -> kbroker.security.config.ListenerSecurity (SSL contexts built, JAAS read)
        self.listener_security = self._listener_security()
        if self.cluster_mode:
            self._validate_kraft(v, advertised)
        self._validate_common(v)
        if not self.cluster_mode:
            self._refuse_unsupported(v)

    # -- KRaft ----------------------------------------------------------------------------------
    @property
    def cluster_mode(self) -> bool:
        """True when process.roles is set: a node of a formatted KRaft cluster."""
        return bool(self.values["process.roles"])

    @property
    def controller_listener_names(self) -> list[str]:
        names = self.values["controller.listener.names"]
        if names is None and not self.cluster_mode:
            return ["CONTROLLER"]   # zero-config mode: a CONTROLLER listener is never advertised
        return [n.upper() for n in names or []]

    @property
    def controller_listeners(self) -> list[Listener]:
        names = self.controller_listener_names
        return [l for l in self.listeners if l.name in names]

    @property
    def advertised_controller_listeners(self) -> list[Listener]:
        """Kafka's effectiveAdvertisedControllerListeners: for each controller listener name in
        order, its advertised.listeners entry, else its listeners entry."""
        out = []
        for name in self.controller_listener_names:
            match = [l for l in self._advertised if l.name == name] or [l for l in self.listeners if l.name == name]
            out.extend(match[:1])
        return out

    @property
    def inter_broker_listener_name(self) -> str:
        """inter.broker.listener.name, else Kafka's default: the listener named after
        security.inter.broker.protocol (PLAINTEXT)."""
        return (self.values["inter.broker.listener.name"] or "PLAINTEXT").upper()

    @property
    def metadata_log_dir(self) -> str:
        """metadata.log.dir, else the first of log.dirs (Kafka's KafkaConfig.metadataLogDir)."""
        return self.values["metadata.log.dir"] or self.log_dirs[0]

    def _security_protocol_map(self, v: dict) -> dict[str, str]:
        """Kafka's effectiveListenerSecurityProtocolMap: the map as given (names upper-cased,
        protocols checked); with the map left at its default, each controller listener name
        maps to PLAINTEXT unless SSL/SASL is in use (KRaft, and zero-config mode's CONTROLLER)."""
        key = "listener.security.protocol.map"
        out: dict[str, str] = {}
        for entry in v[key]:
            name, sep, proto = entry.rpartition(":")
            if not sep or not name.strip():
                raise ConfigError(key, f"invalid entry {entry!r}: expected listener_name:security_protocol")
            proto = proto.strip().upper()
            if proto not in SECURITY_PROTOCOLS:
                raise ConfigError(key, f"Invalid security protocol `{proto}` defined in {key}")
            out[name.strip().upper()] = proto
        if key not in self.originals:
            secure = {"SSL", "SASL_SSL", "SASL_PLAINTEXT"}
            listener_names = {s.split("://", 1)[0].strip().upper() for s in v["listeners"]}
            if not (secure & set(self.controller_listener_names) or secure & listener_names):
                for n in self.controller_listener_names:
                    out.setdefault(n, "PLAINTEXT")
        return out

    def _listener_security(self) -> dict:
        """Each listener's security (zero-config mode serves all four protocols); a listener whose
        TLS or SASL settings are missing or wrong stops start-up with a ConfigError naming the key."""
        out = {}
        for l in self.listeners:
            try:
                out[l.name] = build_listener_security(l.name, self.security_protocols[l.name], self.values,
                                                      self.listener_overrides.get(l.name, {}))
            except SecurityConfigError as e:
                raise ConfigError(e.key, str(e).split(": ", 1)[1]) from None
        for name in self.listener_overrides:
            # (a broker-only node keeps the client side of the controller listener's settings)
            if name not in out and name not in self.controller_listener_names:
                raise ConfigError(f"listener.name.{name.lower()}", f"no listener named {name} in listeners")
        return out

    def inter_node_client_config(self, listener_name: str, mechanism_key: str) -> dict:
        """What this node's NetworkClient needs to connect to ``listener_name`` of another node
        (Kafka's ChannelBuilders for a client mode channel): its security protocol, the
        listener's TLS settings (truststore; keystore for mutual TLS) and SASL mechanism
        (``mechanism_key``, e.g. sasl.mechanism.controller.protocol) with the JAAS text whose
        username/password it logs in with (listener.name.<l>.<mechanism>.sasl.jaas.config,
        else sasl.jaas.config)."""
        proto = self.security_protocols.get(listener_name, "PLAINTEXT")
        out: dict = {"security.protocol": proto}
        overrides = self.listener_overrides.get(listener_name, {})

        def get(key):
            return overrides[key] if key in overrides else self.values.get(key)
        if proto in ("SSL", "SASL_SSL"):
            for key in ("ssl.truststore.location", "ssl.truststore.certificates", "ssl.key.password",
                        "ssl.endpoint.identification.algorithm"):
                if get(key) is not None:
                    out[key] = get(key)
            if get("ssl.client.auth") in ("required", "requested"):
                # mutual TLS: this node's own certificate (a file, or inline PEM) is its principal
                for key in ("ssl.keystore.location", "ssl.keystore.key", "ssl.keystore.certificate.chain"):
                    if get(key):
                        out[key] = get(key)
        if proto.startswith("SASL_"):
            mechanism = (self.values.get(mechanism_key) or "GSSAPI").upper()
            out["sasl.mechanism"] = mechanism
            out["sasl.jaas.config"] = overrides.get(f"{mechanism.lower()}.sasl.jaas.config") or get("sasl.jaas.config")
        return out

    def inter_broker_client_config(self) -> dict:
        """:meth:`inter_node_client_config` for ``inter.broker.listener.name`` with
        ``sasl.mechanism.inter.broker.protocol``: what the replica fetchers, the transaction
        marker sender and the KIP-890 verification sender connect to other brokers with."""
        return self.inter_node_client_config(self.inter_broker_listener_name, "sasl.mechanism.inter.broker.protocol")

    def _validate_kraft(self, v: dict, advertised: list[Listener]) -> None:
        """Kafka 3.9's KafkaConfig.validateValues rules for process.roles set, in its order."""
        roles, node_id, voter_ids = self.process_roles, v["node.id"], set(self.voters)
        cln = self.controller_listener_names
        listener_names = {l.name for l in self.listeners}
        voters_text = "Set(" + ", ".join(str(i) for i in sorted(voter_ids)) + ")"
        if not voter_ids and not v["controller.quorum.bootstrap.servers"]:
            raise ConfigError("controller.quorum.voters",
                              "If using process.roles, either controller.quorum.bootstrap.servers must contain "
                              "the set of bootstrap controllers or controller.quorum.voters must contain a "
                              "parseable set of controllers.")
        if roles == {"broker"}:
            if node_id in voter_ids:
                raise ConfigError("controller.quorum.voters",
                                  f"If process.roles contains just the 'broker' role, the node id {node_id} must "
                                  f"not be included in the set of voters controller.quorum.voters={voters_text}")
            if not cln:
                raise ConfigError("controller.listener.names", "controller.listener.names must contain at least "
                                  "one value when running KRaft with just the broker role")
            if self.controller_listeners:
                raise ConfigError("listeners", "controller.listener.names must not contain a value appearing in "
                                  "the 'listeners' configuration when running KRaft with just the broker role")
            for name in cln:
                if name not in self.security_protocols:
                    raise ConfigError("listener.security.protocol.map",
                                      f"Controller listener with name {name} defined in controller.listener.names "
                                      "not found in listener.security.protocol.map  (an explicit security "
                                      "mapping for each controller listener is required if "
                                      "listener.security.protocol.map is non-empty, or if there are security "
                                      "protocols other than PLAINTEXT in use)")
            if any(l.name in cln for l in advertised):
                raise ConfigError("advertised.listeners",
                                  "The advertised.listeners config must not contain KRaft controller listeners "
                                  "from controller.listener.names when process.roles contains the broker role "
                                  "because Kafka clients that send requests via advertised listeners do not "
                                  "send requests to KRaft controllers -- they only send requests to KRaft brokers.")
            if len(cln) > 1:
                _log.warning("controller.listener.names has multiple entries; only the first will be used "
                             "since process.roles=broker: %s", cln)
        else:
            if roles == {"controller"} and any(l.name not in cln for l in self.listeners):
                raise ConfigError("listeners", "The listeners config must only contain KRaft controller "
                                  "listeners from controller.listener.names when process.roles=controller")
            if voter_ids and node_id not in voter_ids:
                raise ConfigError("controller.quorum.voters",
                                  f"If process.roles contains the 'controller' role, the node id {node_id} must "
                                  f"be included in the set of voters controller.quorum.voters={voters_text}")
            if not self.advertised_controller_listeners:
                raise ConfigError("controller.listener.names", "controller.listener.names must contain at least "
                                  "one value appearing in the 'listeners' configuration when running the KRaft "
                                  "controller role")
            if any(n not in listener_names for n in cln):
                raise ConfigError("controller.listener.names", "controller.listener.names must only contain "
                                  "values appearing in the 'listeners' configuration when running the KRaft "
                                  "controller role")
            if voter_ids:
                voter_port = self.voters[node_id][1]
                ports = {l.port for l in self.controller_listeners}
                if 0 not in ports and voter_port not in ports:
                    raise ConfigError("controller.quorum.voters",
                                      f"the voter entry of this node ({node_id}@...:{voter_port}) does not match "
                                      "the port of any controller listener in 'listeners' "
                                      f"({', '.join(str(p) for p in sorted(ports))})")
        if "broker" in roles:
            broker_adv = {l.name for l in advertised if l.name not in cln}
            if not broker_adv:
                raise ConfigError("listeners", "There must be at least one broker advertised listener. "
                                  "Perhaps all listeners appear in controller.listener.names?")
            ibl = self.inter_broker_listener_name
            if ibl not in self.security_protocols:
                raise ConfigError("inter.broker.listener.name",
                                  f"Listener with name {ibl} defined in inter.broker.listener.name not found "
                                  "in listener.security.protocol.map.")
            if ibl not in broker_adv:
                raise ConfigError("inter.broker.listener.name",
                                  "inter.broker.listener.name must be a listener name defined in "
                                  "advertised.listeners. The valid options based on currently configured "
                                  f"listeners are {','.join(sorted(broker_adv))}")
            if not broker_adv <= listener_names:
                raise ConfigError("advertised.listeners",
                                  "advertised.listeners listener names must be equal to or a subset of the ones "
                                  f"defined in listeners. Found {','.join(sorted(broker_adv))}. The valid options "
                                  f"based on the current configuration are {','.join(sorted(listener_names))}")
        if any(l.host == "0.0.0.0" for l in advertised + self.advertised_controller_listeners):
            raise ConfigError("advertised.listeners", "advertised.listeners cannot use the nonroutable "
                              "meta-address 0.0.0.0. Use a routable IP address.")

    def _validate_common(self, v: dict) -> None:
        from kbroker.security.authorizer import AUTHORIZER_CLASS_NAMES
        if v["authorizer.class.name"] and v["authorizer.class.name"].strip() not in AUTHORIZER_CLASS_NAMES:
            raise ConfigError("authorizer.class.name", f"{v['authorizer.class.name']!r} is not supported: leave it "
                              "empty (no authorization) or set org.apache.kafka.metadata.authorizer.StandardAuthorizer")
        if v["group.min.session.timeout.ms"] > v["group.max.session.timeout.ms"]:
            raise ConfigError("group.min.session.timeout.ms", "must not exceed group.max.session.timeout.ms")
        # Kafka's GroupCoordinatorConfig requirements for the group.consumer.* timeouts.
        for name in ("session.timeout.ms", "heartbeat.interval.ms"):
            lo, val, hi = (v[f"group.consumer.min.{name}"], v[f"group.consumer.{name}"],
                           v[f"group.consumer.max.{name}"])
            if not lo <= val <= hi:
                raise ConfigError(f"group.consumer.{name}", f"must be within [group.consumer.min.{name}, "
                                  f"group.consumer.max.{name}] = [{lo}, {hi}]")
        if v["group.consumer.heartbeat.interval.ms"] >= v["group.consumer.session.timeout.ms"]:
            raise ConfigError("group.consumer.heartbeat.interval.ms", "must be less than group.consumer.session.timeout.ms")
        if not v["group.consumer.assignors"]:
            raise ConfigError("group.consumer.assignors", "at least one assignor is required")
        # Kafka's KafkaConfig.validateValues checks of the network layer's limits.
        if 0 < v["queued.max.request.bytes"] < v["socket.request.max.bytes"]:
            raise ConfigError("queued.max.request.bytes", f"must be larger or equal to socket.request.max.bytes "
                              f"({v['socket.request.max.bytes']}), or <= 0 for no limit")
        self.max_connections_per_ip_overrides = parse_ip_overrides(
            "max.connections.per.ip.overrides", v["max.connections.per.ip.overrides"])
        if v["max.connections.per.ip"] == 0 and not self.max_connections_per_ip_overrides:
            raise ConfigError("max.connections.per.ip", "can be set to zero only if "
                              "max.connections.per.ip.overrides property is set")
        if "log.message.format.version" in self.originals:
            _log.warning("log.message.format.version is deprecated and has no effect (Kafka 3.0+ ignores it)")

    def _refuse_unsupported(self, v: dict) -> None:
        """Zero-config mode: values a single node cannot honour stop start-up (never stored and ignored)."""
        for voter_id in self.voters:
            if voter_id != v["node.id"]:
                raise ConfigError("controller.quorum.voters",
                                  f"voter {voter_id} is not this node ({v['node.id']}): without process.roles "
                                  "kbroker is a single-node cluster, the quorum is this node alone "
                                  "(set process.roles for a KRaft cluster)")
        if "offsets.topic.replication.factor" in self.originals and v["offsets.topic.replication.factor"] != 1:
            raise ConfigError("offsets.topic.replication.factor",
                              f"{v['offsets.topic.replication.factor']} replicas cannot be placed on a single-node "
                              "cluster; set it to 1")
        if v["metadata.log.dir"] is not None:
            raise ConfigError("metadata.log.dir", "only a KRaft node (process.roles set) has a metadata log; a "
                              "zero-config node keeps its metadata in the first of log.dirs")

    def socket_server_config(self, listeners, *, client_limits: bool = True):
        """The network layer's settings for ``listeners`` (listener URLs), from this config.
        ``client_limits``: also the per-IP connection limits and the request-memory pool (a
        client-facing SocketServer; not a controller's). Every listener gets its security."""
        from kbroker.network.socket_server import SocketServerConfig

        extra = {"listener_security": self.listener_security}
        if client_limits:
            extra.update(max_connections_per_ip=self["max.connections.per.ip"],
                         max_connections_per_ip_overrides=self.max_connections_per_ip_overrides,
                         queued_max_request_bytes=self["queued.max.request.bytes"],
                         max_connection_creation_rate=self["max.connection.creation.rate"],
                         listener_connection_creation_rates={
                             name: o["max.connection.creation.rate"] for name, o in self.listener_overrides.items()
                             if o.get("max.connection.creation.rate") is not None},
                         inter_broker_listener=self.inter_broker_listener_name,
                         quota_window_num=self["quota.window.num"],
                         quota_window_size_s=self["quota.window.size.seconds"])
        return SocketServerConfig(
            listeners=listeners,
            num_network_threads=self["num.network.threads"],
            queued_max_requests=self["queued.max.requests"],
            socket_request_max_bytes=self["socket.request.max.bytes"],
            socket_send_buffer_bytes=self["socket.send.buffer.bytes"],
            socket_receive_buffer_bytes=self["socket.receive.buffer.bytes"],
            socket_listen_backlog_size=self["socket.listen.backlog.size"],
            connections_max_idle_ms=self["connections.max.idle.ms"],
            max_connections=self["max.connections"],
            **extra)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def node_id(self) -> int:
        return self.values["node.id"]

    @property
    def log_dirs(self) -> list[str]:
        return self.values["log.dirs"] or [self.values["log.dir"]]

    @property
    def log_retention_ms(self) -> int:
        """log.retention.ms, else .minutes, else .hours (Kafka's precedence); -1 = unlimited."""
        v = self.values
        if v["log.retention.ms"] is not None:
            return v["log.retention.ms"]
        if v["log.retention.minutes"] is not None:
            m = v["log.retention.minutes"]
            return -1 if m < 0 else m * 60_000
        h = v["log.retention.hours"]
        return -1 if h < 0 else h * 3_600_000

    @property
    def log_roll_ms(self) -> int:
        v = self.values
        return v["log.roll.ms"] if v["log.roll.ms"] is not None else v["log.roll.hours"] * 3_600_000

    @property
    def log_roll_jitter_ms(self) -> int:
        v = self.values
        return v["log.roll.jitter.ms"] if v["log.roll.jitter.ms"] is not None else v["log.roll.jitter.hours"] * 3_600_000

    @classmethod
    def from_sources(cls, config_file: str | None = None, overrides: list[str] | None = None) -> "KafkaConfig":
        props: dict[str, Any] = {}
        if config_file:
            try:
                props.update(read_properties(config_file))
            except OSError as e:
                raise ConfigError("--config", f"cannot read {config_file}: {e.strerror}") from None
        for item in overrides or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError("--override", f"expected key=value, got {item!r}")
            props[key.strip()] = value
        return cls(props)
