"""A real ``kbroker schema-registry`` process for tests and benchmarks: 127.0.0.1, a free
port, started with ``subprocess.Popen`` and stopped by its own PID only."""
from __future__ import annotations

import os
import sys
import tempfile

from kbroker.testing import _Process, free_port


class SchemaRegistryProcess(_Process):
    def __init__(self, bootstrap: str, port: int | None = None, extra_args: list[str] | None = None):
        self.bootstrap_servers = bootstrap
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self._tmp = tempfile.TemporaryDirectory(prefix="kbroker-sr-")
        self.log_path = os.path.join(self._tmp.name, "registry.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "SchemaRegistryProcess":
        argv = [sys.executable, "-m", "kbroker", "schema-registry", "--bootstrap-servers", self.bootstrap_servers,
                "--listeners", self.url, *self.extra_args]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        try:
            self._spawn(argv, env, self.log_path, timeout_s)
        except Exception as e:
            raise RuntimeError(f"{e}; registry log tail:\n{self.read_log()[-3000:]}") from None
        return self

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def __exit__(self, *exc):
        self.terminate()
        self._tmp.cleanup()
