"""MetadataDelta: replay ``__cluster_metadata`` records on an image, in log order.

Kafka: ``image/MetadataDelta`` and friends, ``image/TopicDelta.localChanges``. A delta
starts from an image, takes records one at a time (``replay``) and ``apply`` returns the
next image, sharing every topic and broker that did not change. Replay follows
Kafka's semantics: PartitionChangeRecord fields that are absent mean unchanged (leader
-2, null lists, recovery state -1) and a set leader bumps the leader epoch; a fence,
unfence or registration change names the broker epoch it applies to and a mismatch is
an error (MetadataReplayError), as is a change to an unknown topic or partition.
RemoveTopicRecord also drops the topic's config overrides. AccessControlEntryRecord /
RemoveAccessControlEntryRecord add and remove ACLs by id (removing an unknown id is an error).
UserScramCredentialRecord / RemoveUserScramCredentialRecord set and drop one (user, mechanism)
credential (Kafka's ScramDelta: removing one that is absent changes nothing).
Records the image does not model (delegation tokens, transactions markers) are accepted and
ignored.

``changes()`` says what the delta changed (topics created, deleted, partitions changed)
and ``local_changes(broker_id)`` turns that into what one broker's ReplicaManager must
do: become leader, become follower, delete.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from kbroker.metadata import records as R
from kbroker.metadata.image import (
    TOPIC_RESOURCE, AclsImage, BrokerRegistration, ClientQuotasImage, ClusterImage, ConfigurationsImage,
    FeaturesImage, MetadataImage, PartitionRegistration, ProducerIdsImage, ScramImage, TopicImage, TopicsImage,
    frozen_map,
)
from kbroker.security.authorizer import StandardAcl
from kbroker.security.scram import ScramCredential


class MetadataReplayError(ValueError):
    """A record that cannot apply to the current state (a corrupt or misordered log)."""


@dataclass(frozen=True)
class PartitionInfo:
    topic_id: uuid.UUID
    partition: PartitionRegistration


@dataclass
class LocalReplicaChanges:
    """What one broker must do after a delta (Kafka's LocalReplicaChanges). Keys are
    (topic name, partition id). ``leaders`` / ``followers`` hold every partition whose
    registration changed and that this broker leads / follows; ``elected_leaders`` those
    it newly leads (the leader epoch changed)."""
    deletes: set = field(default_factory=set)
    elected_leaders: dict = field(default_factory=dict)
    leaders: dict = field(default_factory=dict)
    followers: dict = field(default_factory=dict)
    topic_ids: dict = field(default_factory=dict)


@dataclass
class TopicChange:
    """A topic touched by the delta: ``before`` is the image's (None if created)."""
    topic_id: uuid.UUID
    name: str
    before: TopicImage | None
    partitions: dict = field(default_factory=dict)   # partition id -> new PartitionRegistration


class MetadataDelta:
    def __init__(self, image: MetadataImage):
        self.image = image
        self.offset = image.offset
        self.epoch = image.epoch
        self._features: dict = {}            # name -> level (0: remove)
        self._brokers: dict = {}             # id -> BrokerRegistration | None
        self._topics: dict = {}              # topic id -> TopicChange
        self._removed: dict = {}             # topic id -> TopicImage (image topics removed)
        self._configs: dict = {}             # (type, name) -> {key: value | None}
        self._cleared: set = set()           # (type, name) whose image configs are dropped
        self._next_producer_id: int | None = None
        self._quotas: dict = {}              # entity key -> {quota key: value | None (removed)}
        self._acls: dict | None = None       # id -> StandardAcl, once an ACL record is replayed
        self._scram: dict = {}               # (user, mechanism type) -> ScramCredential | None (removed)

    # --- reading through the delta --------------------------------------------------
    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.cluster.brokers.get(broker_id)

    def _topic_change(self, topic_id) -> TopicChange:
        ch = self._topics.get(topic_id)
        if ch is None:
            t = None if topic_id in self._removed else self.image.topics.by_id.get(topic_id)
            if t is None:
                raise MetadataReplayError("unknown topic id %s" % topic_id)
            ch = self._topics[topic_id] = TopicChange(topic_id, t.name, t)
        return ch

    def _partition(self, ch: TopicChange, pid: int) -> PartitionRegistration | None:
        if pid in ch.partitions:
            return ch.partitions[pid]
        return None if ch.before is None else ch.before.partitions.get(pid)

    def _topic_name_live(self, name: str) -> bool:
        if any(ch.name == name for ch in self._topics.values()):
            return True
        t = self.image.topics.by_name.get(name)
        return t is not None and t.topic_id not in self._removed

    # --- replay -------------------------------------------------------------------------
    def replay(self, record, offset: int | None = None, epoch: int | None = None) -> None:
        """Apply one record (an ApiMessageAndVersion or a bare message) read at ``offset``."""
        msg = getattr(record, "message", record)
        fn = _REPLAY.get(type(msg))
        if fn is not None:
            fn(self, msg)
        if offset is not None:
            if offset <= self.offset:
                raise MetadataReplayError("offset %d after %d" % (offset, self.offset))
            self.offset = offset
        if epoch is not None:
            self.epoch = epoch

    def _feature(self, r):
        self._features[r.name] = r.feature_level

    def _register(self, r):
        self._brokers[r.broker_id] = BrokerRegistration.from_record(r)

    def _unregister(self, r):
        self._broker_or_raise(r.broker_id, r.broker_epoch, "unregister")
        self._brokers[r.broker_id] = None

    def _broker_or_raise(self, bid, epoch, what) -> BrokerRegistration:
        b = self.broker(bid)
        if b is None:
            raise MetadataReplayError("cannot %s unknown broker %d" % (what, bid))
        if b.epoch != epoch:
            raise MetadataReplayError("cannot %s broker %d: epoch %d, registration has %d"
                                      % (what, bid, epoch, b.epoch))
        return b

    def _fence(self, r):
        b = self._broker_or_raise(r.id, r.epoch, "fence")
        self._brokers[r.id] = replace(b, fenced=True)

    def _unfence(self, r):
        b = self._broker_or_raise(r.id, r.epoch, "unfence")
        self._brokers[r.id] = replace(b, fenced=False)

    def _registration_change(self, r):
        b = self._broker_or_raise(r.broker_id, r.broker_epoch, "change")
        if r.fenced not in (-1, 0, 1) or r.in_controlled_shutdown not in (0, 1):
            raise MetadataReplayError("bad BrokerRegistrationChangeRecord %r" % (r,))
        fenced = b.fenced if r.fenced == 0 else r.fenced == 1
        ics = b.in_controlled_shutdown or r.in_controlled_shutdown == 1
        dirs = tuple(sorted(r.log_dirs)) if r.log_dirs else b.directories
        self._brokers[r.broker_id] = replace(b, fenced=fenced, in_controlled_shutdown=ics, directories=dirs)

    def _topic(self, r):
        if r.topic_id in self._topics or (r.topic_id in self.image.topics.by_id
                                          and r.topic_id not in self._removed):
            raise MetadataReplayError("topic id %s already exists" % r.topic_id)
        if self._topic_name_live(r.name):
            raise MetadataReplayError("topic %r already exists" % r.name)
        self._topics[r.topic_id] = TopicChange(r.topic_id, r.name, None)

    def _partition_record(self, r):
        ch = self._topic_change(r.topic_id)
        ch.partitions[r.partition_id] = PartitionRegistration.from_record(r)

    def _partition_change(self, r):
        ch = self._topic_change(r.topic_id)
        p = self._partition(ch, r.partition_id)
        if p is None:
            raise MetadataReplayError("unknown partition %s-%d" % (r.topic_id, r.partition_id))
        ch.partitions[r.partition_id] = p.merge(r)

    def _remove_topic(self, r):
        ch = self._topic_change(r.topic_id)
        del self._topics[r.topic_id]
        if ch.before is not None:
            self._removed[r.topic_id] = ch.before
        key = (TOPIC_RESOURCE, ch.name)
        self._configs[key] = {}
        self._cleared.add(key)

    def _config(self, r):
        key = (r.resource_type, r.resource_name)
        self._configs.setdefault(key, {})[r.name] = r.value

    def _client_quota(self, r):
        key = tuple(sorted(((e.entity_type, e.entity_name) for e in r.entity), key=lambda e: e[0]))
        self._quotas.setdefault(key, {})[r.key] = None if r.remove else r.value

    def _acl_map(self) -> dict:
        if self._acls is None:
            self._acls = dict(self.image.acls.by_id)
        return self._acls

    def _acl(self, r):
        self._acl_map()[r.id] = StandardAcl(r.resource_type, r.resource_name, r.pattern_type, r.principal,
                                            r.host, r.operation, r.permission_type)

    def _remove_acl(self, r):
        if self._acl_map().pop(r.id, None) is None:
            raise MetadataReplayError("RemoveAccessControlEntryRecord for unknown acl id %s" % r.id)

    def _scram_credential(self, r):
        self._scram[(r.name, r.mechanism)] = ScramCredential(bytes(r.salt), bytes(r.stored_key),
                                                             bytes(r.server_key), r.iterations)

    def _remove_scram_credential(self, r):
        self._scram[(r.name, r.mechanism)] = None

    def _producer_ids(self, r):
        cur = self._next_producer_id if self._next_producer_id is not None else \
            self.image.producer_ids.next_producer_id
        if r.next_producer_id < cur:
            raise MetadataReplayError("producer id block goes back: %d < %d" % (r.next_producer_id, cur))
        self._next_producer_id = r.next_producer_id

    # --- results ---------------------------------------------------------------------
    def apply(self) -> MetadataImage:
        img = self.image
        features = img.features
        if self._features:
            f = dict(features.finalized)
            for k, v in self._features.items():
                if v:
                    f[k] = v
                else:
                    f.pop(k, None)
            features = FeaturesImage(frozen_map(f))
        cluster = img.cluster
        if self._brokers:
            b = dict(cluster.brokers)
            for k, v in self._brokers.items():
                if v is None:
                    b.pop(k, None)
                else:
                    b[k] = v
            cluster = ClusterImage(frozen_map(sorted(b.items())))
        topics = img.topics
        if self._topics or self._removed:
            by_id = dict(topics.by_id)
            for tid in self._removed:
                by_id.pop(tid, None)
            for tid, ch in self._topics.items():
                parts = dict(ch.before.partitions) if ch.before is not None else {}
                parts.update(ch.partitions)
                by_id[tid] = TopicImage(ch.name, tid, frozen_map(sorted(parts.items())))
            topics = TopicsImage(frozen_map(by_id), frozen_map({t.name: t for t in by_id.values()}))
        configs = img.configs
        if self._configs:
            res = dict(configs.resources)
            for key, kv in self._configs.items():
                cur = {} if key in self._cleared else dict(res.get(key, {}))
                for k, v in kv.items():
                    if v is None:
                        cur.pop(k, None)
                    else:
                        cur[k] = v
                if cur:
                    res[key] = frozen_map(sorted(cur.items()))
                else:
                    res.pop(key, None)
            configs = ConfigurationsImage(frozen_map(res))
        pids = img.producer_ids
        if self._next_producer_id is not None:
            pids = ProducerIdsImage(self._next_producer_id)
        quotas = img.client_quotas
        if self._quotas:
            ents = {k: dict(v) for k, v in quotas.entities.items()}
            for key, kv in self._quotas.items():
                cur = ents.setdefault(key, {})
                for k, v in kv.items():
                    if v is None:
                        cur.pop(k, None)
                    else:
                        cur[k] = v
                if not cur:
                    del ents[key]
            quotas = ClientQuotasImage(frozen_map({k: frozen_map(sorted(v.items())) for k, v in ents.items()}))
        acls = img.acls if self._acls is None else AclsImage(frozen_map(self._acls))
        scram = img.scram
        if self._scram:
            creds = dict(scram.credentials)
            for key, cred in self._scram.items():
                if cred is None:
                    creds.pop(key, None)
                else:
                    creds[key] = cred
            scram = ScramImage(frozen_map(sorted(creds.items())))
        return MetadataImage(self.offset, self.epoch, features, cluster, topics, configs, pids,
                             client_quotas=quotas, acls=acls, scram=scram)

    def changes(self):
        """(created topic ids, {removed topic id: TopicImage}, {topic id: TopicChange})."""
        created = [tid for tid, ch in self._topics.items() if ch.before is None]
        return created, dict(self._removed), dict(self._topics)

    def changed_brokers(self) -> dict:
        return dict(self._brokers)

    def changed_configs(self) -> set:
        return set(self._configs)

    def client_quotas_changed(self) -> bool:
        return bool(self._quotas)

    def scram_changed(self) -> bool:
        return bool(self._scram)

    def local_changes(self, broker_id: int) -> LocalReplicaChanges:
        out = LocalReplicaChanges()
        for tid, before in self._removed.items():
            if tid in self._topics:
                continue
            for pid, p in before.partitions.items():
                if broker_id in p.replicas:
                    out.deletes.add((before.name, pid))
        for tid, ch in self._topics.items():
            for pid, new in ch.partitions.items():
                prev = None if ch.before is None else ch.before.partitions.get(pid)
                tp = (ch.name, pid)
                if broker_id not in new.replicas:
                    if prev is not None and broker_id in prev.replicas:
                        out.deletes.add(tp)
                    continue
                if prev is not None and prev.partition_epoch == new.partition_epoch:
                    continue
                info = PartitionInfo(tid, new)
                if new.leader == broker_id:
                    out.leaders[tp] = info
                    if prev is None or prev.leader_epoch != new.leader_epoch:
                        out.elected_leaders[tp] = info
                else:
                    out.followers[tp] = info
                out.topic_ids.setdefault(ch.name, tid)
        return out


_REPLAY = {
    R.AccessControlEntryRecord: MetadataDelta._acl,
    R.RemoveAccessControlEntryRecord: MetadataDelta._remove_acl,
    R.FeatureLevelRecord: MetadataDelta._feature,
    R.RegisterBrokerRecord: MetadataDelta._register,
    R.UnregisterBrokerRecord: MetadataDelta._unregister,
    R.FenceBrokerRecord: MetadataDelta._fence,
    R.UnfenceBrokerRecord: MetadataDelta._unfence,
    R.BrokerRegistrationChangeRecord: MetadataDelta._registration_change,
    R.TopicRecord: MetadataDelta._topic,
    R.PartitionRecord: MetadataDelta._partition_record,
    R.PartitionChangeRecord: MetadataDelta._partition_change,
    R.RemoveTopicRecord: MetadataDelta._remove_topic,
    R.ConfigRecord: MetadataDelta._config,
    R.ProducerIdsRecord: MetadataDelta._producer_ids,
    R.ClientQuotaRecord: MetadataDelta._client_quota,
    R.UserScramCredentialRecord: MetadataDelta._scram_credential,
    R.RemoveUserScramCredentialRecord: MetadataDelta._remove_scram_credential,
}


def image_delta(old: MetadataImage, new: MetadataImage) -> MetadataDelta:
    """The delta that turns ``old`` into ``new``: what a node publishes when a snapshot
    replaces its image (Kafka's MetadataDelta after ``finishSnapshot``: whatever the
    snapshot does not hold is removed). ``delta.apply()`` equals ``new`` in content."""
    d = MetadataDelta(old)
    of, nf = old.features.finalized, new.features.finalized
    for name in set(of) | set(nf):
        if of.get(name, 0) != nf.get(name, 0):
            d._features[name] = nf.get(name, 0)
    ob, nb = old.cluster.brokers, new.cluster.brokers
    for bid in set(ob) | set(nb):
        if ob.get(bid) != nb.get(bid):
            d._brokers[bid] = nb.get(bid)
    for tid, t in old.topics.by_id.items():
        if tid not in new.topics.by_id:
            d._removed[tid] = t
            key = (TOPIC_RESOURCE, t.name)
            d._configs[key] = {}
            d._cleared.add(key)
    for tid, t in new.topics.by_id.items():
        before = old.topics.by_id.get(tid)
        changed = {p: reg for p, reg in t.partitions.items()
                   if before is None or before.partitions.get(p) != reg}
        if before is None or changed:
            d._topics[tid] = TopicChange(tid, t.name, before, changed)
    oc, nc = old.configs.resources, new.configs.resources
    for key in set(oc) | set(nc):
        if oc.get(key) != nc.get(key):
            d._configs[key] = dict(nc.get(key, {}))
            d._cleared.add(key)
    if new.producer_ids.next_producer_id != old.producer_ids.next_producer_id:
        d._next_producer_id = new.producer_ids.next_producer_id
    oq, nq = old.client_quotas.entities, new.client_quotas.entities
    for key in set(oq) | set(nq):
        if oq.get(key) != nq.get(key):
            have, want = oq.get(key, {}), nq.get(key, {})
            d._quotas[key] = {**{k: None for k in have}, **dict(want)}
    if new.acls != old.acls:
        d._acls = dict(new.acls.by_id)
    os_, ns = old.scram.credentials, new.scram.credentials
    for key in set(os_) | set(ns):
        if os_.get(key) != ns.get(key):
            d._scram[key] = ns.get(key)
    d.offset, d.epoch = new.offset, new.epoch
    return d


def replay_all(records, image: MetadataImage | None = None, first_offset: int | None = None) -> MetadataImage:
    """The image after ``records`` (ApiMessageAndVersion or (offset, record) pairs)."""
    delta = MetadataDelta(image if image is not None else MetadataImage())
    off = first_offset
    for r in records:
        if isinstance(r, tuple):
            delta.replay(r[1], r[0])
        else:
            delta.replay(r, off)
            if off is not None:
                off += 1
    return delta.apply()
