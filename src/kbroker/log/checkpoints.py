"""Kafka's small text files in a log directory, written atomically.

Formats (byte for byte as Kafka writes them; every line ends with ``\\n``):

``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``replication-offset-checkpoint`` (Kafka's ``OffsetCheckpointFile``)::

    0                       <- version
    2                       <- number of entries
    my-topic 0 1234         <- "topic partition offset"
    my-topic 1 99

``<topic>-<partition>/leader-epoch-checkpoint`` (``LeaderEpochCheckpointFile``)::

    0
    2
    0 0                     <- "epoch start_offset"
    3 1500

``<topic>-<partition>/partition.metadata`` (``PartitionMetadataFile``)::

    version: 0
    topic_id: <22-char URL-safe base64 UUID, no padding>

``meta.properties`` (``MetaProperties``): a Java properties file. Version 1 (KRaft, what
``kbroker storage format`` and zero-config start-up write)::

    #
    #Wed Nov 25 16:20:00 UTC 2026     <- java.util.Properties.store's header: "" comment, date
    node.id=1
    directory.id=J8aAPcfLQt2bqs1JT_rMgQ
    version=1
    cluster.id=MkU3OEVBNTcwNTJENDM2Qg

Version 0 (ZooKeeper mode; ``version`` absent or 0) has ``broker.id`` instead of ``node.id``.

``.kafka_cleanshutdown`` (``CleanShutdownFileHandler``): JSON
``{"version":0,"brokerEpoch":N}``; its presence means the previous run
closed every log cleanly.

Atomic write (Kafka's ``CheckpointFile`` + ``Utils.atomicMoveWithFallback``):
write ``<name>.tmp``, flush, fsync, rename over ``<name>``, fsync the
directory. A crash leaves either the old or the new file, never a mix.
"""
from __future__ import annotations

import base64
import functools
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
META_PROPERTIES = "meta.properties"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


class CheckpointError(IOError):
    """A checkpoint file that cannot be parsed (Kafka: 'Malformed line in checkpoint file')."""


def fsync_dir(path: str) -> None:
    """fsync a directory so a rename/create in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: file systems whose syncfs(2) writes back and commits everything (data, mmap'd
#: pages, directory entries), as an fsync of every file and directory would.
#: Others (FUSE, network file systems) get an fsync per file.
SYNCFS_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs"})


def file_system_type(path: str) -> str | None:
    """The type of the file system holding ``path`` (/proc/self/mountinfo), or None."""
    path = os.path.realpath(path)
    best, best_type = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, sep, right = line.partition(" - ")
                fields = left.split(" ")
                if not sep or len(fields) < 5:
                    continue
                mount_point = fields[4].replace("\\040", " ")
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, right.split(" ", 1)[0]
    except OSError:
        return None
    return best_type


def syncfs(path: str) -> bool:
    """syncfs(2) on the file system holding ``path``: True once everything written to
    it is durable; False (nothing done) where that is not known to hold (see
    SYNCFS_FILE_SYSTEMS) or syncfs is unavailable, and the caller must fsync each
    file. Raises OSError if the sync itself fails."""
    if file_system_type(path) not in SYNCFS_FILE_SYSTEMS:
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def atomic_write(path: str, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` via ``path.tmp`` + fsync + rename (+ dir fsync)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def read_file_bytes(path: str) -> bytes:
    """The whole file, with os.open / os.read (no buffered or text file object: this runs
    for a few small files per partition at start-up). Raises what os.open raises."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _lines(path: str) -> list[str]:
    return read_file_bytes(path).decode("utf-8").split("\n")


def _read_versioned(path: str, parse_entry) -> list:
    """Parse version line, count line and ``count`` entry lines (version 0 only)."""
    lines = _lines(path)
    try:
        version = int(lines[0])
    except (ValueError, IndexError):
        raise CheckpointError(f"Malformed version line in checkpoint file {path}") from None
    if version != 0:
        raise CheckpointError(f"Unrecognized version of the checkpoint file ({path}): {version}")
    try:
        count = int(lines[1])
    except (ValueError, IndexError):
        raise CheckpointError(f"Malformed count line in checkpoint file {path}") from None
    if count < 0 or len(lines) < 2 + count:
        raise CheckpointError(f"Expected {count} entries in checkpoint file ({path}), found fewer")
    out = []
    for line in lines[2: 2 + count]:
        try:
            out.append(parse_entry(line))
        except (ValueError, IndexError):
            raise CheckpointError(f"Malformed line in checkpoint file ({path}): {line!r}") from None
    if any(l.strip() for l in lines[2 + count:]):
        raise CheckpointError(f"Expected {count} entries in checkpoint file ({path}), but found more")
    return out


class OffsetCheckpointFile:
    """``topic partition offset`` checkpoint (recovery point / log start / high watermark).

    Thread-safety: callers serialise writes per file (the LogManager does).
    """

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def encode(offsets: Mapping[tuple[str, int], int]) -> bytes:
        lines = ["0", str(len(offsets))]
        lines += [f"{t} {p} {o}" for (t, p), o in offsets.items()]
        return ("\n".join(lines) + "\n").encode()

    def write(self, offsets: Mapping[tuple[str, int], int]) -> None:
        atomic_write(self.path, self.encode(offsets))

    def read(self) -> dict[tuple[str, int], int]:
        """The checkpointed offsets; {} if the file does not exist."""
        def entry(line: str):
            topic, partition, offset = line.split(" ")
            return (topic, int(partition)), int(offset)

        try:
            return dict(_read_versioned(self.path, entry))
        except FileNotFoundError:
            return {}


class LeaderEpochCheckpointFile:
    """Per-partition ``epoch start_offset`` checkpoint."""

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def encode(entries: Iterable[tuple[int, int]]) -> bytes:
        entries = list(entries)
        lines = ["0", str(len(entries))] + [f"{e} {o}" for e, o in entries]
        return ("\n".join(lines) + "\n").encode()

    def write(self, entries: Iterable[tuple[int, int]], *, sync: bool = True) -> None:
        atomic_write(self.path, self.encode(entries), sync=sync)

    def read(self) -> list[tuple[int, int]]:
        def entry(line: str):
            epoch, offset = line.split(" ")
            return int(epoch), int(offset)

        try:
            return _read_versioned(self.path, entry)
        except FileNotFoundError:
            return []


def topic_id_to_str(topic_id: uuid.UUID | bytes) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 of the 16 bytes, no padding."""
    raw = topic_id.bytes if isinstance(topic_id, uuid.UUID) else bytes(topic_id)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@functools.lru_cache(maxsize=4096)
def topic_id_from_str(s: str) -> uuid.UUID:
    """Kafka's ``Uuid.fromString`` (cached: every partition of a topic reads the same)."""
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if len(raw) != 16:
        raise ValueError(f"invalid topic id {s!r}")
    return uuid.UUID(bytes=raw)


class PartitionMetadataFile:
    """``partition.metadata``: the topic id of a partition directory."""

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def encode(topic_id: uuid.UUID) -> bytes:
        return f"version: 0\ntopic_id: {topic_id_to_str(topic_id)}".encode()

    def write(self, topic_id: uuid.UUID, *, sync: bool = True) -> None:
        """Atomically and durably; with ``sync=False`` (a new partition directory, whose
        first flush fsyncs it) just written in place: a torn file reads as damaged and
        the broker rewrites it from the cluster metadata."""
        if sync:
            atomic_write(self.path, self.encode(topic_id))
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, self.encode(topic_id))
            finally:
                os.close(fd)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self) -> uuid.UUID:
        lines = [l for l in _lines(self.path) if l.strip()]
        try:
            k0, v0 = [x.strip() for x in lines[0].split(":", 1)]
            k1, v1 = [x.strip() for x in lines[1].split(":", 1)]
        except (ValueError, IndexError):
            raise CheckpointError(f"Malformed partition metadata file {self.path}") from None
        if k0 != "version" or v0 != "0":
            raise CheckpointError(f"Unrecognized version of partition metadata file {self.path}: {v0}")
        if k1 != "topic_id":
            raise CheckpointError(f"Malformed partition metadata file {self.path}")
        try:
            return topic_id_from_str(v1)
        except ValueError:
            raise CheckpointError(f"Invalid topic id in {self.path}: {v1!r}") from None


def _java_date(now: float) -> str:
    # java.util.Date.toString(): "EEE MMM dd HH:mm:ss zzz yyyy"
    return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(now))


def write_meta_properties(path: str, *, node_id: int, cluster_id: str,
                          directory_id: uuid.UUID | str | None = None, now: float | None = None) -> None:
    """Write a KRaft (version 1) ``meta.properties`` as Kafka does."""
    props = {"node.id": str(node_id), "directory.id": None, "version": "1", "cluster.id": cluster_id}
    if directory_id is None:
        props.pop("directory.id")
    else:
        props["directory.id"] = directory_id if isinstance(directory_id, str) else topic_id_to_str(directory_id)
    body = "#\n#" + _java_date(time.time() if now is None else now) + "\n"
    body += "".join(f"{k}={v}\n" for k, v in props.items())
    atomic_write(path, body.encode())


def read_meta_properties(path: str, *, require_version: bool = True) -> dict[str, str]:
    """Parse a Java properties file (the subset Kafka writes: comments, key=value)."""
    props = {}
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            for sep in ("=", ":"):
                if sep in line:
                    k, v = line.split(sep, 1)
                    props[k.strip()] = v.strip()
                    break
    if require_version and "version" not in props:
        raise CheckpointError(f"meta.properties {path} has no version")
    return props


def random_uuid() -> str:
    """Kafka's ``Uuid.randomUuid().toString()``: URL-safe base64 of 16 random bytes, no padding,
    never a reserved id (0, 1) and never starting with ``-`` (it would read as a CLI option)."""
    while True:
        raw = os.urandom(16)
        if int.from_bytes(raw, "big") <= 1:
            continue
        s = topic_id_to_str(raw)
        if not s.startswith("-"):
            return s


def random_directory_id(used: Iterable[str] = ()) -> str:
    """Kafka's ``Copier.generateValidDirectoryId``: a random Uuid that is not one of the
    reserved directory ids (``DirectoryId.reserved``: the first 100) nor in ``used``."""
    used = set(used)
    while True:
        s = random_uuid()
        if int.from_bytes(topic_id_from_str(s).bytes, "big") >= 100 and s not in used:
            return s


class MetaPropertiesError(CheckpointError):
    """A meta.properties that cannot be read (Kafka: MetaProperties.Builder's errors)."""


@dataclass(frozen=True)
class MetaProperties:
    """One directory's meta.properties (Kafka's ``MetaProperties``). ``version`` 0 is a
    ZooKeeper-mode file (its ``broker.id`` is ``node_id``), 1 a KRaft one."""

    version: int
    cluster_id: str | None
    node_id: int | None
    directory_id: str | None = None


def load_meta_properties(path: str) -> MetaProperties:
    """Read and check ``path`` as Kafka's ``MetaProperties.Builder(Properties)`` does.
    FileNotFoundError if absent; MetaPropertiesError (naming the file) if malformed."""
    props = read_meta_properties(path, require_version=False)
    raw = props.get("version", "0")
    try:
        version = int(raw.strip())
    except ValueError:
        raise MetaPropertiesError(f"Invalid meta.properties version string '{raw}' in {path}") from None
    if version not in (0, 1):
        raise MetaPropertiesError(f"Unknown meta.properties version number {version} in {path}")
    id_key = "broker.id" if version == 0 else "node.id"
    node_id = None
    if id_key in props:
        try:
            node_id = int(props[id_key])
        except ValueError:
            raise MetaPropertiesError(f"Unable to read {id_key} as a base-10 number in {path}") from None
    elif version == 1:
        raise MetaPropertiesError(f"Failed to find required property node.id in {path}")
    directory_id = props.get("directory.id")
    if directory_id is not None:
        try:
            topic_id_from_str(directory_id)
        except ValueError as e:
            raise MetaPropertiesError(f"Unable to read directory.id as a Uuid: {e} in {path}") from None
    cluster_id = props.get("cluster.id")
    if version == 1 and cluster_id is None:
        raise MetaPropertiesError(f"cluster.id was not specified in the v1 file: {path}")
    return MetaProperties(version, cluster_id, node_id, directory_id)


def write_clean_shutdown(log_dir: str, broker_epoch: int = -1) -> None:
    atomic_write(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE),
                 json.dumps({"version": 0, "brokerEpoch": broker_epoch}, separators=(",", ":")).encode())


def has_clean_shutdown(log_dir: str) -> bool:
    return os.path.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))


def remove_clean_shutdown(log_dir: str) -> None:
    try:
        os.unlink(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))
        fsync_dir(log_dir)
    except FileNotFoundError:
        pass
