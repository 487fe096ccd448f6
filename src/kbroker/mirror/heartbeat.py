"""MirrorHeartbeatTask: every ``emit.heartbeats.interval.seconds`` write
Heartbeat(source, target, now) to the target's ``heartbeats`` topic (partition 0, created
compacted with one partition). Replicated onward as ``A.heartbeats``, heartbeats show
each hop of a replication path and its liveness (RemoteClusterUtils.replicationHops)."""
from __future__ import annotations

import time

from kbroker.client import Producer
from kbroker.mirror.formats import Heartbeat
from kbroker.mirror.topics import ensure_topic


class HeartbeatTask:
    def __init__(self, fc, target_admin):
        self.fc = fc
        self.topic = fc.policy.heartbeats_topic()
        self.target_admin = target_admin
        self.producer = Producer(fc.target_clients["producer"])
        self._created = False
        self.emitted = 0

    def emit(self) -> None:
        if not self._created:
            ensure_topic(self.target_admin, self.topic, 1, self.fc["heartbeats.topic.replication.factor"],
                         {"cleanup.policy": "compact"})
            self._created = True
        hb = Heartbeat(self.fc.source, self.fc.target, time.time_ns() // 1_000_000)
        self.producer.send(self.topic, hb.record_value(), hb.record_key(), partition=0,
                           timestamp_ms=hb.timestamp).get(self.fc["admin.timeout.ms"] / 1000.0)
        self.emitted += 1

    def close(self) -> None:
        self.producer.close(5.0)
