"""TopicManager: create, delete and grow topics (the controller's part, single node).

Kafka: the controller's ReplicationControlManager (KRaft) plus
AutoTopicCreationManager. Every change is recorded in the MetadataStore first,
then applied to the ReplicaManager (logs created or deleted), which is the
order a broker applies metadata records in.
"""
from __future__ import annotations

import logging
import re
import threading

from kbroker.log.config import DEPRECATED_CONFIGS, LogConfig
from kbroker.log.errors import ConfigError as LogConfigError
from kbroker.protocol import ErrorCode

MAX_NAME_LENGTH = 249
#: Kafka's QuorumController.MAX_RECORDS_PER_USER_OP: one user operation may not
#: create more metadata records than this (a topic record + one per partition + configs)
MAX_RECORDS_PER_USER_OP = 10000
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
log = logging.getLogger(__name__)


class TopicError(Exception):
    """A topic operation failed with Kafka error ``code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate."""
    if not name:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, topic name: {name}")
    if not _LEGAL.match(name):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"Topic name \"{name}\" is illegal, it contains a character other than "
                         "ASCII alphanumerics, '.', '_' and '-'")


def validate_topic_configs(configs: dict[str, str | None], *, schema_registry: bool = True) -> dict[str, str]:
    """Validate topic-level overrides; None values are dropped. Raises TopicError(INVALID_CONFIG).
    ``schema_registry``: whether the broker has a kbroker.schema.registry.url; without one,
    kbroker.key/value.schema.validation=true is refused."""
    clean = {k: v for k, v in configs.items() if v is not None}
    unknown = [k for k in clean if k not in set(LogConfig.config_names())]
    if unknown:
        raise TopicError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {unknown[0]}")
    try:
        parsed = LogConfig.validate(clean)
    except (LogConfigError, ValueError) as e:
        raise TopicError(ErrorCode.INVALID_CONFIG, str(e)) from None
    for field in ("key", "value"):
        if parsed.get(f"kbroker.{field}.schema.validation.payload") and \
                not parsed.get(f"kbroker.{field}.schema.validation"):
            raise TopicError(ErrorCode.INVALID_CONFIG,
                             f"Invalid value true for configuration kbroker.{field}.schema.validation.payload: "
                             f"it needs kbroker.{field}.schema.validation=true")
    if not schema_registry:
        for key in ("kbroker.key.schema.validation", "kbroker.value.schema.validation"):
            if parsed.get(key):
                raise TopicError(ErrorCode.INVALID_CONFIG,
                                 f"Invalid value true for configuration {key}: schema validation needs a "
                                 "Schema Registry, and the broker config kbroker.schema.registry.url is not set")
    for key in sorted(DEPRECATED_CONFIGS & clean.keys()):
        log.warning("Topic configuration %s is deprecated and has no effect (Kafka 3.0+ ignores it)", key)
    return clean


def _check_record_count(records: int) -> None:
    if records > MAX_RECORDS_PER_USER_OP:
        raise TopicError(ErrorCode.POLICY_VIOLATION,
                         f"Unable to perform excessively large batch operation: {records} metadata records "
                         f"would exceed the limit of {MAX_RECORDS_PER_USER_OP}.")


class TopicManager:
    def __init__(self, broker):
        self.broker = broker
        self._lock = threading.Lock()  # serialises create/delete/grow (the controller's event queue)

    def create(self, name: str, num_partitions: int, replication_factor: int,
               configs: dict[str, str | None] | None = None, assignments=None,
               validate_only: bool = False):
        b = self.broker
        validate_topic_name(name)
        self._check_new_name(name)
        if assignments:
            num_partitions, replication_factor = self._check_manual_assignment(
                assignments, num_partitions, replication_factor)
        if num_partitions == -1:
            num_partitions = b.config["num.partitions"]
        if replication_factor == -1:
            replication_factor = b.config["default.replication.factor"]
        if num_partitions <= 0:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
        if replication_factor <= 0:
            raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             "Replication factor must be larger than 0, or -1 to use the default value.")
        if replication_factor > 1:
            raise TopicError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             f"Unable to replicate the partition {replication_factor} time(s): "
                             "The target replication factor of {0} cannot be reached because only 1 broker(s) "
                             "are registered.".format(replication_factor))
        clean = validate_topic_configs(configs or {},
                                       schema_registry=bool(b.config["kbroker.schema.registry.url"]))
        _check_record_count(1 + num_partitions + len(clean))
        with self._lock:
            self._check_new_name(name)  # again: another create may have won meanwhile
            if validate_only:
                return None
            t = b.metadata.create_topic(name, num_partitions, clean)
            b.log_manager.update_topic_config(name, clean)
            with b.log_manager.batched_dir_sync():
                b.replica_manager.apply_topic(t)
            return t

    def _check_new_name(self, name: str) -> None:
        """Kafka's ReplicationControlManager.createTopics name checks, before any other:
        TOPIC_ALREADY_EXISTS for an existing name, else INVALID_TOPIC_EXCEPTION for a
        name that collides with an existing one once '.' and '_' are treated alike."""
        topics = self.broker.metadata.image.topics
        if name in topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if "." in name or "_" in name:
            norm = name.replace(".", "_")
            for other in topics:
                if other.replace(".", "_") == norm:
                    raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                                     f"Topic '{name}' collides with existing topic: {other}")

    def _check_manual_assignment(self, assignments, num_partitions: int, replication_factor: int):
        """Kafka's ReplicationControlManager.createTopic checks of a manual assignment;
        returns (partition count, replication factor) it implies."""
        if num_partitions != -1:
            raise TopicError(ErrorCode.INVALID_REQUEST,
                             "A manual partition assignment was specified, but numPartitions was not set to -1.")
        if replication_factor != -1:
            raise TopicError(ErrorCode.INVALID_REQUEST,
                             "A manual partition assignment was specified, but replicationFactor was not set to -1.")
        rf = None
        for i, a in enumerate(sorted(assignments, key=lambda a: a.partition_index)):
            if a.partition_index != i:
                raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"Found a non-consecutive partition index {a.partition_index}: expected {i}.")
            self._check_replicas(list(a.broker_ids))
            if rf is not None and len(a.broker_ids) != rf:
                raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"The manual partition assignment includes a partition with {len(a.broker_ids)} "
                                 f"replica(s), but this is inconsistent with previous partitions, which have "
                                 f"{rf} replica(s).")
            rf = len(a.broker_ids)
        return len(assignments), rf

    def _check_replicas(self, broker_ids: list[int]) -> None:
        """One partition's manual replica list: non-empty, no duplicates, registered brokers only."""
        if not broker_ids:
            raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "The manual partition assignment includes an empty replica list.")
        for bid in broker_ids:
            if broker_ids.count(bid) > 1:
                raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"The manual partition assignment includes the broker {bid} more than once.")
            if bid != self.broker.node_id:
                raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                 f"The manual partition assignment includes broker {bid}, but no broker with "
                                 "that id is registered.")

    def auto_create(self, name: str):
        b = self.broker
        try:
            return self.create(name, b.config["num.partitions"], b.config["default.replication.factor"])
        except TopicError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return b.metadata.image.topics.get(name)
            raise

    def create_internal(self, name: str, num_partitions: int, configs: dict[str, str]):
        """Internal topics (__consumer_offsets): created on first use."""
        b = self.broker
        with self._lock:
            t = b.metadata.image.topics.get(name)
            if t is None:
                t = b.metadata.create_topic(name, num_partitions, configs)
                b.log_manager.update_topic_config(name, configs)
                with b.log_manager.batched_dir_sync():
                    b.replica_manager.apply_topic(t)
            return t

    def delete(self, name: str):
        b = self.broker
        if not b.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.TOPIC_DELETION_DISABLED, "Topic deletion is disabled.")
        with self._lock:
            t = b.metadata.image.topics.get(name)
            if t is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                 "This server does not host this topic-partition.")
            b.metadata.delete_topic(name)
            b.replica_manager.remove_topic(name)
            for hook in b.topic_deletion_hooks:
                hook(name)
            return t

    def create_partitions(self, name: str, count: int, assignments=None, validate_only: bool = False):
        b = self.broker
        with self._lock:
            t = b.metadata.image.topics.get(name)
            if t is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
            if t.is_internal:
                raise TopicError(ErrorCode.INVALID_REQUEST, f"Cannot add partitions to internal topic {name}")
            if count < t.num_partitions:
                raise TopicError(ErrorCode.INVALID_PARTITIONS,
                                 f"Topic currently has {t.num_partitions} partitions, which is higher than "
                                 f"the requested {count}.")
            if count == t.num_partitions:
                raise TopicError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {t.num_partitions} partitions.")
            _check_record_count(count - t.num_partitions)
            if assignments:
                if len(assignments) != count - t.num_partitions:
                    raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"Attempted to add {count - t.num_partitions} additional partition(s), but only "
                                     f"{len(assignments)} assignment(s) were specified.")
                for a in assignments:
                    self._check_replicas(list(a.broker_ids))
                    if len(a.broker_ids) != 1:  # the topic's replication factor: always 1 on one node
                        raise TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                         f"The manual partition assignment includes a partition with "
                                         f"{len(a.broker_ids)} replica(s), but this is inconsistent with previous "
                                         "partitions, which have 1 replica(s).")
            if validate_only:
                return t
            t = b.metadata.create_partitions(name, count)
            with b.log_manager.batched_dir_sync():
                b.replica_manager.apply_topic(t)
            return t
