"""`kbroker dump-log --cluster-metadata-decoder` (kafka-dump-log.sh's): __cluster_metadata
segments and KRaft .checkpoint snapshots, every record decoded, undecodable ones reported."""
import io
import json
import subprocess
import sys
import uuid

from kbroker.kernels import records
from kbroker.log.checkpoints import topic_id_from_str
from kbroker.metadata.bootstrap import control_key
from kbroker.metadata.records.partition_record import PartitionRecord
from kbroker.metadata.records.register_broker_record import (
    BrokerEndpoint,
    BrokerFeature,
    RegisterBrokerRecord,
)
from kbroker.metadata.records.topic_record import TopicRecord
from kbroker.metadata.serde import ApiMessageAndVersion, serialize
from kbroker.protocol.messages.kraft_version_record import KRaftVersionRecord
from kbroker.protocol.messages.leader_change_message import LeaderChangeMessage, Voter as LCVoter
from kbroker.protocol.messages.voters_record import Endpoint, KRaftVersionFeature, Voter, VotersRecord
from kbroker.tools import dump_log

TS = 1_700_000_000_000
TOPIC_ID = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")    # a6e4EJ2tEdGAtADAT9QwyA
DIR_ID = topic_id_from_str("J8aAPcfLQt2bqs1JT_rMgQ")


def _control(offset, ctype, message, epoch=3):
    return records.encode_batch([(TS, control_key(ctype), message.encode(0), ())], base_offset=offset,
                                partition_leader_epoch=epoch, is_control=True)


def _data(offset, values, epoch=3):
    return records.encode_batch([(TS, None, v, ()) for v in values], base_offset=offset,
                                partition_leader_epoch=epoch)


def _segment(tmp_path):
    """A hand-built __cluster_metadata-0 segment: the leader's control records, then metadata
    records, one of them garbage."""
    leader_change = LeaderChangeMessage(version=0, leader_id=1, voters=[LCVoter(voter_id=1)],
                                        granting_voters=[LCVoter(voter_id=1)])
    voters = VotersRecord(version=0, voters=[Voter(
        voter_id=1, voter_directory_id=DIR_ID, endpoints=[Endpoint(name="CONTROLLER", host="localhost", port=9093)],
        kraft_version_feature=KRaftVersionFeature(min_supported_version=0, max_supported_version=1))])
    broker = RegisterBrokerRecord(
        broker_id=1, incarnation_id=TOPIC_ID, broker_epoch=5,
        end_points=[BrokerEndpoint(name="PLAINTEXT", host="localhost", port=9092, security_protocol=0)],
        features=[BrokerFeature(name="metadata.version", min_supported_version=1, max_supported_version=21)],
        rack=None, fenced=True, log_dirs=[DIR_ID])
    data = b"".join([
        _control(0, 2, leader_change),
        _control(1, 5, KRaftVersionRecord(version=0, kraft_version=1)),
        _control(2, 6, voters),
        _data(3, [serialize(ApiMessageAndVersion(broker, 3)),
                  serialize(ApiMessageAndVersion(TopicRecord(name="demo", topic_id=TOPIC_ID), 0)),
                  serialize(ApiMessageAndVersion(PartitionRecord(
                      partition_id=0, topic_id=TOPIC_ID, replicas=[1], isr=[1], leader=1, leader_epoch=0,
                      partition_epoch=0, directories=[DIR_ID]), 1)),
                  b"\x01\x63\x00garbage", b"\x01\x02\x00"]),
    ])
    d = tmp_path / "__cluster_metadata-0"
    d.mkdir()
    path = d / "00000000000000000000.log"
    path.write_bytes(data)
    return str(path)


def _payloads(text):
    return [line.split(" payload: ", 1)[1] for line in text.splitlines() if " payload: " in line]


def test_metadata_segment_every_record_decoded(tmp_path):
    path = _segment(tmp_path)
    out = io.StringIO()
    assert dump_log.main(["--cluster-metadata-decoder", "--files", path], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == [f"Dumping {path}", "Log starting offset: 0"]
    assert lines[2].startswith("baseOffset: 0 lastOffset: 0 count: 1 ") and " isControl: true " in lines[2]
    assert lines[3].startswith(f"| offset: 0 CreateTime: {TS} keySize: 4 valueSize: ")
    assert ' LeaderChange {"version":0,"leaderId":1,"voters":[{"voterId":1}],"grantingVoters":[{"voterId":1}]}' \
        in lines[3]
    assert lines[5].endswith(' KRaftVersion {"version":0,"kRaftVersion":1}')
    assert lines[7].endswith(
        ' KRaftVoters {"version":0,"voters":[{"voterId":1,"voterDirectoryId":"J8aAPcfLQt2bqs1JT_rMgQ",'
        '"endpoints":[{"name":"CONTROLLER","host":"localhost","port":9093}],'
        '"kRaftVersionFeature":{"minSupportedVersion":0,"maxSupportedVersion":1}}]}')
    payloads = _payloads(out.getvalue())
    assert len(payloads) == 5
    assert json.loads(payloads[0]) == {"type": "REGISTER_BROKER_RECORD", "version": 3, "data": {
        "brokerId": 1, "isMigratingZkBroker": False, "incarnationId": "a6e4EJ2tEdGAtADAT9QwyA", "brokerEpoch": 5,
        "endPoints": [{"name": "PLAINTEXT", "host": "localhost", "port": 9092, "securityProtocol": 0}],
        "features": [{"name": "metadata.version", "minSupportedVersion": 1, "maxSupportedVersion": 21}],
        "rack": None, "fenced": True, "inControlledShutdown": False, "logDirs": ["J8aAPcfLQt2bqs1JT_rMgQ"]}}
    assert payloads[1] == ('{"type":"TOPIC_RECORD","version":0,"data":{"name":"demo",'
                           '"topicId":"a6e4EJ2tEdGAtADAT9QwyA"}}')
    # tagged fields at their default (leaderRecoveryState 0, the ELR lists) are left out, as Kafka does
    assert payloads[2] == ('{"type":"PARTITION_RECORD","version":1,"data":{"partitionId":0,'
                           '"topicId":"a6e4EJ2tEdGAtADAT9QwyA","replicas":[1],"isr":[1],"removingReplicas":[],'
                           '"addingReplicas":[],"leader":1,"leaderEpoch":0,"partitionEpoch":0,'
                           '"directories":["J8aAPcfLQt2bqs1JT_rMgQ"]}}')
    assert payloads[3].startswith("Error at 6, skipping. Unknown metadata id 99")
    assert payloads[4].startswith("Error at 7, skipping. ")
    assert all(l.startswith(("Dumping", "Log starting", "baseOffset:", "| offset:")) for l in lines)


def test_bootstrap_checkpoint_from_storage_format(tmp_path):
    conf = tmp_path / "c.properties"
    conf.write_text(f"process.roles=controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:19093\n"
                    f"listeners=CONTROLLER://127.0.0.1:19093\ncontroller.listener.names=CONTROLLER\n"
                    f"log.dirs={tmp_path}/meta\n")
    fmt = subprocess.run([sys.executable, "-m", "kbroker", "storage", "format", "-c", str(conf),
                          "-t", "MkU3OEVBNTcwNTJENDM2Qg"], capture_output=True, text=True, timeout=60)
    assert fmt.returncode == 0, fmt.stderr
    path = str(tmp_path / "meta" / "bootstrap.checkpoint")
    r = subprocess.run([sys.executable, "-m", "kbroker", "dump-log", "--cluster-metadata-decoder", "--files", path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == [f"Dumping {path}", "KRaft bootstrap snapshot"]
    assert lines[2].startswith("baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 "
                               "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false "
                               "isControl: true deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: ")
    assert lines[3].endswith('keySize: 4 valueSize: 11 sequence: -1 headerKeys: [] '
                             'SnapshotHeader {"version":0,"lastContainedLogTimestamp":0}')
    assert " isControl: false " in lines[4] and " count: 2 " in lines[4] and " size: 124 " in lines[4]
    assert lines[5].endswith('keySize: -1 valueSize: 23 sequence: -1 headerKeys: [] payload: '
                             '{"type":"FEATURE_LEVEL_RECORD","version":0,"data":{"name":"metadata.version",'
                             '"featureLevel":21}}')
    assert lines[6].endswith('payload: {"type":"FEATURE_LEVEL_RECORD","version":0,"data":{"name":'
                             '"transaction.version","featureLevel":2}}')      # a new cluster's default
    assert lines[8].endswith(' SnapshotFooter {"version":0}')
    assert len(lines) == 9


def test_snapshot_file_name_gives_end_offset_and_epoch(tmp_path):
    path = tmp_path / "00000000000000000042-0000000003.checkpoint"
    path.write_bytes(_data(0, [serialize(ApiMessageAndVersion(TopicRecord(name="t", topic_id=TOPIC_ID), 0))]))
    out = io.StringIO()
    dump_log.main(["--cluster-metadata-decoder", "--files", str(path)], out=out)
    assert out.getvalue().splitlines()[1] == "Snapshot end offset: 42, epoch: 3"
    assert '"type":"TOPIC_RECORD"' in out.getvalue()


def test_doubles_and_nullable_strings_print_as_kafka_does():
    from types import SimpleNamespace

    from kbroker.metadata.records.client_quota_record import ClientQuotaRecord, EntityData

    rec = ClientQuotaRecord(entity=[EntityData(entity_type="user", entity_name=None)],
                            key="producer_byte_rate", value=1e9, remove=False)
    value = serialize(ApiMessageAndVersion(rec, 0))
    assert dump_log.metadata_payload(SimpleNamespace(offset=0, value=value)) == (
        '{"type":"CLIENT_QUOTA_RECORD","version":0,"data":{"entity":[{"entityType":"user","entityName":null}],'
        '"key":"producer_byte_rate","value":1.0E9,"remove":false}}')
    assert dump_log.metadata_payload(SimpleNamespace(offset=4, value=None)).startswith("Error at 4, skipping.")
