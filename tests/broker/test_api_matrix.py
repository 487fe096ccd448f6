"""Conformance matrix: what ApiVersions advertises is exactly what is implemented, and
every advertised (api key, version) is exercised with a meaningful request.

How the matrix works
--------------------
``EXPECTED`` pins, independently of the broker, the (api key, min version, max version)
set kbroker implements. ``test_advertised_is_the_pinned_table`` compares the live
ApiVersions response with it, so a handler module that stops loading (its APIs vanish
from ApiVersions) fails the matrix instead of turning its cases into "refused" checks.
Changing what kbroker supports means changing ``EXPECTED`` in the same commit.

``CASES`` maps an api key to a function ``case(env, version)`` that sends requests at
``version`` over a raw socket (tests/broker/raw_client.py: frames built with
kbroker.protocol.encode_request, responses decoded *exactly* at the request version)
and checks Kafka's semantics for that version. ``test_version`` runs every
(api key, version) in the spec's validVersions of each api key that has a case:

* in ``EXPECTED`` -> the case runs;
* not in ``EXPECTED`` -> the request must be refused with UNSUPPORTED_VERSION or a
  closed connection, and the broker must keep serving.

``test_every_expected_version_has_a_case`` fails for any pinned pair without a case,
so a handler added without tests makes the matrix fail. Api keys outside ``EXPECTED``
are covered by ``test_unadvertised_api_keys_are_refused``.

Semantics follow Apache Kafka 3.9 (KafkaApis, ReplicaManager, FetchSession, the group
coordinator); where kbroker deliberately differs, the case says so. The tests at the end
pin defects this matrix found and that were fixed (regression tests).
"""
from __future__ import annotations

import random
import struct
import time
import uuid

import pytest

from kbroker.kernels import records as rec
from kbroker.protocol import API_INFO, ApiKey, ErrorCode
from kbroker.protocol.messages import (
    alter_configs as ac, api_versions as av, consumer_group_describe as cgd, consumer_group_heartbeat as cgh,
    create_partitions as cp, create_topics as ct,
    delete_groups as dg, delete_records as dr, delete_topics as dt, describe_cluster as dc,
    describe_configs as dcf, describe_groups as dgr, describe_log_dirs as dld, fetch as f,
    find_coordinator as fc, heartbeat as hb, incremental_alter_configs as iac, init_producer_id as ipi,
    join_group as jg, leave_group as lg, list_groups as lgr, list_offsets as lo, metadata as md,
    offset_commit as oc, offset_delete as od, offset_fetch as of, offset_for_leader_epoch as ofle,
    produce as pr, sync_group as sg, write_txn_markers as wtm,
    add_offsets_to_txn as aot, add_partitions_to_txn as apt, describe_transactions as dtx, end_txn as et,
    list_transactions as ltx, txn_offset_commit as toc,
    sasl_handshake as sh, sasl_authenticate as sa,
    alter_user_scram_credentials as auc, describe_user_scram_credentials as duc,
    alter_client_quotas as acq, describe_client_quotas as dcq,
)
from tests.broker.raw_client import ConnectionClosed, RawClient, advertised, decode_exact

E = ErrorCode
K = ApiKey
ZERO_UUID = uuid.UUID(int=0)
NOT_REQUESTED = -(2 ** 31)  # "authorized operations not requested"
CLIENT_ID = "kbroker-matrix"

#: What kbroker implements: {api key: (min version, max version)}, written down here (not read
#: from the broker) so that losing a handler fails the matrix. Reviewed against Kafka 3.9's
#: ranges: Produce starts at v3 and Fetch at v4 (message format v2 only, as Kafka 4.0);
#: Fetch v17 (KIP-853 replica directory ids, a tagged field followers send) is served; the ACL/SASL APIs are absent; of the transaction
#: APIs, the coordinator's are here (WriteTxnMarkers and TxnOffsetCommit come with the log side).
EXPECTED: dict[int, tuple[int, int]] = {
    K.PRODUCE: (3, 12),
    K.FETCH: (4, 17),
    K.LIST_OFFSETS: (1, 9),
    K.METADATA: (0, 12),
    K.OFFSET_COMMIT: (0, 9),
    K.OFFSET_FETCH: (0, 9),
    K.FIND_COORDINATOR: (0, 6),
    K.JOIN_GROUP: (0, 9),
    K.HEARTBEAT: (0, 4),
    K.LEAVE_GROUP: (0, 5),
    K.SYNC_GROUP: (0, 5),
    K.DESCRIBE_GROUPS: (0, 5),
    K.LIST_GROUPS: (0, 5),
    K.API_VERSIONS: (0, 4),
    K.CREATE_TOPICS: (0, 7),
    K.DELETE_TOPICS: (0, 6),
    K.DELETE_RECORDS: (0, 2),
    K.INIT_PRODUCER_ID: (0, 5),
    K.OFFSET_FOR_LEADER_EPOCH: (0, 4),
    K.DESCRIBE_CONFIGS: (0, 4),
    K.ALTER_CONFIGS: (0, 2),
    K.DESCRIBE_LOG_DIRS: (0, 4),
    K.CREATE_PARTITIONS: (0, 3),
    K.DELETE_GROUPS: (0, 2),
    K.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    K.OFFSET_DELETE: (0, 0),
    K.DESCRIBE_CLUSTER: (0, 1),
    K.CONSUMER_GROUP_HEARTBEAT: (0, 1),
    K.CONSUMER_GROUP_DESCRIBE: (0, 0),
    K.ADD_PARTITIONS_TO_TXN: (0, 5),
    K.ADD_OFFSETS_TO_TXN: (0, 4),
    K.END_TXN: (0, 5),
    K.DESCRIBE_TRANSACTIONS: (0, 0),
    K.LIST_TRANSACTIONS: (0, 1),
    K.TXN_OFFSET_COMMIT: (0, 5),
    K.WRITE_TXN_MARKERS: (0, 1),
    K.SASL_HANDSHAKE: (0, 1),
    K.SASL_AUTHENTICATE: (0, 2),
    K.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    K.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    K.DESCRIBE_CLIENT_QUOTAS: (0, 1),
    K.ALTER_CLIENT_QUOTAS: (0, 1),
    K.DESCRIBE_ACLS: (0, 3),
    K.CREATE_ACLS: (0, 3),
    K.DELETE_ACLS: (0, 3),
}

# -- environment: setup helpers shared by the cases ---------------------------------------------


class Env:
    """One connection plus helpers that set up state with the highest advertised versions."""

    def __init__(self, broker, live: dict[int, tuple[int, int]]):
        self.broker = broker
        self.live = live
        self.c = RawClient(broker.port, client_id=CLIENT_ID)
        md_resp = self.call(K.METADATA, self.top(K.METADATA), md.MetadataRequest(topics=[]))
        self.node_id = md_resp.brokers[0].node_id
        self.cluster_id = md_resp.cluster_id

    def close(self):
        self.c.close()

    def top(self, key: int) -> int:
        return self.live[key][1]

    def call(self, key: int, version: int, body, timeout_s: float | None = None):
        return self.c.call(key, version, body, timeout_s)

    # topics ----------------------------------------------------------------------------------

    def new_topic(self, tag: str, partitions: int = 1, configs: dict | None = None) -> tuple[str, uuid.UUID]:
        name = f"mx-{tag}-{uuid.uuid4().hex[:8]}"
        r = self.call(K.CREATE_TOPICS, self.top(K.CREATE_TOPICS), ct.CreateTopicsRequest(
            topics=[ct.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                      configs=[ct.CreatableTopicConfig(name=k, value=v)
                                               for k, v in (configs or {}).items()])],
            timeout_ms=10000))
        assert r.topics[0].error_code == E.NONE, r
        return name, self.topic_id(name)

    def metadata(self, names: list[str] | None, allow_auto: bool = False):
        v = self.top(K.METADATA)
        topics = None if names is None else [md.MetadataRequestTopic(name=n) for n in names]
        return self.call(K.METADATA, v, md.MetadataRequest(topics=topics, allow_auto_topic_creation=allow_auto))

    def topic_meta(self, name: str):
        (t,) = self.metadata([name]).topics
        return t

    def topic_id(self, name: str) -> uuid.UUID:
        t = self.topic_meta(name)
        assert t.error_code == E.NONE and t.topic_id != ZERO_UUID, t
        return t.topic_id

    def init_txn(self, transactional_id: str, version: int | None = None, timeout_ms: int = 60000):
        """InitProducerId for a transactional id -> (producer id, epoch); retries while the
        coordinator's partitions load."""
        v = self.top(K.INIT_PRODUCER_ID) if version is None else version
        deadline = time.monotonic() + 15
        while True:
            r = self.call(K.INIT_PRODUCER_ID, v, ipi.InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=timeout_ms))
            if r.error_code != E.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.error_code == E.NONE and r.producer_id >= 0 and r.producer_epoch >= 0, r
        return r.producer_id, r.producer_epoch

    def exists(self, name: str) -> bool:
        return self.topic_meta(name).error_code == E.NONE

    def leader_epoch(self, name: str, partition: int = 0) -> int:
        return self.topic_meta(name).partitions[partition].leader_epoch

    # records ---------------------------------------------------------------------------------

    def produce(self, topic: str, partition: int, values: list[bytes], timestamp_ms: int | None = None,
                version: int | None = None, acks: int = -1, compression: int = rec.NO_COMPRESSION):
        v = self.top(K.PRODUCE) if version is None else version
        r = self.call(K.PRODUCE, v, produce_request(topic, partition, values, timestamp_ms, acks, compression))
        (pp,) = r.responses[0].partition_responses
        assert pp.error_code == E.NONE, r
        return pp.base_offset

    def list_offset(self, topic: str, partition: int, timestamp: int, version: int | None = None):
        v = self.top(K.LIST_OFFSETS) if version is None else version
        r = self.call(K.LIST_OFFSETS, v, lo.ListOffsetsRequest(replica_id=-1, topics=[lo.ListOffsetsTopic(
            name=topic, partitions=[lo.ListOffsetsPartition(partition_index=partition, timestamp=timestamp)])]))
        (p,) = r.topics[0].partitions
        return p

    def fetch_values(self, topic: str, partition: int, offset: int = 0) -> list[bytes]:
        v = self.top(K.FETCH)
        tid = self.topic_id(topic) if v >= 13 else None
        r = self.call(K.FETCH, v, fetch_request(v, [(topic, tid, [(partition, offset)])]))
        parts = fetch_parts(v, r, {tid: topic})
        data = parts[(topic, partition)]
        assert data.error_code == E.NONE, data
        return [x.value for x in decode_records(data.records) if x.offset >= offset]

    # groups ----------------------------------------------------------------------------------

    def join(self, group: str, version: int | None = None, member_id: str = "", protocol_type="consumer",
             protocol="range", metadata=b"meta", session_timeout_ms=10000, client: RawClient | None = None):
        """JoinGroup, retrying once with the assigned id after MEMBER_ID_REQUIRED (v4+)."""
        v = self.top(K.JOIN_GROUP) if version is None else version
        c = client or self.c
        for _ in range(2):
            r = c.call(K.JOIN_GROUP, v, join_request(group, member_id, protocol_type, protocol, metadata,
                                                      session_timeout_ms, v))
            if r.error_code != E.MEMBER_ID_REQUIRED:
                return r
            member_id = r.member_id
        return r

    def join_and_sync(self, group: str, assignment=b"assign"):
        j = self.join(group)
        assert j.error_code == E.NONE, j
        v = self.top(K.SYNC_GROUP)
        s = self.call(K.SYNC_GROUP, v, sync_request(group, j.generation_id, j.member_id, v,
                                                     [(j.member_id, assignment)]))
        assert s.error_code == E.NONE, s
        return j.member_id, j.generation_id

    def leave(self, group: str, member_id: str):
        v = self.top(K.LEAVE_GROUP)
        r = self.call(K.LEAVE_GROUP, v, leave_request(group, member_id, v))
        assert r.error_code == E.NONE, r

    def commit(self, group: str, topic: str, offsets: dict[int, int], metadata="m"):
        v = self.top(K.OFFSET_COMMIT)
        r = self.call(K.OFFSET_COMMIT, v, oc.OffsetCommitRequest(group_id=group, topics=[oc.OffsetCommitRequestTopic(
            name=topic, partitions=[oc.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                                    committed_metadata=metadata)
                                    for p, o in offsets.items()])]))
        assert all(p.error_code == E.NONE for t in r.topics for p in t.partitions), r

    def committed(self, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
        v = self.top(K.OFFSET_FETCH)
        if v >= 8:
            r = self.call(K.OFFSET_FETCH, v, of.OffsetFetchRequest(groups=[of.OffsetFetchRequestGroup(
                group_id=group, topics=[of.OffsetFetchRequestTopics(name=topic, partition_indexes=partitions)])]))
            return {p.partition_index: p.committed_offset for t in r.groups[0].topics for p in t.partitions}
        r = self.call(K.OFFSET_FETCH, v, of.OffsetFetchRequest(group_id=group, topics=[
            of.OffsetFetchRequestTopic(name=topic, partition_indexes=partitions)]))
        return {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions}


# -- request builders ---------------------------------------------------------------------------

def batch(values: list[bytes], timestamp_ms: int | None = None, compression: int = rec.NO_COMPRESSION) -> bytes:
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return rec.encode_batch([(ts, b"k%d" % i, v, [("h", b"x")]) for i, v in enumerate(values)],
                            compression=compression)


def produce_request(topic, partition, values, timestamp_ms=None, acks=-1, compression=rec.NO_COMPRESSION,
                    records=None):
    return pr.ProduceRequest(transactional_id=None, acks=acks, timeout_ms=10000, topic_data=[pr.TopicProduceData(
        name=topic, partition_data=[pr.PartitionProduceData(
            index=partition, records=batch(values, timestamp_ms, compression) if records is None else records)])])


def fetch_request(v, topics, session_id=0, epoch=-1, forgotten=(), max_wait_ms=0, min_bytes=0,
                  isolation_level=0):
    """``topics``: [(name, topic_id, [(partition, fetch_offset)])]; forgotten: [(name, topic_id, [p])]."""
    def ft(name, tid, parts):
        kw = {"topic_id": tid} if v >= 13 else {"topic": name}
        return f.FetchTopic(partitions=[f.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=1 << 20)
                                        for p, o in parts], **kw)

    req = f.FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=16 << 20,
                         isolation_level=isolation_level, topics=[ft(*t) for t in topics])
    if v >= 15:
        req.replica_id = -1
    if v >= 7:
        req.session_id, req.session_epoch = session_id, epoch
        req.forgotten_topics_data = [
            f.ForgottenTopic(partitions=list(ps), **({"topic_id": tid} if v >= 13 else {"topic": name}))
            for name, tid, ps in forgotten]
    return req


def fetch_parts(v, resp, names_by_id: dict) -> dict:
    """{(topic, partition): PartitionData} of a FetchResponse (topic ids mapped back, v13+)."""
    out = {}
    for t in resp.responses:
        name = names_by_id.get(t.topic_id, t.topic_id) if v >= 13 else t.topic
        for p in t.partitions:
            assert (name, p.partition_index) not in out, "partition answered twice"
            out[(name, p.partition_index)] = p
    return out


def decode_records(data) -> list:
    if data is None or len(data) == 0:
        return []
    return [r for b in rec.decode_batches(bytes(data)) for r in b.records]


def join_request(group, member_id, protocol_type, protocol, metadata, session_timeout_ms, v):
    r = jg.JoinGroupRequest(group_id=group, session_timeout_ms=session_timeout_ms, member_id=member_id,
                            protocol_type=protocol_type,
                            protocols=[jg.JoinGroupRequestProtocol(name=protocol, metadata=metadata)])
    if v >= 1:
        r.rebalance_timeout_ms = 10000
    return r


def sync_request(group, generation, member_id, v, assignments=(), protocol_type="consumer", protocol="range"):
    r = sg.SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                            assignments=[sg.SyncGroupRequestAssignment(member_id=m, assignment=a)
                                         for m, a in assignments])
    if v >= 5:
        r.protocol_type, r.protocol_name = protocol_type, protocol
    return r


def leave_request(group, member_id, v):
    if v >= 3:
        return lg.LeaveGroupRequest(group_id=group, members=[lg.MemberIdentity(member_id=member_id)])
    return lg.LeaveGroupRequest(group_id=group, member_id=member_id)


def gname(tag: str) -> str:
    return f"mxg-{tag}-{uuid.uuid4().hex[:8]}"


# -- the cases ----------------------------------------------------------------------------------

CASES: dict[int, object] = {}


def case(key: int):
    def register(fn):
        CASES[int(key)] = fn
        return fn
    return register


@case(K.API_VERSIONS)
def case_api_versions(env: Env, v: int):
    r = env.c.api_versions(v)
    assert r.error_code == E.NONE
    assert {k.api_key: (k.min_version, k.max_version) for k in r.api_keys} == env.live
    assert [k.api_key for k in r.api_keys] == sorted(k.api_key for k in r.api_keys)
    if v >= 1:
        assert r.throttle_time_ms == 0
    if v >= 3:
        # KIP-511: client software name/version must match [a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?
        bad = env.call(K.API_VERSIONS, v, av.ApiVersionsRequest(client_software_name="bad name!",
                                                               client_software_version="1.0"))
        assert bad.error_code == E.INVALID_REQUEST


@case(K.METADATA)
def case_metadata(env: Env, v: int):
    name, tid = env.new_topic(f"md{v}", partitions=2)

    def call(topics, **kw):
        return env.call(K.METADATA, v, md.MetadataRequest(topics=topics, **kw))

    def check_topic(t):
        assert t.error_code == E.NONE and t.name == name and len(t.partitions) == 2, t
        for i, p in enumerate(sorted(t.partitions, key=lambda p: p.partition_index)):
            assert p.partition_index == i and p.error_code == E.NONE
            assert p.leader_id == env.node_id and p.replica_nodes == [env.node_id] and p.isr_nodes == [env.node_id]
            if v >= 7:
                assert p.leader_epoch >= 0
        if v >= 1:
            assert t.is_internal is False
        if v >= 10:
            assert t.topic_id == tid

    # all topics: v0 empty list, v1+ null
    r = call([] if v == 0 else None)
    (b,) = r.brokers
    assert (b.node_id, b.host, b.port) == (env.node_id, "127.0.0.1", env.broker.port)
    if v >= 1:
        assert r.controller_id == env.node_id
    if v >= 2:
        assert r.cluster_id and r.cluster_id == env.cluster_id
    check_topic(next(t for t in r.topics if t.name == name))
    # named
    r = call([md.MetadataRequestTopic(name=name)])
    (t,) = r.topics
    check_topic(t)
    if v >= 1:
        assert call([]).topics == []  # v1+: empty list = no topics
    # auto creation: v0-3 always allowed, v4+ only when asked (auto.create.topics.enable=true)
    absent = f"mx-auto{v}-{uuid.uuid4().hex[:8]}"
    if v >= 4:
        (t,) = call([md.MetadataRequestTopic(name=absent)], allow_auto_topic_creation=False).topics
        assert (t.name, t.error_code, t.partitions) == (absent, E.UNKNOWN_TOPIC_OR_PARTITION, [])
        assert not env.exists(absent)
        (t,) = call([md.MetadataRequestTopic(name="bad name!")], allow_auto_topic_creation=False).topics
        assert t.error_code == E.INVALID_TOPIC_EXCEPTION
    (t,) = call([md.MetadataRequestTopic(name=absent)]).topics
    assert t.error_code in (E.NONE, E.LEADER_NOT_AVAILABLE), t  # Kafka: LEADER_NOT_AVAILABLE while creating
    assert len(env.topic_meta(absent).partitions) == 1  # num.partitions=1
    (t,) = call([md.MetadataRequestTopic(name="bad name!")]).topics
    assert t.error_code == E.INVALID_TOPIC_EXCEPTION
    if v >= 8:
        r = call([md.MetadataRequestTopic(name=name)], include_topic_authorized_operations=True,
                 **({"include_cluster_authorized_operations": True} if v <= 10 else {}))
        ops = r.topics[0].topic_authorized_operations
        assert ops != NOT_REQUESTED and ops & (1 << 8), ops  # DESCRIBE
        if v <= 10:
            assert r.cluster_authorized_operations != NOT_REQUESTED
        assert call([md.MetadataRequestTopic(name=name)]).topics[0].topic_authorized_operations == NOT_REQUESTED
    if v in (10, 11):  # a null name (or an id) needs v12; the response cannot carry a null name
        (t,) = call([md.MetadataRequestTopic(topic_id=tid, name=None)]).topics
        assert (t.error_code, t.name) == (E.INVALID_REQUEST, "")
    if v >= 12:
        unknown = uuid.uuid4()
        (t,) = call([md.MetadataRequestTopic(topic_id=unknown, name=None)]).topics
        assert (t.error_code, t.topic_id) == (E.UNKNOWN_TOPIC_ID, unknown)


@case(K.PRODUCE)
def case_produce(env: Env, v: int):
    name, _ = env.new_topic(f"pr{v}")

    def send(values, **kw):
        r = env.call(K.PRODUCE, v, produce_request(name, kw.pop("partition", 0), values, **kw))
        (t,) = r.responses
        (p,) = t.partition_responses
        assert t.name == name
        if v >= 1:
            assert r.throttle_time_ms == 0
        return p

    p = send([b"a", b"b", b"c"])
    assert (p.index, p.error_code, p.base_offset) == (0, E.NONE, 0)
    if v >= 2:
        assert p.log_append_time_ms == -1  # CreateTime topic
    if v >= 5:
        assert p.log_start_offset == 0
    if v >= 8:
        assert p.record_errors == [] and p.error_message is None
    p = send([b"d", b"e"], compression=rec.GZIP)
    assert (p.error_code, p.base_offset) == (E.NONE, 3)
    # acks=0: no response at all; the next request on the connection gets the next frame
    corr = env.c.send(K.PRODUCE, v, produce_request(name, 0, [b"f"], acks=0))
    mv = env.top(K.METADATA)
    r = env.c.recv(K.METADATA, mv, env.c.send(K.METADATA, mv, md.MetadataRequest(topics=[])))
    assert r.topics == [] and corr >= 0
    assert env.fetch_values(name, 0) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    # per-partition errors
    assert send([b"x"], acks=2).error_code == E.INVALID_REQUIRED_ACKS
    assert send([b"x"], partition=7).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    r = env.call(K.PRODUCE, v, produce_request(f"mx-nosuch-{uuid.uuid4().hex[:8]}", 0, [b"x"]))
    assert r.responses[0].partition_responses[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    bad = bytearray(batch([b"corrupt-me"]))
    bad[-3] ^= 0xFF  # inside the CRC-covered records
    assert send([], records=bytes(bad)).error_code == E.CORRUPT_MESSAGE
    assert env.list_offset(name, 0, -1).offset == 6


@case(K.FETCH)
def case_fetch(env: Env, v: int):
    name, tid = env.new_topic(f"fe{v}", partitions=2)
    ids = {tid: name}
    env.produce(name, 0, [b"a0", b"a1"])
    env.produce(name, 1, [b"b0"])

    def fetch(parts, **kw):
        r = env.call(K.FETCH, v, fetch_request(v, [(name, tid, parts)] if parts else [], **kw))
        if v >= 1:
            assert r.throttle_time_ms == 0
        return r, fetch_parts(v, r, ids)

    def values(pd):
        return [x.value for x in decode_records(pd.records)]

    # sessionless full fetch (v7+: session 0, epoch -1)
    r, parts = fetch([(0, 0), (1, 0)])
    assert set(parts) == {(name, 0), (name, 1)}
    p0, p1 = parts[(name, 0)], parts[(name, 1)]
    assert (p0.error_code, p0.high_watermark, values(p0)) == (E.NONE, 2, [b"a0", b"a1"])
    assert (p1.error_code, p1.high_watermark, values(p1)) == (E.NONE, 1, [b"b0"])
    assert p0.last_stable_offset == 2  # v4+: no open transactions
    if v >= 5:
        assert p0.log_start_offset == 0
    if v >= 7:
        assert (r.error_code, r.session_id) == (E.NONE, 0)
    # errors
    _, parts = fetch([(0, 99)])
    assert parts[(name, 0)].error_code == E.OFFSET_OUT_OF_RANGE
    _, parts = fetch([(5, 0)])
    assert parts[(name, 5)].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    if v <= 12:
        ghost = f"mx-ghost-{uuid.uuid4().hex[:8]}"
        r = env.call(K.FETCH, v, fetch_request(v, [(ghost, None, [(0, 0)])]))
        assert fetch_parts(v, r, {})[(ghost, 0)].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    else:
        ghost = uuid.uuid4()
        r = env.call(K.FETCH, v, fetch_request(v, [(None, ghost, [(0, 0)])]))
        assert fetch_parts(v, r, {})[(ghost, 0)].error_code == E.UNKNOWN_TOPIC_ID
    if v < 7:
        return
    # -- KIP-227 fetch sessions --
    r, parts = fetch([(0, 0), (1, 0)], session_id=0, epoch=0)  # create: full
    sid = r.session_id
    assert r.error_code == E.NONE and sid != 0, r
    assert set(parts) == {(name, 0), (name, 1)}
    # incremental, offsets moved to the end: nothing changed -> no partitions at all
    r, parts = fetch([(0, 2), (1, 1)], session_id=sid, epoch=1)
    assert (r.error_code, r.session_id, parts) == (E.NONE, sid, {})
    env.produce(name, 1, [b"b1"])
    r, parts = fetch([], session_id=sid, epoch=2)  # only the changed partition
    assert list(parts) == [(name, 1)], parts
    assert (values(parts[(name, 1)]), parts[(name, 1)].high_watermark) == ([b"b1"], 2)
    # wrong epoch: INVALID_FETCH_SESSION_EPOCH, and the session survives it
    r, parts = fetch([], session_id=sid, epoch=7)
    assert (r.error_code, r.session_id, r.responses) == (E.INVALID_FETCH_SESSION_EPOCH, 0, [])
    # forget p0, move p1 to its end
    r, parts = fetch([(1, 2)], session_id=sid, epoch=3, forgotten=[(name, tid, [0])])
    assert (r.error_code, r.session_id, parts) == (E.NONE, sid, {})
    env.produce(name, 0, [b"a2"])
    env.produce(name, 1, [b"b2"])
    r, parts = fetch([], session_id=sid, epoch=4)
    assert list(parts) == [(name, 1)] and values(parts[(name, 1)]) == [b"b2"], parts
    # unknown session id
    other = sid
    while other == sid:
        other = random.randrange(1, 2 ** 31)
    r, _ = fetch([], session_id=other, epoch=1)
    assert (r.error_code, r.session_id, r.responses) == (E.FETCH_SESSION_ID_NOT_FOUND, 0, [])
    r, _ = fetch([], session_id=0, epoch=3)  # Kafka looks up session 0: not found
    assert r.error_code == E.FETCH_SESSION_ID_NOT_FOUND
    # close the session (epoch -1): answered as a sessionless full fetch; the id is gone
    r, parts = fetch([(0, 2)], session_id=sid, epoch=-1)
    assert (r.error_code, r.session_id) == (E.NONE, 0)
    assert values(parts[(name, 0)]) == [b"a2"]
    r, _ = fetch([], session_id=sid, epoch=5)
    assert r.error_code == E.FETCH_SESSION_ID_NOT_FOUND


@case(K.LIST_OFFSETS)
def case_list_offsets(env: Env, v: int):
    name, _ = env.new_topic(f"lo{v}")
    for ts in (1000, 5000, 3000):  # offsets 0, 1, 2
        env.produce(name, 0, [b"%d" % ts], timestamp_ms=ts)
    epoch = env.leader_epoch(name)

    def q(timestamp, partition=0, **kw):
        req = lo.ListOffsetsRequest(replica_id=-1, topics=[lo.ListOffsetsTopic(name=name, partitions=[
            lo.ListOffsetsPartition(partition_index=partition, timestamp=timestamp,
                                    **({"current_leader_epoch": kw.pop("current_leader_epoch")}
                                       if "current_leader_epoch" in kw else {}))])], **kw)
        r = env.call(K.LIST_OFFSETS, v, req)
        (t,) = r.topics
        assert t.name == name
        (p,) = t.partitions
        assert p.partition_index == partition
        return p

    def check(p, err, offset, timestamp):
        assert (p.error_code, p.offset, p.timestamp) == (err, offset, timestamp), p
        if v >= 4 and err == E.NONE and offset >= 0:
            assert p.leader_epoch == epoch

    check(q(-2), E.NONE, 0, -1)       # earliest
    check(q(-1), E.NONE, 3, -1)       # latest (high watermark)
    check(q(1000), E.NONE, 0, 1000)   # first offset with timestamp >= target
    check(q(2000), E.NONE, 1, 5000)
    check(q(4000), E.NONE, 1, 5000)
    check(q(6000), E.NONE, -1, -1)    # none: unknown offset and timestamp
    if v >= 7:
        check(q(-3), E.NONE, 1, 5000)  # max timestamp (KIP-734)
    else:
        assert q(-3).error_code == E.UNSUPPORTED_VERSION
    if v >= 2:
        check(q(-1, isolation_level=1), E.NONE, 3, -1)  # read_committed: last stable offset
    if v >= 4:
        assert q(-1, current_leader_epoch=epoch + 1).error_code == E.UNKNOWN_LEADER_EPOCH
        check(q(-1, current_leader_epoch=epoch), E.NONE, 3, -1)
    assert q(-1, partition=4).error_code == E.UNKNOWN_TOPIC_OR_PARTITION


@case(K.OFFSET_FOR_LEADER_EPOCH)
def case_offset_for_leader_epoch(env: Env, v: int):
    name, _ = env.new_topic(f"ofle{v}")
    env.produce(name, 0, [b"1", b"2", b"3"])
    epoch = env.leader_epoch(name)

    def q(leader_epoch, partition=0, current=None):
        part = ofle.OffsetForLeaderPartition(partition=partition, leader_epoch=leader_epoch)
        if current is not None:
            part.current_leader_epoch = current
        req = ofle.OffsetForLeaderEpochRequest(topics=[ofle.OffsetForLeaderTopic(topic=name, partitions=[part])])
        if v >= 3:
            req.replica_id = -1  # a consumer
        r = env.call(K.OFFSET_FOR_LEADER_EPOCH, v, req)
        (t,) = r.topics
        (p,) = t.partitions
        assert (t.topic, p.partition) == (name, partition)
        return p

    p = q(epoch)
    assert (p.error_code, p.end_offset) == (E.NONE, 3)
    if v >= 1:
        assert p.leader_epoch == epoch
    p = q(epoch + 5)  # an epoch after the latest: undefined
    assert (p.error_code, p.end_offset) == (E.NONE, -1)
    assert q(epoch, partition=3).error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    if v >= 2:
        assert q(epoch, current=epoch + 1).error_code == E.UNKNOWN_LEADER_EPOCH
        assert q(epoch, current=epoch).error_code == E.NONE


@case(K.CREATE_TOPICS)
def case_create_topics(env: Env, v: int):
    def create(*topics, validate_only=False):
        req = ct.CreateTopicsRequest(topics=list(topics), timeout_ms=10000)
        if validate_only:
            req.validate_only = True
        r = env.call(K.CREATE_TOPICS, v, req)
        if v >= 2:
            assert r.throttle_time_ms == 0
        assert [t.name for t in r.topics] == [t.name for t in topics]
        return r.topics

    def topic(name, n=3, rf=1, configs=None):
        return ct.CreatableTopic(name=name, num_partitions=n, replication_factor=rf,
                                 configs=[ct.CreatableTopicConfig(name=k, value=val) for k, val in (configs or {}).items()])

    name = f"mx-ct{v}-{uuid.uuid4().hex[:8]}"
    (r,) = create(topic(name, configs={"retention.ms": "3600000"}))
    assert r.error_code == E.NONE, r
    if v >= 5:
        assert (r.num_partitions, r.replication_factor) == (3, 1)
        cfg = {c.name: c for c in r.configs}
        assert cfg["retention.ms"].value == "3600000" and cfg["retention.ms"].config_source == 1  # DYNAMIC_TOPIC
        assert cfg["cleanup.policy"].value == "delete"
    meta = env.topic_meta(name)
    assert len(meta.partitions) == 3
    if v >= 7:
        assert r.topic_id == meta.topic_id != ZERO_UUID

    def err(t, code):
        (res,) = create(t)
        assert res.error_code == code, res
        if v >= 1:
            assert res.error_message, res

    err(topic(name), E.TOPIC_ALREADY_EXISTS)
    err(topic("bad/name"), E.INVALID_TOPIC_EXCEPTION)
    err(topic(f"mx-rf-{uuid.uuid4().hex[:8]}", rf=3), E.INVALID_REPLICATION_FACTOR)
    err(topic(f"mx-np-{uuid.uuid4().hex[:8]}", n=0), E.INVALID_PARTITIONS)
    err(topic(f"mx-cfg-{uuid.uuid4().hex[:8]}", configs={"retention.ms": "soon"}), E.INVALID_CONFIG)
    dup = f"mx-dup-{uuid.uuid4().hex[:8]}"
    assert [t.error_code for t in create(topic(dup), topic(dup))] == [E.INVALID_REQUEST] * 2
    assert not env.exists(dup)
    if v >= 1:
        vo = f"mx-vo-{uuid.uuid4().hex[:8]}"
        (res,) = create(topic(vo), validate_only=True)
        assert res.error_code == E.NONE
        assert not env.exists(vo)
    if v >= 4:  # -1 = the broker defaults (KIP-464)
        dflt = f"mx-dflt-{uuid.uuid4().hex[:8]}"
        (res,) = create(topic(dflt, n=-1, rf=-1))
        assert res.error_code == E.NONE
        assert len(env.topic_meta(dflt).partitions) == 1


@case(K.DELETE_TOPICS)
def case_delete_topics(env: Env, v: int):
    a, _ = env.new_topic(f"dta{v}")
    b, bid = env.new_topic(f"dtb{v}")

    def delete(names=(), ids=()):
        if v >= 6:
            req = dt.DeleteTopicsRequest(topics=[dt.DeleteTopicState(name=n) for n in names]
                                         + [dt.DeleteTopicState(name=None, topic_id=i) for i in ids], timeout_ms=10000)
        else:
            assert not ids
            req = dt.DeleteTopicsRequest(topic_names=list(names), timeout_ms=10000)
        r = env.call(K.DELETE_TOPICS, v, req)
        if v >= 1:
            assert r.throttle_time_ms == 0
        return r.responses

    (res,) = delete([a])
    assert (res.name, res.error_code) == (a, E.NONE)
    assert not env.exists(a)
    (res,) = delete([a])
    assert (res.name, res.error_code) == (a, E.UNKNOWN_TOPIC_OR_PARTITION)
    if v >= 5:
        assert res.error_message
    if v >= 6:
        (res,) = delete(ids=[bid])
        assert (res.error_code, res.topic_id) == (E.NONE, bid)
        (res,) = delete(ids=[uuid.uuid4()])
        assert res.error_code == E.UNKNOWN_TOPIC_ID
    else:
        (res,) = delete([b])
        assert res.error_code == E.NONE
    assert not env.exists(b)
    env.new_topic(f"dta{v}")  # names are reusable after deletion


@case(K.CREATE_PARTITIONS)
def case_create_partitions(env: Env, v: int):
    name, _ = env.new_topic(f"cp{v}")

    def grow(topic, count, validate_only=False):
        r = env.call(K.CREATE_PARTITIONS, v, cp.CreatePartitionsRequest(
            topics=[cp.CreatePartitionsTopic(name=topic, count=count, assignments=None)], timeout_ms=10000,
            validate_only=validate_only))
        (res,) = r.results
        assert res.name == topic
        if res.error_code != E.NONE:
            assert res.error_message
        return res.error_code

    assert grow(name, 3, validate_only=True) == E.NONE
    assert len(env.topic_meta(name).partitions) == 1
    assert grow(name, 3) == E.NONE
    assert len(env.topic_meta(name).partitions) == 3
    assert env.produce(name, 2, [b"new partition"]) == 0
    assert grow(name, 2) == E.INVALID_PARTITIONS
    assert grow(name, 3) == E.INVALID_PARTITIONS
    assert grow(f"mx-nosuch-{uuid.uuid4().hex[:8]}", 2) == E.UNKNOWN_TOPIC_OR_PARTITION


@case(K.DELETE_RECORDS)
def case_delete_records(env: Env, v: int):
    name, _ = env.new_topic(f"dr{v}")
    compacted, _ = env.new_topic(f"drc{v}", configs={"cleanup.policy": "compact"})
    env.produce(name, 0, [b"%d" % i for i in range(5)])

    def delete(offset, topic=name, partition=0):
        r = env.call(K.DELETE_RECORDS, v, dr.DeleteRecordsRequest(topics=[dr.DeleteRecordsTopic(
            name=topic, partitions=[dr.DeleteRecordsPartition(partition_index=partition, offset=offset)])],
            timeout_ms=10000))
        (t,) = r.topics
        (p,) = t.partitions
        assert (t.name, p.partition_index) == (topic, partition)
        return p.error_code, p.low_watermark

    assert delete(3) == (E.NONE, 3)
    assert env.list_offset(name, 0, -2).offset == 3
    assert env.fetch_values(name, 0, 3) == [b"3", b"4"]
    assert delete(-1) == (E.NONE, 5)  # -1: up to the high watermark
    assert delete(9)[0] == E.OFFSET_OUT_OF_RANGE
    assert delete(0, partition=2)[0] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert delete(-1, topic=compacted)[0] == E.POLICY_VIOLATION


def _describe_configs(env, v, resources, **kw):
    req = dcf.DescribeConfigsRequest(resources=[dcf.DescribeConfigsResource(
        resource_type=t, resource_name=n, configuration_keys=keys) for t, n, keys in resources])
    if v >= 1:
        req.include_synonyms = kw.get("synonyms", False)
    if v >= 3:
        req.include_documentation = kw.get("docs", False)
    return env.call(K.DESCRIBE_CONFIGS, v, req).results


def topic_configs(env, name) -> dict:
    (res,) = _describe_configs(env, env.top(K.DESCRIBE_CONFIGS), [(2, name, None)])
    assert res.error_code == E.NONE, res
    return {c.name: c for c in res.configs}


@case(K.DESCRIBE_CONFIGS)
def case_describe_configs(env: Env, v: int):
    name, _ = env.new_topic(f"dc{v}", configs={"retention.ms": "3600000"})
    (res,) = _describe_configs(env, v, [(2, name, None)], synonyms=True, docs=True)
    assert (res.error_code, res.resource_type, res.resource_name) == (E.NONE, 2, name)
    cfg = {c.name: c for c in res.configs}
    ret, pol = cfg["retention.ms"], cfg["cleanup.policy"]
    assert (ret.value, ret.read_only, ret.is_sensitive) == ("3600000", False, False)
    assert pol.value == "delete"
    if v == 0:
        assert (ret.is_default, pol.is_default) == (False, True)
    else:
        assert (ret.config_source, pol.config_source) == (1, 5)  # DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG
        assert (ret.synonyms[0].name, ret.synonyms[0].source) == ("retention.ms", 1)
        # Kafka's ConfigHelper.configSynonyms: broker synonyms from the topic key's own broker name on
        # (retention.ms -> log.retention.ms, unset with no default, so log.retention.hours is dropped)
        assert [(s.name, s.source) for s in ret.synonyms] == [("retention.ms", 1)]
        assert [(s.name, s.value, s.source) for s in pol.synonyms] == [("log.cleanup.policy", "delete", 5)]
    if v >= 3:
        assert ret.config_type == 5 and ret.documentation  # LONG
    (res,) = _describe_configs(env, v, [(2, name, ["retention.ms"])])
    assert [c.name for c in res.configs] == ["retention.ms"]
    if v >= 1:
        assert res.configs[0].synonyms == []  # not asked for
    (res,) = _describe_configs(env, v, [(4, str(env.node_id), ["num.partitions"])])
    assert res.error_code == E.NONE and [(c.name, c.value) for c in res.configs] == [("num.partitions", "1")]
    (res,) = _describe_configs(env, v, [(2, f"mx-nosuch-{uuid.uuid4().hex[:8]}", None)])
    assert res.error_code == E.UNKNOWN_TOPIC_OR_PARTITION


@case(K.ALTER_CONFIGS)
def case_alter_configs(env: Env, v: int):
    name, _ = env.new_topic(f"ac{v}")

    def alter(configs, topic=name, validate_only=False):
        r = env.call(K.ALTER_CONFIGS, v, ac.AlterConfigsRequest(resources=[ac.AlterConfigsResource(
            resource_type=2, resource_name=topic,
            configs=[ac.AlterableConfig(name=k, value=val) for k, val in configs.items()])],
            validate_only=validate_only))
        (res,) = r.responses
        assert (res.resource_type, res.resource_name) == (2, topic)
        return res.error_code

    assert alter({"retention.ms": "7200000"}) == E.NONE
    c = topic_configs(env, name)["retention.ms"]
    assert (c.value, c.config_source) == ("7200000", 1)
    assert alter({"retention.ms": "60000"}, validate_only=True) == E.NONE
    assert topic_configs(env, name)["retention.ms"].value == "7200000"
    assert alter({"retention.ms": "soon"}) == E.INVALID_CONFIG
    # the legacy API replaces the whole override set
    assert alter({"max.message.bytes": "20000"}) == E.NONE
    cfg = topic_configs(env, name)
    assert (cfg["retention.ms"].value, cfg["retention.ms"].config_source) == ("604800000", 5)
    assert cfg["max.message.bytes"].value == "20000"
    assert alter({"retention.ms": "1"}, topic=f"mx-nosuch-{uuid.uuid4().hex[:8]}") == E.UNKNOWN_TOPIC_OR_PARTITION


@case(K.INCREMENTAL_ALTER_CONFIGS)
def case_incremental_alter_configs(env: Env, v: int):
    name, _ = env.new_topic(f"iac{v}")
    SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

    def alter(ops, topic=name, validate_only=False):
        r = env.call(K.INCREMENTAL_ALTER_CONFIGS, v, iac.IncrementalAlterConfigsRequest(resources=[
            iac.AlterConfigsResource(resource_type=2, resource_name=topic, configs=[
                iac.AlterableConfig(name=k, config_operation=op, value=val) for k, op, val in ops])],
            validate_only=validate_only))
        (res,) = r.responses
        assert (res.resource_type, res.resource_name) == (2, topic)
        return res.error_code

    assert alter([("retention.ms", SET, "7200000"), ("max.message.bytes", SET, "20000")]) == E.NONE
    assert topic_configs(env, name)["retention.ms"].value == "7200000"
    assert alter([("retention.ms", DELETE, None)]) == E.NONE
    cfg = topic_configs(env, name)
    assert cfg["retention.ms"].value == "604800000" and cfg["max.message.bytes"].value == "20000"
    assert alter([("cleanup.policy", APPEND, "compact")]) == E.NONE
    assert topic_configs(env, name)["cleanup.policy"].value == "delete,compact"
    assert alter([("cleanup.policy", SUBTRACT, "delete")]) == E.NONE
    assert topic_configs(env, name)["cleanup.policy"].value == "compact"
    assert alter([("retention.ms", SET, "1000")], validate_only=True) == E.NONE
    assert topic_configs(env, name)["retention.ms"].value == "604800000"
    assert alter([("retention.ms", SET, "soon")]) == E.INVALID_CONFIG
    assert alter([("retention.ms", 9, "1")]) == E.INVALID_REQUEST
    assert alter([("retention.ms", APPEND, "1")]) == E.INVALID_CONFIG  # not a LIST config
    assert alter([("retention.ms", SET, "1")], topic=f"mx-nosuch-{uuid.uuid4().hex[:8]}") \
        == E.UNKNOWN_TOPIC_OR_PARTITION


@case(K.DESCRIBE_CLUSTER)
def case_describe_cluster(env: Env, v: int):
    r = env.call(K.DESCRIBE_CLUSTER, v, dc.DescribeClusterRequest(include_cluster_authorized_operations=True))
    assert (r.error_code, r.cluster_id, r.controller_id) == (E.NONE, env.cluster_id, env.node_id)
    assert [(b.broker_id, b.host, b.port) for b in r.brokers] == [(env.node_id, "127.0.0.1", env.broker.port)]
    assert r.cluster_authorized_operations not in (NOT_REQUESTED, 0)
    r = env.call(K.DESCRIBE_CLUSTER, v, dc.DescribeClusterRequest())
    assert r.cluster_authorized_operations == NOT_REQUESTED
    if v >= 1:
        assert r.endpoint_type == 1  # BROKER
        r = env.call(K.DESCRIBE_CLUSTER, v, dc.DescribeClusterRequest(endpoint_type=2))
        assert r.error_code == E.MISMATCHED_ENDPOINT_TYPE and r.error_message


@case(K.DESCRIBE_LOG_DIRS)
def case_describe_log_dirs(env: Env, v: int):
    name, _ = env.new_topic(f"dld{v}")
    env.produce(name, 0, [b"x" * 100])

    def describe(topics):
        r = env.call(K.DESCRIBE_LOG_DIRS, v, dld.DescribeLogDirsRequest(topics=topics))
        if v >= 3:
            assert r.error_code == E.NONE
        assert r.results and all(d.error_code == E.NONE and d.log_dir for d in r.results)
        if v >= 4:
            assert all(d.total_bytes > 0 and 0 <= d.usable_bytes <= d.total_bytes for d in r.results)
        return {(t.name, p.partition_index): p for d in r.results for t in d.topics for p in t.partitions}

    parts = describe(None)
    assert parts[(name, 0)].partition_size > 100 and parts[(name, 0)].is_future_key is False
    assert list(describe([dld.DescribableLogDirTopic(topic=name, partitions=[0])])) == [(name, 0)]
    assert describe([]) == {}


# groups ------------------------------------------------------------------------------------------

@case(K.FIND_COORDINATOR)
def case_find_coordinator(env: Env, v: int):
    me = (env.node_id, "127.0.0.1", env.broker.port)
    if v <= 3:
        r = env.call(K.FIND_COORDINATOR, v, fc.FindCoordinatorRequest(key=gname("fc")))
        assert (r.error_code, (r.node_id, r.host, r.port)) == (E.NONE, me)
        if v >= 1:
            r = env.call(K.FIND_COORDINATOR, v, fc.FindCoordinatorRequest(key="g", key_type=9))
            assert r.error_code == E.INVALID_REQUEST
            r = env.call(K.FIND_COORDINATOR, v, fc.FindCoordinatorRequest(key=gname("fctx"), key_type=1))
            assert (r.error_code, (r.node_id, r.host, r.port)) == (E.NONE, me)  # the transaction coordinator
    else:
        keys = [gname("fc1"), gname("fc2")]
        r = env.call(K.FIND_COORDINATOR, v, fc.FindCoordinatorRequest(key_type=0, coordinator_keys=keys))
        assert sorted(c.key for c in r.coordinators) == sorted(keys)
        assert all((c.error_code, (c.node_id, c.host, c.port)) == (E.NONE, me) for c in r.coordinators)
        r = env.call(K.FIND_COORDINATOR, v, fc.FindCoordinatorRequest(key_type=1, coordinator_keys=keys))
        assert all((c.error_code, (c.node_id, c.host, c.port)) == (E.NONE, me) for c in r.coordinators)


@case(K.JOIN_GROUP)
def case_join_group(env: Env, v: int):
    group = gname(f"jg{v}")
    r = env.call(K.JOIN_GROUP, v, join_request(group, "", "consumer", "range", b"meta", 10000, v))
    if v >= 4:  # KIP-394: a new member must rejoin with the id it is given
        assert (r.error_code, r.generation_id) == (E.MEMBER_ID_REQUIRED, -1) and r.member_id, r
        r = env.call(K.JOIN_GROUP, v, join_request(group, r.member_id, "consumer", "range", b"meta", 10000, v))
    assert r.error_code == E.NONE, r
    assert r.generation_id == 1 and r.leader == r.member_id and r.protocol_name == "range"
    assert [(m.member_id, bytes(m.metadata)) for m in r.members] == [(r.member_id, b"meta")]
    if v >= 7:
        assert r.protocol_type == "consumer"
    if v >= 2:
        assert r.throttle_time_ms == 0
    other = env.call(K.JOIN_GROUP, v, join_request(group, "", "connect", "x", b"", 10000, v))
    assert other.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    small = env.call(K.JOIN_GROUP, v, join_request(gname("jgs"), "", "consumer", "range", b"", 1, v))
    assert small.error_code == E.INVALID_SESSION_TIMEOUT  # below group.min.session.timeout.ms
    env.leave(group, r.member_id)


@case(K.SYNC_GROUP)
def case_sync_group(env: Env, v: int):
    group = gname(f"sg{v}")
    j = env.join(group)
    assert j.error_code == E.NONE
    bad = env.call(K.SYNC_GROUP, v, sync_request(group, j.generation_id + 1, j.member_id, v))
    assert bad.error_code == E.ILLEGAL_GENERATION
    bad = env.call(K.SYNC_GROUP, v, sync_request(group, j.generation_id, "nobody", v))
    assert bad.error_code == E.UNKNOWN_MEMBER_ID
    if v >= 5:
        bad = env.call(K.SYNC_GROUP, v, sync_request(group, j.generation_id, j.member_id, v, protocol="roundrobin"))
        assert bad.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    r = env.call(K.SYNC_GROUP, v, sync_request(group, j.generation_id, j.member_id, v, [(j.member_id, b"assign")]))
    assert (r.error_code, bytes(r.assignment)) == (E.NONE, b"assign")
    if v >= 5:
        assert (r.protocol_type, r.protocol_name) == ("consumer", "range")
    env.leave(group, j.member_id)


@case(K.HEARTBEAT)
def case_heartbeat(env: Env, v: int):
    group = gname(f"hb{v}")
    member, gen = env.join_and_sync(group)

    def beat(generation, member_id):
        r = env.call(K.HEARTBEAT, v, hb.HeartbeatRequest(group_id=group, generation_id=generation, member_id=member_id))
        return r.error_code

    assert beat(gen, member) == E.NONE
    assert beat(gen + 1, member) == E.ILLEGAL_GENERATION
    assert beat(gen, "nobody") == E.UNKNOWN_MEMBER_ID
    env.leave(group, member)


@case(K.LEAVE_GROUP)
def case_leave_group(env: Env, v: int):
    group = gname(f"lg{v}")
    member, _ = env.join_and_sync(group)
    r = env.call(K.LEAVE_GROUP, v, leave_request(group, member, v))
    assert r.error_code == E.NONE
    if v >= 3:
        assert [(m.member_id, m.error_code) for m in r.members] == [(member, E.NONE)]
    d = env.call(K.DESCRIBE_GROUPS, env.top(K.DESCRIBE_GROUPS), dgr.DescribeGroupsRequest(groups=[group]))
    assert (d.groups[0].group_state, d.groups[0].members) == ("Empty", [])
    r = env.call(K.LEAVE_GROUP, v, leave_request(group, member, v))
    if v >= 3:
        assert r.error_code == E.NONE and [m.error_code for m in r.members] == [E.UNKNOWN_MEMBER_ID]
    else:
        assert r.error_code == E.UNKNOWN_MEMBER_ID


@case(K.OFFSET_COMMIT)
def case_offset_commit(env: Env, v: int):
    name, _ = env.new_topic(f"oc{v}", partitions=2)
    group = gname(f"oc{v}")

    def commit(offsets, generation=-1, member=""):
        req = oc.OffsetCommitRequest(group_id=group, topics=[oc.OffsetCommitRequestTopic(name=t, partitions=[
            oc.OffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_metadata="m")
            for p, o in ps.items()]) for t, ps in offsets.items()])
        if v >= 1:
            req.generation_id_or_member_epoch, req.member_id = generation, member
        r = env.call(K.OFFSET_COMMIT, v, req)
        return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}

    res = commit({name: {0: 5, 1: 7}, "mx-nosuch-topic-x": {0: 1}})
    # Kafka's KRaft brokers refuse v0 (it meant "store in ZooKeeper"); kbroker stores it in the coordinator
    if v == 0 and res[(name, 0)] == E.UNSUPPORTED_VERSION:
        return
    assert res == {(name, 0): E.NONE, (name, 1): E.NONE, ("mx-nosuch-topic-x", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert env.committed(group, name, [0, 1]) == {0: 5, 1: 7}
    if v >= 1:  # a member of an active generation
        member, gen = env.join_and_sync(group)
        assert commit({name: {0: 9}}, gen, member) == {(name, 0): E.NONE}
        assert commit({name: {0: 10}}, gen + 1, member) == {(name, 0): E.ILLEGAL_GENERATION}
        assert commit({name: {0: 11}}, gen, "nobody") == {(name, 0): E.UNKNOWN_MEMBER_ID}
        assert env.committed(group, name, [0]) == {0: 9}
        env.leave(group, member)


@case(K.OFFSET_FETCH)
def case_offset_fetch(env: Env, v: int):
    name, _ = env.new_topic(f"of{v}", partitions=2)
    group, empty_group = gname(f"of{v}"), gname(f"ofe{v}")
    env.commit(group, name, {0: 5}, metadata="meta")

    def check(parts):
        assert {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in parts} == {
            0: (5, "meta", E.NONE), 1: (-1, "", E.NONE)}
        if v >= 5:
            assert all(p.committed_leader_epoch == -1 for p in parts)

    if v >= 8:
        r = env.call(K.OFFSET_FETCH, v, of.OffsetFetchRequest(require_stable=True, groups=[
            of.OffsetFetchRequestGroup(group_id=group, topics=[of.OffsetFetchRequestTopics(
                name=name, partition_indexes=[0, 1])]),
            of.OffsetFetchRequestGroup(group_id=empty_group, topics=None)]))
        g = {x.group_id: x for x in r.groups}
        assert set(g) == {group, empty_group} and g[group].error_code == E.NONE
        (t,) = g[group].topics
        check(t.partitions)
        assert (g[empty_group].error_code, g[empty_group].topics) == (E.NONE, [])
        r = env.call(K.OFFSET_FETCH, v, of.OffsetFetchRequest(groups=[of.OffsetFetchRequestGroup(
            group_id=group, topics=None)]))
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in r.groups[0].topics] == [(name, [(0, 5)])]
        return
    req = of.OffsetFetchRequest(group_id=group, topics=[of.OffsetFetchRequestTopic(name=name, partition_indexes=[0, 1])])
    if v >= 7:
        req.require_stable = True
    r = env.call(K.OFFSET_FETCH, v, req)
    (t,) = r.topics
    if v == 0 and t.partitions[0].error_code == E.UNSUPPORTED_VERSION:
        return  # Kafka's KRaft brokers refuse v0 (ZooKeeper offsets); kbroker reads the coordinator
    check(t.partitions)
    if v >= 2:
        assert r.error_code == E.NONE
        r = env.call(K.OFFSET_FETCH, v, of.OffsetFetchRequest(group_id=group, topics=None))  # all topics
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in r.topics] == [(name, [(0, 5)])]


@case(K.DESCRIBE_GROUPS)
def case_describe_groups(env: Env, v: int):
    group, ghost = gname(f"dg{v}"), gname(f"dgx{v}")
    member, gen = env.join_and_sync(group, assignment=b"assign")
    req = dgr.DescribeGroupsRequest(groups=[group, ghost])
    if v >= 3:
        req.include_authorized_operations = True
    r = env.call(K.DESCRIBE_GROUPS, v, req)
    g = {x.group_id: x for x in r.groups}
    d = g[group]
    assert (d.error_code, d.group_state, d.protocol_type, d.protocol_data) == (E.NONE, "Stable", "consumer", "range")
    (m,) = d.members
    assert (m.member_id, m.client_id, bytes(m.member_metadata), bytes(m.member_assignment)) == (
        member, CLIENT_ID, b"meta", b"assign")
    assert m.client_host
    if v >= 3:
        assert d.authorized_operations not in (NOT_REQUESTED, 0)
    x = g[ghost]
    assert (x.error_code, x.group_state) in ((E.NONE, "Dead"), (E.GROUP_ID_NOT_FOUND, "Dead"),
                                             (E.GROUP_ID_NOT_FOUND, "")), x
    env.leave(group, member)


@case(K.LIST_GROUPS)
def case_list_groups(env: Env, v: int):
    group = gname(f"lgr{v}")
    member, _ = env.join_and_sync(group)

    def listed(**kw):
        r = env.call(K.LIST_GROUPS, v, lgr.ListGroupsRequest(**kw))
        assert r.error_code == E.NONE
        return {g.group_id: g for g in r.groups}

    g = listed()[group]
    assert g.protocol_type == "consumer"
    if v >= 4:
        assert g.group_state == "Stable"
        assert group in listed(states_filter=["Stable"]) and group not in listed(states_filter=["Empty"])
    if v >= 5:
        assert g.group_type == "classic"
        assert group in listed(types_filter=["classic"]) and group not in listed(types_filter=["consumer"])
    env.leave(group, member)


@case(K.DELETE_GROUPS)
def case_delete_groups(env: Env, v: int):
    name, _ = env.new_topic(f"dgs{v}")
    busy, idle, ghost = gname(f"dgb{v}"), gname(f"dgi{v}"), gname(f"dgg{v}")
    member, _ = env.join_and_sync(busy)
    env.commit(idle, name, {0: 3})
    r = env.call(K.DELETE_GROUPS, v, dg.DeleteGroupsRequest(groups_names=[busy, idle, ghost]))
    assert {x.group_id: x.error_code for x in r.results} == {
        busy: E.NON_EMPTY_GROUP, idle: E.NONE, ghost: E.GROUP_ID_NOT_FOUND}
    assert env.committed(idle, name, [0]) == {0: -1}
    env.leave(busy, member)


@case(K.OFFSET_DELETE)
def case_offset_delete(env: Env, v: int):
    name, _ = env.new_topic(f"od{v}", partitions=2)
    group = gname(f"od{v}")
    env.commit(group, name, {0: 3, 1: 4})

    def delete(g, parts):
        r = env.call(K.OFFSET_DELETE, v, od.OffsetDeleteRequest(group_id=g, topics=[od.OffsetDeleteRequestTopic(
            name=name, partitions=[od.OffsetDeleteRequestPartition(partition_index=p) for p in parts])]))
        return r.error_code, {p.partition_index: p.error_code for t in r.topics for p in t.partitions}

    assert delete(group, [0]) == (E.NONE, {0: E.NONE})
    assert env.committed(group, name, [0, 1]) == {0: -1, 1: 4}
    assert delete(gname("odx"), [0])[0] == E.GROUP_ID_NOT_FOUND


@case(K.INIT_PRODUCER_ID)
def case_init_producer_id(env: Env, v: int):
    def init():
        r = env.call(K.INIT_PRODUCER_ID, v, ipi.InitProducerIdRequest(transactional_id=None,
                                                                     transaction_timeout_ms=60000))
        assert r.error_code == E.NONE and r.producer_id >= 0 and r.producer_epoch >= 0, r
        return r.producer_id

    assert init() != init()  # an idempotent producer gets a fresh id each time
    tid = gname(f"ipt{v}")
    first = env.init_txn(tid, v)
    again = env.init_txn(tid, v)
    assert again == (first[0], first[1] + 1)  # a transactional id: same producer id, epoch bumped


def _fenced(v: int, first_version: int = 2) -> int:
    """PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH for versions before it existed."""
    return E.PRODUCER_FENCED if v >= first_version else E.INVALID_PRODUCER_EPOCH


def _add_partitions(env: Env, v: int, tid: str, pid: int, epoch: int, parts: list, verify_only: bool = False):
    """-> {(topic, partition): error} of one transaction, in the version's form."""
    by_topic: dict = {}
    for t, p in parts:
        by_topic.setdefault(t, []).append(p)
    topics = [apt.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()]
    if v < 4:
        r = env.call(K.ADD_PARTITIONS_TO_TXN, v, apt.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=topics))
        results = r.results_by_topic_v3_and_below
    else:
        r = env.call(K.ADD_PARTITIONS_TO_TXN, v, apt.AddPartitionsToTxnRequest(transactions=[
            apt.AddPartitionsToTxnTransaction(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                              verify_only=verify_only, topics=topics)]))
        assert r.error_code == E.NONE, r
        (txn,) = r.results_by_transaction
        assert txn.transactional_id == tid
        results = txn.topic_results
    return {(t.name, p.partition_index): p.partition_error_code for t in results for p in t.results_by_partition}


@case(K.ADD_PARTITIONS_TO_TXN)
def case_add_partitions_to_txn(env: Env, v: int):
    name, _ = env.new_topic(f"apt{v}", partitions=2)
    tid = gname(f"apt{v}")
    pid, epoch = env.init_txn(tid)
    if v >= 4:  # KIP-890 part 1: a partition not yet in the transaction is not verified
        assert _add_partitions(env, v, tid, pid, epoch, [(name, 0)], verify_only=True) == \
            {(name, 0): E.TRANSACTION_ABORTABLE}
    assert _add_partitions(env, v, tid, pid, epoch, [(name, 0), (name, 1)]) == \
        {(name, 0): E.NONE, (name, 1): E.NONE}
    if v >= 4:
        assert _add_partitions(env, v, tid, pid, epoch, [(name, 0)], verify_only=True) == {(name, 0): E.NONE}
    assert _add_partitions(env, v, tid, pid, epoch + 1, [(name, 0)]) == {(name, 0): _fenced(v)}
    assert _add_partitions(env, v, tid, pid + 1, epoch, [(name, 0)]) == {(name, 0): E.INVALID_PRODUCER_ID_MAPPING}
    # one unknown partition fails the whole request
    assert _add_partitions(env, v, tid, pid, epoch, [(name, 0), (name, 7)]) == \
        {(name, 0): E.OPERATION_NOT_ATTEMPTED, (name, 7): E.UNKNOWN_TOPIC_OR_PARTITION}


@case(K.ADD_OFFSETS_TO_TXN)
def case_add_offsets_to_txn(env: Env, v: int):
    tid = gname(f"aot{v}")
    pid, epoch = env.init_txn(tid)

    def add(p, e):
        return env.call(K.ADD_OFFSETS_TO_TXN, v, aot.AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=p, producer_epoch=e, group_id=gname("aotg"))).error_code

    assert add(pid, epoch) == E.NONE
    assert add(pid, epoch + 1) == _fenced(v)
    assert add(pid + 1, epoch) == E.INVALID_PRODUCER_ID_MAPPING
    (d,) = env.call(K.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(
        transactional_ids=[tid])).transaction_states
    assert d.transaction_state == "Ongoing" and [t.topic for t in d.topics] == ["__consumer_offsets"]


@case(K.END_TXN)
def case_end_txn(env: Env, v: int):
    name, _ = env.new_topic(f"et{v}")
    tid = gname(f"et{v}")
    pid, epoch = env.init_txn(tid)

    def end(p, e, commit):
        r = env.call(K.END_TXN, v, et.EndTxnRequest(transactional_id=tid, producer_id=p, producer_epoch=e,
                                                   committed=commit))
        if v >= 5 and r.error_code == E.NONE:   # transaction version 2: the epoch of the next transaction
            assert (r.producer_id, r.producer_epoch) == (pid, epoch + 1), r
        return r.error_code

    assert end(pid, epoch, True) == E.INVALID_TXN_STATE  # Empty: no transaction to end
    assert _add_partitions(env, 3, tid, pid, epoch, [(name, 0)]) == {(name, 0): E.NONE}
    assert end(pid, epoch + 1, True) == _fenced(v)
    assert end(pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
    assert end(pid, epoch, True) == E.NONE               # PrepareCommit written; the markers follow
    # a retry: CONCURRENT_TRANSACTIONS while the markers are out, NONE once complete
    assert end(pid, epoch, True) in (E.CONCURRENT_TRANSACTIONS, E.NONE)
    (d,) = env.call(K.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(
        transactional_ids=[tid])).transaction_states
    assert d.transaction_state in ("PrepareCommit", "CompleteCommit"), d


@case(K.TXN_OFFSET_COMMIT)
def case_txn_offset_commit(env: Env, v: int):
    """Runs once TXN_OFFSET_COMMIT is in EXPECTED (after the merge with the log side); until
    then its versions are checked to be refused."""
    name, _ = env.new_topic(f"toc{v}", partitions=2)
    group = gname(f"toc{v}")
    tid = gname(f"toc{v}")
    pid, epoch = env.init_txn(tid)

    def commit(p, e, offsets):
        req = toc.TxnOffsetCommitRequest(transactional_id=tid, group_id=group, producer_id=p, producer_epoch=e,
                                         topics=[toc.TxnOffsetCommitRequestTopic(name=t, partitions=[
                                             toc.TxnOffsetCommitRequestPartition(partition_index=i, committed_offset=o,
                                                                                 committed_metadata="m")
                                             for i, o in ps.items()]) for t, ps in offsets.items()])
        if v >= 3:
            req.generation_id, req.member_id = -1, ""
        r = env.call(K.TXN_OFFSET_COMMIT, v, req)
        return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}

    if v >= 5:
        # transaction version 2 (KIP-890 part 2): the commit adds the group's partition itself
        assert commit(pid, epoch, {name: {0: 5}}) == {(name, 0): E.NONE}
    else:
        # KIP-890 part 1: the group's partition must have been added to the transaction first
        not_added = E.TRANSACTION_ABORTABLE if v >= 4 else E.INVALID_TXN_STATE
        assert commit(pid, epoch, {name: {0: 5}}) == {(name, 0): not_added}
        r = env.call(K.ADD_OFFSETS_TO_TXN, 3, aot.AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group))
        assert r.error_code == E.NONE
    assert commit(pid, epoch, {name: {0: 5, 1: 6}, "mx-nosuch-topic-x": {0: 1}}) == {
        (name, 0): E.NONE, (name, 1): E.NONE, ("mx-nosuch-topic-x", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert commit(pid, epoch + 1, {name: {0: 7}}) == {(name, 0): E.INVALID_PRODUCER_EPOCH}
    # not visible before the transaction commits
    assert env.committed(group, name, [0, 1]) == {0: -1, 1: -1}


@case(K.DESCRIBE_TRANSACTIONS)
def case_describe_transactions(env: Env, v: int):
    name, _ = env.new_topic(f"dtx{v}", partitions=2)
    tid = gname(f"dtx{v}")
    pid, epoch = env.init_txn(tid, timeout_ms=45000)
    _add_partitions(env, 3, tid, pid, epoch, [(name, 1), (name, 0)])
    missing = gname("dtx-none")
    r = env.call(K.DESCRIBE_TRANSACTIONS, v, dtx.DescribeTransactionsRequest(transactional_ids=[tid, missing]))
    d, m = r.transaction_states
    assert (d.error_code, d.transactional_id, d.transaction_state, d.transaction_timeout_ms, d.producer_id,
            d.producer_epoch) == (E.NONE, tid, "Ongoing", 45000, pid, epoch)
    assert d.transaction_start_time_ms > 0
    assert [(t.topic, sorted(t.partitions)) for t in d.topics] == [(name, [0, 1])]
    assert (m.transactional_id, m.error_code) == (missing, E.TRANSACTIONAL_ID_NOT_FOUND)


@case(K.LIST_TRANSACTIONS)
def case_list_transactions(env: Env, v: int):
    name, _ = env.new_topic(f"ltx{v}")
    tid = gname(f"ltx{v}")
    pid, epoch = env.init_txn(tid)
    _add_partitions(env, 3, tid, pid, epoch, [(name, 0)])

    def listed(**kw):
        r = env.call(K.LIST_TRANSACTIONS, v, ltx.ListTransactionsRequest(**kw))
        assert r.error_code == E.NONE, r
        return r, {(t.transactional_id, t.producer_id, t.transaction_state) for t in r.transaction_states}

    r, txns = listed(state_filters=["Ongoing", "NoSuchState"], producer_id_filters=[])
    assert (tid, pid, "Ongoing") in txns and list(r.unknown_state_filters) == ["NoSuchState"]
    assert listed(state_filters=[], producer_id_filters=[pid])[1] == {(tid, pid, "Ongoing")}
    assert (tid, pid, "Ongoing") not in listed(state_filters=["Empty"], producer_id_filters=[])[1]
    if v >= 1:  # KIP-994: only transactions running longer than the duration filter
        assert listed(state_filters=[], producer_id_filters=[pid], duration_filter=3_600_000)[1] == set()
        assert listed(state_filters=[], producer_id_filters=[pid], duration_filter=0)[1] == {(tid, pid, "Ongoing")}


def _cg_heartbeat(env: Env, v: int, group: str, member_id: str, epoch: int, topics=None):
    req = cgh.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=epoch)
    if epoch == 0:  # joining: the full subscription
        req.rebalance_timeout_ms, req.subscribed_topic_names, req.topic_partitions = 30000, topics, []
    return env.call(K.CONSUMER_GROUP_HEARTBEAT, v, req)


@case(K.WRITE_TXN_MARKERS)
def case_write_txn_markers(env: Env, v: int):
    """A transactional batch (of a transaction begun at the coordinator: the leader verifies
    it, KIP-890), then its COMMIT written here as the coordinator would: the marker is
    written, the partition's last stable offset moves past it; unknown partitions answer
    per partition."""
    name, _ = env.new_topic(f"wtm{v}")
    tid = gname(f"wtm{v}")
    pid, epoch = env.init_txn(tid, timeout_ms=900000)
    assert _add_partitions(env, 3, tid, pid, epoch, [(name, 0)]) == {(name, 0): E.NONE}
    batch = rec.encode_batch([(int(time.time() * 1000), None, b"t", [])], producer_id=pid, producer_epoch=epoch,
                             base_sequence=0, is_transactional=True)
    r = env.call(K.PRODUCE, env.top(K.PRODUCE), pr.ProduceRequest(transactional_id=tid, acks=-1, timeout_ms=5000,
                 topic_data=[pr.TopicProduceData(name=name, partition_data=[
                     pr.PartitionProduceData(index=0, records=batch)])]))
    assert r.responses[0].partition_responses[0].error_code == E.NONE, r
    r = env.call(K.WRITE_TXN_MARKERS, v, wtm.WriteTxnMarkersRequest(markers=[wtm.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=True, coordinator_epoch=0,
        topics=[wtm.WritableTxnMarkerTopic(name=name, partition_indexes=[0, 9])])]))
    (m,) = r.markers
    assert m.producer_id == pid
    assert {p.partition_index: p.error_code for t in m.topics for p in t.partitions} == {
        0: E.NONE, 9: E.UNKNOWN_TOPIC_OR_PARTITION}
    assert env.list_offset(name, 0, -1).offset == 2


@case(K.CONSUMER_GROUP_HEARTBEAT)
def case_consumer_group_heartbeat(env: Env, v: int):
    """KIP-848: join with epoch 0, heartbeat until the assignment arrives, leave with epoch -1."""
    name, tid = env.new_topic(f"cgh{v}")
    group = gname(f"cgh{v}")
    mine = str(uuid.uuid4()) if v >= 1 else ""  # v1+: the client generates its member id (KIP-1082)
    r = _cg_heartbeat(env, v, group, mine, 0, [name])
    assert r.error_code == E.NONE, r
    assert r.member_id and (v == 0 or r.member_id == mine)
    assert r.member_epoch >= 1 and r.heartbeat_interval_ms > 0
    member, epoch = r.member_id, r.member_epoch
    owned = []
    deadline = time.monotonic() + 15  # the assignment comes with this or a following heartbeat
    while True:
        if r.assignment is not None:
            owned = [(t.topic_id, p) for t in r.assignment.topic_partitions for p in t.partitions]
        if owned or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        r = _cg_heartbeat(env, v, group, member, epoch)
        assert r.error_code == E.NONE, r
        epoch = r.member_epoch
    assert owned == [(tid, 0)], r
    bad = _cg_heartbeat(env, v, group, member, epoch + 5)
    assert bad.error_code == E.FENCED_MEMBER_EPOCH
    r = _cg_heartbeat(env, v, group, member, -1)  # leave
    assert (r.error_code, r.member_epoch) == (E.NONE, -1), r


@case(K.CONSUMER_GROUP_DESCRIBE)
def case_consumer_group_describe(env: Env, v: int):
    name, _ = env.new_topic(f"cgd{v}")
    group, ghost = gname(f"cgd{v}"), gname(f"cgdx{v}")
    hv = env.top(K.CONSUMER_GROUP_HEARTBEAT)
    r = _cg_heartbeat(env, hv, group, str(uuid.uuid4()) if hv >= 1 else "", 0, [name])
    assert r.error_code == E.NONE, r
    d = env.call(K.CONSUMER_GROUP_DESCRIBE, v, cgd.ConsumerGroupDescribeRequest(
        group_ids=[group, ghost], include_authorized_operations=True))
    g = {x.group_id: x for x in d.groups}
    assert g[group].error_code == E.NONE and g[group].group_epoch >= 1, g[group]
    (m,) = g[group].members
    assert (m.member_id, m.client_id, m.subscribed_topic_names) == (r.member_id, CLIENT_ID, [name])
    assert g[group].authorized_operations not in (NOT_REQUESTED, 0)
    assert g[ghost].error_code == E.GROUP_ID_NOT_FOUND
    _cg_heartbeat(env, hv, group, r.member_id, -1)


@case(K.SASL_HANDSHAKE)
def case_sasl_handshake(env: Env, v: int):
    # a PLAINTEXT listener: Kafka's KafkaApis answers ILLEGAL_SASL_STATE
    r = env.call(K.SASL_HANDSHAKE, v, sh.SaslHandshakeRequest(mechanism="PLAIN"))
    assert r.error_code == E.ILLEGAL_SASL_STATE, r


@case(K.SASL_AUTHENTICATE)
def case_sasl_authenticate(env: Env, v: int):
    r = env.call(K.SASL_AUTHENTICATE, v, sa.SaslAuthenticateRequest(auth_bytes=b"\0u\0p"))
    assert r.error_code == E.ILLEGAL_SASL_STATE and r.error_message, r


@case(K.ALTER_USER_SCRAM_CREDENTIALS)
def case_alter_user_scram_credentials(env: Env, v: int):
    user = f"mx-user-{uuid.uuid4().hex[:8]}"
    r = env.call(K.ALTER_USER_SCRAM_CREDENTIALS, v, auc.AlterUserScramCredentialsRequest(
        deletions=[auc.ScramCredentialDeletion(name="nobody-" + user, mechanism=1)],
        upsertions=[auc.ScramCredentialUpsertion(name=user, mechanism=2, iterations=4096, salt=b"s" * 16,
                                                 salted_password=b"p" * 64),
                    auc.ScramCredentialUpsertion(name="few-" + user, mechanism=1, iterations=10, salt=b"s",
                                                 salted_password=b"p" * 32)]))
    got = {x.user: x.error_code for x in r.results}
    assert got == {"nobody-" + user: E.RESOURCE_NOT_FOUND, user: E.NONE,
                   "few-" + user: E.UNACCEPTABLE_CREDENTIAL}, r
    up = auc.ScramCredentialUpsertion(name="dup-" + user, mechanism=1, iterations=4096, salt=b"s",
                                      salted_password=b"p" * 32)
    r = env.call(K.ALTER_USER_SCRAM_CREDENTIALS, v, auc.AlterUserScramCredentialsRequest(
        deletions=[], upsertions=[up, up]))
    assert [(x.user, x.error_code) for x in r.results] == [("dup-" + user, E.DUPLICATE_RESOURCE)], r


@case(K.DESCRIBE_USER_SCRAM_CREDENTIALS)
def case_describe_user_scram_credentials(env: Env, v: int):
    user = f"mx-user-{uuid.uuid4().hex[:8]}"
    env.call(K.ALTER_USER_SCRAM_CREDENTIALS, 0, auc.AlterUserScramCredentialsRequest(
        deletions=[], upsertions=[auc.ScramCredentialUpsertion(name=user, mechanism=1, iterations=8192,
                                                               salt=b"s" * 16, salted_password=b"p" * 32)]))
    r = env.call(K.DESCRIBE_USER_SCRAM_CREDENTIALS, v, duc.DescribeUserScramCredentialsRequest(
        users=[duc.UserName(name=user), duc.UserName(name="ghost-" + user)]))
    got = {x.user: x for x in r.results}
    assert got[user].error_code == E.NONE
    assert [(c.mechanism, c.iterations) for c in got[user].credential_infos] == [(1, 8192)]
    assert got["ghost-" + user].error_code == E.RESOURCE_NOT_FOUND


@case(K.ALTER_CLIENT_QUOTAS)
def case_alter_client_quotas(env: Env, v: int):
    client = f"mx-quota-{uuid.uuid4().hex[:8]}"
    ent = [acq.AlterClientQuotasRequestEntityData(entity_type="client-id", entity_name=client)]
    r = env.call(K.ALTER_CLIENT_QUOTAS, v, acq.AlterClientQuotasRequest(entries=[
        acq.AlterClientQuotasRequestEntryData(entity=ent, ops=[
            acq.OpData(key="producer_byte_rate", value=1e9, remove=False)]),
        acq.AlterClientQuotasRequestEntryData(
            entity=[acq.AlterClientQuotasRequestEntityData(entity_type="user", entity_name=client)],
            ops=[acq.OpData(key="producer_byte_rate", value=1.5, remove=False)]),
        acq.AlterClientQuotasRequestEntryData(
            entity=[acq.AlterClientQuotasRequestEntityData(entity_type="ip", entity_name="127.0.0.1")],
            ops=[acq.OpData(key="producer_byte_rate", value=10.0, remove=False)])], validate_only=False))
    assert [(e.error_code, e.entity[0].entity_type) for e in r.entries] == [
        (E.NONE, "client-id"), (E.INVALID_REQUEST, "user"), (E.INVALID_REQUEST, "ip")], r
    assert "fractional" in r.entries[1].error_message and "Invalid configuration key" in r.entries[2].error_message
    r = env.call(K.ALTER_CLIENT_QUOTAS, v, acq.AlterClientQuotasRequest(entries=[
        acq.AlterClientQuotasRequestEntryData(entity=ent, ops=[
            acq.OpData(key="producer_byte_rate", value=0.0, remove=True)])], validate_only=False))
    assert r.entries[0].error_code == E.NONE, r


@case(K.DESCRIBE_CLIENT_QUOTAS)
def case_describe_client_quotas(env: Env, v: int):
    client = f"mx-quota-{uuid.uuid4().hex[:8]}"
    env.call(K.ALTER_CLIENT_QUOTAS, 0, acq.AlterClientQuotasRequest(entries=[
        acq.AlterClientQuotasRequestEntryData(
            entity=[acq.AlterClientQuotasRequestEntityData(entity_type="client-id", entity_name=client)],
            ops=[acq.OpData(key="consumer_byte_rate", value=1e9, remove=False)])], validate_only=False))
    r = env.call(K.DESCRIBE_CLIENT_QUOTAS, v, dcq.DescribeClientQuotasRequest(components=[
        dcq.ComponentData(entity_type="client-id", match_type=0, match=client)], strict=True))
    assert r.error_code == E.NONE, r
    assert [([(e.entity_type, e.entity_name) for e in x.entity], [(q.key, q.value) for q in x.values])
            for x in r.entries] == [([("client-id", client)], [("consumer_byte_rate", 1e9)])], r
    r = env.call(K.DESCRIBE_CLIENT_QUOTAS, v, dcq.DescribeClientQuotasRequest(components=[
        dcq.ComponentData(entity_type="group", match_type=2, match=None)], strict=False))
    assert r.error_code == E.UNSUPPORTED_VERSION and r.error_message, r
    env.call(K.ALTER_CLIENT_QUOTAS, 0, acq.AlterClientQuotasRequest(entries=[
        acq.AlterClientQuotasRequestEntryData(
            entity=[acq.AlterClientQuotasRequestEntityData(entity_type="client-id", entity_name=client)],
            ops=[acq.OpData(key="consumer_byte_rate", value=0.0, remove=True)])], validate_only=False))


# The matrix broker has no authorizer (authorizer.class.name empty, Kafka's default): every ACL
# API answers SECURITY_DISABLED (tests/security/test_acls.py covers them with one).
@case(K.DESCRIBE_ACLS)
def case_describe_acls(env: Env, v: int):
    from kbroker.protocol.messages import describe_acls as dsa
    r = env.call(K.DESCRIBE_ACLS, v, dsa.DescribeAclsRequest(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=3, principal_filter=None,
        host_filter=None, operation=1, permission_type=1))
    assert r.error_code == E.SECURITY_DISABLED and r.resources == []


@case(K.CREATE_ACLS)
def case_create_acls(env: Env, v: int):
    from kbroker.protocol.messages import create_acls as ca
    r = env.call(K.CREATE_ACLS, v, ca.CreateAclsRequest(creations=[ca.AclCreation(
        resource_type=2, resource_name="t", resource_pattern_type=3, principal="User:x", host="*",
        operation=3, permission_type=3)]))
    assert [x.error_code for x in r.results] == [E.SECURITY_DISABLED]


@case(K.DELETE_ACLS)
def case_delete_acls(env: Env, v: int):
    from kbroker.protocol.messages import delete_acls as da
    r = env.call(K.DELETE_ACLS, v, da.DeleteAclsRequest(filters=[da.DeleteAclsFilter(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=3, principal_filter=None,
        host_filter=None, operation=1, permission_type=1)]))
    assert [x.error_code for x in r.filter_results] == [E.SECURITY_DISABLED]


# -- the matrix -----------------------------------------------------------------------------------

ALL_PAIRS = [(k, ver) for k in sorted(CASES) for ver in range(API_INFO[k].min_version, API_INFO[k].max_version + 1)]


@pytest.fixture(scope="module")
def live(broker):
    """The broker's ApiVersions ranges, checked against the pinned ``EXPECTED`` table."""
    ranges = advertised(broker.port)
    assert ranges == EXPECTED, _table_diff(ranges)
    return ranges


def _table_diff(ranges: dict[int, tuple[int, int]]) -> str:
    keys = sorted(set(ranges) | set(EXPECTED))
    return "advertised vs EXPECTED: " + "; ".join(
        f"{API_INFO[k].name}: {ranges.get(k)} vs {EXPECTED.get(k)}" for k in keys if ranges.get(k) != EXPECTED.get(k))


def test_advertised_is_the_pinned_table(broker):
    ranges = advertised(broker.port)
    assert ranges == EXPECTED, _table_diff(ranges)


@pytest.fixture
def env(broker, live):
    e = Env(broker, live)
    yield e
    e.close()


def has_top_level_error_code(key: int, version: int) -> bool:
    """Does the response of ``key`` carry a top-level error_code at ``version``? (round trip)"""
    cls = API_INFO[key].response_class
    if "error_code" not in cls.__slots__:
        return False
    r = cls()
    r.error_code = E.UNSUPPORTED_VERSION
    try:
        return cls.decode(r.encode(version), version).error_code == E.UNSUPPORTED_VERSION
    except Exception:
        return False


def assert_refused(port: int, key: int, version: int) -> None:
    """UNSUPPORTED_VERSION in a response decodable at ``version``, or a closed connection;
    either way the broker keeps serving."""
    with RawClient(port) as c:
        corr = c.send(key, version, API_INFO[key].request_class())
        try:
            frame = c.read_frame(10.0)
        except ConnectionClosed:
            frame = None
        if frame is not None:
            resp = decode_exact(frame, key, version, corr)
            # a response without a top-level error code at this version would read as
            # success: Kafka closes the connection instead
            assert has_top_level_error_code(key, version), resp
            assert resp.error_code == E.UNSUPPORTED_VERSION, resp
    with RawClient(port) as c:
        assert c.api_versions(3).error_code == E.NONE


@pytest.mark.parametrize("api_key,version", ALL_PAIRS,
                         ids=[f"{API_INFO[k].name}-v{ver}" for k, ver in ALL_PAIRS])
def test_version(env, live, api_key, version):
    lo_v, hi_v = EXPECTED.get(api_key, (1, 0))
    if lo_v <= version <= hi_v:
        CASES[api_key](env, version)
    else:
        assert_refused(env.broker.port, api_key, version)


def test_every_expected_version_has_a_case():
    missing = [f"{API_INFO[k].name} v{ver}" for k, (lo_v, hi_v) in sorted(EXPECTED.items())
               for ver in range(lo_v, hi_v + 1) if (k, ver) not in ALL_PAIRS]
    assert not missing, f"supported without a conformance case: {missing}"


def test_expected_ranges_lie_within_the_spec():
    for k, (lo_v, hi_v) in EXPECTED.items():
        info = API_INFO.get(k)
        assert info is not None, f"unknown api key {k} advertised"
        assert "broker" in info.listeners, f"{info.name} is not a broker API"
        assert info.min_version <= lo_v <= hi_v <= info.max_version, (info.name, lo_v, hi_v)


def test_api_versions_is_the_same_at_every_version(broker, live):
    with RawClient(broker.port) as c:
        for ver in range(API_INFO[K.API_VERSIONS].min_version, API_INFO[K.API_VERSIONS].max_version + 1):
            r = c.api_versions(ver)
            assert {k.api_key: (k.min_version, k.max_version) for k in r.api_keys} == live


def test_api_versions_from_the_future_is_answered_as_v0(broker, live):
    # KIP-511: an unknown ApiVersions version gets a v0 response with UNSUPPORTED_VERSION and our ranges
    body = struct.pack(">hhih", K.API_VERSIONS, 99, 77, 1) + b"x" + b"\x00\x00\x00"
    with RawClient(broker.port) as c:
        c.send_bytes(struct.pack(">i", len(body)) + body)
        r = decode_exact(c.read_frame(), K.API_VERSIONS, 0, 77)
    assert r.error_code == E.UNSUPPORTED_VERSION
    assert {k.api_key: (k.min_version, k.max_version) for k in r.api_keys} == live


def test_unadvertised_api_keys_are_refused(broker, live):
    refused = []
    for k, info in sorted(API_INFO.items()):
        if k in EXPECTED:
            continue
        assert_refused(broker.port, k, info.max_version)
        refused.append(info.name)
    assert refused  # e.g. SaslHandshake, the transaction and ACL APIs


@pytest.mark.parametrize("key", [K.PRODUCE, K.FETCH, K.METADATA, K.JOIN_GROUP, K.LIST_OFFSETS])
def test_versions_beyond_the_spec_close_or_refuse(broker, live, key):
    """A version no spec knows cannot be parsed: Kafka closes the connection."""
    info = API_INFO[key]
    body = info.request_class().encode(info.max_version)
    hdr = struct.pack(">hhi", key, info.max_version + 1, 77) + struct.pack(">h", 1) + b"x"
    if info.request_flexible_min is not None:
        hdr += b"\x00"
    frame = hdr + body
    with RawClient(broker.port) as c:
        c.send_bytes(struct.pack(">i", len(frame)) + frame)
        assert c.is_closed_by_peer(5.0)
    with RawClient(broker.port) as c:
        assert c.api_versions(0).error_code == E.NONE


# -- long polling (a few versions: each waits) --------------------------------------------------------

def test_fetch_long_poll(env, live):
    lo_v, hi_v = live[K.FETCH]
    for v in sorted({lo_v, hi_v}):
        name, tid = env.new_topic(f"lp{v}")
        ids = {tid: name}
        # nothing to read: the broker holds the fetch for max_wait_ms, then answers empty
        t0 = time.monotonic()
        r = env.call(K.FETCH, v, fetch_request(v, [(name, tid, [(0, 0)])], max_wait_ms=400, min_bytes=1))
        waited = time.monotonic() - t0
        assert 0.38 <= waited < 3.0, waited
        p = fetch_parts(v, r, ids)[(name, 0)]
        assert (p.error_code, p.high_watermark, decode_records(p.records)) == (E.NONE, 0, [])
        # a produce during the wait completes the fetch early
        t0 = time.monotonic()
        corr = env.c.send(K.FETCH, v, fetch_request(v, [(name, tid, [(0, 0)])], max_wait_ms=15000, min_bytes=1))
        time.sleep(0.2)
        with RawClient(env.broker.port) as producer:
            r2 = producer.call(K.PRODUCE, env.top(K.PRODUCE), produce_request(name, 0, [b"wake"]))
            assert r2.responses[0].partition_responses[0].error_code == E.NONE
        r = env.c.recv(K.FETCH, v, corr, timeout_s=10)
        waited = time.monotonic() - t0
        assert waited < 3.0, waited
        p = fetch_parts(v, r, ids)[(name, 0)]
        assert [x.value for x in decode_records(p.records)] == [b"wake"]


# -- known defects (strict: these start failing once the broker is fixed) ---------------------------

def test_metadata_v12_by_topic_id(env, live):
    assert EXPECTED[K.METADATA][1] >= 12
    name, tid = env.new_topic("mdid")
    (t,) = env.call(K.METADATA, 12, md.MetadataRequest(topics=[md.MetadataRequestTopic(topic_id=tid, name=None)])).topics
    assert (t.error_code, t.name, t.topic_id) == (E.NONE, name, tid)


def test_list_offsets_duplicate_partition(env, live):
    name, _ = env.new_topic("lodup")
    part = lo.ListOffsetsPartition(partition_index=0, timestamp=-1)
    r = env.call(K.LIST_OFFSETS, live[K.LIST_OFFSETS][1], lo.ListOffsetsRequest(
        replica_id=-1, topics=[lo.ListOffsetsTopic(name=name, partitions=[part, part])]))
    assert [p.error_code for t in r.topics for p in t.partitions] == [E.INVALID_REQUEST]


def test_excessively_many_partitions_are_refused(env, live):
    name = f"mx-huge-{uuid.uuid4().hex[:8]}"
    r = env.call(K.CREATE_TOPICS, live[K.CREATE_TOPICS][1], ct.CreateTopicsRequest(topics=[ct.CreatableTopic(
        name=name, num_partitions=1_000_000, replication_factor=1)], timeout_ms=10000, validate_only=True))
    assert r.topics[0].error_code == E.POLICY_VIOLATION
    existing, _ = env.new_topic("huge")
    r = env.call(K.CREATE_PARTITIONS, live[K.CREATE_PARTITIONS][1], cp.CreatePartitionsRequest(
        topics=[cp.CreatePartitionsTopic(name=existing, count=1_000_000, assignments=None)], timeout_ms=10000,
        validate_only=True))
    assert r.results[0].error_code == E.POLICY_VIOLATION


def test_fetch_negative_partition_max_bytes_fails_only_that_partition(fresh_broker):
    # a broker of its own: the defect logs a traceback, which the shared broker's teardown refuses
    b = fresh_broker()
    live = advertised(b.port)
    env = Env(b, live)
    v = live[K.FETCH][1]
    name, tid = env.new_topic("negmax", partitions=2)
    env.produce(name, 0, [b"data"])  # an empty partition never reaches the log read
    env.produce(name, 1, [b"ok"])
    req = fetch_request(v, [(name, tid, [(0, 0), (1, 0)])])
    req.topics[0].partitions[0].partition_max_bytes = -1
    r = env.call(K.FETCH, v, req)
    assert r.error_code == E.NONE, r
    parts = fetch_parts(v, r, {tid: name})
    assert parts[(name, 0)].error_code == E.UNKNOWN_SERVER_ERROR
    assert [x.value for x in decode_records(parts[(name, 1)].records)] == [b"ok"]
