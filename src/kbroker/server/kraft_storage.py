"""A KRaft node's storage on disk: its directories' meta.properties checked together, and the
bootstrap files ``kbroker storage format`` writes.

Kafka: ``metadata/.../metadata/properties/MetaPropertiesEnsemble.java``,
``metadata/.../bootstrap/BootstrapDirectory.java`` and ``KafkaRaftServer.initializeLogDirs``
(3.9). ``kbroker storage format`` loads the ensemble to find the directories still to format
and writes ``bootstrap.checkpoint`` (and, for a KIP-853 dynamic quorum, the voters snapshot);
a KRaft node (process.roles set) checks its storage at start-up with
:func:`verify_kraft_storage` and refuses an unformatted, foreign or legacy directory. The
encodings are in the pure :mod:`kbroker.metadata.bootstrap`.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kbroker.log.checkpoints import (
    META_PROPERTIES,
    MetaProperties,
    MetaPropertiesError,
    atomic_write,
    load_meta_properties,
)
from kbroker.metadata.bootstrap import (
    BOOTSTRAP_FILE,
    BOOTSTRAP_SNAPSHOT,
    DynamicVoter,
    FormatterError,
    decode_bootstrap,
    encode_snapshot,
    encode_voters_snapshot,
)
from kbroker.metadata.serde import ApiMessageAndVersion

CLUSTER_METADATA_DIR = "__cluster_metadata-0"


def _now_ms() -> int:
    return int(time.time() * 1000)


def write_bootstrap_file(directory: str, records: list[ApiMessageAndVersion], now_ms: int | None = None) -> str:
    """Write ``directory/bootstrap.checkpoint`` atomically (Kafka's BootstrapDirectory.writeBinaryFile);
    returns its path."""
    if not os.path.isdir(directory):
        raise FormatterError(f"No such directory as {directory}")
    path = os.path.join(directory, BOOTSTRAP_FILE)
    atomic_write(path, encode_snapshot(records, _now_ms() if now_ms is None else now_ms))
    return path


def read_bootstrap_file(path: str) -> list[ApiMessageAndVersion]:
    """The metadata records of a bootstrap file (control batches skipped)."""
    with open(path, "rb") as f:
        return decode_bootstrap(f.read(), path)


def write_voters_snapshot(metadata_dir: str, voters: dict[int, DynamicVoter], listener_name: str,
                          kraft_version: int) -> str:
    """Kafka's Formatter.writeDynamicQuorumSnapshot: the initial voter set as the bootstrap
    snapshot ``__cluster_metadata-0/00000000000000000000-0000000000.checkpoint``; returns its path."""
    snapshot_dir = os.path.join(metadata_dir, CLUSTER_METADATA_DIR)
    os.makedirs(snapshot_dir, exist_ok=True)
    path = os.path.join(snapshot_dir, BOOTSTRAP_SNAPSHOT)
    atomic_write(path, encode_voters_snapshot(voters, listener_name, kraft_version, _now_ms()))
    return path


class EnsembleError(RuntimeError):
    """The directories disagree or one is unusable; a one-line message naming the directory."""


def config_directories(config) -> list[str]:
    """log.dirs plus metadata.log.dir, sorted and distinct (Kafka's configToLogDirectories)."""
    return sorted(set(config.log_dirs) | {config.metadata_log_dir})


@dataclass
class MetaPropertiesEnsemble:
    """What each directory holds (Kafka's MetaPropertiesEnsemble): formatted dirs with their
    meta.properties, empty dirs (no meta.properties, or no directory at all) and dirs whose
    meta.properties cannot be read (``errors``: dir -> message)."""

    props: dict[str, MetaProperties] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, directories: list[str]) -> "MetaPropertiesEnsemble":
        e = cls()
        for d in directories:
            try:
                e.props[d] = load_meta_properties(os.path.join(d, META_PROPERTIES))
            except (FileNotFoundError, NotADirectoryError):
                if os.path.exists(d) and not os.path.isdir(d):
                    e.errors[d] = f"{d} is not a directory"
                else:
                    e.empty.append(d)
            except (OSError, MetaPropertiesError, UnicodeError) as err:
                e.errors[d] = str(err)
        return e

    def verify(self, cluster_id: str | None, node_id: int | None) -> None:
        """Kafka's MetaPropertiesEnsemble.verify: one cluster id, one node id, distinct directory ids."""
        seen: dict[str, str] = {}
        for d, mp in self.props.items():
            path = os.path.join(d, META_PROPERTIES)
            if mp.cluster_id is not None:
                if cluster_id is None:
                    cluster_id = mp.cluster_id
                elif mp.cluster_id != cluster_id:
                    raise EnsembleError(f"Invalid cluster.id in: {path}. Expected {cluster_id}, "
                                        f"but read {mp.cluster_id}")
            if mp.node_id is not None:
                if node_id is None:
                    node_id = mp.node_id
                elif mp.node_id != node_id:
                    raise EnsembleError(f"Stored node id {mp.node_id} doesn't match previous node id {node_id} in "
                                        f"{path}. If you moved your data, make sure your configured node id "
                                        "matches. If you intend to create a new node, you should remove all data "
                                        "in your data directories.")
            if mp.directory_id is not None:
                if mp.directory_id in seen:
                    raise EnsembleError(f"Duplicate directory ID {mp.directory_id} found. It was the ID of "
                                        f"{seen[mp.directory_id]}, but also of {d}")
                seen[mp.directory_id] = d


def verify_kraft_storage(config) -> tuple[str, MetaPropertiesEnsemble]:
    """Start-up of a KRaft node (Kafka's KafkaRaftServer.initializeLogDirs): every directory of
    log.dirs and metadata.log.dir formatted (version 1) for this node, all of one cluster
    (``cluster.id`` too when it is configured), the metadata log only in metadata.log.dir, a
    readable bootstrap.checkpoint if there is one. Returns (cluster id, ensemble); EnsembleError
    otherwise."""
    directories = config_directories(config)
    ensemble = MetaPropertiesEnsemble.load(directories)
    for d, message in sorted(ensemble.errors.items()):
        raise EnsembleError(f"Error while reading meta.properties file in {d}: {message}")
    if not ensemble.props:
        raise EnsembleError(f"No readable meta.properties files found (have you run `kbroker storage format` "
                            f"on {', '.join(directories)}?)")
    for d in sorted(ensemble.empty):
        raise EnsembleError(f"No `meta.properties` found in {d} (have you run `kbroker storage format` "
                            "to format the directory?)")
    for d, mp in sorted(ensemble.props.items()):
        if mp.version == 0:
            raise EnsembleError(f"{os.path.join(d, META_PROPERTIES)} is a version 0 (ZooKeeper mode) file: "
                                "the directory is formatted for legacy mode, a KRaft node needs version 1 "
                                "(`kbroker storage format`)")
    ensemble.verify(config["cluster.id"], config.node_id)
    for d in ensemble.props:
        if d != config.metadata_log_dir and os.path.exists(os.path.join(d, CLUSTER_METADATA_DIR)):
            raise EnsembleError(f"Found unexpected metadata location in data directory "
                                f"`{os.path.join(d, CLUSTER_METADATA_DIR)}` (the configured metadata directory "
                                f"is {config.metadata_log_dir}).")
    bootstrap = os.path.join(config.metadata_log_dir, BOOTSTRAP_FILE)
    if os.path.exists(bootstrap):
        try:
            read_bootstrap_file(bootstrap)
        except (OSError, ValueError) as e:
            raise EnsembleError(f"Cannot read the bootstrap metadata {bootstrap}: {e}".replace("\n", " ")) from None
    return next(iter(ensemble.props.values())).cluster_id, ensemble
