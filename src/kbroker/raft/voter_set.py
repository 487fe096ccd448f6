"""The set of voters and its history in the log (KIP-853 dynamic quorums).

Kafka: ``raft/VoterSet.java``, ``raft/internals/KRaftControlRecordStateMachine.java`` and
``LogHistory``. A voter is a *replica key* (node id, directory id) with its endpoints
(listener name -> host, port) and the kraft.version range it supports.

Where the voter set comes from:

* kraft.version 0 (a static quorum, ``controller.quorum.voters``): the configured set, fixed;
  no VotersRecord is ever written and AddRaftVoter / RemoveRaftVoter are refused.
* kraft.version 1 (``kbroker storage format --standalone / --initial-controllers``): the
  KRaftVersionRecord and VotersRecord control records in the latest snapshot (the
  bootstrap snapshot ``0-0`` at first) and in the log after it. The latest VotersRecord
  *appended* is in force at once, committed or not (Raft's single-server change: each change
  adds or removes one voter, so any two consecutive majorities intersect); a truncation of
  the log takes back what it removed.

:class:`VoterHistory` is that state machine: ``(offset, value)`` entries in offset order
(offset -1 for what a snapshot at offset 0 holds; a snapshot at ``s`` counts as offset
``s - 1``), a static base for kraft.version 0.
"""
from __future__ import annotations

import base64
import struct
import uuid
from dataclasses import dataclass
from typing import Iterable, Optional

from kbroker.kernels import load as _load_kernel
from kbroker.protocol.messages.kraft_version_record import KRaftVersionRecord
from kbroker.protocol.messages.voters_record import Endpoint, KRaftVersionFeature, Voter, VotersRecord

_records = _load_kernel("records")

KRAFT_VERSION = 5
KRAFT_VOTERS = 6
ZERO_UUID = uuid.UUID(int=0)
#: what this implementation supports of kraft.version (Kafka 3.9: 0..1)
SUPPORTED_KRAFT_VERSIONS = (0, 1)


@dataclass(frozen=True)
class VoterNode:
    node_id: int
    directory_id: uuid.UUID = ZERO_UUID
    endpoints: tuple = ()              # ((listener name, host, port), ...)
    kraft_min: int = 0
    kraft_max: int = 0

    @property
    def key(self) -> tuple[int, uuid.UUID]:
        return (self.node_id, self.directory_id)

    def address(self, listener: Optional[str] = None) -> Optional[tuple[str, int]]:
        """The (host, port) on ``listener`` (any listener, the first, when None)."""
        for name, host, port in self.endpoints:
            if listener is None or name == listener:
                return (host, port)
        return None


class VoterSet:
    """An immutable voter set: node id -> VoterNode."""

    def __init__(self, nodes: Iterable[VoterNode] = ()) -> None:
        self.nodes = {n.node_id: n for n in nodes}

    @classmethod
    def static(cls, voters, listener_name: str = "") -> "VoterSet":
        """kraft.version 0: ids (and endpoints on ``listener_name``, when ``voters`` is
        {id: (host, port)}, as Kafka's VoterSet.fromInetSocketAddresses); no directory ids."""
        if isinstance(voters, dict):
            return cls(VoterNode(i, endpoints=((listener_name, hp[0], hp[1]),)) for i, hp in voters.items())
        return cls(VoterNode(i) for i in voters)

    @classmethod
    def from_record(cls, rec: VotersRecord) -> "VoterSet":
        return cls(VoterNode(v.voter_id, v.voter_directory_id,
                             tuple((e.name, e.host, e.port) for e in v.endpoints),
                             v.kraft_version_feature.min_supported_version,
                             v.kraft_version_feature.max_supported_version) for v in rec.voters)

    def to_record(self) -> VotersRecord:
        return VotersRecord(version=0, voters=[
            Voter(voter_id=n.node_id, voter_directory_id=n.directory_id,
                  endpoints=[Endpoint(name=e[0], host=e[1], port=e[2]) for e in n.endpoints],
                  kraft_version_feature=KRaftVersionFeature(min_supported_version=n.kraft_min,
                                                            max_supported_version=n.kraft_max))
            for n in sorted(self.nodes.values(), key=lambda n: n.node_id)])

    @property
    def ids(self) -> frozenset:
        return frozenset(self.nodes)

    def is_voter(self, node_id: int, directory_id: Optional[uuid.UUID] = None) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and (directory_id is None or n.directory_id == directory_id)

    def add(self, node: VoterNode) -> Optional["VoterSet"]:
        if node.node_id in self.nodes:
            return None
        return VoterSet(list(self.nodes.values()) + [node])

    def remove(self, node_id: int, directory_id: uuid.UUID) -> Optional["VoterSet"]:
        """None if (id, directory id) is not a voter or it is the last one."""
        n = self.nodes.get(node_id)
        if n is None or n.directory_id != directory_id or len(self.nodes) == 1:
            return None
        return VoterSet(x for x in self.nodes.values() if x.node_id != node_id)

    def __eq__(self, other) -> bool:
        return isinstance(other, VoterSet) and self.nodes == other.nodes

    def __repr__(self) -> str:
        def uid(u):     # Kafka's Uuid.toString
            return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")
        return "VoterSet(%s)" % ", ".join("%d:%s" % (n.node_id, uid(n.directory_id)) for n in
                                          sorted(self.nodes.values(), key=lambda n: n.node_id))


def kraft_version_record(version: int) -> bytes:
    return bytes(KRaftVersionRecord(version=0, kraft_version=version).encode(0))


def parse_control(ctype: int, value: bytes):
    """The KRaftVersionRecord or VotersRecord a control record of ``ctype`` holds."""
    if ctype == KRAFT_VERSION:
        return KRaftVersionRecord.decode(value, 0)
    if ctype == KRAFT_VOTERS:
        return VotersRecord.decode(value, 0)
    return None


def snapshot_control_records(data: bytes) -> list[tuple[int, bytes]]:
    """(control type, value) of every KRaftVersion / Voters control record in snapshot bytes
    (none when the bytes are not record batches: the simulation's snapshots are opaque)."""
    out = []
    try:
        batches = list(_records.iter_batches(data))
    except Exception:
        return out
    for batch in batches:
        if not batch.is_control:
            continue
        for r in batch.records:
            if r.key is None or len(r.key) < 4:
                continue
            ctype = struct.unpack(">hh", bytes(r.key[:4]))[1]
            if ctype in (KRAFT_VERSION, KRAFT_VOTERS) and r.value is not None:
                out.append((ctype, bytes(r.value)))
    return out


class VoterHistory:
    """Kafka's KRaftControlRecordStateMachine: the kraft.version and voter set at each offset."""

    def __init__(self, static: VoterSet) -> None:
        self.static = static
        self.voters: list[tuple[int, VoterSet]] = []     # (offset, set), ascending
        self.kraft: list[tuple[int, int]] = []           # (offset, kraft.version), ascending

    # -- reads -------------------------------------------------------------------------------
    def latest(self) -> VoterSet:
        return self.voters[-1][1] if self.voters else self.static

    def latest_offset(self) -> Optional[int]:
        """Offset of the latest VotersRecord (-1: from the bootstrap snapshot), None: static."""
        return self.voters[-1][0] if self.voters else None

    def kraft_version(self) -> int:
        return self.kraft[-1][1] if self.kraft else 0

    def at(self, offset: int) -> VoterSet:
        """The voter set in force after ``offset``."""
        best = self.static
        for off, vs in self.voters:
            if off <= offset:
                best = vs
        return best

    def kraft_version_at(self, offset: int) -> int:
        best = 0
        for off, v in self.kraft:
            if off <= offset:
                best = v
        return best

    # -- updates -----------------------------------------------------------------------------
    def apply(self, offset: int, ctype: int, value: bytes) -> bool:
        """A control record at ``offset``; True if the voter set changed."""
        msg = parse_control(ctype, value)
        if isinstance(msg, KRaftVersionRecord):
            self.kraft.append((offset, msg.kraft_version))
            return False
        if isinstance(msg, VotersRecord):
            new = VoterSet.from_record(msg)
            changed = new != self.latest()
            self.voters.append((offset, new))
            return changed
        return False

    def apply_batches(self, batches) -> bool:
        changed = False
        for b in batches:
            if b.control_type in (KRAFT_VERSION, KRAFT_VOTERS):
                for i, value in enumerate(b.records):
                    changed |= self.apply(b.base_offset + i, b.control_type, value)
        return changed

    def truncate(self, end_offset: int) -> bool:
        """Forget what is at or after ``end_offset``; True if the voter set changed."""
        before = self.latest()
        self.voters = [e for e in self.voters if e[0] < end_offset]
        self.kraft = [e for e in self.kraft if e[0] < end_offset]
        return before != self.latest()

    def reset_to_snapshot(self, snapshot_offset: int, data: bytes) -> bool:
        """Only what a snapshot ending at ``snapshot_offset`` holds; True if the set changed."""
        before = self.latest()
        self.voters, self.kraft = [], []
        for ctype, value in snapshot_control_records(data):
            self.apply(snapshot_offset - 1, ctype, value)
        return before != self.latest()
