"""The registry's in-memory state, a pure function of the ``_schemas`` records applied
in offset order (``apply``). Nothing else mutates it: a write goes to the topic first and
becomes visible when the reader thread applies it, on every instance alike.

Record keys and values are JSON (as Confluent's ``_schemas`` topic); the key names what
compaction keeps the latest of:

- ``{"keytype":"SCHEMA","subject":s,"version":v,"magic":1}`` -> ``{"subject","version","id",
  "schemaType","schema","references","deleted"}``; a null value (tombstone) is a hard delete;
- ``{"keytype":"CONFIG","subject":s|null,"magic":0}`` -> ``{"compatibilityLevel": L}`` or null;
- ``{"keytype":"MODE","subject":s|null,"magic":0}`` -> ``{"mode": M}`` or null.

Locking: ``lock`` (an RLock) guards every field; the reader thread holds it while applying
a record, request handlers while reading.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field


def schema_key(subject: str, version: int) -> bytes:
    return json.dumps({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1},
                      separators=(",", ":")).encode()


def config_key(subject: str | None) -> bytes:
    return json.dumps({"keytype": "CONFIG", "subject": subject, "magic": 0}, separators=(",", ":")).encode()


def mode_key(subject: str | None) -> bytes:
    return json.dumps({"keytype": "MODE", "subject": subject, "magic": 0}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class StoredSchema:
    """One schema id's content. ``references``: tuple of (name, subject, version)."""
    schema_type: str
    schema: str
    references: tuple = ()

    def body(self) -> dict:
        d: dict = {"schema": self.schema}
        if self.schema_type != "AVRO":
            d["schemaType"] = self.schema_type
        if self.references:
            d["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in self.references]
        return d


@dataclass
class SubjectVersion:
    version: int
    schema_id: int
    deleted: bool = False


@dataclass
class RegistryState:
    lock: threading.RLock = field(default_factory=threading.RLock)
    schemas: dict = field(default_factory=dict)        # id -> StoredSchema
    ids: dict = field(default_factory=dict)            # StoredSchema -> id
    subjects: dict = field(default_factory=dict)       # subject -> {version: SubjectVersion}
    configs: dict = field(default_factory=dict)        # subject | None -> level
    modes: dict = field(default_factory=dict)          # subject | None -> mode
    uses: dict = field(default_factory=dict)           # id -> {(subject, version): deleted}
    max_id: int = 0

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Apply one ``_schemas`` record; an unknown or malformed key is skipped (as a
        Confluent registry skips NOOP and other key types it does not know)."""
        try:
            k = json.loads(key)
            v = None if value is None else json.loads(value)
        except (TypeError, ValueError):
            return
        if not isinstance(k, dict):
            return
        kt = k.get("keytype")
        with self.lock:
            if kt == "SCHEMA":
                self._apply_schema(k["subject"], int(k["version"]), v)
            elif kt == "CONFIG":
                self._set(self.configs, k.get("subject"), None if v is None else v.get("compatibilityLevel"))
            elif kt == "MODE":
                self._set(self.modes, k.get("subject"), None if v is None else v.get("mode"))

    @staticmethod
    def _set(d: dict, subject, value) -> None:
        if value is None:
            d.pop(subject, None)
        else:
            d[subject] = value

    def _apply_schema(self, subject: str, version: int, v: dict | None) -> None:
        versions = self.subjects.setdefault(subject, {})
        old = versions.get(version)
        if old is not None:
            self.uses.get(old.schema_id, {}).pop((subject, version), None)
        if v is None:  # hard delete
            versions.pop(version, None)
            if not versions:
                del self.subjects[subject]
            return
        sid = int(v["id"])
        stored = StoredSchema(v.get("schemaType") or "AVRO", v["schema"],
                              tuple((r["name"], r["subject"], int(r["version"])) for r in v.get("references") or ()))
        self.schemas.setdefault(sid, stored)
        self.ids.setdefault(stored, sid)
        self.max_id = max(self.max_id, sid)
        versions[version] = SubjectVersion(version, sid, bool(v.get("deleted")))
        self.uses.setdefault(sid, {})[(subject, version)] = bool(v.get("deleted"))

    # -- queries (callers hold ``lock``) -----------------------------------------------------
    def live_versions(self, subject: str, deleted: bool = False) -> list[SubjectVersion]:
        return [sv for _, sv in sorted(self.subjects.get(subject, {}).items()) if deleted or not sv.deleted]

    def usages(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        return sorted(sv for sv, gone in self.uses.get(schema_id, {}).items() if deleted or not gone)

    def in_use(self, schema_id: int) -> bool:
        """Whether some version (soft-deleted ones included) still has this id."""
        return bool(self.uses.get(schema_id))

    def referenced_by(self, subject: str, version: int) -> list[int]:
        out = set()
        for s, vs in self.subjects.items():
            for sv in vs.values():
                if not sv.deleted and any(rs == subject and rv == version
                                          for _, rs, rv in self.schemas[sv.schema_id].references):
                    out.add(sv.schema_id)
        return sorted(out)
