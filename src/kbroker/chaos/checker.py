"""The queue-workload checker (Jepsen's Kafka "queue" workload, as applied to Kafka and
Kafka-compatible systems): given every send a run attempted and what a reader found in
each partition afterwards, say whether the broker kept its promises.

A *send* is (producer, sequence, value, partition) with an outcome: ``ok`` with the offset
the broker acknowledged, ``failed`` (a definite error: the record must not be there, but
with retries a failed send may still have been written, so it is only *allowed*), or
``unknown`` (a timeout: it may or may not be there). The *reads* are, per partition, the
(offset, value) pairs a consumer read from the log start to the end, in offset order.

Violations (each listed with examples; ``ok`` is True when all are empty):

- ``lost``: an acknowledged value that no read holds;
- ``reassigned``: an acknowledged value read at another offset or partition than the one
  acknowledged (offsets must never be reassigned);
- ``duplicated``: a value read more than once;
- ``reordered``: within one partition, two values of one producer read in the opposite
  order of their sequence numbers (idempotent producers keep per-partition order);
- ``unexpected``: a value read that no send produced;
- ``offsets``: a partition's reads whose offsets do not increase.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


class Send(NamedTuple):
    producer: int
    sequence: int
    value: bytes
    partition: int
    outcome: str          # OK, FAILED or UNKNOWN
    offset: int = -1      # the acknowledged offset (OK only)
    error: str = ""       # the client's error name (FAILED / UNKNOWN)


@dataclass
class Verdict:
    sends: int = 0
    acknowledged: int = 0
    failed: int = 0       # sends with a definite error
    unknown: int = 0      # sends that timed out
    read: int = 0
    lost: list = field(default_factory=list)
    reassigned: list = field(default_factory=list)
    duplicated: list = field(default_factory=list)
    reordered: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    errors: dict = field(default_factory=dict)   # error name -> sends (not acknowledged)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.reassigned or self.duplicated or self.reordered
                    or self.unexpected or self.offsets)

    def summary(self) -> str:
        parts = [f"{self.sends} sends, {self.acknowledged} acknowledged ({self.failed} failed, "
                 f"{self.unknown} unknown), {self.read} read"]
        if self.errors:
            parts.append(f"errors {dict(sorted(self.errors.items(), key=lambda kv: -kv[1]))}")
        for name in ("lost", "reassigned", "duplicated", "reordered", "unexpected", "offsets"):
            v = getattr(self, name)
            if v:
                parts.append(f"{len(v)} {name} (e.g. {v[:3]})")
        return "; ".join(parts)


def check(sends: Iterable[Send], reads: dict) -> Verdict:
    """``reads``: {partition: [(offset, value), ...] in offset order}."""
    sends = list(sends)
    v = Verdict(sends=len(sends))
    by_value = {}
    for s in sends:
        by_value[s.value] = s
    where: dict = {}
    for p, rows in sorted(reads.items()):
        last = -1
        for off, value in rows:
            v.read += 1
            if off <= last:
                v.offsets.append((p, last, off))
            last = off
            where.setdefault(value, []).append((p, off))
            if value not in by_value:
                v.unexpected.append((p, off, value))
    for value, places in where.items():
        if len(places) > 1:
            v.duplicated.append((value, places))
    for s in sends:
        if s.outcome != OK:
            if s.outcome == FAILED:
                v.failed += 1
            else:
                v.unknown += 1
            v.errors[s.error] = v.errors.get(s.error, 0) + 1
            continue
        v.acknowledged += 1
        places = where.get(s.value)
        if not places:
            v.lost.append((s.partition, s.offset, s.value))
        elif (s.partition, s.offset) not in places:
            v.reassigned.append((s.value, (s.partition, s.offset), places))
    # per partition and producer: sequence order must match offset order
    for p, rows in reads.items():
        last_seq: dict = {}
        for off, value in rows:
            s = by_value.get(value)
            if s is None:
                continue
            prev = last_seq.get(s.producer)
            if prev is not None and s.sequence < prev[0]:
                v.reordered.append((p, s.producer, prev, (s.sequence, off)))
            last_seq[s.producer] = (s.sequence, off)
    return v
