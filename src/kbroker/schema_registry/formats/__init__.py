"""Schema formats: AVRO, JSON and PROTOBUF, each in its own module.

Every format parses a schema string (plus the texts of its references, dependencies
first) into an object with:

- ``canonical()``: the string the registry stores and compares, so that the same schema
  written with different whitespace gets the same id;
- ``normalized()``: the form stored with ``?normalize=true`` (key order, names and the like
  made canonical as well);
- ``incompatibilities(writer)``: with ``self`` as the *reader*, the reasons why data
  written with ``writer`` could not be read (empty list: compatible).

A schema that does not parse raises ``SchemaParseError`` (REST 42201).
"""
from __future__ import annotations


class SchemaParseError(ValueError):
    pass


TYPES = ("JSON", "PROTOBUF", "AVRO")


def parse(schema_type: str, text: str, references: list[tuple[str, str]] = ()):
    """``references``: (name, schema text) of every schema this one depends on,
    dependencies first."""
    if not isinstance(text, str) or not text.strip():
        raise SchemaParseError("Empty schema")
    try:
        return _parse(schema_type, text, references)
    except RecursionError:
        raise SchemaParseError("the schema nests too deeply") from None


def _parse(schema_type: str, text: str, references):
    if schema_type == "AVRO":
        from kbroker.schema_registry.formats.avro import AvroSchema
        return AvroSchema(text, references)
    if schema_type == "JSON":
        from kbroker.schema_registry.formats.json_schema import JsonSchema
        return JsonSchema(text, references)
    if schema_type == "PROTOBUF":
        from kbroker.schema_registry.formats.protobuf import ProtobufSchema
        return ProtobufSchema(text, references)
    raise SchemaParseError(f"unknown schema type {schema_type!r}; supported: {', '.join(TYPES)}")
