"""Compatibility levels (Confluent's names) and the check of a new schema against a
subject's earlier versions.

BACKWARD: the new schema reads data written with the latest version; FORWARD: the
latest version reads data written with the new one; FULL: both. The ``_TRANSITIVE``
variants check every earlier (not soft-deleted) version instead of the latest only.
NONE checks nothing.
"""
from __future__ import annotations

LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
          "FULL_TRANSITIVE")
DEFAULT_LEVEL = "BACKWARD"


def check(level: str, new, previous: list[tuple[int, object]]) -> list[str]:
    """``previous``: (version, parsed schema), oldest first. Returns the reasons the new
    schema is incompatible (empty: compatible)."""
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    base = level.split("_")[0]
    out: list[str] = []
    for version, old in reversed(against):
        reasons = []
        if base in ("BACKWARD", "FULL"):
            reasons += new.incompatibilities(old)
        if base in ("FORWARD", "FULL"):
            reasons += old.incompatibilities(new)
        if reasons:
            out += reasons + [f"{{oldSchemaVersion: {version}}}", f"{{oldSchema: '{old.canonical()}'}}",
                              f"{{compatibility: '{level}'}}"]
    return out
