"""QuorumController: routes controller requests to the managers; pure and deterministic.

Kafka: ``controller/QuorumController``. State = what the metadata log says (changed
only by ``replay``) + soft state of the active controller (broker sessions, placement
randomness). Driving it, as the raft client will:

- every node replays each record of ``__cluster_metadata`` in order:
  ``replay(record, offset)``; ``handle_commit(offset)`` when the high watermark moves.
- the active controller calls ``activate(now_ms)`` once it has replayed its whole log,
  then handles requests with the methods below. Each returns a ControllerResult whose
  ``records`` are ALREADY replayed at offsets ``first_offset..last_offset``
  (= ``next_write_offset`` before the call onward), as Kafka's controller applies
  records before they commit so the next request sees them. The caller appends exactly
  those records to the raft log at exactly those offsets (``atomic`` ones in one
  batch), and sends ``response`` once ``last_committed_offset >= last_offset``. If the
  append fails or lands elsewhere (leadership lost), throw this controller away and
  rebuild one by replaying the committed log: ``QuorumController.from_records``.
- ``fence_stale_brokers(now_ms)`` on a timer (``next_session_expiry_ms``).

Invariant (tests/controller): the state after handling any sequence of requests equals
the state of a fresh controller that replayed the records they emitted
(``state()``), and a broker's MetadataImage replayed from those records equals
``image()``.
"""
from __future__ import annotations

import random as _random

from kbroker.controller.acl_control import AclControlManager
from kbroker.controller.client_quota_control import ClientQuotaControlManager
from kbroker.controller.cluster_control import ClusterControlManager
from kbroker.controller.configuration_control import ConfigurationControlManager
from kbroker.controller.features import SAFE_DOWNGRADE, UPGRADE, FeatureControlManager
from kbroker.controller.producer_id_control import ProducerIdControlManager
from kbroker.controller.replication_control import ReplicationControlManager
from kbroker.controller.result import ControllerConfig, ControllerResult
from kbroker.controller.scram_control import ScramControlManager
from kbroker.metadata import records as R
from kbroker.metadata.image import (
    AclsImage, ClientQuotasImage, ClusterImage, ConfigurationsImage, FeaturesImage, MetadataImage, ProducerIdsImage,
    ScramImage, TopicImage, TopicsImage, frozen_map,
)
from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import update_features as UF


class QuorumController:
    def __init__(self, config: ControllerConfig | None = None, seed: int | None = None):
        self.config = config or ControllerConfig()
        self.random = _random.Random(seed)
        self.features = FeatureControlManager(self.config.node_id)
        self.cluster = ClusterControlManager(self.config, self.features)
        self.configs = ConfigurationControlManager(self.config, self.cluster)
        self.replication = ReplicationControlManager(self.config, self.features, self.cluster, self.configs,
                                                     self.random)
        self.producer_ids = ProducerIdControlManager(self.config, self.cluster)
        self.client_quotas = ClientQuotaControlManager()
        self.acls = AclControlManager(self.random)
        self.scram = ScramControlManager(self.features)
        self.cluster.replication = self.replication
        self.configs.replication = self.replication
        self.last_applied_offset = -1
        self.last_committed_offset = -1
        self._route = {
            R.FeatureLevelRecord: self.features.replay,
            R.RegisterBrokerRecord: self.cluster.replay,
            R.UnregisterBrokerRecord: self.cluster.replay,
            R.FenceBrokerRecord: self.cluster.replay,
            R.UnfenceBrokerRecord: self.cluster.replay,
            R.BrokerRegistrationChangeRecord: self.cluster.replay,
            R.TopicRecord: self.replication.replay,
            R.PartitionRecord: self.replication.replay,
            R.PartitionChangeRecord: self.replication.replay,
            R.ConfigRecord: self.configs.replay,
            R.ProducerIdsRecord: self.producer_ids.replay,
            R.ClientQuotaRecord: self.client_quotas.replay,
            R.AccessControlEntryRecord: self.acls.replay,
            R.RemoveAccessControlEntryRecord: self.acls.replay,
            R.UserScramCredentialRecord: self.scram.replay,
            R.RemoveUserScramCredentialRecord: self.scram.replay,
        }

    # --- the log ----------------------------------------------------------------------------
    @property
    def next_write_offset(self) -> int:
        return self.last_applied_offset + 1

    def replay(self, record, offset: int) -> None:
        """Apply one record (ApiMessageAndVersion or bare message) read at ``offset``."""
        if offset <= self.last_applied_offset:
            raise ValueError("replay of offset %d after %d" % (offset, self.last_applied_offset))
        self._apply(record, offset)
        self.last_applied_offset = offset

    def _apply(self, record, offset: int) -> None:
        msg = getattr(record, "message", record)
        t = type(msg)
        if t is R.RemoveTopicRecord:
            topic = self.replication.topics.get(msg.topic_id)
            self.replication.replay(msg, offset)
            self.configs.delete_topic_configs(topic.name)
        else:
            fn = self._route.get(t)
            if fn is not None:
                fn(msg, offset)

    def handle_commit(self, offset: int) -> None:
        self.last_committed_offset = max(self.last_committed_offset, offset)

    @classmethod
    def from_records(cls, records, config: ControllerConfig | None = None, seed: int | None = None,
                     first_offset: int = 0) -> "QuorumController":
        """A controller that replayed ``records`` (ApiMessageAndVersion, or (offset, record))."""
        c = cls(config, seed)
        off = first_offset
        for r in records:
            if isinstance(r, tuple):
                off, r = r
            c.replay(r, off)
            off += 1
        return c

    @classmethod
    def from_snapshot(cls, records, last_offset: int, config: ControllerConfig | None = None,
                      seed: int | None = None) -> "QuorumController":
        """A controller loaded from a snapshot whose last contained offset is ``last_offset``:
        every record is replayed at that offset, as Kafka's QuorumController does on
        handleLoadSnapshot (a broker's registration offset is then the snapshot's)."""
        c = cls(config, seed)
        for r in records:
            c._apply(r, last_offset)
        c.last_applied_offset = last_offset
        c.last_committed_offset = last_offset
        return c

    def activate(self, now_ms: int) -> None:
        """Become the active controller (after replaying the whole log)."""
        self.cluster.activate(now_ms)

    def _write(self, result: ControllerResult) -> ControllerResult:
        if result.records:
            result.first_offset = self.next_write_offset
            for r in result.records:
                self.replay(r, self.next_write_offset)
            result.last_offset = self.last_applied_offset
        return result

    # --- write operations ------------------------------------------------------------------------
    def register_broker(self, req, now_ms: int) -> ControllerResult:
        return self._write(self.cluster.register_broker(req, self.next_write_offset, now_ms))

    def broker_heartbeat(self, req, now_ms: int) -> ControllerResult:
        return self._write(self.cluster.broker_heartbeat(req, self.next_write_offset, now_ms))

    def unregister_broker(self, req) -> ControllerResult:
        return self._write(self.cluster.unregister_broker(req))

    def fence_stale_brokers(self, now_ms: int) -> ControllerResult:
        """Fence every broker whose session expired, one after the other."""
        out = ControllerResult()
        for bid in self.cluster.stale_brokers(now_ms):
            r = self._write(self.cluster.fence_stale_broker(bid))
            if out.first_offset < 0:
                out.first_offset = r.first_offset
            out.records.extend(r.records)
            out.last_offset = r.last_offset
        return out

    def next_session_expiry_ms(self):
        return self.cluster.next_session_expiry_ms()

    def create_topics(self, req) -> ControllerResult:
        return self._write(self.replication.create_topics(req))

    def create_partitions(self, req) -> ControllerResult:
        return self._write(self.replication.create_partitions(req))

    def delete_topics(self, req) -> ControllerResult:
        return self._write(self.replication.delete_topics(req))

    def alter_partition(self, req, api_version: int = 3) -> ControllerResult:
        return self._write(self.replication.alter_partition(req, api_version))

    def elect_leaders(self, req) -> ControllerResult:
        return self._write(self.replication.elect_leaders(req))

    def alter_partition_reassignments(self, req) -> ControllerResult:
        return self._write(self.replication.alter_partition_reassignments(req))

    def incremental_alter_configs(self, req) -> ControllerResult:
        return self._write(self.configs.incremental_alter_configs(req))

    def alter_configs(self, req) -> ControllerResult:
        return self._write(self.configs.alter_configs(req))

    def alter_client_quotas(self, req) -> ControllerResult:
        return self._write(self.client_quotas.alter_client_quotas(req))

    def create_acls(self, req) -> ControllerResult:
        return self._write(self.acls.create_acls(req))

    def delete_acls(self, req) -> ControllerResult:
        return self._write(self.acls.delete_acls(req))

    def alter_user_scram_credentials(self, req) -> ControllerResult:
        return self._write(self.scram.alter_user_scram_credentials(req))

    def update_features(self, req, version: int = 1) -> ControllerResult:
        """UpdateFeatures (Kafka's QuorumController.updateFeatures): the response carries a
        result per feature when all succeed (v0-1), else only the top-level error."""
        updates, types = {}, {}
        for u in req.feature_updates or ():
            updates[u.feature] = u.max_version_level
            # v0 had AllowDowngrade, which v1's UpgradeType replaced (KIP-778)
            types[u.feature] = (SAFE_DOWNGRADE if u.allow_downgrade else UPGRADE) if version == 0 else u.upgrade_type
        brokers = [(b.id, {n: (lo, hi) for n, lo, hi in b.supported_features})
                   for _, b in sorted(self.cluster.brokers.items())]
        res = self.features.update_features(updates, types, bool(req.validate_only), self.config.supported_features,
                                            brokers)
        err = res.response
        if err is not None:
            res.response = UF.UpdateFeaturesResponse(
                throttle_time_ms=0, error_code=err.code, results=[],
                error_message="The update failed for all features since the following feature had an error: "
                              + (err.message or ""))
        else:
            res.response = UF.UpdateFeaturesResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                                                     results=[UF.UpdatableFeatureResult(feature=n, error_code=0,
                                                                                        error_message=None)
                                                              for n in updates])
        return self._write(res)

    def allocate_producer_ids(self, req) -> ControllerResult:
        return self._write(self.producer_ids.allocate_producer_ids(req))

    def write_noop(self) -> ControllerResult:
        """A NoOpRecord (Kafka writes one periodically so the high watermark advances)."""
        r = ControllerResult()
        r.add(R.NoOpRecord(), 0)
        return self._write(r)

    def bootstrap(self, records) -> ControllerResult:
        """Write a new cluster's bootstrap records (features.bootstrap_records)."""
        return self._write(ControllerResult(list(records), None, atomic=True))

    # --- reads ----------------------------------------------------------------------------------
    def describe_configs(self, req):
        return self.configs.describe_configs(req)

    def list_partition_reassignments(self, req):
        return self.replication.list_partition_reassignments(req)

    def image(self) -> MetadataImage:
        """The controller's view as a MetadataImage (built from the managers' own state)."""
        feats = FeaturesImage(frozen_map(sorted(self.features.finalized.items())))
        cluster = ClusterImage(frozen_map(sorted(self.cluster.brokers.items())))
        by_id = {t.id: TopicImage(t.name, t.id, frozen_map(sorted(t.parts.items())))
                 for t in self.replication.topics.values()}
        topics = TopicsImage(frozen_map(by_id), frozen_map({t.name: t for t in by_id.values()}))
        configs = ConfigurationsImage(frozen_map({k: frozen_map(sorted(v.items()))
                                                  for k, v in self.configs.data.items() if v}))
        return MetadataImage(self.last_applied_offset, -1, feats, cluster, topics, configs,
                             ProducerIdsImage(self.producer_ids.next_producer_id),
                             ClientQuotasImage(frozen_map({k: frozen_map(sorted(v.items()))
                                                           for k, v in self.client_quotas.data.items() if v})),
                             AclsImage(frozen_map(self.acls.acls)),
                             ScramImage(frozen_map(sorted(self.scram.credentials.items()))))

    def state(self) -> tuple:
        """Everything replicated, comparable by value (image + registration offsets + indexes)."""
        rc = self.replication
        return (self.image(), dict(self.cluster.registration_offsets),
                {k: frozenset(v) for k, v in rc.isr_index.items()},
                {k: frozenset(v) for k, v in rc.leader_index.items()},
                frozenset(rc.leaderless), dict(rc.by_name),
                {k: frozenset(v) for k, v in rc.collisions.items()})


__all__ = ["QuorumController"]
