"""ChaosCluster: a KRaft cluster of real processes for Jepsen-style tests — one controller
(node 1) and ``brokers`` brokers (nodes 2, 3, ...), each ``kbroker serve`` with its own
data dir, on 127.0.0.1 and random ports — with faults applied to one broker by PID.

Faults: ``kill`` (SIGKILL), ``start`` (again, on the same data), ``terminate`` (SIGTERM:
controlled shutdown), ``pause``/``resume`` (SIGSTOP/SIGCONT) and ``isolate``/``heal``: a
broker cut off from its peers and from the controller while clients still reach it.

How the cut works: no broker knows another node's real inter-node port. Each broker has
two listeners, PLAINTEXT (clients, advertised as is) and REPLICATION
(``inter.broker.listener.name``), whose advertised port is a :class:`FaultProxy` in
front of it; the controller listens on an ephemeral port (found in /proc) and its
``controller.quorum.voters`` entry, the endpoint every node is given and the raft
announces, is a proxy too. A proxy learns which node opened a connection from /proc
(the socket inode of the client's port, looked up among the cluster's PIDs), and
refuses (closing open ones) a connection between an isolated node and any other node.
Connections from processes outside the cluster (the test itself) always pass.

Only processes this object started are signalled, by PID; ``stop`` SIGCONTs, kills and
reaps them and stops every proxy, also when a test fails half-way (use it as a context
manager or in ``finally``).
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import socket
import threading
import time

from kbroker.chaos.proxy import FaultProxy
from kbroker.testing import KBrokerProcess, free_port, raw_request

CONTROLLER_ID = 1

#: short timeouts: fencing, elections and ISR changes within a few seconds
FAST = {
    "controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
    "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
    "broker.session.timeout.ms": 2000, "broker.heartbeat.interval.ms": 300,
    "replica.lag.time.max.ms": 2000, "offsets.topic.num.partitions": 6,
    "group.initial.rebalance.delay.ms": 0,
}


# -- who owns a socket (/proc) ------------------------------------------------------------------
def _hex_port(field: str) -> int:
    return int(field.rsplit(":", 1)[1], 16)


def _tcp_rows():
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    yield parts[1], parts[2], parts[3], parts[9]   # local, remote, state, inode
        except OSError:
            continue


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds (all its threads share the table)."""
    out = set()
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for n in names:
        try:
            t = os.readlink(f"{base}/{n}")
        except OSError:
            continue
        if t.startswith("socket:["):
            out.add(t[8:-1])
    return out


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on."""
    inodes = socket_inodes(pid)
    return {_hex_port(local) for local, _, state, inode in _tcp_rows() if state == "0A" and inode in inodes}


def owner_of(client_port: int, server_port: int, pids: dict) -> object | None:
    """Which key of ``pids`` ({key: pid}) holds the client end (127.0.0.1:client_port) of
    a connection to ``server_port``; None when no process of ``pids`` does."""
    inode = None
    for local, remote, _, ino in _tcp_rows():
        if _hex_port(local) == client_port and _hex_port(remote) == server_port:
            inode = ino
            break
    if inode is None or inode == "0":
        return None
    for key, pid in pids.items():
        if pid is not None and inode in socket_inodes(pid):
            return key
    return None


def stable_port() -> int:
    """A free port below the kernel's ephemeral range: a broker restarted after SIGKILL binds
    its port again, and while it is down an ephemeral port (another test's ``bind(0)``, any
    outgoing connection's local port) could take it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rnd = random.Random()
    for _ in range(200):
        port = rnd.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


# -- the cluster ----------------------------------------------------------------------------------
class _Link(FaultProxy):
    """The proxy in front of one node's inter-node listener (``owner``: its node id)."""

    def __init__(self, cluster: "ChaosCluster", owner: int):
        super().__init__()
        self.owner = owner
        self.refuse = lambda addr: cluster._cut(owner, addr[1], self.port)


class ChaosCluster:
    """1 controller + ``brokers`` brokers; see the module docstring. ``nodes[i]`` is node
    i's :class:`KBrokerProcess` (``pid``, ``data_dir``, ``read_log``).

    ``links=False`` (benchmarks): no proxy on the inter-node path — every node is told the
    real ports, so replication runs at full speed, and ``isolate`` is not available."""

    def __init__(self, base_dir: str, brokers: int = 3, overrides: dict | None = None,
                 broker_overrides: dict | None = None, cluster_id: str = "Q2hhb3NDbHVzdGVyMDAwMA",
                 links: bool = True):
        from kbroker.tools import storage

        self.base_dir = base_dir
        self.cluster_id = cluster_id
        self.broker_ids = list(range(CONTROLLER_ID + 1, CONTROLLER_ID + 1 + brokers))
        self.isolated: set[int] = set()
        self._lock = threading.Lock()
        self.linked = links
        self.links = {i: _Link(self, i) for i in [CONTROLLER_ID] + self.broker_ids} if links else {}
        self.client_ports = {i: stable_port() for i in self.broker_ids}
        self.replication_ports = {i: stable_port() for i in self.broker_ids}
        controller_port = self.links[CONTROLLER_ID].port if links else stable_port()
        advertised = {i: (self.links[i].port if links else self.replication_ports[i]) for i in self.broker_ids}
        voters = f"{CONTROLLER_ID}@127.0.0.1:{controller_port}"
        from kbroker.server.config import BROKER_CONFIG

        fast = {k: v for k, v in FAST.items() if k in BROKER_CONFIG}   # keys the broker knows yet
        common = {"controller.quorum.voters": voters, "controller.listener.names": "CONTROLLER",
                  **fast, **(overrides or {})}
        self.nodes: dict[int, KBrokerProcess] = {}
        for i in [CONTROLLER_ID] + self.broker_ids:
            d = os.path.join(base_dir, f"node{i}")
            os.makedirs(d, exist_ok=True)
            if i == CONTROLLER_ID:
                # an ephemeral port nobody is told: every node reaches the controller through its proxy
                props = {"process.roles": "controller", "node.id": i, **common,
                         "listeners": f"CONTROLLER://127.0.0.1:{0 if links else controller_port}"}
            else:
                props = {"process.roles": "broker", "node.id": i, **common,
                         "listeners": f"PLAINTEXT://127.0.0.1:{self.client_ports[i]},"
                                      f"REPLICATION://127.0.0.1:{self.replication_ports[i]}",
                         "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.client_ports[i]},"
                                                 f"REPLICATION://127.0.0.1:{advertised[i]}",
                         "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,REPLICATION:PLAINTEXT,"
                                                           "CONTROLLER:PLAINTEXT",
                         "inter.broker.listener.name": "REPLICATION", **(broker_overrides or {})}
                if links:
                    self.links[i].upstream_port = self.replication_ports[i]
            props["log.dirs"] = os.path.join(d, "logs")
            conf = os.path.join(d, "node.properties")
            with open(conf, "w", encoding="utf-8") as f:
                f.write("".join(f"{k}={v}\n" for k, v in props.items()))
            with contextlib.redirect_stdout(io.StringIO()):
                if storage.main(["format", "-c", conf, "-t", cluster_id]) != 0:
                    raise RuntimeError(f"kbroker storage format failed for node {i}")
            # the controller's start waits on its proxy's port (always open), then finds the real one
            port = self.client_ports.get(i) or controller_port
            self.nodes[i] = KBrokerProcess(data_dir=d, overrides=props, port=port)
        for link in self.links.values():
            link.start()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """The brokers' client listeners, as a client's bootstrap.servers."""
        return ",".join(f"127.0.0.1:{self.client_ports[i]}" for i in self.broker_ids)

    def bootstrap_of(self, i: int) -> str:
        return f"127.0.0.1:{self.client_ports[i]}"

    def pid(self, i: int) -> int | None:
        return self.nodes[i].pid

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, i=None, timeout_s: float = 30.0) -> "ChaosCluster":
        """Start node ``i`` (a node id, a list of them, else every node not running; in
        parallel: Python start-up dominates) and wait until each listens."""
        if i is None:
            ids = list(self.nodes)
        else:
            ids = [i] if isinstance(i, int) else list(i)
        errors = []

        def one(j):
            try:
                n = self.nodes[j]
                n.start(timeout_s)
                if j == CONTROLLER_ID and self.linked:
                    self.links[j].upstream_port = self._await_listener(n, timeout_s)
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=one, args=(j,), daemon=True) for j in ids if self.nodes[j].proc is None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return self

    def _await_listener(self, n: KBrokerProcess, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ports = listening_ports(n.pid) - {self.links[CONTROLLER_ID].port}
            if ports:
                return min(ports)
            if n.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"controller did not listen within {timeout_s}s; log tail:\n{n.read_log()[-3000:]}")

    def kill(self, i: int) -> None:
        """SIGKILL (SIGCONT first, in case it was paused)."""
        self.resume(i)
        self.nodes[i].kill()

    def terminate(self, i: int, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait: a controlled shutdown."""
        self.resume(i)
        return self.nodes[i].terminate(timeout_s)

    def restart(self, i: int) -> None:
        self.kill(i)
        self.start(i)

    def pause(self, i: int) -> None:
        os.kill(self.nodes[i].pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        pid = self.nodes[i].pid
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)

    def isolate(self, i: int) -> None:
        """Cut node ``i`` off from every other node (clients still reach it)."""
        if not self.linked:
            raise RuntimeError("isolate needs a cluster started with links=True")
        with self._lock:
            self.isolated.add(i)
        for link in self.links.values():
            link.sever()

    def heal(self) -> None:
        with self._lock:
            self.isolated.clear()

    def links_between(self) -> dict:
        """{(from node, to node): open connections} through the inter-node proxies."""
        pids = {i: n.pid for i, n in self.nodes.items()}
        out: dict = {}
        for owner, link in self.links.items():
            with link._lock:
                addrs = list(link._pairs.values())
            for addr in addrs:
                src = owner_of(addr[1], link.port, pids)
                out[(src, owner)] = out.get((src, owner), 0) + 1
        return out

    def _cut(self, owner: int, client_port: int, server_port: int) -> bool:
        """Must a connection from 127.0.0.1:client_port to ``owner``'s proxy be refused?"""
        with self._lock:
            isolated = set(self.isolated)
        if not isolated:
            return False
        src = owner_of(client_port, server_port, {i: n.pid for i, n in self.nodes.items()})
        if src is None or src == owner:
            return False
        return owner in isolated or src in isolated

    def stop(self) -> None:
        """SIGCONT + SIGKILL every node this cluster started, stop the proxies."""
        for i in self.nodes:
            with contextlib.suppress(Exception):
                self.kill(i)
        for link in self.links.values():
            with contextlib.suppress(Exception):
                link.stop()

    def __enter__(self) -> "ChaosCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what the cluster says ------------------------------------------------------------------
    def _request(self, port: int, api_key: int, version: int, body, timeout_s: float = 5.0):
        return raw_request(port, api_key, version, body, client_id="kbroker-chaos", timeout_s=timeout_s)

    def metadata(self, topic: str, via: int | None = None) -> dict:
        """{partition: (leader, leader epoch, replicas, isr, error)} as broker ``via`` (else
        the first live, unpaused, unisolated broker that answers) sees it."""
        from kbroker.protocol import ApiKey
        from kbroker.protocol.messages import metadata as md

        req = md.MetadataRequest(topics=[md.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False)
        order = [via] if via is not None else [i for i in self.broker_ids if i not in self.isolated] + \
            [i for i in self.broker_ids if i in self.isolated]
        last = None
        for i in order:
            if self.nodes[i].proc is None:
                continue
            try:
                r = self._request(self.client_ports[i], ApiKey.METADATA, 12, req, timeout_s=2.0)
            except OSError as e:
                last = e
                continue
            t = r.topics[0]
            return {p.partition_index: (p.leader_id, p.leader_epoch, list(p.replica_nodes), list(p.isr_nodes),
                                        p.error_code) for p in t.partitions}
        raise ConnectionError(f"no broker answered Metadata: {last}")

    def registered_brokers(self, via: int | None = None) -> list[int]:
        """The unfenced brokers as broker ``via`` (else the first live, unisolated one) sees them."""
        from kbroker.protocol import ApiKey
        from kbroker.protocol.messages import metadata as md

        for i in ([via] if via is not None else self.broker_ids):
            if self.nodes[i].proc is None or (via is None and i in self.isolated):
                continue
            try:
                r = self._request(self.client_ports[i], ApiKey.METADATA, 12,
                                  md.MetadataRequest(topics=[], allow_auto_topic_creation=False), timeout_s=2.0)
            except OSError:
                continue
            return sorted(b.node_id for b in r.brokers)
        return []

    def wait(self, cond, timeout_s: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                v = cond()
            except Exception as e:   # a broker going down under us: ask again
                v, last = None, e
            if v:
                return v
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached within {timeout_s}s (last error: {last})")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Every broker registered and unfenced, as every broker sees it (a broker that was
        cut off from the controller still shows its stale view until it catches up)."""
        self.wait(lambda: all(self.registered_brokers(i) == self.broker_ids for i in self.broker_ids),
                  timeout_s, "all brokers unfenced")

    def create_topic(self, name: str, partitions: int, replication_factor: int = 3, configs: dict | None = None,
                     timeout_s: float = 30.0) -> dict:
        """Create through confluent-kafka's AdminClient and wait until every partition has a
        leader and a full ISR; returns :meth:`metadata`."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                                            config={k: str(v) for k, v in (configs or {}).items()})])[name]
        fut.result(timeout_s)

        def ready():
            m = self.metadata(name)
            return m if len(m) == partitions and all(
                l in self.broker_ids and len(isr) == replication_factor for l, _, _, isr, _ in m.values()) else None
        return self.wait(ready, timeout_s, f"{name} led with full ISRs")

    def leader(self, topic: str, partition: int) -> int:
        return self.metadata(topic)[partition][0]

    def log_tails(self, n: int = 2000) -> str:
        return "\n".join(f"--- node {i} ---\n{node.read_log()[-n:]}" for i, node in self.nodes.items())


# -- the nemesis ------------------------------------------------------------------------------------
class ClusterNemesis:
    """A seeded schedule of faults on a :class:`ChaosCluster`'s brokers, one at a time:

    - ``kill``: SIGKILL a random broker, start it again after the hold;
    - ``kill-leader``: the same for the leader of a random partition of ``topic``;
    - ``pause``: SIGSTOP a random broker for the hold (a long GC pause), then SIGCONT;
    - ``isolate``: cut a random broker off from its peers and the controller for the hold;
    - ``terminate``: SIGTERM (controlled shutdown), start it again after the hold;
    - ``<fault>-leader`` (``kill-leader``, ``pause-leader``, ``isolate-leader``,
      ``terminate-leader``): the fault on the leader of a random partition of ``topic``.

    After each fault heals, the nemesis waits (up to ``settle_s``) until every broker is
    registered and unfenced again, then a quiet gap. ``run(stop)`` returns once ``stop`` is
    set or ``max_faults`` were applied, with every fault healed. ``log``: (seconds since
    start, what, broker) for failure messages."""

    def __init__(self, cluster: ChaosCluster, *, topic: str | None = None, partitions: int = 0, seed: int = 0,
                 faults=("kill-leader", "pause", "isolate"), gap_s=(0.5, 1.5), fault_s=(1.0, 3.0),
                 max_faults: int = 5, settle_s: float = 20.0):
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.rnd = random.Random(seed)
        self.faults = tuple(faults)
        self.gap_s, self.fault_s = gap_s, fault_s
        self.max_faults = max_faults
        self.settle_s = settle_s
        self.log: list = []
        self._t0 = time.monotonic()

    def _note(self, what: str, target) -> None:
        self.log.append((round(time.monotonic() - self._t0, 2), what, target))

    def _victim(self, fault: str) -> int:
        c = self.cluster
        if fault.endswith("-leader") and self.topic:
            p = self.rnd.randrange(max(1, self.partitions))
            try:
                leader = c.metadata(self.topic)[p][0]
            except Exception:
                leader = -1
            if leader in c.broker_ids:
                return leader
        return self.rnd.choice(c.broker_ids)

    def run(self, stop: threading.Event) -> None:
        c = self.cluster
        applied = 0
        while not stop.is_set() and applied < self.max_faults:
            if stop.wait(self.rnd.uniform(*self.gap_s)):
                break
            fault = self.rnd.choice(self.faults)
            hold = self.rnd.uniform(*self.fault_s)
            b = self._victim(fault)
            self._note(fault, b)
            action = fault[:-len("-leader")] if fault.endswith("-leader") else fault
            try:
                if action == "kill":
                    c.kill(b)
                    stop.wait(hold)
                elif action == "terminate":
                    c.terminate(b)
                    stop.wait(hold)
                elif action == "pause":
                    c.pause(b)
                    stop.wait(hold)
                elif action == "isolate":
                    c.isolate(b)
                    stop.wait(hold)
                else:
                    raise ValueError(f"unknown fault {fault!r}")
            finally:
                self.heal()
                self._note("healed", b)
            applied += 1
            try:
                c.wait_ready(self.settle_s)
            except TimeoutError:
                self._note("not settled", b)

    def heal(self) -> None:
        """Undo whatever is applied: heal the network, SIGCONT, start stopped brokers."""
        c = self.cluster
        c.heal()
        for b in c.broker_ids:
            c.resume(b)
            if c.nodes[b].proc is None:
                c.start(b)
