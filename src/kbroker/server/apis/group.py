"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups, OffsetDelete, and
KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Kafka: the group parts of ``core/.../server/KafkaApis.scala`` (request → coordinator
call → response, per-version field rules). The logic is in
:class:`kbroker.coordinator.group.GroupCoordinator`; these functions translate.

What the handlers need from ``broker``:

* ``broker.group_coordinator``: the :class:`GroupCoordinator` (started).
* ``broker.endpoint(listener_name)``: ``(host, port)`` of this node on the listener the
  request came in on (FindCoordinator's answer when this node coordinates the key); otherwise
  ``broker.metadata_cache`` names the leader of the group's ``__consumer_offsets``
  partition (a KRaft broker, which asks ``broker.topic_manager.create_offsets_topic()``
  when that topic does not exist yet).
* ``broker.metadata.image.topics``: ``name → TopicImage`` with ``num_partitions``
  (OffsetCommit / OffsetDelete answer UNKNOWN_TOPIC_OR_PARTITION for partitions
  that do not exist, as KafkaApis does against its metadata cache), and
  ``broker.metadata.image.topics_by_id`` (ConsumerGroupDescribe names topic ids).

Asynchronous answers (JoinGroup, SyncGroup, OffsetCommit, DeleteGroups,
OffsetDelete) come from the coordinator's callbacks, possibly on a timer or
another handler thread; ``ctx.respond`` is thread-safe and answers once.
"""
from __future__ import annotations

from kbroker.coordinator.group.consumer_group import HeartbeatRequest
from kbroker.coordinator.group.coordinator import JoinGroupResult, SyncGroupResult
from kbroker.coordinator.group.offsets import OffsetAndMetadata
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import consumer_group_describe as cgd
from kbroker.protocol.messages.consumer_group_heartbeat import (
    Assignment as HeartbeatAssignment, ConsumerGroupHeartbeatResponse, ConsumerGroupHeartbeatResponseTopicPartitions,
)
from kbroker.protocol.messages.delete_groups import DeletableGroupResult, DeleteGroupsResponse
from kbroker.protocol.messages.describe_groups import DescribedGroup, DescribedGroupMember, DescribeGroupsResponse
from kbroker.protocol.messages.find_coordinator import Coordinator, FindCoordinatorResponse
from kbroker.protocol.messages.heartbeat import HeartbeatResponse
from kbroker.protocol.messages.join_group import JoinGroupResponse, JoinGroupResponseMember
from kbroker.protocol.messages.leave_group import LeaveGroupResponse, MemberResponse
from kbroker.protocol.messages.list_groups import ListedGroup, ListGroupsResponse
from kbroker.protocol.messages.offset_commit import (
    OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
)
from kbroker.protocol.messages.offset_delete import (
    OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
)
from kbroker.protocol.messages.offset_fetch import (
    OffsetFetchResponse, OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
)
from kbroker.protocol.messages.sync_group import SyncGroupResponse
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import CLUSTER, DELETE, DESCRIBE, GROUP, READ, TOPIC, TRANSACTIONAL_ID, allowed, authz

E = ErrorCode
OFFSETS_TOPIC = "__consumer_offsets"

COORDINATOR_TYPE_GROUP = 0
COORDINATOR_TYPE_TRANSACTION = 1
TRANSACTION_STATE_TOPIC = "__transaction_state"
#: DescribeGroups v3+: operations allowed on a group without an authorizer: READ 3, DELETE 6, DESCRIBE 8
GROUP_OPS = (3, 6, 8)
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)
NOT_REQUESTED = -(2 ** 31)


def _message(err: ErrorCode) -> str:
    return err.message or err.name  # Kafka's Errors.message(): "NONE" for NONE


def _partition_exists(broker, topic: str, partition: int) -> bool:
    t = broker.metadata.image.topics.get(topic)
    return t is not None and 0 <= partition < t.num_partitions


# -- FindCoordinator ------------------------------------------------------------------------

def _find(broker, key: str, key_type: int, ctx) -> tuple[ErrorCode, int, str, int]:
    coordinator = broker.group_coordinator
    if key_type == COORDINATOR_TYPE_TRANSACTION:
        coordinator = getattr(broker, "transaction_coordinator", None)
        if coordinator is None:
            # A broker without a transaction coordinator. A retriable COORDINATOR_NOT_AVAILABLE
            # would make transactional clients retry until their timeout (aiokafka's start()
            # never returns); this fatal code makes them fail at once with a clear error.
            return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, "", -1
    if coordinator.is_serving(key):
        host, port = broker.endpoint(getattr(ctx.request, "listener_name", None))
        return E.NONE, broker.node_id, host, port
    if coordinator.is_active:
        # the leader of the key's __consumer_offsets / __transaction_state partition
        # coordinates it (KRaft: another broker)
        view = broker.metadata_cache
        txn = key_type == COORDINATOR_TYPE_TRANSACTION
        leader = view.leader_of(TRANSACTION_STATE_TOPIC if txn else OFFSETS_TOPIC, coordinator.partition_for(key))
        if leader is None:
            create = getattr(broker.topic_manager,
                             "create_transaction_state_topic" if txn else "create_offsets_topic", None)
            if create is not None:
                create()   # through the controller; clients retry COORDINATOR_NOT_AVAILABLE
        elif leader[0] >= 0 and leader[0] != broker.node_id:
            ep = view.endpoint(leader[0], getattr(ctx.request, "listener_name", None))
            if ep is not None:
                return E.NONE, leader[0], ep[0], ep[1]
    return E.COORDINATOR_NOT_AVAILABLE, -1, "", -1


def _find_authorized(broker, key: str, key_type: int, ctx) -> tuple[ErrorCode, int, str, int]:
    """KafkaApis: DESCRIBE on the group, or on the transactional id, before looking it up."""
    if key_type == COORDINATOR_TYPE_GROUP and not allowed(broker, ctx, DESCRIBE, GROUP, key):
        return E.GROUP_AUTHORIZATION_FAILED, -1, "", -1
    if key_type == COORDINATOR_TYPE_TRANSACTION and not allowed(broker, ctx, DESCRIBE, TRANSACTIONAL_ID, key):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, "", -1
    return _find(broker, key, key_type, ctx)


def handle_find_coordinator(broker, ctx, req) -> None:
    v = ctx.api_version
    key_type = req.key_type if v >= 1 else COORDINATOR_TYPE_GROUP
    invalid = key_type not in (COORDINATOR_TYPE_GROUP, COORDINATOR_TYPE_TRANSACTION)
    if v < 4:
        err, node_id, host, port = (E.INVALID_REQUEST, -1, "", -1) if invalid else _find_authorized(broker, req.key, key_type, ctx)
        ctx.respond(FindCoordinatorResponse(error_code=err, error_message=_message(err), node_id=node_id,
                                            host=host, port=port))
        return
    coordinators = []
    for key in req.coordinator_keys:
        err, node_id, host, port = (E.INVALID_REQUEST, -1, "", -1) if invalid else _find_authorized(broker, key, key_type, ctx)
        coordinators.append(Coordinator(key=key, node_id=node_id, host=host, port=port, error_code=err,
                                        error_message=_message(err)))
    ctx.respond(FindCoordinatorResponse(coordinators=coordinators))


# -- JoinGroup / SyncGroup / Heartbeat / LeaveGroup ------------------------------------------

def handle_join_group(broker, ctx, req) -> None:
    v = ctx.api_version
    instance_id = req.group_instance_id if v >= 5 else None

    def respond(r: JoinGroupResult) -> None:
        name = r.protocol_name
        if v < 7 and name is None:
            name = ""
        elif v >= 7 and name == "":
            name = None
        ctx.respond(JoinGroupResponse(
            error_code=r.error, generation_id=r.generation_id, protocol_type=r.protocol_type,
            protocol_name=name, leader=r.leader_id, skip_assignment=r.skip_assignment and v >= 9,
            member_id=r.member_id,
            members=[JoinGroupResponseMember(member_id=mid, group_instance_id=iid if v >= 5 else None,
                                             metadata=md) for mid, iid, md in r.members]))

    if not allowed(broker, ctx, READ, GROUP, req.group_id):
        respond(JoinGroupResult.failed("", E.GROUP_AUTHORIZATION_FAILED))
        return
    broker.group_coordinator.join_group(
        req.group_id, req.member_id, instance_id,
        require_known_member_id=v >= 4 and instance_id is None, supports_skip_assignment=v >= 9,
        client_id=ctx.client_id or "", client_host="/" + ctx.client_host,
        rebalance_timeout_ms=req.rebalance_timeout_ms if v >= 1 else req.session_timeout_ms,
        session_timeout_ms=req.session_timeout_ms, protocol_type=req.protocol_type,
        protocols=[(p.name, p.metadata) for p in req.protocols], callback=respond,
        reason=req.reason if v >= 8 else None)


def handle_sync_group(broker, ctx, req) -> None:
    v = ctx.api_version

    def respond(r: SyncGroupResult) -> None:
        ctx.respond(SyncGroupResponse(error_code=r.error, protocol_type=r.protocol_type if v >= 5 else None,
                                      protocol_name=r.protocol_name if v >= 5 else None, assignment=r.assignment))

    if not allowed(broker, ctx, READ, GROUP, req.group_id):
        ctx.respond(SyncGroupResponse(error_code=E.GROUP_AUTHORIZATION_FAILED, assignment=b""))
        return
    broker.group_coordinator.sync_group(
        req.group_id, req.generation_id, req.member_id, req.group_instance_id if v >= 3 else None,
        req.protocol_type if v >= 5 else None, req.protocol_name if v >= 5 else None,
        {a.member_id: bytes(a.assignment) for a in req.assignments}, respond)


def handle_heartbeat(broker, ctx, req) -> None:
    v = ctx.api_version
    if not allowed(broker, ctx, READ, GROUP, req.group_id):
        ctx.respond(HeartbeatResponse(error_code=E.GROUP_AUTHORIZATION_FAILED))
        return
    err = broker.group_coordinator.heartbeat(req.group_id, req.member_id,
                                             req.group_instance_id if v >= 3 else None, req.generation_id)
    ctx.respond(HeartbeatResponse(error_code=err))


def handle_leave_group(broker, ctx, req) -> None:
    v = ctx.api_version
    if v < 3:
        members = [(req.member_id, None)]
    else:
        members = [(m.member_id, m.group_instance_id) for m in req.members]
    if not allowed(broker, ctx, READ, GROUP, req.group_id):
        ctx.respond(LeaveGroupResponse(error_code=E.GROUP_AUTHORIZATION_FAILED, members=[]))
        return
    err, results = broker.group_coordinator.leave_group(req.group_id, members)
    if v < 3:
        if err == E.NONE and results:
            err = results[0][2]
        ctx.respond(LeaveGroupResponse(error_code=err))
        return
    ctx.respond(LeaveGroupResponse(error_code=err, members=[
        MemberResponse(member_id=mid, group_instance_id=iid, error_code=e) for mid, iid, e in results]))


# -- OffsetCommit / OffsetFetch / OffsetDelete --------------------------------------------------

def handle_offset_commit(broker, ctx, req) -> None:
    v = ctx.api_version
    coordinator = broker.group_coordinator
    now = coordinator.now_ms()
    retention = req.retention_time_ms if 2 <= v <= 4 else -1
    expire = now + retention if retention >= 0 else -1
    order: list[tuple[str, list[int]]] = []
    errors: dict[tuple, ErrorCode] = {}
    offsets: dict[tuple, OffsetAndMetadata] = {}
    auth = authz(broker, ctx)
    group_denied = auth is not None and not auth.allowed(READ, GROUP, req.group_id)
    for t in req.topics:
        order.append((t.name, [p.partition_index for p in t.partitions]))
        topic_denied = auth is not None and not auth.allowed(READ, TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if group_denied:      # KafkaApis: READ on the group, then READ on each topic
                errors[tp] = E.GROUP_AUTHORIZATION_FAILED
                continue
            if topic_denied:
                errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
                continue
            if not _partition_exists(broker, t.name, p.partition_index):
                errors[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
                continue
            ts = p.commit_timestamp if v == 1 and p.commit_timestamp != -1 else now
            offsets[tp] = OffsetAndMetadata(
                p.committed_offset, p.committed_leader_epoch if v >= 6 else -1,
                p.committed_metadata if p.committed_metadata is not None else "", ts, expire)

    def respond(result: dict[tuple, ErrorCode]) -> None:
        errors.update(result)
        ctx.respond(OffsetCommitResponse(topics=[
            OffsetCommitResponseTopic(name=name, partitions=[
                OffsetCommitResponsePartition(partition_index=i, error_code=errors.get((name, i), E.NONE))
                for i in parts])
            for name, parts in order]))

    if not offsets:
        respond({})
        return
    coordinator.commit_offsets(
        req.group_id, req.member_id if v >= 1 else "", req.group_instance_id if v >= 7 else None,
        req.generation_id_or_member_epoch if v >= 1 else -1, offsets, respond, api_version=v)


def _fetch_group(coordinator, group_id: str, topics, require_stable: bool, auth=None):
    """(error, [(topic, [(partition, OffsetFetchPartition)])]) for one group; topics None = all.
    ``auth`` (KafkaApis): DESCRIBE on the group, else GROUP_AUTHORIZATION_FAILED; DESCRIBE on
    each topic, else its partitions answer TOPIC_AUTHORIZATION_FAILED (all topics: left out)."""
    if auth is not None and not auth.allowed(DESCRIBE, GROUP, group_id):
        return E.GROUP_AUTHORIZATION_FAILED, [(t.name, [(p, None) for p in t.partition_indexes])
                                              for t in topics or ()]
    if topics is None:
        err, result = coordinator.fetch_offsets(group_id, None, require_stable)
        by_topic: dict[str, list] = {}
        for (t, p), r in sorted(result.items()):
            if auth is None or auth.allowed(DESCRIBE, TOPIC, t):
                by_topic.setdefault(t, []).append((p, r))
        return err, list(by_topic.items())
    denied = set() if auth is None else {t.name for t in topics if not auth.allowed(DESCRIBE, TOPIC, t.name)}
    tps = [(t.name, p) for t in topics if t.name not in denied for p in t.partition_indexes]
    err, result = coordinator.fetch_offsets(group_id, tps, require_stable)
    if err != E.NONE:
        return err, [(t.name, [(p, None) for p in t.partition_indexes]) for t in topics]
    if denied:
        from kbroker.coordinator.group.coordinator import OffsetFetchPartition
        no = OffsetFetchPartition(-1, -1, "", E.TOPIC_AUTHORIZATION_FAILED)
        return err, [(t.name, [(p, no if t.name in denied else result[(t.name, p)]) for p in t.partition_indexes])
                     for t in topics]
    return err, [(t.name, [(p, result[(t.name, p)]) for p in t.partition_indexes]) for t in topics]


def handle_offset_fetch(broker, ctx, req) -> None:
    v = ctx.api_version
    coordinator = broker.group_coordinator
    require_stable = req.require_stable if v >= 7 else False
    auth = authz(broker, ctx)
    if v >= 8:
        groups = []
        for g in req.groups:
            err, topics = _fetch_group(coordinator, g.group_id, g.topics, require_stable, auth)
            groups.append(OffsetFetchResponseGroup(
                group_id=g.group_id, error_code=err,
                topics=[] if err != E.NONE else [
                    OffsetFetchResponseTopics(name=name, partitions=[
                        OffsetFetchResponsePartitions(
                            partition_index=p, committed_offset=r.committed_offset,
                            committed_leader_epoch=r.leader_epoch, metadata=r.metadata, error_code=r.error)
                        for p, r in parts]) for name, parts in topics]))
        ctx.respond(OffsetFetchResponse(groups=groups))
        return
    topics_req = req.topics if (v >= 2 or req.topics is not None) else []
    err, topics = _fetch_group(coordinator, req.group_id, topics_req, require_stable, auth)
    if err != E.NONE:
        if v < 2:  # no top-level error field: every requested partition carries it
            ctx.respond(OffsetFetchResponse(topics=[
                OffsetFetchResponseTopic(name=name, partitions=[
                    OffsetFetchResponsePartition(partition_index=p, committed_offset=-1, metadata="",
                                                 error_code=err) for p, _ in parts])
                for name, parts in topics]))
        else:
            ctx.respond(OffsetFetchResponse(error_code=err, topics=[]))
        return
    ctx.respond(OffsetFetchResponse(error_code=E.NONE, topics=[
        OffsetFetchResponseTopic(name=name, partitions=[
            OffsetFetchResponsePartition(partition_index=p, committed_offset=r.committed_offset,
                                         committed_leader_epoch=r.leader_epoch if v >= 5 else -1,
                                         metadata=r.metadata, error_code=r.error)
            for p, r in parts]) for name, parts in topics]))


def handle_offset_delete(broker, ctx, req) -> None:
    order: list[tuple[str, list[int]]] = []
    errors: dict[tuple, ErrorCode] = {}
    valid: list[tuple] = []
    auth = authz(broker, ctx)
    if auth is not None and not auth.allowed(DELETE, GROUP, req.group_id):
        ctx.respond(OffsetDeleteResponse(error_code=E.GROUP_AUTHORIZATION_FAILED, topics=[]))
        return
    for t in req.topics:
        order.append((t.name, [p.partition_index for p in t.partitions]))
        topic_denied = auth is not None and not auth.allowed(READ, TOPIC, t.name)
        for p in t.partitions:
            tp = (t.name, p.partition_index)
            if topic_denied:
                errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
            elif _partition_exists(broker, t.name, p.partition_index):
                valid.append(tp)
            else:
                errors[tp] = E.UNKNOWN_TOPIC_OR_PARTITION

    def respond(group_error: ErrorCode, result: dict[tuple, ErrorCode]) -> None:
        if group_error != E.NONE:
            ctx.respond(OffsetDeleteResponse(error_code=group_error, topics=[]))
            return
        errors.update(result)
        ctx.respond(OffsetDeleteResponse(error_code=E.NONE, topics=[
            OffsetDeleteResponseTopic(name=name, partitions=[
                OffsetDeleteResponsePartition(partition_index=i, error_code=errors.get((name, i), E.NONE))
                for i in parts]) for name, parts in order]))

    broker.group_coordinator.delete_offsets(req.group_id, valid, respond)


# -- DescribeGroups / ListGroups / DeleteGroups ---------------------------------------------------

def handle_describe_groups(broker, ctx, req) -> None:
    v = ctx.api_version
    include_ops = v >= 3 and req.include_authorized_operations
    auth = authz(broker, ctx)
    out = []
    for gid in req.groups:
        if auth is not None and not auth.allowed(DESCRIBE, GROUP, gid):
            out.append(DescribedGroup(error_code=E.GROUP_AUTHORIZATION_FAILED, group_id=gid, group_state="",
                                      protocol_type="", protocol_data="", members=[],
                                      authorized_operations=NOT_REQUESTED))
            continue
        err, s = broker.group_coordinator.describe_group(gid)
        out.append(DescribedGroup(
            error_code=err, group_id=gid, group_state=s.state, protocol_type=s.protocol_type,
            protocol_data=s.protocol,
            members=[DescribedGroupMember(member_id=m.member_id,
                                          group_instance_id=m.group_instance_id if v >= 4 else None,
                                          client_id=m.client_id, client_host=m.client_host,
                                          member_metadata=m.metadata, member_assignment=m.assignment)
                     for m in s.members],
            authorized_operations=NOT_REQUESTED if not include_ops or err != E.NONE else
            GROUP_OPERATIONS if auth is None else auth.operations(GROUP, gid, GROUP_OPS)))
    ctx.respond(DescribeGroupsResponse(groups=out))


def handle_list_groups(broker, ctx, req) -> None:
    v = ctx.api_version
    err, groups = broker.group_coordinator.list_groups(req.states_filter if v >= 4 else (),
                                                       req.types_filter if v >= 5 else ())
    auth = authz(broker, ctx)
    if auth is not None and not auth.cluster(DESCRIBE):      # KafkaApis: else only the groups it may DESCRIBE
        groups = [g for g in groups if auth.allowed(DESCRIBE, GROUP, g.group_id)]
    ctx.respond(ListGroupsResponse(error_code=err, groups=[
        ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type,
                    group_state=g.state if v >= 4 else "", group_type=g.group_type if v >= 5 else "")
        for g in groups]))


def handle_delete_groups(broker, ctx, req) -> None:
    names = list(req.groups_names)

    def respond(results: dict[str, ErrorCode]) -> None:
        ctx.respond(DeleteGroupsResponse(results=[
            DeletableGroupResult(group_id=g, error_code=results.get(g, E.NONE)) for g in dict.fromkeys(names)]))

    auth = authz(broker, ctx)
    denied = {} if auth is None else {g: E.GROUP_AUTHORIZATION_FAILED for g in dict.fromkeys(names)
                                      if not auth.allowed(DELETE, GROUP, g)}
    if denied:
        inner = respond

        def respond(results: dict[str, ErrorCode]) -> None:
            inner({**results, **denied})
    broker.group_coordinator.delete_groups([g for g in dict.fromkeys(names) if g not in denied], respond)


# -- KIP-848: ConsumerGroupHeartbeat / ConsumerGroupDescribe ----------------------------------------

def _consumer_protocol_disabled(broker) -> bool:
    return not broker.group_coordinator.config.consumer_protocol_enabled


def handle_consumer_group_heartbeat(broker, ctx, req) -> None:
    """KafkaApis.handleConsumerGroupHeartbeat: UNSUPPORTED_VERSION unless
    group.coordinator.rebalance.protocols has "consumer"."""
    coordinator = broker.group_coordinator
    if _consumer_protocol_disabled(broker):
        ctx.respond(ConsumerGroupHeartbeatResponse(error_code=E.UNSUPPORTED_VERSION,
                                                   error_message=_message(E.UNSUPPORTED_VERSION)))
        return
    if not allowed(broker, ctx, READ, GROUP, req.group_id):
        ctx.respond(ConsumerGroupHeartbeatResponse(error_code=E.GROUP_AUTHORIZATION_FAILED,
                                                   error_message=_message(E.GROUP_AUTHORIZATION_FAILED)))
        return
    owned = None if req.topic_partitions is None else [(tp.topic_id, list(tp.partitions))
                                                       for tp in req.topic_partitions]
    hb = HeartbeatRequest(req.group_id, req.member_id, req.member_epoch, req.instance_id, req.rack_id,
                          req.rebalance_timeout_ms,
                          None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
                          req.server_assignor, owned, ctx.client_id or "", "/" + ctx.client_host,
                          api_version=ctx.api_version,
                          subscribed_topic_regex=req.subscribed_topic_regex if ctx.api_version >= 1 else None)
    interval = coordinator.config.consumer_group_heartbeat_interval_ms

    def respond(err, message, outcome) -> None:
        if err != E.NONE or outcome is None:
            ctx.respond(ConsumerGroupHeartbeatResponse(error_code=err, error_message=message or _message(err)))
            return
        leaving = outcome.member_epoch < 0
        assignment = None
        if outcome.assignment is not None:
            assignment = HeartbeatAssignment(topic_partitions=[
                ConsumerGroupHeartbeatResponseTopicPartitions(topic_id=tid, partitions=sorted(ps))
                for tid, ps in outcome.assignment.items()])
        ctx.respond(ConsumerGroupHeartbeatResponse(
            error_code=E.NONE, member_id=outcome.member_id, member_epoch=outcome.member_epoch,
            heartbeat_interval_ms=0 if leaving else interval, assignment=assignment))

    coordinator.consumer_group_heartbeat(hb, respond)


def _described_assignment(broker, assignment) -> "cgd.Assignment":
    by_id = broker.metadata.image.topics_by_id
    parts = []
    for tid, ps in sorted(assignment.items(), key=lambda kv: str(kv[0])):
        t = by_id.get(tid)
        parts.append(cgd.TopicPartitions(topic_id=tid, topic_name=t.name if t is not None else "",
                                         partitions=sorted(ps)))
    return cgd.Assignment(topic_partitions=parts)


def handle_consumer_group_describe(broker, ctx, req) -> None:
    coordinator = broker.group_coordinator
    include_ops = req.include_authorized_operations
    out = []
    for gid in req.group_ids:
        if _consumer_protocol_disabled(broker):
            err, message, d = E.UNSUPPORTED_VERSION, None, None
        elif not allowed(broker, ctx, DESCRIBE, GROUP, gid):
            err, message, d = E.GROUP_AUTHORIZATION_FAILED, None, None
        else:
            err, message, d = coordinator.consumer_group_describe(gid)
        if err != E.NONE:
            out.append(cgd.DescribedGroup(error_code=err, error_message=message or _message(err), group_id=gid))
            continue
        members = [cgd.Member(
            member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
            client_id=m.client_id, client_host=m.client_host, subscribed_topic_names=list(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex, assignment=_described_assignment(broker, m.assigned_partitions),
            target_assignment=_described_assignment(broker, target)) for m, target in d["members"]]
        out.append(cgd.DescribedGroup(
            error_code=E.NONE, group_id=gid, group_state=d["state"], group_epoch=d["group_epoch"],
            assignment_epoch=d["assignment_epoch"], assignor_name=d["assignor_name"], members=members,
            authorized_operations=NOT_REQUESTED if not include_ops else
            GROUP_OPERATIONS if authz(broker, ctx) is None else authz(broker, ctx).operations(GROUP, gid, GROUP_OPS)))
    ctx.respond(cgd.ConsumerGroupDescribeResponse(groups=out))


HANDLERS = {
    ApiKey.FIND_COORDINATOR: ApiHandler(0, 6, handle_find_coordinator),
    ApiKey.JOIN_GROUP: ApiHandler(0, 9, handle_join_group),
    ApiKey.SYNC_GROUP: ApiHandler(0, 5, handle_sync_group),
    ApiKey.HEARTBEAT: ApiHandler(0, 4, handle_heartbeat),
    ApiKey.LEAVE_GROUP: ApiHandler(0, 5, handle_leave_group),
    ApiKey.OFFSET_COMMIT: ApiHandler(0, 9, handle_offset_commit),
    ApiKey.OFFSET_FETCH: ApiHandler(0, 9, handle_offset_fetch),
    ApiKey.DESCRIBE_GROUPS: ApiHandler(0, 5, handle_describe_groups),
    ApiKey.LIST_GROUPS: ApiHandler(0, 5, handle_list_groups),
    ApiKey.DELETE_GROUPS: ApiHandler(0, 2, handle_delete_groups),
    ApiKey.OFFSET_DELETE: ApiHandler(0, 0, handle_offset_delete),
    # v1 (Kafka 4.0): what librdkafka >= 2.10 requires; v1 members generate their own member id.
    ApiKey.CONSUMER_GROUP_HEARTBEAT: ApiHandler(0, 1, handle_consumer_group_heartbeat),
    ApiKey.CONSUMER_GROUP_DESCRIBE: ApiHandler(0, 0, handle_consumer_group_describe),
}
