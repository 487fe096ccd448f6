"""Client configuration under Kafka's names and defaults.

Users pass a dict (or keyword arguments with ``_`` for ``.``) keyed by Kafka's property
names (``bootstrap.servers``, ``linger.ms``, ``acks``, ...) so settings carry over from the
Java client. ``ClientConfig(defs, props)`` validates every value and raises
``KafkaConfigError`` naming the key; unknown keys are rejected the same way.

Defaults are Kafka 4.0's (ProducerConfig / ConsumerConfig / AdminClientConfig). Notable
choices: ``linger.ms`` = 5 (Kafka 4.0, KIP-1030); ``enable.idempotence`` = True (KIP-679)
unless the user set a conflicting ``acks`` / ``max.in.flight.requests.per.connection`` /
``retries`` without asking for idempotence, in which case it is off, as in the Java client.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from kbroker.client.errors import KafkaConfigError

_NO_DEFAULT = object()


class ConfigDef(NamedTuple):
    name: str
    type: type | tuple
    default: Any
    check: Callable[[Any], bool] | None = None
    doc: str = ""


def _at_least(n):
    return lambda v: v >= n


def _in(*choices):
    return lambda v: v in choices


def _int(name, default, lo=None, doc=""):
    return ConfigDef(name, int, default, _at_least(lo) if lo is not None else None, doc)


COMMON = [
    ConfigDef("bootstrap.servers", (str, list, tuple), _NO_DEFAULT, None,
              "host:port[,host:port...] used to fetch the first metadata"),
    ConfigDef("client.id", str, "kbroker-client"),
    _int("request.timeout.ms", 30000, 0),
    _int("metadata.max.age.ms", 300000, 0),
    _int("retry.backoff.ms", 100, 0),
    _int("retry.backoff.max.ms", 1000, 0),
    _int("reconnect.backoff.ms", 50, 0),
    _int("reconnect.backoff.max.ms", 1000, 0),
    _int("socket.connection.setup.timeout.ms", 10000, 0),
    _int("connections.max.idle.ms", 540000, -1),
    _int("send.buffer.bytes", 131072, -1),
    _int("receive.buffer.bytes", 65536, -1),
    ConfigDef("security.protocol", str, "PLAINTEXT", _in("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
    ConfigDef("ssl.truststore.type", str, "PEM", _in("PEM"), "PEM only"),
    ConfigDef("ssl.truststore.location", (str, type(None)), None, None, "PEM file of trusted CAs"),
    ConfigDef("ssl.truststore.certificates", (str, type(None)), None, None, "inline PEM CAs"),
    ConfigDef("ssl.keystore.type", str, "PEM", _in("PEM"), "PEM only"),
    ConfigDef("ssl.keystore.location", (str, type(None)), None, None, "PEM key + certificate (mutual TLS)"),
    ConfigDef("ssl.key.password", (str, type(None)), None),
    ConfigDef("ssl.endpoint.identification.algorithm", (str, type(None)), "https", None,
              "https: check the broker's certificate names its host; empty: do not"),
    ConfigDef("sasl.mechanism", str, "GSSAPI", None, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    ConfigDef("sasl.jaas.config", (str, type(None)), None, None,
              'e.g. org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";'),
    ConfigDef("client.dns.lookup", str, "use_all_dns_ips",
              _in("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only")),
]

PRODUCER = COMMON + [
    ConfigDef("acks", (str, int), "all", lambda v: str(v) in ("all", "-1", "0", "1")),
    _int("linger.ms", 5, 0),
    _int("batch.size", 16384, 0),
    _int("buffer.memory", 33554432, 0),
    _int("max.block.ms", 60000, 0),
    _int("max.request.size", 1048576, 1),
    ConfigDef("compression.type", str, "none", _in("none", "gzip", "snappy", "lz4", "zstd")),
    _int("retries", 2147483647, 0),
    _int("delivery.timeout.ms", 120000, 0),
    _int("max.in.flight.requests.per.connection", 5, 1),
    ConfigDef("enable.idempotence", bool, True),
    ConfigDef("partitioner.ignore.keys", bool, False),
    ConfigDef("partitioner.class", (type(None), object), None, None,
              "callable(topic, key_bytes, num_partitions) -> partition, or None for the built-in"),
    ConfigDef("key.serializer", (type(None), object), None, lambda v: v is None or callable(v)),
    ConfigDef("value.serializer", (type(None), object), None, lambda v: v is None or callable(v)),
    ConfigDef("transactional.id", (type(None), str), None, lambda v: v is None or len(v) > 0,
              "a non-empty id; needs enable.idempotence (the default)"),
    _int("transaction.timeout.ms", 60000, 1),
]

CONSUMER = COMMON + [
    ConfigDef("group.id", (type(None), str), None),
    ConfigDef("group.instance.id", (type(None), str), None),
    ConfigDef("auto.offset.reset", str, "latest", _in("latest", "earliest", "none")),
    ConfigDef("enable.auto.commit", bool, True),
    _int("auto.commit.interval.ms", 5000, 0),
    _int("fetch.min.bytes", 1, 0),
    _int("fetch.max.bytes", 52428800, 0),
    _int("fetch.max.wait.ms", 500, 0),
    _int("max.partition.fetch.bytes", 1048576, 0),
    _int("max.poll.records", 500, 1),
    _int("max.poll.interval.ms", 300000, 1),
    _int("session.timeout.ms", 45000, 1),
    _int("heartbeat.interval.ms", 3000, 1),
    _int("default.api.timeout.ms", 60000, 0),
    ConfigDef("isolation.level", str, "read_uncommitted", _in("read_uncommitted", "read_committed")),
    ConfigDef("partition.assignment.strategy", (str, list, tuple), "range",
              lambda v: all(s in ("range", "roundrobin") for s in _as_list(v))),
    ConfigDef("check.crcs", bool, True),
    ConfigDef("key.deserializer", (type(None), object), None, lambda v: v is None or callable(v)),
    ConfigDef("value.deserializer", (type(None), object), None, lambda v: v is None or callable(v)),
    ConfigDef("allow.auto.create.topics", bool, True),
]

ADMIN = COMMON + [
    _int("default.api.timeout.ms", 60000, 0),
]

# Java class names map to our built-ins, so copied configs keep working.
_ASSIGNOR_ALIASES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
}


def _as_list(v):
    if isinstance(v, str):
        return [_ASSIGNOR_ALIASES.get(s.strip(), s.strip()) for s in v.split(",") if s.strip()]
    return [_ASSIGNOR_ALIASES.get(s, s) for s in v]


def _coerce(d: ConfigDef, value):
    """Accept the string forms the Java client accepts ("5", "true")."""
    t = d.type
    if t is int and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise KafkaConfigError(f"Invalid value {value!r} for configuration {d.name}: "
                                   "expected an integer") from None
    if t is bool and isinstance(value, str):
        s = value.strip().lower()
        if s in ("true", "false"):
            return s == "true"
        raise KafkaConfigError(f"Invalid value {value!r} for configuration {d.name}: "
                               "expected true or false")
    return value


class ClientConfig:
    """Validated settings: ``cfg["linger.ms"]``. Immutable after construction."""

    def __init__(self, defs: list[ConfigDef], props: dict[str, Any] | None = None, **kwargs):
        by_name = {d.name: d for d in defs}
        merged = dict(props or {})
        for k, v in kwargs.items():
            merged[k.replace("_", ".")] = v
        values = {}
        for k, v in merged.items():
            d = by_name.get(k)
            if d is None:
                raise KafkaConfigError(f"Unknown configuration {k!r}")
            v = _coerce(d, v)
            if d.type is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise KafkaConfigError(f"Invalid value {v!r} for configuration {k}: expected an integer")
            if d.type is bool and not isinstance(v, bool):
                raise KafkaConfigError(f"Invalid value {v!r} for configuration {k}: expected a bool")
            if isinstance(d.type, tuple) and object not in d.type and not isinstance(v, d.type):
                raise KafkaConfigError(f"Invalid value {v!r} for configuration {k}")
            if d.check is not None and not d.check(v):
                raise KafkaConfigError(f"Invalid value {v!r} for configuration {k}"
                                       + (f" ({d.doc})" if d.doc else ""))
            values[k] = v
        for d in defs:
            if d.name not in values:
                if d.default is _NO_DEFAULT:
                    raise KafkaConfigError(f"Missing required configuration {d.name!r}")
                values[d.name] = d.default
        self._values = values
        self._explicit = frozenset(merged)  # keys the user set (defaults excluded)
        self._post_checks()

    def _post_checks(self):
        v = self._values
        if "acks" in v:
            v["acks"] = -1 if str(v["acks"]) in ("all", "-1") else int(v["acks"])
            if "enable.idempotence" not in self._explicit and (
                    v["acks"] != -1 or v["max.in.flight.requests.per.connection"] > 5 or v["retries"] == 0):
                # Java's ProducerConfig: idempotence is on by default, but conflicting settings the
                # user chose without asking for idempotence turn it off instead of failing
                v["enable.idempotence"] = False
            if v.get("enable.idempotence") and v["acks"] != -1:
                raise KafkaConfigError("Must set acks to all in order to use the idempotent "
                                       "producer (configuration acks)")
            if v.get("enable.idempotence") and v["max.in.flight.requests.per.connection"] > 5:
                raise KafkaConfigError("max.in.flight.requests.per.connection must be at most 5 "
                                       "with enable.idempotence")
            if v.get("transactional.id") is not None and not v.get("enable.idempotence"):
                raise KafkaConfigError("Cannot set a transactional.id without also enabling idempotence "
                                       "(configuration enable.idempotence)")
            if v["delivery.timeout.ms"] < v["linger.ms"] + v["request.timeout.ms"]:
                raise KafkaConfigError("delivery.timeout.ms should be equal to or larger than "
                                       "linger.ms + request.timeout.ms (configuration delivery.timeout.ms)")
        if "partition.assignment.strategy" in v:
            v["partition.assignment.strategy"] = _as_list(v["partition.assignment.strategy"])
        bs = v["bootstrap.servers"]
        servers = [s.strip() for s in (bs.split(",") if isinstance(bs, str) else bs) if s.strip()]
        if not servers:
            raise KafkaConfigError("No resolvable bootstrap urls given in bootstrap.servers")
        parsed = []
        for s in servers:
            host, sep, port = s.rpartition(":")
            if not sep or not port.isdigit():
                raise KafkaConfigError(f"Invalid url in bootstrap.servers: {s}")
            parsed.append((host.strip("[]"), int(port)))
        v["bootstrap.servers"] = parsed

    def __getitem__(self, key: str):
        return self._values[key]

    def get(self, key: str, default=None):
        return self._values.get(key, default)

    def as_dict(self) -> dict:
        return dict(self._values)
