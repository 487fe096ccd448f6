"""The ``kbroker`` command line: ``kbroker serve`` runs a broker."""
from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading

from kbroker import __version__


#: operator tools that parse their own arguments: name -> (module in kbroker.tools, Kafka's script)
TOOLS = {
    "consumer-groups": ("consumer_groups", "kafka-consumer-groups.sh"),
    "get-offsets": ("get_offsets", "kafka-get-offsets.sh"),
    "configs": ("configs", "kafka-configs.sh"),
    "acls": ("acls", "kafka-acls.sh"),
    "console-producer": ("console_producer", "kafka-console-producer.sh"),
    "console-consumer": ("console_consumer", "kafka-console-consumer.sh"),
    "log-dirs": ("log_dirs", "kafka-log-dirs.sh"),
    "leader-election": ("leader_election", "kafka-leader-election.sh"),
    "reassign-partitions": ("reassign_partitions", "kafka-reassign-partitions.sh"),
    "metadata-quorum": ("metadata_quorum", "kafka-metadata-quorum.sh"),
    "features": ("features", "kafka-features.sh"),
    "dev-cluster": ("dev_cluster", "a local 3-node KRaft cluster: start / status / stop"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbroker", description="Apache Kafka-compatible broker")
    p.add_argument("--version", action="version", version=f"kbroker {__version__}")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="run a broker (defaults: 127.0.0.1:9092, ./kbroker-data, node.id 1)",
                       description="Run a broker. Configuration uses Apache Kafka's broker property names.")
    s.add_argument("--config", metavar="server.properties", help="a Kafka server.properties file")
    s.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                   help="set one property (repeatable; wins over --config)")
    s.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub.add_parser("kernels", help="show which hot-path kernels are compiled")
    sub.add_parser("topics", help="create/list/describe/alter/delete topics (like kafka-topics.sh)", add_help=False)
    sub.add_parser("dump-log", help="print segments and indexes (like kafka-dump-log.sh)", add_help=False)
    sub.add_parser("storage", help="format or inspect a KRaft node's log directories (like kafka-storage.sh)",
                   add_help=False)
    for name, (_, like) in TOOLS.items():
        sub.add_parser(name, help=like if " " in like else f"like {like}", add_help=False)
    mm = sub.add_parser("mirror", help="MirrorMaker 2: replicate topics, configs and group offsets "
                                       "between clusters (like connect-mirror-maker.sh)",
                        description="Run MirrorMaker 2 flows from an mm2.properties (MM2's property names).")
    from kbroker.mirror.cli import add_arguments as _mirror_arguments
    _mirror_arguments(mm)
    sr = sub.add_parser("schema-registry", help="serve a Confluent-compatible Schema Registry "
                                                "stored in a kbroker topic")
    from kbroker.schema_registry.server import add_arguments as _sr_arguments
    _sr_arguments(sr)
    return p


def _fail(message: str) -> int:
    print(f"kbroker: error: {message}", file=sys.stderr)
    return 2


def serve(args) -> int:
    from kbroker.config_def import ConfigError
    from kbroker.log.errors import ConfigError as LogConfigError, KafkaStorageError
    from kbroker.server.config import KafkaConfig

    try:
        config = KafkaConfig.from_sources(args.config, args.override)
    except ConfigError as e:
        return _fail(str(e))
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        from kbroker.server.broker import BrokerStartupError, KafkaBroker
        from kbroker.server.kraft_node import KRaftNode, KRaftNodeError
    except ImportError as e:  # a broken install: name the module, no traceback
        return _fail(f"cannot start: {e.name or 'kbroker.server.broker'} failed to import: {e}".replace("\n", " "))

    # a node of a KRaft cluster (process.roles set), or the zero-config single node
    broker = KRaftNode(config) if config.cluster_mode else KafkaBroker(config)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Start-up builds the objects of every partition (10,000 logs: ~a million), which
    # live until shutdown: no cyclic collection while they are built, then they move to
    # the permanent generation (gc.freeze), so no later full collection walks them again.
    gc.disable()
    try:
        broker.startup()
    except (LogConfigError, ConfigError) as e:
        broker.shutdown()
        return _fail(str(e).replace("\n", " "))
    except (KafkaStorageError, OSError, BrokerStartupError, KRaftNodeError) as e:
        broker.shutdown()
        return _fail(f"cannot start: {e}".replace("\n", " "))
    finally:
        gc.freeze()
        gc.enable()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        broker.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("topics", "dump-log", "storage"):
        # these tools parse their own arguments
        from kbroker.tools import dump_log, storage, topics

        return {"topics": topics, "dump-log": dump_log, "storage": storage}[argv[0]].main(argv[1:])
    if argv and argv[0] in TOOLS:
        import importlib

        return importlib.import_module(f"kbroker.tools.{TOOLS[argv[0]][0]}").main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "mirror":
        from kbroker.mirror.cli import run as run_mirror

        return run_mirror(args)
    if args.command == "schema-registry":
        from kbroker.schema_registry.server import run as run_schema_registry

        return run_schema_registry(args)
    if args.command == "kernels":
        from kbroker import kernels

        import glob
        import os

        core = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_core")
        for name in sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(core, "*.pyx"))):
            try:
                kernels.load(name)
            except ImportError as e:
                print(f"{name}: missing ({e})")
                continue
            print(f"{name}: {kernels.SELECTED[name]}")
        return 0
    build_parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
