"""A FUSE pass-through file system that keeps what a power loss would keep (tests only).

Daemon: ``python3 tests/_powerloss_fs.py BACKING MOUNTPOINT STATE`` mounts
MOUNTPOINT (libfuse 3 through ``mfusepy``, single-threaded, foreground) and
passes every operation to the directory BACKING, which plays the page cache:
it holds everything written, synced or not. Beside it, STATE records only
what is durable, by the strict POSIX model:

* file data: a file's durable bytes and length are those it had at its last
  ``fsync``/``fdatasync`` (``msync`` of a shared mapping arrives as writes of
  the dirty pages, then an fsync). Later writes and truncations are not
  durable. A file never fsynced has no durable bytes.
* names: a directory's durable entries are those it had at its last fsync
  (``fsyncdir``); creating, renaming or unlinking a name is not durable
  before that. A directory never fsynced has no durable entries, so nothing
  in it survives. The mount's root directory always exists.
* not modelled: modes, owners and times (materialized files get defaults).

Files and directories are tracked by identity (the backing inode, re-keyed on
each create, so a reused inode number is a new file): a file renamed keeps its
durable bytes, a name fsynced in two directories appears in both.

STATE holds ``objects/<id>`` (durable bytes of file ``id``, written at each
fsync from the file's dirty ranges) and ``manifest.json`` (durable directory
entries, written at each fsyncdir and at unmount).

A power loss (:meth:`PowerLossFS.power_cut`): kill the writers, unmount,
then :func:`materialize` the durable tree into a fresh directory; optionally
with a torn tail (part of the unsynced appended bytes of some files reached
the disk: a prefix of what BACKING has past the durable length).
"""
from __future__ import annotations

import errno
import fnmatch
import json
import os
import shutil
import stat
import subprocess
import sys
import time

MANIFEST = "manifest.json"
OBJECTS = "objects"
HIDDEN_PREFIX = ".fuse_hidden"  # libfuse's name for an open file that was unlinked
_COPY_CHUNK = 1 << 20


class DurabilityTracker:
    """The durable state (see module docstring); one instance, single-threaded daemon."""

    def __init__(self, backing: str, state: str):
        self.backing = os.path.abspath(backing)
        self.state = os.path.abspath(state)
        os.makedirs(os.path.join(self.state, OBJECTS), exist_ok=True)
        self._next_id = 0
        self.id_of_ino: dict[int, int] = {}
        self.kinds: dict[int, str] = {}            # id -> "f" | "d"
        self.dirs: dict[int, dict[str, int]] = {}  # durable entries of each fsynced directory
        self.dirty: dict[int, list[list[int]]] = {}  # id -> [[start, end), ...] written since its last fsync
        self.trunc_min: dict[int, int] = {}        # id -> lowest size it was truncated to since its last fsync
        self.stats = {"writes": 0, "fsyncs": 0, "fsyncdirs": 0}
        # What is there at mount time is durable.
        self.root = self._new_id(os.lstat(self.backing))
        for dirpath, dirnames, filenames in os.walk(self.backing):
            did = self.id_of(os.lstat(dirpath))
            for name in filenames:
                fid = self.id_of(os.lstat(os.path.join(dirpath, name)))
                with open(os.path.join(dirpath, name), "rb") as src, open(self._object(fid), "wb") as dst:
                    shutil.copyfileobj(src, dst)
            self._snapshot_dir(did, dirpath)
        self.write_manifest()

    # -- identities -----------------------------------------------------------
    def _new_id(self, st: os.stat_result) -> int:
        self._next_id += 1
        i = self._next_id
        self.id_of_ino[st.st_ino] = i
        self.kinds[i] = "d" if stat.S_ISDIR(st.st_mode) else "f"
        return i

    def id_of(self, st: os.stat_result) -> int:
        i = self.id_of_ino.get(st.st_ino)
        return i if i is not None else self._new_id(st)

    def created(self, st: os.stat_result) -> int:
        """A new file or directory: a new identity even if the inode number was reused."""
        return self._new_id(st)

    def forget_ino(self, st: os.stat_result | None) -> None:
        """The last name of ``st`` is gone: its inode number may be reused."""
        if st is not None and (stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1):
            self.id_of_ino.pop(st.st_ino, None)

    def _object(self, fid: int) -> str:
        return os.path.join(self.state, OBJECTS, str(fid))

    # -- data ---------------------------------------------------------------
    def wrote(self, fid: int, offset: int, n: int) -> None:
        self.stats["writes"] += 1
        ranges = self.dirty.setdefault(fid, [])
        if ranges and ranges[-1][1] == offset:
            ranges[-1][1] = offset + n      # appends extend the last range
        else:
            ranges.append([offset, offset + n])

    def truncated(self, fid: int, old_size: int, new_size: int) -> None:
        low = min(old_size, new_size)
        self.trunc_min[fid] = min(self.trunc_min.get(fid, low), low)

    def sync_file(self, fid: int, fd: int) -> None:
        """fsync/fdatasync of ``fd`` (file ``fid``): its current bytes become durable."""
        self.stats["fsyncs"] += 1
        size = os.fstat(fd).st_size
        rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # fd may be write-only
        ofd = os.open(self._object(fid), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            low = self.trunc_min.pop(fid, None)
            if low is not None:
                os.ftruncate(ofd, min(low, size))
            os.ftruncate(ofd, size)           # bytes past a truncation read as zero
            for start, end in self.dirty.pop(fid, ()):
                end = min(end, size)
                while start < end:
                    buf = os.pread(rfd, min(_COPY_CHUNK, end - start), start)
                    if not buf:
                        break
                    os.pwrite(ofd, buf, start)
                    start += len(buf)
        finally:
            os.close(ofd)
            os.close(rfd)

    # -- names --------------------------------------------------------------
    def _snapshot_dir(self, did: int, path: str) -> None:
        entries = {}
        for name in os.listdir(path):
            if name.startswith(HIDDEN_PREFIX):
                continue
            try:
                entries[name] = self.id_of(os.lstat(os.path.join(path, name)))
            except FileNotFoundError:
                continue
        self.dirs[did] = entries

    def sync_dir(self, path: str) -> None:
        """fsync of directory ``path`` (backing path): its entries become durable."""
        self.stats["fsyncdirs"] += 1
        self._snapshot_dir(self.id_of(os.lstat(path)), path)
        self.write_manifest()

    def write_manifest(self) -> None:
        m = {"root": self.root, "kinds": self.kinds,
             "dirs": {str(d): e for d, e in self.dirs.items()}, "stats": self.stats}
        tmp = os.path.join(self.state, MANIFEST + ".tmp")
        with open(tmp, "w") as f:
            json.dump(m, f)
        os.replace(tmp, os.path.join(self.state, MANIFEST))


def _make_operations(backing: str, state: str):
    import mfusepy

    class PowerLossOperations(mfusepy.Operations):
        """Pass-through to ``backing``; durability events go to the tracker."""

        use_ns = True

        def __init__(self):
            self.backing = os.path.abspath(backing)
            self.t = DurabilityTracker(self.backing, state)

        def _p(self, path: str) -> str:
            return os.path.join(self.backing, path.lstrip("/"))

        @staticmethod
        def _lstat_or_none(p: str):
            try:
                return os.lstat(p)
            except FileNotFoundError:
                return None

        # -- metadata ----------------------------------------------------------
        def getattr(self, path, fh=None):
            st = os.fstat(fh) if fh is not None else os.lstat(self._p(path))
            return {"st_mode": st.st_mode, "st_nlink": st.st_nlink, "st_size": st.st_size,
                    "st_uid": st.st_uid, "st_gid": st.st_gid, "st_ino": st.st_ino,
                    "st_blocks": st.st_blocks, "st_blksize": st.st_blksize,
                    "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

        def access(self, path, amode):
            if not os.access(self._p(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path, mode):
            os.chmod(self._p(path), mode)
            return 0

        def chown(self, path, uid, gid):
            os.chown(self._p(path), uid, gid)
            return 0

        def utimens(self, path, times=None):
            if times is None:
                os.utime(self._p(path))
            else:
                os.utime(self._p(path), ns=times)
            return 0

        def statfs(self, path):
            sv = os.statvfs(self._p(path))
            return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        # -- directories ---------------------------------------------------------
        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._p(path))

        def mkdir(self, path, mode):
            p = self._p(path)
            os.mkdir(p, mode)
            self.t.created(os.lstat(p))
            return 0

        def rmdir(self, path):
            p = self._p(path)
            st = os.lstat(p)
            os.rmdir(p)
            self.t.forget_ino(st)
            return 0

        def fsyncdir(self, path, datasync, fh):
            self.t.sync_dir(self._p(path))
            return 0

        # -- names -----------------------------------------------------------------
        def unlink(self, path):
            p = self._p(path)
            st = os.lstat(p)
            os.unlink(p)
            self.t.forget_ino(st)
            return 0

        def rename(self, old, new):
            target = self._lstat_or_none(self._p(new))
            source = os.lstat(self._p(old))
            os.rename(self._p(old), self._p(new))
            if target is not None and target.st_ino != source.st_ino:
                self.t.forget_ino(target)
            return 0

        # -- files -----------------------------------------------------------------
        def create(self, path, mode, flags=None):
            p = self._p(path)
            existed = self._lstat_or_none(p)
            fd = os.open(p, (flags or os.O_WRONLY) | os.O_CREAT, mode)
            st = os.fstat(fd)
            fid = self.t.created(st) if existed is None else self.t.id_of(st)
            if existed is not None and flags is not None and flags & os.O_TRUNC:
                self.t.truncated(fid, existed.st_size, 0)
            return fd

        def open(self, path, flags):
            p = self._p(path)
            if flags & os.O_TRUNC:
                st = os.lstat(p)
                self.t.truncated(self.t.id_of(st), st.st_size, 0)
            return os.open(p, flags)

        def read(self, path, size, offset, fh):
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            n = os.pwrite(fh, data, offset)
            self.t.wrote(self.t.id_of(os.fstat(fh)), offset, n)
            return n

        def truncate(self, path, length, fh=None):
            p = self._p(path)
            st = os.lstat(p)
            os.truncate(p, length)
            self.t.truncated(self.t.id_of(st), st.st_size, length)
            return 0

        def flush(self, path, fh):
            return 0   # close(): not a durability point

        def release(self, path, fh):
            os.close(fh)
            return 0

        def fsync(self, path, datasync, fh):
            self.t.sync_file(self.t.id_of(os.fstat(fh)), fh)
            return 0

        def destroy(self, path):
            self.t.write_manifest()

    return PowerLossOperations()


# -- the durable tree ----------------------------------------------------------------------
def materialize(state: str, dest: str, *, backing: str | None = None, torn_glob: str | None = None,
                torn_bytes: int = 0) -> dict:
    """Write the durable tree recorded in ``state`` to the new directory ``dest``.

    With ``torn_glob``/``torn_bytes``/``backing``: each durable file whose name
    matches gets up to ``torn_bytes`` more of the bytes the same path in
    ``backing`` (the page cache at the cut) has past its durable length, if
    its durable bytes are a prefix of those (a partly written-back append).
    Returns the manifest's stats plus ``files``, ``durable_bytes``, ``torn_bytes``."""
    with open(os.path.join(state, MANIFEST)) as f:
        m = json.load(f)
    kinds = m["kinds"]
    out = dict(m["stats"], files=0, durable_bytes=0, torn_bytes=0)
    os.makedirs(dest)
    seen = set()

    def walk(did: int, out_dir: str, rel: str) -> None:
        if did in seen:   # a directory durably under two names: keep the first
            return
        seen.add(did)
        for name, fid in sorted(m["dirs"].get(str(did), {}).items()):
            target = os.path.join(out_dir, name)
            if kinds[str(fid)] == "d":
                os.mkdir(target)
                walk(fid, target, os.path.join(rel, name))
                continue
            obj = os.path.join(state, OBJECTS, str(fid))
            data = b""
            if os.path.exists(obj):
                with open(obj, "rb") as f:
                    data = f.read()
            out["files"] += 1
            out["durable_bytes"] += len(data)
            if torn_glob and torn_bytes > 0 and backing and fnmatch.fnmatch(name, torn_glob):
                try:
                    with open(os.path.join(backing, rel, name), "rb") as f:
                        cached = f.read()
                except FileNotFoundError:
                    cached = b""
                if cached.startswith(data) and len(cached) > len(data):
                    extra = cached[len(data): len(data) + torn_bytes]
                    data += extra
                    out["torn_bytes"] += len(extra)
            with open(target, "wb") as f:
                f.write(data)

    walk(m["root"], dest, "")
    return out


# -- driving the daemon from a test ------------------------------------------------------------
class PowerLossFS:
    """The daemon as a subprocess (started and stopped by its PID) mounted at ``mountpoint``."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self.backing = os.path.join(self.root, "backing")
        self.mountpoint = os.path.join(self.root, "mnt")
        self.state = os.path.join(self.root, "state")
        self.daemon_log = os.path.join(self.root, "powerloss-fs.log")
        self.proc: subprocess.Popen | None = None
        self.stats: dict = {}

    def start(self, timeout_s: float = 30.0) -> "PowerLossFS":
        for d in (self.backing, self.mountpoint, self.state):
            os.makedirs(d, exist_ok=True)
        env = dict(os.environ, FUSE_LIBRARY_NAME="fuse3")  # mfusepy would take libfuse 2 if present
        with open(self.daemon_log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), self.backing, self.mountpoint, self.state],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        deadline = time.monotonic() + timeout_s
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"FUSE daemon did not mount {self.mountpoint}:\n{self.read_log()[-3000:]}")
            time.sleep(0.05)
        return self

    def read_log(self) -> str:
        try:
            with open(self.daemon_log, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def unmount(self, timeout_s: float = 30.0) -> None:
        """Unmount (writers must be gone) and wait for the daemon to exit; it writes the manifest."""
        deadline = time.monotonic() + timeout_s
        while os.path.ismount(self.mountpoint):
            r = subprocess.run(["fusermount3", "-u", self.mountpoint], capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"fusermount3 -u {self.mountpoint} failed: {r.stderr.strip()}")
            time.sleep(0.1)
        if self.proc is not None:
            try:
                rc = self.proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"FUSE daemon did not exit after unmount:\n{self.read_log()[-3000:]}") from None
            self.proc = None
            if rc != 0:
                raise RuntimeError(f"FUSE daemon exited with {rc}:\n{self.read_log()[-3000:]}")

    def power_cut(self, dest: str, **torn) -> dict:
        """Unmount and write the durable state to ``dest`` (see :func:`materialize`)."""
        self.unmount()
        self.stats = materialize(self.state, dest, backing=self.backing, **torn)
        return self.stats

    def close(self) -> None:
        """Teardown: lazy-unmount if still mounted, kill the daemon by its PID. Idempotent."""
        if os.path.ismount(self.mountpoint):
            r = subprocess.run(["fusermount3", "-u", "-z", self.mountpoint], capture_output=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", self.mountpoint], capture_output=True)
        if self.proc is not None:
            if self.proc.poll() is None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None


def main(argv: list[str]) -> int:
    import mfusepy

    if len(argv) != 3:
        print("usage: _powerloss_fs.py BACKING MOUNTPOINT STATE", file=sys.stderr)
        return 2
    backing, mountpoint, state = argv
    mfusepy.FUSE(_make_operations(backing, state), mountpoint, foreground=True, nothreads=True,
                 fsname="powerloss")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
