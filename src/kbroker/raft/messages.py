"""Building and reading the KRaft RPCs for the single ``__cluster_metadata`` partition.

The messages are the generated codecs (KIP-595 Vote, BeginQuorumEpoch, EndQuorumEpoch,
Fetch v17 with diverging epoch and current leader). ``Inbound``/``Outbound`` carry one
message between nodes; ``correlation_id`` pairs a response with its request.
"""
from __future__ import annotations

from typing import NamedTuple
from uuid import UUID

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import add_raft_voter as arv
from kbroker.protocol.messages import begin_quorum_epoch as bqe
from kbroker.protocol.messages import describe_quorum as dq
from kbroker.protocol.messages import end_quorum_epoch as eqe
from kbroker.protocol.messages import fetch as fm
from kbroker.protocol.messages import fetch_snapshot as fs
from kbroker.protocol.messages import remove_raft_voter as rrv
from kbroker.protocol.messages import update_raft_voter as urv
from kbroker.protocol.messages import vote as vm

METADATA_TOPIC = "__cluster_metadata"
METADATA_TOPIC_ID = UUID(int=1)       # Kafka's Uuid.METADATA_TOPIC_ID (0, 1)
METADATA_PARTITION = 0

#: the versions we send (Kafka 3.9's latest)
VERSIONS = {vm.VoteRequest: 1, vm.VoteResponse: 1,
            bqe.BeginQuorumEpochRequest: 1, bqe.BeginQuorumEpochResponse: 1,
            eqe.EndQuorumEpochRequest: 1, eqe.EndQuorumEpochResponse: 1,
            fm.FetchRequest: 17, fm.FetchResponse: 17,
            dq.DescribeQuorumRequest: 1, dq.DescribeQuorumResponse: 1,
            fs.FetchSnapshotRequest: 1, fs.FetchSnapshotResponse: 1,
            arv.AddRaftVoterRequest: 0, arv.AddRaftVoterResponse: 0,
            rrv.RemoveRaftVoterRequest: 0, rrv.RemoveRaftVoterResponse: 0,
            urv.UpdateRaftVoterRequest: 0, urv.UpdateRaftVoterResponse: 0}

REQUEST_TYPES = (vm.VoteRequest, bqe.BeginQuorumEpochRequest, eqe.EndQuorumEpochRequest, fm.FetchRequest,
                 dq.DescribeQuorumRequest, fs.FetchSnapshotRequest, arv.AddRaftVoterRequest,
                 rrv.RemoveRaftVoterRequest, urv.UpdateRaftVoterRequest)
RESPONSE_OF = {vm.VoteRequest: vm.VoteResponse, bqe.BeginQuorumEpochRequest: bqe.BeginQuorumEpochResponse,
               eqe.EndQuorumEpochRequest: eqe.EndQuorumEpochResponse, fm.FetchRequest: fm.FetchResponse,
               dq.DescribeQuorumRequest: dq.DescribeQuorumResponse,
               fs.FetchSnapshotRequest: fs.FetchSnapshotResponse,
               arv.AddRaftVoterRequest: arv.AddRaftVoterResponse,
               rrv.RemoveRaftVoterRequest: rrv.RemoveRaftVoterResponse,
               urv.UpdateRaftVoterRequest: urv.UpdateRaftVoterResponse}
BY_API_KEY = {(c.API_KEY, c in REQUEST_TYPES): c for c in VERSIONS}


class Inbound(NamedTuple):
    source: int
    correlation_id: int
    message: object


class Outbound(NamedTuple):
    destination: int
    correlation_id: int
    message: object

    @property
    def is_request(self) -> bool:
        return type(self.message) in RESPONSE_OF


def encode(message) -> bytes:
    return bytes(message.encode(VERSIONS[type(message)]))


def decode(api_key: int, is_request: bool, data: bytes):
    cls = BY_API_KEY[(api_key, is_request)]
    return cls.decode(data, VERSIONS[cls])


# -- Vote -----------------------------------------------------------------------------------

def vote_request(cluster_id, voter_id, candidate_epoch, candidate_id, last_epoch, last_offset):
    return vm.VoteRequest(cluster_id=cluster_id, voter_id=voter_id, topics=[vm.VoteRequestTopicData(
        topic_name=METADATA_TOPIC, partitions=[vm.VoteRequestPartitionData(
            partition_index=METADATA_PARTITION, candidate_epoch=candidate_epoch, candidate_id=candidate_id,
            last_offset_epoch=last_epoch, last_offset=last_offset)])])


def vote_response(error=ErrorCode.NONE, partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1, granted=False):
    if error != ErrorCode.NONE:
        return vm.VoteResponse(error_code=error)
    return vm.VoteResponse(topics=[vm.VoteResponseTopicData(topic_name=METADATA_TOPIC, partitions=[
        vm.VoteResponsePartitionData(partition_index=METADATA_PARTITION, error_code=partition_error,
                                     leader_id=leader_id, leader_epoch=epoch, vote_granted=granted)])])


# -- BeginQuorumEpoch / EndQuorumEpoch ---------------------------------------------------------

def begin_quorum_epoch_request(cluster_id, voter_id, leader_id, epoch):
    return bqe.BeginQuorumEpochRequest(cluster_id=cluster_id, voter_id=voter_id, topics=[
        bqe.BeginQuorumEpochRequestTopicData(topic_name=METADATA_TOPIC, partitions=[
            bqe.BeginQuorumEpochRequestPartitionData(partition_index=METADATA_PARTITION, leader_id=leader_id,
                                                     leader_epoch=epoch)])])


def begin_quorum_epoch_response(error=ErrorCode.NONE, partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1):
    if error != ErrorCode.NONE:
        return bqe.BeginQuorumEpochResponse(error_code=error)
    return bqe.BeginQuorumEpochResponse(topics=[bqe.BeginQuorumEpochResponseTopicData(
        topic_name=METADATA_TOPIC, partitions=[bqe.BeginQuorumEpochResponsePartitionData(
            partition_index=METADATA_PARTITION, error_code=partition_error, leader_id=leader_id,
            leader_epoch=epoch)])])


def end_quorum_epoch_request(cluster_id, leader_id, epoch, preferred):
    return eqe.EndQuorumEpochRequest(cluster_id=cluster_id, topics=[eqe.EndQuorumEpochRequestTopicData(
        topic_name=METADATA_TOPIC, partitions=[eqe.EndQuorumEpochRequestPartitionData(
            partition_index=METADATA_PARTITION, leader_id=leader_id, leader_epoch=epoch,
            preferred_candidates=[eqe.ReplicaInfo(candidate_id=c) for c in preferred])])])


def end_quorum_epoch_response(error=ErrorCode.NONE, partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1):
    if error != ErrorCode.NONE:
        return eqe.EndQuorumEpochResponse(error_code=error)
    return eqe.EndQuorumEpochResponse(topics=[eqe.EndQuorumEpochResponseTopicData(
        topic_name=METADATA_TOPIC, partitions=[eqe.EndQuorumEpochResponsePartitionData(
            partition_index=METADATA_PARTITION, error_code=partition_error, leader_id=leader_id,
            leader_epoch=epoch)])])


# -- Fetch ------------------------------------------------------------------------------------

def fetch_request(cluster_id, replica_id, epoch, fetch_offset, last_fetched_epoch, max_wait_ms,
                  max_bytes=8 * 1024 * 1024, directory_id=None):
    return fm.FetchRequest(cluster_id=cluster_id, replica_state=fm.ReplicaState(replica_id=replica_id),
                           max_wait_ms=max_wait_ms, min_bytes=0, max_bytes=max_bytes, topics=[fm.FetchTopic(
                               topic_id=METADATA_TOPIC_ID, partitions=[fm.FetchPartition(
                                   partition=METADATA_PARTITION, current_leader_epoch=epoch,
                                   fetch_offset=fetch_offset, last_fetched_epoch=last_fetched_epoch,
                                   partition_max_bytes=max_bytes,
                                   replica_directory_id=directory_id or fm.ZERO_UUID)])])


def fetch_response(error=ErrorCode.NONE, partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1,
                   high_watermark=-1, records=None, diverging=None, snapshot_id=None):
    if error != ErrorCode.NONE:
        return fm.FetchResponse(error_code=error)
    p = fm.PartitionData(partition_index=METADATA_PARTITION, error_code=partition_error,
                         high_watermark=high_watermark, current_leader=fm.LeaderIdAndEpoch(
                             leader_id=leader_id, leader_epoch=epoch), records=records)
    if diverging is not None:
        p.diverging_epoch = fm.EpochEndOffset(epoch=diverging.epoch, end_offset=diverging.offset)
    if snapshot_id is not None:
        p.snapshot_id = fm.SnapshotId(end_offset=snapshot_id.offset, epoch=snapshot_id.epoch)
    return fm.FetchResponse(responses=[fm.FetchableTopicResponse(topic_id=METADATA_TOPIC_ID, partitions=[p])])


def fetch_replica_id(req) -> int:
    return req.replica_state.replica_id


def single_partition(msg, topic_attr, parts_attr="partitions", name_attr="topic_name"):
    """The one partition of a single-topic message, or None if it is not exactly ours."""
    topics = getattr(msg, topic_attr)
    if len(topics) != 1:
        return None
    t = topics[0]
    if name_attr == "topic_id":
        if t.topic_id != METADATA_TOPIC_ID:
            return None
    elif getattr(t, name_attr) != METADATA_TOPIC:
        return None
    parts = getattr(t, parts_attr)
    if len(parts) != 1:
        return None
    p = parts[0]
    if hasattr(p, "partition_index"):
        idx = p.partition_index
    elif hasattr(p, "partition"):
        idx = p.partition
    else:
        idx = p.index
    return p if idx == METADATA_PARTITION else None


# -- DescribeQuorum ------------------------------------------------------------------------------

def describe_quorum_request():
    return dq.DescribeQuorumRequest(topics=[dq.DescribeQuorumRequestTopicData(
        topic_name=METADATA_TOPIC, partitions=[dq.DescribeQuorumRequestPartitionData(
            partition_index=METADATA_PARTITION)])])


def describe_quorum_response(partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1, high_watermark=-1,
                             voters=(), observers=(), nodes=()):
    """voters / observers: (replica id, log end offset, last fetch ms, last caught up ms[,
    directory id]); nodes (v2): (node id, ((listener name, host, port), ...))."""
    def rs(t):
        return dq.ReplicaState(replica_id=t[0], log_end_offset=t[1], last_fetch_timestamp=t[2],
                               last_caught_up_timestamp=t[3],
                               replica_directory_id=t[4] if len(t) > 4 else dq.ZERO_UUID)
    return dq.DescribeQuorumResponse(nodes=[dq.Node(node_id=i, listeners=[
        dq.Listener(name=e[0], host=e[1], port=e[2]) for e in eps]) for i, eps in nodes],
        topics=[dq.DescribeQuorumResponseTopicData(
        topic_name=METADATA_TOPIC, partitions=[dq.DescribeQuorumResponsePartitionData(
            partition_index=METADATA_PARTITION, error_code=partition_error, leader_id=leader_id,
            leader_epoch=epoch, high_watermark=high_watermark, current_voters=[rs(v) for v in voters],
            observers=[rs(o) for o in observers])])])


# -- FetchSnapshot (KIP-630) ------------------------------------------------------------------------

def fetch_snapshot_request(cluster_id, replica_id, epoch, snapshot_id, position, max_bytes):
    return fs.FetchSnapshotRequest(cluster_id=cluster_id, replica_id=replica_id, max_bytes=max_bytes, topics=[
        fs.FetchSnapshotRequestTopicSnapshot(name=METADATA_TOPIC, partitions=[
            fs.FetchSnapshotRequestPartitionSnapshot(
                partition=METADATA_PARTITION, current_leader_epoch=epoch, position=position,
                snapshot_id=fs.FetchSnapshotRequestSnapshotId(end_offset=snapshot_id.offset,
                                                              epoch=snapshot_id.epoch))])])


def fetch_snapshot_response(error=ErrorCode.NONE, partition_error=ErrorCode.NONE, leader_id=-1, epoch=-1,
                            snapshot_id=None, size=0, position=0, data=None):
    if error != ErrorCode.NONE:
        return fs.FetchSnapshotResponse(error_code=error)
    p = fs.FetchSnapshotResponsePartitionSnapshot(
        index=METADATA_PARTITION, error_code=partition_error, size=size, position=position,
        current_leader=fs.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=epoch),
        snapshot_id=fs.FetchSnapshotResponseSnapshotId(end_offset=snapshot_id.offset if snapshot_id else -1,
                                                       epoch=snapshot_id.epoch if snapshot_id else -1),
        unaligned_records=data if data is not None else b"")
    return fs.FetchSnapshotResponse(topics=[fs.FetchSnapshotResponseTopicSnapshot(name=METADATA_TOPIC,
                                                                                  partitions=[p])])


def describe_quorum_for_version(resp, version: int):
    """Drop what DescribeQuorum v0/v1 cannot carry (directory ids, nodes: v2+)."""
    if version < 2:
        resp.nodes = []
        for t in resp.topics:
            for p in t.partitions:
                for r in list(p.current_voters) + list(p.observers):
                    r.replica_directory_id = dq.ZERO_UUID
    return resp


# -- AddRaftVoter / RemoveRaftVoter / UpdateRaftVoter (KIP-853) ---------------------------------------

def add_raft_voter_response(error=ErrorCode.NONE, message=None):
    return arv.AddRaftVoterResponse(error_code=error, error_message=message)


def remove_raft_voter_response(error=ErrorCode.NONE, message=None):
    return rrv.RemoveRaftVoterResponse(error_code=error, error_message=message)


def update_raft_voter_response(error=ErrorCode.NONE, leader_id=-1, epoch=-1, endpoint=None):
    host, port = endpoint or ("", 0)
    return urv.UpdateRaftVoterResponse(error_code=error, current_leader=urv.CurrentLeader(
        leader_id=leader_id, leader_epoch=epoch, host=host, port=port))
