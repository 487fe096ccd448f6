"""PartitionChangeBuilder: the PartitionChangeRecord (if any) that moves a partition
to a target ISR / leader recovery state, electing a leader when needed.

Kafka: ``controller/PartitionChangeBuilder`` without eligible leader replicas (ELR
needs metadata.version 4.0). Election rules:
- ONLINE (the default): keep the current leader if it is still in the target ISR and
  acceptable; else the first acceptable replica (in replica order) in the target ISR;
- PREFERRED: the first replica if it is in the target ISR and acceptable, else as ONLINE;
- UNCLEAN: as ONLINE, then any acceptable replica; the ISR becomes just that leader and
  the leader recovery state RECOVERING.
Reassignment (KIP-455): while ``adding`` / ``removing`` replicas are set, a build whose
target ISR holds every replica that stays completes it — replicas become the target
(removing dropped), the ISR drops the removed ones, and the leader moves if it was removed.
Removing a replica from the replica set always bumps the leader epoch.
No acceptable leader → leader -1 (offline). The ISR is never set empty: when the last
ISR member goes, the ISR keeps it (Kafka's rule without ELR) and the leader is -1.
A record that sets the leader, even to the same broker, bumps the leader epoch; every
record bumps the partition epoch (PartitionRegistration.merge).
"""
from __future__ import annotations

from kbroker.metadata.image import NO_LEADER, NO_LEADER_CHANGE, RECOVERING, PartitionRegistration
from kbroker.metadata.records import PartitionChangeRecord
from kbroker.metadata.serde import ApiMessageAndVersion

ONLINE, PREFERRED, UNCLEAN = "online", "preferred", "unclean"


class PartitionChangeBuilder:
    def __init__(self, partition: PartitionRegistration, topic_id, partition_id: int,
                 is_acceptable_leader, record_version: int = 0, default_dir=None):
        self.partition = partition
        self.topic_id = topic_id
        self.partition_id = partition_id
        self.acceptable = is_acceptable_leader
        self.version = record_version
        self.election = ONLINE
        self.target_isr = list(partition.isr)
        self.target_replicas = list(partition.replicas)
        self.target_lrs = partition.leader_recovery_state
        self.target_removing = list(partition.removing_replicas)
        self.target_adding = list(partition.adding_replicas)
        #: broker id -> its default log directory (None: directories are not assigned)
        self.default_dir = default_dir

    def set_target_replicas(self, replicas) -> "PartitionChangeBuilder":
        self.target_replicas = list(replicas)
        return self

    def set_target_removing(self, removing) -> "PartitionChangeBuilder":
        self.target_removing = list(removing)
        return self

    def set_target_adding(self, adding) -> "PartitionChangeBuilder":
        self.target_adding = list(adding)
        return self

    def _complete_reassignment(self) -> None:
        if not self.target_removing and not self.target_adding:
            return
        isr, replicas = self.target_isr, self.target_replicas
        if self.target_removing:
            isr = [r for r in isr if r not in self.target_removing]
            replicas = [r for r in replicas if r not in self.target_removing]
            if not isr or not replicas:
                return
        if not set(replicas) <= set(isr):
            return
        self.target_isr, self.target_replicas = isr, replicas
        self.target_removing, self.target_adding = [], []

    def set_target_isr(self, isr) -> "PartitionChangeBuilder":
        self.target_isr = list(isr)
        return self

    def set_election(self, election: str) -> "PartitionChangeBuilder":
        self.election = election
        return self

    def set_target_leader_recovery_state(self, lrs: int) -> "PartitionChangeBuilder":
        self.target_lrs = lrs
        return self

    def _valid(self, r: int) -> bool:
        return r in self.target_isr and self.acceptable(r)

    def elect_leader(self):
        """(new leader, unclean)."""
        p = self.partition
        if self.election == PREFERRED and self.target_replicas and self._valid(self.target_replicas[0]):
            return self.target_replicas[0], False
        if p.leader != NO_LEADER and self._valid(p.leader):
            return p.leader, False
        for r in self.target_replicas:
            if self._valid(r):
                return r, False
        if self.election == UNCLEAN:
            for r in self.target_replicas:
                if self.acceptable(r):
                    return r, True
        return NO_LEADER, False

    def build(self):
        """An ApiMessageAndVersion(PartitionChangeRecord), or None when nothing changes."""
        p = self.partition
        rec = PartitionChangeRecord(partition_id=self.partition_id, topic_id=self.topic_id)
        self._complete_reassignment()
        leader, unclean = self.elect_leader()
        if leader != p.leader:
            rec.leader = leader
            if unclean:
                rec.isr = [leader]
                if p.leader_recovery_state != RECOVERING:
                    rec.leader_recovery_state = RECOVERING
        if rec.leader == NO_LEADER_CHANGE and not set(p.replicas) <= set(self.target_replicas):
            rec.leader = p.leader       # a replica leaves: bump the leader epoch
        if rec.isr is None and self.target_isr and tuple(self.target_isr) != p.isr:
            rec.isr = list(self.target_isr)
        if rec.leader_recovery_state == -1 and self.target_lrs != p.leader_recovery_state:
            rec.leader_recovery_state = self.target_lrs
        if self.target_replicas and tuple(self.target_replicas) != p.replicas:
            rec.replicas = list(self.target_replicas)
            if self.default_dir is not None:
                old = dict(zip(p.replicas, p.directories))
                rec.directories = [old[r] if r in old else self.default_dir(r) for r in self.target_replicas]
        if tuple(self.target_removing) != p.removing_replicas:
            rec.removing_replicas = list(self.target_removing)
        if tuple(self.target_adding) != p.adding_replicas:
            rec.adding_replicas = list(self.target_adding)
        if (rec.leader == NO_LEADER_CHANGE and rec.isr is None and rec.replicas is None
                and rec.leader_recovery_state == -1 and rec.removing_replicas is None
                and rec.adding_replicas is None):
            return None
        return ApiMessageAndVersion(rec, self.version)
