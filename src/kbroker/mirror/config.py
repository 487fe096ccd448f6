"""MirrorMaker 2 configuration (``mm2.properties``) under MM2's property names.

Precedence for a flow setting (``MirrorMakerConfig.connectorBaseConfig``): the flow's
``A->B.<name>`` wins over the top-level ``<name>``, which wins over MM2's default.
Clusters: ``clusters = A, B``; each cluster's ``A.<client config>`` (``A.bootstrap.servers``)
applies to all of its clients, ``A.consumer.*`` / ``A.producer.*`` / ``A.admin.*`` to one
role; top-level client settings (``bootstrap.servers``-style names) apply to every cluster.

Unlike MM2 (which ignores unknown keys), every key must be known: a typo is a
``MirrorConfigError`` naming the key, and so is a bad value.
"""
from __future__ import annotations

import re
from typing import NamedTuple

from kbroker.client.config import ADMIN, COMMON, CONSUMER, PRODUCER, ClientConfig
from kbroker.client.errors import KafkaConfigError
from kbroker.mirror import filters
from kbroker.mirror.policy import POLICIES, DefaultReplicationPolicy, IdentityReplicationPolicy


class MirrorConfigError(ValueError):
    """A bad mm2.properties: the message names the key."""


#: flow settings (top-level or ``A->B.``-prefixed) and MM2's defaults; type from the default
FLOW_DEFAULTS: dict[str, object] = {
    "enabled": False,
    "topics": filters.TOPICS_DEFAULT,
    "topics.exclude": filters.TOPICS_EXCLUDE_DEFAULT,
    "groups": filters.GROUPS_DEFAULT,
    "groups.exclude": filters.GROUPS_EXCLUDE_DEFAULT,
    "config.properties.exclude": filters.CONFIG_PROPERTIES_EXCLUDE_DEFAULT,
    "use.defaults.from": "target",
    "replication.factor": 2,
    "replication.policy.class": "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
    "replication.policy.separator": ".",
    "replication.policy.internal.topic.separator.enabled": True,
    "sync.topic.configs.enabled": True,
    "sync.topic.configs.interval.seconds": 600,
    "sync.topic.acls.enabled": True,
    "sync.topic.acls.interval.seconds": 600,
    "refresh.topics.enabled": True,
    "refresh.topics.interval.seconds": 600,
    "refresh.groups.enabled": True,
    "refresh.groups.interval.seconds": 600,
    "emit.heartbeats.enabled": True,
    "emit.heartbeats.interval.seconds": 1,
    "heartbeats.replication.enabled": True,
    "emit.checkpoints.enabled": True,
    "emit.checkpoints.interval.seconds": 60,
    "sync.group.offsets.enabled": False,
    "sync.group.offsets.interval.seconds": 60,
    "emit.offset-syncs.enabled": True,
    "offset-syncs.topic.location": "source",
    "offset-syncs.topic.replication.factor": 3,
    "checkpoints.topic.replication.factor": 3,
    "heartbeats.topic.replication.factor": 3,
    "offset.lag.max": 100,
    "consumer.poll.timeout.ms": 1000,
    "admin.timeout.ms": 60000,
    "tasks.max": 1,                           # accepted; instances split the work instead
    "offset.flush.interval.ms": 60000,        # Connect's: how often source offsets are committed
    "task.shutdown.graceful.timeout.ms": 5000,  # Connect's: how long a stop waits for a task
    # Connect settings MM2 files often carry; the mirror copies bytes, so converters are fixed
    "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
    "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
    "header.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
    "dedicated.mode.enable.internal.rest": False,
    # exactly-once (KIP-618 / KIP-656): the worker's switch, the connector's request, and
    # where a task's source offsets live (the Connect worker's offsets topic on the target)
    "exactly.once.source.support": "disabled",
    "exactly.once.support": "requested",
    "transaction.boundary": "poll",
    "transaction.boundary.interval.ms": -1,   # unset: offset.flush.interval.ms, as Connect
    "offset.storage.topic": "",               # unset: mm2-offsets.<source>.internal
    "offset.storage.partitions": 25,
    "offset.storage.replication.factor": 3,
    "transaction.timeout.ms": 60000,          # the task producers' (Connect leaves the client default)
}
_INTERVALS_OFF = -1          # MM2: a negative *.interval.seconds disables the task
_CLIENT_NAMES = {d.name for d in COMMON}
_ROLES = {"consumer": CONSUMER, "producer": PRODUCER, "admin": ADMIN}
_ENUMS = {"offset-syncs.topic.location": ("source", "target"), "use.defaults.from": ("source", "target"),
          "exactly.once.source.support": ("disabled", "preparing", "enabled"),
          "exactly.once.support": ("requested", "required"),
          # ``connector`` (connector-defined boundaries) is not offered: MirrorSourceConnector defines none
          "transaction.boundary": ("poll", "interval")}


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties``: ``key=value`` / ``key: value`` / ``key value``, ``#`` and ``!``
    comments, trailing ``\\`` continues a line."""
    props: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        while line.endswith("\\") and not line.endswith("\\\\"):
            line = line[:-1] + next(lines, "").lstrip()
        m = re.match(r"((?:\\.|[^=:\s\\])+)\s*[=:\s]\s*(.*)$", line)
        if m is None:
            key, value = line, ""
        else:
            key, value = m.group(1), m.group(2)
        props[key.replace("\\", "")] = value.strip()
    return props


def _coerce(key: str, default, raw):
    if isinstance(default, bool):
        s = str(raw).strip().lower()
        if s not in ("true", "false"):
            raise MirrorConfigError(f"invalid value {raw!r} for {key}: expected true or false")
        return s == "true"
    if isinstance(default, int):
        try:
            return int(str(raw).strip())
        except ValueError:
            raise MirrorConfigError(f"invalid value {raw!r} for {key}: expected an integer") from None
    value = str(raw).strip()
    choices = _ENUMS.get(key.rsplit("->", 1)[-1].split(".", 1)[-1] if "->" in key else key)
    if choices and value not in choices:
        raise MirrorConfigError(f"invalid value {raw!r} for {key}: expected one of {', '.join(choices)}")
    return value


class Flow(NamedTuple):
    source: str
    target: str

    def __str__(self):
        return f"{self.source}->{self.target}"


class FlowConfig:
    """One replication flow's settings (``A->B``), resolved and typed."""

    def __init__(self, mm: "MirrorMakerConfig", flow: Flow):
        self.flow = flow
        self.source, self.target = flow
        self._values = {name: mm.flow_value(flow, name) for name in FLOW_DEFAULTS}
        self.policy = mm.replication_policy(flow)
        self.topic_filter = filters.TopicFilter(self["topics"], self["topics.exclude"])
        self.group_filter = filters.GroupFilter(self["groups"], self["groups.exclude"])
        self.config_filter = filters.ConfigPropertyFilter(self["config.properties.exclude"],
                                                          self["use.defaults.from"])
        self.source_clients = {r: mm.client_config(self.source, r) for r in _ROLES}
        self.target_clients = {r: mm.client_config(self.target, r) for r in _ROLES}

    def __getitem__(self, name):
        return self._values[name]

    def interval(self, name: str) -> float | None:
        """``<name>.interval.seconds`` in seconds, None when ``<name>.enabled`` is false
        or the interval is negative (MM2 disables the task then)."""
        if not self._values.get(f"{name}.enabled", True):
            return None
        s = self._values[f"{name}.interval.seconds"]
        return None if s < 0 else float(s)

    @property
    def offset_syncs_on_source(self) -> bool:
        return self["offset-syncs.topic.location"] == "source"

    @property
    def offset_syncs_topic(self) -> str:
        """MirrorSourceConfig.offsetSyncsTopic: named after the *other* cluster."""
        other = self.target if self.offset_syncs_on_source else self.source
        return self.policy.offset_syncs_topic(other)

    @property
    def checkpoints_topic(self) -> str:
        return self.policy.checkpoints_topic(self.source)

    def remote_topic(self, topic: str) -> str:
        return self.policy.format_remote_topic(self.source, topic)

    @property
    def exactly_once(self) -> bool:
        """The worker's ``exactly.once.source.support = enabled`` (``preparing`` only readies
        a Connect cluster for the switch; its tasks still run at least once)."""
        return self["exactly.once.source.support"] == "enabled"

    @property
    def read_committed(self) -> bool:
        return self.source_clients["consumer"].get("isolation.level", "read_uncommitted") == "read_committed"

    @property
    def worker_group_id(self) -> str:
        """The group.id MM2's Connect worker of this flow has on the target (``A-mm2``)."""
        return f"{self.source}-mm2"

    @property
    def offset_storage_topic(self) -> str:
        """The worker's offsets topic on the target: ``mm2-offsets.<source>.internal``."""
        return self["offset.storage.topic"] or f"mm2-offsets.{self.source}.internal"

    def transactional_id(self, task: int) -> str:
        """Connect's task transactional id, ``<group.id>-<connector>-<task>``: stable across
        restarts, so a restarted task fences the one it replaces."""
        return f"{self.worker_group_id}-MirrorSourceConnector-{task}"

    @property
    def transaction_boundary_s(self) -> float | None:
        """Seconds between commits with ``transaction.boundary = interval``; None for ``poll``."""
        if self["transaction.boundary"] == "poll":
            return None
        ms = self["transaction.boundary.interval.ms"]
        return (ms if ms >= 0 else self["offset.flush.interval.ms"]) / 1000.0

    @property
    def mirror_group_id(self) -> str:
        """The consumer group mirror instances of this flow share on the source cluster."""
        return f"mm2-{self.source}->{self.target}"


class MirrorMakerConfig:
    def __init__(self, props: dict[str, str]):
        self.props = dict(props)
        raw = self.props.get("clusters")
        if not raw:
            raise MirrorConfigError("missing required property clusters (e.g. clusters = A, B)")
        self.clusters = filters.parse_list(raw)
        if len(set(self.clusters)) != len(self.clusters) or not all(self.clusters):
            raise MirrorConfigError(f"invalid value {raw!r} for clusters")
        self._validate()
        self.flows = [FlowConfig(self, f) for f in self._pairs() if self.flow_value(f, "enabled")]
        self.heartbeat_flows = [FlowConfig(self, f) for f in self._pairs()
                                if self.flow_value(f, "emit.heartbeats.enabled")]
        if not self.flows:
            raise MirrorConfigError("no replication flow enabled (set e.g. A->B.enabled = true)")
        for fc in self.flows:    # MirrorSourceConnector.validateExactlyOnceConfigs
            if fc["exactly.once.support"] == "required" and not fc.read_committed:
                raise MirrorConfigError(
                    f"{fc.flow}: exactly.once.support = required needs {fc.source}.consumer.isolation.level"
                    " = read_committed (records of aborted source transactions would be mirrored)")

    @classmethod
    def from_file(cls, path: str) -> "MirrorMakerConfig":
        with open(path, encoding="utf-8") as f:
            return cls(parse_properties(f.read()))

    def _pairs(self):
        return [Flow(s, t) for s in self.clusters for t in self.clusters if s != t]

    # -- lookups ------------------------------------------------------------------------
    def flow_value(self, flow: Flow, name: str):
        default = FLOW_DEFAULTS[name]
        key = f"{flow}.{name}"
        if key in self.props:
            return _coerce(key, default, self.props[key])
        if name != "enabled" and name in self.props:
            return _coerce(name, default, self.props[name])
        return default

    def replication_policy(self, flow: Flow) -> DefaultReplicationPolicy:
        cls = POLICIES[self.flow_value(flow, "replication.policy.class")]
        sep = self.flow_value(flow, "replication.policy.separator")
        internal = self.flow_value(flow, "replication.policy.internal.topic.separator.enabled")
        if cls is IdentityReplicationPolicy:
            return cls(sep, internal, flow.source)
        return cls(sep, internal)

    def client_config(self, cluster: str, role: str) -> dict:
        """The kbroker.client config for ``role`` (consumer/producer/admin) on ``cluster``."""
        out = {k: v for k, v in self.props.items() if k in _CLIENT_NAMES}
        prefix = cluster + "."
        for k, v in self.props.items():
            if k.startswith(prefix):
                rest = k[len(prefix):]
                if rest in _CLIENT_NAMES:
                    out[rest] = v
        rp = f"{prefix}{role}."
        out.update({k[len(rp):]: v for k, v in self.props.items() if k.startswith(rp)})
        return out

    # -- validation ---------------------------------------------------------------------
    def _validate(self) -> None:
        flows = {str(f): f for f in self._pairs()}
        for key, value in self.props.items():
            if key == "clusters" or key in _CLIENT_NAMES:
                continue
            if key in FLOW_DEFAULTS:
                _coerce(key, FLOW_DEFAULTS[key], value)
                if key == "replication.policy.class" and value.strip() not in POLICIES:
                    raise MirrorConfigError(f"invalid value {value!r} for {key}: expected one of "
                                            "DefaultReplicationPolicy, IdentityReplicationPolicy")
                continue
            head, dot, rest = key.partition(".")
            if "->" in head:
                if head not in flows:
                    raise MirrorConfigError(f"unknown property {key}: {head} is not a flow between "
                                            f"the clusters {', '.join(self.clusters)}")
                if rest not in FLOW_DEFAULTS:
                    raise MirrorConfigError(f"unknown property {key}")
                _coerce(key, FLOW_DEFAULTS[rest], value)
                if rest == "replication.policy.class" and value.strip() not in POLICIES:
                    raise MirrorConfigError(f"invalid value {value!r} for {key}")
                continue
            if head in self.clusters and dot:
                role, _, name = rest.partition(".")
                if rest in _CLIENT_NAMES:
                    continue
                if role in _ROLES and name:
                    try:
                        ClientConfig(_ROLES[role], {"bootstrap.servers": "localhost:9092", name: value})
                    except KafkaConfigError as e:
                        raise MirrorConfigError(f"{key}: {e}") from None
                    continue
            raise MirrorConfigError(f"unknown property {key}")
        for cluster in self.clusters:
            for role, defs in _ROLES.items():
                cfg = self.client_config(cluster, role)
                if "bootstrap.servers" not in cfg:
                    raise MirrorConfigError(f"missing required property {cluster}.bootstrap.servers")
                try:
                    ClientConfig(defs, cfg)
                except KafkaConfigError as e:
                    raise MirrorConfigError(f"{cluster} {role}: {e}") from None
