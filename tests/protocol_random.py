"""Random message instances for protocol tests (a helper module, not a test file).

``build(cls, version, rnd)`` returns an instance of a generated top-level message whose
fields hold random values valid at ``version``: only fields present at that version are
set (the rest keep Kafka's defaults, which is what a decode yields), null only where the
version allows it, and, in flexible versions, some unknown tagged fields (tags the struct
does not define) so their preservation is exercised too.
"""
from __future__ import annotations

import importlib
import math
import random
import struct
import uuid

from kbroker.protocol.messages import MODULES

INT_RANGES = {
    "int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-2**31, 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-2**63, 2**63 - 1),
}
_TEXT = "abcxyzABC019._-/ é漢字🙂"


def all_message_classes():
    """Every generated top-level class: API messages, data messages, headers, records."""
    out = []
    for mod, names in MODULES.items():
        m = importlib.import_module("kbroker.protocol.messages." + mod)
        out.extend(getattr(m, n) for n in names)
    hdr = importlib.import_module("kbroker.protocol.headers")
    out += [hdr.RequestHeader, hdr.ResponseHeader]
    rec = importlib.import_module("kbroker.coordinator.records")
    out += [getattr(rec, n) for n in rec.__all__]
    return out


def versions_of(cls):
    lo, hi = cls.VALID_VERSIONS
    return range(lo, hi + 1)


def is_flexible(cls, version):
    f = cls.FLEXIBLE_VERSIONS
    return f is not None and f[0] <= version <= f[1]


def rand_int(rnd, kind):
    lo, hi = INT_RANGES[kind]
    r = rnd.random()
    if r < 0.15:
        return rnd.choice((lo, hi, 0, -1 if lo < 0 else 1))
    if r < 0.5:
        return rnd.randint(max(lo, -300), min(hi, 300))
    return rnd.randint(lo, hi)


def rand_float(rnd):
    while True:
        x = struct.unpack(">d", rnd.getrandbits(64).to_bytes(8, "big"))[0]
        if not math.isnan(x):
            return x if rnd.random() < 0.5 else rnd.uniform(-1e6, 1e6)


def rand_text(rnd):
    n = rnd.choice((0, 1, 3, 8, 20))
    return "".join(rnd.choice(_TEXT) for _ in range(n))


def rand_bytes(rnd, top=40):
    return rnd.randbytes(rnd.choice((0, 1, 5, top)))


def prim(rnd, kind):
    if kind in INT_RANGES:
        return rand_int(rnd, kind)
    if kind == "bool":
        return rnd.random() < 0.5
    if kind == "float64":
        return rand_float(rnd)
    if kind == "uuid":
        return uuid.UUID(int=rnd.getrandbits(128))
    if kind == "string":
        return rand_text(rnd)
    if kind in ("bytes", "records"):
        return rand_bytes(rnd)
    raise AssertionError(kind)


def build(cls, version, rnd: random.Random, flexible=None, depth=0, unknown_tags=True):
    if flexible is None:
        flexible = is_flexible(cls, version)
    kwargs = {}
    known_tags = set()
    for f in cls._fields:
        if f.tag is not None:
            known_tags.add(f.tag)
        if not f.present(version):
            continue
        if f.is_tagged(version) and rnd.random() < 0.4:
            continue  # leave the tagged field at its default: not written
        if f.is_nullable(version) and rnd.random() < 0.2:
            kwargs[f.attr] = None
            continue
        t = f.type
        if t.startswith("[]"):
            n = rnd.choice((0, 1, 2, 3) if depth < 2 else (0, 1))
            if f.struct is not None:
                kwargs[f.attr] = [build(f.struct, version, rnd, flexible, depth + 1, unknown_tags)
                                  for _ in range(n)]
            else:
                kwargs[f.attr] = [prim(rnd, t[2:]) for _ in range(n)]
        elif f.struct is not None:
            kwargs[f.attr] = build(f.struct, version, rnd, flexible, depth + 1, unknown_tags)
        else:
            kwargs[f.attr] = prim(rnd, t)
    if flexible and unknown_tags and rnd.random() < 0.3:
        unknown = {}
        for _ in range(rnd.choice((1, 2))):
            tag = rnd.choice((0, 1, 2, 3, 7, 100, 1000, 70000))
            while tag in known_tags:
                tag += 1
            unknown[tag] = rand_bytes(rnd, 10)
        kwargs["_unknown_tagged_fields"] = unknown
    return cls(**kwargs)
