"""QuorumControllerHost against a scripted raft: activation after the epoch's
LeaderChange commits, answers only on commit, NOT_CONTROLLER when not active, renounce on
losing leadership and on a controller error (rebuilt from committed records, active again
once everything it appended is committed)."""
from __future__ import annotations

import uuid
from types import SimpleNamespace

from kbroker.controller.result import ControllerConfig
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import broker_registration as BR
from kbroker.protocol.messages import create_topics as CT
from kbroker.raft.replicated_log import DATA, LEADER_CHANGE, Batch
from kbroker.server.quorum_controller_host import QuorumControllerHost

CID = "MkU3OEVBNTcwNTJENDM2Qg"


class FakeRaft:
    """The part of RaftManager the host uses; appends land in ``log`` uncommitted."""

    def __init__(self):
        self.log = []                     # (offset, value bytes) appended, in order
        self.end = 0
        self.client = SimpleNamespace(is_leader=False, quorum=SimpleNamespace(state=None),
                                      log=SimpleNamespace(end_offset=0), schedule_append=self._append)
        self.timers = []

    def _append(self, epoch, records, now):
        for r in records:
            self.log.append((self.end, r))
            self.end += 1
        self.client.log.end_offset = self.end
        return self.end - 1

    def become_leader(self, epoch):
        self.client.is_leader = True
        self.client.quorum.state = SimpleNamespace(epoch_start_offset=self.end)
        self.log.append((self.end, None))    # the LeaderChangeMessage
        self.end += 1
        self.client.log.end_offset = self.end

    def now_ms(self):
        return 1000

    def submit(self, fn):
        fn()

    def submit_later(self, delay_ms, fn):
        self.timers.append(fn)


class Ctx:
    def __init__(self, key, version):
        self.api_key, self.api_version = key, version
        self.answers = []

    def respond(self, body):
        self.answers.append(body)

    def close_connection(self):
        self.answers.append("closed")


def _commit(host, raft, upto):
    """Commit every appended record below ``upto`` as one batch per record."""
    batches = []
    for off, value in raft.log:
        if host.next_commit_offset <= off < upto:
            if value is None:
                batches.append(Batch(off, 1, (b"",), LEADER_CHANGE, b""))
            else:
                batches.append(Batch(off, 1, (value,), DATA, b""))
    host.handle_commit(batches)


def _registration(broker_id):
    return BR.BrokerRegistrationRequest(
        broker_id=broker_id, cluster_id=CID, incarnation_id=uuid.uuid4(),
        listeners=[BR.Listener(name="PLAINTEXT", host="h", port=9092, security_protocol=0)],
        features=[BR.Feature(name="metadata.version", min_supported_version=1, max_supported_version=21)],
        rack=None, log_dirs=[uuid.uuid4()], previous_broker_epoch=-1)


def test_activation_commit_answers_and_renounce():
    raft = FakeRaft()
    host = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=1), seed=1)
    host.attach(raft)
    ctx = Ctx(ApiKey.BROKER_REGISTRATION, 3)
    host._on_request(ctx, _registration(4))
    assert ctx.answers[0].error_code == ErrorCode.NOT_CONTROLLER        # nobody active yet

    raft.become_leader(1)
    host.handle_leader_change(1, 1)
    assert not host.active                                              # LeaderChange not committed
    _commit(host, raft, 1)
    assert host.active and len(raft.log) == 2                           # + the bootstrap feature level
    ctx = Ctx(ApiKey.BROKER_REGISTRATION, 3)
    host._on_request(ctx, _registration(4))
    assert ctx.answers == []                                            # appended, not committed
    _commit(host, raft, raft.end)
    assert ctx.answers[0].error_code == ErrorCode.NONE and ctx.answers[0].broker_epoch == 2

    # a controller error: answered UNKNOWN_SERVER_ERROR, state rebuilt, active again at once
    def boom(req):
        raise RuntimeError("bug")
    host.controller.create_topics = boom
    ctx = Ctx(ApiKey.CREATE_TOPICS, 7)
    host._on_request(ctx, CT.CreateTopicsRequest(topics=[CT.CreatableTopic(name="t", num_partitions=1,
                                                                          replication_factor=1)]))
    assert ctx.answers[0].topics[0].error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert host.active and host.controller.create_topics is not boom
    assert 4 in host.controller.image().cluster.brokers

    # a write in flight when leadership moves: NOT_CONTROLLER (per topic), state rebuilt
    # from the committed records only
    ctx = Ctx(ApiKey.BROKER_REGISTRATION, 3)
    host._on_request(ctx, _registration(5))
    assert ctx.answers == []
    host.handle_leader_change(2, 2)
    assert ctx.answers[0].error_code == ErrorCode.NOT_CONTROLLER and not host.active
    assert 5 not in host.controller.image().cluster.brokers
    ctx = Ctx(ApiKey.CREATE_TOPICS, 7)
    host._on_request(ctx, CT.CreateTopicsRequest(topics=[CT.CreatableTopic(name="x", num_partitions=1,
                                                                          replication_factor=1)]))
    assert [t.error_code for t in ctx.answers[0].topics] == [ErrorCode.NOT_CONTROLLER]


def test_renounced_leader_waits_for_its_own_appends_before_writing_again():
    raft = FakeRaft()
    host = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=1), seed=1)
    host.attach(raft)
    raft.become_leader(1)
    host.handle_leader_change(1, 1)
    _commit(host, raft, raft.end)
    _commit(host, raft, raft.end)
    assert host.active
    ctx = Ctx(ApiKey.BROKER_REGISTRATION, 3)
    host._on_request(ctx, _registration(4))       # appended at offset 2, not committed
    host._renounce()                              # e.g. an error; still the raft leader
    assert not host.active                        # offset 2 is in the log but not committed
    _commit(host, raft, raft.end)                 # it commits: replayed, then active again
    assert host.active and 4 in host.controller.image().cluster.brokers
    assert host.controller.next_write_offset == raft.end


def test_a_new_cluster_starts_with_the_formatted_bootstrap_records():
    """The first active controller writes what `kbroker storage format` put in
    bootstrap.checkpoint (here metadata.version 3.7-IV4 = level 19), not a default."""
    from kbroker.metadata.records import FeatureLevelRecord
    from kbroker.metadata.serde import ApiMessageAndVersion, deserialize

    raft = FakeRaft()
    boot = [ApiMessageAndVersion(FeatureLevelRecord(name="metadata.version", feature_level=19), 0)]
    host = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=1), bootstrap=boot, seed=1)
    host.attach(raft)
    raft.become_leader(1)
    host.handle_leader_change(1, 1)
    _commit(host, raft, 1)
    written = [deserialize(v) for _, v in raft.log if v is not None]
    assert [(r.message.name, r.message.feature_level) for r in written] == [("metadata.version", 19)]
    assert host.controller.features.finalized["metadata.version"] == 19


def test_snapshots_replace_the_committed_records_kept_and_rebuild_the_same_controller():
    """After this node writes a snapshot the host keeps it instead of the records it covers;
    a renounce then rebuilds from snapshot + tail; a snapshot installed from the leader
    (a voter that fell behind) replaces the controller, and commits continue after it."""
    from kbroker.metadata.snapshot import encode_snapshot
    from kbroker.raft.replicated_log import OffsetAndEpoch

    raft = FakeRaft()
    host = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=1), seed=1)
    host.attach(raft)
    raft.become_leader(1)
    host.handle_leader_change(1, 1)
    _commit(host, raft, raft.end)
    _commit(host, raft, raft.end)
    for b in (4, 5):
        host._on_request(Ctx(ApiKey.BROKER_REGISTRATION, 3), _registration(b))
    _commit(host, raft, raft.end)
    before = host.controller.image()
    snap_at = host.next_commit_offset
    host.snapshot_written(OffsetAndEpoch(snap_at, 1), before.to_records())
    assert host.committed == [] and host.snapshot[0] == snap_at - 1
    ctx = Ctx(ApiKey.BROKER_REGISTRATION, 3)
    host._on_request(ctx, _registration(6))
    _commit(host, raft, raft.end)
    assert ctx.answers[0].error_code == ErrorCode.NONE
    assert [o for o, _ in host.committed] == list(range(snap_at, raft.end))
    after = host.controller.image()
    host._renounce()
    assert host.controller.image().same_state(after) and host.active

    # a follower installing a snapshot: the controller is what the snapshot holds
    other = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=2), seed=2)
    other.attach(FakeRaft())
    other.handle_load_snapshot(OffsetAndEpoch(snap_at, 1), encode_snapshot(before.to_records(), 0))
    assert other.controller.image().same_state(before) and other.next_commit_offset == snap_at
    _commit(other, raft, raft.end)
    assert other.controller.image().same_state(after)


def test_scram_credentials_from_bootstrap_and_alter_user_scram_credentials():
    """Format-time credentials (--add-scram) are written with the bootstrap records; the host
    serves AlterUserScramCredentials (answered once committed), and a node that is not the
    active controller answers NOT_CONTROLLER per user, which the broker's controller channel
    retries elsewhere."""
    from kbroker.metadata import scram_parser
    from kbroker.metadata.records import FeatureLevelRecord, UserScramCredentialRecord
    from kbroker.metadata.serde import ApiMessageAndVersion, deserialize
    from kbroker.protocol.messages import alter_user_scram_credentials as A

    boot = [ApiMessageAndVersion(FeatureLevelRecord(name="metadata.version", feature_level=21), 0),
            *scram_parser.parse(["SCRAM-SHA-512=[name=alice,password=alice-secret]"])]
    raft = FakeRaft()
    host = QuorumControllerHost(ControllerConfig(cluster_id=CID, node_id=1), bootstrap=boot, seed=1)
    host.attach(raft)
    req = A.AlterUserScramCredentialsRequest(
        deletions=[A.ScramCredentialDeletion(name="alice", mechanism=2)],
        upsertions=[A.ScramCredentialUpsertion(name="bob", mechanism=1, iterations=4096, salt=b"s",
                                               salted_password=b"p"),
                    A.ScramCredentialUpsertion(name="bob", mechanism=2, iterations=4096, salt=b"s",
                                               salted_password=b"p")])
    ctx = Ctx(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0)
    host._on_request(ctx, req)
    assert [(x.user, x.error_code) for x in ctx.answers[0].results] == [
        ("alice", ErrorCode.NOT_CONTROLLER), ("bob", ErrorCode.NOT_CONTROLLER)]
    raft.become_leader(1)
    host.handle_leader_change(1, 1)
    _commit(host, raft, 1)
    written = [deserialize(v).message for _, v in raft.log if v is not None]
    assert [type(r) for r in written] == [FeatureLevelRecord, UserScramCredentialRecord]
    assert set(host.controller.scram.credentials) == {("alice", 2)}
    ctx = Ctx(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0)
    host._on_request(ctx, req)
    assert ctx.answers == []                                            # appended, not committed
    _commit(host, raft, raft.end)
    assert [(x.user, x.error_code) for x in ctx.answers[0].results] == [
        ("alice", ErrorCode.NONE), ("bob", ErrorCode.DUPLICATE_RESOURCE)]
    assert host.controller.scram.credentials == {}
