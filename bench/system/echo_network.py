"""Throughput of the network layer alone: SocketServer + KafkaRequestHandlerPool with a
trivial handler, driven by client *processes* over 127.0.0.1.

Workloads (``--workload``):
  small   100-byte requests, echo handler              -> requests/s (per-request overhead)
  echo    256 KiB requests, echo handler               -> MB/s in + out (recv_into + sendmsg)
  fetch   small requests, 1 MiB FileRegion responses   -> MB/s out (os.sendfile, zero copy)

The server runs in this process (so the GIL is shared by acceptor, processors and
handlers exactly as in the broker); each client process runs a closed loop over its
connections (one request outstanding per connection, like a Kafka client with
max.in.flight=1). Each configuration runs for ``--seconds`` and at most ``--max-requests``.

    python bench/system/echo_network.py                       # full matrix
    python bench/system/echo_network.py --net 1 3 --io 1 8 --workload small --seconds 2
    python bench/system/echo_network.py --json results.json

Results are JSON (one object per configuration) for the analysis pipeline.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import selectors
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from kbroker.network import SocketServer, SocketServerConfig  # noqa: E402
from kbroker.records.region import FileRegion  # noqa: E402
from kbroker.server.request_handler import KafkaRequestHandlerPool  # noqa: E402

WORKLOADS = {
    # name: (request body bytes, response kind)
    "small": (100 - 8, "echo"),
    "echo": (256 * 1024 - 8, "echo"),
    "fetch": (32 - 8, "region"),
}
REGION_BYTES = 1 << 20


def _client(port: int, n_conns: int, body_size: int, seconds: float, max_requests: int,
            start_at: float, out: mp.Queue) -> None:
    payload = struct.pack(">hhi", 1, 11, 0) + b"\xab" * body_size
    request = struct.pack(">i", len(payload)) + payload
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n_conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)           # blocking: recv only after select() says readable
    state = {}                   # sock -> [size prefix bytes, bytes of payload remaining]
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.perf_counter()
    deadline = t0 + seconds
    done = 0
    bytes_in = 0
    for s in socks:
        s.sendall(request)
        state[s] = [bytearray(), -1]
        sel.register(s, selectors.EVENT_READ)
    sent = n_conns
    while state:
        for key, _ in sel.select(1.0):
            s = key.fileobj
            st = state[s]
            n = s.recv_into(view)
            if n == 0:
                raise RuntimeError("server closed the connection")
            bytes_in += n
            pos = 0
            while pos < n:
                if st[1] < 0:
                    hdr = st[0]
                    take = min(4 - len(hdr), n - pos)
                    hdr += view[pos:pos + take]
                    pos += take
                    if len(hdr) < 4:
                        break
                    st[1] = int.from_bytes(hdr, "big")
                take = min(st[1], n - pos)
                st[1] -= take
                pos += take
                if st[1] == 0:
                    if pos != n:
                        raise RuntimeError("server sent more than one response")
                    done += 1
                    st[0], st[1] = bytearray(), -1
                    if time.perf_counter() < deadline and sent < max_requests:
                        s.sendall(request)
                        sent += 1
                    else:
                        sel.unregister(s)
                        del state[s]
    elapsed = time.perf_counter() - t0
    for s in socks:
        s.close()
    out.put({"requests": done, "bytes_in": bytes_in, "bytes_out": done * len(request),
             "elapsed_s": elapsed})


def run_config(workload: str, num_network_threads: int, num_io_threads: int, *,
               clients: int, conns_per_client: int, seconds: float, max_requests: int,
               region_file) -> dict:
    body_size, kind = WORKLOADS[workload]
    server = SocketServer(SocketServerConfig(
        listeners="PLAINTEXT://127.0.0.1:0", num_network_threads=num_network_threads,
        socket_send_buffer_bytes=-1, socket_receive_buffer_bytes=-1))
    channel = server.channel
    if kind == "echo":
        def handle(request):
            payload = request.payload
            channel.send_response(request, [(payload.nbytes - 4).to_bytes(4, "big"),
                                            payload[4:8], payload[8:]])
    else:
        region = FileRegion(region_file, 0, REGION_BYTES)
        size_prefix = (4 + REGION_BYTES).to_bytes(4, "big")

        def handle(request):
            channel.send_response(request, [size_prefix + request.payload[4:8], region])
    pool = KafkaRequestHandlerPool(channel, handle, num_io_threads, server.metrics)
    server.start()
    pool.start()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.5          # let spawned clients import and connect
    procs = [ctx.Process(target=_client, args=(server.bound_port(), conns_per_client, body_size,
                                               seconds, max_requests // clients, start_at, out))
             for _ in range(clients)]
    for p in procs:
        p.start()
    try:
        time.sleep(max(0.0, start_at - time.time()))
        server.metrics.network_processor_avg_idle_percent()   # start the idle windows
        server.metrics.request_handler_avg_idle_percent()
        results = [out.get(timeout=seconds + 60) for _ in procs]
        proc_idle = server.metrics.network_processor_avg_idle_percent()
        handler_idle = server.metrics.request_handler_avg_idle_percent()
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        server.stop(0.5)
        pool.shutdown(5)
    requests = sum(r["requests"] for r in results)
    elapsed = max(r["elapsed_s"] for r in results)
    bytes_in = sum(r["bytes_in"] for r in results)        # response bytes seen by clients
    bytes_out = sum(r["bytes_out"] for r in results)      # request bytes sent by clients
    return {
        "workload": workload, "num_network_threads": num_network_threads,
        "num_io_threads": num_io_threads, "clients": clients,
        "connections": clients * conns_per_client, "requests": requests,
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(requests / elapsed, 1),
        "request_mb_per_s": round(bytes_out / elapsed / 1e6, 1),
        "response_mb_per_s": round(bytes_in / elapsed / 1e6, 1),
        "network_processor_avg_idle_percent": round(proc_idle, 3),
        "request_handler_avg_idle_percent": round(handler_idle, 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--net", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--io", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--conns", type=int, default=8, help="connections per client process")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--max-requests", type=int, default=2_000_000)
    ap.add_argument("--json", help="write results to this file")
    args = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryFile() as f:
        f.write(os.urandom(REGION_BYTES))
        f.flush()
        print(f"{'workload':8} {'net':>3} {'io':>3} {'req/s':>10} {'req MB/s':>9} "
              f"{'resp MB/s':>9} {'net idle':>8} {'io idle':>8}", flush=True)
        for workload in args.workload:
            for net in args.net:
                for io in args.io:
                    r = run_config(workload, net, io, clients=args.clients,
                                   conns_per_client=args.conns, seconds=args.seconds,
                                   max_requests=args.max_requests, region_file=f)
                    results.append(r)
                    print(f"{workload:8} {net:3d} {io:3d} {r['requests_per_s']:10.0f} "
                          f"{r['request_mb_per_s']:9.1f} {r['response_mb_per_s']:9.1f} "
                          f"{r['network_processor_avg_idle_percent']:8.2f} "
                          f"{r['request_handler_avg_idle_percent']:8.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "echo_network", "cpu_count": os.cpu_count(),
                       "python": sys.version.split()[0], "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
