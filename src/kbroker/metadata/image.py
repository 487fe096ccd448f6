"""MetadataImage: an immutable, by-value view of the cluster metadata at one log offset.

Kafka: ``metadata/.../image/`` (MetadataImage, FeaturesImage, ClusterImage, TopicsImage,
TopicImage, ConfigurationsImage, ProducerIdsImage, ClientQuotasImage, AclsImage, ScramImage) and ``metadata/PartitionRegistration``.
An image is what a broker (or the controller) knows after replaying the
``__cluster_metadata`` log up to and including ``offset``. Images never change: a
:class:`kbroker.metadata.delta.MetadataDelta` replays records on top of one and produces
the next. Two images are equal when every field is equal (mappings compare by content),
which is how a replay is checked against the controller's own view.

Pure: no I/O, no threads, no clock.
"""
from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Optional

from kbroker.protocol.primitives import ZERO_UUID
from kbroker.security import scram as _scram
from kbroker.security.authorizer import EMPTY_ACLS, AclIndex

NO_LEADER = -1
NO_LEADER_CHANGE = -2
#: LeaderRecoveryState: RECOVERED (elected from the ISR) or RECOVERING (unclean election)
RECOVERED, RECOVERING = 0, 1
#: ConfigResource.Type wire values
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
METADATA_VERSION = "metadata.version"
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
#: DirectoryId.UNASSIGNED / LOST / MIGRATING (reserved log-directory ids)
DIR_UNASSIGNED = ZERO_UUID
DIR_LOST = uuid.UUID(int=1)
DIR_MIGRATING = uuid.UUID(int=2)

EMPTY_MAP: Mapping = MappingProxyType({})


def frozen_map(d) -> Mapping:
    """A read-only mapping over a private copy of ``d`` (compares by content)."""
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Endpoint:
    name: str
    host: str
    port: int
    security_protocol: int


@dataclass(frozen=True)
class BrokerRegistration:
    """One broker as the controller registered it. ``epoch`` is the offset of the
    RegisterBrokerRecord that created this incarnation (Kafka's broker epoch)."""
    id: int
    epoch: int
    incarnation_id: uuid.UUID
    listeners: tuple = ()                  # tuple[Endpoint]
    supported_features: tuple = ()         # tuple[(name, min, max)], sorted by name
    rack: Optional[str] = None
    fenced: bool = True
    in_controlled_shutdown: bool = False
    directories: tuple = ()                # tuple[uuid.UUID], sorted
    is_migrating_zk_broker: bool = False

    @classmethod
    def from_record(cls, r) -> "BrokerRegistration":
        return cls(r.broker_id, r.broker_epoch, r.incarnation_id,
                   tuple(Endpoint(e.name, e.host, e.port, e.security_protocol) for e in r.end_points),
                   tuple(sorted((f.name, f.min_supported_version, f.max_supported_version) for f in r.features)),
                   r.rack, bool(r.fenced), bool(r.in_controlled_shutdown),
                   tuple(sorted(r.log_dirs or ())), bool(r.is_migrating_zk_broker))

    @property
    def is_active(self) -> bool:
        """Eligible to lead and to be in an ISR: unfenced and not shutting down."""
        return not self.fenced and not self.in_controlled_shutdown

    def listener(self, name: str) -> Optional[Endpoint]:
        for e in self.listeners:
            if e.name == name:
                return e
        return None


@dataclass(frozen=True)
class PartitionRegistration:
    """One partition's replica assignment and leadership. ``leader_epoch`` grows by one
    with every record that sets the leader; ``partition_epoch`` with every change."""
    replicas: tuple
    isr: tuple
    removing_replicas: tuple = ()
    adding_replicas: tuple = ()
    leader: int = NO_LEADER
    leader_recovery_state: int = RECOVERED
    leader_epoch: int = 0
    partition_epoch: int = 0
    directories: tuple = ()
    elr: tuple = ()
    last_known_elr: tuple = ()

    @classmethod
    def from_record(cls, r) -> "PartitionRegistration":
        dirs = tuple(r.directories) if r.directories else (DIR_MIGRATING,) * len(r.replicas)
        return cls(tuple(r.replicas), tuple(r.isr), tuple(r.removing_replicas), tuple(r.adding_replicas),
                   r.leader, r.leader_recovery_state, r.leader_epoch, r.partition_epoch, dirs,
                   tuple(r.eligible_leader_replicas or ()), tuple(r.last_known_elr or ()))

    def merge(self, r) -> "PartitionRegistration":
        """The registration after PartitionChangeRecord ``r``: absent (None / -2 / -1)
        fields are unchanged; a set leader (even the same one) bumps the leader epoch."""
        replicas = self.replicas if r.replicas is None else tuple(r.replicas)
        if r.directories is not None:
            dirs = tuple(r.directories)
        elif r.replicas is not None:
            old = dict(zip(self.replicas, self.directories))
            dirs = tuple(old.get(b, DIR_MIGRATING) for b in replicas)
        else:
            dirs = self.directories
        if r.leader == NO_LEADER_CHANGE:
            leader, leader_epoch = self.leader, self.leader_epoch
        else:
            leader, leader_epoch = r.leader, self.leader_epoch + 1
        lrs = self.leader_recovery_state if r.leader_recovery_state == -1 else r.leader_recovery_state
        return PartitionRegistration(
            replicas,
            self.isr if r.isr is None else tuple(r.isr),
            self.removing_replicas if r.removing_replicas is None else tuple(r.removing_replicas),
            self.adding_replicas if r.adding_replicas is None else tuple(r.adding_replicas),
            leader, lrs, leader_epoch, self.partition_epoch + 1, dirs,
            self.elr if r.eligible_leader_replicas is None else tuple(r.eligible_leader_replicas),
            self.last_known_elr if r.last_known_elr is None else tuple(r.last_known_elr))

    def to_record(self, topic_id: uuid.UUID, partition_id: int):
        from kbroker.metadata.records import PartitionRecord
        return PartitionRecord(partition_id=partition_id, topic_id=topic_id, replicas=list(self.replicas),
                               isr=list(self.isr), removing_replicas=list(self.removing_replicas),
                               adding_replicas=list(self.adding_replicas), leader=self.leader,
                               leader_recovery_state=self.leader_recovery_state,
                               leader_epoch=self.leader_epoch, partition_epoch=self.partition_epoch,
                               directories=list(self.directories))

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def is_reassigning(self) -> bool:
        return bool(self.removing_replicas or self.adding_replicas)

    def offline_replicas(self, cluster: "ClusterImage") -> tuple:
        """Replicas whose broker is unregistered or fenced (Metadata's offline_replicas)."""
        return tuple(b for b in self.replicas
                     if (reg := cluster.brokers.get(b)) is None or reg.fenced)


@dataclass(frozen=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionRegistration] = field(default_factory=lambda: EMPTY_MAP)

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def topic_id_base64(self) -> str:
        return base64.urlsafe_b64encode(self.topic_id.bytes).rstrip(b"=").decode()


@dataclass(frozen=True)
class TopicsImage:
    by_id: Mapping[uuid.UUID, TopicImage] = field(default_factory=lambda: EMPTY_MAP)
    by_name: Mapping[str, TopicImage] = field(default_factory=lambda: EMPTY_MAP)

    def partition(self, topic_id: uuid.UUID, partition_id: int) -> Optional[PartitionRegistration]:
        t = self.by_id.get(topic_id)
        return None if t is None else t.partitions.get(partition_id)


@dataclass(frozen=True)
class ClusterImage:
    brokers: Mapping[int, BrokerRegistration] = field(default_factory=lambda: EMPTY_MAP)

    def alive_brokers(self):
        """Unfenced brokers, by id (what Metadata responses list)."""
        return [b for _, b in sorted(self.brokers.items()) if not b.fenced]


@dataclass(frozen=True)
class FeaturesImage:
    finalized: Mapping[str, int] = field(default_factory=lambda: EMPTY_MAP)  # feature name -> level (0 never stored)

    @property
    def metadata_version(self) -> int:
        return self.finalized.get(METADATA_VERSION, 0)


@dataclass(frozen=True)
class ConfigurationsImage:
    #: (resource type, resource name) -> {key: value}; broker name "" is the cluster default
    resources: Mapping[tuple, Mapping[str, str]] = field(default_factory=lambda: EMPTY_MAP)

    def get(self, resource_type: int, name: str) -> Mapping[str, str]:
        return self.resources.get((resource_type, name), EMPTY_MAP)


@dataclass(frozen=True)
class AclsImage:
    """The ACLs (Kafka's AclsImage): id -> StandardAcl, and the authorizer's index of them
    (built once per image; not part of equality)."""
    by_id: Mapping = field(default_factory=lambda: EMPTY_MAP)
    index: AclIndex = field(default=EMPTY_ACLS, compare=False, repr=False)

    def __post_init__(self):
        if self.by_id and self.index is EMPTY_ACLS:
            object.__setattr__(self, "index", AclIndex(self.by_id.values()))


@dataclass(frozen=True)
class ProducerIdsImage:
    next_producer_id: int = 0   # first id of the next block the controller hands out


@dataclass(frozen=True)
class ClientQuotasImage:
    #: entity key ((type, name | None), ...) sorted by type -> {quota key: value}
    entities: Mapping[tuple, Mapping[str, float]] = field(default_factory=lambda: EMPTY_MAP)


@dataclass(frozen=True)
class ScramImage:
    """The users' SCRAM credentials (Kafka's ScramImage): (user, mechanism type) -> credential,
    the mechanism type being the int8 of UserScramCredentialRecord (1 SCRAM-SHA-256, 2
    SCRAM-SHA-512). Immutable, so it is itself a
    :class:`kbroker.security.credentials.ScramCredentialSource` the SASL servers can read."""
    credentials: Mapping[tuple, _scram.ScramCredential] = field(default_factory=lambda: EMPTY_MAP)

    def scram_credential(self, user: str, mechanism: str) -> Optional[_scram.ScramCredential]:
        m = _scram.MECHANISMS.get(mechanism)
        return None if m is None else self.credentials.get((user, m[1]))

    def scram_credentials(self) -> Mapping[str, Mapping[str, _scram.ScramCredential]]:
        """{user: {mechanism name: credential}} (what DescribeUserScramCredentials reads)."""
        out: dict = {}
        for (user, mtype), cred in self.credentials.items():
            name = _scram.MECHANISM_BY_TYPE.get(mtype)
            if name is not None:
                out.setdefault(user, {})[name] = cred
        return out


@dataclass(frozen=True)
class MetadataImage:
    """The cluster metadata after the record at ``offset`` (-1: nothing replayed) of
    leader ``epoch``."""
    offset: int = -1
    epoch: int = -1
    features: FeaturesImage = field(default_factory=FeaturesImage)
    cluster: ClusterImage = field(default_factory=ClusterImage)
    topics: TopicsImage = field(default_factory=TopicsImage)
    configs: ConfigurationsImage = field(default_factory=ConfigurationsImage)
    producer_ids: ProducerIdsImage = field(default_factory=ProducerIdsImage)
    client_quotas: ClientQuotasImage = field(default_factory=ClientQuotasImage)
    acls: AclsImage = field(default_factory=AclsImage)
    scram: ScramImage = field(default_factory=ScramImage)

    def topic_configs(self, name: str) -> Mapping[str, str]:
        return self.configs.get(TOPIC_RESOURCE, name)

    @property
    def broker_configs(self) -> Mapping[str, Mapping[str, str]]:
        """Dynamic broker configs by resource name, as the single-node MetadataImage had them."""
        return frozen_map({n: v for (t, n), v in self.configs.resources.items() if t == BROKER_RESOURCE})

    def same_state(self, other: "MetadataImage") -> bool:
        """Equal content, whatever offset and epoch each was read at."""
        return replace(self, offset=-1, epoch=-1) == replace(other, offset=-1, epoch=-1)

    def to_records(self) -> list:
        """Records that rebuild this image from empty (a snapshot's content), as
        ApiMessageAndVersion at the highest versions this image's fields need."""
        from kbroker.metadata import records as R
        from kbroker.metadata.serde import ApiMessageAndVersion as AMV
        out = []
        for name, level in sorted(self.features.finalized.items()):
            out.append(AMV(R.FeatureLevelRecord(name=name, feature_level=level), 0))
        for b in sorted(self.cluster.brokers.values(), key=lambda b: b.id):
            rec = R.RegisterBrokerRecord(
                broker_id=b.id, incarnation_id=b.incarnation_id, broker_epoch=b.epoch,
                end_points=[R.register_broker_record.BrokerEndpoint(name=e.name, host=e.host, port=e.port,
                                                                 security_protocol=e.security_protocol)
                            for e in b.listeners],
                features=[R.register_broker_record.BrokerFeature(name=n, min_supported_version=lo,
                                                              max_supported_version=hi)
                          for n, lo, hi in b.supported_features],
                rack=b.rack, fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown,
                log_dirs=list(b.directories))
            out.append(AMV(rec, 3))
        for t in sorted(self.topics.by_id.values(), key=lambda t: t.name):
            out.append(AMV(R.TopicRecord(name=t.name, topic_id=t.topic_id), 0))
            for p, reg in sorted(t.partitions.items()):
                out.append(AMV(reg.to_record(t.topic_id, p), 1))
        for (rtype, rname), kv in sorted(self.configs.resources.items()):
            for k, v in sorted(kv.items()):
                out.append(AMV(R.ConfigRecord(resource_type=rtype, resource_name=rname, name=k, value=v), 0))
        for key, quotas in sorted(self.client_quotas.entities.items(), key=lambda kv: repr(kv[0])):
            for k, v in sorted(quotas.items()):
                out.append(AMV(R.ClientQuotaRecord(
                    entity=[R.client_quota_record.EntityData(entity_type=t, entity_name=n) for t, n in key],
                    key=k, value=v, remove=False), 0))
        for acl_id, a in sorted(self.acls.by_id.items(), key=lambda kv: str(kv[0])):
            out.append(AMV(R.AccessControlEntryRecord(
                id=acl_id, resource_type=a.resource_type, resource_name=a.resource_name,
                pattern_type=a.pattern_type, principal=a.principal, host=a.host, operation=a.operation,
                permission_type=a.permission_type), 0))
        for (user, mtype), c in sorted(self.scram.credentials.items()):
            out.append(AMV(R.UserScramCredentialRecord(name=user, mechanism=mtype, salt=c.salt, stored_key=c.stored_key,
                                                       server_key=c.server_key, iterations=c.iterations), 0))
        if self.producer_ids.next_producer_id:
            out.append(AMV(R.ProducerIdsRecord(broker_id=-1, broker_epoch=-1,
                                               next_producer_id=self.producer_ids.next_producer_id), 0))
        return out


EMPTY_IMAGE = MetadataImage()
