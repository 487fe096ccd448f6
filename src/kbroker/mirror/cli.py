"""``kbroker mirror --config mm2.properties [--clusters B ...] [--metrics-port N]``
(Kafka's connect-mirror-maker.sh). SIGTERM/SIGINT stop it cleanly: in-flight records are
delivered and their source offsets committed."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="mm2.properties", help="MirrorMaker 2 properties")
    p.add_argument("--clusters", nargs="+", metavar="ALIAS",
                   help="run only the flows whose target is one of these clusters")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus /metrics on this port (0: any free port)")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args) -> int:
    from kbroker.mirror.config import MirrorConfigError, MirrorMakerConfig
    from kbroker.mirror.maker import MirrorMaker

    try:
        config = MirrorMakerConfig.from_file(args.config)
    except OSError as e:
        print(f"kbroker: error: cannot read {args.config}: {e.strerror}", file=sys.stderr)
        return 2
    except MirrorConfigError as e:
        print(f"kbroker: error: {args.config}: {e}", file=sys.stderr)
        return 2
    if args.clusters:
        unknown = [c for c in args.clusters if c not in config.clusters]
        if unknown:
            print(f"kbroker: error: --clusters: {', '.join(unknown)} not in clusters", file=sys.stderr)
            return 2
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    maker = MirrorMaker(config, args.clusters)
    server = None
    if args.metrics_port is not None:
        from kbroker.mirror.metrics import start_metrics_server

        server = start_metrics_server(maker, args.metrics_host, args.metrics_port)
    maker.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        maker.shutdown()
        if server is not None:
            server.shutdown()
    return 0
