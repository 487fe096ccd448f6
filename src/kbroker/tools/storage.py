"""``kbroker storage``: format and inspect a KRaft node's directories, like ``kafka-storage.sh``.

    kbroker storage random-uuid
    kbroker storage format --config server.properties --cluster-id ID [--override k=v]
                           [--ignore-formatted] [--release-version 3.9] [--feature name=level]
                           [--add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]' ...]
                           [--standalone | --initial-controllers ID@HOST:PORT:DIR,... |
                            --no-initial-controllers]
    kbroker storage info --config server.properties

Kafka: ``core/.../tools/StorageTool.scala`` and ``metadata/.../storage/Formatter.java`` (3.9).
``format`` writes into every directory of ``log.dirs`` plus ``metadata.log.dir`` that has no
``meta.properties`` yet: ``bootstrap.checkpoint`` (the initial feature levels, see
:mod:`kbroker.metadata.bootstrap`), then ``meta.properties`` version 1 (cluster.id, node.id, a
fresh directory.id per directory). ``--add-scram`` (repeatable; kafka-storage.sh's syntax, see
:mod:`kbroker.metadata.scram_parser`) adds a UserScramCredentialRecord to the bootstrap metadata,
so the user can authenticate before any AlterUserScramCredentials (metadata.version 3.5-IV2 or
later). A directory that is already formatted is refused unless
``--ignore-formatted``; one formatted for another cluster or node is refused even then.
Errors are one line on stderr, exit code 1. Only for nodes with ``process.roles`` set:
zero-config mode formats its directory itself on first start.

KIP-853 dynamic quorums (a controller without ``controller.quorum.voters``): ``--standalone``
(this controller alone, on its first controller listener) or ``--initial-controllers`` also
set kraft.version 1 and write the initial voter set into the metadata directory as the
bootstrap snapshot ``__cluster_metadata-0/00000000000000000000-0000000000.checkpoint``; a
voter's metadata directory takes the directory id given for it.

Entry point for the ``kbroker storage`` subcommand: ``main(argv) -> int`` (exit code).
"""
from __future__ import annotations

import argparse
import os
import sys

from kbroker.config_def import ConfigError
from kbroker.log.checkpoints import (
    META_PROPERTIES,
    MetaProperties,
    MetaPropertiesError,
    load_meta_properties,
    random_directory_id,
    random_uuid,
    write_meta_properties,
)
from kbroker.server.kraft_storage import (
    EnsembleError,
    MetaPropertiesEnsemble,
    config_directories,
    write_bootstrap_file,
    write_voters_snapshot,
)
from kbroker.metadata import scram_parser
from kbroker.metadata.bootstrap import (
    SCRAM_MINIMUM_VERSION,
    FormatterError,
    bootstrap_records,
    effective_feature_levels,
    metadata_version_from_string,
    parse_dynamic_voters,
)


class StorageError(Exception):
    """A one-line failure of the storage tool (Kafka's TerseFailure / FormatterException)."""


def _load_config(args):
    from kbroker.server.config import KafkaConfig

    try:
        return KafkaConfig.from_sources(args.config, args.override)
    except ConfigError as e:
        raise StorageError(str(e).replace("\n", " ")) from None


def _parse_features(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items or []:
        name, sep, level = item.partition("=")
        if not sep:
            raise StorageError(f"Can't parse feature=level string {item}: equals sign not found.")
        try:
            out[name.strip()] = int(level.strip())
        except ValueError:
            raise StorageError(f"Can't parse feature=level string {item}: unable to parse {level.strip()} "
                               "as a short.") from None
    return out


def format_storage(args, out) -> int:
    """Kafka's StorageTool.runFormatCommand + Formatter.run/doFormat."""
    config = _load_config(args)
    if not config.cluster_mode:
        raise StorageError("The configuration has no process.roles: formatting is only for the nodes of a "
                           "KRaft cluster (a zero-config kbroker formats its own storage on first start).")
    node_id, cluster_id = config.node_id, args.cluster_id
    controller_listener = config.controller_listener_names[0]
    try:
        initial = None
        if args.initial_controllers is not None:
            initial = parse_dynamic_voters(args.initial_controllers)
        elif args.standalone:
            initial = _standalone_voter(config)
        if "controller" in config.process_roles and not config.voters and initial is None \
                and not args.no_initial_controllers:
            raise StorageError("Because controller.quorum.voters is not set on this controller, you must specify "
                               "one of the following: --standalone, --initial-controllers, or "
                               "--no-initial-controllers.")
        release = metadata_version_from_string(args.release_version) if args.release_version else None
        mv, levels = effective_feature_levels(release, _parse_features(args.feature),
                                              dynamic_quorum=initial is not None)
        records = bootstrap_records(mv, levels)
        if args.add_scram:
            # Kafka's Formatter.calculateBootstrapMetadata
            if mv < SCRAM_MINIMUM_VERSION:
                raise FormatterError(f"SCRAM is only supported in metadata.version {SCRAM_MINIMUM_VERSION} or later.")
            records += scram_parser.parse(args.add_scram)
    except FormatterError as e:
        raise StorageError(str(e)) from None
    directories = config_directories(config)
    ensemble = MetaPropertiesEnsemble.load(directories)
    try:
        ensemble.verify(cluster_id, node_id)
    except EnsembleError as e:
        raise StorageError(str(e)) from None
    if ensemble.props and not args.ignore_formatted:
        first = sorted(ensemble.props)[0]
        raise StorageError(f"Log directory {first} is already formatted. Use --ignore-formatted to ignore "
                           "this directory and format the others.")
    if ensemble.errors:
        for d in sorted(ensemble.errors):
            print(f"I/O error trying to read log directory {d}. Ignoring...", file=out)
        if not ensemble.empty and not ensemble.props:
            raise StorageError("No available log directories to format.")
    if not ensemble.empty:
        print("All of the log directories are already formatted.", file=out)
        return 0
    used = {mp.directory_id for mp in ensemble.props.values() if mp.directory_id}
    for d in sorted(ensemble.empty):
        # Kafka's Formatter.DirectoryType
        dynamic = d == config.metadata_log_dir and initial is not None
        if d != config.metadata_log_dir:
            kind = "data directory"
        elif initial is None:
            kind = "metadata directory"
        else:
            kind = "dynamic metadata voter directory" if node_id in initial else "dynamic metadata directory"
        if dynamic and node_id in initial:
            directory_id = initial[node_id].directory_id
        else:
            directory_id = random_directory_id(used)
        used.add(directory_id)
        print(f"Formatting {kind} {d} with metadata.version {mv}.", file=out)
        try:
            os.makedirs(d, exist_ok=True)
            write_bootstrap_file(d, records)
            if dynamic:
                write_voters_snapshot(d, initial, controller_listener, levels["kraft.version"])
            write_meta_properties(os.path.join(d, META_PROPERTIES), node_id=node_id, cluster_id=cluster_id,
                                  directory_id=directory_id)
        except OSError as e:
            raise StorageError(f"Error while writing meta.properties file {d}: {e}") from None
    return 0


def _standalone_voter(config):
    """Kafka's createStandaloneDynamicVoters: this controller alone, at its first advertised
    controller listener (host 'localhost' when the listener has none), a fresh directory id."""
    from kbroker.metadata.bootstrap import DynamicVoter

    if "controller" not in config.process_roles:
        raise StorageError("You can only use --standalone on a controller.")
    if not config.advertised_controller_listeners:
        raise StorageError("No controller listeners found.")
    l = config.advertised_controller_listeners[0]
    return {config.node_id: DynamicVoter(config.node_id, l.host or "localhost", l.port, random_uuid())}


def info(args, out) -> int:
    """Kafka's StorageTool.infoCommand: what each directory holds, and any problem."""
    config = _load_config(args)
    directories = config_directories(config)
    problems, found = [], []
    prev: MetaProperties | None = None
    for d in sorted(directories):
        if not os.path.isdir(d):
            problems.append(f"{d} does not exist" if not os.path.exists(d) else f"{d} is not a directory")
            continue
        found.append(d)
        path = os.path.join(d, META_PROPERTIES)
        if not os.path.exists(path):
            problems.append(f"{d} is not formatted.")
            continue
        try:
            cur = load_meta_properties(path)
        except (OSError, MetaPropertiesError, UnicodeError) as e:
            problems.append(f"Error loading {path}: {e}")
            continue
        if prev is None:
            prev = cur
        elif prev.cluster_id != cur.cluster_id:
            problems.append("Mismatched cluster IDs between storage directories.")
        elif prev.node_id != cur.node_id:
            problems.append("Mismatched node IDs between storage directories.")
    if prev is not None and prev.version == 0:
        problems.append("The kafka configuration file appears to be for a cluster in KRaft mode, but the "
                        "directories are formatted for legacy mode.")
    if not directories:
        print("No directories specified.", file=out)
        return 0
    if found:
        print("Found log directory:" if len(found) == 1 else "Found log directories:", file=out)
        for d in found:
            print(f"  {d}", file=out)
        print("", file=out)
    if prev is not None:
        props = {"version": str(prev.version)}
        if prev.cluster_id is not None:
            props["cluster.id"] = prev.cluster_id
        if prev.node_id is not None:
            props["node.id" if prev.version else "broker.id"] = str(prev.node_id)
        if prev.directory_id is not None:
            props["directory.id"] = prev.directory_id
        print("Found metadata: {" + ", ".join(f"{k}={props[k]}" for k in sorted(props)) + "}", file=out)
        print("", file=out)
    if problems:
        print("Found problem:" if len(problems) == 1 else "Found problems:", file=out)
        for p in problems:
            print(f"  {p}", file=out)
        print("", file=out)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbroker storage", description="The kbroker storage tool (like kafka-storage.sh).")
    sub = p.add_subparsers(dest="command", required=True)
    info_p = sub.add_parser("info", help="Get information about the log directories on this node.")
    fmt = sub.add_parser("format", help="Format the log directories on this node.")
    sub.add_parser("random-uuid", help="Print a random UUID.")
    for sp in (info_p, fmt):
        sp.add_argument("--config", "-c", required=True, help="The configuration file to use.")
        sp.add_argument("--override", metavar="KEY=VALUE", action="append", default=[],
                        help="set one property (repeatable; wins over --config)")
    fmt.add_argument("--cluster-id", "-t", required=True, help="The cluster ID to use.")
    fmt.add_argument("--add-scram", "-S", action="append", default=[],
                     help="A SCRAM_CREDENTIAL to add to the __cluster_metadata log e.g. "
                          "'SCRAM-SHA-256=[name=alice,password=alice-secret]' "
                          "'SCRAM-SHA-512=[name=alice,iterations=8192,salt=\"N3E=\",saltedpassword=\"YCE=\"]'")
    fmt.add_argument("--ignore-formatted", "-g", action="store_true",
                     help="Skip directories that are already formatted and format the others.")
    fmt.add_argument("--release-version", "-r",
                     help="The release version to use for the initial feature settings. The minimum is 3.3-IV0; "
                          "the default is 3.9-IV0")
    fmt.add_argument("--feature", "-f", action="append", default=[],
                     help="The setting to use for a specific feature, in feature=level format.")
    quorum = fmt.add_mutually_exclusive_group()
    quorum.add_argument("--standalone", "-s", action="store_true",
                        help="Used to initialize a controller as a single-node dynamic quorum.")
    quorum.add_argument("--no-initial-controllers", "-N", action="store_true",
                        help="Used to initialize a server without a dynamic quorum topology.")
    quorum.add_argument("--initial-controllers", "-I",
                        help="Used to initialize a server with a specific dynamic quorum topology: a "
                             "comma-separated list of id@hostname:port:directory, the same on every node.")
    return p


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        if args.command == "random-uuid":
            print(random_uuid(), file=out)
            return 0
        if args.command == "info":
            return info(args, out)
        return format_storage(args, out)
    except StorageError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
