"""JSON schemas: checked against their own draft's meta-schema with ``jsonschema``;
references resolve through a ``referencing`` registry keyed by each reference's name.

Compatibility (reader = the schema that must accept what the writer allowed) follows the
open/closed content-model rules Confluent documents for JSON Schema; each reason names
its rule (``TYPE_CHANGED``, ``REQUIRED_ATTRIBUTE_ADDED``, ``PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL`` …).
Covered: type (integer widens to number), object properties / required /
additionalProperties, enum, string and number bounds, array items and bounds,
``oneOf``/``anyOf`` alternatives. ``$ref`` inside a schema is compared by its string.
"""
from __future__ import annotations

import json

import jsonschema
import jsonschema.exceptions
import referencing
import referencing.jsonschema

from kbroker.schema_registry.formats import SchemaParseError


def _load(text: str):
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SchemaParseError(f"JSON parse error: {e}") from None
    if not isinstance(doc, (dict, bool)):
        raise SchemaParseError("a JSON schema is an object or a boolean")
    return doc


class JsonSchema:
    schema_type = "JSON"

    def __init__(self, text: str, references=()):
        self.text = text
        self.doc = _load(text)
        resources = []
        for name, ref_text in references:
            resources.append((name, referencing.jsonschema.specification_with(
                "https://json-schema.org/draft/2020-12/schema").create_resource(_load(ref_text))))
        self.registry = referencing.Registry().with_resources(resources)
        cls = jsonschema.validators.validator_for(self.doc, default=jsonschema.Draft7Validator)
        try:
            cls.check_schema(self.doc)
        except jsonschema.exceptions.SchemaError as e:
            raise SchemaParseError(f"{e.message} at {'/'.join(map(str, e.absolute_path)) or '/'}") from None
        self.validator = cls(self.doc, registry=self.registry)

    def canonical(self) -> str:
        return json.dumps(self.doc, separators=(",", ":"))

    def normalized(self) -> str:
        return json.dumps(self.doc, separators=(",", ":"), sort_keys=True)

    def validate(self, instance) -> None:
        self.validator.validate(instance)

    def incompatibilities(self, writer: "JsonSchema") -> list[str]:
        out: list[str] = []
        _check(self.doc, writer.doc, "#", out)
        return [f"{{errorType:'{kind}', description:'{desc}'}}" for kind, desc in out]


def _types(s) -> set | None:
    if s is True or s == {}:
        return None  # anything
    if s is False:
        return set()
    t = s.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _covers(reader_types, writer_types) -> bool:
    if reader_types is None:
        return True
    if writer_types is None:
        return False
    for t in writer_types:
        if t in reader_types or (t == "integer" and "number" in reader_types):
            continue
        return False
    return True


def _bound(out, path, r, w, key, narrower, rule):
    """``narrower(rv, wv)``: True when the reader's bound rejects values the writer's allowed."""
    rv, wv = r.get(key), w.get(key)
    if rv is None:
        return
    if wv is None:
        out.append((f"{rule}_ADDED", f"{key} {rv} added at {path}"))
    elif narrower(rv, wv):
        out.append((f"{rule}_NARROWED", f"{key} changed from {wv} to {rv} at {path}"))


def _check(r, w, path: str, out: list) -> None:
    """Append (rule, description) for every way ``w``-valid data can fail ``r``."""
    if r is True or r == {} or r == w:
        return
    if w is False:
        return
    if r is False:
        out.append(("SCHEMA_NARROWED", f"reader accepts nothing at {path}"))
        return
    if w is True:
        w = {}
    for comb in ("oneOf", "anyOf"):
        if comb in r or comb in w:
            ralts, walts = r.get(comb, [r]), w.get(comb, [w])
            for i, wa in enumerate(walts):
                if not any(not _collect(ra, wa, f"{path}/{comb}/{i}") for ra in ralts):
                    out.append(("COMBINED_TYPE_SUBSCHEMAS_CHANGED",
                                f"alternative {i} of {path} is accepted by no reader alternative"))
            return
    if "$ref" in r or "$ref" in w:
        if r.get("$ref") != w.get("$ref"):
            out.append(("REFERENCE_CHANGED", f"$ref changed at {path}"))
        return
    rt, wt = _types(r), _types(w)
    if not _covers(rt, wt):
        kind = "TYPE_NARROWED" if rt and wt and rt < wt else "TYPE_CHANGED"
        out.append((kind, f"type {sorted(wt) if wt else 'any'} changed to {sorted(rt)} at {path}"))
        return
    if "enum" in r:
        if "enum" not in w:
            out.append(("ENUM_ARRAY_ADDED", f"enum added at {path}"))
        elif not all(v in r["enum"] for v in w["enum"]):
            out.append(("ENUM_ARRAY_NARROWED", f"enum values removed at {path}"))
    if "const" in r and r.get("const") != w.get("const"):
        out.append(("CONST_CHANGED", f"const changed at {path}"))
    lt, gt = (lambda a, b: a < b), (lambda a, b: a > b)
    _bound(out, path, r, w, "maxLength", lt, "MAX_LENGTH")
    _bound(out, path, r, w, "minLength", gt, "MIN_LENGTH")
    _bound(out, path, r, w, "maximum", lt, "MAXIMUM")
    _bound(out, path, r, w, "minimum", gt, "MINIMUM")
    _bound(out, path, r, w, "exclusiveMaximum", lt, "EXCLUSIVE_MAXIMUM")
    _bound(out, path, r, w, "exclusiveMinimum", gt, "EXCLUSIVE_MINIMUM")
    _bound(out, path, r, w, "maxItems", lt, "MAX_ITEMS")
    _bound(out, path, r, w, "minItems", gt, "MIN_ITEMS")
    _bound(out, path, r, w, "maxProperties", lt, "MAX_PROPERTIES")
    _bound(out, path, r, w, "minProperties", gt, "MIN_PROPERTIES")
    if "pattern" in r and r.get("pattern") != w.get("pattern"):
        out.append(("PATTERN_ADDED" if "pattern" not in w else "PATTERN_CHANGED", f"pattern at {path}"))
    if "items" in r or "items" in w:
        ri, wi = r.get("items", True), w.get("items", True)
        if isinstance(ri, (dict, bool)) and isinstance(wi, (dict, bool)):
            _check(ri, wi, f"{path}/items", out)
    if rt is None or "object" in rt or "properties" in r or "properties" in w:
        _check_object(r, w, path, out)


def _collect(r, w, path) -> list:
    out: list = []
    _check(r, w, path, out)
    return out


def _check_object(r, w, path, out) -> None:
    rprops, wprops = r.get("properties", {}), w.get("properties", {})
    radd, wadd = r.get("additionalProperties", True), w.get("additionalProperties", True)
    rreq, wreq = set(r.get("required", [])), set(w.get("required", []))
    for name in sorted(rreq - wreq):
        out.append(("REQUIRED_ATTRIBUTE_ADDED", f"required property {name!r} added at {path}"))
    for name, rs in rprops.items():
        p = f"{path}/properties/{name}"
        if name in wprops:
            _check(rs, wprops[name], p, out)
        elif wadd is False:
            continue  # closed writer model: the writer never wrote it (OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL)
        elif wadd is True or wadd == {}:
            # open writer model: old data may carry any value under this name
            if not _collect(rs, {}, p):
                continue
            out.append(("PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL", f"property {name!r} added to an open content model at {p}"))
        else:  # partially open: the writer's additionalProperties schema applies to it
            if _collect(rs, wadd, p):
                out.append(("PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", f"property {name!r} at {p}"))
    for name, ws in wprops.items():
        if name in rprops:
            continue
        p = f"{path}/properties/{name}"
        if radd is False:
            out.append(("PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL", f"property {name!r} removed from a closed content model at {p}"))
        elif not (radd is True or radd == {}) and _collect(radd, ws, p):
            out.append(("PROPERTY_REMOVED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL", f"property {name!r} at {p}"))
    if radd is False and wadd is not False:
        out.append(("ADDITIONAL_PROPERTIES_REMOVED", f"additionalProperties set to false at {path}"))
    elif isinstance(radd, dict) and radd != {} and wadd is not False:
        if isinstance(wadd, dict) and wadd:
            if _collect(radd, wadd, f"{path}/additionalProperties"):
                out.append(("ADDITIONAL_PROPERTIES_NARROWED", f"additionalProperties narrowed at {path}"))
        else:
            out.append(("ADDITIONAL_PROPERTIES_NARROWED", f"additionalProperties narrowed at {path}"))
