"""Deterministic simulation of one replicated partition: leader, followers, ISR, high watermark.

Three brokers hold a replica each as a real :class:`kbroker.log.Log` in a temp dir
(tmpfs when there is one). The leader side is :class:`PartitionLeader` with
:func:`follower_fetch.handle_follower_fetch`; each follower runs a
:class:`ReplicaFetcher` whose Fetch requests go through the v17 codec. A simulated
controller owns the partition state: it elects leaders from the ISR only (clean
elections), fences brokers that crash or stop heartbeating, moves leadership on a whim
(as a preferred-leader election or controlled shutdown would) and commits AlterPartition
proposals with Kafka's checks (leader epoch, partition epoch, eligible new members).
Brokers learn partition states late and in order (the metadata log). One seeded clock
and network: every message is delayed at random (so messages reorder), some are lost,
and a broker may be cut off from the other brokers (and half of the time from the
controller too) for a while; clients still reach it, so a deposed leader keeps taking
writes it can never commit. The leader sometimes gets DeleteRecords (then a retention
pass): a follower left behind its log start restarts its log there (OFFSET_OUT_OF_RANGE,
then the leader's offsets).

Producers are idempotent (one batch in flight, retried with the same sequence until
acknowledged) with acks=all and ``min.insync.replicas=2``; an ack is sent when the
leader's high watermark passes the batch. A process crash keeps every byte written;
a power loss only what the broker flushed: the reopened log is its files cut back to
the recovery point (a torn partial batch after it, sometimes), recovered without the
clean-shutdown marker. Faults keep to what Kafka promises to survive without data loss:
one broker down at a time, and a power loss only while every replica is in the ISR, so
the two others hold every acknowledged record.

Invariants, checked after every event (a violation raises :class:`InvariantViolation`
naming the seed):

* at most one leader per leader epoch;
* a leader's high watermark never goes back (within one leadership of one broker life);
* committed offsets are never reassigned: every batch below any leader's high watermark
  is the same batch (offsets and CRC) on every replica that ever has that offset below
  its own high watermark, followers included (their logs below their high watermark are
  prefixes of the leaders');
* a replica's leader-epoch cache is what its batches say (checked after every restart
  and truncation, and at the end);
* every acknowledged record is in the log of every replica that becomes leader after
  the ack, at its acknowledged offset, and, after the faults heal, in every final log;
  two acks of one batch name the same offsets (no duplicates); records below what
  DeleteRecords asked are exempt, and no log starts above that;
* liveness: after the faults heal, the partition has a leader, the ISR is full, every
  batch in flight is acknowledged and every log is the leader's.

Costs about 0.12 s of CPU per seed (3 s of faults, 4 s of healing, ~2500 events).

Reproduce: ``python -m kbroker.cluster.simulation SEED [--count N] [-v]``.
"""
from __future__ import annotations

import heapq
import logging
import os
import random
import shutil
import struct
import sys
import tempfile
import uuid
from dataclasses import dataclass, field

from kbroker.cluster.alter_partition import AlterPartitionManager
from kbroker.cluster.follower_fetch import handle_follower_fetch, maybe_increment_high_watermark
from kbroker.cluster.partition_leader import PartitionLeader
from kbroker.cluster.replica_fetcher import FetcherConfig, ReplicaFetcher
from kbroker.kernels import records
from kbroker.log import LogConfig
from kbroker.log.log import Log
from kbroker.log.producer_state import ProducerStateError
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.alter_partition import (
    AlterPartitionRequest, AlterPartitionResponse, AlterPartitionResponsePartitionData, AlterPartitionResponseTopicData,
)
from kbroker.protocol.messages.fetch import FetchableTopicResponse, FetchRequest, FetchResponse

log = logging.getLogger(__name__)

TOPIC = "sim"
TP = (TOPIC, 0)
TOPIC_ID = uuid.UUID(int=0x5151)
REPLICAS = (1, 2, 3)
FETCH_VERSION = 17
EPOCH_MS = 1_700_000_000_000     # the wall clock at simulated time 0
_BATCH_HEAD = struct.Struct(">qi")
_CRC = struct.Struct(">I")


class InvariantViolation(AssertionError):
    pass


@dataclass
class SimConfig:
    fault_ms: int = 3000            # simulated time with faults and producers
    heal_ms: int = 4000             # then: no faults, outstanding batches retried, logs converge
    max_delay_ms: int = 8
    drop: float = 0.03
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 300
    session_timeout_ms: int = 200
    fetch_wait_max_ms: int = 40
    fetch_backoff_ms: int = 20
    request_timeout_ms: int = 150
    produce_every_ms: int = 6       # mean gap between a producer's ack and its next batch
    producers: int = 2
    crash_every_ms: int = 700       # mean gaps between fault events of each kind
    move_every_ms: int = 600
    isolate_every_ms: int = 900
    delete_records_every_ms: int = 700   # DeleteRecords on the leader (then a retention pass)
    flush_every_ms: int = 40
    segment_bytes: int = 1500
    stale_producer_metadata: float = 0.15   # a producer sends to the previous leader


@dataclass
class PartitionState:
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: frozenset
    version: int


class Registry:
    """The controller's broker registrations, as a leader sees them (BrokerRegistry)."""

    def __init__(self, controller: "Controller"):
        self.c = controller

    def alive_broker_epoch(self, b):
        return None if b in self.c.fenced else self.c.broker_epochs[b]

    def is_fenced(self, b):
        return b in self.c.fenced

    def is_shutting_down(self, b):
        return False


class Controller:
    def __init__(self, sim: "Sim"):
        self.sim = sim
        self.broker_epochs = {b: 1 for b in REPLICAS}
        self.fenced: set[int] = set()
        self.last_heartbeat = {b: 0 for b in REPLICAS}
        self.state = PartitionState(REPLICAS[0], 0, 0, frozenset(REPLICAS), 0)

    def _publish(self, **changes) -> None:
        s = self.state
        vals = dict(leader=s.leader, leader_epoch=s.leader_epoch, partition_epoch=s.partition_epoch + 1,
                    isr=s.isr, version=s.version + 1)
        vals.update(changes)
        self.state = PartitionState(**vals)
        self.sim.trace(f"controller: {self.state}")
        for b in REPLICAS:
            self.sim.push_metadata(b)

    def _electable(self, candidates) -> list[int]:
        return [b for b in REPLICAS if b in candidates and b not in self.fenced and self.sim.brokers[b].alive]

    def elect(self, exclude=()) -> None:
        """A new leader from the ISR (clean election); none: offline, the ISR kept."""
        s = self.state
        choices = self._electable(s.isr - set(exclude))
        leader = self.sim.rng.choice(choices) if choices else -1
        self._publish(leader=leader, leader_epoch=s.leader_epoch + 1)

    def fence(self, b: int) -> None:
        if b in self.fenced:
            return
        self.fenced.add(b)
        s = self.state
        isr = s.isr - {b} if len(s.isr) > 1 else s.isr     # Kafka keeps the last member
        if s.leader == b:
            choices = self._electable(isr - {b})
            leader = self.sim.rng.choice(choices) if choices else -1
            self._publish(leader=leader, leader_epoch=s.leader_epoch + 1, isr=isr)
        elif isr != s.isr:
            self._publish(isr=isr)

    def unfence(self, b: int) -> None:
        if b not in self.fenced:
            return
        self.fenced.discard(b)
        s = self.state
        if s.leader == -1 and b in s.isr:
            self._publish(leader=b, leader_epoch=s.leader_epoch + 1)

    def register(self, b: int) -> int:
        """A broker starts: a new broker epoch (it was fenced when it crashed)."""
        self.broker_epochs[b] += 1
        self.last_heartbeat[b] = self.sim.now
        self.unfence(b)
        return self.broker_epochs[b]

    def tick(self) -> None:
        for b in REPLICAS:
            if b not in self.fenced and self.sim.now - self.last_heartbeat[b] > self.sim.cfg.session_timeout_ms:
                self.sim.trace(f"controller: broker {b} missed its heartbeats")
                self.fence(b)

    def heartbeat(self, b: int) -> None:
        self.last_heartbeat[b] = self.sim.now
        if b in self.fenced and self.sim.brokers[b].alive:
            self.unfence(b)

    def alter_partition(self, req: AlterPartitionRequest) -> AlterPartitionResponse:
        """Kafka's checks, per partition: the sender's broker epoch, its leader epoch,
        the partition epoch (a request for the current ISR is answered with it), and new
        members alive, unfenced and in their current broker epoch."""
        b = req.broker_id
        if req.broker_epoch != self.broker_epochs[b] or b in self.fenced:
            return AlterPartitionResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                err = self._alter(b, p)
                s = self.state
                parts.append(AlterPartitionResponsePartitionData(
                    partition_index=p.partition_index, error_code=err, leader_id=s.leader,
                    leader_epoch=s.leader_epoch, isr=sorted(s.isr), partition_epoch=s.partition_epoch))
            topics.append(AlterPartitionResponseTopicData(topic_id=t.topic_id, partitions=parts))
        return AlterPartitionResponse(error_code=ErrorCode.NONE, topics=topics)

    def _alter(self, b: int, p) -> int:
        s = self.state
        if b != s.leader or p.leader_epoch != s.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        new = {x.broker_id: x.broker_epoch for x in p.new_isr_with_epochs}
        if p.partition_epoch != s.partition_epoch:
            return ErrorCode.NONE if frozenset(new) == s.isr else ErrorCode.INVALID_UPDATE_VERSION
        for r, e in new.items():
            if r not in s.isr and (r in self.fenced or not self.sim.brokers[r].alive
                                   or (e != -1 and e != self.broker_epochs[r])):
                return ErrorCode.INELIGIBLE_REPLICA
        if frozenset(new) != s.isr:
            self._publish(isr=frozenset(new))
        return ErrorCode.NONE


@dataclass
class PendingAck:
    required_offset: int
    producer: int
    seq: int
    first: int
    last: int
    deadline: int


class Broker:
    def __init__(self, sim: "Sim", bid: int):
        self.sim = sim
        self.id = bid
        self.dir = os.path.join(sim.root, f"broker-{bid}", f"{TOPIC}-0")
        self.alive = True
        self.life = 0
        self.broker_epoch = 1
        self.log = self._open(0, 0, None)
        self.leader = PartitionLeader(bid, Registry(sim.controller), sim.cfg.replica_lag_time_max_ms,
                                      sim.cfg.min_insync_replicas, local_broker_epoch=1)
        self.fetcher: ReplicaFetcher | None = None
        self.offsets_query = None        # the leader-offsets query in flight (a token)
        self.fetch_token = 0
        self.parked: list = []           # follower fetches waiting for data (DelayedFetch)
        self.pending_acks: list[PendingAck] = []
        self.applied_version = -1
        self.flushed_hw = 0
        self.alter_partition = AlterPartitionManager(bid, lambda: self.broker_epoch, retry_backoff_ms=20)

    def _open(self, log_start_offset: int, recovery_point: int, hw: int | None) -> Log:
        cfg = LogConfig({"segment.bytes": self.sim.cfg.segment_bytes, "file.delete.delay.ms": 0})
        return Log.open(self.dir, cfg, time_ms=lambda: self.sim.now + EPOCH_MS,
                        log_start_offset=log_start_offset, recovery_point=recovery_point, high_watermark=hw,
                        had_clean_shutdown=False)

    # -- metadata ----------------------------------------------------------------------
    def apply_metadata(self, s: PartitionState) -> None:
        if not self.alive or s.version <= self.applied_version:
            return
        self.applied_version = s.version
        sim = self.sim
        if s.leader == self.id:
            if self.fetcher is not None:
                self.fetcher = None
                self.fetch_token += 1
            pl = self.leader
            new_epoch = not pl.is_leader or s.leader_epoch != pl.leader_epoch
            if new_epoch:
                self.log.assign_epoch_start_offset(s.leader_epoch, self.log.log_end_offset)
                sim.became_leader(self, s.leader_epoch)
            pl.make_leader(sim.now, leader_epoch=s.leader_epoch, partition_epoch=s.partition_epoch,
                           replicas=REPLICAS, isr=s.isr, leader_end_offset=self.log.log_end_offset)
            self.after_leader_change()
        else:
            if self.leader.is_leader:
                self.leader.make_follower()
                self.fail_pending(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                self.parked.clear()
            if s.leader == -1:
                self.fetcher = None
                self.fetch_token += 1
                return
            if self.fetcher is None or self.fetcher.source_broker_id != s.leader:
                self.fetcher = ReplicaFetcher(self.id, s.leader, lambda: self.broker_epoch, FetcherConfig(
                    wait_max_ms=sim.cfg.fetch_wait_max_ms, backoff_ms=sim.cfg.fetch_backoff_ms,
                    max_bytes=sim.rng.choice([300, 1000, 1 << 20])))
                self.fetch_token += 1
            self.fetcher.add_partition(TP, TOPIC_ID, s.leader_epoch, self.log)
            sim.poll_fetcher(self)

    # -- leader ------------------------------------------------------------------------
    def after_leader_change(self) -> None:
        """An append, a follower fetch or an ISR change: move the high watermark, ack."""
        if not self.leader.is_leader:
            return
        maybe_increment_high_watermark(self.leader, self.log, self.sim.now)
        self.complete_acks()

    def complete_acks(self) -> None:
        hw = self.log.high_watermark
        keep = []
        for a in self.pending_acks:
            done, err = self.leader.check_enough_replicas_reach_offset(a.required_offset, hw)
            if done:
                self.sim.send_produce_response(self, a, err)
            elif self.sim.now >= a.deadline:
                self.sim.send_produce_response(self, a, ErrorCode.REQUEST_TIMED_OUT)
            else:
                keep.append(a)
        self.pending_acks = keep

    def fail_pending(self, err: int) -> None:
        for a in self.pending_acks:
            self.sim.send_produce_response(self, a, err)
        self.pending_acks = []

    def produce(self, producer: int, seq: int, values: list[bytes]) -> tuple[int, PendingAck | None]:
        pl = self.leader
        if not pl.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
        err = pl.check_append(-1)
        if err:
            return err, None
        buf = bytearray(records.encode_batch([(self.sim.now + EPOCH_MS, b"k", v, []) for v in values],
                                             producer_id=producer, producer_epoch=0, base_sequence=seq))
        try:
            info = self.log.append_as_leader(buf, leader_epoch=pl.leader_epoch)
        except ProducerStateError as e:
            return e.error_code, None
        ack = PendingAck(info.last_offset + 1, producer, seq, info.first_offset, info.last_offset,
                         self.sim.now + self.sim.cfg.request_timeout_ms)
        self.pending_acks.append(ack)
        self.sim.wake_parked(self)
        self.after_leader_change()
        return ErrorCode.NONE, ack

    # -- crash / restart ------------------------------------------------------------------
    def crash(self, power_loss: bool, torn: bool) -> None:
        """A process crash keeps every byte written (the page cache); a power loss only
        what was flushed (the files cut at the recovery point, maybe a torn batch after).
        Either way the restart recovers from the recovery point without the clean-shutdown
        marker, with the high watermark of the last flush (its checkpoint)."""
        lg = self.log
        rp = lg.recovery_point
        # nothing durable at or above the log start offset: every segment goes
        where = lg.convert_to_offset_metadata(rp) if rp >= lg.log_start_offset else None
        with lg._lock:
            lg._closed = True
            segs = list(lg._segments) + [s for _, s in lg._pending_deletes]
        for s in segs:
            s.close_handlers()
        for name in os.listdir(self.dir) if power_loss else ():
            if name.endswith(".log"):
                base = int(name[:20])
                path = os.path.join(self.dir, name)
                if where is None or base > where.segment_base_offset:
                    os.unlink(path)
                elif base == where.segment_base_offset:
                    os.truncate(path, where.relative_position_in_segment)
                    if torn:
                        with open(path, "ab") as f:
                            f.write(self.sim.rng.randbytes(self.sim.rng.randrange(1, 40)))
        self.alive = False
        self.fetcher = None
        self.fetch_token += 1
        self.parked.clear()
        self.pending_acks = []
        self.leader.make_follower()
        self.applied_version = -1
        self.restart_rp = rp
        self.restart_lso = lg.log_start_offset      # its checkpoint

    def restart(self) -> None:
        self.life += 1
        self.log = self._open(self.restart_lso, self.restart_rp, None)
        self.log.update_high_watermark(self.flushed_hw)
        self.alive = True
        self.leader = PartitionLeader(self.id, Registry(self.sim.controller), self.sim.cfg.replica_lag_time_max_ms,
                                      self.sim.cfg.min_insync_replicas)
        self.broker_epoch = self.sim.controller.register(self.id)
        self.leader.local_broker_epoch = self.broker_epoch
        self.alter_partition = AlterPartitionManager(self.id, lambda: self.broker_epoch, retry_backoff_ms=20)
        self.sim.push_metadata(self.id)

    def flush(self) -> None:
        if self.alive:
            self.log.flush()
            self.flushed_hw = self.log.high_watermark


class Producer:
    def __init__(self, pid: int):
        self.pid = pid
        self.seq = 0
        self.values: list[bytes] | None = None   # the batch in flight
        self.attempt = 0
        self.acked: dict[int, tuple[int, int]] = {}   # seq -> (first, last)
        self.errors = 0


class Sim:
    def __init__(self, seed: int, cfg: SimConfig | None = None, verbose: bool = False):
        self.seed = seed
        self.cfg = cfg or SimConfig()
        self.rng = random.Random(seed)
        self.now = 0
        self._q: list = []
        self._n = 0
        self.verbose = verbose
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.root = tempfile.mkdtemp(prefix=f"kbroker-repl-sim-{seed}-", dir=base)
        self.controller = Controller(self)
        self.brokers = {b: Broker(self, b) for b in REPLICAS}
        self.isolated: int | None = None
        self.isolated_from_controller = True   # else only from the other brokers
        self.producers = [Producer(1000 + i) for i in range(self.cfg.producers)]
        # checker state
        self.leader_of_epoch: dict[int, int] = {}
        self.leader_hw: dict[tuple, int] = {}
        self.committed: dict[int, tuple[int, int]] = {}     # offset -> (batch base offset, crc)
        self.acked: dict[int, bytes] = {}                   # offset -> value
        self.checked_hw: dict[tuple, int] = {}
        self.producing = True
        self.events = 0
        self.deleted_below = 0          # DeleteRecords asked for: acked records below may go
        self.stats: dict[str, int] = {}

    # -- plumbing ----------------------------------------------------------------------------
    def count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def trace(self, msg: str) -> None:
        if self.verbose:
            print(f"{self.now:6d} {msg}")

    def at(self, t: int, fn) -> None:
        self._n += 1
        heapq.heappush(self._q, (t, self._n, fn))

    def after(self, dt: int, fn) -> None:
        self.at(self.now + dt, fn)

    def delay(self) -> int:
        return self.rng.randint(1, self.cfg.max_delay_ms)

    def lost(self) -> bool:
        return self.rng.random() < self.cfg.drop

    def cut(self, a: int, b: int) -> bool:
        """Brokers/controller (0) a and b cannot talk (clients, negative ids, always reach
        a broker; the controller too unless the isolation includes it)."""
        if self.isolated is None or a < 0 or b < 0:
            return False
        if not self.isolated_from_controller and (a == 0 or b == 0):
            return False
        return (a == self.isolated) != (b == self.isolated)

    def send(self, src: int, dst: int, fn, droppable: bool = True) -> None:
        if self.cut(src, dst) or (droppable and self.lost()):
            return
        self.after(self.delay(), lambda: None if self.cut(src, dst) else fn())

    def fail(self, msg: str) -> None:
        raise InvariantViolation(f"seed {self.seed} at {self.now} ms: {msg}\n"
                                 f"reproduce: python -m kbroker.cluster.simulation {self.seed} -v")

    # -- metadata -------------------------------------------------------------------------------
    def push_metadata(self, b: int) -> None:
        state = self.controller.state
        broker = self.brokers[b]

        def deliver():
            if self.cut(0, b):
                self.after(50, deliver)          # the metadata log is fetched again later
                return
            broker.apply_metadata(self.controller.state if self.controller.state.version >= state.version
                                  else state)
        self.after(self.delay() * 2, deliver)

    def became_leader(self, broker: Broker, epoch: int) -> None:
        prev = self.leader_of_epoch.get(epoch)
        if prev is not None and prev != broker.id:
            self.fail(f"two leaders in epoch {epoch}: {prev} and {broker.id}")
        self.leader_of_epoch[epoch] = broker.id
        # what it had as a follower was checked; from here on its high watermark commits
        self.leader_hw[(broker.id, broker.life, epoch)] = broker.log.high_watermark
        self.trace(f"broker {broker.id} leads epoch {epoch} at log end {broker.log.log_end_offset}")
        missing = self._missing_acked(broker.log)
        if missing:
            self.fail(f"broker {broker.id} became leader of epoch {epoch} without acknowledged records "
                      f"{missing[:5]}")

    # -- follower fetches -------------------------------------------------------------------------
    def poll_fetcher(self, f: Broker) -> None:
        fetcher = f.fetcher
        if not f.alive or fetcher is None:
            return
        self.query_leader_offsets(f)
        req = fetcher.poll(self.now)
        if req is None:
            d = fetcher.next_deadline_ms()
            if d is not None and d > self.now and not fetcher.in_flight:
                tok = f.fetch_token
                self.at(d, lambda: self.poll_fetcher(f) if f.fetch_token == tok else None)
            return
        f.fetch_token += 1
        tok = f.fetch_token
        wire = req.encode(FETCH_VERSION)
        leader = self.brokers[fetcher.source_broker_id]
        self.send(f.id, leader.id, lambda: self.serve_fetch(leader, f, tok, wire))
        self.after(self.cfg.request_timeout_ms, lambda: self.fetch_answered(f, tok, None))

    def query_leader_offsets(self, f: Broker) -> None:
        """An OUT_OF_RANGE partition asks the leader for its log start and end offsets
        (ListOffsets EARLIEST / LATEST with the replica id, in the server)."""
        fetcher = f.fetcher
        queries = fetcher.offset_queries()
        if not queries or f.offsets_query is not None:
            return
        (tp, epoch), = queries
        token = object()
        f.offsets_query = token
        leader = self.brokers[fetcher.source_broker_id]

        def at_leader():
            if not leader.alive:
                return
            pl = leader.leader
            if not pl.is_leader:
                answer = (-1, -1, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            elif epoch > pl.leader_epoch:
                answer = (-1, -1, ErrorCode.UNKNOWN_LEADER_EPOCH)
            elif epoch < pl.leader_epoch:
                answer = (-1, -1, ErrorCode.FENCED_LEADER_EPOCH)
            else:
                answer = (leader.log.log_start_offset, leader.log.log_end_offset, ErrorCode.NONE)
            self.send(leader.id, f.id, lambda: answered(*answer))

        def answered(start, end, err):
            if f.offsets_query is not token:
                return
            f.offsets_query = None
            if not f.alive or f.fetcher is not fetcher:
                return
            outcome = fetcher.on_leader_offsets(self.now, tp, epoch, start, end, err)
            self.count(f"leader_offsets_{outcome}")
            self.trace(f"broker {f.id}: leader offsets [{start}, {end}) {ErrorCode(err).name}: {outcome}")
            if outcome == "truncated":
                self.check_epoch_cache(f)
            self.poll_fetcher(f)

        def timed_out():
            if f.offsets_query is token:
                f.offsets_query = None
                self.poll_fetcher(f)
        self.send(f.id, leader.id, at_leader)
        self.after(self.cfg.request_timeout_ms, timed_out)

    def fetch_answered(self, f: Broker, tok: int, resp) -> None:
        if not f.alive or f.fetch_token != tok or f.fetcher is None:
            return
        f.fetch_token += 1
        outcome = f.fetcher.on_fetch_response(self.now, resp)
        for v in outcome.values():
            self.count(f"fetch_{v}")
        if "truncated" in outcome.values():
            self.check_epoch_cache(f)
        if self.verbose and outcome and any(v not in ("empty", "appended") for v in outcome.values()):
            self.trace(f"broker {f.id} fetch: {outcome}")
        self.check_follower(f)
        self.poll_fetcher(f)

    def serve_fetch(self, leader: Broker, f: Broker, tok: int, wire: bytes, parked_at: int | None = None) -> None:
        if not leader.alive:
            return
        req = FetchRequest.decode(wire, FETCH_VERSION)
        topics = []
        has_data = False
        for t in req.topics:
            parts = []
            for p in t.partitions:
                r = handle_follower_fetch(leader.leader, leader.log, self.now, replica_id=req.replica_state.replica_id,
                                          broker_epoch=req.replica_state.replica_epoch,
                                          current_leader_epoch=p.current_leader_epoch, fetch_offset=p.fetch_offset,
                                          last_fetched_epoch=p.last_fetched_epoch,
                                          log_start_offset=p.log_start_offset, max_bytes=p.partition_max_bytes)
                d = r.data
                d.partition_index = p.partition
                if d.records is not None and not isinstance(d.records, (bytes, bytearray)):
                    d.records = d.records.read_bytes()
                if d.records or d.error_code or d.diverging_epoch.epoch >= 0:
                    has_data = True
                if r.proposal is not None:
                    self.submit(leader, r.proposal)
                parts.append(d)
            topics.append(FetchableTopicResponse(topic_id=t.topic_id, partitions=parts))
        leader.after_leader_change()
        waited = 0 if parked_at is None else self.now - parked_at
        if not has_data and waited < req.max_wait_ms and leader.leader.is_leader:
            first = parked_at if parked_at is not None else self.now
            leader.parked.append((f, tok, wire, first))
            self.after(req.max_wait_ms - waited, lambda: self.unpark(leader, (f, tok, wire, first)))
            return
        resp = FetchResponse(responses=topics)
        self.send(leader.id, f.id, lambda: self.fetch_answered(f, tok, resp))

    def unpark(self, leader: Broker, entry) -> None:
        if entry in leader.parked:
            leader.parked.remove(entry)
            f, tok, wire, first = entry
            self.serve_fetch(leader, f, tok, wire, parked_at=first - 10**9)   # due: answer now

    def wake_parked(self, leader: Broker) -> None:
        parked, leader.parked = leader.parked, []
        for f, tok, wire, first in parked:
            self.serve_fetch(leader, f, tok, wire, parked_at=first)

    # -- ISR proposals ------------------------------------------------------------------------------
    def submit(self, b: Broker, proposal) -> None:
        """Queue an ISR proposal on the broker's AlterPartitionManager."""
        life = b.life

        def done(result, err):
            if not b.alive or b.life != life:
                return
            outcome = b.leader.on_alter_partition_result(proposal, result, err)
            self.trace(f"broker {b.id} AlterPartition {sorted(proposal.sent.isr)}: {ErrorCode(err).name} {outcome}")
            if outcome == "retry":
                self.submit(b, proposal)
            b.after_leader_change()

        if not b.alter_partition.submit(TOPIC, TOPIC_ID, 0, proposal.sent, done):
            done(None, ErrorCode.OPERATION_NOT_ATTEMPTED)
        self.pump_alter_partition(b)

    def pump_alter_partition(self, b: Broker) -> None:
        """Send the broker's AlterPartition request, if it has one to send now; a request
        or answer lost fails the request after the request timeout (the manager retries)."""
        mgr = b.alter_partition
        req = mgr.poll(self.now)
        if req is None:
            return
        wire = req.encode(3)
        state = {"answered": False}

        def answer(resp):
            if state["answered"] or b.alter_partition is not mgr or not b.alive:
                return
            state["answered"] = True
            for cb, res, err in mgr.on_response(self.now, resp):
                cb(res, err)
            self.pump_alter_partition(b)

        def at_controller():
            resp = self.controller.alter_partition(AlterPartitionRequest.decode(wire, 3))
            self.send(0, b.id, lambda: answer(AlterPartitionResponse.decode(resp.encode(3), 3)))
        self.send(b.id, 0, at_controller)
        self.after(self.cfg.request_timeout_ms, lambda: answer(None))

    def leader_tick(self, b: Broker) -> None:
        if b.alive and b.leader.is_leader:
            proposal = b.leader.maybe_shrink_isr(self.now, b.log.log_end_offset)
            if proposal is not None:
                self.submit(b, proposal)
            self.pump_alter_partition(b)       # retries after the manager's backoff
            b.complete_acks()
            b.after_leader_change()

    # -- producers ----------------------------------------------------------------------------------
    def producer_target(self) -> int:
        s = self.controller.state
        if self.rng.random() < self.cfg.stale_producer_metadata and self.leader_of_epoch.get(s.leader_epoch - 1):
            return self.leader_of_epoch[s.leader_epoch - 1]
        return s.leader

    def produce(self, p: Producer) -> None:
        if p.values is None:
            if not self.producing:
                return
            p.values = [b"p%d-s%d-r%d" % (p.pid, p.seq, i) for i in range(self.rng.randint(1, 3))]
        p.attempt += 1
        attempt = p.attempt
        target = self.producer_target()
        seq, values = p.seq, p.values
        if target != -1:
            b = self.brokers[target]

            def at_broker():
                if not b.alive:
                    return
                err, ack = b.produce(p.pid, seq, values)
                if ack is None:
                    self.send_produce_response(b, PendingAck(0, p.pid, seq, -1, -1, 0), err)
            self.send(-p.pid, target, at_broker)
        self.after(self.cfg.request_timeout_ms + 20,
                   lambda: self.produce(p) if p.attempt == attempt and p.values is not None else None)

    def send_produce_response(self, b: Broker, a: PendingAck, err: int) -> None:
        p = next(x for x in self.producers if x.pid == a.producer)
        self.send(b.id, -p.pid, lambda: self.produce_answered(p, a, err))

    def produce_answered(self, p: Producer, a: PendingAck, err: int) -> None:
        if err != ErrorCode.NONE:
            if err not in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS,
                           ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
                p.errors += 1
                self.trace(f"producer {p.pid} seq {a.seq}: {ErrorCode(err).name}")
            if a.seq == p.seq and p.values is not None:
                attempt = p.attempt
                self.after(10, lambda: self.produce(p) if p.attempt == attempt else None)
            return
        prev = p.acked.get(a.seq)
        if prev is not None:
            if prev != (a.first, a.last):
                self.fail(f"producer {p.pid} seq {a.seq} acknowledged at {prev} and at {(a.first, a.last)}")
            return
        if a.seq != p.seq:
            self.fail(f"producer {p.pid}: ack of seq {a.seq} while seq {p.seq} is in flight")
        values = p.values
        if a.last - a.first + 1 != len(values):
            self.fail(f"producer {p.pid} seq {a.seq}: {len(values)} records acknowledged at {a.first}..{a.last}")
        p.acked[a.seq] = (a.first, a.last)
        for i, v in enumerate(values):
            off = a.first + i
            if off in self.acked and self.acked[off] != v:
                self.fail(f"offset {off} acknowledged twice: {self.acked[off]!r} and {v!r}")
            self.acked[off] = v
        p.seq += len(values)
        p.values = None
        self.after(self.rng.randint(0, 2 * self.cfg.produce_every_ms), lambda: self.produce(p))

    # -- faults -------------------------------------------------------------------------------------
    def full_isr_everyone_up(self) -> bool:
        c = self.controller
        return (c.state.isr == frozenset(REPLICAS) and not c.fenced and self.isolated is None
                and all(b.alive for b in self.brokers.values()))

    def fault_crash(self) -> None:
        if self.now < self.cfg.fault_ms:
            # A power loss only while the two others hold every acknowledged record (Kafka
            # needs an ISR member that did not lose its tail); a process crash any time
            # one broker is down at most.
            power_loss = self.rng.random() < 0.6
            if self.full_isr_everyone_up() if power_loss else all(b.alive for b in self.brokers.values()):
                b = self.brokers[self.rng.choice(REPLICAS)]
                torn = power_loss and self.rng.random() < 0.5
                self.trace(f"CRASH broker {b.id} (recovery point {b.log.recovery_point}, "
                           f"log end {b.log.log_end_offset}, power loss={power_loss}, torn={torn})")
                lost = power_loss and b.log.recovery_point < b.log.log_end_offset
                self.count("crash_lost_records" if lost else "crash")
                b.crash(power_loss, torn)
                self.controller.fence(b.id)
                self.after(self.rng.randint(50, 400), lambda: self.restart(b))
            self.after(int(self.rng.expovariate(1 / self.cfg.crash_every_ms)) + 1, self.fault_crash)

    def restart(self, b: Broker) -> None:
        self.trace(f"RESTART broker {b.id}")
        b.restart()
        self.trace(f"broker {b.id} reopened: log end {b.log.log_end_offset}, hw {b.log.high_watermark}")
        self.check_epoch_cache(b)
        self.check_follower(b)

    def fault_move(self) -> None:
        if self.now < self.cfg.fault_ms:
            s = self.controller.state
            if s.leader != -1 and self.controller._electable(s.isr - {s.leader}):
                self.trace("controller: moving leadership")
                self.controller.elect(exclude=(s.leader,))
                self.count("leader_move")
            self.after(int(self.rng.expovariate(1 / self.cfg.move_every_ms)) + 1, self.fault_move)

    def fault_isolate(self) -> None:
        if self.now < self.cfg.fault_ms:
            if self.isolated is None and all(b.alive for b in self.brokers.values()):
                self.isolated = self.rng.choice(REPLICAS)
                self.isolated_from_controller = self.rng.random() < 0.5
                self.trace(f"ISOLATE broker {self.isolated} (from the controller too: "
                           f"{self.isolated_from_controller})")
                self.count("isolation")
                self.after(self.rng.randint(100, 600), self.heal_isolation)
            self.after(int(self.rng.expovariate(1 / self.cfg.isolate_every_ms)) + 1, self.fault_isolate)

    def fault_delete_records(self) -> None:
        """DeleteRecords at the leader up to a random offset below its high watermark,
        then a retention pass (segments wholly below the log start offset go): a follower
        that lost more than that on a crash must restart its log at the leader's start."""
        if self.now < self.cfg.fault_ms:
            s = self.controller.state
            b = self.brokers.get(s.leader)
            if b is not None and b.alive and b.leader.is_leader and b.log.high_watermark > b.log.log_start_offset:
                target = self.rng.randint(b.log.log_start_offset, b.log.high_watermark)
                self.deleted_below = max(self.deleted_below, target)
                b.log.delete_records(target)
                b.log.delete_old_segments()
                self.count("delete_records")
                self.trace(f"broker {b.id}: DeleteRecords to {target}")
            self.after(int(self.rng.expovariate(1 / self.cfg.delete_records_every_ms)) + 1, self.fault_delete_records)

    def heal_isolation(self) -> None:
        self.trace(f"HEAL broker {self.isolated}")
        self.isolated = None

    # -- periodic ---------------------------------------------------------------------------------------
    def tick(self) -> None:
        for b in self.brokers.values():
            if b.alive and not self.cut(b.id, 0):
                self.controller.heartbeat(b.id)
        self.controller.tick()
        for b in self.brokers.values():
            self.leader_tick(b)
            if b.alive and b.fetcher is not None and not b.fetcher.in_flight:
                self.poll_fetcher(b)
        self.after(10, self.tick)

    def flush_tick(self) -> None:
        b = self.brokers[self.rng.choice(REPLICAS)]
        b.flush()
        self.after(self.rng.randint(1, 2 * self.cfg.flush_every_ms), self.flush_tick)

    # -- checks --------------------------------------------------------------------------------------------
    def _batches(self, lg: Log, start: int, end: int):
        """(base offset, last offset, crc) of the batches holding offsets [start, end)."""
        out = []
        off = start
        while off < end:
            data = lg.read(off, 1 << 20).records.read_bytes()
            pos, n = 0, len(data)
            progressed = False
            while pos + 61 <= n:
                base, length = _BATCH_HEAD.unpack_from(data, pos)
                size = 12 + length
                if size > n - pos:
                    break
                last = base + struct.unpack_from(">i", data, pos + 23)[0]
                crc = _CRC.unpack_from(data, pos + 17)[0]
                if base >= end:
                    return out
                out.append((base, last, crc))
                off = last + 1
                progressed = True
                pos += size
            if not progressed:
                raise InvariantViolation(f"seed {self.seed}: cannot read {lg} at {off}")
        return out

    def check_epoch_cache(self, b: Broker) -> None:
        """The leader-epoch cache is what the batches say: the first offset of each new
        partition leader epoch, epochs never going back; plus, on a replica that led, an
        entry at the log end for an epoch it has not written in yet."""
        lg = b.log
        derived = []
        off, end = lg.log_start_offset, lg.log_end_offset
        while off < end:
            data = lg.read(off, 1 << 20).records.read_bytes()
            pos, n = 0, len(data)
            while pos + 61 <= n:
                base, length = _BATCH_HEAD.unpack_from(data, pos)
                if 12 + length > n - pos:
                    break
                epoch = struct.unpack_from(">i", data, pos + 12)[0]
                if derived and epoch < derived[-1][0]:
                    self.fail(f"broker {b.id}: batch {base} has epoch {epoch} after epoch {derived[-1][0]}")
                if not derived or epoch > derived[-1][0]:
                    derived.append((epoch, max(base, lg.log_start_offset)))
                off = base + struct.unpack_from(">i", data, pos + 23)[0] + 1
                pos += 12 + length
        entries = lg.leader_epoch_cache.epoch_entries()
        if entries and entries[-1][1] == end and (not derived or entries[-1][0] > derived[-1][0]):
            entries = entries[:-1]
        if entries != derived:
            self.fail(f"broker {b.id}: leader-epoch cache {entries} but its batches say {derived}")

    def _missing_acked(self, lg: Log) -> list[int]:
        """Acknowledged offsets not in ``lg`` with their value (those below what
        DeleteRecords removed excepted)."""
        if lg.log_start_offset > self.deleted_below:
            self.fail(f"{lg.name} starts at {lg.log_start_offset}: nothing deleted records above "
                      f"{self.deleted_below}")
        leo = lg.log_end_offset
        acked = {o: v for o, v in self.acked.items() if o >= lg.log_start_offset}
        missing = [o for o in acked if o >= leo]
        if missing:
            return sorted(missing)
        if not acked:
            return []
        got = {}
        data_off = min(acked)
        while data_off < leo:
            data = lg.read(data_off, 1 << 20).records.read_bytes()
            bs = records.decode_batches(data)
            if not bs:
                break
            for bt in bs:
                for r in bt.records:
                    got[r.offset] = r.value
            data_off = bs[-1].base_offset + bs[-1].last_offset_delta + 1
        return sorted(o for o, v in acked.items() if got.get(o) != v)

    def note_committed(self, b: Broker, lg: Log, start: int, end: int, what: str) -> None:
        for base, last, crc in self._batches(lg, start, end):
            for off in range(max(base, start), min(last + 1, end)):
                known = self.committed.get(off)
                if known is None:
                    if what == "follower":
                        self.fail(f"broker {b.id}: offset {off} is below its high watermark {end} "
                                  f"but no leader committed it")
                    self.committed[off] = (base, crc)
                elif known != (base, crc):
                    self.fail(f"broker {b.id} ({what}): offset {off} is in batch {(base, crc)} below the high "
                              f"watermark; it was committed in batch {known}")

    def check_follower(self, b: Broker) -> None:
        """A follower's log below its high watermark is made of committed batches."""
        if not b.alive:
            return
        key = (b.id, b.life)
        hw = b.log.high_watermark
        start = min(self.checked_hw.get(key, 0), hw)
        if b.log.log_start_offset > start:
            start = b.log.log_start_offset
        if hw > start:
            self.note_committed(b, b.log, start, hw, "follower")
        self.checked_hw[key] = hw

    def check(self) -> None:
        epochs = {}
        for b in self.brokers.values():
            if not b.alive or not b.leader.is_leader:
                continue
            e = b.leader.leader_epoch
            if e in epochs:
                self.fail(f"brokers {epochs[e]} and {b.id} both lead epoch {e}")
            epochs[e] = b.id
            key = (b.id, b.life, e)
            hw = b.log.high_watermark
            prev = self.leader_hw.get(key)
            if prev is not None and hw < prev:
                self.fail(f"leader {b.id} high watermark went back from {prev} to {hw} in epoch {e}")
            start = max(prev if prev is not None else hw, b.log.log_start_offset)
            if hw > start:
                self.note_committed(b, b.log, start, hw, "leader")
            self.leader_hw[key] = hw

    # -- run ----------------------------------------------------------------------------------------------
    def run(self) -> "Sim":
        try:
            for b in REPLICAS:
                self.push_metadata(b)
            self.after(1, self.tick)
            self.after(1, self.flush_tick)
            for p in self.producers:
                self.after(self.rng.randint(5, 30), lambda p=p: self.produce(p))
            self.after(self.rng.randint(50, 400), self.fault_crash)
            self.after(self.rng.randint(50, 400), self.fault_move)
            self.after(self.rng.randint(50, 400), self.fault_isolate)
            self.after(self.rng.randint(50, 400), self.fault_delete_records)
            self.at(self.cfg.fault_ms, self.stop_producing)
            end = self.cfg.fault_ms + self.cfg.heal_ms
            while self._q and self._q[0][0] <= end:
                t, _, fn = heapq.heappop(self._q)
                self.now = t
                fn()
                self.events += 1
                self.check()
            self.final_check()
            return self
        finally:
            for b in self.brokers.values():
                if b.alive:
                    try:
                        b.log.close(sync=False)
                    except Exception:
                        pass
            shutil.rmtree(self.root, ignore_errors=True)

    def stop_producing(self) -> None:
        self.producing = False      # batches in flight are still retried until acknowledged
        self.trace("faults stop")

    def final_check(self) -> None:
        c = self.controller.state
        if c.leader == -1:
            self.fail("the partition is offline after the faults healed")
        leader = self.brokers[c.leader]
        for p in self.producers:
            if p.values is not None:
                self.fail(f"producer {p.pid}: batch seq {p.seq} still unacknowledged after the faults healed")
        if c.isr != frozenset(REPLICAS):
            self.fail(f"the ISR is {sorted(c.isr)} after the faults healed")
        for b in self.brokers.values():
            self.check_epoch_cache(b)
            missing = self._missing_acked(b.log)
            if missing:
                self.fail(f"broker {b.id}'s final log lacks acknowledged records {missing[:5]}")
            if b.log.log_end_offset != leader.log.log_end_offset:
                self.fail(f"broker {b.id} ends at {b.log.log_end_offset}, the leader at "
                          f"{leader.log.log_end_offset}")
        start = max(b.log.log_start_offset for b in self.brokers.values())
        ref = self._batches(leader.log, start, leader.log.log_end_offset)
        for b in self.brokers.values():
            if self._batches(b.log, start, b.log.log_end_offset) != ref:
                self.fail(f"broker {b.id}'s final log differs from the leader's")

    def summary(self) -> str:
        acked = len(self.acked)
        errors = sum(p.errors for p in self.producers)
        return (f"seed {self.seed}: {self.events} events, {acked} records acknowledged, leader epoch "
                f"{self.controller.state.leader_epoch}, log end {max(b.log.log_end_offset for b in self.brokers.values())}, "
                f"producer errors {errors}; " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())))


def run_seed(seed: int, cfg: SimConfig | None = None, verbose: bool = False) -> Sim:
    return Sim(seed, cfg, verbose).run()


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m kbroker.cluster.simulation",
                                 description="Replay the replication simulation for seeds.")
    ap.add_argument("seed", type=int)
    ap.add_argument("--count", type=int, default=1, help="run seeds SEED .. SEED+COUNT-1")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the event trace")
    args = ap.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    failed = 0
    for seed in range(args.seed, args.seed + args.count):
        try:
            sim = run_seed(seed, verbose=args.verbose)
            print(sim.summary())
        except InvariantViolation as e:
            failed += 1
            print(f"FAILED {e}")
    print(f"{args.count - failed}/{args.count} seeds passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
