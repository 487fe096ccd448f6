"""Replication policies: how a remote topic is named (MM2's ReplicationPolicy).

DefaultReplicationPolicy: ``orders`` from cluster ``A`` is ``A.orders`` on the target
(``replication.policy.separator``, default ``.``); internal topics use the separator too
unless ``replication.policy.internal.topic.separator.enabled=false``.
IdentityReplicationPolicy: the remote topic keeps its name (heartbeats excepted), so it
cannot tell where a topic came from and does not prevent cycles.
"""
from __future__ import annotations


class DefaultReplicationPolicy:
    def __init__(self, separator: str = ".", internal_separator_enabled: bool = True):
        self.separator = separator
        self._internal = separator if internal_separator_enabled else "."

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        return source_alias + self.separator + topic

    def topic_source(self, topic: str) -> str | None:
        """The cluster alias a remote topic came from, None for a local topic."""
        parts = topic.split(self.separator)
        # Java's Pattern.split drops trailing empty strings
        while parts and parts[-1] == "":
            parts.pop()
        return parts[0] if len(parts) >= 2 else None

    def upstream_topic(self, topic: str) -> str | None:
        source = self.topic_source(topic)
        return None if source is None else topic[len(source) + len(self.separator):]

    def original_topic(self, topic: str) -> str:
        upstream = self.upstream_topic(topic)
        return topic if upstream is None or upstream == topic else self.original_topic(upstream)

    def heartbeats_topic(self) -> str:
        return "heartbeats"

    def offset_syncs_topic(self, cluster_alias: str) -> str:
        return "mm2-offset-syncs" + self._internal + cluster_alias + self._internal + "internal"

    def checkpoints_topic(self, cluster_alias: str) -> str:
        return cluster_alias + self._internal + "checkpoints" + self._internal + "internal"

    def is_heartbeats_topic(self, topic: str) -> bool:
        return self.heartbeats_topic() == self.original_topic(topic)

    def is_checkpoints_topic(self, topic: str) -> bool:
        return topic.endswith(self._internal + "checkpoints" + self._internal + "internal")

    def is_mm2_internal_topic(self, topic: str) -> bool:
        return topic.endswith(self._internal + "internal")

    def is_internal_topic(self, topic: str) -> bool:
        return (self.is_mm2_internal_topic(topic) or topic.startswith(("__", "."))
                or topic.endswith(("-internal", ".internal")))


class IdentityReplicationPolicy(DefaultReplicationPolicy):
    def __init__(self, separator: str = ".", internal_separator_enabled: bool = True,
                 source_cluster_alias: str | None = None):
        super().__init__(separator, internal_separator_enabled)
        self.source_cluster_alias = source_cluster_alias

    def _heartbeat(self, topic) -> bool:
        return topic is not None and topic.endswith(self.heartbeats_topic())

    def format_remote_topic(self, source_alias: str, topic: str) -> str:
        return super().format_remote_topic(source_alias, topic) if self._heartbeat(topic) else topic

    def topic_source(self, topic: str) -> str | None:
        return super().topic_source(topic) if self._heartbeat(topic) else self.source_cluster_alias

    def upstream_topic(self, topic: str) -> str | None:
        return super().upstream_topic(topic) if self._heartbeat(topic) else topic


POLICIES = {
    "org.apache.kafka.connect.mirror.DefaultReplicationPolicy": DefaultReplicationPolicy,
    "DefaultReplicationPolicy": DefaultReplicationPolicy,
    "org.apache.kafka.connect.mirror.IdentityReplicationPolicy": IdentityReplicationPolicy,
    "IdentityReplicationPolicy": IdentityReplicationPolicy,
}


def is_cycle(policy: DefaultReplicationPolicy, topic: str, target_alias: str) -> bool:
    """True if ``topic`` came (through any number of hops) from ``target_alias``: mirroring
    it there would loop (``B.orders`` on A is never mirrored back to B)."""
    seen = set()
    while topic not in seen:
        seen.add(topic)
        source = policy.topic_source(topic)
        if source is None:
            return False
        if source == target_alias:
            return True
        upstream = policy.upstream_topic(topic)
        if upstream is None or upstream == topic:
            return False
        topic = upstream
    return False
