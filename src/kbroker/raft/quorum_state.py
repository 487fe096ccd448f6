"""Election state of one replica and its durable form, the ``quorum-state`` file.

Kafka: ``raft/QuorumState.java``, ``EpochState`` and its subclasses, ``ElectionState``,
``FileQuorumStateStore``. A replica is in exactly one epoch state:

* ``Unattached``: knows the epoch but no leader; ``voted_id`` set once it has voted in this
  epoch (Kafka's VotedState, folded into UnattachedState in 3.9).
* ``Candidate``: a voter asking for votes in its own epoch; it voted for itself.
* ``Leader``: won a majority in its epoch.
* ``Follower``: knows the leader of its epoch and fetches from it.
* ``Resigned``: a leader stepping down (graceful shutdown); it serves nothing new.

Invariants kept by :class:`QuorumState`, across restarts because every change of
(epoch, leader, vote) is written to the store *before* it takes effect: the epoch never
goes back; a replica votes at most once per epoch; there is at most one leader it knows
per epoch.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

NO_ID = -1


@dataclass(frozen=True)
class ElectionState:
    """What the quorum-state file holds: epoch, leader (-1 unknown), vote (-1 none), voters."""
    epoch: int
    leader_id: int = NO_ID
    voted_id: int = NO_ID
    voters: frozenset = frozenset()


class QuorumStateStore:
    def read(self) -> Optional[ElectionState]:
        raise NotImplementedError

    def write(self, state: ElectionState) -> None:
        raise NotImplementedError


class MemoryQuorumStateStore(QuorumStateStore):
    """For the simulation: a write is durable when ``write`` returns (the file store fsyncs)."""

    def __init__(self) -> None:
        self.state: Optional[ElectionState] = None
        self.writes = 0

    def read(self):
        return self.state

    def write(self, state):
        self.state = state
        self.writes += 1


DATA_VERSION = "data_version"


def to_json(state: ElectionState, version: int = 0) -> str:
    """Kafka's JSON form of QuorumStateData (QuorumStateDataJsonConverter) + ``data_version``."""
    if version == 0:
        obj = {"clusterId": "", "leaderId": state.leader_id, "leaderEpoch": state.epoch,
               "votedId": state.voted_id, "appliedOffset": 0,
               "currentVoters": [{"voterId": v} for v in sorted(state.voters)]}
    elif version == 1:
        obj = {"leaderId": state.leader_id, "leaderEpoch": state.epoch, "votedId": state.voted_id,
               "votedDirectoryId": "AAAAAAAAAAAAAAAAAAAAAA"}
    else:
        raise ValueError("Quorum state data version (%d) is greater than the supported version (1)" % version)
    obj[DATA_VERSION] = version
    return json.dumps(obj, separators=(",", ":"))


def from_json(text: str) -> ElectionState:
    line = text.split("\n", 1)[0]
    if not line:
        raise ValueError("File ended prematurely.")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("Deserialized node %s is not an object node" % line)
    if DATA_VERSION not in obj:
        raise ValueError("Deserialized node %s does not have %s field" % (line, DATA_VERSION))
    version = obj[DATA_VERSION]
    if not 0 <= version <= 1:
        raise ValueError("data_version (%d) is not within the min (0) and max (1) supported version" % version)
    voters = frozenset(v["voterId"] for v in (obj.get("currentVoters") or [])) if version == 0 else frozenset()
    return ElectionState(obj.get("leaderEpoch", -1), obj.get("leaderId", -1), obj.get("votedId", -1), voters)


class FileQuorumStateStore(QuorumStateStore):
    """``<metadata log dir>/quorum-state``: written to ``quorum-state.tmp``, fsynced, renamed
    over the old file, directory fsynced; a crash leaves the old or the new state, whole."""

    FILE_NAME = "quorum-state"

    def __init__(self, path: str, version: int = 0) -> None:
        self.path = path
        self.version = version

    def read(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                return from_json(f.read())
        except FileNotFoundError:
            return None

    def write(self, state):
        tmp = self.path + ".tmp"
        data = to_json(state, self.version).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        d = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(d)
        finally:
            os.close(d)


# -- epoch states -------------------------------------------------------------------------

@dataclass
class Unattached:
    epoch: int
    voted_id: int = NO_ID
    election_deadline: int = 0
    name = "Unattached"

    @property
    def leader_id(self):
        return NO_ID


@dataclass
class Candidate:
    epoch: int
    local_id: int
    voters: frozenset
    election_deadline: int
    retries: int = 1
    granted: set = field(default_factory=set)
    rejected: set = field(default_factory=set)
    backoff_until: Optional[int] = None
    name = "Candidate"

    def __post_init__(self):
        self.granted.add(self.local_id)

    @property
    def leader_id(self):
        return NO_ID

    @property
    def voted_id(self):
        return self.local_id

    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def is_vote_granted(self) -> bool:
        return len(self.granted) >= self.majority()

    def is_vote_rejected(self) -> bool:
        return len(self.voters) - len(self.rejected) < self.majority()

    def unrecorded_voters(self):
        return sorted(self.voters - self.granted - self.rejected)


@dataclass
class ReplicaProgress:
    """What the leader knows of one replica: end offset (what it has flushed, from its
    fetch offset), last fetch time, and whether it acknowledged this epoch's leader."""
    replica_id: int
    end_offset: Optional[int] = None
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    acknowledged: bool = False
    directory_id: object = None      # the directory id it fetches with (KIP-853), None unknown


@dataclass
class Leader:
    epoch: int
    local_id: int
    voters: frozenset
    epoch_start_offset: int
    granting: frozenset
    high_watermark: Optional[int] = None
    progress: dict = field(default_factory=dict)     # voter id -> ReplicaProgress
    observers: dict = field(default_factory=dict)    # observer id -> ReplicaProgress
    check_quorum_deadline: int = 0
    name = "Leader"

    def __post_init__(self):
        for v in self.voters:
            self.progress[v] = ReplicaProgress(v, acknowledged=v == self.local_id)

    @property
    def leader_id(self):
        return self.local_id

    @property
    def voted_id(self):
        return self.local_id

    def non_acknowledging(self):
        return sorted(v for v, p in self.progress.items() if not p.acknowledged)

    def update_end_offset(self, replica_id: int, end_offset: int, now_ms: int, leader_end: int = -1) -> bool:
        """Record a replica's end offset; True if the high watermark moved. ``leader_end``:
        the leader's log end offset now (a replica at it is caught up)."""
        if replica_id in self.progress:
            p = self.progress[replica_id]
            p.acknowledged = True
        else:
            p = self.observers.setdefault(replica_id, ReplicaProgress(replica_id))
        p.end_offset = end_offset
        p.last_fetch_ms = now_ms
        if end_offset >= leader_end:
            p.last_caught_up_ms = now_ms
        return replica_id in self.progress and self.maybe_update_high_watermark()

    #: test hook: False is the classic Raft bug (commit an old epoch's entry by counting replicas)
    commit_requires_current_epoch: bool = True

    def maybe_update_high_watermark(self) -> bool:
        """HW = the largest offset a majority of voters (the leader counts, with what it has
        flushed) hold, once it is past the epoch start offset: a leader commits an entry of
        its own epoch before it exposes any entry of an earlier one. It never goes back."""
        ends = sorted((p.end_offset if p.end_offset is not None else -1 for p in self.progress.values()),
                      reverse=True)
        candidate = ends[len(ends) // 2]
        if candidate < 0:
            return False
        if self.commit_requires_current_epoch and candidate <= self.epoch_start_offset:
            return False
        if self.high_watermark is None or candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False


@dataclass
class Follower:
    epoch: int
    leader_id: int
    fetch_deadline: int
    high_watermark: Optional[int] = None
    voted_id: int = NO_ID
    name = "Follower"


@dataclass
class Resigned:
    epoch: int
    local_id: int
    election_deadline: int
    unacknowledged: set = field(default_factory=set)
    preferred: list = field(default_factory=list)
    name = "Resigned"

    @property
    def leader_id(self):
        return self.local_id

    @property
    def voted_id(self):
        return self.local_id


class IllegalTransition(RuntimeError):
    pass


class QuorumState:
    """The replica's current epoch state; every transition is checked and persisted first."""

    def __init__(self, local_id: int, voters, store: QuorumStateStore) -> None:
        self.local_id = local_id
        self.voters = frozenset(voters)
        self.store = store
        self.state = Unattached(0)
        self.allow_double_vote = False    # test hook: lets a replica vote twice in one epoch

    def initialize(self, election_deadline: int) -> None:
        """Start from the stored election state. A stored leader that is us becomes Resigned
        (we cannot know what we appended); a stored leader that is not us becomes Unattached
        for the fetch to rediscover, keeping the vote."""
        s = self.store.read()
        if s is None:
            self._persist(ElectionState(0, voters=self.voters))
            self.state = Unattached(0, election_deadline=election_deadline)
            return
        if s.leader_id == self.local_id and self.is_voter:
            self.state = Resigned(s.epoch, self.local_id, election_deadline, set(self.voters - {self.local_id}))
        elif s.voted_id == self.local_id and s.leader_id == NO_ID and self.is_voter:
            # we were a candidate: stay in that epoch having voted for ourselves
            self.state = Unattached(s.epoch, self.local_id, election_deadline)
        else:
            self.state = Unattached(s.epoch, s.voted_id, election_deadline)

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def is_voter(self) -> bool:
        return self.local_id in self.voters

    @property
    def leader_id(self) -> int:
        return self.state.leader_id

    def election_state(self) -> ElectionState:
        return ElectionState(self.state.epoch, self.state.leader_id, getattr(self.state, "voted_id", NO_ID),
                             self.voters)

    def _persist(self, e: ElectionState) -> None:
        old = self.store.read()
        if old is not None:
            if e.epoch < old.epoch:
                raise IllegalTransition("epoch %d would go back from %d" % (e.epoch, old.epoch))
            if e.epoch == old.epoch:
                if old.voted_id != NO_ID and e.voted_id != old.voted_id and not self.allow_double_vote:
                    raise IllegalTransition("second vote in epoch %d (%d, then %d)"
                                            % (e.epoch, old.voted_id, e.voted_id))
                if old.leader_id != NO_ID and e.leader_id != old.leader_id:
                    raise IllegalTransition("second leader in epoch %d (%d, then %d)"
                                            % (e.epoch, old.leader_id, e.leader_id))
        if old != e:
            self.store.write(e)

    # -- transitions --------------------------------------------------------------------
    def to_unattached(self, epoch: int, election_deadline: int) -> None:
        if epoch <= self.epoch:
            raise IllegalTransition("unattached at epoch %d from %d" % (epoch, self.epoch))
        st = self.state
        if isinstance(st, (Unattached, Candidate)):
            # keep the running election timer: a stale candidate bumping the epoch again and
            # again must not keep the others from ever timing out (Kafka does the same)
            election_deadline = st.election_deadline
        self._persist(ElectionState(epoch, voters=self.voters))
        self.state = Unattached(epoch, NO_ID, election_deadline)

    def to_voted(self, epoch: int, candidate_id: int, election_deadline: int) -> None:
        st = self.state
        if epoch != self.epoch or not isinstance(st, Unattached):
            raise IllegalTransition("vote in epoch %d from %s" % (epoch, st))
        if st.voted_id != NO_ID and not self.allow_double_vote:
            raise IllegalTransition("already voted for %d in epoch %d" % (st.voted_id, epoch))
        self._persist(ElectionState(epoch, voted_id=candidate_id, voters=self.voters))
        self.state = Unattached(epoch, candidate_id, election_deadline)

    def to_candidate(self, election_deadline: int, retries: int) -> Candidate:
        if not self.is_voter:
            raise IllegalTransition("%d is not a voter" % self.local_id)
        if isinstance(self.state, Leader):
            raise IllegalTransition("a leader does not become candidate")
        epoch = self.epoch + 1
        self._persist(ElectionState(epoch, voted_id=self.local_id, voters=self.voters))
        self.state = Candidate(epoch, self.local_id, self.voters, election_deadline, retries)
        return self.state

    def to_leader(self, epoch_start_offset: int, now_ms: int, check_quorum_ms: int) -> Leader:
        st = self.state
        if not isinstance(st, Candidate) or not st.is_vote_granted():
            raise IllegalTransition("leader from %s" % st)
        self._persist(ElectionState(st.epoch, leader_id=self.local_id, voted_id=self.local_id, voters=self.voters))
        self.state = Leader(st.epoch, self.local_id, self.voters, epoch_start_offset, frozenset(st.granted),
                            check_quorum_deadline=now_ms + check_quorum_ms)
        return self.state

    def to_follower(self, epoch: int, leader_id: int, fetch_deadline: int) -> Follower:
        st = self.state
        if epoch < self.epoch:
            raise IllegalTransition("follower at epoch %d from %d" % (epoch, self.epoch))
        if epoch == self.epoch:
            if isinstance(st, (Leader, Resigned)) or (isinstance(st, Follower) and st.leader_id != leader_id):
                raise IllegalTransition("follower of %d in epoch %d from %s" % (leader_id, epoch, st))
            if isinstance(st, Candidate) and leader_id == self.local_id:
                raise IllegalTransition("follower of itself")
        voted = getattr(st, "voted_id", NO_ID) if epoch == self.epoch else NO_ID
        self._persist(ElectionState(epoch, leader_id=leader_id, voted_id=voted, voters=self.voters))
        self.state = Follower(epoch, leader_id, fetch_deadline, voted_id=voted)
        return self.state

    def to_resigned(self, election_deadline: int) -> Resigned:
        st = self.state
        if not isinstance(st, Leader):
            raise IllegalTransition("resign from %s" % st)
        self.state = Resigned(st.epoch, self.local_id, election_deadline, set(st.voters - {self.local_id}))
        return self.state
