"""Malformed frames close only the offending connection; the broker keeps serving."""
import os
import random
import socket
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kbroker.testing import free_port
from tests.broker.kafka_helpers import consume_assigned, create_topic, produce


def _api_versions_v0(correlation_id=7):
    body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def _read_frame(sock, timeout=5):
    sock.settimeout(timeout)
    hdr = b""
    while len(hdr) < 4:
        chunk = sock.recv(4 - len(hdr))
        if not chunk:
            return None
        hdr += chunk
    (n,) = struct.unpack(">i", hdr)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def test_api_versions_raw(broker):
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(_api_versions_v0())
        resp = _read_frame(s)
    corr, err = struct.unpack_from(">ih", resp)
    assert (corr, err) == (7, 0)


def test_unknown_api_version_gets_unsupported_version(broker):
    # ApiVersions at a version from the future: answered as v0 with UNSUPPORTED_VERSION (35)
    body = struct.pack(">hhih", 18, 99, 11, 1) + b"x" + b"\x00" * 8
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        resp = _read_frame(s)
    corr, err = struct.unpack_from(">ih", resp)
    assert (corr, err) == (11, 35)
    (n,) = struct.unpack_from(">i", resp, 6)
    keys = [struct.unpack_from(">hhh", resp, 10 + 6 * i) for i in range(n)]
    assert (18, 0, 4) in keys


def test_unknown_api_key_answers_or_closes_only_that_connection(broker):
    body = struct.pack(">hhih", 999, 0, 5, 1) + b"x"
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        s.settimeout(5)
        try:
            s.recv(100)
        except (ConnectionResetError, socket.timeout):
            pass
    with socket.create_connection(("127.0.0.1", broker.port)) as s:
        s.sendall(_api_versions_v0())
        assert _read_frame(s) is not None


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_frames_never_break_the_broker(broker, seed):
    rnd = random.Random(seed)
    valid = _api_versions_v0()
    for _ in range(60):
        kind = rnd.randrange(4)
        if kind == 0:
            payload = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 64)))
            frame = struct.pack(">i", len(payload)) + payload
        elif kind == 1:
            b = bytearray(valid)
            for _ in range(rnd.randrange(1, 4)):
                b[rnd.randrange(4, len(b))] = rnd.randrange(256)
            frame = bytes(b)
        elif kind == 2:
            frame = struct.pack(">i", rnd.choice([-1, 0, 3, 2**31 - 1]))
        else:
            # a produce request header with garbage body
            body = struct.pack(">hhih", 0, rnd.randrange(0, 12), 1, 1) + b"x" + bytes(
                rnd.randrange(256) for _ in range(rnd.randrange(0, 80)))
            frame = struct.pack(">i", len(body)) + body
        with socket.create_connection(("127.0.0.1", broker.port)) as s:
            s.sendall(frame)
            s.settimeout(1.0)
            try:
                s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                pass
    # still serving real clients
    topic = f"fuzz-{seed}"
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [(0, None, b"alive", None)])
    assert [m.value() for m in consume_assigned(broker.bootstrap, topic, [0], 1)] == [b"alive"]


def test_bad_config_stops_startup_naming_the_key(tmp_path):
    for args, key in [(["--override", "no.such.key=1"], "no.such.key"),
                      (["--override", "num.io.threads=zero"], "num.io.threads"),
                      (["--config", str(tmp_path / "missing.properties")], "--config")]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        r = subprocess.run([sys.executable, "-m", "kbroker", "serve", *args], capture_output=True,
                           timeout=60, text=True, cwd=tmp_path, env=env)
        assert r.returncode != 0
        lines = [l for l in r.stderr.strip().splitlines() if l]
        assert len(lines) == 1, r.stderr
        assert key in lines[0]


_IMPORT_SHIM = '''
import importlib.abc
import sys


class _Refuse(importlib.abc.MetaPathFinder):
    """Makes {module} (and its submodules) fail to import, as a broken install would."""

    def find_spec(self, name, path=None, target=None):
        if name == {module!r} or name.startswith({module!r} + "."):
            raise ImportError("simulated: " + name + " is broken", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
'''


@pytest.mark.parametrize("module,component", [
    ("kbroker.coordinator.group", "group coordinator"),
    ("kbroker.server.apis.configs", "request handlers"),
    ("kbroker.server.fetch_session", "cannot start"),
])
def test_core_component_that_fails_to_import_stops_startup(tmp_path, module, component):
    """A core component that cannot be imported stops ``kbroker serve`` with one line naming
    it and a non-zero exit; the broker never serves without it."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_IMPORT_SHIM.format(module=module))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "kbroker", "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
                        "--override", f"log.dirs={tmp_path / 'logs'}"],
                       capture_output=True, timeout=120, text=True, cwd=tmp_path, env=env)
    assert r.returncode != 0, r.stdout[-3000:]
    lines = [l for l in r.stderr.strip().splitlines() if l]
    assert len(lines) == 1, r.stderr
    assert component in lines[0] and module in lines[0] and "failed to import" in lines[0], lines[0]
