"""``kbroker dev-cluster``: a local KRaft cluster for development, in one command.

    kbroker dev-cluster start [--dir ./kbroker-cluster] [--layout combined|split] [--base-port 19100]
    kbroker dev-cluster status [--dir ...]
    kbroker dev-cluster stop [--dir ...]

``start`` writes one properties file per node under ``<dir>/config/`` (``combined``: three
broker+controller nodes 1-3; ``split``: controllers 1-3 and brokers 4-6), formats their
storage once with one cluster id (``kbroker storage format``), starts each node as
``kbroker serve --config`` in the background with its log in ``<dir>/<node>.log`` and its
PID in ``<dir>/<node>.pid``, and waits until every broker is registered and the quorum
has a leader; then it prints the bootstrap servers. ``stop`` sends SIGTERM to each PID it
wrote (only those processes, and only while they still run ``kbroker serve``), waits for
them to exit (SIGKILL after ``--timeout``) and removes the PID files; the data stays until
the directory is deleted. Ports: node i's broker listener is ``base + 10*i + 2``, its
controller listener ``base + 10*i + 3``.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

LAYOUTS = {"combined": {1: "broker,controller", 2: "broker,controller", 3: "broker,controller"},
           "split": {1: "controller", 2: "controller", 3: "controller", 4: "broker", 5: "broker", 6: "broker"}}


def _ports(base: int, i: int) -> tuple[int, int]:
    return base + 10 * i + 2, base + 10 * i + 3


def _configs(d: str, layout: str, base: int) -> dict[int, str]:
    nodes = LAYOUTS[layout]
    voters = ",".join(f"{i}@127.0.0.1:{_ports(base, i)[1]}" for i, r in nodes.items() if "controller" in r)
    out = {}
    os.makedirs(os.path.join(d, "config"), exist_ok=True)
    for i, roles in nodes.items():
        bport, cport = _ports(base, i)
        listeners, lines = [], [f"process.roles={roles}", f"node.id={i}", f"controller.quorum.voters={voters}",
                                "controller.listener.names=CONTROLLER"]
        if "broker" in roles:
            listeners.append(f"PLAINTEXT://127.0.0.1:{bport}")
            lines.append(f"advertised.listeners=PLAINTEXT://127.0.0.1:{bport}")
        if "controller" in roles:
            listeners.append(f"CONTROLLER://127.0.0.1:{cport}")
        lines += [f"listeners={','.join(listeners)}", f"log.dirs={os.path.abspath(os.path.join(d, f'node-{i}'))}"]
        path = os.path.join(d, "config", f"node-{i}.properties")
        with open(path, "w", encoding="utf-8") as f:
            f.write("# written by kbroker dev-cluster\n" + "\n".join(lines) + "\n")
        out[i] = path
    return out


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
    except OSError:
        return False
    return b"serve" in cmd and any(b"kbroker" in c for c in cmd)


def _pids(d: str) -> dict[str, int]:
    out = {}
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        if f.endswith(".pid"):
            try:
                out[f[:-4]] = int(open(os.path.join(d, f)).read().strip())
            except (OSError, ValueError):
                pass
    return out


def _wait_ready(d: str, layout: str, base: int, timeout_s: float) -> None:
    from kbroker.protocol import ApiKey
    from kbroker.protocol.frames import decode_response, encode_request
    from kbroker.protocol.messages.metadata import MetadataRequest
    import socket

    brokers = [i for i, r in LAYOUTS[layout].items() if "broker" in r]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", _ports(base, brokers[0])[0]), timeout=2) as s:
                s.sendall(encode_request(ApiKey.METADATA, 12, 1, "dev-cluster", MetadataRequest(topics=[])))
                buf = b""
                while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                    chunk = s.recv(65536)
                    if not chunk:
                        raise OSError("closed")
                    buf += chunk
            md = decode_response(buf[4:], ApiKey.METADATA, 12)[1]
            if sorted(b.node_id for b in md.brokers) == brokers:
                return
        except OSError:
            pass
        for name, pid in _pids(d).items():
            if not _pid_alive(pid):
                raise RuntimeError(f"{name} exited; see {os.path.join(d, name + '.log')}")
        time.sleep(0.2)
    raise TimeoutError(f"the cluster was not ready within {timeout_s:.0f}s (logs in {d})")


def start(args) -> int:
    d = args.dir
    running = {n: p for n, p in _pids(d).items() if _pid_alive(p)}
    if running:
        print(f"Error: a dev cluster is already running in {d} (PIDs {sorted(running.values())}); "
              "run `kbroker dev-cluster stop` first", file=sys.stderr)
        return 1
    marker = os.path.join(d, "config", "layout")
    if os.path.exists(marker):
        layout, base = open(marker).read().split()
        base = int(base)
        if (layout, base) != (args.layout, args.base_port):
            print(f"Error: {d} holds a {layout} cluster on base port {base}; use another --dir", file=sys.stderr)
            return 1
    layout, base = args.layout, args.base_port
    configs = _configs(d, layout, base)
    if not os.path.exists(marker):
        from kbroker.log.checkpoints import random_uuid
        from kbroker.tools import storage

        cid = random_uuid()
        for i, conf in configs.items():
            if storage.main(["format", "-c", conf, "-t", cid]) != 0:
                return 1
        with open(marker, "w") as f:
            f.write(f"{layout} {base}\n")
    for i, conf in configs.items():
        log = open(os.path.join(d, f"node-{i}.log"), "ab")
        p = subprocess.Popen([sys.executable, "-m", "kbroker", "serve", "--config", conf], stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        with open(os.path.join(d, f"node-{i}.pid"), "w") as f:
            f.write(f"{p.pid}\n")
    try:
        _wait_ready(d, layout, base, args.timeout)
    except (RuntimeError, TimeoutError) as e:
        print(f"Error: {e}", file=sys.stderr)
        stop(args)
        return 1
    boot = ",".join(f"127.0.0.1:{_ports(base, i)[0]}" for i, r in LAYOUTS[layout].items() if "broker" in r)
    print(f"kbroker dev cluster ({layout}) running in {d}; bootstrap.servers={boot}")
    return 0


def _broker_only(d: str, name: str) -> bool:
    try:
        with open(os.path.join(d, "config", name + ".properties"), encoding="utf-8") as f:
            return "process.roles=broker\n" in f.read()
    except OSError:
        return False


def stop(args) -> int:
    """SIGTERM by PID: broker-only nodes first (their controlled shutdown needs the
    controllers), then the others; SIGKILL whatever outlives --timeout."""
    pids = {n: p for n, p in _pids(args.dir).items() if _pid_alive(p)}
    brokers = {n: p for n, p in pids.items() if _broker_only(args.dir, n)}
    for group in (brokers, {n: p for n, p in pids.items() if n not in brokers}):
        for p in group.values():
            os.kill(p, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and any(_pid_alive(p) for p in group.values()):
            time.sleep(0.1)
        for p in group.values():
            if _pid_alive(p):
                os.kill(p, signal.SIGKILL)
    for n in _pids(args.dir):
        os.unlink(os.path.join(args.dir, n + ".pid"))
    print(f"stopped {len(pids)} node(s)" + (f" ({', '.join(sorted(pids))})" if pids else ""))
    return 0


def status(args) -> int:
    pids = _pids(args.dir)
    if not pids:
        print("no dev cluster in " + args.dir)
        return 1
    for n, p in pids.items():
        print(f"{n}: pid {p} {'running' if _pid_alive(p) else 'not running'}")
    return 0 if all(_pid_alive(p) for p in pids.values()) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="kbroker dev-cluster", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--dir", default="./kbroker-cluster", help="data, configs, logs and PID files")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="combined")
    ap.add_argument("--base-port", type=int, default=19100)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    args.dir = os.path.abspath(args.dir)
    return {"start": start, "stop": stop, "status": status}[args.action](args)
