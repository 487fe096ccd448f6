"""The flow's topic management (MM2's MirrorSourceConnector duties): find the source
topics to replicate, create their remote topics on the target with the same partition
count and the synced configs, add partitions when the source grows, sync topic configs
and topic ACLs (``sync_acls``), and create MM2's internal topics.

A topic is replicated when the topic filter (``topics`` / ``topics.exclude``) accepts it
(or it is a heartbeats topic and ``heartbeats.replication.enabled``), it is not internal
(``__*``, ``.*``, ``*.internal``, ``*-internal``) and it is not a cycle: a topic whose
upstream cluster, at any hop, is the target (``B.orders`` on A is never sent to B).

Every instance of a flow runs this; creation is idempotent (TOPIC_ALREADY_EXISTS is fine).
"""
from __future__ import annotations

import logging

from kbroker.client import Admin, NewTopic
from kbroker.client import errors as E
from kbroker.client.admin import DELETE, RESOURCE_TOPIC, SET, ConfigResource
from kbroker.mirror.policy import is_cycle
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)
_STATIC_BROKER_CONFIG = 4
_DEFAULT_CONFIG = 5
_DYNAMIC_TOPIC_CONFIG = 1


def ensure_topic(admin: Admin, name: str, partitions: int, replication_factor: int, configs=None) -> bool:
    """Create ``name`` unless it exists; True if this call created it."""
    try:
        admin.create_topics([NewTopic(name, partitions, replication_factor, dict(configs or {}))])
        return True
    except E.TopicAlreadyExistsError:
        return False


class TopicManager:
    def __init__(self, fc, source_admin: Admin, target_admin: Admin):
        self.fc = fc
        self.source_admin = source_admin
        self.target_admin = target_admin
        self.known: dict[str, int] = {}        # replicated source topic -> partition count
        self.config_errors = 0
        self.acl_errors = 0
        #: the source answered SECURITY_DISABLED: no ACLs to sync (MM2 logs and stops too)
        self.acls_disabled = False

    def should_replicate_topic(self, topic: str) -> bool:
        fc, policy = self.fc, self.fc.policy
        wanted = fc.topic_filter.should_replicate_topic(topic) or (
            fc["heartbeats.replication.enabled"] and policy.is_heartbeats_topic(topic))
        return wanted and not policy.is_internal_topic(topic) and not is_cycle(policy, topic, fc.target)

    def create_internal_topics(self) -> None:
        fc = self.fc
        compact = {"cleanup.policy": "compact"}
        if fc["emit.offset-syncs.enabled"]:
            admin = self.source_admin if fc.offset_syncs_on_source else self.target_admin
            ensure_topic(admin, fc.offset_syncs_topic, 1, fc["offset-syncs.topic.replication.factor"], compact)
        if fc.exactly_once:     # the Connect worker's offsets topic (KafkaOffsetBackingStore: compacted)
            ensure_topic(self.target_admin, fc.offset_storage_topic, fc["offset.storage.partitions"],
                         fc["offset.storage.replication.factor"], compact)
        if fc.interval("emit.checkpoints") is not None:
            ensure_topic(self.target_admin, fc.checkpoints_topic, 1, fc["checkpoints.topic.replication.factor"],
                         compact)

    def refresh(self) -> dict[str, int]:
        """Create missing remote topics and partitions; returns {source topic: partitions}
        for every topic whose remote topic is ready."""
        fc = self.fc
        source = {t: len(ps) for t, ps in self.source_admin.describe_topics().items()
                  if self.should_replicate_topic(t)}
        target = {t: len(ps) for t, ps in self.target_admin.describe_topics().items()}
        ready = {}
        for topic, n in sorted(source.items()):
            remote = fc.remote_topic(topic)
            try:
                if remote not in target:
                    configs = self._create_configs(topic) if fc["sync.topic.configs.enabled"] else {}
                    if ensure_topic(self.target_admin, remote, n, fc["replication.factor"], configs):
                        log.info("%s: created %s with %d partitions", fc.flow, remote, n)
                elif target[remote] < n:
                    self.target_admin.create_partitions({remote: n})
                    log.info("%s: %s grows from %d to %d partitions", fc.flow, remote, target[remote], n)
                ready[topic] = n
            except E.KafkaError as e:
                log.warning("%s: cannot create %s: %s", fc.flow, remote, e)
        self.known = ready
        return ready

    # -- configs ------------------------------------------------------------------------
    def _source_configs(self, topic: str) -> dict:
        res = ConfigResource(RESOURCE_TOPIC, topic)
        return self.source_admin.describe_configs([res])[res]

    def _replicable(self, entry) -> bool:
        return (not entry.read_only and not entry.is_sensitive and entry.source != _STATIC_BROKER_CONFIG
                and self.fc.config_filter.should_replicate_config_property(entry.name))

    @staticmethod
    def _is_default(entry) -> bool:
        return entry.is_default or entry.source == _DEFAULT_CONFIG

    def _create_configs(self, topic: str) -> dict:
        """MirrorSourceConnector.targetConfig(incremental=false): the source's non-default
        (or, with use.defaults.from=source, every) replicable config."""
        try:
            entries = self._source_configs(topic)
        except E.KafkaError as e:
            self.config_errors += 1
            log.warning("%s: cannot describe the configs of %s: %s", self.fc.flow, topic, e)
            return {}
        cf = self.fc.config_filter
        return {e.name: e.value for e in entries.values() if self._replicable(e) and e.value is not None
                and (not self._is_default(e) or cf.should_replicate_source_default(e.name))}

    def sync_acls(self) -> int:
        """MM2's syncTopicAcls: the source's LITERAL TOPIC ACLs of replicated topics, except
        ALLOW WRITE (only the mirror writes a remote topic), created on the target for the
        remote topic, ALLOW ALL downgraded to ALLOW READ. Creating an ACL the target has is a
        no-op there. A cluster without an authorizer (SECURITY_DISABLED) turns this job off
        with one log line. Returns how many ACLs were sent."""
        from kbroker.security.authorizer import (
            AclFilter, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
        )
        if self.acls_disabled:
            return 0
        try:
            acls = self.source_admin.describe_acls(AclFilter(
                ResourceType.TOPIC, None, PatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY))
        except E.KafkaError as e:
            if getattr(e, "code", None) == ErrorCode.SECURITY_DISABLED:
                self.acls_disabled = True
                log.info("%s: the source cluster has no authorizer; topic ACLs are not synced", self.fc.flow)
            else:
                self.acl_errors += 1
                log.warning("%s: cannot describe the source's topic ACLs: %s", self.fc.flow, e)
            return 0
        out = []
        for a in acls:
            if a.resource_type != ResourceType.TOPIC or a.pattern_type != PatternType.LITERAL:
                continue
            if a.permission_type == AclPermissionType.ALLOW and a.operation == AclOperation.WRITE:
                continue
            if not self.should_replicate_topic(a.resource_name):
                continue
            op = (AclOperation.READ if a.permission_type == AclPermissionType.ALLOW
                  and a.operation == AclOperation.ALL else a.operation)
            out.append(StandardAcl(ResourceType.TOPIC, self.fc.remote_topic(a.resource_name), PatternType.LITERAL,
                                   a.principal, a.host, op, a.permission_type))
        if not out:
            return 0
        try:
            errors = [err for err in self.target_admin.create_acls(out) if err is not None]
        except E.KafkaError as e:
            errors = [e]
        if errors:
            self.acl_errors += 1
            log.warning("%s: cannot create %d topic ACLs on the target: %s", self.fc.flow, len(errors), errors[0])
        return len(out)

    def sync_configs(self) -> int:
        """Incremental sync: SET every replicable non-default source config that differs on
        the target; DELETE (back to the target's default) a replicable config the target
        overrides but the source leaves at its default. Returns how many topics changed."""
        changed = 0
        cf = self.fc.config_filter
        for topic in list(self.known):
            remote = self.fc.remote_topic(topic)
            try:
                src = self._source_configs(topic)
                res = ConfigResource(RESOURCE_TOPIC, remote)
                tgt = self.target_admin.describe_configs([res])[res]
            except E.KafkaError as e:
                self.config_errors += 1
                log.warning("%s: cannot describe the configs of %s: %s", self.fc.flow, topic, e)
                continue
            ops = []
            for e in src.values():
                if not self._replicable(e):
                    continue
                t = tgt.get(e.name)
                if self._is_default(e) and not cf.should_replicate_source_default(e.name):
                    if t is not None and t.source == _DYNAMIC_TOPIC_CONFIG:
                        ops.append((e.name, DELETE, None))
                elif e.value is not None and (t is None or t.value != e.value or t.source != _DYNAMIC_TOPIC_CONFIG):
                    ops.append((e.name, SET, e.value))
            if ops:
                try:
                    self.target_admin.incremental_alter_configs({res: ops})
                    changed += 1
                    log.info("%s: synced %d configs to %s", self.fc.flow, len(ops), remote)
                except E.KafkaError as e:
                    self.config_errors += 1
                    log.warning("%s: cannot alter the configs of %s: %s", self.fc.flow, remote, e)
        return changed
