"""BrokerMetadataPublisher: each published metadata image, applied to a KRaft broker.

Kafka: ``BrokerMetadataPublisher.onMetadataUpdate`` and ``ReplicaManager.applyDelta``.
Runs on the raft thread (BrokerMetadataListener), once per committed batch, in log order:

1. the handler view (KRaftMetadataCache) is refreshed to the new image;
2. topic config changes go to the LogManager (before any log of the topic is created, so
   a new topic's logs start with its overrides); BROKER config changes reload the dynamic
   broker configs; client quota changes go to the broker's QuotaManagers; SCRAM credential
   changes replace the image the SASL servers read (``broker.scram_credentials``, through a
   :class:`ScramPublisher`);
3. the delta's local changes (``MetadataDelta.local_changes(node.id)``) go to the
   ReplicaManager: stop and delete replicas of removed partitions, become leader (log
   opened or created, leader epoch / replicas / ISR from the registration), become
   follower;
4. the group coordinator loads each ``__consumer_offsets`` partition this node starts
   leading (in the background) and unloads each it stops leading, the transaction
   coordinator each ``__transaction_state`` partition; deleted topics run
   the broker's topic-deletion hooks.

The first publish (``delta`` None) deletes stray logs (on disk but not placed here by the
image: Kafka's isStrayKraftReplica), then applies the whole image as if replayed from empty.
"""
from __future__ import annotations

import logging

from kbroker.metadata.delta import MetadataDelta
from kbroker.metadata.image import BROKER_RESOURCE, EMPTY_IMAGE, TOPIC_RESOURCE

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"


def full_delta(image) -> MetadataDelta:
    """A delta from the empty image to ``image`` (the first publish)."""
    delta = MetadataDelta(EMPTY_IMAGE)
    for r in image.to_records():
        delta.replay(r)
    return delta


class ScramPublisher:
    """Kafka's ScramPublisher: the first publish (``delta`` None) and each delta that changes
    SCRAM credentials hand the image's ScramImage to ``credentials`` (a
    PublishedScramCredentials the listeners' SASL servers read). A broker's
    BrokerMetadataPublisher runs one; a controller installs one on its own metadata listener."""

    def __init__(self, credentials):
        self.credentials = credentials

    def publish(self, delta, image) -> None:
        if delta is None or delta.scram_changed():
            self.credentials.update(image.scram)


class BrokerMetadataPublisher:
    def __init__(self, broker):
        self.broker = broker
        self.node_id = broker.node_id
        creds = getattr(broker, "scram_credentials", None)
        self.scram = ScramPublisher(creds) if creds is not None else None

    def publish(self, delta, image) -> None:
        b = self.broker
        first = delta is None
        if first:
            delta = full_delta(image)
        b.metadata_cache.refresh()
        changed = delta.changed_configs()
        for rtype, name in sorted(changed):
            if rtype == TOPIC_RESOURCE and name in image.topics.by_name:
                b.log_manager.update_topic_config(name, dict(image.topic_configs(name)))
        if any(rtype == BROKER_RESOURCE and name in ("", str(self.node_id)) for rtype, name in changed):
            b.dynamic_config.reload(b.log_manager)
        if delta.client_quotas_changed() and getattr(b, "quotas", None) is not None:
            b.quotas.update_quotas(image.client_quotas.entities)
        if self.scram is not None:
            self.scram.publish(None if first else delta, image)
        changes = delta.local_changes(self.node_id)
        if first:
            if getattr(getattr(b, "metadata_listener", None), "incomplete", False):
                log.warning("the metadata image skipped a snapshot: stray logs are not looked for")
            else:
                self._delete_stray_logs(image)
        if changes.deletes or changes.leaders or changes.followers:
            log.info("broker %d applying metadata offset %d: %d leader(s), %d follower(s), %d deleted",
                     self.node_id, image.offset, len(changes.leaders), len(changes.followers), len(changes.deletes))
        with b.log_manager.batched_dir_sync():
            b.replica_manager.apply_delta(changes, on_leader=self._on_leader, on_stop=self._on_stop)
        _created, removed, _touched = delta.changes()
        for t in removed.values():
            if t.name in image.topics.by_name:
                continue
            for hook in b.topic_deletion_hooks:
                try:
                    hook(t.name)
                except Exception:
                    log.exception("topic deletion hook for %s failed", t.name)
        cache = getattr(b, "topic_metadata_cache", None)
        if cache is not None and removed:
            cache.retain(image.topics.by_name)
        if not getattr(b, "serving", True):
            b.maybe_enable_request_processing()     # waits for this broker's unfencing

    def _delete_stray_logs(self, image) -> None:
        """Kafka's LogManager.isStrayKraftReplica, at the first publish (before any request
        is served): a log whose topic id is not in the image (the topic was deleted while
        this broker was down; one re-created under the same name has another id), or whose
        partition no longer lists this broker, is deleted, so it can never be served as a
        re-created topic's data. Unlike Kafka, a log without a readable topic id is kept:
        ``partition.metadata`` of a new log is not fsynced (kbroker/log: a torn one is
        rewritten from the metadata), so a missing id does not prove the log empty; if
        the image places the partition here, the log adopts the image's id."""
        lm = self.broker.log_manager
        for tp, lg in list(lm.logs.items()):
            tid = lg.topic_id
            if tid is None:
                t = image.topics.by_name.get(tp[0])
                reg = None if t is None else t.partitions.get(tp[1])
                if reg is None or self.node_id not in reg.replicas:
                    log.warning("log %s-%d has no topic id and is not placed on this broker; left alone",
                                tp[0], tp[1])
                continue
            reg = image.topics.partition(tid, tp[1])
            kt = image.topics.by_id.get(tid)
            if reg is not None and kt.name == tp[0] and self.node_id in reg.replicas:
                continue
            why = ("its topic id is not in the metadata" if reg is None or kt.name != tp[0] else
                   "the replicas no longer include this broker")
            log.warning("deleting stray log %s-%d (topic id %s): %s", tp[0], tp[1], tid, why)
            lm.delete_log(tp)

    def _on_leader(self, tp) -> None:
        if tp[0] == OFFSETS_TOPIC and self.broker.group_coordinator is not None:
            # loads on the coordinator's loader thread; requests meanwhile get COORDINATOR_LOAD_IN_PROGRESS
            self.broker.group_coordinator.startup([tp[1]], background=True, enable_retention=False)
        elif tp[0] == TRANSACTION_STATE_TOPIC and getattr(self.broker, "transaction_coordinator", None) is not None:
            from kbroker.coordinator.transaction.coordinator import on_leader
            on_leader(self.broker.transaction_coordinator, tp[1])

    def _on_stop(self, tp) -> None:
        if tp[0] == OFFSETS_TOPIC and self.broker.group_coordinator is not None:
            self.broker.group_coordinator.unload_partition(tp[1])
        elif tp[0] == TRANSACTION_STATE_TOPIC and getattr(self.broker, "transaction_coordinator", None) is not None:
            from kbroker.coordinator.transaction.coordinator import on_stop
            on_stop(self.broker.transaction_coordinator, tp[1])
