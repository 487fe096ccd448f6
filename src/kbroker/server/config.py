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

BROKER_CONFIG = (
    ConfigDef()
    # --- identity and roles (KRaft) ---
    .define("node.id", "int", 1, at_least(0), "This node's id.")
    .define("broker.id", "int", -1, None, "Legacy synonym of node.id (-1: use node.id).")
    .define("process.roles", "list", ["broker", "controller"], one_of("broker", "controller"))
    .define("controller.quorum.voters", "list", [], None, "id@host:port voters; empty = this node alone.")
    .define("controller.quorum.bootstrap.servers", "list", [])
    .define("controller.listener.names", "list", ["CONTROLLER"])
    .define("cluster.id", "string", None, None, "Cluster id; generated and stored in meta.properties when absent.")
    .define("broker.rack", "string", None)
    # --- listeners and the network layer ---
    .define("listeners", "list", ["PLAINTEXT://127.0.0.1:9092"])
    .define("advertised.listeners", "list", None)
    .define("listener.security.protocol.map", "list",
            ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"])
    .define("inter.broker.listener.name", "string", "PLAINTEXT")
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
    .define("max.connections.per.ip.overrides", "string", "", None,
            "Per-IP or per-hostname limits overriding max.connections.per.ip, e.g. 'hostName:100,127.0.0.1:200'.")
    .define("message.max.bytes", "int", 1048588, at_least(0))
    .define("replica.fetch.max.bytes", "int", 1048576, at_least(0))
    .define("replica.high.watermark.checkpoint.interval.ms", "long", 5000, at_least(1))
    .define("fetch.max.bytes", "int", 57671680, at_least(1024))
    .define("request.timeout.ms", "int", 30000, at_least(0))
    .define("sasl.kerberos.min.time.before.relogin", "long", 60000, None,
            "Kafka's GSSAPI relogin interval; kbroker has PLAINTEXT listeners only (see BROKER_NO_OP_CONFIGS).")
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
    .define("offsets.topic.replication.factor", "int", 1, at_least(1))
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
    .define("transaction.state.log.replication.factor", "int", 1, at_least(1))
    .define("transaction.state.log.min.isr", "int", 1, at_least(1))
    # --- purgatory ---
    .define("fetch.purgatory.purge.interval.requests", "int", 1000)
    .define("producer.purgatory.purge.interval.requests", "int", 1000)
    # --- kbroker operations ---
    .define("kbroker.metrics.port", "int", -1, between(-1, 65535),
            "Port of the Prometheus /metrics HTTP endpoint on the first listener's host; -1 = off, 0 = any.")
)


#: Broker-only keys kbroker accepts but that change nothing today, with the reason (topic-config
#: synonyms such as ``log.retention.ms`` act through their topic config; kbroker/log/config.py
#: NO_OP_CONFIGS lists the topic configs without effect). Every other key is read by the broker
#: (tests/broker/test_config_walk.py checks both). Values kbroker cannot honour are refused at
#: start-up instead (``KafkaConfig``): process.roles without both roles, a quorum naming other
#: nodes, offsets.topic.replication.factor above 1.
BROKER_NO_OP_CONFIGS: dict[str, str] = {
    "process.roles": "kbroker is always a combined broker+controller; only that value is accepted",
    "controller.quorum.voters": "single node: the quorum is this node alone; only it may be named",
    "controller.quorum.bootstrap.servers": "single node: there is no other controller to find",
    "inter.broker.listener.name": "single node: there is no inter-broker traffic",
    "replica.fetch.max.bytes": "single node: there are no followers fetching",
    "offsets.topic.replication.factor": "single node: __consumer_offsets has one replica; only 1 is accepted",
    "transactional.id.expiration.ms": "transactions are not implemented yet (transactional produce is refused)",
    "transaction.state.log.num.partitions": "transactions are not implemented yet: no __transaction_state",
    "transaction.state.log.replication.factor": "transactions are not implemented yet: no __transaction_state",
    "transaction.state.log.min.isr": "transactions are not implemented yet: no __transaction_state",
    "log.message.format.version": "deprecated in Kafka 3.0 and ignored there too; accepted with a warning",
    "sasl.kerberos.min.time.before.relogin":
        "PLAINTEXT listeners only: no GSSAPI login to refresh (a Kafka broker without a SASL listener "
        "ignores it too); dynamic, as in Kafka, so librdkafka's AlterConfigs test 0081 can set it",
}


_VALID_HOST = re.compile(r"[0-9a-zA-Z\-%._:]*")   # Kafka's Utils.validHostPattern


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


class KafkaConfig:
    """Parsed broker configuration. ``values`` maps every key to its value."""

    def __init__(self, props: Mapping[str, Any] | None = None):
        self.originals = dict(props or {})
        self.values = BROKER_CONFIG.parse(self.originals)
        v = self.values
        if v["broker.id"] not in (-1, v["node.id"]) and "node.id" in self.originals:
            raise ConfigError("broker.id", "must equal node.id when both are set")
        if v["broker.id"] != -1 and "node.id" not in self.originals:
            v["node.id"] = v["broker.id"]
        self.listeners = [parse_listener("listeners", s) for s in v["listeners"]]
        if not self.listeners:
            raise ConfigError("listeners", "at least one listener is required")
        names = [l.name for l in self.listeners]
        if len(set(names)) != len(names):
            raise ConfigError("listeners", "listener names must be unique")
        protocols = {}
        for entry in v["listener.security.protocol.map"]:
            name, _, proto = entry.partition(":")
            if proto.upper() != "PLAINTEXT":
                raise ConfigError("listener.security.protocol.map",
                                  f"security protocol {proto!r} is not supported yet (PLAINTEXT only)")
            protocols[name.upper()] = proto.upper()
        for l in self.listeners:
            if l.name not in protocols:
                raise ConfigError("listener.security.protocol.map", f"no security protocol for listener {l.name}")
        adv = v["advertised.listeners"]
        self.advertised_listeners = (
            [parse_listener("advertised.listeners", s) for s in adv] if adv else
            [Listener(l.name, l.host or "127.0.0.1", l.port) for l in self.listeners
             if l.name not in [n.upper() for n in v["controller.listener.names"]]]
        )
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
        self._refuse_unsupported(v)

    def _refuse_unsupported(self, v: dict) -> None:
        """Values a single-node kbroker cannot honour stop start-up (never stored and ignored)."""
        if set(v["process.roles"]) != {"broker", "controller"}:
            raise ConfigError("process.roles", "kbroker runs as a combined broker,controller node only")
        for voter in v["controller.quorum.voters"]:
            if voter.partition("@")[0].strip() != str(v["node.id"]):
                raise ConfigError("controller.quorum.voters",
                                  f"voter {voter!r} is not this node ({v['node.id']}): kbroker is a single-node "
                                  "cluster, the quorum is this node alone")
        if v["offsets.topic.replication.factor"] != 1:
            raise ConfigError("offsets.topic.replication.factor",
                              f"{v['offsets.topic.replication.factor']} replicas cannot be placed on a single-node "
                              "cluster; set it to 1")
        if "log.message.format.version" in self.originals:
            _log.warning("log.message.format.version is deprecated and has no effect (Kafka 3.0+ ignores it)")

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
