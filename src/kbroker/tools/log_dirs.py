"""kbroker log-dirs: log directory usage per broker (Kafka's ``kafka-log-dirs.sh``,
LogDirsCommand).

    kbroker log-dirs --bootstrap-server HOST:PORT --describe [--topic-list t1,t2] [--broker-list 1,2]

Prints Kafka's two progress lines, then one line of JSON:
``{"version":1,"brokers":[{"broker":1,"logDirs":[{"logDir":"/data","error":null,
"partitions":[{"partition":"t-0","size":1234,"offsetLag":0,"isFuture":false}]}]}]}``;
``size`` is the replica's bytes on disk, ``offsetLag`` how far its log end is behind the
high watermark (0 for a leader).
"""
from __future__ import annotations

import json
import sys

from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, run_tool

PURPOSE = "This tool helps to query log directory usage on the specified brokers."


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker log-dirs", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="The server(s) to use for bootstrapping",
      help="REQUIRED: the server(s) to use for bootstrapping")
    a("--command-config", metavar="Admin client property file",
      help="Property file containing configs to be passed to Admin Client.")
    a("--describe", action="store_true", help="Describe the specified log directories on the specified brokers.")
    a("--topic-list", default="", metavar="Topic list",
      help="The list of topics to be queried in the form \"topic1,topic2,topic3\". All topics will be queried if no "
           "topic list is specified")
    a("--broker-list", default="", metavar="Broker list",
      help="The list of brokers to be queried in the form \"0,1,2\". All brokers in the cluster will be queried if no "
           "broker list is specified")
    return p


def _split(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def describe(adm, topics: set[str], wanted: list[int], out) -> None:
    cluster = sorted(b.node_id for b in adm.describe_cluster().brokers)
    missing = sorted(set(wanted) - set(cluster))
    if missing:
        raise ToolError(f"The given brokers do not exist from --broker-list: {','.join(map(str, missing))}. "
                        f"Current existent brokers: {','.join(map(str, cluster))}")
    brokers = sorted(set(wanted)) if wanted else cluster
    print("Querying brokers for log directories information", file=out)
    dirs = adm.describe_log_dirs(brokers)
    print(f"Received log directory information from brokers {','.join(map(str, brokers))}", file=out)
    doc = {"version": 1, "brokers": [
        {"broker": b, "logDirs": [
            {"logDir": path, "error": type(d.error).__name__ if d.error is not None else None,
             "partitions": [{"partition": f"{tp.topic}-{tp.partition}", "size": r.size, "offsetLag": r.offset_lag,
                             "isFuture": r.is_future}
                            for tp, r in sorted(d.replicas.items()) if not topics or tp.topic in topics]}
            for path, d in sorted(dirs[b].items())]}
        for b in brokers]}
    print(json.dumps(doc, separators=(",", ":")), file=out)


def _main(argv, out) -> int:
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    if not o.describe:
        raise ToolError("Missing required argument \"[describe]\"")
    try:
        wanted = [int(x) for x in _split(o.broker_list)]
    except ValueError:
        raise ToolError(f"Invalid --broker-list '{o.broker_list}': expected broker ids like 0,1,2") from None
    adm = admin(o.bootstrap_server, o.command_config)
    try:
        describe(adm, set(_split(o.topic_list)), wanted, out)
    finally:
        adm.close()
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())
