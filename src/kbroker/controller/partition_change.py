"""PartitionChangeBuilder: the PartitionChangeRecord (if any) that moves a partition
to a target ISR / leader recovery state, electing a leader when needed.

Kafka: ``controller/PartitionChangeBuilder`` without eligible leader replicas (ELR
needs metadata.version 4.0). Election rules:
- ONLINE (the default): keep the current leader if it is still in the target ISR and
  acceptable; else the first acceptable replica (in replica order) in the target ISR;
- PREFERRED: the first replica if it is in the target ISR and acceptable, else as ONLINE;
- UNCLEAN: as ONLINE, then any acceptable replica; the ISR becomes just that leader and
  the leader recovery state RECOVERING.
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
                 is_acceptable_leader, record_version: int = 0):
        self.partition = partition
        self.topic_id = topic_id
        self.partition_id = partition_id
        self.acceptable = is_acceptable_leader
        self.version = record_version
        self.election = ONLINE
        self.target_isr = list(partition.isr)
        self.target_replicas = list(partition.replicas)
        self.target_lrs = partition.leader_recovery_state

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
        leader, unclean = self.elect_leader()
        if leader != p.leader:
            rec.leader = leader
            if unclean:
                rec.isr = [leader]
                if p.leader_recovery_state != RECOVERING:
                    rec.leader_recovery_state = RECOVERING
        if rec.isr is None and self.target_isr and tuple(self.target_isr) != p.isr:
            rec.isr = list(self.target_isr)
        if rec.leader_recovery_state == -1 and self.target_lrs != p.leader_recovery_state:
            rec.leader_recovery_state = self.target_lrs
        if (rec.leader == NO_LEADER_CHANGE and rec.isr is None and rec.replicas is None
                and rec.leader_recovery_state == -1):
            return None
        return ApiMessageAndVersion(rec, self.version)
