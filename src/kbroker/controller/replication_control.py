"""ReplicationControlManager: topics, partitions, ISRs and leaders.

Kafka: ``controller/ReplicationControlManager``. Replicated state (changed only by
``replay``): topics by id and name with their PartitionRegistrations, plus indexes
rebuilt from them — which partitions each broker is in the ISR of, which it leads,
and which have no leader. Handlers: CreateTopics, CreatePartitions, DeleteTopics,
AlterPartition, ElectLeaders, AlterPartitionReassignments (+ List), and the leader/ISR moves that fencing, unfencing,
controlled shutdown and unregistration need (``handle_broker_*``), each through
PartitionChangeBuilder so every leadership change bumps the leader epoch.
"""
from __future__ import annotations

import base64
import re
import uuid

from kbroker.controller.partition_change import PREFERRED, UNCLEAN, PartitionChangeBuilder
from kbroker.controller.placement import StripedReplicaPlacer, check_replication_factor
from kbroker.controller.result import ApiError, ControllerResult
from kbroker.metadata import records as R
from kbroker.metadata.image import (
    BROKER_RESOURCE, DIR_UNASSIGNED, NO_LEADER, NO_LEADER_CHANGE, RECOVERED, RECOVERING, TOPIC_RESOURCE,
    PartitionRegistration,
)
from kbroker.protocol.errors import ErrorCode

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
E = ErrorCode


def validate_topic_name(name) -> None:
    """Kafka's Topic.validate (ApiError INVALID_TOPIC_EXCEPTION)."""
    if not name:
        raise ApiError(E.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise ApiError(E.INVALID_TOPIC_EXCEPTION, "Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_NAME_LENGTH:
        raise ApiError(E.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be longer than %d "
                       "characters, topic name: %s" % (MAX_NAME_LENGTH, name))
    if not _LEGAL.match(name):
        raise ApiError(E.INVALID_TOPIC_EXCEPTION, "Topic name \"%s\" is illegal, it contains a character "
                       "other than ASCII alphanumerics, '.', '_' and '-'" % name)


def random_topic_id(rnd) -> uuid.UUID:
    """Kafka's Uuid.randomUuid from a seeded random: never zero or the metadata topic's id
    (1), never one whose base64 form starts with '-'."""
    while True:
        u = uuid.UUID(int=rnd.getrandbits(128))
        if u.int > 1 and not base64.urlsafe_b64encode(u.bytes).startswith(b"-"):
            return u


class TopicControl:
    __slots__ = ("name", "id", "parts")

    def __init__(self, name, tid):
        self.name = name
        self.id = tid
        self.parts: dict = {}


class ReplicationControlManager:
    def __init__(self, config, features, cluster, configs, rnd):
        self.config = config
        self.features = features
        self.cluster = cluster
        self.configs = configs
        self.random = rnd
        self.placer = StripedReplicaPlacer(rnd)
        self.topics: dict = {}          # topic id -> TopicControl
        self.by_name: dict = {}         # name -> topic id
        self.collisions: dict = {}      # name with '.' as '_' -> set of names
        self.isr_index: dict = {}       # broker id -> {(topic id, partition)}
        self.leader_index: dict = {}    # broker id -> {(topic id, partition)}
        self.leaderless: set = set()    # {(topic id, partition)} with leader -1

    # --- replicated state ------------------------------------------------------------
    def replay(self, r, offset: int) -> None:
        t = type(r)
        if t is R.TopicRecord:
            if r.name in self.by_name or r.topic_id in self.topics:
                raise ValueError("topic %s / %s already exists" % (r.name, r.topic_id))
            self.topics[r.topic_id] = TopicControl(r.name, r.topic_id)
            self.by_name[r.name] = r.topic_id
            self.collisions.setdefault(r.name.replace(".", "_"), set()).add(r.name)
        elif t is R.PartitionRecord:
            topic = self.topics[r.topic_id]
            self._set(topic, r.partition_id, PartitionRegistration.from_record(r))
        elif t is R.PartitionChangeRecord:
            topic = self.topics[r.topic_id]
            self._set(topic, r.partition_id, topic.parts[r.partition_id].merge(r))
        elif t is R.RemoveTopicRecord:
            topic = self.topics.pop(r.topic_id)
            del self.by_name[topic.name]
            key = topic.name.replace(".", "_")
            self.collisions[key].discard(topic.name)
            if not self.collisions[key]:
                del self.collisions[key]
            for pid in list(topic.parts):
                self._unindex((topic.id, pid), topic.parts[pid])

    def _unindex(self, tp, p) -> None:
        for b in p.isr:
            s = self.isr_index.get(b)
            if s is not None:
                s.discard(tp)
                if not s:
                    del self.isr_index[b]
        if p.leader == NO_LEADER:
            self.leaderless.discard(tp)
        else:
            s = self.leader_index.get(p.leader)
            if s is not None:
                s.discard(tp)
                if not s:
                    del self.leader_index[p.leader]

    def _set(self, topic, pid, new) -> None:
        tp = (topic.id, pid)
        old = topic.parts.get(pid)
        if old is not None:
            self._unindex(tp, old)
        topic.parts[pid] = new
        for b in new.isr:
            self.isr_index.setdefault(b, set()).add(tp)
        if new.leader == NO_LEADER:
            self.leaderless.add(tp)
        else:
            self.leader_index.setdefault(new.leader, set()).add(tp)

    # --- queries -----------------------------------------------------------------------
    def has_leaderships(self, broker_id: int) -> bool:
        return bool(self.leader_index.get(broker_id))

    def topic_by_name(self, name):
        tid = self.by_name.get(name)
        return None if tid is None else self.topics[tid]

    def partition(self, topic_id, pid):
        t = self.topics.get(topic_id)
        return None if t is None else t.parts.get(pid)

    def unclean_leader_election_enabled(self, name: str) -> bool:
        """unclean.leader.election.enable: the topic's config, else the cluster default
        (BROKER resource ""), else the static setting (Kafka's uncleanLeaderElectionEnabledForTopic)."""
        key = "unclean.leader.election.enable"
        v = self.configs.data.get((TOPIC_RESOURCE, name), {}).get(key)
        if v is None:
            v = self.configs.data.get((BROKER_RESOURCE, ""), {}).get(key)
        if v is None:
            return self.config.unclean_leader_election_enable
        return v.strip().lower() == "true"

    def _record_version(self) -> int:
        return self.features.partition_record_version()

    def default_dir(self, broker_id: int):
        """Kafka's defaultDir: the broker's only log dir, else UNASSIGNED."""
        reg = self.cluster.registration(broker_id)
        return reg.directories[0] if reg is not None and len(reg.directories) == 1 else DIR_UNASSIGNED

    def _builder(self, topic, pid, acceptable) -> PartitionChangeBuilder:
        b = PartitionChangeBuilder(topic.parts[pid], topic.id, pid, acceptable, self._record_version(),
                                   self.default_dir if self.features.directory_assignment() else None)
        if self.unclean_leader_election_enabled(topic.name):
            b.set_election(UNCLEAN)
        return b

    # --- leader and ISR moves for broker state changes ---------------------------------------
    def _leader_and_isr_updates(self, to_remove: int, to_add: int, tps, result) -> None:
        """Kafka's generateLeaderAndIsrUpdates: drop ``to_remove`` from each ISR and elect
        a leader among active brokers (``to_add`` counts as active even if still fenced)."""
        def acceptable(r):
            return r != to_remove and (r == to_add or self.cluster.is_active(r))
        for tid, pid in sorted(tps, key=lambda tp: (self.topics[tp[0]].name, tp[1])):
            topic = self.topics[tid]
            p = topic.parts[pid]
            b = self._builder(topic, pid, acceptable)
            b.set_target_isr([r for r in p.isr if r != to_remove])
            rec = b.build()
            if rec is not None:
                result.records.append(rec)

    def handle_broker_fenced(self, broker_id: int, result: ControllerResult) -> None:
        reg = self.cluster.registration(broker_id)
        self._leader_and_isr_updates(broker_id, NO_LEADER, self.isr_index.get(broker_id, ()), result)
        if self.features.registration_change_record():
            result.add(R.BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=reg.epoch, fenced=1), 0)
        else:
            result.add(R.FenceBrokerRecord(id=broker_id, epoch=reg.epoch), 0)

    def handle_broker_unfenced(self, broker_id: int, epoch: int, result: ControllerResult) -> None:
        if self.features.registration_change_record():
            result.add(R.BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=epoch, fenced=-1), 0)
        else:
            result.add(R.UnfenceBrokerRecord(id=broker_id, epoch=epoch), 0)
        self._leader_and_isr_updates(NO_LEADER, broker_id, self.leaderless, result)

    def handle_broker_in_controlled_shutdown(self, broker_id: int, epoch: int, result: ControllerResult) -> None:
        if self.features.controlled_shutdown_state() and not self.cluster.registration(broker_id).in_controlled_shutdown:
            result.add(R.BrokerRegistrationChangeRecord(broker_id=broker_id, broker_epoch=epoch,
                                                        in_controlled_shutdown=1), 1)
        self._leader_and_isr_updates(broker_id, NO_LEADER, self.isr_index.get(broker_id, ()), result)

    def remove_broker_from_partitions(self, broker_id: int, result: ControllerResult) -> None:
        self._leader_and_isr_updates(broker_id, NO_LEADER, self.isr_index.get(broker_id, ()), result)

    # --- CreateTopics ------------------------------------------------------------------------
    def _new_partition(self, replicas, what: str) -> PartitionRegistration:
        isr = [b for b in replicas if self.cluster.is_active(b)]
        if not isr:
            raise ApiError(E.INVALID_REPLICATION_FACTOR, what)
        dirs = tuple(self.default_dir(b) for b in replicas) if self.features.directory_assignment() else ()
        return PartitionRegistration(tuple(replicas), tuple(isr), (), (), isr[0], RECOVERED, 0, 0, tuple(dirs))

    def _check_assignment(self, pid, replicas, rf=None) -> None:
        if not replicas:
            raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty "
                           "replica list.")
        if len(set(replicas)) != len(replicas):
            raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes the "
                           "broker %d more than once." % next(b for b in replicas if replicas.count(b) > 1))
        for b in replicas:
            if self.cluster.registration(b) is None:
                raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes broker "
                               "%d, but no such broker is registered." % b)
        if rf is not None and len(replicas) != rf:
            raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes a partition "
                           "with %d replica(s), but this is not consistent with previous partitions, which have "
                           "%d replica(s)." % (len(replicas), rf))

    def _place(self, first_pid: int, count: int, rf: int) -> list:
        usable = self.cluster.usable_brokers()
        check_replication_factor(rf, len(usable), sum(not b.fenced for b in usable))
        return self.placer.place(count, rf, usable)

    def create_topics(self, req) -> ControllerResult:
        from kbroker.protocol.messages import create_topics as Resp
        result = ControllerResult()
        results = []
        names = [t.name for t in req.topics]
        for t in req.topics:
            res = Resp.CreatableTopicResult(name=t.name, error_code=0, error_message=None)
            results.append(res)
            if names.count(t.name) > 1:
                res.error_code, res.error_message = E.INVALID_REQUEST, "Duplicate topic name."
                continue
            try:
                recs, tid, n, rf, cfg = self._create_topic(t)
            except ApiError as e:
                res.error_code, res.error_message = e.code, e.message
                continue
            res.topic_id, res.num_partitions, res.replication_factor = tid, n, rf
            res.configs = [Resp.CreatableTopicConfigs(name=k, value=v, read_only=False, config_source=1,
                                                      is_sensitive=False) for k, v in sorted(cfg.items())]
            if not req.validate_only:
                result.records.extend(recs)
        result.response = Resp.CreateTopicsResponse(topics=results)
        return result

    def _create_topic(self, t):
        name = t.name
        validate_topic_name(name)
        if name in self.by_name:
            raise ApiError(E.TOPIC_ALREADY_EXISTS, "Topic '%s' already exists." % name)
        others = self.collisions.get(name.replace(".", "_"), ())
        if others:
            raise ApiError(E.INVALID_TOPIC_EXCEPTION, "Topic '%s' collides with existing topic: %s"
                           % (name, sorted(others)[0]))
        cfg_recs, cfg = self.configs.new_topic_config_records(name, [(c.name, c.value) for c in t.configs])
        parts = []
        if t.assignments:
            if t.num_partitions != -1:
                raise ApiError(E.INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions "
                               "was not set to -1.")
            if t.replication_factor != -1:
                raise ApiError(E.INVALID_REQUEST, "A manual partition assignment was specified, but "
                               "replicationFactor was not set to -1.")
            by_index = {a.partition_index: list(a.broker_ids) for a in t.assignments}
            if sorted(by_index) != list(range(len(t.assignments))):
                raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based "
                               "integer sequence")
            for pid in range(len(by_index)):
                self._check_assignment(pid, by_index[pid])
                parts.append(self._new_partition(by_index[pid], "All brokers specified in the partition "
                                                 "assignment for partition %d are fenced or in controlled "
                                                 "shutdown." % pid))
            n, rf = len(parts), len(parts[0].replicas)
        else:
            n = self.config.default_num_partitions if t.num_partitions == -1 else t.num_partitions
            rf = self.config.default_replication_factor if t.replication_factor == -1 else t.replication_factor
            if n <= 0:
                raise ApiError(E.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
            if rf <= 0:
                raise ApiError(E.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0, or -1 "
                               "to use the default value.")
            if 1 + n + len(cfg_recs) > self.config.max_records_per_user_op:
                raise ApiError(E.POLICY_VIOLATION, "Unable to perform excessively large batch operation: %d "
                               "metadata records would exceed the limit of %d."
                               % (1 + n + len(cfg_recs), self.config.max_records_per_user_op))
            for pid, replicas in enumerate(self._place(0, n, rf)):
                parts.append(self._new_partition(replicas, "Unable to replicate the partition %d time(s): All "
                                                 "brokers are currently fenced or in controlled shutdown." % rf))
        tid = random_topic_id(self.random)
        while tid in self.topics:       # a controller rebuilt with the same seed draws the same ids
            tid = random_topic_id(self.random)
        v = self._record_version()
        recs = [R.TopicRecord(name=name, topic_id=tid)]
        from kbroker.metadata.serde import ApiMessageAndVersion as AMV
        out = [AMV(recs[0], 0)] + cfg_recs + [AMV(p.to_record(tid, pid), v) for pid, p in enumerate(parts)]
        return out, tid, n, rf, cfg

    # --- CreatePartitions ---------------------------------------------------------------------
    def create_partitions(self, req) -> ControllerResult:
        from kbroker.protocol.messages import create_partitions as Resp
        result = ControllerResult()
        results = []
        names = [t.name for t in req.topics]
        for t in req.topics:
            res = Resp.CreatePartitionsTopicResult(name=t.name, error_code=0)
            results.append(res)
            if names.count(t.name) > 1:
                res.error_code, res.error_message = E.INVALID_REQUEST, "Duplicate topic name."
                continue
            try:
                recs = self._create_partitions(t)
            except ApiError as e:
                res.error_code, res.error_message = e.code, e.message
                continue
            if not req.validate_only:
                result.records.extend(recs)
        result.response = Resp.CreatePartitionsResponse(results=results)
        return result

    def _create_partitions(self, t) -> list:
        from kbroker.metadata.serde import ApiMessageAndVersion as AMV
        topic = self.topic_by_name(t.name)
        if topic is None:
            raise ApiError(E.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        cur = len(topic.parts)
        if t.count < cur:
            raise ApiError(E.INVALID_PARTITIONS, "The topic %s currently has %d partition(s); %d would not be "
                           "an increase." % (t.name, cur, t.count))
        if t.count == cur:
            raise ApiError(E.INVALID_PARTITIONS, "Topic already has %d partition(s)." % cur)
        add = t.count - cur
        rf = len(topic.parts[0].replicas) if topic.parts else 1
        if t.assignments is not None:
            if len(t.assignments) != add:
                raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "Attempted to add %d additional partition(s), but "
                               "only %d assignment(s) were specified." % (add, len(t.assignments)))
            placements = []
            for i, a in enumerate(t.assignments):
                self._check_assignment(cur + i, list(a.broker_ids), rf)
                placements.append(list(a.broker_ids))
        else:
            if add + 0 > self.config.max_records_per_user_op:
                raise ApiError(E.POLICY_VIOLATION, "Unable to perform excessively large batch operation: %d "
                               "metadata records would exceed the limit of %d."
                               % (add, self.config.max_records_per_user_op))
            placements = self._place(cur, add, rf)
        v = self._record_version()
        out = []
        for i, replicas in enumerate(placements):
            p = self._new_partition(replicas, "Unable to replicate the partition %d time(s): All brokers are "
                                    "currently fenced or in controlled shutdown." % rf)
            out.append(AMV(p.to_record(topic.id, cur + i), v))
        return out

    # --- DeleteTopics -------------------------------------------------------------------------
    def delete_topics(self, req) -> ControllerResult:
        """By name (v0-5 ``topic_names``, v6 ``topics[].name``) or by id (v6)."""
        from kbroker.protocol.messages import delete_topics as Resp
        from kbroker.protocol.primitives import ZERO_UUID
        wanted = [(n, ZERO_UUID) for n in (req.topic_names or [])]
        wanted += [(t.name, t.topic_id) for t in (req.topics or [])]
        result = ControllerResult()
        out = []
        seen_names, seen_ids = set(), set()
        for name, tid in wanted:
            res = Resp.DeletableTopicResult(name=name, topic_id=tid, error_code=0)
            out.append(res)
            if name is not None and tid != ZERO_UUID:
                res.error_code, res.error_message = E.INVALID_REQUEST, "You may not specify both topic name and topic id."
                continue
            if name is not None:
                if name in seen_names:
                    res.error_code, res.error_message = E.INVALID_REQUEST, "Duplicate topic name."
                    continue
                seen_names.add(name)
                topic = self.topic_by_name(name)
                if topic is None:
                    res.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                    res.error_message = "This server does not host this topic-partition."
                    continue
            else:
                if tid in seen_ids:
                    res.error_code, res.error_message = E.INVALID_REQUEST, "Duplicate topic id."
                    continue
                seen_ids.add(tid)
                topic = self.topics.get(tid)
                if topic is None:
                    res.error_code, res.error_message = E.UNKNOWN_TOPIC_ID, "This server does not host this topic ID."
                    continue
            if name is not None and topic.id in seen_ids:
                res.error_code, res.error_message = E.INVALID_REQUEST, "Duplicate topic id."
                continue   # named twice, once by id and once by name
            seen_ids.add(topic.id)
            seen_names.add(topic.name)
            res.name, res.topic_id = topic.name, topic.id
            result.add(R.RemoveTopicRecord(topic_id=topic.id), 0)
        result.response = Resp.DeleteTopicsResponse(responses=out)
        return result

    # --- AlterPartition -----------------------------------------------------------------------
    def alter_partition(self, req, api_version: int = 3) -> ControllerResult:
        from kbroker.protocol.messages import alter_partition as Resp
        try:
            self.cluster.check_broker_epoch(req.broker_id, req.broker_epoch)
        except ApiError as e:
            return ControllerResult([], Resp.AlterPartitionResponse(error_code=e.code))
        result = ControllerResult()
        topics_out = []
        for td in req.topics:
            tres = Resp.AlterPartitionResponseTopicData(topic_name=td.topic_name, topic_id=td.topic_id, partitions=[])
            topics_out.append(tres)
            topic = self.topics.get(td.topic_id) if api_version > 1 else self.topic_by_name(td.topic_name)
            if topic is None:
                code = E.UNKNOWN_TOPIC_ID if api_version > 1 else E.UNKNOWN_TOPIC_OR_PARTITION
                for pd in td.partitions:
                    tres.partitions.append(Resp.AlterPartitionResponsePartitionData(partition_index=pd.partition_index, error_code=code))
                continue
            for pd in td.partitions:
                if api_version < 3:
                    new_isr = [(b, -1) for b in pd.new_isr]
                else:
                    new_isr = [(s.broker_id, s.broker_epoch) for s in pd.new_isr_with_epochs]
                pid = pd.partition_index
                p = topic.parts.get(pid)
                err = self._validate_alter(req.broker_id, p, pd, new_isr, api_version)
                if err:
                    tres.partitions.append(Resp.AlterPartitionResponsePartitionData(partition_index=pid, error_code=err))
                    continue
                b = self._builder(topic, pid, self.cluster.is_active)
                b.set_target_isr([bid for bid, _ in new_isr])
                b.set_target_leader_recovery_state(pd.leader_recovery_state)
                rec = b.build()
                if rec is not None:
                    result.records.append(rec)
                    p = p.merge(rec.message)
                    if rec.message.leader not in (req.broker_id, NO_LEADER_CHANGE):
                        code = E.NEW_LEADER_ELECTED if api_version > 1 else E.FENCED_LEADER_EPOCH
                        tres.partitions.append(Resp.AlterPartitionResponsePartitionData(partition_index=pid, error_code=code))
                        continue
                tres.partitions.append(Resp.AlterPartitionResponsePartitionData(
                    partition_index=pid, error_code=0, leader_id=p.leader, leader_epoch=p.leader_epoch,
                    isr=list(p.isr), leader_recovery_state=p.leader_recovery_state,
                    partition_epoch=p.partition_epoch))
        result.response = Resp.AlterPartitionResponse(error_code=0, topics=topics_out)
        return result

    def _validate_alter(self, broker_id, p, pd, new_isr, api_version) -> int:
        if p is None:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        if pd.leader_epoch > p.leader_epoch or pd.partition_epoch > p.partition_epoch:
            return E.NOT_CONTROLLER
        if pd.leader_epoch < p.leader_epoch:
            return E.FENCED_LEADER_EPOCH
        if broker_id != p.leader:
            return E.INVALID_REQUEST
        if pd.partition_epoch < p.partition_epoch:
            return E.INVALID_UPDATE_VERSION
        ids = [b for b, _ in new_isr]
        if len(set(ids)) != len(ids) or any(b not in p.replicas for b in ids) or not ids:
            return E.INVALID_REQUEST
        if p.leader not in ids:
            return E.INVALID_REQUEST
        if pd.leader_recovery_state == RECOVERING and len(ids) > 1:
            return E.INVALID_REQUEST
        if p.leader_recovery_state == RECOVERED and pd.leader_recovery_state == RECOVERING:
            return E.INVALID_REQUEST
        for b, epoch in new_isr:
            reg = self.cluster.registration(b)
            if reg is None or reg.in_controlled_shutdown or reg.fenced or (epoch != -1 and reg.epoch != epoch):
                return E.INELIGIBLE_REPLICA if api_version > 1 else E.OPERATION_NOT_ATTEMPTED
        return E.NONE

    # --- ElectLeaders -------------------------------------------------------------------------
    def elect_leaders(self, req) -> ControllerResult:
        from kbroker.protocol.messages import elect_leaders as Resp
        election = UNCLEAN if req.election_type == 1 else PREFERRED
        result = ControllerResult()
        by_topic: dict = {}
        if req.topic_partitions is None:
            for topic in sorted(self.topics.values(), key=lambda t: t.name):
                for pid in sorted(topic.parts):
                    code, msg = self._elect(topic, pid, election, result)
                    if code != E.ELECTION_NOT_NEEDED:
                        by_topic.setdefault(topic.name, []).append(Resp.PartitionResult(
                            partition_id=pid, error_code=code, error_message=msg))
        else:
            for tp in req.topic_partitions:
                topic = self.topic_by_name(tp.topic)
                lst = by_topic.setdefault(tp.topic, [])
                for pid in tp.partitions:
                    if topic is None or pid not in topic.parts:
                        code, msg = E.UNKNOWN_TOPIC_OR_PARTITION, "No such topic partition"
                    else:
                        code, msg = self._elect(topic, pid, election, result)
                    lst.append(Resp.PartitionResult(partition_id=pid, error_code=code, error_message=msg))
        result.response = Resp.ElectLeadersResponse(error_code=0, replica_election_results=[
            Resp.ReplicaElectionResult(topic=t, partition_result=lst) for t, lst in by_topic.items()])
        return result

    def _elect(self, topic, pid, election, result):
        p = topic.parts[pid]
        if election == PREFERRED and p.replicas and p.leader == p.replicas[0]:
            return E.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
        if election == UNCLEAN and p.leader != NO_LEADER:
            return E.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
        b = self._builder(topic, pid, self.cluster.is_active)
        b.set_election(election)
        rec = b.build()
        if rec is None:
            if election == PREFERRED:
                return E.PREFERRED_LEADER_NOT_AVAILABLE, "Failed to elect leader for partition. Preferred replica not available."
            return E.ELIGIBLE_LEADERS_NOT_AVAILABLE, "Failed to elect leader for partition. No eligible leader."
        result.records.append(rec)
        return E.NONE, None

    # --- AlterPartitionReassignments / ListPartitionReassignments (KIP-455) ----------------
    def alter_partition_reassignments(self, req) -> ControllerResult:
        """Start (replicas given) or cancel (replicas null) reassignments. While one runs the
        partition's replicas are target + removing, with ``adding`` / ``removing`` set; it
        completes when the ISR holds every target replica (AlterPartition from the leader)."""
        from kbroker.protocol.messages import alter_partition_reassignments as M
        result = ControllerResult(atomic=True)
        out = []
        for t in req.topics:
            tres = M.ReassignableTopicResponse(name=t.name, partitions=[])
            out.append(tres)
            for rp in t.partitions:
                code, msg = E.NONE, None
                try:
                    rec = self._reassign(t.name, rp)
                    if rec is not None:
                        result.records.append(rec)
                except ApiError as e:
                    code, msg = e.code, e.message
                tres.partitions.append(M.ReassignablePartitionResponse(
                    partition_index=rp.partition_index, error_code=code, error_message=msg))
        result.response = M.AlterPartitionReassignmentsResponse(error_code=0, error_message=None, responses=out)
        return result

    def _reassign(self, name, rp):
        topic = self.topic_by_name(name)
        if topic is None:
            raise ApiError(E.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named %s." % name)
        p = topic.parts.get(rp.partition_index)
        if p is None:
            raise ApiError(E.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition %s:%d." % (name, rp.partition_index))
        b = self._builder(topic, rp.partition_index, self.cluster.is_active)
        if rp.replicas is None:
            if not p.is_reassigning:
                raise ApiError(E.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress.")
            replicas = [r for r in p.replicas if r not in p.adding_replicas]
            isr = [r for r in p.isr if r not in p.adding_replicas]
            if not isr and not self.unclean_leader_election_enabled(name):
                raise ApiError(E.INVALID_REPLICA_ASSIGNMENT, "Unable to revert partition assignment for %s:%d "
                               "because it would require an unclean leader election." % (name, rp.partition_index))
            return (b.set_target_isr(isr).set_target_replicas(replicas).set_target_removing([])
                    .set_target_adding([]).build())
        target = list(rp.replicas)
        self._check_assignment(rp.partition_index, target)
        removing = sorted(set(p.replicas) - set(target))
        adding = sorted(set(target) - set(p.replicas))
        return (b.set_target_replicas(target + removing).set_target_removing(removing)
                .set_target_adding(adding).build())

    def list_partition_reassignments(self, req):
        from kbroker.protocol.messages import list_partition_reassignments as M
        wanted = None if req.topics is None else {t.name: set(t.partition_indexes) for t in req.topics}
        out = []
        for topic in sorted(self.topics.values(), key=lambda t: t.name):
            if wanted is not None and topic.name not in wanted:
                continue
            parts = [M.OngoingPartitionReassignment(partition_index=pid, replicas=list(p.replicas),
                                                    adding_replicas=list(p.adding_replicas),
                                                    removing_replicas=list(p.removing_replicas))
                     for pid, p in sorted(topic.parts.items())
                     if p.is_reassigning and (wanted is None or pid in wanted[topic.name])]
            if parts:
                out.append(M.OngoingTopicReassignment(name=topic.name, partitions=parts))
        return M.ListPartitionReassignmentsResponse(error_code=0, error_message=None, topics=out)
