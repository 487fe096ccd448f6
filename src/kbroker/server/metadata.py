"""MetadataImage / MetadataStore: the cluster's topics as the controller records them.

Single node today: the store is this broker's own durable record of topics
(name, topic id, partition count, per-topic config overrides) and the dynamic
broker configs set by (Incremental)AlterConfigs (per broker and cluster default), and the
users' SCRAM credentials (salt, stored key, server key, iterations: Kafka's
UserScramCredentialRecord; this store is the zero-config broker's
``kbroker.security.credentials.ScramCredentialStore``), the client quotas (Kafka's
ClientQuotaRecords: entity -> quota key -> value) and the ACLs (Kafka's
AccessControlEntryRecords, by id; readers take the immutable ``acl_index``), written
atomically (tmp + fsync + rename) to ``__cluster_metadata.json`` in the first
log dir. The seam for a KRaft controller: every change goes through
``create_topic`` / ``delete_topic`` / ``create_partitions`` /
``alter_topic_config`` / ``alter_broker_config`` and readers only ever see immutable snapshots
(``image``), which is how Kafka's MetadataImage is consumed by brokers.

Thread-safety: mutations hold ``_lock``; ``image`` is replaced, never mutated.
"""
from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional

from kbroker.security.authorizer import AclFilter, AclIndex, StandardAcl
from kbroker.security.scram import ScramCredential

FILE_NAME = "__cluster_metadata.json"
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


@dataclass(frozen=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)  # topic-level overrides only

    @property
    def is_internal(self) -> bool:
        return self.name in INTERNAL_TOPICS

    @property
    def topic_id_base64(self) -> str:
        """Kafka's printable form (partition.metadata, kafka-topics.sh): url-safe base64, no padding."""
        return base64.urlsafe_b64encode(self.topic_id.bytes).rstrip(b"=").decode()


@dataclass(frozen=True)
class MetadataImage:
    topics: Mapping[str, TopicImage]
    topics_by_id: Mapping[uuid.UUID, TopicImage]
    epoch: int
    #: dynamic broker configs (Kafka's BROKER ConfigRecords): resource name -> {key: value};
    #: "" is the cluster-wide default, "<node.id>" one broker's own
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def new_topic_id() -> uuid.UUID:
    """A random topic id, as Kafka's ``Uuid.randomUuid``: never the zero or
    metadata-topic id, never one whose base64 form starts with '-'."""
    while True:
        u = uuid.uuid4()
        if u.int > 1 and not base64.urlsafe_b64encode(u.bytes).startswith(b"-"):
            return u


class MetadataStore:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, FILE_NAME)
        self._lock = threading.Lock()
        self._epoch = 0
        #: the leader epoch of every partition this node leads in this run (see start_leadership)
        self._leader_epoch = 0
        self._existed = os.path.exists(self.path)
        self._broker_configs: dict[str, dict[str, str]] = {}
        #: user -> mechanism -> credential; replaced, never mutated (readers take no lock)
        self._scram: Mapping[str, Mapping[str, ScramCredential]] = MappingProxyType({})
        #: client quotas: entity key ((type, name | None), ...) -> {quota key: value}; replaced, never mutated
        self._client_quotas: Mapping = MappingProxyType({})
        #: ACL id -> ACL; replaced, never mutated; ``acl_index`` is rebuilt with it
        self._acls: Mapping[str, StandardAcl] = MappingProxyType({})
        topics: dict[str, TopicImage] = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
            self._epoch = int(doc.get("epoch", 0))
            self._leader_epoch = int(doc.get("leader_epoch", 0))
            for t in doc.get("topics", []):
                topics[t["name"]] = TopicImage(t["name"], uuid.UUID(t["topic_id"]),
                                               int(t["num_partitions"]), dict(t.get("configs", {})))
            self._broker_configs = {str(k): dict(v) for k, v in doc.get("broker_configs", {}).items() if v}
            self._scram = _frozen_scram({u: {m: ScramCredential.from_json(c) for m, c in mechs.items()}
                                         for u, mechs in doc.get("scram_credentials", {}).items()})
            self._client_quotas = _frozen_quotas({
                tuple((t, n) for t, n in q["entity"]): {k: float(v) for k, v in q["quotas"].items()}
                for q in doc.get("client_quotas", [])})
            self._acls = MappingProxyType({str(i): StandardAcl.from_json(a) for i, a in doc.get("acls", {}).items()})
        self.acl_index = AclIndex(self._acls.values())
        self._publish(topics)

    @property
    def image(self) -> MetadataImage:
        return self._image

    @property
    def leader_epoch(self) -> int:
        return self._leader_epoch

    def start_leadership(self) -> int:
        """Begin a new leadership term for every partition of this single node and return
        its leader epoch, durable before any request is served.

        In Kafka a broker that restarts loses and regains leadership of its partitions,
        and each change bumps the partition's leader epoch (KIP-320 consumers detect
        truncation by it). A fresh store starts at 0, as new partitions do; every later
        start of a node that had metadata is one more epoch."""
        with self._lock:
            if self._existed:
                self._leader_epoch += 1
                self._persist(dict(self._image.topics))
            return self._leader_epoch

    def _publish(self, topics: dict[str, TopicImage]) -> None:
        self._image = MetadataImage(MappingProxyType(dict(topics)),
                                    MappingProxyType({t.topic_id: t for t in topics.values()}),
                                    self._epoch,
                                    MappingProxyType({k: MappingProxyType(dict(v))
                                                      for k, v in self._broker_configs.items()}))

    def _persist(self, topics: dict[str, TopicImage]) -> None:
        self._epoch += 1
        doc = {"version": 1, "epoch": self._epoch, "leader_epoch": self._leader_epoch, "topics": [
            {"name": t.name, "topic_id": str(t.topic_id), "num_partitions": t.num_partitions,
             "configs": dict(t.configs)} for t in sorted(topics.values(), key=lambda t: t.name)],
            "broker_configs": {k: dict(sorted(v.items())) for k, v in sorted(self._broker_configs.items())},
            "scram_credentials": {u: {m: c.to_json() for m, c in sorted(mechs.items())}
                                  for u, mechs in sorted(self._scram.items())},
            "client_quotas": [{"entity": [list(e) for e in key], "quotas": dict(sorted(q.items()))}
                              for key, q in sorted(self._client_quotas.items(), key=lambda kv: repr(kv[0]))],
            "acls": {i: a.to_json() for i, a in sorted(self._acls.items())}}
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._publish(topics)

    def create_topic(self, name: str, num_partitions: int, configs: Mapping[str, str] | None = None,
                     topic_id: uuid.UUID | None = None) -> TopicImage:
        with self._lock:
            if name in self._image.topics:
                raise KeyError(name)
            topics = dict(self._image.topics)
            t = TopicImage(name, topic_id or new_topic_id(), num_partitions, dict(configs or {}))
            topics[name] = t
            self._persist(topics)
            return t

    def delete_topic(self, name: str) -> TopicImage:
        with self._lock:
            topics = dict(self._image.topics)
            t = topics.pop(name)
            self._persist(topics)
            return t

    def create_partitions(self, name: str, total: int) -> TopicImage:
        with self._lock:
            topics = dict(self._image.topics)
            old = topics[name]
            t = TopicImage(old.name, old.topic_id, total, old.configs)
            topics[name] = t
            self._persist(topics)
            return t

    def alter_topic_config(self, name: str, configs: Mapping[str, str]) -> TopicImage:
        """Replace the topic's overrides with ``configs`` (already validated)."""
        with self._lock:
            topics = dict(self._image.topics)
            old = topics[name]
            t = TopicImage(old.name, old.topic_id, old.num_partitions, dict(configs))
            topics[name] = t
            self._persist(topics)
            return t

    def alter_broker_config(self, resource_name: str, configs: Mapping[str, str]) -> MetadataImage:
        """Replace the dynamic broker configs of ``resource_name`` ("" = cluster default,
        else a node id) with ``configs`` (already validated); durable before it returns."""
        with self._lock:
            old = self._broker_configs
            new = dict(old)
            if configs:
                new[resource_name] = dict(configs)
            else:
                new.pop(resource_name, None)
            self._broker_configs = new
            try:
                self._persist(dict(self._image.topics))
            except BaseException:
                self._broker_configs = old
                raise
            return self._image

    # -- SCRAM credentials (kbroker.security.credentials.ScramCredentialStore) ---------------
    def scram_credential(self, user: str, mechanism: str) -> Optional[ScramCredential]:
        mechs = self._scram.get(user)
        return mechs.get(mechanism) if mechs is not None else None

    def scram_credentials(self) -> Mapping[str, Mapping[str, ScramCredential]]:
        return self._scram

    def alter_scram_credentials(self, upsertions: Mapping[tuple[str, str], ScramCredential],
                                deletions: list[tuple[str, str]]) -> None:
        """Delete then upsert (user, mechanism) credentials, all at once; durable before it returns."""
        with self._lock:
            old = self._scram
            new = {u: dict(m) for u, m in old.items()}
            for user, mech in deletions:
                new.get(user, {}).pop(mech, None)
            for (user, mech), cred in upsertions.items():
                new.setdefault(user, {})[mech] = cred
            self._scram = _frozen_scram(new)
            try:
                self._persist(dict(self._image.topics))
            except BaseException:
                self._scram = old
                raise

    # -- client quotas (kbroker.quota) ----------------------------------------------------------
    def client_quotas(self) -> Mapping:
        """entity key ((type, name | None), ...) -> {quota key: value}."""
        return self._client_quotas

    def set_client_quotas(self, quotas: Mapping) -> None:
        """Replace every client quota (an AlterClientQuotas outcome); durable before it returns."""
        with self._lock:
            old = self._client_quotas
            self._client_quotas = _frozen_quotas(quotas)
            try:
                self._persist(dict(self._image.topics))
            except BaseException:
                self._client_quotas = old
                raise

    # -- ACLs (Kafka's AclControlManager, durable before the answer) --------------------------
    def create_acls(self, acls: list[StandardAcl]) -> None:
        """Add the (already validated) ACLs; one already present is not added twice."""
        with self._lock:
            present = set(self._acls.values())
            new = dict(self._acls)
            for a in acls:
                if a not in present:
                    present.add(a)
                    new[uuid.uuid4().hex] = a
            self._set_acls(new)

    def delete_acls(self, filters: list[AclFilter]) -> list[list[StandardAcl]]:
        """Remove every ACL matching each (already validated) filter; per filter, what it matched."""
        with self._lock:
            matched = [[a for a in self._acls.values() if f.matches(a)] for f in filters]
            gone = {a for m in matched for a in m}
            if gone:
                self._set_acls({i: a for i, a in self._acls.items() if a not in gone})
            return [sorted(m) for m in matched]

    def _set_acls(self, new: dict) -> None:
        old, old_index = self._acls, self.acl_index
        self._acls = MappingProxyType(new)
        self.acl_index = AclIndex(new.values())
        try:
            self._persist(dict(self._image.topics))
        except BaseException:
            self._acls, self.acl_index = old, old_index
            raise


def _frozen_quotas(quotas: Mapping) -> Mapping:
    return MappingProxyType({k: MappingProxyType(dict(v)) for k, v in quotas.items() if v})


def _frozen_scram(creds: dict) -> Mapping[str, Mapping[str, ScramCredential]]:
    return MappingProxyType({u: MappingProxyType(dict(m)) for u, m in creds.items() if m})

