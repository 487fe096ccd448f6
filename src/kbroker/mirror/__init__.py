"""kbroker.mirror: MirrorMaker 2 (``kbroker mirror --config mm2.properties``) on kbroker's
own client, with MM2's configuration names, topic naming, and internal record formats
(offset syncs, checkpoints, heartbeats), so MM2's tools and RemoteClusterUtils-style
failover work across kbroker, Apache Kafka and other Kafka-compatible clusters.

Modules: config (mm2.properties), policy (remote topic names, cycles), filters
(topics/groups/configs), formats (OffsetSync / Checkpoint / Heartbeat bytes),
offset_syncs (writer and translation store), topics (remote topic creation and config
sync), source (the copy loop), exactly_once (the transactional copy loop), checkpoint,
heartbeat, metrics, maker (threads per flow), remote (``translate_offsets`` for applications), cli.
"""
from kbroker.mirror.remote import heartbeats, translate_offsets

__all__ = ["translate_offsets", "heartbeats"]
