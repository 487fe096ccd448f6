"""Deterministic simulation of a KRaft quorum: one process, a seeded clock and network.

N voters and M observers run :class:`KafkaRaftClient` over :class:`MemoryLog` and
:class:`MemoryQuorumStateStore`. Every message goes through its generated codec (encoded
to bytes when sent, decoded when delivered). The network delays each message by a random
number of milliseconds (so it reorders), drops and duplicates some, and honours
partitions (a node isolated, or the quorum split in two). Nodes crash and restart with
only what they fsynced (the quorum-state store, the durable prefix of the log and its
snapshot), or shut down gracefully. With ``snapshot_every`` nodes snapshot their applied
state and lagging ones catch up with FetchSnapshot. A workload appends records at whichever node leads.

Invariants, checked after every step (a violation raises :class:`InvariantViolation`
naming the seed):

* at most one leader per epoch, and at most one vote per voter per epoch (across restarts);
* a committed entry is never lost or changed: every record a node delivers as committed
  equals the record the first node to commit that offset delivered; at the end every
  committed entry is in the (fsynced) logs of a majority of voters;
* the high watermark of a node never goes back (within one life of the node);
* a node's applied state is exactly the committed prefix up to its high watermark;
* liveness: once the faults heal, a leader is elected and a new append commits on every
  node within ``liveness_ms`` simulated milliseconds.

Reproduce a failing seed with the command its failure prints, e.g.
``python -m kbroker.raft.simulation SEED --set voters=5 -v`` (``-v`` prints the event trace
and the clients' log), or ``KBROKER_RAFT_SEED=SEED pytest tests/raft/test_simulation.py``.
"""
from __future__ import annotations

import heapq
import logging
import pickle
import random
import sys
from dataclasses import dataclass, field
from typing import Optional

from kbroker.raft import messages as M
from kbroker.raft.client import KafkaRaftClient, Listener, NotLeaderError, RaftConfig
from kbroker.raft.quorum_state import MemoryQuorumStateStore
from kbroker.raft.replicated_log import MemoryLog

CLUSTER_ID = "Sim-cluster-id-0000000"
ADMIN_ID = -100      # where the answers to the workload's AddRaftVoter / RemoveRaftVoter go


def _directory_id(node_id: int):
    import uuid
    return uuid.UUID(int=0xD1 << 64 | node_id)


class InvariantViolation(AssertionError):
    pass


@dataclass
class SimConfig:
    voters: int = 3
    observers: int = 1
    fault_ms: int = 6000            # simulated time with faults
    liveness_ms: int = 20000        # bound for a commit after the faults heal
    max_delay_ms: int = 30
    drop: float = 0.05
    duplicate: float = 0.03
    crash_every_ms: int = 1500      # mean time between crash / shutdown events
    partition_every_ms: int = 1500  # mean time between partitions
    append_every_ms: int = 40       # mean time between workload appends
    fetch_max_bytes: Optional[int] = None   # None: pick per seed (small values split fetches)
    bugs: frozenset = frozenset()   # test-only protocol bugs to inject (see KafkaRaftClient.bugs)
    #: run the nodes on KafkaMetadataLog (our on-disk Log) under this directory instead of
    #: MemoryLog; a crash is then a process crash (written data survives, recovery runs)
    disk_dir: Optional[str] = None
    #: each node snapshots its applied state every this many committed records (None: never)
    snapshot_every: Optional[int] = None
    #: KIP-853: the voters start as a VotersRecord (kraft.version 1) in their logs, the
    #: observers know them as bootstrap servers, and the workload adds and removes voters
    #: (AddRaftVoter / RemoveRaftVoter at the leader) about every this many ms (None: static)
    reconfigure_every_ms: Optional[int] = None


class AppliedState(Listener):
    """A node's state machine: the committed records in offset order, checked on delivery."""

    def __init__(self, sim: "Simulation", node: "SimNode") -> None:
        self.sim = sim
        self.node = node
        self.applied: list = []     # (epoch, control_type, value) per offset
        self.leader = (-1, -1)

    def handle_commit(self, batches):
        committed = self.sim.committed
        for b in batches:
            if b.base_offset != len(self.applied):
                self.sim.fail("node %d applied offset %d after %d records" % (self.node.id, b.base_offset,
                                                                             len(self.applied)))
            for i, v in enumerate(b.records):
                off = b.base_offset + i
                entry = (b.epoch, b.control_type, v)
                if off < len(committed):
                    if committed[off] != entry:
                        self.sim.fail("committed entry at offset %d changed: node %d has %r, committed was %r"
                                      % (off, self.node.id, entry, committed[off]))
                else:
                    committed.append(entry)
                self.applied.append(entry)

    def handle_leader_change(self, leader_id, epoch):
        self.leader = (leader_id, epoch)

    def handle_load_snapshot(self, snapshot_id, data):
        entries = pickle.loads(data)
        if len(entries) != snapshot_id.offset or entries != self.sim.committed[:len(entries)]:
            self.sim.fail("node %d loaded snapshot %s that is not the committed prefix"
                          % (self.node.id, tuple(snapshot_id)))
        self.applied = entries


@dataclass
class SimNode:
    id: int
    voter: bool
    log: MemoryLog = field(default_factory=MemoryLog)
    store: MemoryQuorumStateStore = field(default_factory=MemoryQuorumStateStore)
    client: Optional[KafkaRaftClient] = None
    state: Optional[AppliedState] = None
    up: bool = False
    incarnation: int = 0
    last_hw: int = 0
    last_snapshot: int = 0
    deadline: int = 1 << 62         # the client's next_deadline(), cached after each call into it


class Simulation:
    def __init__(self, seed: int, config: Optional[SimConfig] = None) -> None:
        self.seed = seed
        self.cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self.now = 0
        self.heap: list = []
        self.seq = 0
        self.nodes: dict[int, SimNode] = {}
        voter_ids = list(range(1, self.cfg.voters + 1))
        self.voter_ids = frozenset(voter_ids)
        for i in voter_ids:
            self.nodes[i] = SimNode(i, True)
        for j in range(self.cfg.observers):
            self.nodes[100 + j] = SimNode(100 + j, False)
        if self.cfg.disk_dir:
            for n in self.nodes.values():
                n.log = self._open_disk_log(n)
        self.committed: list = []
        self.leaders: dict[int, int] = {}      # epoch -> leader id
        self.votes: dict = {}                  # (node id, epoch) -> the candidate it voted for
        self.blocked: set = set()              # (src, dst) links that drop everything
        self.partitions: list = []             # (heal time, links)
        self.restarts: list = []               # (time, node id)
        self.drop = self.cfg.drop
        self.dup = self.cfg.duplicate
        self.faults = True
        self.trace: list = []
        self.stats = {"messages": 0, "bytes": 0, "dropped": 0, "crashes": 0, "partitions": 0,
                      "appends": 0}
        fmb = self.cfg.fetch_max_bytes
        if fmb is None:
            fmb = self.rng.choice([1, 200, 8 * 1024 * 1024])
        # snapshots travel in chunks of up to 1000 bytes, so fetching one takes several rounds
        self.raft_config = RaftConfig(fetch_max_bytes=fmb, fetch_snapshot_max_bytes=1000)
        self._append_counter = 0

    # -- failures --------------------------------------------------------------------------
    def repro(self) -> str:
        """The command that replays this run."""
        default = SimConfig()
        opts = "".join(" --set %s=%r" % (k, v) for k, v in vars(self.cfg).items()
                       if k != "bugs" and v != getattr(default, k))
        opts += "".join(" --bug %s" % b for b in sorted(self.cfg.bugs))
        return "python -m kbroker.raft.simulation %d%s -v" % (self.seed, opts)

    def fail(self, what: str):
        raise InvariantViolation("seed %d at %d ms: %s\n  reproduce: %s" % (self.seed, self.now, what, self.repro()))

    def log_event(self, text: str) -> None:
        self.trace.append("%7d %s" % (self.now, text))

    # -- nodes ---------------------------------------------------------------------------------
    def start_node(self, n: SimNode) -> None:
        n.incarnation += 1
        n.up = True
        n.last_hw = 0
        n.state = AppliedState(self, n)
        rng = random.Random(self.seed * 1_000_003 + n.id * 1009 + n.incarnation)
        if self.cfg.reconfigure_every_ms:
            n.client = KafkaRaftClient(n.id, (), CLUSTER_ID, n.log, n.store, n.state, rng, self.raft_config,
                                       bootstrap_ids=tuple(sorted(self.voter_ids)),
                                       directory_id=_directory_id(n.id), listener_name="SIM",
                                       endpoints=(("SIM", "node", n.id),), followers_always_flush=True)
        else:
            n.client = KafkaRaftClient(n.id, self.voter_ids, CLUSTER_ID, n.log, n.store, n.state, rng,
                                       self.raft_config)
        n.client.bugs = self.cfg.bugs
        self.log_event("start node %d (#%d)" % (n.id, n.incarnation))
        self.send(n, n.client.start(self.now))
        n.deadline = n.client.next_deadline()

    def _open_disk_log(self, n: SimNode):
        import os
        from kbroker.raft.kafka_log import KafkaMetadataLog
        d = os.path.join(self.cfg.disk_dir, "node%d" % n.id)
        os.makedirs(d, exist_ok=True)
        return KafkaMetadataLog.open(d, sync_parent_dir=False)

    def close(self) -> None:
        """Close the nodes' disk logs (disk_dir runs)."""
        if self.cfg.disk_dir:
            for n in self.nodes.values():
                n.log.close(sync=False)

    def crash_node(self, n: SimNode, graceful: bool) -> None:
        if graceful:
            self.send(n, n.client.shutdown(self.now))
        n.up = False
        n.deadline = 1 << 62
        if self.cfg.disk_dir:
            n.log.close(sync=graceful)
            n.log = self._open_disk_log(n)
        else:
            n.log = n.log.crash()
        n.client = None
        self.stats["crashes"] += 1
        self.log_event("%s node %d" % ("shutdown" if graceful else "crash", n.id))
        self.check_majority()

    # -- network ---------------------------------------------------------------------------------
    def send(self, src: SimNode, outs) -> None:
        for o in outs:
            dst = self.nodes.get(o.destination)
            msg = o.message
            data = M.encode(msg)
            self.stats["messages"] += 1
            self.stats["bytes"] += len(data)
            is_req = o.is_request
            env = (src.id, o.destination, o.correlation_id, msg.API_KEY, is_req, data,
                   dst.incarnation if dst is not None else 0)
            if dst is None or (src.id, o.destination) in self.blocked or (self.faults and self.rng.random() < self.drop):
                self.stats["dropped"] += 1
                continue
            copies = 2 if self.faults and self.rng.random() < self.dup else 1
            for _ in range(copies):
                self.seq += 1
                t = self.now + self.rng.randint(1, self.cfg.max_delay_ms)
                heapq.heappush(self.heap, (t, self.seq, env))

    def deliver(self, env) -> None:
        src, dst_id, corr, api_key, is_req, data, dst_inc = env
        dst = self.nodes[dst_id]
        if not dst.up or dst.incarnation != dst_inc or (src, dst_id) in self.blocked:
            return   # the connection it travelled on is gone
        msg = M.decode(api_key, is_req, data)
        outs = dst.client.handle(self.now, M.Inbound(src, corr, msg))
        self.send(dst, outs)
        dst.deadline = dst.client.next_deadline()
        self.check(dst)

    # -- invariants -------------------------------------------------------------------------------
    def check(self, n: SimNode) -> None:
        c = n.client
        if c.is_leader:
            epoch = c.quorum.epoch
            prev = self.leaders.setdefault(epoch, n.id)
            if prev != n.id:
                self.fail("two leaders in epoch %d: %d and %d" % (epoch, prev, n.id))
        e = n.store.state
        if e is not None and e.voted_id >= 0:
            prev = self.votes.setdefault((n.id, e.epoch), e.voted_id)
            if prev != e.voted_id:
                self.fail("node %d voted twice in epoch %d: for %d and %d" % (n.id, e.epoch, prev, e.voted_id))
        hw = c.high_watermark
        if hw < n.last_hw:
            self.fail("node %d high watermark went back from %d to %d" % (n.id, n.last_hw, hw))
        n.last_hw = hw
        if len(n.state.applied) != hw:
            self.fail("node %d applied %d records but its high watermark is %d" % (n.id, len(n.state.applied), hw))
        k = self.cfg.snapshot_every
        if k and hw - max(n.last_snapshot, n.log.start_offset) >= k and hw <= n.log.durable_end_offset:
            c.create_snapshot(hw, pickle.dumps(n.state.applied[:hw]))
            n.last_snapshot = hw
            self.stats["snapshots"] = self.stats.get("snapshots", 0) + 1

    def check_majority(self) -> None:
        """Every committed entry is in the logs of a majority of the voters (up or down:
        a down node's log is what it fsynced), as Raft guarantees at all times. With dynamic
        voters: of the committed voter set, or of a voter set appended after it (a leader
        counts the latest appended set, committed or not; single-voter changes make any two
        consecutive majorities intersect, so either is safe)."""
        flat = {}
        configs = self.voter_sets()
        for n in self.nodes.values():
            if any(n.id in c for c in configs):
                snap = n.log.latest_snapshot_id()
                flat[n.id] = (pickle.loads(n.log.read_snapshot(snap)) if snap else []) + [
                    (b.epoch, b.control_type, v) for b in n.log.read(n.log.start_offset, 1 << 40) for v in b.records]
        for off, entry in enumerate(self.committed):
            holders = {i for i, entries in flat.items() if off < len(entries) and entries[off] == entry}
            if not any(len(holders & c) >= len(c) // 2 + 1 for c in configs):
                self.fail("committed entry at offset %d is on %s, fewer than a majority of the voters %s"
                          % (off, sorted(holders), [sorted(c) for c in configs]))

    def committed_voters(self) -> frozenset:
        """The voters of the latest committed VotersRecord (the static set without one)."""
        from kbroker.raft.voter_set import KRAFT_VOTERS, VoterSet, parse_control
        for _, ctype, value in reversed(self.committed):
            if ctype == KRAFT_VOTERS:
                return VoterSet.from_record(parse_control(ctype, value)).ids
        return self.voter_ids

    def voter_sets(self) -> list:
        """The committed voter set, then every voter set appended after it in any log."""
        from kbroker.raft.voter_set import KRAFT_VOTERS, VoterSet, parse_control
        out = [self.committed_voters()]
        if self.cfg.reconfigure_every_ms:
            at = max((off for off, e in enumerate(self.committed) if e[1] == KRAFT_VOTERS), default=-1)
            for n in self.nodes.values():
                for b in n.log.read(max(at + 1, n.log.start_offset), 1 << 40):
                    if b.control_type == KRAFT_VOTERS:
                        ids = VoterSet.from_record(parse_control(KRAFT_VOTERS, b.records[0])).ids
                        if ids not in out:
                            out.append(ids)
        return out

    # -- KIP-853 ------------------------------------------------------------------------------------
    def _bootstrap_voters(self) -> None:
        """The initial voters' logs start with KRaftVersion(1) and the VotersRecord of them
        (epoch 0, fsynced), as a formatted dynamic quorum's first leader writes them."""
        from kbroker.raft.replicated_log import KRAFT_VERSION, KRAFT_VOTERS
        from kbroker.raft.voter_set import VoterNode, VoterSet, kraft_version_record
        vs = VoterSet(VoterNode(i, _directory_id(i), (("SIM", "node", i),), 0, 1) for i in sorted(self.voter_ids))
        for i in self.voter_ids:
            lg = self.nodes[i].log
            lg.append_as_leader([kraft_version_record(1)], 0, KRAFT_VERSION)
            lg.append_as_leader([bytes(vs.to_record().encode(0))], 0, KRAFT_VOTERS)
            lg.flush()

    def reconfigure(self) -> None:
        """At the leader: remove a voter (sometimes itself) or add an observer."""
        from kbroker.protocol.messages import add_raft_voter as arv
        from kbroker.protocol.messages import remove_raft_voter as rrv
        leaders = [n for n in self.nodes.values() if n.up and n.client.is_leader]
        if not leaders:
            return
        n = leaders[0]
        voters = sorted(n.client.voters)
        others = sorted(set(self.nodes) - set(voters))
        if len(voters) > 2 and (not others or self.rng.random() < 0.5):
            v = self.rng.choice(voters)
            msg = rrv.RemoveRaftVoterRequest(cluster_id=CLUSTER_ID, voter_id=v, voter_directory_id=_directory_id(v))
            what = "remove voter %d" % v
        elif others:
            v = self.rng.choice(others)
            msg = arv.AddRaftVoterRequest(cluster_id=CLUSTER_ID, voter_id=v, voter_directory_id=_directory_id(v),
                                          timeout_ms=10000, listeners=[arv.Listener(name="SIM", host="node", port=v)])
            what = "add voter %d" % v
        else:
            return
        self.seq += 1
        self.log_event("%s at leader %d" % (what, n.id))
        self.stats["reconfigurations"] = self.stats.get("reconfigurations", 0) + 1
        # the answer goes to ADMIN_ID, a node that does not exist (dropped)
        self.send(n, n.client.handle(self.now, M.Inbound(ADMIN_ID, self.seq, M.decode(
            msg.API_KEY, True, M.encode(msg)))))
        n.deadline = n.client.next_deadline()
        self.check(n)

    # -- faults and workload --------------------------------------------------------------------------
    def _exp(self, mean: int) -> int:
        return self.now + 1 + int(self.rng.expovariate(1.0 / mean))

    def fault_crash(self) -> None:
        up = [n for n in self.nodes.values() if n.up]
        if not up:
            return
        # prefer the leader now and then: that is where the interesting cases are
        leaders = [n for n in up if n.client.is_leader]
        n = self.rng.choice(leaders) if leaders and self.rng.random() < 0.5 else self.rng.choice(up)
        self.crash_node(n, graceful=self.rng.random() < 0.25)
        self.restarts.append((self.now + self.rng.randint(50, 3000), n.id))

    def fault_partition(self) -> None:
        ids = list(self.nodes)
        links = set()
        kind = self.rng.random()
        if kind < 0.5:
            x = self.rng.choice(ids)
            links = {(x, y) for y in ids if y != x} | {(y, x) for y in ids if y != x}
            desc = "isolate %d" % x
        elif kind < 0.85:
            side = set(self.rng.sample(ids, self.rng.randint(1, len(ids) - 1)))
            links = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
            desc = "split %s | %s" % (sorted(side), sorted(set(ids) - side))
        else:
            a, b = self.rng.sample(ids, 2)
            links = {(a, b)}
            desc = "one-way %d -> %d" % (a, b)
        self.stats["partitions"] += 1
        self.blocked |= links
        self.partitions.append((self.now + self.rng.randint(100, 4000), links))
        self.log_event(desc)

    def workload(self) -> Optional[int]:
        for n in self.nodes.values():
            if n.up and n.client.is_leader:
                self._append_counter += 1
                rec = b"r%d" % self._append_counter
                try:
                    off = n.client.schedule_append(n.client.quorum.epoch, [rec], self.now)
                except NotLeaderError:
                    return None
                n.deadline = n.client.next_deadline()
                self.stats["appends"] += 1
                return off
        return None

    # -- the loop -----------------------------------------------------------------------------------------
    def step_until(self, end: int, stop=None) -> bool:
        """Run events up to ``end`` ms (or until ``stop()`` is true); True if stopped."""
        cfg = self.cfg
        next_crash = self._exp(cfg.crash_every_ms) if self.faults else 1 << 62
        next_part = self._exp(cfg.partition_every_ms) if self.faults else 1 << 62
        # after the heal only the liveness probe appends
        next_append = self._exp(cfg.append_every_ms) if self.faults else 1 << 62
        next_reconf = self._exp(cfg.reconfigure_every_ms) if self.faults and cfg.reconfigure_every_ms else 1 << 62
        same, last_t = 0, -1
        while True:
            if stop is not None and stop():
                return True
            nodes = self.nodes.values()
            t_nodes = min(n.deadline for n in nodes)
            t_msg = self.heap[0][0] if self.heap else 1 << 62
            t_rst = min((r[0] for r in self.restarts), default=1 << 62)
            t_heal = min((p[0] for p in self.partitions), default=1 << 62)
            t = min(t_nodes, t_msg, t_rst, t_heal, next_crash, next_part, next_append, next_reconf)
            if t > end:
                self.now = end
                return False
            self.now = max(self.now, t)
            now = self.now
            if now == last_t:
                same += 1
                if same > 20000:
                    self.fail("livelock: 20000 steps at the same simulated time")
            else:
                same, last_t = 0, now
            if t_msg <= now:
                _, _, env = heapq.heappop(self.heap)
                self.deliver(env)
            elif t_nodes <= now:
                for n in nodes:
                    if n.up and n.deadline <= now:
                        self.send(n, n.client.poll(now))
                        n.deadline = n.client.next_deadline()
                        self.check(n)
            elif t_rst <= now:
                due = [r for r in self.restarts if r[0] <= now]
                self.restarts = [r for r in self.restarts if r[0] > now]
                for _, nid in due:
                    self.start_node(self.nodes[nid])
            elif t_heal <= now:
                due = [p for p in self.partitions if p[0] <= now]
                self.partitions = [p for p in self.partitions if p[0] > now]
                for _, links in due:
                    self.blocked -= links
                for _, links in self.partitions:
                    self.blocked |= links
                self.log_event("heal a partition")
            elif next_crash <= now:
                self.fault_crash()
                next_crash = self._exp(cfg.crash_every_ms)
            elif next_part <= now:
                self.fault_partition()
                next_part = self._exp(cfg.partition_every_ms)
            elif next_reconf <= now:
                self.reconfigure()
                next_reconf = self._exp(cfg.reconfigure_every_ms)
            else:
                self.workload()
                next_append = self._exp(cfg.append_every_ms) if self.faults else 1 << 62

    def run(self) -> dict:
        try:
            return self._run()
        except InvariantViolation:
            raise
        except Exception as e:   # a client's own assertion is a failed run too
            raise InvariantViolation("seed %d at %d ms: %s: %s\n  reproduce: %s"
                                     % (self.seed, self.now, type(e).__name__, e, self.repro())) from e
        finally:
            self.close()

    def _run(self) -> dict:
        if self.cfg.reconfigure_every_ms:
            self._bootstrap_voters()
        for n in self.nodes.values():
            self.start_node(n)
        self.step_until(self.cfg.fault_ms)
        # heal: everything restarts, partitions end, the network stops dropping
        self.faults = False
        self.blocked.clear()
        self.partitions.clear()
        for _, nid in self.restarts:
            if not self.nodes[nid].up:
                self.start_node(self.nodes[nid])
        self.restarts.clear()
        for n in self.nodes.values():
            if not n.up:
                self.start_node(n)
        self.log_event("healed")
        healed_at = self.now
        deadline = healed_at + self.cfg.liveness_ms
        target = [None]

        def committed_everywhere():
            off = target[0]
            if off is None:
                target[0] = self.workload()
                return False
            if all(n.client.high_watermark > off for n in self.nodes.values()):
                return all(n.state.applied[off][2].startswith(b"r") for n in self.nodes.values())
            return False
        # keep appending (a leader may lose its uncommitted tail) until one append commits everywhere
        while self.now < deadline:
            if self.step_until(min(deadline, self.now + 2000), committed_everywhere):
                break
            target[0] = None
        else:
            self.fail("no commit on every node within %d ms after the faults healed (leaders %s)"
                      % (self.cfg.liveness_ms, {n.id: n.state.leader for n in self.nodes.values()}))
        self.check_majority()
        self.stats["recovery_ms"] = self.now - healed_at
        self.stats["committed"] = len(self.committed)
        self.stats["epochs"] = max(self.leaders, default=0)
        self.stats["leaders"] = len(self.leaders)
        return self.stats


def run_seed(seed: int, **kw) -> dict:
    return Simulation(seed, SimConfig(**kw)).run()


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="Run the KRaft simulation for one seed or a range.")
    ap.add_argument("seed", type=int)
    ap.add_argument("--count", type=int, default=1, help="run seeds seed .. seed+count-1")
    ap.add_argument("--bug", action="append", default=[], help="inject a test-only bug")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a SimConfig field, e.g. --set voters=5 --set drop=0.2")
    ap.add_argument("-v", action="store_true", help="print the event trace and the raft log")
    a = ap.parse_args(argv)
    import ast
    kw = {}
    for item in a.set:
        k, _, v = item.partition("=")
        kw[k] = ast.literal_eval(v)
    logging.basicConfig(level=logging.INFO if a.v else logging.ERROR, format="%(message)s")
    bad = 0
    for s in range(a.seed, a.seed + a.count):
        sim = Simulation(s, SimConfig(bugs=frozenset(a.bug), **kw))
        try:
            st = sim.run()
            print("seed %d ok %s" % (s, st))
        except InvariantViolation as e:
            bad += 1
            if a.v:
                print("\n".join(sim.trace))
            print("FAILED", e)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
