"""``kbroker schema-registry``: load the state from ``_schemas``, then serve HTTP with
uvicorn until SIGTERM/SIGINT (uvicorn's own handlers stop it; the store closes after)."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from urllib.parse import urlparse

log = logging.getLogger("kbroker.schema_registry")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT",
                   help="the kbroker cluster that holds the _schemas topic")
    p.add_argument("--listeners", default="http://127.0.0.1:8081", metavar="URL",
                   help="where to serve the REST API (default http://127.0.0.1:8081)")
    p.add_argument("--topic", default="_schemas", help="the compacted topic holding the state (default _schemas)")
    p.add_argument("--max-request-bytes", type=int, default=1 << 20,
                   help="largest request body accepted; larger schemas get 42209 (default 1 MiB)")
    p.add_argument("--group-id", default="schema-registry",
                   help="the consumer group the instances elect their leader in (default schema-registry)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args) -> int:
    try:
        import uvicorn

        from kbroker.schema_registry.app import build_app
        from kbroker.schema_registry.leader import LeaderElector
        from kbroker.schema_registry.service import SchemaRegistry
        from kbroker.schema_registry.state import RegistryState
        from kbroker.schema_registry.store import KafkaStore
    except ImportError as e:
        print(f"kbroker: error: the schema registry needs the 'schema-registry' extra "
              f"(pip install 'kbroker[schema-registry]'): {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    url = urlparse(args.listeners.split(",")[0].strip())
    if url.scheme != "http" or not url.port:
        print(f"kbroker: error: --listeners takes http://HOST:PORT, got {args.listeners!r}", file=sys.stderr)
        return 2
    state = RegistryState()
    store = KafkaStore(args.bootstrap_servers, state, topic=args.topic)
    try:
        store.start()
    except Exception as e:  # noqa: BLE001 - no cluster, no registry: say why and exit
        print(f"kbroker: error: cannot load the schema registry state from {args.bootstrap_servers}: {e}",
              file=sys.stderr)
        store.close()
        return 2
    elector = LeaderElector(store, f"http://{url.hostname}:{url.port}", args.group_id)
    elector.start()
    app = build_app(SchemaRegistry(store, state, elector), args.max_request_bytes)
    server = uvicorn.Server(uvicorn.Config(app, host=url.hostname, port=url.port, log_level="warning",
                                          access_log=False))
    log.info("schema registry listening on %s", args.listeners)
    # uvicorn handles SIGTERM/SIGINT during run() and re-raises the signal once it has shut
    # down: with these no-op handlers in place that re-raise returns here, so the store
    # closes and the process exits 0 (as `kbroker serve` does on SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    try:
        server.run()
    finally:
        elector.close()
        store.close()
    return 0
