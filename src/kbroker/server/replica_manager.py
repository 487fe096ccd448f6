"""ReplicaManager and Partition: the broker's view of the partitions it hosts.

Kafka: ``core/.../server/ReplicaManager.scala``, ``core/.../cluster/Partition.scala``.

Zero-config: every partition has one replica, this node, which is the leader and
the whole ISR (``apply_topic``); its high watermark follows the log end offset: the
log moves it with each append, in the same view and under the same lock
(``Log.append(high_watermark_follows=True)``; in fsync mode after the fsync, with
flush.messages after that flush), so no DelayedProduce ever waits on such a partition.

A KRaft broker hosts the partitions the controller placed on it (``apply_delta``, from
each published metadata image) and replicates them:

- a leader's Partition owns a :class:`~kbroker.cluster.partition_leader.PartitionLeader`
  (``Partition.leader_state``, kept across the Partition objects of one log): followers'
  fetch states, the ISR (committed / pending proposal), the high watermark rule (least
  log end offset over the maximal ISR, moved only forward) and the acks=all rules.
  Followers' Fetch requests are answered by :meth:`ReplicaManager.fetch_messages` with
  ``replica_id >= 0`` (``cluster.follower_fetch.handle_follower_fetch`` per partition,
  through the same DelayedFetch as consumers); ISR proposals go to the controller
  through ``alter_partition`` (an :class:`AlterPartitionSender`); the leader acts on the
  committed answer or on a newer registration from the metadata log, whichever comes first.
  ``maybe_shrink_isr`` runs every replica.lag.time.max.ms / 2 (the broker schedules it).
- a follower's log is fed by the broker's ReplicaFetcherManager
  (``replica_fetcher_manager``): ``apply_delta`` removes a partition from its fetcher
  before this broker leads it and adds it, with the new leader and leader epoch, when it
  follows (truncation happens through the leader's diverging epoch).

Every high watermark move completes the DelayedProduces (acks=all) and consumer
DelayedFetches watching the partition. acks=all answers NOT_ENOUGH_REPLICAS before the
append when the ISR is below min.insync.replicas, NOT_ENOUGH_REPLICAS_AFTER_APPEND when
it shrank below it by the time the high watermark passed the batch.

Thread-safety: ``_partitions`` is replaced under ``_lock`` and read without it
(a dict read is atomic); each Partition's log has its own append lock. ``Partition.lock``
(Kafka's leaderIsrUpdateLock, one per log, shared by the Partition objects of that log)
guards its PartitionLeader, and a leader's append (the leader check with the append);
it is taken before a log's lock, never while holding it, and the purgatories are
completed outside it.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

from kbroker.cluster.follower_fetch import handle_follower_fetch, maybe_increment_high_watermark
from kbroker.cluster.partition_leader import PartitionLeader
from kbroker.kernels import records as _records
from kbroker.log.errors import (
    KafkaStorageError, OffsetOutOfRangeError, RecordBatchTooLargeError, RecordTooLargeError,
)
from kbroker.log.producer_state import AppendOrigin, ProducerStateError
from kbroker.log.txn_verification import SENTINEL
from kbroker.protocol import ErrorCode
from kbroker.server import log_validator, schema_validation
from kbroker.server.delayed import DelayedFetch, DelayedProduce, FetchPartitionStatus
from kbroker.server.metadata import TopicImage

log = logging.getLogger(__name__)

TopicPartition = tuple  # (topic: str, partition: int)

_NONE = int(ErrorCode.NONE)     # a plain int: no enum compare per partition


class ProducePartitionResult:
    """Kafka's ProduceResponse.PartitionResponse for one partition (a slotted class: one
    is made per partition of every Produce). ``error`` is set again by DelayedProduce."""

    __slots__ = ("error", "base_offset", "log_append_time_ms", "log_start_offset", "error_message",
                 "record_errors", "last_offset")

    def __init__(self, error: int = ErrorCode.NONE, base_offset: int = -1, log_append_time_ms: int = -1,
                 log_start_offset: int = -1, error_message: str | None = None, record_errors=(),
                 last_offset: int = -1):
        self.error = error
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.log_start_offset = log_start_offset
        self.error_message = error_message
        self.record_errors = record_errors  # [(batch_index, message)]
        self.last_offset = last_offset      # for the acks=all wait (not on the wire)

    def __repr__(self) -> str:
        return (f"ProducePartitionResult(error={self.error}, base_offset={self.base_offset}, "
                f"log_append_time_ms={self.log_append_time_ms}, log_start_offset={self.log_start_offset}, "
                f"error_message={self.error_message!r}, record_errors={self.record_errors!r}, "
                f"last_offset={self.last_offset})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, ProducePartitionResult):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None


@dataclass
class FetchPartitionResult:
    error: int = ErrorCode.NONE
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: object = None  # FileRegion | bytes | None
    fetch_offset: int = -1
    diverging_epoch: tuple | None = None  # (epoch, end_offset)
    #: read_committed: the aborted transactions (AbortedTxn) overlapping the records
    aborted_transactions: list | None = None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Partition:
    """One hosted partition: its log, leader (and epoch), replicas, ISR and high watermark.

    A leader serves clients; a follower (``is_leader`` False: a KRaft broker listed in the
    replicas that does not lead) only keeps the log, fed by the replica fetcher. Leadership
    fields are never changed on an object: a new leader epoch, ISR or role is a new
    Partition in the map. ``leader_state`` (KRaft: the PartitionLeader, None on the
    zero-config node) and ``lock`` live as long as the log and move to each new Partition."""

    def __init__(self, topic: str, partition: int, topic_id, log_, node_id: int, leader_epoch: int = 0,
                 replicas: tuple | None = None, isr=None, leader: int | None = None,
                 leader_state: PartitionLeader | None = None, lock=None):
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.log = log_
        self.node_id = node_id
        self.leader_epoch = leader_epoch
        self.leader = node_id if leader is None else leader
        self.is_leader = self.leader == node_id
        self._isr = frozenset({node_id}) if isr is None else frozenset(isr)
        self.replicas = (node_id,) if replicas is None else tuple(replicas)
        self.leader_state = leader_state
        self.lock = lock if lock is not None else threading.Lock()

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def isr(self) -> frozenset:
        """The ISR the leader acts on: the controller's as last committed (an
        AlterPartition answer or the registration); the registration's on a follower."""
        pl = self.leader_state
        if pl is not None and self.is_leader and pl.is_leader:
            return pl.state.isr
        return self._isr

    def maybe_increment_high_watermark(self) -> bool:
        """Kafka's Partition.maybeIncrementLeaderHW; the log moves it only forward.
        Returns True if it moved. Zero-config (one replica): the leader's log end offset;
        KRaft: PartitionLeader.high_watermark_candidate."""
        pl = self.leader_state
        if pl is None:
            return self.log.maybe_increment_high_watermark_to_end() is not None
        with self.lock:
            pl.min_insync_replicas = self.log.config.min_insync_replicas
            return maybe_increment_high_watermark(pl, self.log, _now_ms()) is not None

    def acks_all_error(self, required_offset: int) -> int | None:
        """For a DelayedProduce: None while the high watermark is not past
        ``required_offset`` (the last appended offset + 1), else the partition's answer
        (NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below min.insync.replicas)."""
        hw = self.log.high_watermark
        pl = self.leader_state
        if pl is None:
            return ErrorCode.NONE if hw >= required_offset else None
        with self.lock:
            pl.min_insync_replicas = self.log.config.min_insync_replicas
            done, err = pl.check_enough_replicas_reach_offset(required_offset, hw)
        return err if done else None

    def check_leader_epoch(self, current_leader_epoch: int) -> int:
        """Kafka's Partition.checkCurrentLeaderEpoch: -1 means "don't check"."""
        if current_leader_epoch == -1 or current_leader_epoch == self.leader_epoch:
            return ErrorCode.NONE
        if current_leader_epoch > self.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.FENCED_LEADER_EPOCH


class ReplicaManager:
    #: checks schema ids against the Schema Registry (schema_validation.from_config; set by the broker)
    schema_validator: schema_validation.SchemaIdValidator | None = None
    #: KIP-890 produce-time verification (kbroker.server.txn_verification; set by the broker)
    txn_verifier = None

    def __init__(self, config, log_manager, node_id: int, produce_purgatory, fetch_purgatory,
                 time_ms: Callable[[], int] | None = None, leader_epoch: int = 0):
        self.config = config
        #: the leader epoch of every partition hosted in this run (MetadataStore.start_leadership)
        self.leader_epoch = leader_epoch
        self.log_manager = log_manager
        self.node_id = node_id
        self.produce_purgatory = produce_purgatory
        self.fetch_purgatory = fetch_purgatory
        self._time_ms = time_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartition, Partition] = {}
        #: hooks run after records are appended to a partition (e.g. the group coordinator)
        self.append_listeners: list[Callable[[TopicPartition], None]] = []
        #: the broker's MetadataCache when partitions are led elsewhere too (KRaft): a
        #: partition not led here that the cluster knows is NOT_LEADER_OR_FOLLOWER
        self.metadata_cache = None
        # -- replication (KRaft; set by the broker) --
        #: what a PartitionLeader asks of other brokers (MetadataBrokerRegistry)
        self.broker_registry = None
        #: this broker's epoch (its registration), for the ISR proposals it makes
        self.broker_epoch: Callable[[], int] = lambda: -1
        #: sends ISR proposals to the controller (AlterPartitionSender)
        self.alter_partition = None
        #: feeds followers' logs (ReplicaFetcherManager)
        self.replica_fetcher_manager = None
        self.replica_lag_time_max_ms = config["replica.lag.time.max.ms"] if config is not None else 30000

    # -- partitions ------------------------------------------------------------------
    def get_partition(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    @property
    def partitions(self) -> dict[TopicPartition, Partition]:
        return self._partitions

    def partition_error(self, tp: TopicPartition) -> int:
        """Kafka's getPartitionOrError for a partition this node does not lead: hosted as
        a follower, or led by another broker of the cluster: NOT_LEADER_OR_FOLLOWER; else
        UNKNOWN_TOPIC_OR_PARTITION."""
        part = self._partitions.get(tp)
        if part is not None:
            return ErrorCode.NONE if part.is_leader else ErrorCode.NOT_LEADER_OR_FOLLOWER
        mc = self.metadata_cache
        if mc is not None and mc.leader_of(tp[0], tp[1]) is not None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def apply_delta(self, changes, on_leader=None, on_stop=None) -> None:
        """Apply one metadata delta's LocalReplicaChanges (Kafka's ReplicaManager.applyDelta):
        stop and delete the replicas this node no longer hosts, then become leader of
        ``changes.leaders`` (fetching stopped first; log opened or created, the new leader
        epoch's start offset recorded, the PartitionLeader given the registration's
        replicas, ISR and epochs), then follower of ``changes.followers`` (the PartitionLeader
        made follower, so no append is accepted any more, then the partition handed to the
        replica fetcher of its leader with the leader epoch). ``on_leader(tp)`` /
        ``on_stop(tp)`` run after each partition this node starts / stops leading."""
        fetchers = self.replica_fetcher_manager
        stopped = []
        if fetchers is not None and changes.deletes:
            fetchers.remove_partitions(changes.deletes)
        with self._lock:
            parts = dict(self._partitions)
            for tp in changes.deletes:
                old = parts.pop(tp, None)
                if old is not None:
                    stopped.append(old)
            self._partitions = parts
        for old in stopped:
            if old.leader_state is not None:
                with old.lock:
                    old.leader_state.make_follower()
            self.produce_purgatory.check_and_complete(old.tp)
            self.fetch_purgatory.check_and_complete(old.tp)
            if old.is_leader and on_stop is not None:
                on_stop(old.tp)
        for tp in changes.deletes:
            self.log_manager.delete_log(tp)
        if fetchers is not None and changes.leaders:
            # a partition this node now leads: no fetcher appends to its log after this
            fetchers.remove_partitions(changes.leaders.keys())
        # open or create every log first, then publish all new Partitions in one map swap
        # (a topic of many partitions costs one copy of the map, not one per partition)
        made = []
        now = _now_ms()
        broker_epoch = self.broker_epoch()
        current = self._partitions
        for infos in (changes.leaders, changes.followers):
            for tp, info in infos.items():
                reg = info.partition
                lg = self.log_manager.get_or_create_log(tp, topic_id=info.topic_id)
                old = current.get(tp)
                if old is not None and old.log is lg and old.leader_state is not None:
                    pl, lock = old.leader_state, old.lock
                else:
                    pl = PartitionLeader(self.node_id, self.broker_registry, self.replica_lag_time_max_ms,
                                         lg.config.min_insync_replicas)
                    lock = threading.Lock()
                with lock:
                    pl.local_broker_epoch = broker_epoch
                    pl.min_insync_replicas = lg.config.min_insync_replicas
                    if reg.leader == self.node_id:
                        if not pl.is_leader or reg.leader_epoch > pl.leader_epoch:
                            lg.assign_epoch_start_offset(reg.leader_epoch, lg.log_end_offset)
                        pl.make_leader(now, leader_epoch=reg.leader_epoch, partition_epoch=reg.partition_epoch,
                                       replicas=reg.replicas, isr=reg.isr, leader_end_offset=lg.log_end_offset,
                                       leader_recovery_state=reg.leader_recovery_state)
                    else:
                        pl.make_follower()
                made.append(Partition(tp[0], tp[1], info.topic_id, lg, self.node_id, reg.leader_epoch,
                                      replicas=reg.replicas, isr=reg.isr, leader=reg.leader,
                                      leader_state=pl, lock=lock))
        if not made:
            return
        with self._lock:
            parts = dict(self._partitions)
            olds = [parts.get(part.tp) for part in made]
            for part in made:
                parts[part.tp] = part
            self._partitions = parts
        became = []
        follow = {}
        for part, old in zip(made, olds):
            tp = part.tp
            if part.is_leader:
                part.maybe_increment_high_watermark()
                if old is None or not old.is_leader:
                    became.append(tp)
            else:
                if old is not None and old.is_leader and on_stop is not None:
                    on_stop(tp)
                follow[tp] = part
            self.produce_purgatory.check_and_complete(tp)
            self.fetch_purgatory.check_and_complete(tp)
        if fetchers is not None and follow:
            fetchers.follow(follow)
        if on_leader is not None:
            for tp in became:
                on_leader(tp)

    def apply_topic(self, topic: TopicImage) -> list[Partition]:
        """Host every partition of ``topic`` (creating logs as needed)."""
        created = []
        with self._lock:
            parts = dict(self._partitions)
            for p in range(topic.num_partitions):
                tp = (topic.name, p)
                if tp in parts:
                    continue
                lg = self.log_manager.get_or_create_log(tp, topic_id=topic.topic_id)
                lg.update_high_watermark(lg.log_end_offset)
                part = Partition(topic.name, p, topic.topic_id, lg, self.node_id, self.leader_epoch)
                parts[tp] = part
                created.append(part)
            self._partitions = parts
        return created

    def remove_topic(self, topic: str) -> None:
        """Stop hosting ``topic`` and delete its logs (DeleteTopics)."""
        with self._lock:
            parts = dict(self._partitions)
            gone = [tp for tp in parts if tp[0] == topic]
            for tp in gone:
                del parts[tp]
            self._partitions = parts
        for tp in gone:
            self.fetch_purgatory.check_and_complete(tp)
            self.log_manager.delete_log(tp)

    # -- produce ---------------------------------------------------------------------------
    def append_records(self, timeout_ms: int, required_acks: int,
                       entries: dict[TopicPartition, object],
                       respond: Callable[[dict[TopicPartition, ProducePartitionResult]], None], *,
                       internal_topics_allowed: bool = False, produce_version: int | None = None,
                       transactional_id: str | None = None, verification_guards: dict | None = None) -> None:
        """Validate and append ``entries`` (records buffers by partition), then call
        ``respond`` — at once, or from the produce purgatory when acks=all has to wait.
        ``produce_version``: the ProduceRequest's version for a client's records (checked
        as AppendOrigin.CLIENT), None for the broker's own appends. ``transactional_id``:
        the Produce's, for KIP-890 verification first (``txn_verifier``), which comes back
        here with ``verification_guards`` ({tp: guard}; a partition without one needs an
        ongoing transaction)."""
        if (transactional_id is not None and verification_guards is None and self.txn_verifier is not None
                and self.txn_verifier.handle_produce_append(self, timeout_ms, required_acks, entries, respond,
                                                            transactional_id, internal_topics_allowed,
                                                            produce_version)):
            return
        results: dict[TopicPartition, ProducePartitionResult] = {}
        appended = []
        now = self._time_ms()       # one clock read per request: LogAppendTime and the timestamp window
        acks_all = required_acks == -1
        append = self._append_to_local_log
        partitions = self._partitions
        for tp, buf in entries.items():
            r = None
            if acks_all:
                part = partitions.get(tp)
                # a leader is always in its ISR: min.insync.replicas 1 needs no look at it
                if part is not None and part.log.config.min_insync_replicas > 1 \
                        and len(part.isr) < part.log.config.min_insync_replicas:
                    r = _not_enough_replicas(part, tp, buf, produce_version)
            if r is None:
                if verification_guards is None:
                    r = append(tp, buf, internal_topics_allowed, produce_version, now)
                else:
                    r = append(tp, buf, internal_topics_allowed, produce_version, now,
                               verification_guard=verification_guards.get(tp, SENTINEL))
                if r.error == _NONE and r.last_offset >= 0:
                    appended.append(tp)
            results[tp] = r
        if appended and not self._after_appends(appended, results if acks_all else None) and acks_all:
            op = DelayedProduce(timeout_ms, self, results, respond)
            self.produce_purgatory.try_complete_else_watch(op, appended)
        else:
            respond(results)

    def append_txn_markers(self, timeout_ms: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                           is_commit: bool, tps, respond: Callable[[dict], None]) -> None:
        """WriteTxnMarkers for one marker (Kafka's appendRecords with AppendOrigin.COORDINATOR
        and acks=all): a COMMIT/ABORT control batch for ``producer_id`` appended to each
        partition of ``tps`` this broker leads, then ``respond({tp: ProducePartitionResult})``
        once the high watermark passed every marker (or ``timeout_ms`` elapsed).
        Per partition: UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH (an older producer
        epoch), TRANSACTION_COORDINATOR_FENCED (an older coordinator epoch than the
        producer's last marker), KAFKA_STORAGE_ERROR."""
        results: dict[TopicPartition, ProducePartitionResult] = {}
        appended = []
        for tp in tps:
            part = self._partitions.get(tp)
            if part is None:
                results[tp] = ProducePartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            lg = part.log
            try:
                info = lg.append_end_txn_marker(producer_id, producer_epoch, coordinator_epoch, is_commit,
                                                leader_epoch=part.leader_epoch)
            except ProducerStateError as e:
                results[tp] = ProducePartitionResult(e.error_code, error_message=str(e))
                continue
            except KafkaStorageError as e:
                log.error("marker append to %s-%d failed: %s", tp[0], tp[1], e)
                results[tp] = ProducePartitionResult(ErrorCode.KAFKA_STORAGE_ERROR, error_message=str(e))
                continue
            results[tp] = ProducePartitionResult(ErrorCode.NONE, info.first_offset, -1, info.log_start_offset,
                                                 last_offset=info.last_offset)
            appended.append(tp)
        if appended and not self._after_appends(appended, results):
            self.produce_purgatory.try_complete_else_watch(DelayedProduce(timeout_ms, self, results, respond),
                                                           appended)
        else:
            respond(results)

    def _after_appends(self, tps, results=None) -> bool:
        """After appends to ``tps``: move each high watermark, complete what waits on it
        (the produce purgatory when it moved, the fetch purgatory always), run the append
        listeners. With ``results`` (acks=all), also tell whether the high watermark
        already passed every appended batch, so acks=all is answered at once, without a
        DelayedProduce (same answer: its first try_complete would succeed); a replicated
        partition whose ISR shrank below min.insync.replicas gets its
        NOT_ENOUGH_REPLICAS_AFTER_APPEND here. Single replica: always true, as its log
        moved the high watermark with the append (or here); with followers, the purgatory
        waits for them. One pass, each partition looked up once."""
        partitions = self._partitions
        produce_check = self.produce_purgatory.check_and_complete
        fetch_check = self.fetch_purgatory.check_and_complete
        listeners = self.append_listeners
        reached = results is not None
        for tp in tps:
            part = partitions.get(tp)
            if part is None:
                reached = False
            else:
                if part.maybe_increment_high_watermark():
                    produce_check(tp)
                if reached:
                    r = results[tp]
                    if part.log.high_watermark <= r.last_offset:
                        reached = False
                    elif part.leader_state is not None:
                        err = part.acks_all_error(r.last_offset + 1)
                        if err is None:
                            reached = False
                        else:
                            r.error = err
            fetch_check(tp)
            for listener in listeners:
                listener(tp)
        return reached

    def _append_to_local_log(self, tp, buf, internal_topics_allowed: bool,
                             produce_version: int | None, now: int | None = None,
                             verification_guard=None) -> ProducePartitionResult:
        """Kafka's ReplicaManager.appendToLocalLog for one partition, with the checks of
        ProduceRequest.validateRecords, UnifiedLog.analyzeAndValidateRecords and
        LogValidator on the way to ``Log.append``. ``produce_version`` is set for a
        client's ProduceRequest (AppendOrigin.CLIENT: the records kernel walks the
        request's checks, the base offset and size checks and the batch checks in one
        pass, ``validate_batches(produce_version=...)``); None for the broker's own
        appends (the group coordinator). ``now``: the request's clock reading."""
        topic = tp[0]
        if topic.startswith("__") and topic in ("__consumer_offsets", "__transaction_state") \
                and not internal_topics_allowed:
            # Kafka answers ProduceRequest.validateRecords (KafkaApis) before this check
            early = _request_records_error(buf, produce_version)
            return early if early is not None else ProducePartitionResult(
                ErrorCode.INVALID_TOPIC_EXCEPTION, error_message=f"Cannot append to internal topic {topic}")
        part = self._partitions.get(tp)
        if part is None or not part.is_leader:
            return ProducePartitionResult(self.partition_error(tp))
        lg = part.log
        client = produce_version is not None
        if not client and (buf is None or len(buf) == 0):
            return ProducePartitionResult(ErrorCode.NONE, -1, -1, lg.log_start_offset)
        cfg = lg.config
        plan = cfg.derived(_PRODUCE_PLAN, _produce_plan)
        if now is None:
            now = self._time_ms()
        log_append_time = plan.log_append_time
        try:
            infos = _records.validate_batches(
                buf, timestamp_type=plan.timestamp_type, now_ms=now,
                timestamp_before_max_ms=plan.before_max_ms, timestamp_after_max_ms=plan.after_max_ms,
                compacted=plan.compacted, produce_version=produce_version if client else -1,
                max_message_bytes=plan.max_message_bytes, key_schema=plan.key_schema and client,
                value_schema=plan.value_schema and client)
        except _records.ProduceRecordsError as e:
            return _produce_records_result(tp, e, lg, cfg)
        except _records.UnsupportedCompressionError as e:
            return ProducePartitionResult(ErrorCode.CORRUPT_MESSAGE, error_message=str(e))
        except _records.InvalidRecordError as e:
            return ProducePartitionResult(ErrorCode.INVALID_RECORD, log_start_offset=lg.log_start_offset,
                                          error_message=str(e))
        except _records.CorruptRecordError as e:
            return ProducePartitionResult(ErrorCode.CORRUPT_MESSAGE, error_message=str(e))
        for info in infos:
            if not client and info.size_in_bytes > cfg.max_message_bytes:
                return _too_large(tp, info.size_in_bytes, cfg)
            if info.record_errors:
                e = log_validator.record_validation_error(tp, cfg, buf, info, now)
                return ProducePartitionResult(e.code, log_start_offset=lg.log_start_offset,
                                              error_message=e.message, record_errors=e.record_errors)
        if client and (plan.key_schema or plan.value_schema):
            refused = schema_validation.check_schema_ids(self.schema_validator, tp, buf, infos,
                                                         (plan.key_payload, plan.value_payload))
            if refused is not None:
                return ProducePartitionResult(refused[0], log_start_offset=lg.log_start_offset,
                                              error_message=refused[1], record_errors=refused[2])
        for info in infos:
            if info.is_transactional and (info.producer_id < 0 or info.producer_epoch < 0):
                # Kafka's clients cannot build one (MemoryRecordsBuilder); the log could not
                # track its transaction, so it never gets here
                return ProducePartitionResult(
                    ErrorCode.INVALID_RECORD, log_start_offset=lg.log_start_offset,
                    error_message=(f"Transactional record batch in {topic}-{tp[1]} without a producer id "
                                   f"and epoch ({info.producer_id}, {info.producer_epoch})"))
        target = plan.target_compression
        if target is not None and any(info.compression != target[0] for info in infos):
            buf = log_validator.recompress(buf, infos, target[0], target[1], log_append_time, now)
            infos = _records.validate_batches(buf)
            for info in infos:  # the size may have changed (UnifiedLog.append re-checks it)
                if info.size_in_bytes > cfg.max_message_bytes:
                    return ProducePartitionResult(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        error_message=(f"Message batch size is {info.size_in_bytes} bytes in append to partition "
                                       f"{topic}-{tp[1]} which exceeds the maximum configured size of "
                                       f"{cfg.max_message_bytes}."))
        else:
            buf = log_validator.set_max_timestamps(buf, infos, log_append_time, now)
        try:
            # the broker's own appends (a coordinator's TxnOffsetCommit batch) are COORDINATOR
            # origin, as Kafka's: producer epochs checked, sequences not
            origin = None if client else AppendOrigin.COORDINATOR
            pl = part.leader_state
            if pl is None:      # no followers: the high watermark is the log end (Partition)
                info = lg.append(buf, infos, leader_epoch=part.leader_epoch, verification_guard=verification_guard,
                                 origin=origin, high_watermark_follows=True)
            else:
                with part.lock:     # no append once the partition became a follower
                    if not pl.is_leader or pl.leader_epoch != part.leader_epoch:
                        return ProducePartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                    info = lg.append(buf, infos, leader_epoch=part.leader_epoch,
                                     verification_guard=verification_guard, origin=origin)
        except RecordTooLargeError as e:
            return ProducePartitionResult(ErrorCode.MESSAGE_TOO_LARGE, error_message=str(e))
        except RecordBatchTooLargeError as e:
            return ProducePartitionResult(ErrorCode.RECORD_LIST_TOO_LARGE, error_message=str(e))
        except _records.CorruptRecordError as e:
            return ProducePartitionResult(ErrorCode.CORRUPT_MESSAGE, error_message=str(e))
        except KafkaStorageError as e:
            log.error("append to %s-%d failed: %s", tp[0], tp[1], e)
            return ProducePartitionResult(ErrorCode.KAFKA_STORAGE_ERROR, error_message=str(e))
        except ProducerStateError as e:  # bad sequence / epoch of an idempotent producer (45, 47, ...)
            return ProducePartitionResult(e.error_code, error_message=str(e))
        # a duplicate (batch_count 0) carries its original append time
        append_time = (info.log_append_time_ms if info.batch_count == 0 else now) if log_append_time else -1
        return ProducePartitionResult(_NONE, info.first_offset, append_time, info.log_start_offset, None, (),
                                      info.last_offset)

    # -- fetch -------------------------------------------------------------------------------
    def read_from_local_log(self, fetch_infos, max_bytes: int, min_one_message: bool,
                            isolation_level: int, replica_id: int = -1) -> dict:
        """Read each partition; ``fetch_infos`` is a list of (tp, FetchPartitionStatus)."""
        results = {}
        remaining = max_bytes
        for tp, st in fetch_infos:
            try:
                r = self._read_partition(tp, st, remaining, min_one_message, isolation_level, replica_id)
            except Exception:
                # Kafka's readFromLog: an unexpected failure fails only this partition
                log.exception("error reading %s-%d at offset %d", tp[0], tp[1], st.fetch_offset)
                r = FetchPartitionResult(ErrorCode.UNKNOWN_SERVER_ERROR)
            results[tp] = r
            size = region_size(r.records)
            if size:
                remaining = max(0, remaining - size)
                min_one_message = False
        return results

    def _read_partition(self, tp, st: FetchPartitionStatus, max_bytes: int, min_one_message: bool,
                        isolation_level: int, replica_id: int) -> FetchPartitionResult:
        part = self._partitions.get(tp)
        if part is None or not part.is_leader:
            return FetchPartitionResult(self.partition_error(tp))
        if replica_id >= 0 and part.leader_state is not None:
            return self._read_for_follower(part, st, max_bytes, replica_id, min_one_message)
        lg = part.log
        if st.max_bytes < 0:
            # Kafka: LogSegment.read rejects a negative size; readFromLog answers UNKNOWN_SERVER_ERROR
            return FetchPartitionResult(ErrorCode.UNKNOWN_SERVER_ERROR, lg.high_watermark, lg.high_watermark,
                                        lg.log_start_offset)
        err = part.check_leader_epoch(st.current_leader_epoch)
        hw = lg.high_watermark
        lso = lg.last_stable_offset     # read after the high watermark: never above it
        if err != ErrorCode.NONE:
            return FetchPartitionResult(err, hw, lso, lg.log_start_offset)
        upper = lg.log_end_offset if replica_id >= 0 else (lso if isolation_level == 1 else hw)
        try:
            data = lg.read(st.fetch_offset, min(max_bytes, st.max_bytes), upper, min_one_message)
        except OffsetOutOfRangeError:
            return FetchPartitionResult(ErrorCode.OFFSET_OUT_OF_RANGE, hw, lso, lg.log_start_offset)
        except KafkaStorageError as e:
            log.error("read of %s-%d failed: %s", tp[0], tp[1], e)
            return FetchPartitionResult(ErrorCode.KAFKA_STORAGE_ERROR, hw, lso, lg.log_start_offset)
        aborted = None
        if isolation_level == 1 and replica_id < 0:
            aborted = []
            if region_size(data.records):
                aborted = lg.aborted_transactions_for_read(st.fetch_offset, data, upper)
        return FetchPartitionResult(ErrorCode.NONE, hw, lso, lg.log_start_offset, data.records,
                                    st.fetch_offset, aborted_transactions=aborted)

    # -- replication: the leader's side ---------------------------------------------------------
    def _read_for_follower(self, part: Partition, st: FetchPartitionStatus, max_bytes: int,
                           replica_id: int, min_one_message: bool = True) -> FetchPartitionResult:
        """A follower's fetch of a partition led here (Kafka's Partition.fetchRecords for
        a follower): epochs checked, diverging epoch, read up to the log end, the
        follower's state and the ISR expansion it earns, the high watermark moved. Runs
        under the partition's lock; the proposal is submitted and the purgatories
        completed after it is released."""
        pl = part.leader_state
        lg = part.log
        with part.lock:
            pl.min_insync_replicas = lg.config.min_insync_replicas
            r = handle_follower_fetch(pl, lg, _now_ms(), replica_id=replica_id, broker_epoch=st.replica_epoch,
                                      current_leader_epoch=st.current_leader_epoch, fetch_offset=st.fetch_offset,
                                      last_fetched_epoch=st.last_fetched_epoch,
                                      log_start_offset=st.log_start_offset, max_bytes=min(max_bytes, st.max_bytes),
                                      min_one_message=min_one_message)
        if r.proposal is not None:
            self._submit_isr_proposal(part, r.proposal)
        if r.new_high_watermark is not None:
            self._high_watermark_moved(part.tp)
        d = r.data
        div = d.diverging_epoch
        diverging = (div.epoch, div.end_offset) if div is not None and div.epoch >= 0 else None
        return FetchPartitionResult(d.error_code, d.high_watermark, d.last_stable_offset, d.log_start_offset,
                                    d.records, st.fetch_offset, diverging_epoch=diverging)

    def _high_watermark_moved(self, tp) -> None:
        """Complete what waits on the high watermark: acks=all and consumers' fetches."""
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)

    def _submit_isr_proposal(self, part: Partition, proposal) -> None:
        """Send an ISR proposal (PendingExpandIsr / PendingShrinkIsr) to the controller;
        its answer is applied by the partition's PartitionLeader (``on_alter_partition_result``:
        committed, reverted, retried, or left for the next metadata) under the lock."""
        sender = self.alter_partition
        pl = part.leader_state
        tp = part.tp
        if sender is None:
            return

        def done(result, error) -> None:
            with part.lock:
                outcome = pl.on_alter_partition_result(proposal, result, error)
            if outcome != "ignored":
                log.info("AlterPartition of %s-%d to ISR %s: %s (%s)", tp[0], tp[1], sorted(proposal.sent.isr),
                         outcome, ErrorCode(error).name if error else "committed")
            if outcome == "retry":
                t = threading.Timer(0.05, self._submit_isr_proposal, (part, proposal))
                t.daemon = True
                t.start()
                return
            if part.maybe_increment_high_watermark() or outcome == "committed":
                self._high_watermark_moved(tp)

        sender.submit(tp[0], part.topic_id, tp[1], proposal.sent, done)

    def maybe_shrink_isr(self) -> None:
        """Kafka's isr-expiration task (every replica.lag.time.max.ms / 2): each leader
        proposes dropping the followers that have not caught up for that long."""
        now = _now_ms()
        for part in list(self._partitions.values()):
            pl = part.leader_state
            if pl is None or not part.is_leader:
                continue
            with part.lock:
                if not pl.is_leader:
                    continue
                proposal = pl.maybe_shrink_isr(now, part.log.log_end_offset)
            if proposal is not None:
                log.info("Shrinking the ISR of %s-%d from %s to %s", part.topic, part.partition,
                         sorted(proposal.last_committed.isr), sorted(proposal.sent.isr))
                self._submit_isr_proposal(part, proposal)
            # the high watermark may move with the caught-up followers rule
            if part.maybe_increment_high_watermark():
                self._high_watermark_moved(part.tp)

    def fetch_messages(self, max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int,
                       fetch_infos: list, respond: Callable[[dict], None], replica_id: int = -1) -> None:
        """Answer now when there is enough data, an error, or no wait; else park a
        DelayedFetch watched on every partition fetched. ``replica_id >= 0``: a
        follower's fetch (each FetchPartitionStatus carries its broker epoch): read up to
        the log end offset, the follower's state updated by each read."""
        results = self.read_from_local_log(fetch_infos, max_bytes, True, isolation_level, replica_id)
        total = sum(region_size(r.records) for r in results.values())
        # a diverging epoch is an answer the follower needs at once (it truncates)
        errors = any(r.error != ErrorCode.NONE or r.diverging_epoch is not None for r in results.values())
        if max_wait_ms <= 0 or not fetch_infos or total >= min_bytes or errors:
            respond(results)
            return
        op = DelayedFetch(max_wait_ms, self, fetch_infos, min_bytes, max_bytes, isolation_level,
                          replica_id, respond)
        self.fetch_purgatory.try_complete_else_watch(op, [tp for tp, _ in fetch_infos])


def region_size(r) -> int:
    """Bytes in a records value: a FileRegion, bytes-like, or None (0)."""
    if r is None:
        return 0
    size = getattr(r, "size", None)
    return size if isinstance(size, int) else len(r)


_PRODUCE_PLAN = "produce_plan"


class _ProducePlan(NamedTuple):
    """What a client append needs from a LogConfig, read once per config (configs are
    immutable; ``LogConfig.derived`` caches it on the config)."""

    timestamp_type: int
    log_append_time: bool
    before_max_ms: int
    after_max_ms: int
    compacted: bool
    max_message_bytes: int
    target_compression: tuple | None
    key_schema: bool      # kbroker.key.schema.validation
    value_schema: bool    # kbroker.value.schema.validation
    key_payload: bool     # kbroker.key.schema.validation.payload
    value_payload: bool   # kbroker.value.schema.validation.payload


def _produce_plan(cfg) -> _ProducePlan:
    log_append_time = cfg.message_timestamp_type == "LogAppendTime"
    return _ProducePlan(log_validator.LOG_APPEND_TIME if log_append_time else log_validator.CREATE_TIME,
                        log_append_time, cfg.timestamp_before_max_ms, cfg.timestamp_after_max_ms,
                        cfg.compact, cfg.max_message_bytes, log_validator.target_compression(cfg),
                        cfg.get("kbroker.key.schema.validation"), cfg.get("kbroker.value.schema.validation"),
                        cfg.get("kbroker.key.schema.validation.payload"),
                        cfg.get("kbroker.value.schema.validation.payload"))


def _not_enough_replicas(part, tp, buf, produce_version) -> ProducePartitionResult:
    """Kafka's Partition.appendRecordsToLeader check for acks=all: with fewer in-sync
    replicas than the topic's ``min.insync.replicas``, nothing is appended and the
    partition answers NOT_ENOUGH_REPLICAS — unless the client's records break
    ProduceRequest.validateRecords, which Kafka answers first (KafkaApis)."""
    early = _request_records_error(buf, produce_version)
    if early is not None:
        return early
    isr = part.isr
    return ProducePartitionResult(
        ErrorCode.NOT_ENOUGH_REPLICAS,
        error_message=(f"The size of the current ISR {sorted(isr)} is insufficient to satisfy "
                       f"the min.isr requirement of {part.log.config.min_insync_replicas} for partition "
                       f"{tp[0]}-{tp[1]}"))


def _request_records_error(buf, produce_version) -> ProducePartitionResult | None:
    """The answer of Kafka's ProduceRequest.validateRecords to a client's records, None
    when they pass (or are not a client's). For the error paths whose checks come after
    it in Kafka but before the records kernel here."""
    if produce_version is None:
        return None
    err = _records.produce_records_error(buf, produce_version)
    return ProducePartitionResult(err) if err else None


def _produce_records_result(tp, e, lg, cfg) -> ProducePartitionResult:
    """The answer to a ProduceRecordsError of ``validate_batches(produce_version=...)``."""
    if e.base_offset is not None:      # UnifiedLog.analyzeAndValidateRecords
        return ProducePartitionResult(
            ErrorCode.INVALID_RECORD, log_start_offset=lg.log_start_offset,
            error_message=(f"The baseOffset of the record batch in the append to {tp[0]}-{tp[1]} "
                           f"should be 0, but it is {e.base_offset}"))
    if e.size is not None:
        return _too_large(tp, e.size, cfg)
    return ProducePartitionResult(e.error_code)  # ProduceRequest.validateRecords: no message



def _too_large(tp, size: int, cfg) -> ProducePartitionResult:
    return ProducePartitionResult(
        ErrorCode.MESSAGE_TOO_LARGE,
        error_message=(f"The record batch size in the append to {tp[0]}-{tp[1]} is {size} bytes which "
                       f"exceeds the maximum configured value of {cfg.max_message_bytes}."))
