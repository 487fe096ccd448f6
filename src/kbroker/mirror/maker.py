"""MirrorMaker: run every enabled flow of an mm2.properties (``kbroker mirror``).

Per flow ``A->B`` two threads: the source task (MirrorSourceTask: consume A, produce B; with
``exactly.once.source.support = enabled`` ExactlyOnceSourceTask, transactions on B)
and the control thread, which runs MM2's connectors' periodic jobs in turn: topic refresh
and remote-topic creation (``refresh.topics.interval.seconds``), config sync
(``sync.topic.configs.interval.seconds``), checkpoints (``emit.checkpoints.interval.seconds``),
group offset sync (``sync.group.offsets.*``) and heartbeats (``emit.heartbeats.*``). A
cluster pair with heartbeats but no enabled flow gets a control thread for heartbeats only.
A failed job is logged and retried at its next interval; nothing here exits on a broker error.
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.client import Admin
from kbroker.client import errors as E
from kbroker.mirror.checkpoint import CheckpointTask
from kbroker.mirror.exactly_once import ExactlyOnceSourceTask
from kbroker.mirror.heartbeat import HeartbeatTask
from kbroker.mirror.source import MirrorSourceTask
from kbroker.mirror.topics import TopicManager

log = logging.getLogger(__name__)


class FlowRunner:
    def __init__(self, fc, stop: threading.Event, replicate: bool, heartbeats: bool):
        self.fc = fc
        self.stop = stop
        self.source_admin = Admin(fc.source_clients["admin"])
        self.target_admin = Admin(fc.target_clients["admin"])
        self.topics = TopicManager(fc, self.source_admin, self.target_admin) if replicate else None
        task_class = ExactlyOnceSourceTask if fc.exactly_once else MirrorSourceTask
        self.source_task = task_class(fc, stop) if replicate else None
        self.checkpoint_task = None
        self.heartbeat_task = HeartbeatTask(fc, self.target_admin) if heartbeats else None
        self.record_rate = 0.0
        self._samples: list[tuple[float, int]] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        if self.source_task is not None:
            self.threads.append(threading.Thread(target=self.source_task.run, name=f"mirror-source-{self.fc.flow}",
                                                 daemon=True))
        self.threads.append(threading.Thread(target=self._control, name=f"mirror-control-{self.fc.flow}",
                                             daemon=True))
        for t in self.threads:
            t.start()

    def _jobs(self) -> list:
        fc, jobs = self.fc, []
        if self.topics is not None:
            if fc.interval("refresh.topics") is not None:
                jobs.append(["refresh topics", fc.interval("refresh.topics"), self._refresh])
            if fc["sync.topic.configs.enabled"] and fc.interval("sync.topic.configs") is not None:
                jobs.append(["sync topic configs", fc.interval("sync.topic.configs"), self.topics.sync_configs])
            if fc["sync.topic.acls.enabled"] and fc.interval("sync.topic.acls") is not None:
                jobs.append(["sync topic acls", fc.interval("sync.topic.acls"), self.topics.sync_acls])
            if fc.interval("emit.checkpoints") is not None:
                jobs.append(["emit checkpoints", fc.interval("emit.checkpoints"), self._checkpoints])
            if fc["sync.group.offsets.enabled"] and fc.interval("sync.group.offsets") is not None:
                jobs.append(["sync group offsets", fc.interval("sync.group.offsets"), self._sync_groups])
            jobs.append(["sample rate", 1.0, self._sample])
        if self.heartbeat_task is not None and fc.interval("emit.heartbeats") is not None:
            jobs.append(["emit heartbeats", fc.interval("emit.heartbeats"), self.heartbeat_task.emit])
        return jobs

    def _refresh(self) -> None:
        self.source_task.set_topics(self.topics.refresh())

    def _checkpoints(self) -> None:
        if self.checkpoint_task is None:
            self.checkpoint_task = CheckpointTask(self.fc, self.source_admin, self.target_admin)
        self.checkpoint_task.emit()

    def _sync_groups(self) -> None:
        if self.checkpoint_task is not None:
            self.checkpoint_task.sync_group_offsets()

    def _sample(self) -> None:
        now = time.monotonic()
        total = sum(st.records for st in list(self.source_task.stats.values()))
        self._samples.append((now, total))
        while len(self._samples) > 1 and now - self._samples[0][0] > 10.0:
            self._samples.pop(0)
        t0, n0 = self._samples[0]
        self.record_rate = (total - n0) / (now - t0) if now > t0 else 0.0

    def _control(self) -> None:
        fc = self.fc
        if self.topics is not None:     # the internal topics and a first refresh, before anything else
            while not self.stop.is_set():
                try:
                    self.topics.create_internal_topics()
                    self._refresh()
                    if fc["sync.topic.configs.enabled"]:
                        self.topics.sync_configs()
                    break
                except E.KafkaError as e:
                    log.warning("%s: starting: %s; retrying", fc.flow, e)
                    self.stop.wait(1.0)
        jobs = self._jobs()
        now = time.monotonic()
        for j in jobs:   # [name, interval, fn, next due]
            j.append(now + (j[1] if j[0] in ("refresh topics", "sync topic configs") else 0.0))
        while not self.stop.is_set():
            now = time.monotonic()
            for j in jobs:
                if now >= j[3]:
                    j[3] = now + j[1]
                    try:
                        j[2]()
                    except Exception as e:      # noqa: BLE001 - a job failure must not stop the flow
                        log.warning("%s: %s failed: %s", fc.flow, j[0], e)
            due = min((j[3] for j in jobs), default=now + 1.0)
            self.stop.wait(max(0.01, min(1.0, due - time.monotonic())))
        for c in (self.checkpoint_task, self.heartbeat_task, self.source_admin, self.target_admin):
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass

    def join(self, deadline: float) -> list[str]:
        """Wait for this flow's threads until ``deadline`` (monotonic); the names of those
        still running (daemon threads, blocked in a client call to a cluster that is gone)."""
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


class MirrorMaker:
    def __init__(self, config, target_clusters=None):
        self.config = config
        self.stop = threading.Event()
        wanted = set(target_clusters) if target_clusters else None
        flows = {str(f.flow): f for f in config.flows if wanted is None or f.target in wanted}
        beats = {str(f.flow): f for f in config.heartbeat_flows if wanted is None or f.target in wanted}
        self.runners = [FlowRunner(flows.get(k) or beats[k], self.stop, k in flows, k in beats)
                        for k in sorted(set(flows) | set(beats))]

    def start(self) -> None:
        for r in self.runners:
            log.info("flow %s: %s", r.fc.flow, "replicating" if r.source_task else "heartbeats only")
            r.start()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop every flow and wait for them together, up to ``timeout`` seconds (default:
        the largest ``task.shutdown.graceful.timeout.ms``). As Connect's worker does after
        that timeout, tasks still running are abandoned with a log line: their threads are
        daemons, blocked in a call to a cluster that does not answer."""
        self.stop.set()
        if timeout is None:
            timeout = max((r.fc["task.shutdown.graceful.timeout.ms"] for r in self.runners), default=5000) / 1000.0
        deadline = time.monotonic() + timeout
        for r in self.runners:
            stuck = r.join(deadline)
            if stuck:
                log.warning("flow %s: graceful stop failed after %.1f s; abandoning %s",
                            r.fc.flow, timeout, ", ".join(stuck))
