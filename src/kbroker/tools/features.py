"""kbroker features: describe and change the cluster's finalized feature levels (Kafka's
``kafka-features.sh``, FeatureCommand), through the Admin API: ApiVersions for ``describe``,
UpdateFeatures (which a broker forwards to the active controller) for the others.

    kbroker features --bootstrap-server HOST:PORT describe
    kbroker features --bootstrap-server HOST:PORT upgrade --feature transaction.version=2 [--dry-run]
    kbroker features --bootstrap-server HOST:PORT upgrade --metadata 3.9
    kbroker features --bootstrap-server HOST:PORT downgrade --feature transaction.version=1 [--unsafe]
    kbroker features --bootstrap-server HOST:PORT disable --feature transaction.version

The output lines are Kafka's; exit code 1 if any update failed. ``--release-version``
(every feature at a release's default) is not offered.
"""
from __future__ import annotations

import sys

from kbroker.controller.features import (
    LATEST, METADATA_VERSION_NAMES, MINIMUM_BOOTSTRAP, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE, UPGRADE,
)
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, describe_error, run_tool

PURPOSE = ("This tool manages feature flags in Kafka.\n"
           "Commands: describe, upgrade, downgrade, disable")
COMMANDS = ("describe", "upgrade", "downgrade", "disable")


def level_to_string(feature: str, level: int) -> str:
    """Kafka's FeatureCommand.levelToString: metadata.version levels by release name."""
    if feature == "metadata.version":
        return METADATA_VERSION_NAMES.get(level, f"UNKNOWN {level}")
    return str(level)


def metadata_level(version: str) -> int:
    """Kafka's MetadataVersion.fromVersionString: "3.7-IV2" exactly, "3.7" its last IV."""
    if version in METADATA_VERSION_NAMES.values():
        return next(lv for lv, name in METADATA_VERSION_NAMES.items() if name == version)
    release = [lv for lv, name in METADATA_VERSION_NAMES.items() if name.split("-")[0] == version]
    if release:
        return max(release)
    supported = ", ".join(METADATA_VERSION_NAMES[lv] for lv in range(MINIMUM_BOOTSTRAP, LATEST + 1))
    raise ToolError(f"Unknown metadata.version {version}. Supported metadata.version are {supported}")


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker features", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="host:port",
      help="A comma-separated list of host:port pairs to use for establishing the connection to the Kafka "
           "cluster.")
    a("--command-config", metavar="command config property file",
      help="Property file containing configs to be passed to Admin Client.")
    a("--feature", action="append", default=[], metavar="feature",
      help="A feature upgrade or downgrade we should perform, in feature=level format (upgrade, downgrade), "
           "or a feature name (disable). May be repeated.")
    a("--metadata", metavar="metadata version",
      help="The level to which we should upgrade or downgrade the metadata.version, e.g. 3.9 or 3.7-IV2.")
    a("--unsafe", action="store_true", help="Whether this downgrade may lose metadata (refused for "
                                            "metadata.version, as in Kafka).")
    a("--dry-run", action="store_true", help="Validate this operation, but do not perform it.")
    return p


def _describe(a, out) -> int:
    fm = a.describe_features()
    epoch = fm.epoch if fm.epoch >= 0 else "-"
    for name in sorted(fm.supported):
        lo, hi = fm.supported[name]
        print(f"Feature: {name}\tSupportedMinVersion: {level_to_string(name, lo)}\t"
              f"SupportedMaxVersion: {level_to_string(name, hi)}\t"
              f"FinalizedVersionLevel: {level_to_string(name, fm.finalized.get(name, 0))}\tEpoch: {epoch}",
              file=out)
    return 0


def _updates(o, command: str) -> dict:
    kind = UPGRADE if command == "upgrade" else UNSAFE_DOWNGRADE if o.unsafe else SAFE_DOWNGRADE
    updates: dict = {}
    if command == "disable":
        if o.metadata is not None:
            raise ToolError("--metadata cannot be used with disable")
        for name in o.feature:
            if name in updates:
                raise ToolError(f"Feature {name} was specified more than once.")
            updates[name] = (0, kind)
        return updates
    if o.metadata is not None:
        updates["metadata.version"] = (metadata_level(o.metadata), kind)
    for item in o.feature:
        name, eq, level = item.partition("=")
        if not eq or not name:
            raise ToolError(f"Can't parse feature={item} string. Expected format is feature=level")
        try:
            lv = int(level)
        except ValueError:
            raise ToolError(f"Can't parse feature={item} string. Level {level} is not a number") from None
        if name in updates:
            raise ToolError(f"Feature {name} was specified more than once.")
        updates[name] = (lv, kind)
    return updates


def _update(a, command: str, updates: dict, dry_run: bool, out) -> int:
    if not updates:
        raise ToolError(f"You must specify at least one feature to {command}")
    results = a.update_features(updates, validate_only=dry_run, raise_on_error=False)
    failures = 0
    for name in sorted(results):
        level = updates[name][0]
        e = results[name]
        if e is not None:
            what = f"disable {name}" if command == "disable" else f"{command} {name} to {level}"
            print(f"{'Can not' if dry_run else 'Could not'} {what}. {describe_error(e)}", file=out)
            failures += 1
        else:
            obj = "disabled." if command == "disable" else f"{command}d to {level}."
            print(f"{name}{' can be ' if dry_run else ' was '}{obj}", file=out)
    if failures:
        raise ToolError(f"{failures} out of {len(updates)} operation(s) failed.")
    return 0


def _main(argv, out) -> int:
    # the command is a bare word anywhere among the options (Kafka's argparse4j sub-parsers)
    commands = [x for x in argv if x in COMMANDS]
    if len(commands) > 1:
        raise ToolError(f"only one command may be given, not {' and '.join(commands)}")
    o = build_parser().parse([x for x in argv if x not in COMMANDS], out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("Missing required option(s) [bootstrap-server]")
    if not commands:
        raise ToolError("a command is required: describe, upgrade, downgrade or disable")
    command = commands[0]
    with admin(o.bootstrap_server, o.command_config) as a:
        if command == "describe":
            return _describe(a, out)
        if command == "upgrade" and o.unsafe:
            raise ToolError("--unsafe is only for downgrade and disable")
        return _update(a, command, _updates(o, command), o.dry_run, out)


def main(argv: list[str] | None = None, out=None, err=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out, err)


if __name__ == "__main__":
    sys.exit(main())
