"""Broker-side schema id validation: the Schema Registry half (beyond Apache Kafka).

A topic with ``kbroker.key.schema.validation`` / ``kbroker.value.schema.validation`` =
true (Confluent Server's ``confluent.*.schema.validation``) accepts a produce only if
every non-null key / value starts with the schema-registry header (magic byte 0, then a
4-byte big-endian schema id) naming a schema registered under the topic's subject
(TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``, the only strategy). Null keys
and values pass, as in Confluent Server (tombstones).

Who does what:

- the records kernel (``validate_batches(key_schema=..., value_schema=...)``) checks the
  header of every record in the walk it already does, listing failures in
  ``BatchInfo.record_errors`` and the batch's distinct ids in ``BatchInfo.schema_ids``;
- :class:`SchemaIdValidator` asks the registry about each distinct (subject, id) once,
  ``GET /schemas/ids/{id}/versions`` (the subject/version pairs using that schema):
  a registered id is cached for the life of the process (a schema id never changes
  meaning), a refused one for ``kbroker.schema.registry.negative.cache.ms``;
- :func:`check_schema_ids` (called by ReplicaManager._append_to_local_log after the
  kernel, before anything is appended) turns refused ids into per-record errors
  (INVALID_RECORD with record_errors, the whole batch refused) and an unreachable
  registry into REQUEST_TIMED_OUT (retriable: Kafka's code for "could not complete in
  time", nothing appended; the producer retries).

Blocking: the lookup runs on the request-handler thread, bounded by
``kbroker.schema.registry.request.timeout.ms`` (default 2 s) for the whole request;
after a failure the registry counts as down for ``DOWN_BACKOFF_S`` and produces to
validated topics are answered at once, without waiting again; the failure is logged
once per ``LOG_INTERVAL_S``. Lookups happen only on a cache miss (a new id), so the
steady state never leaves the process. Concurrent misses on one id share one request.

Payload check (``kbroker.key/value.schema.validation.payload`` = true, beyond Confluent's
Schema ID Validation, which does not look at the data): each key/value must also decode
with its schema: AVRO with fastavro (every byte consumed), JSON with ``jsonschema``
(references not resolved: such a schema only requires well-formed JSON); PROTOBUF is
not decoded (its header check still applies). The schema of an id is fetched once
(``GET /schemas/ids/{id}``, references through ``/subjects/{s}/versions/{v}``) and kept.
This runs in Python over decoded records: it costs per record, see the README.

Thread-safety: ``_lock`` guards the caches and the in-flight table; HTTP requests are
made without it (two threads may fetch one schema for the payload check at once; the
answers are equal).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from kbroker.kernels import records as _records
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)

#: after a failed lookup, answer "unavailable" without asking for this long
DOWN_BACKOFF_S = 0.5
#: an unreachable registry is logged at most once per this interval
LOG_INTERVAL_S = 30.0
#: refused ids remembered at most (expired answers are dropped beyond this)
_MAX_REFUSED = 10_000
_ACCEPT = "application/vnd.schemaregistry.v1+json, application/json"


class RegistryUnavailable(Exception):
    """The Schema Registry could not be asked (connection, timeout, 5xx, bad answer)."""


def subject(topic: str, kind: int) -> str:
    """TopicNameStrategy."""
    return f"{topic}-key" if kind == _records.SCHEMA_KEY else f"{topic}-value"


class SchemaIdValidator:
    """Answers "is schema id X registered under subject S?" with caches (see the module
    docstring). ``urls``: registry base URLs, tried in turn on a connection failure."""

    def __init__(self, urls, timeout_ms: int = 2000, negative_cache_ms: int = 5000,
                 clock=time.monotonic):
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_ms / 1000.0
        self.negative_ttl_s = negative_cache_ms / 1000.0
        self._clock = clock
        self._lock = threading.Lock()
        self._registered: set[tuple[str, int]] = set()    # (subject, id): for good
        self._refused: dict[tuple[str, int], float] = {}  # (subject, id) -> until when it stays refused
        self._inflight: dict[int, threading.Event] = {}   # id -> set when its lookup ends
        self._down_until = 0.0
        self._down_reason = ""
        self._last_log = -LOG_INTERVAL_S
        self.lookups = 0                                  # registry requests made (tests, bench)
        self._decoders: dict[int, object] = {}            # id -> decode(bytes) (payload check)

    def refused(self, topic: str, schema_ids) -> set[tuple[int, int]]:
        """The (kind, id) of ``schema_ids`` not registered under the topic's subjects.
        Raises RegistryUnavailable when an answer is needed and the registry cannot give
        one within the timeout (the whole call, all ids, is bounded by it)."""
        bad = set()
        deadline = None
        for kind, sid in schema_ids:
            key = (subject(topic, kind), sid)
            while True:
                with self._lock:
                    if key in self._registered:
                        break
                    now = self._clock()
                    if self._refused.get(key, 0.0) > now:
                        bad.add((kind, sid))
                        break
                    if now < self._down_until:
                        raise RegistryUnavailable(self._down_reason)
                    waiting = self._inflight.get(sid)
                    if waiting is None:
                        self._inflight[sid] = threading.Event()
                if deadline is None:
                    deadline = now + self.timeout_s
                if waiting is not None:  # another thread is asking about this id: wait for its answer
                    if not waiting.wait(max(0.0, deadline - self._clock())):
                        raise RegistryUnavailable("Schema Registry lookup timed out")
                    continue
                try:
                    subjects = self._fetch(sid, max(0.05, deadline - now))
                except RegistryUnavailable as e:
                    self._mark_down(str(e))
                    raise
                else:
                    with self._lock:
                        self._registered.update((s, sid) for s in subjects)
                        if key[0] not in subjects:
                            now = self._clock()
                            if len(self._refused) >= _MAX_REFUSED:
                                self._refused = {k: t for k, t in self._refused.items() if t > now}
                            self._refused[key] = now + self.negative_ttl_s
                finally:
                    with self._lock:
                        self._inflight.pop(sid).set()
                if key[0] not in subjects:
                    bad.add((kind, sid))
                break
        return bad

    def decoder(self, sid: int):
        """``decode(data)`` for schema ``sid`` (raises ValueError when ``data``, the bytes
        after the header, does not decode), or None for a type not decoded (PROTOBUF).
        Raises RegistryUnavailable when the schema cannot be fetched."""
        dec = self._decoders.get(sid, _MISSING)
        if dec is _MISSING:
            if self._clock() < self._down_until:
                raise RegistryUnavailable(self._down_reason)
            try:
                body = self._get(f"/schemas/ids/{sid}", self.timeout_s)
                dec = _make_decoder(body, lambda ref: self._get(
                    f"/subjects/{urllib.parse.quote(ref['subject'], safe='')}/versions/{int(ref['version'])}",
                    self.timeout_s))
            except RegistryUnavailable as e:
                self._mark_down(str(e))
                raise
            except Exception as e:  # a schema this broker cannot load (or no fastavro): not decoded
                log.warning("schema id %d: payloads not checked, its schema does not load here: %s: %s",
                            sid, type(e).__name__, e)
                dec = None
            self._decoders[sid] = dec
        return dec

    def _get(self, path: str, timeout_s: float) -> dict:
        last = "no Schema Registry URL configured"
        for base in self.urls:
            req = urllib.request.Request(base + path, headers={"Accept": _ACCEPT})
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                last = f"{base}{path}: HTTP {e.code}"
            except (OSError, ValueError) as e:
                last = f"{base}{path}: {e}"
        raise RegistryUnavailable(last)

    def _mark_down(self, reason: str) -> None:
        with self._lock:
            now = self._clock()
            self._down_until = now + DOWN_BACKOFF_S
            self._down_reason = reason
            if now - self._last_log >= LOG_INTERVAL_S:
                self._last_log = now
                log.warning("Schema Registry unreachable, produces to schema-validated topics are "
                            "answered REQUEST_TIMED_OUT: %s", reason)

    def _fetch(self, sid: int, timeout_s: float) -> set[str]:
        """The subjects schema ``sid`` is registered under (empty: unknown id)."""
        self.lookups += 1
        last = "no Schema Registry URL configured"
        for base in self.urls:
            url = f"{base}/schemas/ids/{sid}/versions"
            req = urllib.request.Request(url, headers={"Accept": _ACCEPT})
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    body = json.loads(resp.read())
                return {str(e["subject"]) for e in body}
            except urllib.error.HTTPError as e:
                if e.code == 404:  # 40403 schema not found
                    return set()
                last = f"{url}: HTTP {e.code}"
            except (OSError, ValueError, KeyError, TypeError) as e:
                last = f"{url}: {e}"
        raise RegistryUnavailable(last)


def from_config(config) -> SchemaIdValidator | None:
    """The broker's validator, None without ``kbroker.schema.registry.url``."""
    urls = config["kbroker.schema.registry.url"]
    if not urls:
        return None
    return SchemaIdValidator(urls, config["kbroker.schema.registry.request.timeout.ms"],
                             config["kbroker.schema.registry.negative.cache.ms"])


_MISSING = object()


def _make_decoder(body: dict, fetch_ref):
    """decode(data) for the schema ``body`` (a /schemas/ids/{id} answer); see decoder()."""
    kind = body.get("schemaType") or "AVRO"
    text = body["schema"]
    if kind == "AVRO":
        import io

        import fastavro

        named: dict = {}

        def parse_refs(refs, depth=0):
            for ref in refs or ():
                if depth > 32:
                    raise RegistryUnavailable("schema references nested too deep")
                sub = fetch_ref(ref)
                parse_refs(sub.get("references"), depth + 1)
                fastavro.parse_schema(json.loads(sub["schema"]), named)

        def load(t):
            try:
                return json.loads(t)
            except ValueError:
                return t  # a bare primitive name

        parse_refs(body.get("references"))
        parsed = fastavro.parse_schema(load(text), named)
        reader = fastavro.schemaless_reader

        def decode(data):
            bio = io.BytesIO(data)
            try:
                reader(bio, parsed)
            except Exception as e:  # fastavro raises EOFError, UnicodeDecodeError, ValueError ...
                raise ValueError(f"{type(e).__name__}: {e}") from None
            left = len(data) - bio.tell()
            if left:
                raise ValueError(f"{left} bytes left after the Avro datum")
        return decode
    if kind == "JSON":
        import jsonschema

        doc = json.loads(text)
        validator = None
        if not body.get("references"):
            cls = jsonschema.validators.validator_for(doc)
            validator = cls(doc)

        def decode(data):
            try:
                value = json.loads(data)
            except ValueError as e:
                raise ValueError(f"not JSON: {e}") from None
            if validator is not None:
                err = jsonschema.exceptions.best_match(validator.iter_errors(value))
                if err is not None:
                    raise ValueError(err.message)
        return decode
    return None


def check_schema_ids(validator: SchemaIdValidator | None, tp, buf, infos, payload=(False, False)):
    """After the kernel's walk found every header well-formed: (error code, message,
    record_errors) when the registry refuses an id the batches carry, or cannot be asked;
    None when every id is registered under its subject (or there are none: all null).
    ``payload``: (keys, values) whose data must also decode with their schema."""
    ids = set()
    for info in infos:
        ids.update(info.schema_ids)
    if not ids:
        return None
    topic = tp[0]
    if validator is None:
        return (ErrorCode.REQUEST_TIMED_OUT, f"Topic {topic} has schema validation on, but the broker has no "
                "Schema Registry (kbroker.schema.registry.url is not set)", ())
    try:
        bad = validator.refused(topic, sorted(ids))
    except RegistryUnavailable as e:
        return ErrorCode.REQUEST_TIMED_OUT, f"Schema Registry unavailable, schema ids not validated: {e}", ()
    from kbroker.server.log_validator import invalid_record_error
    if not bad:
        if not (payload[0] or payload[1]):
            return None
        try:
            errors = _payload_errors(validator, buf, infos, payload)
        except RegistryUnavailable as e:
            return ErrorCode.REQUEST_TIMED_OUT, f"Schema Registry unavailable, payloads not validated: {e}", ()
        if not errors:
            return None
        e = invalid_record_error(errors)
        return e.code, e.message, e.record_errors
    errors = []
    for info in infos:  # the error path only: find the records that carry a refused id
        mv = memoryview(buf).cast("B")[info.position:info.position + info.size_in_bytes]
        for i, r in enumerate(_records.decode_batch(mv).records):
            for kind, data in ((_records.SCHEMA_KEY, r.key), (_records.SCHEMA_VALUE, r.value)):
                if data is None or len(data) < 5:
                    continue
                sid = int.from_bytes(data[1:5], "big", signed=True)
                if (kind, sid) in bad:
                    errors.append((i, f"Record {i}: {'key' if kind == _records.SCHEMA_KEY else 'value'} "
                                      f"schema id {sid} is not registered under subject {subject(topic, kind)}"))
                    break
    e = invalid_record_error(errors)
    return e.code, e.message, e.record_errors


def _payload_errors(validator: SchemaIdValidator, buf, infos, payload) -> list[tuple[int, str]]:
    """[(index, message)] of the records whose key/value does not decode with its schema."""
    errors = []
    fields = [(kind, on) for kind, on in ((_records.SCHEMA_KEY, payload[0]), (_records.SCHEMA_VALUE, payload[1]))
              if on]
    for info in infos:
        mv = memoryview(buf).cast("B")[info.position:info.position + info.size_in_bytes]
        for i, r in enumerate(_records.decode_batch(mv).records):
            for kind, _on in fields:
                data = r.key if kind == _records.SCHEMA_KEY else r.value
                if data is None:
                    continue
                sid = int.from_bytes(data[1:5], "big", signed=True)
                dec = validator.decoder(sid)
                if dec is None:
                    continue
                try:
                    dec(data[5:])
                except ValueError as e:
                    what = "key" if kind == _records.SCHEMA_KEY else "value"
                    errors.append((i, f"Record {i}: {what} does not decode with schema id {sid}: {e}"))
                    break
    return errors
