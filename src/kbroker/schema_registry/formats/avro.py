"""AVRO schemas: parsed with the Apache ``avro`` library; compatibility is Avro's
schema resolution (reader/writer) as ``avro.compatibility`` implements it.

References: each referenced schema's named types are defined first (in one ``Names``
scope), so the schema may name them; a reference is not inlined in ``canonical()``.
"""
from __future__ import annotations

import json

import avro.compatibility as _compat
import avro.errors
import avro.schema

from kbroker.schema_registry.formats import SchemaParseError


def _parse_into(text: str, names: avro.schema.Names) -> avro.schema.Schema:
    try:
        doc = json.loads(text)
    except ValueError:
        doc = text  # a bare primitive name, as Avro allows ("string")
    try:
        return avro.schema.make_avsc_object(doc, names)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError, AttributeError) as e:
        raise SchemaParseError(f"{type(e).__name__}: {e}") from None


class AvroSchema:
    schema_type = "AVRO"

    def __init__(self, text: str, references=()):
        names = avro.schema.Names()
        for _name, ref_text in references:
            _parse_into(ref_text, names)
        self._ref_names = dict(names.names)  # full name -> schema defined by a reference
        self.text = text
        self.schema = _parse_into(text, names)

    def canonical(self) -> str:
        """The schema's JSON with whitespace removed, member order kept (like Avro Java's
        ``Schema.toString()``)."""
        try:
            return json.dumps(json.loads(self.text), separators=(",", ":"))
        except ValueError:
            return json.dumps(self.text.strip())

    def normalized(self) -> str:
        """Resolved names (full names, no redundant namespaces), sorted keys."""
        scope = avro.schema.Names()
        scope.names = dict(self._ref_names)  # referenced types stay names, not inlined
        return json.dumps(self.schema.to_json(scope), separators=(",", ":"), sort_keys=True)

    def incompatibilities(self, writer: "AvroSchema") -> list[str]:
        r = _compat.ReaderWriterCompatibilityChecker().get_compatibility(self.schema, writer.schema)
        if r.compatibility is _compat.SchemaCompatibilityType.compatible:
            return []
        out = []
        locations = sorted(r.locations) or ["/"]
        for kind in r.incompatibilities:
            out.append(f"{{errorType:'{kind.name.upper()}', description:'{kind.value.replace('_', ' ')} "
                       f"at {', '.join(locations)}', additionalInfo:'{', '.join(sorted(map(str, r.messages)))}'}}")
        return out or ["{errorType:'INCOMPATIBLE', description:'reader cannot read writer data'}"]
