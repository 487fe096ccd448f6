"""An idle broker sleeps: its threads block until there is work, instead of waking on
short poll timeouts (issue 23: idle CPU at 10,000 partitions is mostly these wake-ups;
an empty broker spent ~1% of a core in them).

Measured as voluntary context switches (/proc/<pid>/task/*/status): a thread that
blocks and is woken switches once per wake-up, whatever the machine's load.
"""
import os
import time

import pytest

from kbroker.testing import KBrokerProcess

pytestmark = pytest.mark.timeout(120)


def _switches(pid: int) -> dict[str, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        out[f"{tid} {name}"] = int(line.split()[1])
        except FileNotFoundError:
            continue
    return out


def test_idle_broker_threads_do_not_poll(tmp_path):
    with KBrokerProcess(data_dir=str(tmp_path), overrides={"num.partitions": 1}) as broker:
        broker.start(timeout_s=60)
        time.sleep(2.0)            # start-up work and its connections are over
        seconds = 4.0
        before = _switches(broker.pid)
        time.sleep(seconds)
        after = _switches(broker.pid)
        deltas = {t: after[t] - n for t, n in before.items() if t in after}
        rate = sum(deltas.values()) / seconds
        busiest = sorted(deltas.items(), key=lambda kv: -kv[1])[:8]
        # Left: the log manager's once-a-second scheduler tick and deletion task, and a
        # few periodic tasks (HW checkpoint every 5 s). Before: 8 request handlers
        # (300 ms), 5 purgatory reapers (200 ms), 3 network threads (300 ms), the
        # acceptor (500 ms) and 2 coordinator loaders (500 ms): ~65 wake-ups a second.
        assert rate < 15, f"{rate:.1f} wake-ups/s while idle; busiest threads: {busiest}"
