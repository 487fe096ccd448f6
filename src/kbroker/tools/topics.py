#!/usr/bin/env python
"""kbroker topics: create, list, describe, delete and configure topics over the wire.

Like Kafka's ``kafka-topics.sh``, against any Kafka-compatible broker. Speaks
the protocol directly (kbroker.protocol's generated messages over a plain
socket), so it needs no client library.

    python tools/kbroker_topics.py --bootstrap-server 127.0.0.1:9092 --list
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --create --topic t --partitions 3 \\
        --config retention.ms=60000
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --describe [--topic t]
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --describe --under-replicated-partitions
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --delete --topic t
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --alter --topic t --partitions 6
    python tools/kbroker_topics.py --bootstrap-server HOST:PORT --alter --topic t \\
        --add-config retention.ms=1000 --delete-config segment.ms

Entry point for the ``kbroker topics`` subcommand: ``main(argv) -> int`` (exit code).
"""
from __future__ import annotations

import argparse
import re
import socket
import struct
import sys

from kbroker.protocol import API_INFO, ApiKey, ErrorCode, decode_response, encode_request
from kbroker.protocol.messages.create_partitions import CreatePartitionsRequest, CreatePartitionsTopic
from kbroker.protocol.messages.create_topics import (
    CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
)
from kbroker.protocol.messages.delete_topics import DeleteTopicsRequest, DeleteTopicState
from kbroker.protocol.messages.describe_configs import DescribeConfigsRequest, DescribeConfigsResource
from kbroker.protocol.messages.incremental_alter_configs import (
    AlterableConfig, AlterConfigsResource, IncrementalAlterConfigsRequest,
)
from kbroker.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic

CLIENT_ID = "kbroker-topics"
_SIZE = struct.Struct(">i")


class AdminError(Exception):
    """The broker answered with an error code."""

    def __init__(self, code: int, message: str | None, what: str):
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        super().__init__(f"{what}: {name}" + (f" ({message})" if message else ""))
        self.code = code


class WireClient:
    """One blocking connection to one broker; one request in flight (Kafka's ordering)."""

    def __init__(self, bootstrap: str, timeout_s: float = 30.0):
        host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s)
        self._correlation_id = 0
        self._versions: dict[int, tuple[int, int]] | None = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, body, version: int | None = None):
        """Send ``body`` at ``version`` (default: the highest both sides support); return the response body."""
        if version is None:
            version = self.pick_version(api_key)
        self._correlation_id += 1
        self.sock.sendall(encode_request(api_key, version, self._correlation_id, CLIENT_ID, body))
        (size,) = _SIZE.unpack(self._recv_exact(4))
        header, resp = decode_response(self._recv_exact(size), api_key, version)
        if header.correlation_id != self._correlation_id:
            raise ConnectionError(f"correlation id {header.correlation_id} != {self._correlation_id}")
        return resp

    def pick_version(self, api_key: int) -> int:
        if self._versions is None:
            from kbroker.protocol.messages.api_versions import ApiVersionsRequest

            resp = self.request(ApiKey.API_VERSIONS, ApiVersionsRequest(
                client_software_name="kbroker-topics", client_software_version="1"), version=3)
            self._versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        lo, hi = self._versions.get(int(api_key), (None, None))
        info = API_INFO[api_key]
        if lo is None or hi < info.min_version or lo > info.max_version:
            raise AdminError(ErrorCode.UNSUPPORTED_VERSION, None, f"broker does not support {info.name}")
        return min(hi, info.max_version)


# -- operations (each returns plain data; main() prints) -------------------------------------------

def _check(code: int, message: str | None, what: str) -> None:
    if code != ErrorCode.NONE:
        raise AdminError(code, message, what)


def list_topics(c: WireClient, include_internal: bool = False) -> list[str]:
    resp = c.request(ApiKey.METADATA, MetadataRequest(topics=None, allow_auto_topic_creation=False))
    return sorted(t.name for t in resp.topics if include_internal or not t.is_internal)


def describe_topics(c: WireClient, names: list[str] | None = None) -> list[dict]:
    """Each topic (by name) with its partitions; ``live_brokers`` is the set of brokers the
    Metadata response listed (a leader outside it is unavailable, as kafka-topics.sh says)."""
    topics = None if not names else [MetadataRequestTopic(name=n) for n in names]
    resp = c.request(ApiKey.METADATA, MetadataRequest(topics=topics, allow_auto_topic_creation=False))
    live = frozenset(b.node_id for b in resp.brokers)
    out = []
    for t in sorted(resp.topics, key=lambda t: t.name):
        _check(t.error_code, None, f"topic {t.name}")
        out.append({"name": t.name, "topic_id": t.topic_id, "is_internal": t.is_internal, "live_brokers": live,
                     "partitions": [{"partition": p.partition_index, "leader": p.leader_id,
                                     "leader_epoch": p.leader_epoch, "replicas": list(p.replica_nodes),
                                     "isr": list(p.isr_nodes), "error_code": p.error_code}
                                    for p in sorted(t.partitions, key=lambda p: p.partition_index)]})
    return out


def topic_overrides(c: WireClient, name: str) -> dict[str, str]:
    """The topic's config overrides (DYNAMIC_TOPIC_CONFIG entries)."""
    resp = c.request(ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest(
        resources=[DescribeConfigsResource(resource_type=2, resource_name=name, configuration_keys=None)]))
    r = resp.results[0]
    _check(r.error_code, r.error_message, f"describe configs of {name}")
    return {e.name: e.value for e in r.configs if e.config_source == 1}


def topic_config(c: WireClient, name: str, key: str) -> str | None:
    """The topic's effective value of ``key`` (override, broker setting or default)."""
    resp = c.request(ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest(
        resources=[DescribeConfigsResource(resource_type=2, resource_name=name, configuration_keys=[key])]))
    r = resp.results[0]
    _check(r.error_code, r.error_message, f"describe configs of {name}")
    return next((e.value for e in r.configs if e.name == key), None)


def create_topic(c: WireClient, name: str, partitions: int = -1, replication_factor: int = -1,
                 configs: dict[str, str] | None = None, validate_only: bool = False) -> None:
    req = CreateTopicsRequest(topics=[CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=replication_factor, assignments=[],
        configs=[CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])],
        timeout_ms=30000, validate_only=validate_only)
    r = c.request(ApiKey.CREATE_TOPICS, req).topics[0]
    _check(r.error_code, r.error_message, f"create topic {name}")


def delete_topic(c: WireClient, name: str) -> None:
    v = c.pick_version(ApiKey.DELETE_TOPICS)
    req = (DeleteTopicsRequest(topics=[DeleteTopicState(name=name)], timeout_ms=30000) if v >= 6
           else DeleteTopicsRequest(topic_names=[name], timeout_ms=30000))
    r = c.request(ApiKey.DELETE_TOPICS, req, version=v).responses[0]
    _check(r.error_code, r.error_message, f"delete topic {name}")


def add_partitions(c: WireClient, name: str, count: int) -> None:
    req = CreatePartitionsRequest(topics=[CreatePartitionsTopic(name=name, count=count, assignments=None)],
                                  timeout_ms=30000, validate_only=False)
    r = c.request(ApiKey.CREATE_PARTITIONS, req).results[0]
    _check(r.error_code, r.error_message, f"create partitions of {name}")


def alter_topic_configs(c: WireClient, name: str, set_configs: dict[str, str], delete: list[str]) -> None:
    ops = [AlterableConfig(name=k, config_operation=0, value=v) for k, v in set_configs.items()]
    ops += [AlterableConfig(name=k, config_operation=1, value=None) for k in delete]
    req = IncrementalAlterConfigsRequest(resources=[AlterConfigsResource(resource_type=2, resource_name=name,
                                                                         configs=ops)], validate_only=False)
    r = c.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, req).responses[0]
    _check(r.error_code, r.error_message, f"alter configs of {name}")


# -- command line --------------------------------------------------------------------------------

def _kv(items: list[str] | None) -> dict[str, str]:
    """``key=value`` items; one item may hold several, comma-separated (``a=1,b=2``). A list
    value keeps its commas (``cleanup.policy=compact,delete``) or uses Kafka's brackets
    (``cleanup.policy=[compact,delete]``)."""
    out = {}
    for item in items or []:
        for part in re.split(r",(?=[A-Za-z0-9._-]+=)", item):
            k, sep, v = part.partition("=")
            if not sep or not k.strip():
                raise SystemExit(f"expected key=value, got {part!r}")
            v = v.strip()
            if v.startswith("[") and v.endswith("]"):
                v = v[1:-1]
            out[k.strip()] = v
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbroker topics", description="Create, list, describe, alter and delete topics.")
    p.add_argument("--bootstrap-server", required=True, help="HOST:PORT of a broker")
    g = p.add_mutually_exclusive_group(required=True)
    for op in ("create", "list", "describe", "delete", "alter"):
        g.add_argument(f"--{op}", action="store_true")
    p.add_argument("--topic")
    p.add_argument("--partitions", type=int)
    p.add_argument("--replication-factor", type=int, default=-1)
    p.add_argument("--config", action="append", help="key=value (create), repeatable")
    p.add_argument("--add-config", action="append", help="key=value[,key=value] (alter)")
    p.add_argument("--delete-config", action="append", help="key (alter), repeatable")
    p.add_argument("--exclude-internal", action="store_true")
    for flag, what in (("under-replicated-partitions", "partitions whose ISR is smaller than their replica set"),
                       ("under-min-isr-partitions", "partitions whose ISR is smaller than min.insync.replicas"),
                       ("at-min-isr-partitions", "partitions whose ISR is exactly min.insync.replicas"),
                       ("unavailable-partitions", "partitions without a leader or whose leader is not live"),
                       ("topics-with-overrides", "topics with config overrides (their header lines only)")):
        p.add_argument(f"--{flag}", action="store_true", help=f"describe: only {what}")
    p.add_argument("--if-not-exists", action="store_true")
    p.add_argument("--if-exists", action="store_true")
    p.add_argument("--timeout", type=float, default=30.0, help="socket timeout, seconds")
    return p


def _partition_filter(args):
    """kafka-topics.sh's describe filters as ``(partition, live brokers, min ISR) -> bool``,
    or None when none is given."""
    if args.under_replicated_partitions:
        return lambda p, live, min_isr: len(p["isr"]) < len(p["replicas"])
    if args.under_min_isr_partitions:
        return lambda p, live, min_isr: len(p["isr"]) < min_isr
    if args.at_min_isr_partitions:
        return lambda p, live, min_isr: len(p["isr"]) == min_isr
    if args.unavailable_partitions:
        return lambda p, live, min_isr: p["leader"] < 0 or p["leader"] not in live
    return None


def _print_describe(c: WireClient, topics: list[dict], out, args=None) -> None:
    keep = _partition_filter(args) if args is not None else None
    only_overrides = args is not None and args.topics_with_overrides
    for t in topics:
        overrides = topic_overrides(c, t["name"])
        if only_overrides and not overrides:
            continue
        parts = t["partitions"]
        if keep is not None:
            min_isr = 1
            if args.under_min_isr_partitions or args.at_min_isr_partitions:
                min_isr = int(topic_config(c, t["name"], "min.insync.replicas") or 1)
            parts = [p for p in parts if keep(p, t["live_brokers"], min_isr)]
            if not parts:
                continue
        cfg = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
        rf = len(t["partitions"][0]["replicas"]) if t["partitions"] else 0
        if keep is None:   # kafka-topics.sh prints only the partition lines under a filter
            print(f"Topic: {t['name']}\tTopicId: {_topic_id(t['topic_id'])}\tPartitionCount: {len(t['partitions'])}"
                  f"\tReplicationFactor: {rf}\tConfigs: {cfg}", file=out)
        if only_overrides:
            continue
        for p in parts:
            print(f"\tTopic: {t['name']}\tPartition: {p['partition']}\tLeader: {p['leader']}"
                  f"\tReplicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}", file=out)


def _topic_id(u) -> str:
    import base64

    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    needs_topic = args.create or args.delete or args.alter
    if needs_topic and not args.topic:
        print("error: --topic is required", file=sys.stderr)
        return 2
    try:
        with WireClient(args.bootstrap_server, args.timeout) as c:
            if args.list:
                for name in list_topics(c, include_internal=not args.exclude_internal):
                    print(name, file=out)
            elif args.describe:
                names = [args.topic] if args.topic else None
                _print_describe(c, describe_topics(c, names), out, args)
            elif args.create:
                try:
                    create_topic(c, args.topic, args.partitions if args.partitions else -1,
                                 args.replication_factor, _kv(args.config))
                except AdminError as e:
                    if not (args.if_not_exists and e.code == ErrorCode.TOPIC_ALREADY_EXISTS):
                        raise
                print(f"Created topic {args.topic}.", file=out)
            elif args.delete:
                try:
                    delete_topic(c, args.topic)
                except AdminError as e:
                    if not (args.if_exists and e.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
                        raise
                print(f"Deleted topic {args.topic}.", file=out)
            elif args.alter:
                if args.partitions:
                    add_partitions(c, args.topic, args.partitions)
                if args.add_config or args.delete_config:
                    alter_topic_configs(c, args.topic, _kv(args.add_config), list(args.delete_config or []))
                if not (args.partitions or args.add_config or args.delete_config):
                    print("error: --alter needs --partitions, --add-config or --delete-config", file=sys.stderr)
                    return 2
                print(f"Altered topic {args.topic}.", file=out)
    except AdminError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"Error: cannot talk to {args.bootstrap_server}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
