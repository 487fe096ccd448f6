"""Admin: topic, config, offset and group administration (Kafka's Admin client).

Synchronous: each method sends its requests and waits (default.api.timeout.ms, or the
``timeout`` argument in seconds). Per-item results come back as dicts; with
``raise_on_error=True`` (the default) the first per-item error is raised as the
KafkaError subclass named by its code (TopicAlreadyExistsError, ...).

Routing as in Kafka: CreateTopics / DeleteTopics / CreatePartitions / ElectLeaders /
(Alter|List)PartitionReassignments go to the controller (retried on NOT_CONTROLLER after a metadata refresh), DescribeConfigs /
IncrementalAlterConfigs for a broker resource to that broker, group requests to the
group's coordinator, ListGroups to every broker, ListOffsets to each partition's leader.

Thread-safety: calls are serialized on the NetworkClient's lock; use one Admin per thread
for concurrency.
"""
from __future__ import annotations

import time
from typing import NamedTuple

from kbroker.client import errors as E
from kbroker.client.config import ADMIN, ClientConfig
from kbroker.client.consumer.coordinator import OffsetAndMetadata, decode_assignment
from kbroker.client.metadata import BrokerMetadata, Metadata, TopicPartition
from kbroker.client.network_client import NetworkClient
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import create_partitions as cp
from kbroker.protocol.messages import create_topics as ct
from kbroker.protocol.messages import alter_partition_reassignments as apr
from kbroker.protocol.messages import describe_configs as dc
from kbroker.protocol.messages import elect_leaders as el
from kbroker.protocol.messages import incremental_alter_configs as iac
from kbroker.protocol.messages import list_partition_reassignments as lpr
from kbroker.protocol.messages.delete_groups import DeleteGroupsRequest
from kbroker.protocol.messages.delete_topics import DeleteTopicsRequest
from kbroker.protocol.messages.describe_cluster import DescribeClusterRequest
from kbroker.protocol.messages.describe_groups import DescribeGroupsRequest
from kbroker.protocol.messages.find_coordinator import FindCoordinatorRequest
from kbroker.protocol.messages.list_groups import ListGroupsRequest
from kbroker.protocol.messages.list_offsets import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kbroker.protocol.messages.offset_fetch import OffsetFetchRequest

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
#: IncrementalAlterConfigs operations
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
#: ElectLeaders election types (Kafka's ElectionType)
PREFERRED, UNCLEAN = 0, 1


class NewTopic(NamedTuple):
    name: str
    num_partitions: int = -1          # -1: the broker's num.partitions
    replication_factor: int = -1      # -1: the broker's default.replication.factor
    configs: dict = {}


class ConfigResource(NamedTuple):
    type: int                          # RESOURCE_TOPIC or RESOURCE_BROKER
    name: str


class ConfigEntry(NamedTuple):
    name: str
    value: str | None
    read_only: bool
    is_default: bool
    source: int                        # a CONFIG_SOURCES key
    is_sensitive: bool
    synonyms: tuple = ()               # ((name, value, source), ...) in precedence order


#: DescribeConfigs config_source -> Kafka's ConfigEntry.ConfigSource name
CONFIG_SOURCES = {
    0: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG", 3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG", 6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "DYNAMIC_CLIENT_METRICS_CONFIG", 8: "DYNAMIC_GROUP_CONFIG",
}


class ListOffsetsResult(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int


class GroupListing(NamedTuple):
    group_id: str
    protocol_type: str
    state: str
    type: str = ""                     # "classic" or "consumer" (ListGroups v5+), else ""


class MemberDescription(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: list


class GroupDescription(NamedTuple):
    group_id: str
    state: str
    protocol_type: str
    protocol: str                      # the assignor (classic: the chosen protocol name)
    members: list
    coordinator: BrokerMetadata | None = None


class ReplicaInfo(NamedTuple):
    size: int                          # bytes on disk
    offset_lag: int                    # high watermark (or, for a future replica, the current one's LEO) - LEO
    is_future: bool


class LogDirDescription(NamedTuple):
    error: Exception | None
    replicas: dict                     # {TopicPartition: ReplicaInfo}
    total_bytes: int                   # -1: unknown (DescribeLogDirs < v4)
    usable_bytes: int


class PartitionReassignment(NamedTuple):
    replicas: list                     # the full replica set while moving (target + those leaving)
    adding_replicas: list
    removing_replicas: list


class FeatureMetadata(NamedTuple):
    """Kafka's FeatureMetadata: a broker's ApiVersions v3+ features."""
    finalized: dict          # {feature: finalized level}
    supported: dict          # {feature: (min, max)}
    epoch: int               # the finalized levels' epoch (-1: not known)


class ClusterDescription(NamedTuple):
    cluster_id: str | None
    controller_id: int
    brokers: list


def _check(results: dict, raise_on_error: bool) -> dict:
    if raise_on_error:
        for v in results.values():
            if isinstance(v, Exception):
                raise v
    return results


class Admin:
    def __init__(self, config: dict | None = None, **kwargs):
        self.config = cfg = ClientConfig(ADMIN, config, **kwargs)
        self.metadata = Metadata(cfg)
        self.metadata.set_topics(None)
        self.metadata.allow_auto_topic_creation = False
        self.client = NetworkClient(cfg, self.metadata)
        self.default_timeout_s = cfg["default.api.timeout.ms"] / 1000.0
        self.retry_backoff_s = cfg["retry.backoff.ms"] / 1000.0

    def _deadline(self, timeout):
        return time.monotonic() + (self.default_timeout_s if timeout is None else timeout)

    def _left(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise E.KafkaTimeoutError("Timed out waiting for the admin request")
        return left

    def _ensure_metadata(self, deadline):
        if self.metadata.version == 0:
            self.client.await_metadata(self._left(deadline), force=False)

    def _any_node(self, deadline, exclude=()) -> int:
        self._ensure_metadata(deadline)
        return self.client.least_loaded_node(exclude)

    def _controller(self, deadline, exclude=()) -> int:
        self._ensure_metadata(deadline)
        cid = self.metadata.cluster.controller_id
        if cid is not None and cid >= 0 and cid not in exclude:
            return cid
        return self.client.least_loaded_node(exclude)

    def _request_any(self, api_key, build, deadline, *, controller: bool = False):
        """Send ``build()`` to the controller (``controller``) or the least loaded broker,
        as Kafka's AdminClient does: a node that refuses the connection or drops it is
        left out and the call goes to another one (a KRaft broker names a random broker
        as the "controller", which may have just died) until the deadline."""
        failed: set = set()
        while True:
            node = (self._controller if controller else self._any_node)(deadline, failed)
            if node is None:
                self.client.poll(min(self.retry_backoff_s, self._left(deadline)))
                continue
            try:
                self.client.await_ready(node, deadline, fail_fast=True)
                return self.client.request(node, api_key, build(), self._left(deadline))
            except E.KafkaConnectionError:
                failed.add(node)
                if len(failed) >= len(self.metadata.nodes()):
                    failed.clear()          # every node failed once: back off, try them all again
                    self.client.poll(min(self.retry_backoff_s, self._left(deadline)))
                self.metadata.request_update()

    def _to_controller(self, api_key, build, deadline):
        """Send to the controller; returns the response (the callers resend items that
        answered NOT_CONTROLLER after a metadata refresh)."""
        return self._request_any(api_key, build, deadline, controller=True)

    # -- topics -------------------------------------------------------------------------
    def create_topics(self, new_topics, timeout: float | None = None, validate_only: bool = False,
                      raise_on_error: bool = True) -> dict:
        """{name: None or KafkaError}. Waits until the new topics appear in metadata."""
        deadline = self._deadline(timeout)
        pending = {t.name: t for t in (NewTopic(t) if isinstance(t, str) else t for t in new_topics)}
        results: dict = {}
        while pending:
            req = ct.CreateTopicsRequest(topics=[ct.CreatableTopic(
                name=t.name, num_partitions=t.num_partitions, replication_factor=t.replication_factor,
                assignments=[], configs=[ct.CreatableTopicConfig(name=k, value=str(v)) for k, v in t.configs.items()])
                for t in pending.values()], timeout_ms=int(self._left(deadline) * 1000), validate_only=validate_only)
            resp = self._to_controller(ApiKey.CREATE_TOPICS, lambda: req, deadline)
            retry = {}
            for r in resp.topics:
                if r.error_code == ErrorCode.NOT_CONTROLLER:
                    retry[r.name] = pending[r.name]
                else:
                    results[r.name] = E.for_code(r.error_code, r.error_message or None) if r.error_code else None
            pending = retry
            if pending:
                self.client.await_metadata(self._left(deadline))
        created = [n for n, e in results.items() if e is None]
        if created and not validate_only:
            self._await_topics(created, deadline, present=True)
        return _check(results, raise_on_error)

    def _await_topics(self, names, deadline, present: bool) -> None:
        while True:
            self.client.await_metadata(self._left(deadline))
            topics = self.metadata.cluster.topics
            if all((n in topics and all(p.leader >= 0 for p in topics[n])) == present for n in names):
                return
            self.client.poll(min(self.retry_backoff_s, self._left(deadline)))

    def delete_topics(self, names, timeout: float | None = None, raise_on_error: bool = True) -> dict:
        deadline = self._deadline(timeout)
        resp = self._to_controller(ApiKey.DELETE_TOPICS, lambda: DeleteTopicsRequest(
            topic_names=list(names), timeout_ms=int(self._left(deadline) * 1000)), deadline)
        results = {r.name: E.for_code(r.error_code, getattr(r, "error_message", None)) if r.error_code else None
                   for r in resp.responses}
        return _check(results, raise_on_error)

    def create_partitions(self, new_counts: dict[str, int], timeout: float | None = None,
                          validate_only: bool = False, raise_on_error: bool = True) -> dict:
        """{topic: None or KafkaError}; new_counts maps topic -> new total partition count."""
        deadline = self._deadline(timeout)
        resp = self._to_controller(ApiKey.CREATE_PARTITIONS, lambda: cp.CreatePartitionsRequest(
            topics=[cp.CreatePartitionsTopic(name=t, count=n, assignments=None) for t, n in new_counts.items()],
            timeout_ms=int(self._left(deadline) * 1000), validate_only=validate_only), deadline)
        results = {r.name: E.for_code(r.error_code, r.error_message) if r.error_code else None
                   for r in resp.results}
        return _check(results, raise_on_error)

    # -- leaders and replica placement (sent to the controller: forwarded by a KRaft broker) ---
    def elect_leaders(self, election_type: int = PREFERRED, partitions=None, timeout: float | None = None,
                      raise_on_error: bool = False) -> dict:
        """Kafka's Admin.electLeaders: {TopicPartition: None or KafkaError} (None: a new leader
        was elected; ElectionNotNeededError: the preferred replica already leads). ``partitions``
        None elects every partition that needs it (the answer then lists only those)."""
        deadline = self._deadline(timeout)
        tps = None
        if partitions is not None:
            by_topic: dict = {}
            for tp in partitions:
                by_topic.setdefault(tp[0], []).append(tp[1])
            tps = [el.TopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]
        resp = self._to_controller(ApiKey.ELECT_LEADERS, lambda: el.ElectLeadersRequest(
            election_type=election_type, topic_partitions=tps, timeout_ms=int(self._left(deadline) * 1000)),
            deadline)
        if resp.error_code:
            raise E.for_code(resp.error_code, None)
        results = {TopicPartition(r.topic, p.partition_id): E.for_code(p.error_code, p.error_message)
                   if p.error_code else None
                   for r in resp.replica_election_results for p in r.partition_result}
        return _check(results, raise_on_error)

    def alter_partition_reassignments(self, reassignments: dict, timeout: float | None = None,
                                      raise_on_error: bool = True) -> dict:
        """Kafka's Admin.alterPartitionReassignments: ``{TopicPartition: [replica ids] or None}``
        (None cancels an ongoing reassignment) -> {TopicPartition: None or KafkaError}."""
        deadline = self._deadline(timeout)
        by_topic: dict = {}
        for tp, replicas in reassignments.items():
            by_topic.setdefault(tp[0], []).append(apr.ReassignablePartition(
                partition_index=tp[1], replicas=None if replicas is None else [int(r) for r in replicas]))
        resp = self._to_controller(ApiKey.ALTER_PARTITION_REASSIGNMENTS, lambda: apr.AlterPartitionReassignmentsRequest(
            timeout_ms=int(self._left(deadline) * 1000),
            topics=[apr.ReassignableTopic(name=t, partitions=ps) for t, ps in sorted(by_topic.items())]), deadline)
        if resp.error_code:
            raise E.for_code(resp.error_code, resp.error_message)
        results = {TopicPartition(t.name, p.partition_index): E.for_code(p.error_code, p.error_message)
                   if p.error_code else None for t in resp.responses for p in t.partitions}
        return _check(results, raise_on_error)

    def list_partition_reassignments(self, partitions=None, timeout: float | None = None) -> dict:
        """Kafka's Admin.listPartitionReassignments: {TopicPartition: PartitionReassignment}
        for the reassignments in progress (``partitions`` None: all of them)."""
        deadline = self._deadline(timeout)
        topics = None
        if partitions is not None:
            by_topic: dict = {}
            for tp in partitions:
                by_topic.setdefault(tp[0], []).append(tp[1])
            topics = [lpr.ListPartitionReassignmentsTopics(name=t, partition_indexes=sorted(ps))
                      for t, ps in sorted(by_topic.items())]
        resp = self._to_controller(ApiKey.LIST_PARTITION_REASSIGNMENTS, lambda: lpr.ListPartitionReassignmentsRequest(
            timeout_ms=int(self._left(deadline) * 1000), topics=topics), deadline)
        if resp.error_code:
            raise E.for_code(resp.error_code, resp.error_message)
        return {TopicPartition(t.name, p.partition_index): PartitionReassignment(
            list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
            for t in resp.topics for p in t.partitions}

    def describe_topics(self, names=None, timeout: float | None = None) -> dict:
        """{topic: [PartitionMetadata]} from a fresh metadata response; raises for a
        topic the broker reports an error for (e.g. UnknownTopicOrPartitionError)."""
        deadline = self._deadline(timeout)
        self.client.await_metadata(self._left(deadline))
        c = self.metadata.cluster
        if names is None:
            return dict(c.topics)
        out = {}
        for n in names:
            if n in c.topics:
                out[n] = c.topics[n]
            else:
                raise E.for_code(c.topic_errors.get(n, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), f"topic {n}")
        return out

    def list_topics(self, timeout: float | None = None) -> list[str]:
        return sorted(self.describe_topics(None, timeout))

    def describe_cluster(self, timeout: float | None = None) -> ClusterDescription:
        deadline = self._deadline(timeout)
        try:
            r = self._request_any(ApiKey.DESCRIBE_CLUSTER, DescribeClusterRequest, deadline)
        except E.KafkaError as e:
            if e.code != ErrorCode.UNSUPPORTED_VERSION:
                raise
            r = None                                # a broker without DescribeCluster: use Metadata
        if r is not None:
            if r.error_code:
                raise E.for_code(r.error_code, r.error_message)
            return ClusterDescription(r.cluster_id, r.controller_id,
                                      [BrokerMetadata(b.broker_id, b.host, b.port, b.rack) for b in r.brokers])
        self.client.await_metadata(self._left(deadline))
        c = self.metadata.cluster
        return ClusterDescription(c.cluster_id, c.controller_id, list(c.brokers.values()))

    # -- configs ------------------------------------------------------------------------
    def _resource_node(self, res: ConfigResource, deadline) -> int:
        if res.type == RESOURCE_BROKER and res.name:
            return int(res.name)
        return self._any_node(deadline)

    def describe_configs(self, resources, timeout: float | None = None, raise_on_error: bool = True,
                         include_synonyms: bool = False) -> dict:
        """{ConfigResource: {name: ConfigEntry} or KafkaError}."""
        deadline = self._deadline(timeout)
        self._ensure_metadata(deadline)
        results = {}
        for res in resources:
            res = ConfigResource(*res)
            r = self.client.request(self._resource_node(res, deadline), ApiKey.DESCRIBE_CONFIGS,
                                    dc.DescribeConfigsRequest(resources=[dc.DescribeConfigsResource(
                                        resource_type=res.type, resource_name=res.name, configuration_keys=None)],
                                        include_synonyms=include_synonyms),
                                    self._left(deadline))
            for rr in r.results:
                if rr.error_code:
                    results[res] = E.for_code(rr.error_code, rr.error_message)
                else:
                    results[res] = {c.name: ConfigEntry(c.name, c.value, c.read_only,
                                                        getattr(c, "is_default", False),
                                                        getattr(c, "config_source", -1), c.is_sensitive,
                                                        tuple((y.name, y.value, y.source)
                                                              for y in (getattr(c, "synonyms", None) or ())))
                                    for c in rr.configs}
        return _check(results, raise_on_error)

    def incremental_alter_configs(self, changes: dict, timeout: float | None = None,
                                  validate_only: bool = False, raise_on_error: bool = True) -> dict:
        """changes: {ConfigResource: [(name, op, value)]} with op SET/DELETE/APPEND/SUBTRACT.
        Returns {ConfigResource: None or KafkaError}."""
        deadline = self._deadline(timeout)
        self._ensure_metadata(deadline)
        results = {}
        for res, ops in changes.items():
            res = ConfigResource(*res)
            r = self.client.request(self._resource_node(res, deadline), ApiKey.INCREMENTAL_ALTER_CONFIGS,
                                    iac.IncrementalAlterConfigsRequest(resources=[iac.AlterConfigsResource(
                                        resource_type=res.type, resource_name=res.name,
                                        configs=[iac.AlterableConfig(name=n, config_operation=op,
                                                                     value=None if v is None else str(v))
                                                 for n, op, v in ops])], validate_only=validate_only),
                                    self._left(deadline))
            for rr in r.responses:
                results[res] = E.for_code(rr.error_code, rr.error_message) if rr.error_code else None
        return _check(results, raise_on_error)

    # -- offsets ------------------------------------------------------------------------
    def list_offsets(self, specs: dict, timeout: float | None = None, raise_on_error: bool = True) -> dict:
        """specs: {TopicPartition: EARLIEST | LATEST | MAX_TIMESTAMP | timestamp_ms}.
        Returns {tp: ListOffsetsResult or KafkaError}."""
        deadline = self._deadline(timeout)
        self.client.await_metadata(self._left(deadline))
        by_node: dict[int, dict] = {}
        results = {}
        for tp, ts in specs.items():
            tp = TopicPartition(*tp)
            leader = self.metadata.cluster.leader_for(tp)
            if leader < 0:
                results[tp] = E.for_code(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic}-{tp.partition}")
                continue
            by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(
                ListOffsetsPartition(partition_index=tp.partition, current_leader_epoch=-1, timestamp=ts))
        for node, topics in by_node.items():
            r = self.client.request(node, ApiKey.LIST_OFFSETS, ListOffsetsRequest(
                replica_id=-1, isolation_level=0,
                topics=[ListOffsetsTopic(name=t, partitions=p) for t, p in topics.items()]), self._left(deadline))
            for t in r.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p.partition_index)
                    results[tp] = (E.for_code(p.error_code) if p.error_code else
                                   ListOffsetsResult(p.offset, p.timestamp, p.leader_epoch))
        return _check(results, raise_on_error)

    # -- groups -------------------------------------------------------------------------
    def _coordinator(self, group_id: str, deadline) -> int:
        while True:
            r = self._request_any(ApiKey.FIND_COORDINATOR,
                                  lambda: FindCoordinatorRequest(key=group_id, key_type=0), deadline)
            if r.error_code == 0:
                cid = (1 << 31) - 1 - r.node_id
                self.metadata.extra_nodes[cid] = BrokerMetadata(cid, r.host, r.port, None)
                return cid
            err = E.for_code(r.error_code, r.error_message)
            if not err.retriable:
                raise err
            self.client.poll(min(self.retry_backoff_s, self._left(deadline)))

    def _coordinator_node(self, cid: int) -> BrokerMetadata | None:
        """The coordinator's BrokerMetadata under its real node id (``_coordinator`` maps it
        to a separate connection id, as the Java client does)."""
        b = self.metadata.extra_nodes.get(cid)
        return None if b is None else BrokerMetadata((1 << 31) - 1 - cid, b.host, b.port, b.rack)

    def list_consumer_groups(self, timeout: float | None = None) -> list[GroupListing]:
        deadline = self._deadline(timeout)
        self.client.await_metadata(self._left(deadline))
        out = []
        for b in self.metadata.cluster.brokers.values():
            r = self.client.request(b.node_id, ApiKey.LIST_GROUPS, ListGroupsRequest(), self._left(deadline))
            if r.error_code:
                raise E.for_code(r.error_code)
            out.extend(GroupListing(g.group_id, g.protocol_type, getattr(g, "group_state", ""),
                                    getattr(g, "group_type", "") or "")
                       for g in r.groups)
        return out

    def describe_consumer_groups(self, group_ids, timeout: float | None = None,
                                 raise_on_error: bool = True) -> dict:
        deadline = self._deadline(timeout)
        results = {}
        for g in group_ids:
            node = self._coordinator(g, deadline)
            r = self.client.request(node, ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(groups=[g]),
                                    self._left(deadline))
            for d in r.groups:
                if d.error_code:
                    results[d.group_id] = E.for_code(d.error_code)
                    continue
                members = []
                for m in d.members:
                    try:
                        assignment = decode_assignment(m.member_assignment) if d.protocol_type == "consumer" else []
                    except Exception:
                        assignment = []
                    members.append(MemberDescription(m.member_id, m.group_instance_id, m.client_id,
                                                     m.client_host, assignment))
                results[d.group_id] = GroupDescription(d.group_id, d.group_state, d.protocol_type,
                                                       d.protocol_data, members, self._coordinator_node(node))
        return _check(results, raise_on_error)

    def delete_consumer_groups(self, group_ids, timeout: float | None = None,
                               raise_on_error: bool = True) -> dict:
        deadline = self._deadline(timeout)
        results = {}
        for g in group_ids:
            node = self._coordinator(g, deadline)
            r = self.client.request(node, ApiKey.DELETE_GROUPS, DeleteGroupsRequest(groups_names=[g]),
                                    self._left(deadline))
            for x in r.results:
                results[x.group_id] = E.for_code(x.error_code) if x.error_code else None
        return _check(results, raise_on_error)

    def list_consumer_group_offsets(self, group_id: str, partitions=None,
                                    timeout: float | None = None) -> dict:
        """{TopicPartition: OffsetAndMetadata} committed by the group: for ``partitions``,
        or (None) for every partition it committed."""
        from kbroker.protocol.messages.offset_fetch import OffsetFetchRequestTopic
        deadline = self._deadline(timeout)
        node = self._coordinator(group_id, deadline)
        topics = None
        if partitions is not None:
            by_topic: dict = {}
            for tp in partitions:
                by_topic.setdefault(tp[0], []).append(tp[1])
            topics = [OffsetFetchRequestTopic(name=t, partition_indexes=p) for t, p in by_topic.items()]
        r = self.client.request(node, ApiKey.OFFSET_FETCH,
                                OffsetFetchRequest(group_id=group_id, topics=topics), self._left(deadline))
        if r.error_code:
            raise E.for_code(r.error_code)
        out = {}
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    raise E.for_code(p.error_code)
                if p.committed_offset >= 0:
                    out[TopicPartition(t.name, p.partition_index)] = OffsetAndMetadata(
                        p.committed_offset, p.metadata or "", getattr(p, "committed_leader_epoch", -1))
        return out

    def alter_consumer_group_offsets(self, group_id: str, offsets: dict, timeout: float | None = None,
                                     raise_on_error: bool = True) -> dict:
        """Commit ``offsets`` ({TopicPartition: offset or OffsetAndMetadata}) for the group as an
        admin: OffsetCommit with generation -1 and no member id, which the coordinator accepts
        only while the group has no members (else UNKNOWN_MEMBER_ID). {tp: None or KafkaError}."""
        from kbroker.protocol.messages.offset_commit import (
            OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
        )
        deadline = self._deadline(timeout)
        by_topic: dict = {}
        for tp, o in offsets.items():
            tp = TopicPartition(*tp)
            om = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(int(o), "", -1)
            by_topic.setdefault(tp.topic, []).append(OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=om.offset,
                committed_leader_epoch=getattr(om, "leader_epoch", -1), committed_metadata=om.metadata or ""))
        node = self._coordinator(group_id, deadline)
        r = self.client.request(node, ApiKey.OFFSET_COMMIT, OffsetCommitRequest(
            group_id=group_id, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=[OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()]),
            self._left(deadline))
        results = {TopicPartition(t.name, p.partition_index): E.for_code(p.error_code) if p.error_code else None
                   for t in r.topics for p in t.partitions}
        return _check(results, raise_on_error)

    def delete_consumer_group_offsets(self, group_id: str, partitions, timeout: float | None = None
                                      ) -> tuple:
        """OffsetDelete (KIP-496): (group error or None, {TopicPartition: None or KafkaError}).
        The coordinator refuses partitions of topics the group still consumes."""
        from kbroker.protocol.messages.offset_delete import (
            OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
        )
        deadline = self._deadline(timeout)
        by_topic: dict = {}
        for tp in partitions:
            by_topic.setdefault(tp[0], []).append(OffsetDeleteRequestPartition(partition_index=tp[1]))
        node = self._coordinator(group_id, deadline)
        r = self.client.request(node, ApiKey.OFFSET_DELETE, OffsetDeleteRequest(
            group_id=group_id, topics=[OffsetDeleteRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()]),
            self._left(deadline))
        if r.error_code:
            return E.for_code(r.error_code), {}
        return None, {TopicPartition(t.name, p.partition_index): E.for_code(p.error_code) if p.error_code else None
                      for t in r.topics for p in t.partitions}

    def describe_log_dirs(self, brokers=None, timeout: float | None = None) -> dict:
        """{broker id: {log dir path: LogDirDescription}} for ``brokers`` (None: every broker)."""
        from kbroker.protocol.messages.describe_log_dirs import DescribeLogDirsRequest
        deadline = self._deadline(timeout)
        self.client.await_metadata(self._left(deadline))
        ids = sorted(self.metadata.cluster.brokers) if brokers is None else list(brokers)
        out = {}
        for b in ids:
            r = self.client.request(b, ApiKey.DESCRIBE_LOG_DIRS, DescribeLogDirsRequest(topics=None),
                                    self._left(deadline))
            if getattr(r, "error_code", 0):
                raise E.for_code(r.error_code)
            dirs = {}
            for d in r.results:
                replicas = {TopicPartition(t.name, p.partition_index): ReplicaInfo(p.partition_size, p.offset_lag,
                                                                                   p.is_future_key)
                            for t in d.topics for p in t.partitions}
                dirs[d.log_dir] = LogDirDescription(E.for_code(d.error_code) if d.error_code else None, replicas,
                                                    getattr(d, "total_bytes", -1), getattr(d, "usable_bytes", -1))
            out[b] = dirs
        return out

    # -- SCRAM credentials (KIP-554) ----------------------------------------------------
    def alter_user_scram_credentials(self, upsertions=(), deletions=(), timeout: float | None = None,
                                     raise_on_error: bool = True) -> dict:
        """``upsertions``: (user, mechanism name, iterations, password); ``deletions``: (user,
        mechanism name). The salt and salted password are made here, as Kafka's Admin does; the
        password never leaves this process. Returns {user: None or KafkaError}."""
        import os

        from kbroker.protocol.messages import alter_user_scram_credentials as auc
        from kbroker.security import scram
        deadline = self._deadline(timeout)
        ups = []
        for user, mech, iterations, password in upsertions:
            salt = os.urandom(32)
            ups.append(auc.ScramCredentialUpsertion(
                name=user, mechanism=scram.MECHANISMS[mech][1], iterations=iterations, salt=salt,
                salted_password=scram.salted_password(mech, password, salt, iterations)))
        dels = [auc.ScramCredentialDeletion(name=user, mechanism=scram.MECHANISMS[mech][1])
                for user, mech in deletions]
        req = auc.AlterUserScramCredentialsRequest(deletions=dels, upsertions=ups)
        r = self._to_controller(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, lambda: req, deadline)
        return _check({x.user: E.for_code(x.error_code, x.error_message or None) if x.error_code else None
                       for x in r.results}, raise_on_error)

    def alter_client_quotas(self, alterations, validate_only: bool = False, timeout: float | None = None,
                            raise_on_error: bool = True) -> dict:
        """``alterations``: [(entity, {quota key: value, or None to remove})], an entity being
        ((entity type, name or None for the default), ...). Returns {entity: None or KafkaError}."""
        from kbroker.protocol.messages import alter_client_quotas as acq
        deadline = self._deadline(timeout)
        req = acq.AlterClientQuotasRequest(validate_only=validate_only, entries=[
            acq.AlterClientQuotasRequestEntryData(
                entity=[acq.AlterClientQuotasRequestEntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[acq.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None)
                     for k, v in ops.items()])
            for entity, ops in alterations])
        r = self._to_controller(ApiKey.ALTER_CLIENT_QUOTAS, lambda: req, deadline)
        return _check({tuple((e.entity_type, e.entity_name) for e in x.entity):
                       E.for_code(x.error_code, x.error_message or None) if x.error_code else None
                       for x in r.entries}, raise_on_error)

    def describe_client_quotas(self, components=(), strict: bool = False,
                               timeout: float | None = None) -> dict:
        """``components``: [(entity type, match type 0 exact / 1 default / 2 specified, match)].
        Returns {entity ((type, name or None), ...): {quota key: value}}."""
        from kbroker.protocol.messages import describe_client_quotas as dcq
        deadline = self._deadline(timeout)
        req = dcq.DescribeClientQuotasRequest(strict=strict, components=[
            dcq.ComponentData(entity_type=t, match_type=m, match=x) for t, m, x in components])
        r = self._request_any(ApiKey.DESCRIBE_CLIENT_QUOTAS, lambda: req, deadline)
        if r.error_code:
            raise E.for_code(r.error_code, r.error_message or None)
        return {tuple((e.entity_type, e.entity_name) for e in x.entity): {v.key: v.value for v in x.values}
                for x in r.entries or ()}

    # -- features (ApiVersions / UpdateFeatures) --------------------------------------------------
    def describe_features(self, timeout: float | None = None) -> FeatureMetadata:
        """Kafka's Admin.describeFeatures: the supported ranges and finalized levels a broker's
        ApiVersions (v3+) reports."""
        from kbroker import __version__
        from kbroker.protocol.messages.api_versions import ApiVersionsRequest
        deadline = self._deadline(timeout)
        r = self._request_any(ApiKey.API_VERSIONS, lambda: ApiVersionsRequest(
            client_software_name="kbroker", client_software_version=__version__), deadline)
        if r.error_code:
            raise E.for_code(r.error_code)
        return FeatureMetadata({f.name: f.max_version_level for f in r.finalized_features or ()},
                               {f.name: (f.min_version, f.max_version) for f in r.supported_features or ()},
                               r.finalized_features_epoch)

    def update_features(self, updates: dict, validate_only: bool = False, timeout: float | None = None,
                        raise_on_error: bool = True) -> dict:
        """Kafka's Admin.updateFeatures. ``updates``: {feature: (new level, upgrade type: 1
        upgrade, 2 safe downgrade, 3 unsafe downgrade)}; level 0 disables a feature. Returns
        {feature: None or KafkaError}; the controller applies all or none of them."""
        from kbroker.protocol.messages import update_features as uf
        deadline = self._deadline(timeout)
        req = uf.UpdateFeaturesRequest(
            timeout_ms=int(1000 * max(0.0, deadline - time.monotonic())), validate_only=validate_only,
            feature_updates=[uf.FeatureUpdateKey(feature=n, max_version_level=level, upgrade_type=kind)
                             for n, (level, kind) in updates.items()])      # (v1: UpgradeType)
        r = self._to_controller(ApiKey.UPDATE_FEATURES, lambda: req, deadline)
        if r.error_code:
            err = E.for_code(r.error_code, r.error_message or None)
            return _check({n: err for n in updates}, raise_on_error)
        got = {x.feature: E.for_code(x.error_code, x.error_message or None) if x.error_code else None
               for x in r.results or ()}
        return _check({n: got.get(n) for n in updates}, raise_on_error)

    # -- ACLs (CreateAcls / DescribeAcls / DeleteAcls) -------------------------------------------
    def create_acls(self, acls, timeout: float | None = None) -> list:
        """One KafkaError or None per ``kbroker.security.authorizer.StandardAcl``."""
        from kbroker.protocol.messages import create_acls as ca
        deadline = self._deadline(timeout)
        req = ca.CreateAclsRequest(creations=[ca.AclCreation(
            resource_type=a.resource_type, resource_name=a.resource_name, resource_pattern_type=a.pattern_type,
            principal=a.principal, host=a.host, operation=a.operation, permission_type=a.permission_type)
            for a in acls])
        r = self._request_any(ApiKey.CREATE_ACLS, lambda: req, deadline)
        return [E.for_code(x.error_code, x.error_message or None) if x.error_code else None for x in r.results]

    def describe_acls(self, acl_filter, timeout: float | None = None) -> list:
        """The StandardAcls matching a ``kbroker.security.authorizer.AclFilter``; raises the error."""
        from kbroker.protocol.messages import describe_acls as da
        from kbroker.security.authorizer import StandardAcl
        deadline = self._deadline(timeout)
        f = acl_filter
        req = da.DescribeAclsRequest(resource_type_filter=f.resource_type, resource_name_filter=f.resource_name,
                                     pattern_type_filter=f.pattern_type, principal_filter=f.principal,
                                     host_filter=f.host, operation=f.operation, permission_type=f.permission_type)
        r = self._request_any(ApiKey.DESCRIBE_ACLS, lambda: req, deadline)
        if r.error_code:
            raise E.for_code(r.error_code, r.error_message or None)
        return [StandardAcl(res.resource_type, res.resource_name, res.pattern_type, a.principal, a.host,
                            a.operation, a.permission_type) for res in r.resources for a in res.acls]

    def delete_acls(self, filters, timeout: float | None = None) -> list:
        """Per AclFilter: the StandardAcls it removed, or a KafkaError."""
        from kbroker.protocol.messages import delete_acls as da
        from kbroker.security.authorizer import StandardAcl
        deadline = self._deadline(timeout)
        req = da.DeleteAclsRequest(filters=[da.DeleteAclsFilter(
            resource_type_filter=f.resource_type, resource_name_filter=f.resource_name,
            pattern_type_filter=f.pattern_type, principal_filter=f.principal, host_filter=f.host,
            operation=f.operation, permission_type=f.permission_type) for f in filters])
        r = self._request_any(ApiKey.DELETE_ACLS, lambda: req, deadline)
        return [E.for_code(x.error_code, x.error_message or None) if x.error_code else
                [StandardAcl(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host, m.operation,
                             m.permission_type) for m in x.matching_acls] for x in r.filter_results]

    def describe_user_scram_credentials(self, users=None, timeout: float | None = None,
                                        raise_on_error: bool = True) -> dict:
        """{user: {mechanism name: iterations} or KafkaError} (None: every user with credentials)."""
        from kbroker.protocol.messages import describe_user_scram_credentials as duc
        from kbroker.security import scram
        deadline = self._deadline(timeout)
        req = duc.DescribeUserScramCredentialsRequest(
            users=None if users is None else [duc.UserName(name=u) for u in users])
        r = self._request_any(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, lambda: req, deadline)
        if r.error_code:
            raise E.for_code(r.error_code, r.error_message or None)
        out = {}
        for x in r.results:
            out[x.user] = (E.for_code(x.error_code, x.error_message or None) if x.error_code else
                           {scram.MECHANISM_BY_TYPE.get(c.mechanism, str(c.mechanism)): c.iterations
                            for c in x.credential_infos})
        if raise_on_error:
            for v in out.values():
                if isinstance(v, E.KafkaError):
                    raise v
        return out

    def close(self) -> None:
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
