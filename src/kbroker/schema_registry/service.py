"""SchemaRegistry: the operations behind the REST routes (register, look up, delete,
configure), raising ``RestError`` with Confluent's codes.

Writes take ``_write_lock`` (one writer per instance: the compatibility check, the id and
version allocation and the append are atomic on this instance) and go through the
``KafkaStore``; reads take the state's lock. Several instances against one cluster share
the state through ``_schemas``; only the elected leader writes (leader.py), the others
forward writes to it (app.py).

Ids: the same (type, schema string, references) always maps to one id, in every subject;
a new one is ``max id seen + 1``. Versions: 1 + the highest version the subject ever had
(soft-deleted ones included), as Confluent does.
"""
from __future__ import annotations

import json
import threading

from kbroker.schema_registry import compatibility, errors, formats
from kbroker.schema_registry.state import (
    RegistryState, StoredSchema, SubjectVersion, config_key, mode_key, schema_key,
)
from kbroker.schema_registry.store import KafkaStore

MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
MAX_VERSION = 2**31 - 1


def _dumps(d) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()


class SchemaRegistry:
    def __init__(self, store: KafkaStore, state: RegistryState, elector=None):
        self.store = store
        self.elector = elector  # LeaderElector, or None: this instance always writes
        self.state = state
        self._write_lock = threading.Lock()
        self._parsed: dict[int, object] = {}   # id -> parsed schema (cache; ids never change content)

    # -- helpers -------------------------------------------------------------------------
    def parse_version(self, subject: str, version: str, deleted: bool = False) -> SubjectVersion:
        """'latest' / -1 / 1..2^31-1 -> the subject's version (raises 40401/40402/42202)."""
        with self.state.lock:
            if version == "latest" or version == "-1":
                live = self.state.live_versions(subject, deleted)
                if not live:
                    raise errors.subject_not_found(subject)
                return live[-1]
            try:
                v = int(version)
            except ValueError:
                raise errors.invalid_version(version) from None
            if not 1 <= v <= MAX_VERSION:
                raise errors.invalid_version(version)
            if subject not in self.state.subjects or not self.state.live_versions(subject, deleted=True):
                raise errors.subject_not_found(subject)
            sv = self.state.subjects[subject].get(v)
            if sv is None or (sv.deleted and not deleted):
                raise errors.version_not_found(v)
            return sv

    def _resolve_refs(self, refs) -> tuple[tuple, list[tuple[str, str]]]:
        """(references as stored, [(name, text)] of every dependency, dependencies first)."""
        if refs is None:
            refs = []
        if not isinstance(refs, list):
            raise errors.invalid_schema("references must be a list")
        stored, texts, seen = [], [], set()

        def visit(name, subject, version, depth):
            if depth > 32:
                raise errors.invalid_schema("references nest too deep")
            try:
                sv = self.parse_version(subject, str(version))
            except errors.RestError:
                raise errors.invalid_schema(f"reference {name!r} to {subject} version {version} not found") from None
            target = self.state.schemas[sv.schema_id]
            for n, s, v in target.references:
                visit(n, s, v, depth + 1)
            if name not in seen:
                seen.add(name)
                texts.append((name, target.schema))
            return sv.version

        with self.state.lock:
            for r in refs:
                if not isinstance(r, dict) or not all(k in r for k in ("name", "subject", "version")):
                    raise errors.invalid_schema("a reference has name, subject and version")
                v = visit(str(r["name"]), str(r["subject"]), r["version"], 0)
                stored.append((str(r["name"]), str(r["subject"]), v))
        return tuple(stored), texts

    def parse_request(self, body, normalize: bool):
        """The request's schema parsed: (StoredSchema, parsed). Raises 42201."""
        if not isinstance(body, dict):
            raise errors.invalid_schema("the request body is a JSON object with a \"schema\" field")
        text = body.get("schema")
        schema_type = body.get("schemaType") or "AVRO"
        if not isinstance(text, str):
            raise errors.invalid_schema("Empty schema" if text is None else "the \"schema\" field is a string")
        if schema_type not in formats.TYPES:
            raise errors.invalid_schema(f"unknown schema type {schema_type!r}")
        refs, texts = self._resolve_refs(body.get("references"))
        try:
            parsed = formats.parse(schema_type, text, texts)
        except formats.SchemaParseError as e:
            raise errors.invalid_schema(f"{text[:200]!r}: {e}") from None
        form = parsed.normalized() if normalize else parsed.canonical()
        return StoredSchema(schema_type, form, refs), parsed

    def parsed(self, schema_id: int):
        p = self._parsed.get(schema_id)
        if p is None:
            s = self.state.schemas[schema_id]
            _, texts = self._resolve_refs([{"name": n, "subject": su, "version": v} for n, su, v in s.references])
            p = self._parsed[schema_id] = formats.parse(s.schema_type, s.schema, texts)
        return p

    def compatibility_level(self, subject: str | None) -> str:
        with self.state.lock:
            return self.state.configs.get(subject) or self.state.configs.get(None) or compatibility.DEFAULT_LEVEL

    def mode(self, subject: str | None) -> str:
        with self.state.lock:
            return self.state.modes.get(subject) or self.state.modes.get(None) or "READWRITE"

    def _check_writable(self, subject: str | None) -> None:
        if self.mode(subject) in ("READONLY", "READONLY_OVERRIDE"):
            raise errors.operation_not_permitted(f"Subject {subject} is in read-only mode" if subject
                                                 else "The registry is in read-only mode")

    # -- schemas ---------------------------------------------------------------------------
    def lookup(self, subject: str, body, normalize: bool, deleted: bool) -> dict:
        stored, _ = self.parse_request(body, normalize)
        with self.state.lock:
            if not self.state.live_versions(subject, deleted):
                raise errors.subject_not_found(subject)
            sid = self.state.ids.get(stored)
            for sv in reversed(self.state.live_versions(subject, deleted)):
                if sid is not None and sv.schema_id == sid:
                    return {"subject": subject, "id": sid, "version": sv.version, **stored.body()}
        raise errors.schema_not_found()

    def register(self, subject: str, body, normalize: bool) -> dict:
        self._check_writable(subject)
        stored, parsed = self.parse_request(body, normalize)
        if body.get("id") is not None or body.get("version") is not None:
            return self._import(subject, body, stored, parsed)
        with self._write_lock:
            with self.state.lock:
                live = self.state.live_versions(subject)
                existing_id = self.state.ids.get(stored)
                for sv in live:
                    if sv.schema_id == existing_id:
                        return {"id": existing_id}
                previous = [(sv.version, sv.schema_id) for sv in live]
                every = self.state.subjects.get(subject, {})
                version = max(every, default=0) + 1
                sid = existing_id if existing_id is not None else self.state.max_id + 1
            level = self.compatibility_level(subject)
            reasons = compatibility.check(level, parsed, [(v, self.parsed(i)) for v, i in previous])
            if reasons:
                raise errors.incompatible(subject, reasons)
            value = {"subject": subject, "version": version, "id": sid, "schemaType": stored.schema_type,
                     "schema": stored.schema, "deleted": False}
            if stored.references:
                value["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in stored.references]
            self.store.write(schema_key(subject, version), _dumps(value))
            self._parsed.setdefault(sid, parsed)
        return {"id": sid}

    def _import(self, subject: str, body, stored: StoredSchema, parsed) -> dict:
        """IMPORT mode: register under the given id (and version), as a migration from
        another registry does; no compatibility check. The id may already hold this very
        schema, never another one (42207)."""
        if self.mode(subject) != "IMPORT":
            raise errors.operation_not_permitted(f"Subject {subject} is not in import mode: a schema id or "
                                                 f"version can only be given in IMPORT mode")
        try:
            sid = int(body["id"]) if body.get("id") is not None else None
            version = int(body["version"]) if body.get("version") is not None else None
        except (TypeError, ValueError):
            raise errors.invalid_schema("id and version are integers") from None
        if version is not None and not 1 <= version <= MAX_VERSION:
            raise errors.invalid_version(str(version))
        if sid is not None and sid < 1:
            raise errors.invalid_schema(f"schema id {sid} is not positive")
        with self._write_lock:
            with self.state.lock:
                if sid is None:
                    sid = self.state.ids.get(stored, self.state.max_id + 1)
                held = self.state.schemas.get(sid)
                if held is not None and held != stored:
                    raise errors.id_does_not_match(f"Schema id {sid} already holds another schema; "
                                                       f"the imported schema does not match it")
                versions = self.state.subjects.get(subject, {})
                if version is None:
                    version = max(versions, default=0) + 1
                current = versions.get(version)
                if current is not None and current.schema_id != sid:
                    raise errors.operation_not_permitted(f"Subject {subject} already has a version {version} "
                                                         f"with another schema")
            value = {"subject": subject, "version": version, "id": sid, "schemaType": stored.schema_type,
                     "schema": stored.schema, "deleted": False}
            if stored.references:
                value["references"] = [{"name": n, "subject": s, "version": v} for n, s, v in stored.references]
            self.store.write(schema_key(subject, version), _dumps(value))
            self._parsed.setdefault(sid, parsed)
        return {"id": sid}

    def test_compatibility(self, subject: str, version: str | None, body, normalize: bool, verbose: bool) -> dict:
        _, parsed = self.parse_request(body, normalize)
        with self.state.lock:
            if version is None:
                against = [(sv.version, sv.schema_id) for sv in self.state.live_versions(subject)]
                level = self.compatibility_level(subject)
                if not level.endswith("_TRANSITIVE") and level != "NONE":
                    level += "_TRANSITIVE"  # the "all versions" endpoint checks every version
            else:
                if version in ("latest", "-1") and not self.state.live_versions(subject):
                    return {"is_compatible": True}
                sv = self.parse_version(subject, version)
                against = [(sv.version, sv.schema_id)]
                level = self.compatibility_level(subject)
        reasons = compatibility.check(level, parsed, [(v, self.parsed(i)) for v, i in against])
        out: dict = {"is_compatible": not reasons}
        if verbose:
            out["messages"] = reasons
        return out

    def schema_by_id(self, schema_id: int, fmt: str | None = None) -> dict:
        with self.state.lock:
            s = self.state.schemas.get(schema_id)
            if s is None or not self.state.in_use(schema_id):
                raise errors.schema_not_found(schema_id)
        body = s.body()
        if fmt == "serialized" and s.schema_type == "PROTOBUF":
            body["schema"] = self.parsed(schema_id).serialized()
        return body

    def version_body(self, subject: str, sv: SubjectVersion, fmt: str | None = None) -> dict:
        body = {"subject": subject, "version": sv.version, "id": sv.schema_id,
                **self.schema_by_id(sv.schema_id, fmt)}
        if sv.deleted:
            body["deleted"] = True
        return body

    # -- deletes ---------------------------------------------------------------------------
    def delete_version(self, subject: str, version: str, permanent: bool) -> int:
        self._check_writable(subject)
        with self._write_lock:
            # a numbered version is found even when soft-deleted (40406 / 40407 say which);
            # "latest" means the latest live one unless deleting permanently
            sv = self.parse_version(subject, version, deleted=permanent or version not in ("latest", "-1"))
            if permanent and not sv.deleted:
                raise errors.version_not_soft_deleted(subject, sv.version)
            if not permanent and sv.deleted:
                raise errors.version_soft_deleted(subject, sv.version)
            with self.state.lock:
                users = self.state.referenced_by(subject, sv.version)
            if users:
                raise errors.reference_exists(f"One or more references exist to the schema "
                                              f"{{subject={subject},version={sv.version}}}.")
            self._write_version_delete(subject, sv, permanent)
        return sv.version

    def _write_version_delete(self, subject: str, sv: SubjectVersion, permanent: bool) -> None:
        if permanent:
            self.store.write(schema_key(subject, sv.version), None)
            return
        s = self.state.schemas[sv.schema_id]
        value = {"subject": subject, "version": sv.version, "id": sv.schema_id, "schemaType": s.schema_type,
                 "schema": s.schema, "deleted": True}
        if s.references:
            value["references"] = [{"name": n, "subject": su, "version": v} for n, su, v in s.references]
        self.store.write(schema_key(subject, sv.version), _dumps(value))

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        self._check_writable(subject)
        with self._write_lock:
            with self.state.lock:
                every = self.state.live_versions(subject, deleted=True)
                live = [sv for sv in every if not sv.deleted]
                if not every:
                    raise errors.subject_not_found(subject)
                if permanent and live:
                    raise errors.subject_not_soft_deleted(subject)
                if not permanent and not live:
                    raise errors.subject_soft_deleted(subject)
                for sv in live:
                    if self.state.referenced_by(subject, sv.version):
                        raise errors.reference_exists(f"One or more references exist to the schema "
                                                      f"{{subject={subject},version={sv.version}}}.")
            targets = every if permanent else live
            for sv in targets:
                self._write_version_delete(subject, sv, permanent)
            if permanent:
                with self.state.lock:
                    has_config = subject in self.state.configs
                    has_mode = subject in self.state.modes
                if has_config:
                    self.store.write(config_key(subject), None)
                if has_mode:
                    self.store.write(mode_key(subject), None)
        return [sv.version for sv in targets]

    # -- config and mode -------------------------------------------------------------------
    def set_config(self, subject: str | None, body) -> dict:
        level = body.get("compatibility") if isinstance(body, dict) else None
        if level is None and isinstance(body, dict):
            level = body.get("compatibilityLevel")
        if not isinstance(level, str) or level.upper() not in compatibility.LEVELS:
            raise errors.invalid_compatibility_level()
        level = level.upper()
        with self._write_lock:
            self.store.write(config_key(subject), _dumps({"compatibilityLevel": level}))
        return {"compatibility": level}

    def get_config(self, subject: str | None, default_to_global: bool) -> dict:
        with self.state.lock:
            level = self.state.configs.get(subject)
        if level is None:
            if subject is not None and not default_to_global:
                raise errors.subject_compatibility_not_configured(subject)
            level = self.compatibility_level(None)
        return {"compatibilityLevel": level}

    def delete_config(self, subject: str | None) -> dict:
        with self.state.lock:
            level = self.state.configs.get(subject)
        if subject is not None and level is None:
            raise errors.subject_not_found(subject)
        with self._write_lock:
            self.store.write(config_key(subject), None)
        return {"compatibilityLevel": level or compatibility.DEFAULT_LEVEL}

    def set_mode(self, subject: str | None, body, force: bool) -> dict:
        mode = body.get("mode") if isinstance(body, dict) else None
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise errors.invalid_mode(mode)
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            with self.state.lock:
                nonempty = (self.state.live_versions(subject, True) if subject is not None
                            else any(self.state.subjects.values()))
            if nonempty:
                raise errors.operation_not_permitted("Cannot import since found existing subjects")
        with self._write_lock:
            self.store.write(mode_key(subject), _dumps({"mode": mode}))
        return {"mode": mode}

    def get_mode(self, subject: str | None, default_to_global: bool) -> dict:
        with self.state.lock:
            mode = self.state.modes.get(subject)
        if mode is None:
            if subject is not None and not default_to_global:
                raise errors.subject_mode_not_configured(subject)
            mode = self.mode(None)
        return {"mode": mode}

    def delete_mode(self, subject: str) -> dict:
        with self.state.lock:
            mode = self.state.modes.get(subject)
        if mode is None:
            raise errors.subject_not_found(subject)
        with self._write_lock:
            self.store.write(mode_key(subject), None)
        return {"mode": mode}
