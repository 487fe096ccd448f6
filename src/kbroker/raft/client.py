"""KafkaRaftClient as a pure state machine (Kafka: ``raft/KafkaRaftClient.java``, KIP-595).

The client never blocks, sleeps, reads a clock or does I/O besides its ReplicatedLog and
QuorumStateStore: a driver passes the time to :meth:`handle` (one inbound request or
response) and :meth:`poll` (timers), sends the returned :class:`Outbound` messages, and calls
again no later than :meth:`next_deadline`. Randomness comes from the injected ``random``.

Protocol, as Kafka's:

* Election: a voter whose election timer (``election_timeout_ms`` + random jitter of the
  same size) expires, or a follower that hears nothing from its leader within
  ``fetch_timeout_ms``, becomes Candidate in epoch + 1 and asks every voter for its vote.
  A vote is granted at most once per epoch (persisted first), only to a candidate whose
  (last epoch, end offset) is at least ours. A rejected candidate backs off (binary
  exponential, at most ``election_backoff_max_ms``) before trying again.
* The winner appends a LeaderChangeMessage control batch at its epoch start offset and
  sends BeginQuorumEpoch to the voters until each has acknowledged (or fetched).
* Replication is pull-based: followers and observers send Fetch(fetch offset, last
  fetched epoch); the leader answers records, or the diverging epoch to truncate to.
  Followers fsync what they append before fetching again, so a fetch offset is durable.
* Commit: the high watermark is the largest offset a majority of voters hold (the leader
  counting what it has flushed), and only once it is past the epoch start offset.
  Committed batches go to the :class:`Listener` in order; the HW never goes back.
* Snapshots (KIP-630): ``create_snapshot`` drops the log before a committed offset; a
  fetch from below the log start gets the snapshot id, and the follower pulls the snapshot
  with FetchSnapshot, installs it and hands it to ``Listener.handle_load_snapshot``.
* A leader that has not heard from a majority within 1.5 x fetch timeout resigns (check
  quorum); on graceful shutdown it resigns and sends EndQuorumEpoch with its preferred
  successors (most caught up first).

Bad requests are answered with Kafka's error codes and change nothing: a wrong cluster id
(INCONSISTENT_CLUSTER_ID), a stale epoch (FENCED_LEADER_EPOCH), a newer epoch at a leader
(UNKNOWN_LEADER_EPOCH), a non-leader (NOT_LEADER_OR_FOLLOWER), a sender that is not a voter
where one is required (INCONSISTENT_VOTER_SET), malformed fields (INVALID_REQUEST).
"""
from __future__ import annotations

import logging
import random as _random
from dataclasses import dataclass
from typing import Optional, Sequence

from kbroker.protocol.errors import ErrorCode
from kbroker.protocol.messages import begin_quorum_epoch as bqe
from kbroker.protocol.messages import describe_quorum as dq
from kbroker.protocol.messages import end_quorum_epoch as eqe
from kbroker.protocol.messages import fetch as fm
from kbroker.protocol.messages import fetch_snapshot as fs
from kbroker.protocol.messages import vote as vm
from kbroker.protocol.messages.leader_change_message import LeaderChangeMessage, Voter
from kbroker.raft import messages as M
from kbroker.raft.messages import Inbound, Outbound
from kbroker.protocol.messages import add_raft_voter as arv
from kbroker.protocol.messages import remove_raft_voter as rrv
from kbroker.protocol.messages import update_raft_voter as urv
from kbroker.raft.quorum_state import (NO_ID, Candidate, Follower, Leader, QuorumState, QuorumStateStore,
                                       ReplicaProgress, Resigned, Unattached)
from kbroker.raft.replicated_log import LEADER_CHANGE, Batch, OffsetAndEpoch, ReplicatedLog, decode_batches
from kbroker.raft.voter_set import (KRAFT_VERSION, KRAFT_VOTERS, SUPPORTED_KRAFT_VERSIONS, ZERO_UUID, VoterHistory,
                                    VoterNode, VoterSet, kraft_version_record)

log = logging.getLogger(__name__)

E = ErrorCode
RETRY_BACKOFF_BASE_MS = 50   # Kafka's RETRY_BACKOFF_BASE_MS for election backoff


@dataclass
class RaftConfig:
    """Kafka's ``controller.quorum.*`` settings and their defaults."""
    election_timeout_ms: int = 1000
    fetch_timeout_ms: int = 2000
    election_backoff_max_ms: int = 1000
    request_timeout_ms: int = 2000
    retry_backoff_ms: int = 20
    append_linger_ms: int = 25
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 8 * 1024 * 1024
    fetch_snapshot_max_bytes: int = 8 * 1024 * 1024
    max_batch_records: int = 1000


class Listener:
    """What the owner of the log (the controller, a broker's metadata loader) is told."""

    def handle_commit(self, batches: Sequence[Batch]) -> None:
        """Batches below the new high watermark, in offset order, each once per life."""

    def handle_leader_change(self, leader_id: int, epoch: int) -> None:
        """The known leader (-1 unknown) changed, or the epoch did."""

    def handle_load_snapshot(self, snapshot_id: OffsetAndEpoch, data: bytes) -> None:
        """Replace the state with this snapshot (at start-up, or fetched from the leader);
        commits continue from ``snapshot_id.offset``."""

    def handle_control_append(self, last_offset: int) -> None:
        """The leader appended control records of its own (a VotersRecord) up to
        ``last_offset``: the user's next records go after it."""


class NotLeaderError(RuntimeError):
    pass


class KafkaRaftClient:
    def __init__(self, node_id: int, voters, cluster_id: str, log_: ReplicatedLog, store: QuorumStateStore,
                 listener: Optional[Listener] = None, rng: Optional[_random.Random] = None,
                 config: Optional[RaftConfig] = None, bootstrap_ids=(), directory_id=ZERO_UUID,
                 listener_name: str = "", endpoints=(), followers_always_flush: bool = False) -> None:
        self.node_id = node_id
        #: Kafka's followersAlwaysFlush: an observer that may be added as a voter (a
        #: controller) fsyncs what it fetches like a voter, since the fetch offsets it reports
        #: count for the high watermark from the moment the leader appends it to the voters
        self.followers_always_flush = followers_always_flush
        #: KIP-853: this replica's key is (node id, directory id); ``endpoints`` are its own
        #: ((listener name, host, port), ...); ``listener_name`` the one voters talk on
        self.directory_id = directory_id
        self.listener_name = listener_name
        self.local_endpoints = tuple(endpoints)
        #: the voter set at each offset: static (``voters``, kraft.version 0) or from the
        #: KRaftVersion / Voters control records of the snapshot and log (kraft.version 1)
        self.history = VoterHistory(VoterSet.static(voters, listener_name))
        self.voters_version = 0          # bumped at every change of the voter set
        self._voter_op = None            # the AddRaftVoter / RemoveRaftVoter being committed (leader)
        self._resign_requested = False
        #: KIP-853: an observer that knows no voters finds the leader through these
        #: (controller.quorum.bootstrap.servers, ids -2, -3, ... as Kafka numbers them)
        self.bootstrap_ids = tuple(bootstrap_ids)
        self.cluster_id = cluster_id
        self.log = log_
        self.listener = listener or Listener()
        self.random = rng or _random.Random()
        self.config = config or RaftConfig()
        self.quorum = QuorumState(node_id, self.history.latest().ids, store)
        self._corr = 0
        self._inflight: dict[int, tuple[int, type, int]] = {}   # dest -> (correlation id, request type, deadline)
        self._backoff: dict[int, int] = {}                      # dest -> no request before this time
        self._parked: list = []          # (deadline, source, correlation id, FetchRequest) at the leader
        self._sent_hw: dict[int, int] = {}  # the high watermark last sent to each fetcher
        self._pending: list[bytes] = []  # records scheduled by the leader's user, not yet appended
        self._linger_deadline: Optional[int] = None
        self._next_commit_offset = 0     # first offset not yet given to the listener
        self._notified = (NO_ID, -1)
        self._shutting_down = False
        self.high_watermark = 0          # this replica's view (mirrors leader/follower state)
        self._cq_fetched: set = set()    # voters heard from since the last check-quorum
        self._out: list[Outbound] = []   # messages produced while handling, returned by poll
        self._fetching_snapshot = None   # follower: [snapshot id, bytearray so far] while fetching one
        #: test-only hooks that break the protocol on purpose (the simulation must catch them)
        self.bugs: frozenset = frozenset()

    # -- life cycle ------------------------------------------------------------------------
    @property
    def voters(self) -> frozenset:
        """The ids of the voters in force (the latest voter set appended)."""
        return self.quorum.voters

    @property
    def voter_set(self) -> VoterSet:
        return self.history.latest()

    @property
    def kraft_version(self) -> int:
        return self.history.kraft_version()

    @property
    def _static_quorum(self) -> bool:
        """kraft.version 0: the configured voters are the voters, so a Vote, BeginQuorumEpoch
        or EndQuorumEpoch from another node is refused (INCONSISTENT_VOTER_SET)."""
        return self.history.kraft_version() < 1

    def start(self, now: int) -> list[Outbound]:
        q = self.quorum
        snap = self.log.latest_snapshot_id()
        if snap is not None:
            self.history.reset_to_snapshot(snap.offset, self.log.read_snapshot(snap))
        self.history.apply_batches(self._control_batches(self.log.start_offset))
        self.quorum.voters = self.history.latest().ids
        self.voters_version += 1
        q.initialize(now + self._election_timeout())
        s = q.store.read()
        if s is not None and s.leader_id not in (NO_ID, self.node_id):
            # we knew the leader of this epoch: follow it again without disturbing the quorum
            q.state = Follower(s.epoch, s.leader_id, now + self.config.fetch_timeout_ms, voted_id=s.voted_id)
        if "vote_twice" in self.bugs:
            q.allow_double_vote = True
        if snap is not None:
            self._load_snapshot(snap, self.log.read_snapshot(snap))
        self._notify_leader()
        return []

    def _control_batches(self, start):
        return [b for b in self.log.read(start, 1 << 62) if b.control_type in (KRAFT_VERSION, KRAFT_VOTERS)] \
            if start < self.log.end_offset else []

    def _load_snapshot(self, snap, data):
        self.listener.handle_load_snapshot(snap, data)
        self._next_commit_offset = snap.offset
        if snap.offset > self.high_watermark:
            self.high_watermark = snap.offset
            self.log.update_high_watermark(snap.offset)

    def epoch_at(self, offset: int) -> int:
        """The epoch of the leader that wrote ``offset`` (from the log's epoch cache)."""
        epoch = 0
        for e in self.log.epoch_entries():
            if e.offset <= offset:
                epoch = e.epoch
        return epoch

    def create_snapshot(self, offset: int, data: bytes) -> Optional[OffsetAndEpoch]:
        """Keep ``data``, the state after every committed record below ``offset``, as a
        snapshot and drop the log before it (KIP-630). None if there is nothing new to cover."""
        if offset > self.high_watermark or offset > self.log.durable_end_offset:
            raise ValueError("snapshot at %d beyond the high watermark %d or the durable end %d"
                             % (offset, self.high_watermark, self.log.durable_end_offset))
        if offset <= self.log.start_offset:
            return None
        snap = OffsetAndEpoch(offset, self.epoch_at(offset - 1))
        self.log.create_snapshot(snap, data)
        return snap

    def snapshot_control_records(self, offset: int) -> list[tuple[int, bytes]]:
        """(control type, value) a snapshot ending at ``offset`` carries after its header
        (Kafka's RecordsSnapshotWriter): kraft.version and the voter set, when kraft.version >= 1."""
        version = self.history.kraft_version_at(offset - 1)
        if version < 1:
            return []
        return [(KRAFT_VERSION, kraft_version_record(version)),
                (KRAFT_VOTERS, bytes(self.history.at(offset - 1).to_record().encode(0)))]

    def shutdown(self, now: int) -> list[Outbound]:
        """Graceful shutdown: a leader resigns and tells the voters (EndQuorumEpoch)."""
        self._shutting_down = True
        out: list[Outbound] = []
        if isinstance(self.quorum.state, Leader):
            self._resign(now, out)
        self.log.flush()
        return out

    # -- the user's side ---------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return isinstance(self.quorum.state, Leader)

    @property
    def leader_and_epoch(self) -> tuple[int, int]:
        return self.quorum.leader_id, self.quorum.epoch

    def schedule_append(self, epoch: int, records: Sequence[bytes], now: int) -> int:
        """Queue ``records`` for the leader of ``epoch``; the offset of the last one. They are
        appended after ``append_linger_ms`` and count once ``handle_commit`` delivers them;
        if leadership is lost first they are gone (``handle_leader_change`` says so).
        NotLeaderError if this replica is not that leader (anymore)."""
        st = self.quorum.state
        if not isinstance(st, Leader) or st.epoch != epoch or self._shutting_down:
            raise NotLeaderError("not the leader of epoch %d (%s)" % (epoch, st.name))
        if not records:
            raise ValueError("no records")
        self._pending.extend(bytes(r) for r in records)
        if self._linger_deadline is None:
            self._linger_deadline = now + self.config.append_linger_ms
        return self.log.end_offset + len(self._pending) - 1

    # -- timers -------------------------------------------------------------------------------
    def _election_timeout(self) -> int:
        t = self.config.election_timeout_ms
        return t + self.random.randrange(t)

    def next_deadline(self) -> int:
        st = self.quorum.state
        ds = [d for _, _, d in self._inflight.values()]
        ds.extend(t for t in self._backoff.values())
        if isinstance(st, Resigned):
            ds.append(st.election_deadline)
        elif isinstance(st, Unattached):
            if self.quorum.is_voter:
                ds.append(st.election_deadline)
            elif not ds:
                ds.append(0)
        elif isinstance(st, Candidate):
            ds.append(st.backoff_until if st.backoff_until is not None else st.election_deadline)
        elif isinstance(st, Follower):
            if self.quorum.is_voter or not ds:
                ds.append(st.fetch_deadline)
        elif isinstance(st, Leader):
            ds.append(st.check_quorum_deadline)
            if self._voter_op is not None:
                ds.append(self._voter_op["deadline"])
            if self._resign_requested:
                ds.append(0)
            if self._linger_deadline is not None:
                ds.append(self._linger_deadline)
            ds.extend(p[0] for p in self._parked)
        return min(ds) if ds else 1 << 62

    # -- requests out ----------------------------------------------------------------------------
    def _can_send(self, dest: int, now: int) -> bool:
        return dest not in self._inflight and self._backoff.get(dest, 0) <= now

    def _send(self, out: list, dest: int, msg, now: int) -> None:
        self._corr += 1
        self._inflight[dest] = (self._corr, type(msg), now + self.config.request_timeout_ms)
        self._backoff.pop(dest, None)
        out.append(Outbound(dest, self._corr, msg))

    def _reset_requests(self) -> None:
        self._inflight.clear()
        self._backoff.clear()

    def _expire_requests(self, now: int) -> None:
        for dest in [d for d, t in self._backoff.items() if t <= now]:
            del self._backoff[dest]
        for dest, (_, _, deadline) in list(self._inflight.items()):
            if deadline <= now:
                del self._inflight[dest]
                self._backoff[dest] = now + self.config.retry_backoff_ms

    # -- poll ---------------------------------------------------------------------------------------
    def poll(self, now: int) -> list[Outbound]:
        out = self._out
        self._expire_requests(now)
        st = self.quorum.state
        if isinstance(st, Leader):
            self._poll_leader(now, out)
        elif isinstance(st, Candidate):
            self._poll_candidate(now, out)
        elif isinstance(st, Follower):
            self._poll_follower(now, out)
        elif isinstance(st, Resigned):
            self._poll_resigned(now, out)
        else:
            self._poll_unattached(now, out)
        self._out = []
        return out

    def _poll_unattached(self, now, out):
        st = self.quorum.state
        if self.quorum.is_voter:
            if now >= st.election_deadline and not self._shutting_down:
                self._become_candidate(now, out, retries=1)
        else:
            # an observer finds the leader by fetching from any voter
            self._observer_discover(now, out)

    def _observer_discover(self, now, out):
        if self._inflight:
            return
        known = sorted(self.voters) or list(self.bootstrap_ids)
        choices = [v for v in known if self._backoff.get(v, 0) <= now]
        if choices:
            dest = self.random.choice(choices)
            self._send(out, dest, self._fetch_request(self.quorum.epoch), now)

    def _poll_candidate(self, now, out):
        st = self.quorum.state
        if st.backoff_until is not None:
            if now >= st.backoff_until:
                self._become_candidate(now, out, retries=st.retries + 1)
            return
        if now >= st.election_deadline:
            st.backoff_until = now + self._binary_backoff(st.retries)
            return
        last = self.log.end_offset_and_epoch()
        for v in st.unrecorded_voters():
            if self._can_send(v, now):
                self._send(out, v, M.vote_request(self.cluster_id, v, st.epoch, self.node_id,
                                                  last.epoch, last.offset), now)

    def _binary_backoff(self, retries: int) -> int:
        return min(RETRY_BACKOFF_BASE_MS * self.random.randrange(2 << min(20, retries - 1)),
                   self.config.election_backoff_max_ms)

    def _poll_follower(self, now, out):
        st = self.quorum.state
        if now >= st.fetch_deadline:
            if self.quorum.is_voter:
                if not self._shutting_down:
                    self._become_candidate(now, out, retries=1)
            else:
                # an observer that lost its leader asks any voter who leads now
                self._observer_discover(now, out)
            return
        if self._can_send(st.leader_id, now):
            if self._fetching_snapshot is not None:
                snap, buf = self._fetching_snapshot
                self._send(out, st.leader_id, M.fetch_snapshot_request(
                    self.cluster_id, self.node_id, st.epoch, snap, len(buf), self.config.fetch_snapshot_max_bytes), now)
            else:
                self._send(out, st.leader_id, self._fetch_request(st.epoch), now)

    def _fetch_request(self, epoch):
        return M.fetch_request(self.cluster_id, self.node_id, epoch, self.log.end_offset,
                               self.log.last_fetched_epoch, self.config.fetch_max_wait_ms,
                               self.config.fetch_max_bytes, directory_id=self.directory_id)

    def _poll_resigned(self, now, out):
        st = self.quorum.state
        if now >= st.election_deadline and not self._shutting_down:
            if self.quorum.is_voter:
                self._become_candidate(now, out, retries=1)
            else:
                # a leader that removed itself (KIP-853) goes on as an observer
                self._transition(lambda: self.quorum.to_unattached(st.epoch + 1, now + self._election_timeout()),
                                 now)
                self._observer_discover(now, out)
            return
        self._send_end_quorum_epoch(now, out)

    def _send_end_quorum_epoch(self, now, out):
        st = self.quorum.state
        for v in sorted(st.unacknowledged):
            if self._can_send(v, now):
                self._send(out, v, M.end_quorum_epoch_request(self.cluster_id, self.node_id, st.epoch,
                                                              st.preferred), now)

    def _poll_leader(self, now, out):
        st = self.quorum.state
        if self._linger_deadline is not None and now >= self._linger_deadline:
            self._drain_pending(now)
        if self._voter_op is not None and now >= self._voter_op["deadline"]:
            self._finish_voter_op(E.REQUEST_TIMED_OUT, None)
        if self._resign_requested:
            self._resign_requested = False
            log.info("node %d: leader is not in the committed voter set %s; resigning from epoch %d",
                     self.node_id, sorted(self.voters), st.epoch)
            self._resign(now, out)
            return
        if now >= st.check_quorum_deadline:
            if len(self.voters) > 1:
                log.info("node %d: leader of epoch %d has not heard from a majority in %d ms; resigning",
                         self.node_id, st.epoch, self._check_quorum_ms())
                self._resign(now, out)
                return
            self._cq_fetched = set()
            st.check_quorum_deadline = now + self._check_quorum_ms()
        for v in st.non_acknowledging():
            if self._can_send(v, now):
                self._send(out, v, M.begin_quorum_epoch_request(self.cluster_id, v, self.node_id, st.epoch), now)
        if self._parked:
            due = [p for p in self._parked if p[0] <= now]
            if due:
                self._parked = [p for p in self._parked if p[0] > now]
                for _, src, corr, req in due:
                    out.append(Outbound(src, corr, self._complete_fetch(src, req, now)))

    def _check_quorum_ms(self) -> int:
        return int(self.config.fetch_timeout_ms * 1.5)

    def _drain_pending(self, now):
        st = self.quorum.state
        pending, self._pending = self._pending, []
        self._linger_deadline = None
        n = self.config.max_batch_records
        for i in range(0, len(pending), n):
            self.log.append_as_leader(pending[i:i + n], st.epoch, timestamp_ms=now)
        self._after_leader_append(now)

    def _after_leader_append(self, now):
        st = self.quorum.state
        self.log.flush()
        if st.update_end_offset(self.node_id, self.log.end_offset, now):
            self._on_high_watermark(st.high_watermark)
        self._wake_parked(now)

    def _wake_parked(self, now):
        """Answer parked fetches now (new data, new high watermark or a new state)."""
        if not self._parked:
            return
        parked, self._parked = self._parked, []
        for _, src, corr, req in parked:
            self._out.append(Outbound(src, corr, self._complete_fetch(src, req, now)))

    # -- transitions ------------------------------------------------------------------------------------
    def _transition(self, fn, now):
        was_leader = isinstance(self.quorum.state, Leader)
        fn()
        self._reset_requests()
        if was_leader and not isinstance(self.quorum.state, Leader):
            self._pending = []
            self._linger_deadline = None
            self._resign_requested = False
            if self._voter_op is not None:
                self._finish_voter_op(E.NOT_LEADER_OR_FOLLOWER, None)
            self._wake_parked(now)
        if isinstance(self.quorum.state, Follower):
            self.quorum.state.high_watermark = None
        self._fetching_snapshot = None
        self._notify_leader()

    def _notify_leader(self):
        cur = (self.quorum.leader_id, self.quorum.epoch)
        if cur != self._notified:
            self._notified = cur
            self.listener.handle_leader_change(*cur)

    def _become_candidate(self, now, out, retries):
        self._transition(lambda: self.quorum.to_candidate(now + self._election_timeout(), retries), now)
        st = self.quorum.state
        log.info("node %d: candidate in epoch %d", self.node_id, st.epoch)
        self._maybe_become_leader(now, out)
        if isinstance(self.quorum.state, Candidate):
            self._poll_candidate(now, out)

    def _maybe_become_leader(self, now, out):
        st = self.quorum.state
        if isinstance(st, Candidate) and st.is_vote_granted():
            self._transition(lambda: self.quorum.to_leader(self.log.end_offset, now, self._check_quorum_ms()), now)
            leader = self.quorum.state
            self._sent_hw = {}
            if "commit_without_current_epoch" in self.bugs:
                leader.commit_requires_current_epoch = False
            self._cq_fetched = set()
            log.info("node %d: leader of epoch %d at offset %d", self.node_id, leader.epoch,
                     leader.epoch_start_offset)
            msg = LeaderChangeMessage(version=0, leader_id=self.node_id,
                                      voters=[Voter(voter_id=v) for v in sorted(self.voters)],
                                      granting_voters=[Voter(voter_id=v) for v in sorted(st.granted)])
            self.log.append_as_leader([bytes(msg.encode(0))], leader.epoch, LEADER_CHANGE, timestamp_ms=now)
            if self.kraft_version >= 1 and self.history.latest_offset() == -1:
                # the voter set is only in the bootstrap snapshot, which fetchers from offset 0
                # never see: write it into the log (Kafka's appendStartOfEpochControlRecords)
                self._append_voters(self.history.latest(), now, with_kraft_version=True)
            self._after_leader_append(now)
            self._poll_leader(now, out)

    def _resign(self, now, out):
        st = self.quorum.state
        preferred = sorted((v for v in self.voters if v != self.node_id),
                           key=lambda v: (-(st.progress[v].end_offset if v in st.progress
                                            and st.progress[v].end_offset is not None else -1), v))
        self._transition(lambda: self.quorum.to_resigned(now + self._election_timeout()), now)
        self.quorum.state.preferred = preferred
        self._send_end_quorum_epoch(now, out)

    def _maybe_transition(self, leader_id: int, epoch: int, now: int) -> None:
        """Adopt what a peer told us about (leader, epoch) if it is newer than what we know."""
        q = self.quorum
        if epoch == q.epoch and leader_id != NO_ID and q.leader_id != NO_ID and leader_id != q.leader_id:
            raise AssertionError("node %d: peer says leader %d in epoch %d, we know %d"
                                 % (self.node_id, leader_id, epoch, q.leader_id))
        if epoch > q.epoch:
            if leader_id != NO_ID and leader_id != self.node_id:
                self._transition(lambda: q.to_follower(epoch, leader_id, now + self.config.fetch_timeout_ms), now)
            else:
                self._transition(lambda: q.to_unattached(epoch, now + self._election_timeout()), now)
        elif (epoch == q.epoch and leader_id not in (NO_ID, self.node_id) and q.leader_id == NO_ID):
            self._transition(lambda: q.to_follower(epoch, leader_id, now + self.config.fetch_timeout_ms), now)

    # -- commit ------------------------------------------------------------------------------------------
    def _on_high_watermark(self, hw: int) -> None:
        if hw <= self.high_watermark and self._next_commit_offset >= hw:
            return
        if hw < self.high_watermark:
            raise AssertionError("node %d: high watermark back from %d to %d" % (self.node_id, self.high_watermark, hw))
        self.high_watermark = hw
        self.log.update_high_watermark(hw)
        while self._next_commit_offset < hw:
            batches = self.log.read(self._next_commit_offset, 1 << 30)
            batches = [b for b in batches if b.base_offset < hw]
            if not batches:
                break
            if batches[-1].next_offset > hw:
                raise AssertionError("high watermark %d inside a batch" % hw)
            self._next_commit_offset = batches[-1].next_offset
            self.listener.handle_commit(batches)
        op = self._voter_op
        if op is not None and op["last_offset"] is not None and hw > op["last_offset"]:
            self._finish_voter_op(E.NONE, None)
            if op["kind"] == "remove" and not self.history.latest().is_voter(self.node_id, self.directory_id):
                self._resign_requested = True

    # -- inbound ------------------------------------------------------------------------------------------
    def handle(self, now: int, inbound: Inbound) -> list[Outbound]:
        """Handle one request (the response is among the returned messages) or response."""
        msg = inbound.message
        t = type(msg)
        if t in M.RESPONSE_OF:
            resp = self._handle_request(now, inbound)
            if resp is not None:
                self._out.append(Outbound(inbound.source, inbound.correlation_id, resp))
        else:
            exp = self._inflight.get(inbound.source)
            if exp is None or exp[0] != inbound.correlation_id or M.RESPONSE_OF[exp[1]] is not t:
                log.debug("node %d: ignoring unexpected %s from %d", self.node_id, t.__name__, inbound.source)
            else:
                del self._inflight[inbound.source]
                ok = self._handle_response(now, inbound)
                if not ok:
                    self._backoff[inbound.source] = now + self.config.retry_backoff_ms
        return self.poll(now)

    def _handle_request(self, now, inb):
        msg = inb.message
        if isinstance(msg, vm.VoteRequest):
            return self._handle_vote(now, inb.source, msg)
        if isinstance(msg, bqe.BeginQuorumEpochRequest):
            return self._handle_begin_epoch(now, msg)
        if isinstance(msg, eqe.EndQuorumEpochRequest):
            return self._handle_end_epoch(now, msg)
        if isinstance(msg, fm.FetchRequest):
            return self._handle_fetch(now, inb, msg)
        if isinstance(msg, dq.DescribeQuorumRequest):
            return self.describe_quorum(now, msg)
        if isinstance(msg, fs.FetchSnapshotRequest):
            return self._handle_fetch_snapshot(now, inb.source, msg)
        if isinstance(msg, arv.AddRaftVoterRequest):
            return self._handle_add_voter(now, inb, msg)
        if isinstance(msg, rrv.RemoveRaftVoterRequest):
            return self._handle_remove_voter(now, inb, msg)
        if isinstance(msg, urv.UpdateRaftVoterRequest):
            return self._handle_update_voter(now, msg)
        return None

    def _handle_fetch_snapshot(self, now, src, req):
        """FetchSnapshot (KIP-630): a chunk of the leader's snapshot from ``position``."""
        q = self.quorum
        if not self._valid_cluster_id(req.cluster_id):
            self._reject("FetchSnapshot", src, E.INCONSISTENT_CLUSTER_ID)
            return M.fetch_snapshot_response(E.INCONSISTENT_CLUSTER_ID)
        p = M.single_partition(req, "topics", name_attr="name")
        if p is None:
            return M.fetch_snapshot_response(partition_error=E.UNKNOWN_TOPIC_OR_PARTITION)

        def reply(err, **kw):
            if err != E.NONE:
                self._reject("FetchSnapshot", src, err)
            return M.fetch_snapshot_response(partition_error=err, leader_id=q.leader_id, epoch=q.epoch, **kw)
        if p.current_leader_epoch < q.epoch:
            return reply(E.FENCED_LEADER_EPOCH)
        if p.current_leader_epoch > q.epoch:
            return reply(E.UNKNOWN_LEADER_EPOCH)
        if not isinstance(q.state, Leader):
            return reply(E.NOT_LEADER_OR_FOLLOWER)
        snap = OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
        data = self.log.read_snapshot(snap)
        if data is None:
            return reply(E.SNAPSHOT_NOT_FOUND)
        if p.position < 0 or p.position > len(data):
            return reply(E.POSITION_OUT_OF_RANGE)
        chunk = data[p.position:p.position + max(1, req.max_bytes)]
        return reply(E.NONE, snapshot_id=snap, size=len(data), position=p.position, data=chunk)

    def describe_quorum(self, now, req=None):
        """DescribeQuorum (KIP-595): the leader's view of every voter and observer."""
        if req is not None and M.single_partition(req, "topics") is None:
            return M.describe_quorum_response(E.UNKNOWN_TOPIC_OR_PARTITION)
        st = self.quorum.state
        if not isinstance(st, Leader):
            return M.describe_quorum_response(E.NOT_LEADER_OR_FOLLOWER, self.quorum.leader_id, self.quorum.epoch)

        vs = self.history.latest()

        def row(p):
            node = vs.nodes.get(p.replica_id)
            d = node.directory_id if node is not None else p.directory_id
            if p.replica_id == self.node_id:
                return (p.replica_id, self.log.end_offset, now, now, d if node is not None else self.directory_id)
            return (p.replica_id, p.end_offset if p.end_offset is not None else -1, p.last_fetch_ms,
                    p.last_caught_up_ms, d)
        hw = st.high_watermark if st.high_watermark is not None else -1
        nodes = [(n.node_id, [e for e in n.endpoints if e[0]]) for n in sorted(vs.nodes.values(),
                                                                             key=lambda n: n.node_id)]
        return M.describe_quorum_response(E.NONE, self.node_id, st.epoch, hw,
                                          [row(st.progress[v]) for v in sorted(st.progress)],
                                          [row(st.observers[o]) for o in sorted(st.observers)
                                           if o not in st.progress], nodes=[n for n in nodes if n[1]])

    # -- KIP-853: the voter set changes ------------------------------------------------------
    def _on_voters_changed(self, now) -> None:
        """The latest voter set changed (appended, truncated or loaded): the quorum and, at the
        leader, the replicas counted for the high watermark follow it at once."""
        vs = self.history.latest()
        ids = vs.ids
        self.quorum.voters = ids
        self.voters_version += 1
        log.info("node %d: voters are now %s", self.node_id, vs)
        st = self.quorum.state
        if isinstance(st, Leader):
            st.voters = ids
            for v in ids - set(st.progress):
                p = st.observers.pop(v, None) or ReplicaProgress(v)
                p.acknowledged = p.end_offset is not None or v == self.node_id
                st.progress[v] = p
            for v in set(st.progress) - ids:
                st.observers[v] = st.progress.pop(v)
            self._cq_fetched &= ids
            if st.maybe_update_high_watermark():
                self._on_high_watermark(st.high_watermark)

    def _append_voters(self, voters: VoterSet, now, with_kraft_version=False) -> int:
        """Leader: append a VotersRecord (after the user's pending records, at the offsets
        promised to them); the offset it lands at."""
        st = self.quorum.state
        if self._pending:
            self._drain_pending(now)
        if with_kraft_version:
            b = self.log.append_as_leader([kraft_version_record(self.kraft_version)], st.epoch, KRAFT_VERSION,
                                          timestamp_ms=now)
            self.history.apply(b.base_offset, KRAFT_VERSION, b.records[0])
        b = self.log.append_as_leader([bytes(voters.to_record().encode(0))], st.epoch, KRAFT_VOTERS,
                                      timestamp_ms=now)
        if self.history.apply(b.base_offset, KRAFT_VOTERS, b.records[0]):
            self._on_voters_changed(now)
        self.listener.handle_control_append(b.last_offset)
        return b.base_offset

    def _finish_voter_op(self, err, message) -> None:
        op, self._voter_op = self._voter_op, None
        if op is None:
            return
        if err == E.REQUEST_TIMED_OUT and message is None:
            message = "Request timed out waiting for the voter change to commit"
        build = M.add_raft_voter_response if op["kind"] == "add" else M.remove_raft_voter_response
        log.info("node %d: %s voter %d: %s", self.node_id, op["kind"], op["voter"], ErrorCode(err).name)
        self._out.append(Outbound(op["source"], op["corr"], build(err, message)))

    def _voter_change_precheck(self, what):
        """Kafka's checks shared by AddVoterHandler and RemoveVoterHandler: (error, message)
        or None. The caller made sure this replica is the leader."""
        st = self.quorum.state
        if self._voter_op is not None:
            return (E.REQUEST_TIMED_OUT, "Request timed out waiting for leader to handle previous voter change "
                                         "request")
        if st.high_watermark is None:
            return (E.REQUEST_TIMED_OUT, "Request timed out waiting for leader to establish HWM and fence "
                                         "previous voter changes")
        if self.kraft_version < 1:
            return (E.UNSUPPORTED_VERSION, "Cluster doesn't support %s voter because the kraft.version feature "
                                           "is %d" % (what, self.kraft_version))
        off = self.history.latest_offset()
        if off is None or off >= st.high_watermark:
            return (E.REQUEST_TIMED_OUT, "Request timed out waiting for voters to commit the latest voter change "
                                         "at %s with HWM %d" % (off, st.high_watermark))
        return None

    def _leader_only_error(self):
        return None if isinstance(self.quorum.state, Leader) and not self._shutting_down \
            else E.NOT_LEADER_OR_FOLLOWER

    def _handle_add_voter(self, now, inb, req):
        """AddRaftVoter (Kafka's AddVoterHandler): the new voter must already fetch as an
        observer with this (id, directory id) and have caught up once; the VotersRecord
        with it is appended and the answer waits for its commit (by the new majority).
        Kafka first asks the new voter for its ApiVersions (kraft.version range); a voter
        that fetches from us speaks KIP-853's Fetch v17 and is taken to support 0..1."""
        if not self._valid_cluster_id(req.cluster_id or None):
            return M.add_raft_voter_response(E.INCONSISTENT_CLUSTER_ID, 'The given id "%s" doesn\'t match the '
                                             'cluster id "%s"' % (req.cluster_id, self.cluster_id))
        err = self._leader_only_error()
        if err is not None:
            return M.add_raft_voter_response(err)
        if req.voter_id < 0 or req.voter_directory_id == ZERO_UUID:
            return M.add_raft_voter_response(E.INVALID_REQUEST, "Add voter request didn't include a valid voter")
        endpoints = tuple((l.name, l.host, l.port) for l in req.listeners)
        if not any(e[0] == self.listener_name for e in endpoints):
            return M.add_raft_voter_response(
                E.INVALID_REQUEST, "Add voter request didn't include the endpoint (%s) for the default listener %s"
                % (", ".join("%s://%s:%d" % e for e in endpoints), self.listener_name))
        bad = self._voter_change_precheck("adding")
        if bad is not None:
            return M.add_raft_voter_response(*bad)
        voters = self.history.latest()
        key = "ReplicaKey(id=%d, directoryId=%s)" % (req.voter_id, req.voter_directory_id)
        if req.voter_id in voters.nodes:
            return M.add_raft_voter_response(E.DUPLICATE_VOTER, "The voter id for %s is already part of the set "
                                             "of voters %s." % (key, voters))
        st = self.quorum.state
        p = st.observers.get(req.voter_id)
        if (p is None or p.directory_id != req.voter_directory_id or p.last_caught_up_ms < 0
                or p.last_fetch_ms < 0 or p.last_fetch_ms <= now - 3_600_000):
            return M.add_raft_voter_response(E.REQUEST_TIMED_OUT, "Aborted add voter operation for %s since it "
                                             "is lagging behind" % key)
        new = voters.add(VoterNode(req.voter_id, req.voter_directory_id, endpoints, *SUPPORTED_KRAFT_VERSIONS))
        self._voter_op = {"kind": "add", "voter": req.voter_id, "source": inb.source, "corr": inb.correlation_id,
                          "deadline": now + self.config.request_timeout_ms, "last_offset": None}
        self._voter_op["last_offset"] = self._append_voters(new, now)
        self._after_leader_append(now)
        return None

    def _handle_remove_voter(self, now, inb, req):
        """RemoveRaftVoter (Kafka's RemoveVoterHandler): append the VotersRecord without the
        voter, answer once it is committed; a leader that removed itself then resigns."""
        if not self._valid_cluster_id(req.cluster_id or None):
            return M.remove_raft_voter_response(E.INCONSISTENT_CLUSTER_ID, 'The given id "%s" doesn\'t match '
                                                'the cluster id "%s"' % (req.cluster_id, self.cluster_id))
        err = self._leader_only_error()
        if err is not None:
            return M.remove_raft_voter_response(err)
        if req.voter_id < 0 or req.voter_directory_id == ZERO_UUID:
            return M.remove_raft_voter_response(E.INVALID_REQUEST,
                                                "Remove voter request didn't include a valid voter")
        bad = self._voter_change_precheck("removing")
        if bad is not None:
            return M.remove_raft_voter_response(*bad)
        voters = self.history.latest()
        new = voters.remove(req.voter_id, req.voter_directory_id)
        if new is None:
            return M.remove_raft_voter_response(
                E.VOTER_NOT_FOUND, "Cannot remove voter ReplicaKey(id=%d, directoryId=%s) from the set of voters %s"
                % (req.voter_id, req.voter_directory_id, voters))
        self._voter_op = {"kind": "remove", "voter": req.voter_id, "source": inb.source,
                          "corr": inb.correlation_id, "deadline": now + self.config.request_timeout_ms,
                          "last_offset": None}
        self._voter_op["last_offset"] = self._append_voters(new, now)
        self._after_leader_append(now)
        return None

    def _handle_update_voter(self, now, req):
        """UpdateRaftVoter: a voter's new endpoints. Accepted when nothing changes (what a
        voter restarting on the same listeners sends); endpoint changes are not supported yet."""
        q = self.quorum
        if not self._valid_cluster_id(req.cluster_id or None):
            return M.update_raft_voter_response(E.INCONSISTENT_CLUSTER_ID)
        err = self._leader_only_error()
        if err is not None:
            return M.update_raft_voter_response(err, q.leader_id, q.epoch)
        if self.kraft_version < 1:
            return M.update_raft_voter_response(E.INVALID_REQUEST, q.leader_id, q.epoch)
        node = self.history.latest().nodes.get(req.voter_id)
        if node is None or node.directory_id != req.voter_directory_id:
            return M.update_raft_voter_response(E.VOTER_NOT_FOUND, q.leader_id, q.epoch)
        endpoints = tuple((l.name, l.host, l.port) for l in req.listeners)
        if endpoints != node.endpoints:
            return M.update_raft_voter_response(E.REQUEST_TIMED_OUT, q.leader_id, q.epoch)
        return M.update_raft_voter_response(E.NONE, q.leader_id, q.epoch)

    def _valid_cluster_id(self, cid) -> bool:
        return cid is None or cid == self.cluster_id

    def _reject(self, what, src, error):
        log.warning("node %d: rejected %s from %d: %s", self.node_id, what, src, error.name)

    # Vote
    def _handle_vote(self, now, src, req):
        q = self.quorum
        if not self._valid_cluster_id(req.cluster_id):
            self._reject("Vote", src, E.INCONSISTENT_CLUSTER_ID)
            return M.vote_response(E.INCONSISTENT_CLUSTER_ID)
        p = M.single_partition(req, "topics")
        if p is None:
            return M.vote_response(E.INVALID_REQUEST)

        def reply(err, granted=False):
            if err != E.NONE:
                self._reject("Vote", src, err)
            return M.vote_response(partition_error=err, leader_id=q.leader_id, epoch=q.epoch, granted=granted)
        if p.last_offset < 0 or p.last_offset_epoch < 0 or p.last_offset_epoch >= p.candidate_epoch:
            return reply(E.INVALID_REQUEST)
        if p.candidate_epoch < q.epoch:
            return reply(E.FENCED_LEADER_EPOCH)
        if p.candidate_id < 0:
            return reply(E.INVALID_REQUEST)
        if self._static_quorum and (p.candidate_id not in self.voters or not q.is_voter):
            # (KIP-853: with kraft.version 1 the voter set is in the log and ours may be
            # stale, so Kafka no longer checks it here)
            return reply(E.INCONSISTENT_VOTER_SET)
        if req.voter_id not in (-1, self.node_id):
            return reply(E.INVALID_VOTER_KEY)
        if p.candidate_epoch > q.epoch:
            self._transition(lambda: q.to_unattached(p.candidate_epoch, now + self._election_timeout()), now)
        st = q.state
        last = self.log.end_offset_and_epoch()
        up_to_date = (p.last_offset_epoch, p.last_offset) >= (last.epoch, last.offset) or "vote_ignores_log" in self.bugs
        if isinstance(st, Unattached):
            if st.voted_id != NO_ID and "vote_twice" not in self.bugs:
                granted = st.voted_id == p.candidate_id
            else:
                granted = up_to_date
                if granted and st.voted_id != p.candidate_id:
                    q.to_voted(st.epoch, p.candidate_id, now + self._election_timeout())
        else:
            granted = False
        log.info("node %d: vote for %d in epoch %d %s", self.node_id, p.candidate_id, p.candidate_epoch,
                 "granted" if granted else "rejected")
        return reply(E.NONE, granted)

    # BeginQuorumEpoch
    def _handle_begin_epoch(self, now, req):
        q = self.quorum
        if not self._valid_cluster_id(req.cluster_id):
            self._reject("BeginQuorumEpoch", -1, E.INCONSISTENT_CLUSTER_ID)
            return M.begin_quorum_epoch_response(E.INCONSISTENT_CLUSTER_ID)
        p = M.single_partition(req, "topics")
        if p is None:
            return M.begin_quorum_epoch_response(E.INVALID_REQUEST)

        def reply(err):
            if err != E.NONE:
                self._reject("BeginQuorumEpoch", p.leader_id, err)
            return M.begin_quorum_epoch_response(partition_error=err, leader_id=q.leader_id, epoch=q.epoch)
        if p.leader_epoch < q.epoch:
            return reply(E.FENCED_LEADER_EPOCH)
        if p.leader_id < 0:
            return reply(E.INVALID_REQUEST)
        if self._static_quorum and p.leader_id not in self.voters:
            return reply(E.INCONSISTENT_VOTER_SET)
        if p.leader_id == self.node_id:
            return reply(E.INVALID_REQUEST)
        self._maybe_transition(p.leader_id, p.leader_epoch, now)
        if req.voter_id not in (-1, self.node_id):
            return reply(E.INVALID_VOTER_KEY)
        return reply(E.NONE)

    # EndQuorumEpoch
    def _handle_end_epoch(self, now, req):
        q = self.quorum
        if not self._valid_cluster_id(req.cluster_id):
            self._reject("EndQuorumEpoch", -1, E.INCONSISTENT_CLUSTER_ID)
            return M.end_quorum_epoch_response(E.INCONSISTENT_CLUSTER_ID)
        p = M.single_partition(req, "topics")
        if p is None:
            return M.end_quorum_epoch_response(E.INVALID_REQUEST)

        def reply(err):
            if err != E.NONE:
                self._reject("EndQuorumEpoch", p.leader_id, err)
            return M.end_quorum_epoch_response(partition_error=err, leader_id=q.leader_id, epoch=q.epoch)
        if p.leader_epoch < q.epoch:
            return reply(E.FENCED_LEADER_EPOCH)
        if p.leader_id < 0 or p.leader_id == self.node_id:
            return reply(E.INVALID_REQUEST)
        if self._static_quorum and p.leader_id not in self.voters:
            return reply(E.INCONSISTENT_VOTER_SET)
        self._maybe_transition(p.leader_id, p.leader_epoch, now)
        st = q.state
        if isinstance(st, Follower) and st.leader_id == p.leader_id:
            preferred = [c.candidate_id for c in p.preferred_candidates]
            pos = preferred.index(self.node_id) if self.node_id in preferred else -1
            st.fetch_deadline = now + self._strict_backoff(pos, len(preferred))
        return reply(E.NONE)

    def _strict_backoff(self, pos, total):
        if pos == 0:
            return 0
        mx = self.config.election_backoff_max_ms
        if pos < 0 or pos >= total:
            return mx
        return min(mx, (mx >> (total - 1)) << (pos - 1))

    # Fetch (at the leader)
    def _handle_fetch(self, now, inb, req):
        if not self._valid_cluster_id(req.cluster_id):
            self._reject("Fetch", inb.source, E.INCONSISTENT_CLUSTER_ID)
            return M.fetch_response(E.INCONSISTENT_CLUSTER_ID)
        p = M.single_partition(req, "topics", name_attr="topic_id")
        if p is None:
            return M.fetch_response(E.INVALID_REQUEST)
        if (req.max_wait_ms < 0 or p.fetch_offset < 0 or p.last_fetched_epoch < 0
                or p.last_fetched_epoch > p.current_leader_epoch):
            return self._fetch_error(E.INVALID_REQUEST)
        sent_hw = self._sent_hw.get(inb.source)
        resp = self._complete_fetch(inb.source, req, now)
        rp = resp.responses[0].partitions[0] if resp.responses else None
        replica = M.fetch_replica_id(req)
        st = self.quorum.state
        if rp is not None and rp.error_code == 0 and replica in self.voters and replica != self.node_id:
            # check quorum (Kafka's LeaderState): the timer restarts each time a majority
            # (the leader and the voters fetching from it) has been heard from
            self._cq_fetched.add(replica)
            if len(self._cq_fetched) + 1 >= len(self.voters) // 2 + 1:
                self._cq_fetched = set()
                st.check_quorum_deadline = now + self._check_quorum_ms()
        # answer at once, not after max wait, when: an error, records, no wait wanted, a high
        # watermark this fetcher has not been sent yet, divergence, a snapshot to fetch
        if (rp is None or rp.error_code != 0 or rp.records or req.max_wait_ms == 0
                or rp.high_watermark != sent_hw
                or rp.diverging_epoch.epoch >= 0 or rp.snapshot_id.epoch >= 0):
            return resp
        self._parked.append((now + req.max_wait_ms, inb.source, inb.correlation_id, req))
        return None

    def _fetch_error(self, err):
        q = self.quorum
        return M.fetch_response(partition_error=err, leader_id=q.leader_id, epoch=q.epoch)

    def _complete_fetch(self, src, req, now):
        q = self.quorum
        st = q.state
        p = req.topics[0].partitions[0]
        if p.current_leader_epoch < q.epoch:
            err = E.FENCED_LEADER_EPOCH
        elif p.current_leader_epoch > q.epoch:
            err = E.UNKNOWN_LEADER_EPOCH
        elif not isinstance(st, Leader):
            err = E.NOT_LEADER_OR_FOLLOWER
        elif self._shutting_down:
            err = E.BROKER_NOT_AVAILABLE
        else:
            err = E.NONE
        if err != E.NONE:
            return self._fetch_error(err)
        replica = M.fetch_replica_id(req)
        v = self.log.validate_offset_and_epoch(p.fetch_offset, p.last_fetched_epoch)
        records = None
        diverging = snapshot_id = None
        if v.kind == "valid":
            if replica >= 0 and replica != self.node_id:
                progress = st.progress.get(replica) or st.observers.setdefault(replica, ReplicaProgress(replica))
                progress.directory_id = p.replica_directory_id
                if st.update_end_offset(replica, p.fetch_offset, now, self.log.end_offset):
                    self._on_high_watermark(st.high_watermark)
                    # followers learn the new high watermark without waiting for max_wait
                    parked, self._parked = self._parked, []
                    for _, s2, c2, r2 in parked:
                        if s2 != src:
                            self._out.append(Outbound(s2, c2, self._complete_fetch(s2, r2, now)))
            batches = self.log.read(p.fetch_offset, min(req.max_bytes, p.partition_max_bytes))
            if batches:
                records = b"".join(b.data for b in batches)
        elif v.kind == "diverging":
            diverging = v.offset_and_epoch
        else:
            snapshot_id = v.offset_and_epoch
        hw = st.high_watermark if st.high_watermark is not None else -1
        self._sent_hw[src] = hw
        return M.fetch_response(leader_id=q.leader_id, epoch=q.epoch, high_watermark=hw,
                                records=records, diverging=diverging, snapshot_id=snapshot_id)

    # -- responses ----------------------------------------------------------------------------------------------
    def _handle_response(self, now, inb) -> bool:
        msg = inb.message
        if msg.error_code != 0:
            err = ErrorCode(msg.error_code)
            log.warning("node %d: %s from %d: %s", self.node_id, type(msg).__name__, inb.source, err.name)
            return False
        if isinstance(msg, fm.FetchResponse):
            p = M.single_partition(msg, "responses", name_attr="topic_id")
            if p is None:
                return False
            leader, epoch = p.current_leader.leader_id, p.current_leader.leader_epoch
        elif isinstance(msg, fs.FetchSnapshotResponse):
            p = M.single_partition(msg, "topics", name_attr="name")
            if p is None:
                return False
            leader, epoch = p.current_leader.leader_id, p.current_leader.leader_epoch
        else:
            p = M.single_partition(msg, "topics")
            if p is None:
                return False
            leader, epoch = p.leader_id, p.leader_epoch
        err = ErrorCode(p.error_code)
        handled = self._common_response(err, leader, epoch, now)
        if handled is not None:
            return handled
        if isinstance(msg, vm.VoteResponse):
            return self._handle_vote_response(now, inb.source, err, p)
        if isinstance(msg, bqe.BeginQuorumEpochResponse):
            st = self.quorum.state
            if err == E.NONE and isinstance(st, Leader) and inb.source in st.progress:
                st.progress[inb.source].acknowledged = True
            return err == E.NONE
        if isinstance(msg, fs.FetchSnapshotResponse):
            return self._handle_fetch_snapshot_response(now, inb.source, err, p)
        if isinstance(msg, eqe.EndQuorumEpochResponse):
            st = self.quorum.state
            if err == E.NONE and isinstance(st, Resigned):
                st.unacknowledged.discard(inb.source)
            return err == E.NONE
        return self._handle_fetch_response(now, inb.source, err, p)

    def _common_response(self, err, leader_id, epoch, now):
        """Kafka's maybeHandleCommonResponse: None means "go on to the specific handler"."""
        q = self.quorum
        if epoch < q.epoch or err == E.UNKNOWN_LEADER_EPOCH:
            return True
        if epoch > q.epoch or err in (E.FENCED_LEADER_EPOCH, E.NOT_LEADER_OR_FOLLOWER):
            before = (q.leader_id, q.epoch)
            self._maybe_transition(leader_id, epoch, now)
            # nothing learnt (e.g. a resigned leader): retry after a backoff, not at once
            return before != (q.leader_id, q.epoch)
        if epoch == q.epoch and leader_id >= 0 and q.leader_id == NO_ID:
            self._maybe_transition(leader_id, epoch, now)
            return None if err == E.NONE else True
        if err == E.BROKER_NOT_AVAILABLE:
            return False
        if err in (E.INVALID_VOTER_KEY, E.INCONSISTENT_VOTER_SET, E.INCONSISTENT_CLUSTER_ID):
            log.warning("node %d: response error %s", self.node_id, err.name)
            return False
        if err == E.INVALID_REQUEST:
            raise AssertionError("node %d: our request was invalid" % self.node_id)
        return None

    def _handle_vote_response(self, now, src, err, p):
        st = self.quorum.state
        if err != E.NONE:
            return False
        if isinstance(st, Candidate):
            if p.vote_granted:
                st.granted.add(src)
                self._maybe_become_leader(now, self._out)
            else:
                st.rejected.add(src)
                if st.is_vote_rejected() and st.backoff_until is None:
                    st.backoff_until = now + self._binary_backoff(st.retries)
        return True

    def _handle_fetch_response(self, now, src, err, p):
        st = self.quorum.state
        if err != E.NONE:
            return False
        if not isinstance(st, Follower) or src != st.leader_id:
            return True
        if p.diverging_epoch.epoch >= 0:
            div = OffsetAndEpoch(p.diverging_epoch.end_offset, p.diverging_epoch.epoch)
            if div.offset < self.high_watermark:
                raise AssertionError("node %d: leader asked to truncate to %d below the high watermark %d"
                                     % (self.node_id, div.offset, self.high_watermark))
            if "no_truncate" not in self.bugs:
                off = self.log.truncate_to_end_offset(div)
                log.info("node %d: truncated to %d (diverging epoch %s)", self.node_id, off, tuple(div))
                if self.history.truncate(self.log.end_offset):
                    self._on_voters_changed(now)
        elif p.snapshot_id.epoch >= 0 or p.snapshot_id.end_offset >= 0:
            if p.snapshot_id.epoch < 0 or p.snapshot_id.end_offset < 0:
                log.error("node %d: leader sent an invalid snapshot id %d-%d", self.node_id,
                          p.snapshot_id.end_offset, p.snapshot_id.epoch)
                return False
            snap = OffsetAndEpoch(p.snapshot_id.end_offset, p.snapshot_id.epoch)
            log.info("node %d: fetching snapshot %s from leader %d", self.node_id, tuple(snap), st.leader_id)
            self._fetching_snapshot = [snap, bytearray()]
        else:
            if p.records:
                batches = decode_batches(p.records)
                if batches and batches[0].base_offset != self.log.end_offset:
                    return True       # an answer for an offset we no longer fetch from (stale)
                self.log.append_as_follower(batches)
                if self.history.apply_batches(batches):
                    self._on_voters_changed(now)
                if (self.quorum.is_voter or self.followers_always_flush) and "no_fsync" not in self.bugs:
                    self.log.flush()
            if p.high_watermark >= 0:
                new_hw = min(self.log.end_offset, p.high_watermark)
                if new_hw > self.high_watermark:
                    st.high_watermark = new_hw
                    self._on_high_watermark(new_hw)
        st.fetch_deadline = now + self.config.fetch_timeout_ms
        return True

    def _handle_fetch_snapshot_response(self, now, src, err, p):
        st = self.quorum.state
        if not isinstance(st, Follower) or src != st.leader_id or self._fetching_snapshot is None:
            return True
        snap, buf = self._fetching_snapshot
        if err in (E.SNAPSHOT_NOT_FOUND, E.POSITION_OUT_OF_RANGE):
            self._fetching_snapshot = None          # the leader moved on: Fetch again
            return True
        if err != E.NONE:
            return False
        if (p.snapshot_id.end_offset, p.snapshot_id.epoch) != tuple(snap) or p.position != len(buf):
            return True
        buf += bytes(p.unaligned_records or b"")
        if len(buf) >= p.size:
            data = bytes(buf)
            self._fetching_snapshot = None
            if snap.offset < self.high_watermark:
                raise AssertionError("node %d: snapshot %s below the high watermark %d"
                                     % (self.node_id, tuple(snap), self.high_watermark))
            self.log.install_snapshot(snap, data)
            if self.history.reset_to_snapshot(snap.offset, data):
                self._on_voters_changed(now)
            self._load_snapshot(snap, data)
            log.info("node %d: installed snapshot %s", self.node_id, tuple(snap))
        st.fetch_deadline = now + self.config.fetch_timeout_ms
        return True
