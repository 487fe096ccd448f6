"""Nemesis: a seeded schedule of faults applied to broker processes while a workload runs.

Targets are objects with ``pid``, ``kill()`` and ``start()`` (``kbroker.testing``'s
process handles); proxies are :class:`kbroker.chaos.proxy.FaultProxy`. Faults:

- ``kill``: SIGKILL, then start the broker again on the same data (crash recovery);
- ``pause``: SIGSTOP for a while, then SIGCONT (a long GC pause / a frozen VM);
- ``partition``: a proxy cuts its broker off for a while, then heals.

One fault at a time, each followed by a quiet gap; ``run`` returns (healing anything still
applied) when ``stop`` is set or ``max_faults`` were applied. ``log`` lists what happened
as (seconds since start, fault, target) for the test's failure message. Only processes
the test started are signalled, by PID.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time


class Nemesis:
    def __init__(self, targets: dict, *, proxies: dict | None = None, seed: int = 0,
                 faults=("kill", "pause"), gap_s=(0.5, 2.0), fault_s=(0.5, 2.0), max_faults: int = 10):
        self.targets = dict(targets)
        self.proxies = dict(proxies or {})
        self.rnd = random.Random(seed)
        self.faults = tuple(faults)
        self.gap_s = gap_s
        self.fault_s = fault_s
        self.max_faults = max_faults
        self.log: list = []
        self._t0 = time.monotonic()

    def _note(self, what: str, target) -> None:
        self.log.append((round(time.monotonic() - self._t0, 2), what, target))

    def run(self, stop: threading.Event) -> None:
        applied = 0
        while not stop.is_set() and applied < self.max_faults:
            if stop.wait(self.rnd.uniform(*self.gap_s)):
                break
            fault = self.rnd.choice(self.faults)
            hold = self.rnd.uniform(*self.fault_s)
            if fault == "partition":
                name = self.rnd.choice(sorted(self.proxies))
                proxy = self.proxies[name]
                self._note("partition", name)
                proxy.partition()
                stop.wait(hold)
                proxy.heal()
                self._note("heal", name)
            else:
                name = self.rnd.choice(sorted(self.targets))
                proc = self.targets[name]
                if fault == "kill":
                    self._note("kill", name)
                    proc.kill()
                    stop.wait(hold)
                    proc.start()
                    self._note("restarted", name)
                elif fault == "pause":
                    self._note("pause", name)
                    os.kill(proc.pid, signal.SIGSTOP)
                    try:
                        stop.wait(hold)
                    finally:
                        os.kill(proc.pid, signal.SIGCONT)
                    self._note("resume", name)
                else:
                    raise ValueError(f"unknown fault {fault!r}")
            applied += 1
