"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for TOPIC and BROKER resources.

Kafka: ``core/.../server/ConfigHelper.scala`` (describe: value, source,
synonyms) and the controller's ``ConfigurationControlManager.java`` (alter:
legacy replace-all and incremental SET/DELETE/APPEND/SUBTRACT, validation of
the resulting config before anything is written).

Topic configs: a topic's overrides live in the MetadataStore
(``alter_topic_config``, durable) and are applied to its logs through
``LogManager.update_topic_config``. Alterations are serialised by
``_ALTER_LOCK`` so two concurrent incremental changes cannot lose one another.

Config sources (``DescribeConfigsResponse.ConfigSource``) as Kafka reports
them: an override is DYNAMIC_TOPIC_CONFIG; otherwise the first broker synonym
found, in order dynamic-broker, dynamic-default, STATIC_BROKER_CONFIG
(server.properties / --override) and DEFAULT_CONFIG (the broker key's default),
after dropping synonyms listed before the topic's own broker name (Kafka's
``dropWhile``: ``retention.ms`` looks at ``log.retention.ms`` first, so an
``log.retention.hours`` setting alone does not show as its source); with no
synonym at all, DEFAULT_CONFIG.

Broker configs: resource ``"<node.id>"`` is described in full (every key;
``read_only`` unless kbroker can change it at runtime), resource ``""`` (the
cluster-wide default) lists the dynamic defaults set. Altering them goes
through ``DynamicBrokerConfig`` (server/dynamic_config.py): per-broker >
cluster default > static > default, stored in the MetadataStore, applied to
live logs at once. A refused change answers INVALID_REQUEST, as Kafka does
for BROKER resources (ConfigAdminManager, KAFKA-13609).
"""
from __future__ import annotations

import logging
import threading

from kbroker.log.config import CONFIG_DEFS
from kbroker.log.errors import ConfigError as LogConfigError
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.alter_configs import AlterConfigsResourceResponse, AlterConfigsResponse
from kbroker.protocol.messages.describe_configs import (
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult, DescribeConfigsSynonym,
)
from kbroker.protocol.messages.incremental_alter_configs import (
    AlterConfigsResourceResponse as IncrementalResourceResponse, IncrementalAlterConfigsResponse,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER_CONFIGS, DESCRIBE_CONFIGS, TOPIC, authz
from kbroker.server.config import BROKER_CONFIG
from kbroker.server.dynamic_config import DYNAMIC_CONFIGS, DynamicConfigError
from kbroker.server.topics import TopicError, validate_topic_configs, validate_topic_name

log = logging.getLogger(__name__)

#: ConfigResource.Type
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4

#: DescribeConfigsResponse.ConfigSource
UNKNOWN_SOURCE = 0
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

#: DescribeConfigsResponse.ConfigType by ConfigDef type name
CONFIG_TYPE = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6,
               "list": 7, "class": 8, "password": 9}

#: IncrementalAlterConfigs operations (AlterConfigOp.OpType)
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

#: Kafka's DynamicBrokerConfig.brokerConfigSynonyms: keys that set the same value, highest precedence first
_BROKER_SYNONYM_GROUPS = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)
_BROKER_SYNONYMS = {name: group for group in _BROKER_SYNONYM_GROUPS for name in group}

_ALTER_LOCK = threading.Lock()  # serialises read-modify-write of topic overrides


class ConfigApiError(Exception):
    """A resource failed with Kafka error ``code`` and ``message``."""

    def __init__(self, code: int, message: str | None):
        super().__init__(message)
        self.code = code
        self.message = message


# -- value helpers ---------------------------------------------------------------------------

def config_string(value, type_: str) -> str | None:
    """Kafka's ConfigDef.convertToString."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and type_ == "double":
        return repr(value)
    return str(value)


def _static_default_configs() -> dict[str, str]:
    """Defaults of every broker key that has one, as strings (Kafka's staticDefaultConfigs)."""
    out = {}
    for name, key in BROKER_CONFIG.keys.items():
        s = config_string(key.default, key.type)
        if s is not None:
            out[name] = s
    return out


_STATIC_DEFAULTS = _static_default_configs()


def _static_broker_configs(broker) -> dict[str, str]:
    """Keys set in server.properties or by --override, as strings (staticBrokerConfigs)."""
    out = {}
    for name, raw in broker.config.originals.items():
        key = BROKER_CONFIG.keys.get(name)
        out[name] = config_string(raw, key.type if key else "string") if not isinstance(raw, str) else raw
    return out


def config_synonyms(broker, name: str, sensitive: bool) -> list[DescribeConfigsSynonym]:
    """Kafka's ConfigHelper.configSynonyms for broker key ``name``: per-broker dynamic,
    cluster-default dynamic, static, default; each layer in synonym precedence order."""
    names = _BROKER_SYNONYMS.get(name, (name,))
    found = []
    dyn = broker.dynamic_config
    for source, values in ((DYNAMIC_BROKER_CONFIG, dyn.broker_layer()),
                           (DYNAMIC_DEFAULT_BROKER_CONFIG, dyn.default_layer()),
                           (STATIC_BROKER_CONFIG, _static_broker_configs(broker)),
                           (DEFAULT_CONFIG, _STATIC_DEFAULTS)):
        for n in names:
            if n in values:
                found.append(DescribeConfigsSynonym(name=n, value=None if sensitive else values[n], source=source))
    while found and found[0].name != name:
        found.pop(0)
    return found


def _entry(name, value, source, synonyms, type_, read_only, sensitive, doc, v, include_synonyms,
           include_docs) -> DescribeConfigsResourceResult:
    r = DescribeConfigsResourceResult(name=name, value=value, read_only=read_only, is_sensitive=sensitive)
    if v == 0:
        r.is_default = source == DEFAULT_CONFIG
    else:
        r.config_source = source
        r.synonyms = synonyms if include_synonyms else []
    if v >= 3:
        r.config_type = CONFIG_TYPE.get(type_, 0)
        r.documentation = (doc or "") if include_docs else None
    return r


# -- describe --------------------------------------------------------------------------------

def describe_topic(broker, topic: str, keys, v: int, include_synonyms: bool, include_docs: bool) -> list:
    validate_topic_name(topic)
    t = broker.metadata.image.topics.get(topic)
    if t is None:
        raise ConfigApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
    cfg = broker.log_manager.config_for(topic)
    overrides = t.configs
    out = []
    for name in sorted(CONFIG_DEFS):
        if keys and name not in keys:
            continue
        cdef = CONFIG_DEFS[name]
        value = cfg.string_value(name)
        syns = config_synonyms(broker, cdef.broker_name, False) if cdef.broker_name else []
        if name in overrides:
            syns.insert(0, DescribeConfigsSynonym(name=name, value=value, source=DYNAMIC_TOPIC_CONFIG))
        source = syns[0].source if syns else DEFAULT_CONFIG
        out.append(_entry(name, value, source, syns, cdef.type, False, False, cdef.doc, v,
                          include_synonyms, include_docs))
    return out


def _broker_id(broker, resource_name: str | None) -> int | None:
    """None for the cluster-wide default resource (""), else this broker's id."""
    if not resource_name:
        return None
    try:
        node = int(resource_name)
    except ValueError:
        raise ConfigApiError(ErrorCode.INVALID_REQUEST,
                             f"Broker id must be an integer, but it is: {resource_name}") from None
    if node != broker.node_id:
        raise ConfigApiError(ErrorCode.INVALID_REQUEST,
                             f"Unexpected broker id, expected {broker.node_id} or empty string, "
                             f"but received {resource_name}")
    return node


def describe_broker(broker, resource_name: str | None, keys, v: int, include_synonyms: bool,
                    include_docs: bool) -> list:
    per_broker = _broker_id(broker, resource_name) is not None
    values = broker.dynamic_config.current.values
    defaults = broker.dynamic_config.default_layer()
    out = []
    for name in sorted(BROKER_CONFIG.keys):
        if keys and name not in keys:
            continue
        if not per_broker and name not in defaults:
            continue  # the cluster-default resource lists the dynamic defaults set
        key = BROKER_CONFIG.keys[name]
        sensitive = key.type == "password"
        syns = config_synonyms(broker, name, sensitive)
        if per_broker:
            value = None if sensitive else config_string(values.get(name), key.type)
        else:  # Kafka's createBrokerConfigEntry(perBrokerConfig = false)
            value = None if sensitive else defaults[name]
            syns = [s for s in syns if s.source != DYNAMIC_BROKER_CONFIG]
        source = syns[0].source if syns else DEFAULT_CONFIG
        out.append(_entry(name, value, source, syns, key.type, name not in DYNAMIC_CONFIGS,
                          sensitive, key.doc, v, include_synonyms, include_docs))
    return out


def _authorize(broker, ctx, res, operation) -> None:
    """KafkaApis / ConfigAdminManager: DESCRIBE_CONFIGS or ALTER_CONFIGS on the topic
    (TOPIC_AUTHORIZATION_FAILED) or on the cluster for a broker resource (CLUSTER_AUTHORIZATION_FAILED)."""
    auth = authz(broker, ctx)
    if auth is None:
        return
    if res.resource_type == RESOURCE_TOPIC and not auth.allowed(operation, TOPIC, res.resource_name):
        raise ConfigApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, None)
    if res.resource_type == RESOURCE_BROKER and not auth.cluster(operation):
        raise ConfigApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)


def handle_describe_configs(broker, ctx, req) -> None:
    v = ctx.api_version
    include_synonyms = v >= 1 and req.include_synonyms
    include_docs = v >= 3 and req.include_documentation
    results = []
    for res in req.resources:
        keys = set(res.configuration_keys) if res.configuration_keys else None
        r = DescribeConfigsResult(resource_type=res.resource_type, resource_name=res.resource_name,
                                  error_code=ErrorCode.NONE, error_message=None, configs=[])
        try:
            _authorize(broker, ctx, res, DESCRIBE_CONFIGS)
            if res.resource_type == RESOURCE_TOPIC:
                r.configs = describe_topic(broker, res.resource_name, keys, v, include_synonyms, include_docs)
            elif res.resource_type == RESOURCE_BROKER:
                r.configs = describe_broker(broker, res.resource_name, keys, v, include_synonyms, include_docs)
            else:
                raise ConfigApiError(ErrorCode.INVALID_REQUEST,
                                     f"Unsupported resource type: {res.resource_type}")
        except TopicError as e:
            r.error_code, r.error_message = e.code, e.message
        except ConfigApiError as e:
            r.error_code, r.error_message = e.code, e.message
        results.append(r)
    ctx.respond(DescribeConfigsResponse(throttle_time_ms=0, results=results))


# -- alter -----------------------------------------------------------------------------------

def _validate_topic_overrides(broker, topic: str, configs: dict[str, str]) -> None:
    """The whole resulting override set must be valid (the controller's validateAlterConfig)."""
    nulls = [k for k, val in configs.items() if val is None]
    if nulls:
        raise ConfigApiError(ErrorCode.INVALID_CONFIG,
                             "Null value not supported for topic configs: " + ",".join(nulls))
    try:
        validate_topic_configs(dict(configs), schema_registry=bool(broker.config["kbroker.schema.registry.url"]))
        broker.log_manager.default_config.with_overrides(configs)
    except TopicError as e:
        raise ConfigApiError(e.code, e.message) from None
    except (LogConfigError, ValueError) as e:
        raise ConfigApiError(ErrorCode.INVALID_CONFIG, str(e)) from None
    if topic not in broker.metadata.image.topics:
        raise ConfigApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{topic}' does not exist.")


def _apply_topic_overrides(broker, topic: str, configs: dict[str, str]) -> None:
    try:
        broker.metadata.alter_topic_config(topic, configs)
    except KeyError:
        raise ConfigApiError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             f"The topic '{topic}' does not exist.") from None
    broker.log_manager.update_topic_config(topic, configs)
    log.info("topic %s: config overrides are now %s", topic, dict(sorted(configs.items())))


def _alter_broker(broker, resource_name: str | None, compute, validate_only: bool) -> None:
    """``compute(current_layer) -> new_layer`` for the dynamic configs of ``resource_name``
    ("" = cluster default, else this node id); refused changes answer INVALID_REQUEST."""
    node = _broker_id(broker, resource_name)
    name = "" if node is None else str(node)
    dyn = broker.dynamic_config
    with _ALTER_LOCK:
        try:
            new = compute(dyn.layer(name))
            nulls = sorted(k for k, val in new.items() if val is None)
            if nulls:
                raise DynamicConfigError("Null value not supported for : " + ",".join(nulls))
            dyn.alter(name, new, validate_only, broker.log_manager)
        except DynamicConfigError as e:
            raise ConfigApiError(ErrorCode.INVALID_REQUEST, str(e)) from None


def _alter_topic(broker, topic: str, compute, validate_only: bool) -> None:
    """``compute(current_overrides) -> new_overrides``; validate, then (unless validate_only) apply."""
    try:
        validate_topic_name(topic)
    except TopicError as e:
        raise ConfigApiError(e.code, e.message) from None
    with _ALTER_LOCK:
        t = broker.metadata.image.topics.get(topic)
        current = dict(t.configs) if t is not None else {}
        new = compute(current)
        _validate_topic_overrides(broker, topic, new)
        if not validate_only:
            _apply_topic_overrides(broker, topic, new)


def _alter_response_entry(cls, res, err: ConfigApiError | None):
    code, msg = (err.code, err.message) if err else (ErrorCode.NONE, None)
    return cls(error_code=code, error_message=msg, resource_type=res.resource_type,
               resource_name=res.resource_name)


def _duplicates(resources) -> set:
    seen, dup = set(), set()
    for res in resources:
        k = (res.resource_type, res.resource_name)
        (dup if k in seen else seen).add(k)
    return dup


def handle_alter_configs(broker, ctx, req) -> None:
    out = []
    dup = _duplicates(req.resources)
    for res in req.resources:
        err = None
        try:
            if (res.resource_type, res.resource_name) in dup:
                raise ConfigApiError(ErrorCode.INVALID_REQUEST, "Duplicate resource.")
            _authorize(broker, ctx, res, ALTER_CONFIGS)
            new = {c.name: c.value for c in res.configs}
            if res.resource_type == RESOURCE_TOPIC:
                _alter_topic(broker, res.resource_name, lambda current: new, req.validate_only)
            elif res.resource_type == RESOURCE_BROKER:
                _alter_broker(broker, res.resource_name, lambda current: new, req.validate_only)
            else:
                raise ConfigApiError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type: {res.resource_type}")
        except ConfigApiError as e:
            err = e
        out.append(_alter_response_entry(AlterConfigsResourceResponse, res, err))
    ctx.respond(AlterConfigsResponse(throttle_time_ms=0, responses=out))


def _list_parts(value: str | None) -> list[str]:
    return [p for p in (value or "").split(",") if p]


def _topic_list_base(name: str) -> tuple[str, str] | None:
    """(type, default string) of topic config ``name``, None when unknown."""
    cdef = CONFIG_DEFS.get(name)
    return None if cdef is None else (cdef.type, config_string(cdef.default, cdef.type))


def _broker_list_base(broker):
    """(type, current effective string) of broker config ``name``, None when unknown."""
    def base(name: str) -> tuple[str, str] | None:
        key = BROKER_CONFIG.keys.get(name)
        if key is None:
            return None
        return key.type, config_string(broker.dynamic_config.current.values.get(name), key.type)
    return base


def incremental_result(current: dict[str, str], ops, base=_topic_list_base) -> dict[str, str]:
    """Apply IncrementalAlterConfigs ``ops`` ((name, op, value) ...) to overrides ``current``.

    APPEND/SUBTRACT work on list configs only, starting from ``base(name)`` (the
    key's default for a topic, its current value for a broker) when it is not
    overridden (Kafka's ConfigurationControlManager.getParts).
    """
    new = dict(current)
    for name, op, value in ops:
        if op == OP_SET:
            new[name] = value
        elif op == OP_DELETE:
            new.pop(name, None)
        else:
            typed = base(name)
            if typed is None or typed[0] != "list":
                raise ConfigApiError(ErrorCode.INVALID_CONFIG,
                                     f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST.")
            parts = _list_parts(new[name] if name in new else typed[1])
            for item in value.split(","):
                if op == OP_APPEND:
                    if item not in parts:
                        parts.append(item)
                else:
                    while item in parts:
                        parts.remove(item)
            new[name] = ",".join(parts)
    return new


def _check_ops(res) -> list[tuple[str, int, str | None]]:
    names = [c.name for c in res.configs]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigApiError(ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys : {','.join(dups)}")
    ops = []
    for c in res.configs:
        if c.config_operation not in _OP_NAMES:
            raise ConfigApiError(ErrorCode.INVALID_REQUEST,
                                 f"Unknown alter config operation type: {c.config_operation}")
        if c.config_operation != OP_DELETE and c.value is None:
            raise ConfigApiError(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {c.name}")
        ops.append((c.name, c.config_operation, c.value))
    return ops


def handle_incremental_alter_configs(broker, ctx, req) -> None:
    out = []
    dup = _duplicates(req.resources)
    for res in req.resources:
        err = None
        try:
            if (res.resource_type, res.resource_name) in dup:
                raise ConfigApiError(ErrorCode.INVALID_REQUEST, "Duplicate resource.")
            _authorize(broker, ctx, res, ALTER_CONFIGS)
            ops = _check_ops(res)
            if res.resource_type == RESOURCE_TOPIC:
                _alter_topic(broker, res.resource_name, lambda current: incremental_result(current, ops),
                             req.validate_only)
            elif res.resource_type == RESOURCE_BROKER:
                _alter_broker(broker, res.resource_name,
                              lambda current: incremental_result(current, ops, _broker_list_base(broker)),
                              req.validate_only)
            else:
                raise ConfigApiError(ErrorCode.INVALID_REQUEST, f"Unsupported resource type: {res.resource_type}")
        except ConfigApiError as e:
            err = e
        out.append(_alter_response_entry(IncrementalResourceResponse, res, err))
    ctx.respond(IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=out))


HANDLERS = {
    ApiKey.DESCRIBE_CONFIGS: ApiHandler(0, 4, handle_describe_configs),
    ApiKey.ALTER_CONFIGS: ApiHandler(0, 2, handle_alter_configs),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: ApiHandler(0, 1, handle_incremental_alter_configs),
}
