"""DynamicBrokerConfig: broker configs changed at runtime by (Incremental)AlterConfigs.

Kafka: ``core/.../server/DynamicBrokerConfig.scala`` and the broker-side checks of
``ConfigAdminManager`` (KAFKA-13609: a BROKER change that fails validation is
answered INVALID_REQUEST, not INVALID_CONFIG).

Layers, highest precedence first: this broker's dynamic configs (resource name
``"<node.id>"``), the cluster-wide dynamic default (resource name ``""``), the
static config (server.properties, ``--override``), the key's default. Both
dynamic layers live in the MetadataStore (``alter_broker_config``: durable
before the change is applied), so they survive a restart and are applied at
start-up before any log is opened.

Which keys: ``DYNAMIC_CONFIGS``, the ones kbroker applies live (the broker-wide
defaults of the topic configs, e.g. ``log.retention.ms``, ``log.segment.bytes``,
``message.max.bytes``, ``min.insync.replicas``, plus ``kbroker.log.fsync.every.append``,
``transaction.partition.verification.enable`` (read per transactional produce);
and ``sasl.kerberos.min.time.before.relogin``, a documented no-op without SASL listeners).
Applying one rebuilds the LogManager's default LogConfig; every live log picks
it up with its topic's overrides still on top. A key Kafka can change
dynamically but kbroker cannot without a restart (thread pools, the cleaner,
listeners: ``KAFKA_DYNAMIC_CONFIGS - DYNAMIC_CONFIGS``) is refused with a message
saying so; any other key as Kafka refuses it ("Cannot update these configs
dynamically").

Thread-safety: ``alter`` holds ``_lock``; ``current`` is replaced, never mutated.
"""
from __future__ import annotations

import logging
import threading
from typing import Mapping

from kbroker.config_def import ConfigError
from kbroker.log.config import BROKER_TO_TOPIC, LogConfig, LogManagerConfig
from kbroker.log.errors import ConfigError as LogConfigError
from kbroker.server.config import BROKER_CONFIG, KafkaConfig

log = logging.getLogger(__name__)

#: Broker keys Kafka can change at runtime (DynamicBrokerConfig.AllDynamicConfigs: the log
#: defaults of DynamicLogConfig, thread pools, the cleaner, listeners, connection quotas,
#: producer-state expiry).
KAFKA_DYNAMIC_CONFIGS = frozenset(
    set(BROKER_TO_TOPIC)
    | {"log.retention.hours", "log.retention.minutes", "log.roll.hours", "log.roll.jitter.hours",
       "num.io.threads", "num.network.threads", "num.replica.fetchers", "num.recovery.threads.per.data.dir",
       "background.threads", "log.cleaner.threads", "log.cleaner.dedupe.buffer.size",
       "log.cleaner.io.buffer.size", "log.cleaner.io.buffer.load.factor", "log.cleaner.io.max.bytes.per.second",
       "log.cleaner.backoff.ms", "listeners", "advertised.listeners", "listener.security.protocol.map",
       "max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides",
       "max.connection.creation.rate", "producer.id.expiration.ms",
       "transaction.partition.verification.enable", "metric.reporters", "sasl.kerberos.min.time.before.relogin"}
)

#: Keys kbroker applies without a restart: the broker-wide topic-config defaults and our fsync mode.
DYNAMIC_CONFIGS = frozenset(
    (set(BROKER_TO_TOPIC) | {"log.retention.hours", "log.retention.minutes", "log.roll.hours",
                             "log.roll.jitter.hours", "sasl.kerberos.min.time.before.relogin",
                             "transaction.partition.verification.enable"})
    & set(BROKER_CONFIG.keys)
)


class DynamicConfigError(Exception):
    """A dynamic broker config change was refused; Kafka answers INVALID_REQUEST."""


def log_props(config: KafkaConfig) -> dict:
    """The properties the LogManager is built from: ``config``'s, with log.dirs resolved."""
    props = dict(config.originals)
    props["log.dirs"] = ",".join(config.log_dirs)
    return props


class DynamicBrokerConfig:
    """The static config plus the dynamic layers stored in ``metadata``; ``current`` is the
    effective KafkaConfig (static originals overlaid by the default, then per-broker layer)."""

    def __init__(self, static: KafkaConfig, metadata):
        self.static = static
        self.metadata = metadata
        self.node_id = static.node_id
        self._lock = threading.Lock()
        try:
            self.current = self._merge(self.default_layer(), self.broker_layer())
        except (ConfigError, LogConfigError, ValueError) as e:
            # Kafka logs and skips stored dynamic configs that no longer validate
            log.error("stored dynamic broker configs are invalid (%s); using the static config only", e)
            self.current = static

    def default_layer(self) -> dict[str, str]:
        return dict(self.metadata.image.broker_configs.get("", {}))

    def broker_layer(self) -> dict[str, str]:
        return dict(self.metadata.image.broker_configs.get(str(self.node_id), {}))

    def layer(self, resource_name: str) -> dict[str, str]:
        return self.default_layer() if resource_name == "" else self.broker_layer()

    def _merge(self, default: Mapping[str, str], per_broker: Mapping[str, str]) -> KafkaConfig:
        props = dict(self.static.originals)
        props.update(default)
        props.update(per_broker)
        cfg = KafkaConfig(props)
        LogConfig.from_broker(log_props(cfg))  # the log defaults must validate too
        return cfg

    @staticmethod
    def check_keys(names) -> None:
        """Kafka's DynamicBrokerConfig.validateConfigs key check."""
        refused = sorted(n for n in names if n not in KAFKA_DYNAMIC_CONFIGS and n not in DYNAMIC_CONFIGS)
        if refused:
            raise DynamicConfigError(f"Cannot update these configs dynamically: {', '.join(refused)}")
        later = sorted(n for n in names if n not in DYNAMIC_CONFIGS)
        if later:
            raise DynamicConfigError(
                f"kbroker cannot apply {', '.join(later)} without a restart (Kafka can update it dynamically): "
                "set it in server.properties or with --override and restart the broker")

    def alter(self, resource_name: str, layer: Mapping[str, str], validate_only: bool, log_manager) -> None:
        """Replace the dynamic configs of ``resource_name`` ("" or this node id) with ``layer``:
        validate the result as a whole, store it durably, then apply it to every live log."""
        self.check_keys(layer)
        with self._lock:
            default = dict(layer) if resource_name == "" else self.default_layer()
            per_broker = dict(layer) if resource_name != "" else self.broker_layer()
            try:
                new = self._merge(default, per_broker)
                props = log_props(new)
                default_log_config = LogConfig.from_broker(props)
                fsync = LogManagerConfig.from_broker(props).fsync_every_append
            except (ConfigError, LogConfigError, ValueError) as e:
                raise DynamicConfigError(str(e)) from None
            if validate_only:
                return
            self.metadata.alter_broker_config(resource_name, dict(layer))
            self.current = new
            log_manager.update_broker_defaults(default_log_config, fsync)
            log.info("dynamic broker configs of %s are now %s", repr(resource_name) if resource_name == ""
                     else f"broker {resource_name}", dict(sorted(layer.items())))

    def reload(self, log_manager) -> None:
        """Re-read both dynamic layers from ``metadata`` (a KRaft broker, after the
        controller's ConfigRecords for BROKER resources were published) and apply them to
        every live log. Layers that no longer validate are logged and the old ones kept."""
        with self._lock:
            try:
                new = self._merge(self.default_layer(), self.broker_layer())
                props = log_props(new)
                default_log_config = LogConfig.from_broker(props)
                fsync = LogManagerConfig.from_broker(props).fsync_every_append
            except (ConfigError, LogConfigError, ValueError) as e:
                log.error("published dynamic broker configs are invalid (%s); keeping the current ones", e)
                return
            self.current = new
            log_manager.update_broker_defaults(default_log_config, fsync)
