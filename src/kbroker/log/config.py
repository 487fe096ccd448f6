"""Topic-level log configuration with Kafka's names, defaults and validation.

Model: Kafka's ``LogConfig`` (storage/.../log/LogConfig.java) and the
``log.*`` broker properties in ``ServerLogConfigs``. A ``LogConfig`` is
immutable; ``LogConfig.from_broker(props)`` builds the broker-wide default
from broker property names, ``config.with_overrides(topic_props)`` applies a
topic's overrides on top. Attribute names are the topic-level names in
snake_case (``segment.bytes`` -> ``segment_bytes``).

Values may be given as Python values or as the strings CreateTopics /
AlterConfigs carry; they are parsed and validated, and a bad one raises
``ConfigError`` naming the key.

Besides Kafka's names there is one kbroker broker option:
``kbroker.log.fsync.every.append`` (topic-level ``kbroker.fsync.every.append``)
— fsync the segment before an append returns. See kbroker/log/README.md for
the durability each flush mode gives. Topic-level only: ``kbroker.key/value.schema.validation``
and ``kbroker.key/value.subject.name.strategy`` (broker-side schema id validation,
kbroker/server/schema_validation.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from kbroker.log.errors import ConfigError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1

#: RecordBatch v2 header + one record of the default 1 MiB (Kafka's message.max.bytes default).
DEFAULT_MAX_MESSAGE_BYTES = 1048588


def _at_least(lo):
    def check(key, v):
        if v < lo:
            raise ConfigError(key, v, f"Value must be at least {lo}")
    return check


def _between(lo, hi):
    def check(key, v):
        if not lo <= v <= hi:
            raise ConfigError(key, v, f"Value must be between {lo} and {hi}")
    return check


def _one_of(*allowed, case_sensitive=True):
    def check(key, v):
        vals = v if isinstance(v, list) else [v]
        for item in vals:
            ok = item in allowed if case_sensitive else item.lower() in [a.lower() for a in allowed]
            if not ok:
                raise ConfigError(key, v, f"String must be one of: {', '.join(allowed)}")
    return check


def _non_empty_list(key, v):
    if not v:
        raise ConfigError(key, v, "Empty list not allowed")


def _version_string(key, v):
    """Kafka's MetadataVersionValidator: a Kafka release ("0.10.0.0", "2.8", "3.0-IV1")."""
    if not re.fullmatch(r"\d+(\.\d+){1,3}(-IV\d+)?", v or ""):
        raise ConfigError(key, v, "must be a Kafka version such as 0.10.0, 2.8 or 3.0-IV1")


def _remote_storage_disabled(key, v):
    """Kafka's LogConfig.validateRemoteStorageOnlyIfSystemEnabled with
    remote.log.storage.system.enable=false: kbroker has no tiered storage."""
    if v:
        raise ConfigError(key, v, "Tiered Storage functionality is disabled in the broker. "
                          "Topic cannot be configured with remote log storage.")


def _chain(*checks):
    def check(key, v):
        for c in checks:
            c(key, v)
    return check


@dataclass(frozen=True)
class ConfigDef:
    """One topic-level config: its type, default, validator and broker-level name."""

    name: str
    type: str                      # "long" | "int" | "double" | "boolean" | "string" | "list"
    default: Any
    validator: Callable[[str, Any], None] | None
    broker_name: str | None
    doc: str = ""

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")


#: kbroker.key/value.subject.name.strategy values: Confluent's TopicNameStrategy (its short or
#: class name) only; RecordNameStrategy and TopicRecordNameStrategy are not implemented.
SUBJECT_NAME_STRATEGIES = ("TopicNameStrategy", "io.confluent.kafka.serializers.subject.TopicNameStrategy")


def _defs() -> dict[str, ConfigDef]:
    d = [
        ConfigDef("cleanup.policy", "list", ["delete"],
                  _chain(_non_empty_list, _one_of("compact", "delete")), "log.cleanup.policy",
                  "delete: drop old segments by retention; compact: keep the last value per key"),
        ConfigDef("compression.type", "string", "producer",
                  _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer", case_sensitive=False),
                  "compression.type"),
        ConfigDef("compression.gzip.level", "int", -1, _between(-1, 9), "compression.gzip.level"),
        ConfigDef("compression.lz4.level", "int", 9, _between(1, 17), "compression.lz4.level"),
        ConfigDef("compression.zstd.level", "int", 3, _between(-131072, 22), "compression.zstd.level"),
        ConfigDef("delete.retention.ms", "long", 86400000, _at_least(0), "log.cleaner.delete.retention.ms"),
        ConfigDef("file.delete.delay.ms", "long", 60000, _at_least(0), "log.segment.delete.delay.ms",
                  "time between renaming a deleted segment to .deleted and removing it"),
        ConfigDef("flush.messages", "long", LONG_MAX, _at_least(1), "log.flush.interval.messages",
                  "fsync after this many unflushed messages (default: never, rely on replication)"),
        ConfigDef("flush.ms", "long", LONG_MAX, _at_least(0), "log.flush.interval.ms",
                  "fsync when the oldest unflushed data is older than this"),
        ConfigDef("follower.replication.throttled.replicas", "list", [], None,
                  "follower.replication.throttled.replicas"),
        ConfigDef("index.interval.bytes", "int", 4096, _at_least(0), "log.index.interval.bytes",
                  "bytes of log between two offset-index entries"),
        ConfigDef("leader.replication.throttled.replicas", "list", [], None,
                  "leader.replication.throttled.replicas"),
        ConfigDef("local.retention.bytes", "long", -2, _at_least(-2), "log.local.retention.bytes"),
        ConfigDef("local.retention.ms", "long", -2, _at_least(-2), "log.local.retention.ms"),
        ConfigDef("max.compaction.lag.ms", "long", LONG_MAX, _at_least(1), "log.cleaner.max.compaction.lag.ms"),
        ConfigDef("max.message.bytes", "int", DEFAULT_MAX_MESSAGE_BYTES, _at_least(0), "message.max.bytes",
                  "largest record batch size allowed"),
        ConfigDef("message.downconversion.enable", "boolean", True, None, "log.message.downconversion.enable"),
        ConfigDef("message.format.version", "string", "3.0-IV1", _version_string, "log.message.format.version",
                  "deprecated: ignored since Kafka 3.0 (record batches are always v2); accepted with a warning"),
        ConfigDef("message.timestamp.after.max.ms", "long", LONG_MAX, _at_least(0),
                  "log.message.timestamp.after.max.ms"),
        ConfigDef("message.timestamp.before.max.ms", "long", LONG_MAX, _at_least(0),
                  "log.message.timestamp.before.max.ms"),
        ConfigDef("message.timestamp.difference.max.ms", "long", LONG_MAX, _at_least(0),
                  "log.message.timestamp.difference.max.ms"),
        ConfigDef("message.timestamp.type", "string", "CreateTime", _one_of("CreateTime", "LogAppendTime"),
                  "log.message.timestamp.type"),
        ConfigDef("min.cleanable.dirty.ratio", "double", 0.5, _between(0, 1), "log.cleaner.min.cleanable.ratio"),
        ConfigDef("min.compaction.lag.ms", "long", 0, _at_least(0), "log.cleaner.min.compaction.lag.ms"),
        ConfigDef("min.insync.replicas", "int", 1, _at_least(1), "min.insync.replicas"),
        ConfigDef("preallocate", "boolean", False, None, "log.preallocate"),
        ConfigDef("remote.storage.enable", "boolean", False, _remote_storage_disabled, None,
                  "tiered storage; kbroker has none, so only false is accepted"),
        ConfigDef("retention.bytes", "long", -1, None, "log.retention.bytes",
                  "delete old segments while the log is larger than this (-1: no limit)"),
        ConfigDef("retention.ms", "long", 604800000, _at_least(-1), "log.retention.ms",
                  "delete segments whose largest timestamp is older than this (-1: no limit)"),
        ConfigDef("segment.bytes", "int", 1073741824, _at_least(14), "log.segment.bytes",
                  "roll a new segment before the active one exceeds this size"),
        ConfigDef("segment.index.bytes", "int", 10485760, _at_least(4), "log.index.size.max.bytes",
                  "pre-allocated size of each offset/time index"),
        ConfigDef("segment.jitter.ms", "long", 0, _at_least(0), "log.roll.jitter.ms"),
        ConfigDef("segment.ms", "long", 604800000, _at_least(1), "log.roll.ms",
                  "roll a new segment when the active one's first batch is this old"),
        ConfigDef("unclean.leader.election.enable", "boolean", False, None, "unclean.leader.election.enable"),
        ConfigDef("kbroker.fsync.every.append", "boolean", False, None, "kbroker.log.fsync.every.append",
                  "fdatasync the segment before append returns (durable acks on a single replica)"),
        # broker-side schema id validation (Confluent Server's confluent.key/value.schema.validation)
        ConfigDef("kbroker.key.schema.validation", "boolean", False, None, None,
                  "each non-null record key must carry a schema id registered under the key subject "
                  "(needs the broker config kbroker.schema.registry.url)"),
        ConfigDef("kbroker.value.schema.validation", "boolean", False, None, None,
                  "each non-null record value must carry a schema id registered under the value subject "
                  "(needs the broker config kbroker.schema.registry.url)"),
        ConfigDef("kbroker.key.schema.validation.payload", "boolean", False, None, None,
                  "with kbroker.key.schema.validation: each key must also decode with its schema "
                  "(AVRO, JSON; PROTOBUF is not decoded)"),
        ConfigDef("kbroker.value.schema.validation.payload", "boolean", False, None, None,
                  "with kbroker.value.schema.validation: each value must also decode with its schema "
                  "(AVRO, JSON; PROTOBUF is not decoded)"),
        ConfigDef("kbroker.key.subject.name.strategy", "string", "TopicNameStrategy",
                  _one_of(*SUBJECT_NAME_STRATEGIES), None,
                  "subject of the key schema: TopicNameStrategy (<topic>-key) is the only one"),
        ConfigDef("kbroker.value.subject.name.strategy", "string", "TopicNameStrategy",
                  _one_of(*SUBJECT_NAME_STRATEGIES), None,
                  "subject of the value schema: TopicNameStrategy (<topic>-value) is the only one"),
    ]
    return {c.name: c for c in d}


CONFIG_DEFS: dict[str, ConfigDef] = _defs()

#: Topic configs kbroker accepts but that change nothing today, with the reason. Every other
#: key in CONFIG_DEFS has an effect on the log or the produce/fetch path
#: (tests/broker/test_config_walk.py walks all of them). A key kbroker cannot honour
#: at all is refused by its validator instead (remote.storage.enable=true).
NO_OP_CONFIGS: dict[str, str] = {
    "unclean.leader.election.enable":
        "single node: the only replica is always the leader, so there is never an out-of-sync "
        "replica to elect; it takes effect with replication",
    "follower.replication.throttled.replicas":
        "single node: there are no followers, so no replication traffic to throttle",
    "leader.replication.throttled.replicas":
        "single node: there are no followers, so no replication traffic to throttle",
    "local.retention.ms":
        "applies to the local part of a tiered log only; remote.storage.enable is always false",
    "local.retention.bytes":
        "applies to the local part of a tiered log only; remote.storage.enable is always false",
    "message.downconversion.enable":
        "kbroker serves Fetch v4+ only, whose clients read record batches v2: nothing is down-converted",
    "message.format.version":
        "deprecated in Kafka 3.0 and ignored there too (batches are always v2); accepted with a warning",
    "kbroker.key.subject.name.strategy":
        "TopicNameStrategy, the default, is the only strategy implemented (other values are refused); "
        "the key exists so Confluent Server's topic settings carry over",
    "kbroker.value.subject.name.strategy":
        "TopicNameStrategy, the default, is the only strategy implemented (other values are refused); "
        "the key exists so Confluent Server's topic settings carry over",
}

#: Deprecated topic configs Kafka 3.x still accepts as no-ops: setting one logs a warning.
DEPRECATED_CONFIGS = frozenset({"message.format.version"})
#: broker property name -> topic-level name
BROKER_TO_TOPIC: dict[str, str] = {c.broker_name: c.name for c in CONFIG_DEFS.values() if c.broker_name}

# Broker-level names with an alternative unit: (name, topic key, multiplier to ms), lowest precedence first.
_BROKER_TIME_SYNONYMS = [
    ("log.retention.hours", "retention.ms", 3600000),
    ("log.retention.minutes", "retention.ms", 60000),
    ("log.retention.ms", "retention.ms", 1),
    ("log.roll.hours", "segment.ms", 3600000),
    ("log.roll.ms", "segment.ms", 1),
    ("log.roll.jitter.hours", "segment.jitter.ms", 3600000),
    ("log.roll.jitter.ms", "segment.jitter.ms", 1),
]


def parse_value(cdef: ConfigDef, value: Any) -> Any:
    """Parse a (possibly string) value into the config's type; ConfigError on failure."""
    key, t = cdef.name, cdef.type
    if value is None:
        raise ConfigError(key, value, "value must not be null")
    try:
        if t in ("long", "int"):
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, str):
                value = int(value.strip())
            elif isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                value = int(value)
            elif not isinstance(value, int):
                raise ValueError
            lo, hi = (-(1 << 63), LONG_MAX) if t == "long" else (-(1 << 31), INT_MAX)
            if not lo <= value <= hi:
                raise ConfigError(key, value, f"Not a number of type {t.upper()}")
            return value
        if t == "double":
            if isinstance(value, bool):
                raise ValueError
            return float(value.strip()) if isinstance(value, str) else float(value)
        if t == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "false"):
                return value.strip().lower() == "true"
            raise ValueError
        if t == "string":
            if not isinstance(value, str):
                raise ValueError
            return value.strip()
        if t == "list":
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if isinstance(value, (list, tuple)):
                return [str(v).strip() for v in value]
            raise ValueError
    except ConfigError:
        raise
    except (ValueError, TypeError):
        raise ConfigError(key, value, f"Expected value to be a {t}") from None
    raise AssertionError(t)


_DERIVED_PREFIX = "_derived_"
_MISSING = object()


class LogConfig:
    """Effective configuration of one log (broker defaults + topic overrides).

    Immutable and thread-safe to share. ``originals`` are the topic-level
    overrides given (parsed); attributes hold every effective value.
    """

    __slots__ = ("_values", "originals", "__dict__")

    def __init__(self, overrides: Mapping[str, Any] | None = None, *,
                 defaults: Mapping[str, Any] | None = None, strict: bool = True):
        values = {name: c.default for name, c in CONFIG_DEFS.items()}
        if defaults:
            values.update(defaults)
        originals: dict[str, Any] = {}
        for key, raw in (overrides or {}).items():
            cdef = CONFIG_DEFS.get(key)
            if cdef is None:
                if strict:
                    raise ConfigError(key, raw, "Unknown topic config name")
                continue
            originals[key] = parse_value(cdef, raw)
        values.update(originals)
        for key, v in values.items():
            cdef = CONFIG_DEFS[key]
            if cdef.validator is not None:
                cdef.validator(key, v)
        self._values = values
        self.originals = originals
        for key, v in values.items():
            self.__dict__[CONFIG_DEFS[key].attr] = v

    def __setattr__(self, name, value):
        if name in ("_values", "originals"):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError("LogConfig is immutable")

    # -- construction -----------------------------------------------------------
    @classmethod
    def from_broker(cls, props: Mapping[str, Any] | None = None) -> "LogConfig":
        """Broker-wide default LogConfig from broker property names (``log.*`` ...).

        Unknown broker properties are ignored (they belong to other parts of
        the broker). ``log.retention.ms`` beats ``.minutes`` beats ``.hours``
        (Kafka's precedence); ``log.roll.ms`` beats ``log.roll.hours``.
        """
        props = dict(props or {})
        defaults: dict[str, Any] = {}
        for bname, tname in BROKER_TO_TOPIC.items():
            if bname in props and bname not in ("log.retention.ms", "log.roll.ms", "log.roll.jitter.ms"):
                defaults[tname] = parse_value(CONFIG_DEFS[tname], props[bname])
        for bname, tname, mult in _BROKER_TIME_SYNONYMS:
            if bname in props and props[bname] is not None:
                v = parse_value(ConfigDef(bname, "long", None, None, None), props[bname])
                defaults[tname] = v if v < 0 else v * mult
        # Kafka: a negative retention is "unlimited" (-1).
        if defaults.get("retention.ms", 0) < 0:
            defaults["retention.ms"] = -1
        for tname, v in defaults.items():
            cdef = CONFIG_DEFS[tname]
            if cdef.validator is not None:
                try:
                    cdef.validator(tname, v)
                except ConfigError as e:
                    raise ConfigError(cdef.broker_name or tname, v, str(e).split(": ", 1)[-1]) from None
        return cls(defaults=defaults)

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> "LogConfig":
        """A new config: this one's values as defaults, plus topic overrides."""
        return LogConfig(overrides, defaults=self._values)

    @staticmethod
    def validate(props: Mapping[str, Any]) -> dict[str, Any]:
        """Validate topic-level overrides (CreateTopics / AlterConfigs); returns parsed values."""
        return dict(LogConfig(props).originals)

    @staticmethod
    def config_names() -> Iterable[str]:
        return CONFIG_DEFS.keys()

    # -- access -------------------------------------------------------------------
    def get(self, name: str) -> Any:
        return self._values[name]

    def derived(self, key: str, fn: Callable[["LogConfig"], Any]) -> Any:
        """``fn(self)``, computed once per config and kept on it under ``key`` (the config
        is immutable, so anything derived from it stays valid; e.g. what the produce path
        reads per append). ``key`` must not be a config attribute name."""
        d = self.__dict__
        v = d.get(_DERIVED_PREFIX + key, _MISSING)
        if v is _MISSING:
            v = fn(self)
            d[_DERIVED_PREFIX + key] = v   # a race computes it twice: same value
        return v

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def string_value(self, name: str) -> str:
        """Value as DescribeConfigs reports it."""
        v = self._values[name]
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return ",".join(v)
        return str(v)

    @property
    def compact(self) -> bool:
        return "compact" in self._values["cleanup.policy"]

    @property
    def delete(self) -> bool:
        return "delete" in self._values["cleanup.policy"]

    @property
    def max_index_size(self) -> int:
        return self._values["segment.index.bytes"]

    @property
    def timestamp_before_max_ms(self) -> int:
        """Kafka's LogConfig.messageTimestampBeforeMaxMs: message.timestamp.before.max.ms,
        or the deprecated message.timestamp.difference.max.ms while the former is at its
        default (KIP-937's transition rule)."""
        v = self._values["message.timestamp.before.max.ms"]
        return self._values["message.timestamp.difference.max.ms"] if v == LONG_MAX else v

    @property
    def timestamp_after_max_ms(self) -> int:
        """Kafka's LogConfig.messageTimestampAfterMaxMs (see timestamp_before_max_ms)."""
        v = self._values["message.timestamp.after.max.ms"]
        return self._values["message.timestamp.difference.max.ms"] if v == LONG_MAX else v

    def __eq__(self, other):
        return isinstance(other, LogConfig) and other._values == self._values

    def __repr__(self):
        return f"LogConfig({self.originals!r})"


@dataclass(frozen=True)
class LogManagerConfig:
    """Broker-level settings of the LogManager itself (not per topic)."""

    log_dirs: tuple[str, ...] = ("/tmp/kafka-logs",)
    retention_check_interval_ms: int = 300000      # log.retention.check.interval.ms
    flush_check_interval_ms: int = LONG_MAX          # log.flush.scheduler.interval.ms
    flush_recovery_offset_checkpoint_interval_ms: int = 60000   # log.flush.offset.checkpoint.interval.ms
    flush_start_offset_checkpoint_interval_ms: int = 60000      # log.flush.start.offset.checkpoint.interval.ms
    recovery_threads_per_data_dir: int = 2          # num.recovery.threads.per.data.dir (Kafka 4.0: 2)
    fsync_every_append: bool = False                 # kbroker.log.fsync.every.append
    cleaner_enable: bool = True                      # log.cleaner.enable
    cleaner_threads: int = 1                         # log.cleaner.threads
    cleaner_backoff_ms: int = 15000                  # log.cleaner.backoff.ms
    cleaner_dedupe_buffer_size: int = 134217728      # log.cleaner.dedupe.buffer.size (all threads)
    cleaner_io_buffer_size: int = 524288             # log.cleaner.io.buffer.size
    cleaner_io_buffer_load_factor: float = 0.9       # log.cleaner.io.buffer.load.factor (offset map)

    @classmethod
    def from_broker(cls, props: Mapping[str, Any] | None = None) -> "LogManagerConfig":
        props = dict(props or {})
        dirs = props.get("log.dirs") or props.get("log.dir") or "/tmp/kafka-logs"
        if isinstance(dirs, str):
            dirs = [d.strip() for d in dirs.split(",") if d.strip()]
        if not dirs:
            raise ConfigError("log.dirs", dirs, "at least one log directory is required")

        def long_(name, default, lo=1):
            if name not in props:
                return default
            v = parse_value(ConfigDef(name, "long", None, None, None), props[name])
            if v < lo:
                raise ConfigError(name, v, f"Value must be at least {lo}")
            return v

        fsync = props.get("kbroker.log.fsync.every.append", False)
        fsync = parse_value(ConfigDef("kbroker.log.fsync.every.append", "boolean", False, None, None), fsync)
        cleaner_enable = parse_value(ConfigDef("log.cleaner.enable", "boolean", True, None, None),
                                     props.get("log.cleaner.enable", True))
        cleaner_threads = long_("log.cleaner.threads", 1, 0)
        dedupe = long_("log.cleaner.dedupe.buffer.size", 134217728)
        if cleaner_enable and cleaner_threads > 0 and dedupe // cleaner_threads < 1024 * 1024:
            raise ConfigError("log.cleaner.dedupe.buffer.size", dedupe,
                              "log.cleaner.dedupe.buffer.size must be at least 1MiB per cleaner thread.")
        load_factor = parse_value(ConfigDef("log.cleaner.io.buffer.load.factor", "double", 0.9, None, None),
                                  props.get("log.cleaner.io.buffer.load.factor", 0.9))
        if not 0 < load_factor <= 1:
            raise ConfigError("log.cleaner.io.buffer.load.factor", load_factor, "Value must be in (0, 1]")
        return cls(
            cleaner_enable=cleaner_enable,
            cleaner_threads=cleaner_threads,
            cleaner_backoff_ms=long_("log.cleaner.backoff.ms", 15000, 0),
            cleaner_dedupe_buffer_size=dedupe,
            cleaner_io_buffer_size=long_("log.cleaner.io.buffer.size", 524288, 1024),
            cleaner_io_buffer_load_factor=load_factor,
            log_dirs=tuple(dirs),
            retention_check_interval_ms=long_("log.retention.check.interval.ms", 300000),
            flush_check_interval_ms=long_("log.flush.scheduler.interval.ms", LONG_MAX),
            flush_recovery_offset_checkpoint_interval_ms=long_("log.flush.offset.checkpoint.interval.ms", 60000, 0),
            flush_start_offset_checkpoint_interval_ms=long_("log.flush.start.offset.checkpoint.interval.ms", 60000, 0),
            recovery_threads_per_data_dir=long_("num.recovery.threads.per.data.dir", 2),
            fsync_every_append=fsync,
        )
