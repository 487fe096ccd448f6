"""``kbroker metadata-quorum``: describe the KRaft quorum and change its voters, like
``kafka-metadata-quorum.sh`` (Kafka 3.9's ``MetadataQuorumCommand``).

    kbroker metadata-quorum --bootstrap-controller HOST:PORT describe --status
    kbroker metadata-quorum --bootstrap-controller HOST:PORT describe --replication [--human-readable]
    kbroker metadata-quorum --bootstrap-controller HOST:PORT --command-config controller.properties add-controller
    kbroker metadata-quorum --bootstrap-controller HOST:PORT remove-controller \\
        --controller-id N --controller-directory-id UUID

The requests go to the controller listeners (DescribeQuorum v2, DescribeCluster v1,
AddRaftVoter, RemoveRaftVoter): the tool asks the bootstrap controllers who leads (the
leader answers DescribeQuorum) and sends the voter change to it. ``add-controller`` reads
the new controller's own properties file: its ``node.id``, the directory id in
``meta.properties`` of its metadata log directory, its advertised controller listeners.
Only ``--bootstrap-controller`` is supported (Kafka's brokers forward DescribeQuorum; ours
do not yet). Failures are one ``Error: ...`` line, exit code 1.
"""
from __future__ import annotations

import base64
import itertools
import os
import socket
import sys
import time

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.tools._common import KafkaArgumentParser, ToolError, load_properties, run_tool

_corr = itertools.count(1)


def kafka_uuid(u) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def _parse_hosts(text: str) -> list[tuple[str, int]]:
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ToolError(f"Invalid bootstrap address {item!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ToolError("No bootstrap controllers given")
    return out


def call(hp: tuple[str, int], api_key: int, version: int, req, timeout_s: float = 30.0):
    """One request on a fresh connection; the response body."""
    from kbroker.protocol.frames import decode_response, encode_request

    with socket.create_connection(hp, timeout=timeout_s) as s:
        s.sendall(encode_request(api_key, version, next(_corr), "kbroker-metadata-quorum", req))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ToolError(f"the controller at {hp[0]}:{hp[1]} closed the connection")
            buf += chunk
    return decode_response(buf[4:4 + int.from_bytes(buf[:4], "big")], api_key, version)[1]


def _describe(bootstrap, timeout_s=30.0):
    """(DescribeQuorum v2 response, its partition, the leader's (host, port))."""
    from kbroker.raft.messages import describe_quorum_request

    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        for hp in bootstrap:
            try:
                r = call(hp, ApiKey.DESCRIBE_QUORUM, 2, describe_quorum_request())
            except OSError as e:
                last = f"{hp[0]}:{hp[1]}: {e}"
                continue
            if r.error_code:
                last = ErrorCode(r.error_code).name
                continue
            p = r.topics[0].partitions[0]
            if p.error_code == 0:
                return r, p, hp
            last = ErrorCode(p.error_code).name
            # a follower names the leader: ask it, at its endpoint if we know one
            for n in r.nodes:
                if n.node_id == p.leader_id and n.listeners:
                    bootstrap = [(n.listeners[0].host, n.listeners[0].port)] + list(bootstrap)
        if time.monotonic() >= deadline:
            raise ToolError(f"no quorum leader found through the bootstrap controllers ({last})")
        time.sleep(0.2)


def _leader_endpoint(r, p, hp):
    for n in r.nodes:
        if n.node_id == p.leader_id and n.listeners:
            return (n.listeners[0].host, n.listeners[0].port)
    return hp


def _node_text(state, nodes) -> str:
    parts = ['"id": %d' % state.replica_id,
             '"directoryId": ' + ("null" if state.replica_directory_id.int == 0
                                  else '"%s"' % kafka_uuid(state.replica_directory_id))]
    n = nodes.get(state.replica_id)
    if n is not None and n.listeners:
        parts.append('"endpoints": [' + ", ".join('"%s://%s:%d"' % (l.name, f"[{l.host}]" if ":" in l.host
                                                                     else l.host, l.port)
                                                  for l in n.listeners) + "]")
    return "{" + ", ".join(parts) + "}"


def describe_status(bootstrap, out) -> int:
    from kbroker.protocol.messages import describe_cluster as dc

    r, p, hp = _describe(bootstrap)
    cluster = call(hp, ApiKey.DESCRIBE_CLUSTER, 1, dc.DescribeClusterRequest(endpoint_type=2))
    nodes = {n.node_id: n for n in r.nodes}
    leader = next(v for v in p.current_voters if v.replica_id == p.leader_id)
    lagging = min(p.current_voters, key=lambda v: v.log_end_offset)
    if lagging is leader:
        lag_ms = 0
    elif leader.last_caught_up_timestamp >= 0 and lagging.last_caught_up_timestamp >= 0:
        lag_ms = leader.last_caught_up_timestamp - lagging.last_caught_up_timestamp
    else:
        lag_ms = -1
    print(f"ClusterId:              {cluster.cluster_id}\n"
          f"LeaderId:               {p.leader_id}\n"
          f"LeaderEpoch:            {p.leader_epoch}\n"
          f"HighWatermark:          {p.high_watermark}\n"
          f"MaxFollowerLag:         {leader.log_end_offset - lagging.log_end_offset}\n"
          f"MaxFollowerLagTimeMs:   {lag_ms}\n"
          f"CurrentVoters:          [{', '.join(_node_text(v, nodes) for v in p.current_voters)}]\n"
          f"CurrentObservers:       [{', '.join(_node_text(o, nodes) for o in p.observers)}]", file=out)
    return 0


def describe_replication(bootstrap, human: bool, out) -> int:
    r, p, _ = _describe(bootstrap)
    leader = next(v for v in p.current_voters if v.replica_id == p.leader_id)
    now = int(time.time() * 1000)

    def ts(v):
        if v < 0:
            return "-1"
        return f"{max(0, now - v)} ms ago" if human else str(v)

    rows = []
    for status, states in (("Leader", [leader]),
                           ("Follower", [v for v in p.current_voters if v.replica_id != p.leader_id]),
                           ("Observer", list(p.observers))):
        for s in states:
            rows.append([str(s.replica_id), kafka_uuid(s.replica_directory_id), str(s.log_end_offset),
                         str(leader.log_end_offset - s.log_end_offset), ts(s.last_fetch_timestamp),
                         ts(s.last_caught_up_timestamp), status])
    headers = ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp",
               "Status"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    for row in [headers] + rows:
        out.write("".join(v.ljust(w) + "\t" for v, w in zip(row, widths)) + "\n")
    return 0


def _controller_identity(path: str):
    """(node id, directory id, [(listener, host, port)]) from a controller's properties file."""
    from kbroker.log.checkpoints import META_PROPERTIES, load_meta_properties
    from kbroker.metadata.bootstrap import uuid_from_str
    from kbroker.server.config import KafkaConfig

    props = load_properties(path)
    if "node.id" not in props:
        raise ToolError(f"node.id not found in {path}")
    try:
        config = KafkaConfig.from_sources(path, [])
    except Exception as e:
        raise ToolError(f"cannot load {path}: {' '.join(str(e).split())}") from None
    if "controller" not in config.process_roles:
        raise ToolError(f"{path} is not the configuration of a controller (process.roles)")
    meta_path = os.path.join(config.metadata_log_dir, META_PROPERTIES)
    try:
        mp = load_meta_properties(meta_path)
    except Exception as e:
        raise ToolError(f"cannot read {meta_path}: {e}") from None
    if not mp.directory_id:
        raise ToolError(f"No directory id found in {meta_path}")
    endpoints = [(l.name, l.host or "localhost", l.port) for l in config.advertised_controller_listeners]
    if not endpoints:
        raise ToolError(f"No controller listeners found in {path}")
    return config.node_id, uuid_from_str(mp.directory_id), endpoints


def add_controller(bootstrap, command_config, dry_run, out) -> int:
    from kbroker.protocol.messages import add_raft_voter as arv

    if not command_config:
        raise ToolError("You must supply the configuration file of the controller you are adding when using "
                        "add-controller (--command-config)")
    node_id, directory_id, endpoints = _controller_identity(command_config)
    if not dry_run:
        r, p, hp = _describe(bootstrap)
        req = arv.AddRaftVoterRequest(cluster_id=None, timeout_ms=30000, voter_id=node_id,
                                      voter_directory_id=directory_id,
                                      listeners=[arv.Listener(name=n, host=h, port=pt) for n, h, pt in endpoints])
        resp = call(_leader_endpoint(r, p, hp), ApiKey.ADD_RAFT_VOTER, 0, req)
        if resp.error_code:
            raise ToolError(f"{ErrorCode(resp.error_code).name}: {resp.error_message or ''}".rstrip(": "))
    eps = ", ".join("%s://%s:%d" % (n, f"[{h}]" if ":" in h else h, pt) for n, h, pt in endpoints)
    print(f"{'DRY RUN of adding' if dry_run else 'Added'} controller {node_id} with directory id "
          f"{kafka_uuid(directory_id)} and endpoints: {eps}", file=out)
    return 0


def remove_controller(bootstrap, controller_id, directory_text, dry_run, out) -> int:
    from kbroker.metadata.bootstrap import uuid_from_str
    from kbroker.protocol.messages import remove_raft_voter as rrv

    if controller_id < 0:
        raise ToolError(f"Invalid negative --controller-id: {controller_id}")
    try:
        directory_id = uuid_from_str(directory_text)
    except ValueError as e:
        raise ToolError(f"Failed to parse --controller-directory-id: {e}") from None
    if not dry_run:
        r, p, hp = _describe(bootstrap)
        resp = call(_leader_endpoint(r, p, hp), ApiKey.REMOVE_RAFT_VOTER, 0,
                    rrv.RemoveRaftVoterRequest(cluster_id=None, voter_id=controller_id,
                                               voter_directory_id=directory_id))
        if resp.error_code:
            raise ToolError(f"{ErrorCode(resp.error_code).name}: {resp.error_message or ''}".rstrip(": "))
    print(f"{'DRY RUN of removing ' if dry_run else 'Removed '} KRaft controller {controller_id} with directory id "
          f"{kafka_uuid(directory_id)}", file=out)
    return 0


COMMANDS = ("describe", "add-controller", "remove-controller")


def _body(argv, out) -> int:
    p = KafkaArgumentParser("kbroker metadata-quorum",
                            "This tool describes kraft metadata quorum status.\n"
                            "Commands: describe (--status | --replication), add-controller, remove-controller")
    p.add_argument("--bootstrap-server", help="A comma-separated list of host:port pairs to use for establishing "
                                              "the connection to the Kafka cluster.")
    p.add_argument("--bootstrap-controller", help="A comma-separated list of host:port pairs to use for "
                                                  "establishing the connection to the Kafka controllers.")
    p.add_argument("--command-config", help="Property file containing configs to be passed to Admin Client. "
                                            "For add-controller, the config used for the new controller.")
    p.add_argument("--status", action="store_true", help="A short summary of the quorum status.")
    p.add_argument("--replication", action="store_true", help="Detailed information about the status of "
                                                              "replication")
    p.add_argument("--human-readable", action="store_true", help="Human-readable output")
    p.add_argument("--controller-id", "-i", type=int, help="The id of the controller to remove.")
    p.add_argument("--controller-directory-id", "-d", help="The directory ID of the controller to remove.")
    p.add_argument("--dry-run", action="store_true", help="True if we should print what would be done, "
                                                          "but not do it.")
    # the sub-command (describe / add-controller / remove-controller) is a bare word anywhere
    # among the options, as in Kafka's argparse4j parser
    commands = [a for a in argv if a in COMMANDS]
    if len(commands) > 1:
        raise ToolError(f"only one command may be given, not {' and '.join(commands)}")
    args = p.parse([a for a in argv if a not in COMMANDS], out)
    if args is None:
        return 0
    args.command = commands[0] if commands else None
    if args.bootstrap_server and args.bootstrap_controller:
        raise ToolError("Only one of --bootstrap-server or --bootstrap-controller must be specified")
    if args.bootstrap_server:
        raise ToolError("--bootstrap-server is not supported yet by kbroker metadata-quorum: use "
                        "--bootstrap-controller with the controllers' listeners")
    if not args.bootstrap_controller:
        raise ToolError("One of --bootstrap-server or --bootstrap-controller must be specified")
    bootstrap = _parse_hosts(args.bootstrap_controller)
    if args.command == "describe":
        if args.status == args.replication:
            raise ToolError("One of --status or --replication must be specified with describe sub-command")
        if args.status:
            return describe_status(bootstrap, out)
        return describe_replication(bootstrap, args.human_readable, out)
    if args.command == "add-controller":
        return add_controller(bootstrap, args.command_config, args.dry_run, out)
    if args.command == "remove-controller":
        if args.controller_id is None or args.controller_directory_id is None:
            raise ToolError("remove-controller needs --controller-id and --controller-directory-id")
        return remove_controller(bootstrap, args.controller_id, args.controller_directory_id, args.dry_run, out)
    raise ToolError("a command is required: describe, add-controller or remove-controller")


def main(argv=None, out=None, err=None) -> int:
    return run_tool(_body, sys.argv[1:] if argv is None else argv, out, err)


if __name__ == "__main__":
    sys.exit(main())
