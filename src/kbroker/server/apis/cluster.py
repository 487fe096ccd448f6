"""DescribeCluster and DescribeLogDirs.

Kafka: ``AuthHelper.computeDescribeClusterResponse`` (endpoint types: a broker
answers only for BROKER endpoints) and ``ReplicaManager.describeLogDirs``
(every log dir, the size of each hosted partition's log, offset_lag 0 for a
current — not "future" — replica, the volume's total/usable bytes from v4).
"""
from __future__ import annotations

import os

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.describe_cluster import DescribeClusterBroker, DescribeClusterResponse
from kbroker.protocol.messages.describe_log_dirs import (
    DescribeLogDirsPartition, DescribeLogDirsResponse, DescribeLogDirsResult, DescribeLogDirsTopic,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.apis.metadata import CLUSTER_OPERATIONS, CLUSTER_OPS, NOT_REQUESTED
from kbroker.server.authz import CLUSTER, CLUSTER_NAME, DESCRIBE, allowed, authz

#: DescribeClusterRequest.endpoint_type
ENDPOINT_BROKER, ENDPOINT_CONTROLLER = 1, 2


def handle_describe_cluster(broker, ctx, req) -> None:
    v = ctx.api_version
    endpoint_type = req.endpoint_type if v >= 1 else ENDPOINT_BROKER
    resp = DescribeClusterResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                                   cluster_id=broker.cluster_id or "", controller_id=-1, brokers=[])
    if endpoint_type not in (ENDPOINT_BROKER, ENDPOINT_CONTROLLER):
        resp.error_code = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        resp.error_message = f"Unsupported endpoint type {endpoint_type}"
    elif endpoint_type != ENDPOINT_BROKER:
        # the controller quorum has its own listener (controller.listener.names); this is a broker one
        resp.error_code = ErrorCode.MISMATCHED_ENDPOINT_TYPE
        resp.error_message = "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER"
    else:
        view = broker.metadata_cache
        alive = view.alive_brokers(getattr(ctx.request, "listener_name", None))
        resp.brokers = [DescribeClusterBroker(broker_id=i, host=host, port=port, rack=rack)
                        for i, host, port, rack in alive]
        # Kafka's brokers name a random live broker as "controller" (clients cannot reach the
        # KRaft quorum); on one node that is this node, which is also the controller
        resp.controller_id = view.controller_id(alive)
        if req.include_cluster_authorized_operations:
            auth = authz(broker, ctx)
            resp.cluster_authorized_operations = (CLUSTER_OPERATIONS if auth is None else
                                                  auth.operations(CLUSTER, CLUSTER_NAME, CLUSTER_OPS))
        else:
            resp.cluster_authorized_operations = NOT_REQUESTED
    if v >= 1:
        resp.endpoint_type = ENDPOINT_BROKER
    ctx.respond(resp)


def _volume_bytes(path: str) -> tuple[int, int]:
    """(total_bytes, usable_bytes) of the filesystem holding ``path`` (Java's FileStore)."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def describe_log_dirs(broker, wanted: dict[str, set[int]] | None, v: int) -> list[DescribeLogDirsResult]:
    """One result per log dir; ``wanted`` maps topic -> partitions (None: everything)."""
    by_dir: dict[str, dict[str, list]] = {d: {} for d in broker.log_manager.log_dirs}
    for lg in broker.log_manager.all_logs():
        if broker.replica_manager.get_partition((lg.topic, lg.partition)) is None:
            continue  # not hosted (a log left over on disk, or a topic being deleted)
        if wanted is not None and lg.partition not in wanted.get(lg.topic, ()):
            continue
        parent = os.path.dirname(lg.dir)
        if parent not in by_dir:
            continue
        by_dir[parent].setdefault(lg.topic, []).append(DescribeLogDirsPartition(
            partition_index=lg.partition, partition_size=lg.size_in_bytes, offset_lag=0, is_future_key=False))
    results = []
    for d, topics in by_dir.items():
        r = DescribeLogDirsResult(error_code=ErrorCode.NONE, log_dir=d, topics=[
            DescribeLogDirsTopic(name=t, partitions=sorted(ps, key=lambda p: p.partition_index))
            for t, ps in sorted(topics.items())])
        try:
            total, usable = _volume_bytes(d)
        except OSError:
            r.error_code, r.topics = ErrorCode.KAFKA_STORAGE_ERROR, []
            total = usable = -1
        if v >= 4:
            r.total_bytes, r.usable_bytes = total, usable
        results.append(r)
    return results


def handle_describe_log_dirs(broker, ctx, req) -> None:
    wanted = None
    if req.topics is not None:
        wanted = {}
        for t in req.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):       # KafkaApis: DESCRIBE on the cluster
        resp = DescribeLogDirsResponse(throttle_time_ms=0, results=[])
        if ctx.api_version >= 3:
            resp.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        ctx.respond(resp)
        return
    resp = DescribeLogDirsResponse(throttle_time_ms=0, results=describe_log_dirs(broker, wanted, ctx.api_version))
    if ctx.api_version >= 3:
        resp.error_code = ErrorCode.NONE
    ctx.respond(resp)


HANDLERS = {
    ApiKey.DESCRIBE_CLUSTER: ApiHandler(0, 1, handle_describe_cluster),
    ApiKey.DESCRIBE_LOG_DIRS: ApiHandler(0, 4, handle_describe_log_dirs),
}
