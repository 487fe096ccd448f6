"""Helpers for driving a QuorumController in tests: a simulated clock, brokers that
register and heartbeat, and the log of every record written (offset, record)."""
from __future__ import annotations

import uuid

from kbroker.controller import ControllerConfig, QuorumController
from kbroker.controller.features import LATEST, bootstrap_records
from kbroker.metadata.delta import MetadataDelta
from kbroker.metadata.image import MetadataImage
from kbroker.protocol.messages import alter_partition as AP
from kbroker.protocol.messages import broker_registration as BR
from kbroker.protocol.messages import create_topics as CT
from kbroker.protocol.messages.broker_heartbeat import BrokerHeartbeatRequest
from kbroker.protocol.messages.broker_registration import BrokerRegistrationRequest
from kbroker.protocol.messages.create_topics import CreateTopicsRequest

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


def registration(broker_id, incarnation=None, rack=None, cluster_id=CLUSTER_ID, mv=(1, LATEST), log_dirs=None):
    return BrokerRegistrationRequest(
        broker_id=broker_id, cluster_id=cluster_id,
        incarnation_id=incarnation or uuid.UUID(int=(broker_id + 1) << 64 | 7),
        listeners=[BR.Listener(name="PLAINTEXT", host="127.0.0.1", port=9092 + broker_id,
                                                      security_protocol=0)],
        features=[BR.Feature(name="metadata.version", min_supported_version=mv[0],
                                                     max_supported_version=mv[1])],
        rack=rack,
        log_dirs=log_dirs if log_dirs is not None else [uuid.UUID(int=(broker_id + 1) << 96 | 99)])


class Harness:
    """A controller plus the committed log; every write commits at once."""

    def __init__(self, seed=0, metadata_version=LATEST, **config):
        config.setdefault("cluster_id", CLUSTER_ID)
        self.config = ControllerConfig(**config)
        self.seed = seed
        self.now = 0
        self.c = QuorumController(self.config, seed=seed)
        self.log: list = []          # (offset, ApiMessageAndVersion)
        self.epochs: dict = {}       # broker id -> broker epoch
        self.write(self.c.bootstrap(bootstrap_records(metadata_version)))
        self.c.activate(self.now)

    def write(self, result):
        if result.records:
            assert result.first_offset == (self.log[-1][0] + 1 if self.log else 0)
            for i, r in enumerate(result.records):
                self.log.append((result.first_offset + i, r))
            self.c.handle_commit(result.last_offset)
        return result

    def register(self, broker_id, **kw):
        r = self.write(self.c.register_broker(registration(broker_id, **kw), self.now))
        if r.response.error_code == 0:
            self.epochs[broker_id] = r.response.broker_epoch
        return r

    def heartbeat(self, broker_id, offset=None, want_fence=False, want_shut_down=False, epoch=None):
        req = BrokerHeartbeatRequest(broker_id=broker_id,
                                     broker_epoch=self.epochs.get(broker_id, -1) if epoch is None else epoch,
                                     current_metadata_offset=self.c.last_committed_offset if offset is None else offset,
                                     want_fence=want_fence, want_shut_down=want_shut_down)
        return self.write(self.c.broker_heartbeat(req, self.now))

    def start_brokers(self, ids, racks=None):
        for i in ids:
            assert self.register(i, rack=(racks or {}).get(i)).response.error_code == 0
        for i in ids:
            r = self.heartbeat(i)
            assert r.response.error_code == 0 and not r.response.is_fenced, r.response

    def create_topic(self, name, partitions=1, rf=1, configs=None, assignments=None, validate_only=False):
        T = CT.CreatableTopic
        if assignments:
            partitions = rf = -1
        t = T(name=name, num_partitions=partitions, replication_factor=rf,
              assignments=[CT.CreatableReplicaAssignment(partition_index=i, broker_ids=b)
                           for i, b in enumerate(assignments or [])],
              configs=[CT.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])
        r = self.write(self.c.create_topics(CreateTopicsRequest(topics=[t], validate_only=validate_only)))
        return r.response.topics[0]

    def alter_isr(self, topic, pid, new_isr, broker=None, leader_epoch=None, partition_epoch=None, version=3,
                  broker_epoch=None, isr_epochs=None):
        t = self.c.replication.topic_by_name(topic)
        p = t.parts[pid]
        broker = p.leader if broker is None else broker
        PD = AP.AlterPartitionRequestPartitionData
        pd = PD(partition_index=pid, leader_epoch=p.leader_epoch if leader_epoch is None else leader_epoch,
                partition_epoch=p.partition_epoch if partition_epoch is None else partition_epoch)
        if version >= 3:
            pd.new_isr_with_epochs = [AP.BrokerState(
                broker_id=b, broker_epoch=(isr_epochs or {}).get(b, -1)) for b in new_isr]
        else:
            pd.new_isr = list(new_isr)
        td = AP.AlterPartitionRequestTopicData(topic_name=topic, topic_id=t.id, partitions=[pd])
        req = AP.AlterPartitionRequest(broker_id=broker, broker_epoch=self.epochs.get(broker, -1)
                                    if broker_epoch is None else broker_epoch, topics=[td])
        r = self.write(self.c.alter_partition(req, version))
        return r.response

    def partition(self, topic, pid=0):
        return self.c.replication.topic_by_name(topic).parts[pid]

    def replayed(self) -> QuorumController:
        return QuorumController.from_records(self.log, self.config, seed=self.seed)

    def broker_image(self) -> MetadataImage:
        d = MetadataDelta(MetadataImage())
        for off, r in self.log:
            d.replay(r, off)
        return d.apply()
