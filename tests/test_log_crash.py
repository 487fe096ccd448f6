"""SIGKILL a writer at random moments; every acknowledged append must survive.

The writer (tests/_log_crash_writer.py) runs with kbroker.log.fsync.every.append,
so an acknowledged append is fsynced. After each kill the log is reopened
(unclean start: recovery scans from the recovery point) and must hold every
acknowledged record, readable, with offsets contiguous from 0 and no partial
batch exposed.
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from kbroker.kernels import records
from kbroker.log import LogConfig, LogManager

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run_round(log_dir, rnd, seed):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "_log_crash_writer.py"), log_dir, str(seed)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    acked = -1
    try:
        line = p.stdout.readline().decode()
        assert line.startswith("ready"), (line, p.stderr.read().decode()[-2000:] if p.poll() is not None else "")
        start = int(line.split()[1])
        kill_after = time.monotonic() + rnd.uniform(0.02, 0.4)
        expected_next = start
        while time.monotonic() < kill_after:
            line = p.stdout.readline()
            if not line:
                break
            first, last = map(int, line.split())
            assert first == expected_next, "writer got a gap or duplicate offset"
            expected_next = last + 1
            acked = last
        os.kill(p.pid, signal.SIGKILL)
        # Lines already in the pipe were acknowledged before the kill.
        rest = p.stdout.read().decode().split("\n")
        for line in rest:
            if line.strip():
                first, last = map(int, line.split())
                assert first == expected_next
                expected_next = last + 1
                acked = last
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    return acked


def verify(log_dir, acked):
    lm = LogManager([log_dir], LogConfig({"segment.bytes": 256 * 1024}), background=False)
    lm.startup()
    try:
        lg = lm.get_log(("crash", 0))
        assert lg.log_end_offset >= acked + 1
        expect = 0
        off = 0
        while off < lg.log_end_offset:
            data = lg.read(off, 1 << 20).records.read_bytes()
            batches = records.decode_batches(data)          # CRC checked
            assert batches
            for b in batches:
                for r in b.records:
                    assert r.offset == expect, "gap or duplicate"
                    assert r.value.split(b"|")[0] == b"%d" % r.offset
                    expect += 1
            off = expect
        # nothing but whole batches on disk
        assert sum(s.size for s in lg.segments) == sum(
            os.path.getsize(s.log_path) for s in lg.segments)
        return lg.log_end_offset
    finally:
        lm.get_log(("crash", 0)).close()   # no clean-shutdown marker: next round recovers again


def crash_rounds(tmp_path, rounds, budget_s):
    log_dir = str(tmp_path / "logs")
    rnd = random.Random(1234)
    deadline = time.monotonic() + budget_s
    total_acked = -1
    done = 0
    for i in range(rounds):
        if time.monotonic() > deadline:
            break
        acked = run_round(log_dir, rnd, i)
        total_acked = max(total_acked, acked)
        leo = verify(log_dir, total_acked)
        assert leo >= total_acked + 1
        done += 1
    assert done >= 3 and total_acked > 0
    return done


def test_sigkill_fsync_mode(tmp_path):
    crash_rounds(tmp_path, rounds=12, budget_s=15)


@pytest.mark.slow
def test_sigkill_fsync_mode_many_rounds(tmp_path):
    # 30 rounds keep the suite's time; crash_rounds(rounds=100, budget_s=240) is the soak run
    crash_rounds(tmp_path, rounds=30, budget_s=120)
