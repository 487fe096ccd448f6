"""PROTOBUF schemas: ``.proto`` text parsed with ``proto-schema-parser``, or a
base64-encoded ``FileDescriptorProto`` (what confluent-kafka's ``ProtobufSerializer``
registers) read with ``protobuf``'s ``descriptor_pb2``.

Both become one model: package, syntax, and per message full name the fields by number
(name, type, label, oneof). Compatibility follows Confluent's Protobuf rules: a message
may not disappear (``MESSAGE_REMOVED``), a field number keeps its kind and a
wire-compatible scalar type (``FIELD_KIND_CHANGED``, ``FIELD_SCALAR_KIND_CHANGED``,
``FIELD_NAMED_TYPE_CHANGED``), the package stays (``PACKAGE_CHANGED``), proto2 required
fields are neither added nor removed, and fields do not move into an existing oneof.
Adding and removing optional fields is compatible both ways.

References: the referenced files (the imports) are parsed first and their types resolve
the names this file uses. ``serialized()`` gives the base64 ``FileDescriptorProto`` (``?format=serialized``, which
confluent-kafka's ``ProtobufDeserializer`` asks for); for a text schema it is built from the
parsed model (messages, nested messages, enums, fields, oneofs, maps).
"""
from __future__ import annotations

import base64
import binascii
import re
from typing import NamedTuple

from kbroker.schema_registry.formats import SchemaParseError

_SCALARS = {"double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32",
            "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"}
# wire-compatible groups (protobuf language guide: "Updating A Message Type")
_GROUP = {"int32": "varint", "int64": "varint", "uint32": "varint", "uint64": "varint", "bool": "varint",
          "sint32": "zigzag", "sint64": "zigzag", "fixed32": "f32", "sfixed32": "f32",
          "fixed64": "f64", "sfixed64": "f64", "string": "len", "bytes": "len",
          "double": "double", "float": "float"}
_B64 = re.compile(r"^[A-Za-z0-9+/=\s]+$")


def _type_name(f, T) -> str:
    if f.type in (T.TYPE_MESSAGE, T.TYPE_ENUM, T.TYPE_GROUP):
        return f.type_name.lstrip(".")
    return T.Type.Name(f.type)[5:].lower()


class ProtoField(NamedTuple):
    name: str
    type: str        # scalar name, or a message/enum full name
    kind: str        # "scalar" | "message" | "enum" | "map"
    label: str       # "optional" | "repeated" | "required" | ""
    oneof: str | None


class ProtobufSchema:
    schema_type = "PROTOBUF"

    def __init__(self, text: str, references=()):
        self.text = text
        self.package = ""
        self.syntax = "proto2"
        self.messages: dict[str, dict[int, ProtoField]] = {}
        self.enums: dict[str, dict[str, int]] = {}
        self.imports: list[str] = []
        # types defined by the referenced files (the imports), full name -> "message" | "enum"
        self.external: dict[str, str] = {}
        for i, (_name, ref_text) in enumerate(references):
            ref = ProtobufSchema(ref_text, references[:i])
            self.external.update({n: "message" for n in ref.messages})
            self.external.update({n: "enum" for n in ref.enums})
        self._fdp = None
        stripped = text.strip()
        if _B64.match(stripped) and "message" not in stripped and "syntax" not in stripped:
            self._from_descriptor(stripped)
        else:
            self._from_text(stripped)

    # -- parsing -------------------------------------------------------------------------
    def _from_descriptor(self, b64: str) -> None:
        from google.protobuf import descriptor_pb2
        from google.protobuf.message import DecodeError
        try:
            fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(b64, validate=False))
        except (binascii.Error, DecodeError, ValueError) as e:
            raise SchemaParseError(f"not a serialized FileDescriptorProto: {e}") from None
        if not fdp.name and not fdp.message_type and not fdp.enum_type:
            raise SchemaParseError("empty FileDescriptorProto")
        self._fdp = fdp
        self.package = fdp.package
        self.syntax = fdp.syntax or "proto2"
        labels = {1: "optional", 2: "required", 3: "repeated"}
        T = descriptor_pb2.FieldDescriptorProto

        def walk(msgs, prefix):
            for m in msgs:
                full = f"{prefix}.{m.name}" if prefix else m.name
                fields = {}
                entries = {f"{full}.{n.name}": n for n in m.nested_type if n.options.map_entry}
                for f in m.field:
                    entry = entries.get(f.type_name.lstrip("."))
                    if entry is not None:
                        k, v = (_type_name(x, T) for x in entry.field)
                        fields[f.number] = ProtoField(f.name, f"map<{k},{v}>", "map", "repeated", None)
                        continue
                    if f.type in (T.TYPE_MESSAGE, T.TYPE_GROUP):
                        kind, typ = "message", f.type_name.lstrip(".")
                    elif f.type == T.TYPE_ENUM:
                        kind, typ = "enum", f.type_name.lstrip(".")
                    else:
                        kind, typ = "scalar", T.Type.Name(f.type)[5:].lower()
                    label = labels.get(f.label, "")
                    if self.syntax == "proto3" and label == "optional" and not f.proto3_optional:
                        label = ""
                    oneof = (m.oneof_decl[f.oneof_index].name
                             if f.HasField("oneof_index") and not f.proto3_optional else None)
                    fields[f.number] = ProtoField(f.name, typ, kind, label, oneof)
                self.messages[full] = fields
                for e in m.enum_type:
                    self.enums[f"{full}.{e.name}"] = {v.name: v.number for v in e.value}
                walk([n for n in m.nested_type if not n.options.map_entry], full)

        walk(fdp.message_type, fdp.package)
        for e in fdp.enum_type:
            self.enums[f"{fdp.package}.{e.name}" if fdp.package else e.name] = {v.name: v.number for v in e.value}

    def _from_text(self, text: str) -> None:
        from antlr4.error.ErrorListener import ErrorListener
        from proto_schema_parser import ast
        from proto_schema_parser.parser import Parser

        class Strict(ErrorListener):  # ANTLR recovers and prints by default: make errors fatal
            def syntaxError(self, recognizer, offending, line, column, msg, e):
                raise SchemaParseError(f"proto parse error at line {line}:{column}: {msg}")

        def strict(r):
            r.removeErrorListeners()
            r.addErrorListener(Strict())

        try:
            f = Parser(setup_lexer=strict, setup_parser=strict).parse(text)
        except SchemaParseError:
            raise
        except Exception as e:  # the AST builder on odd input
            raise SchemaParseError(f"proto parse error: {e}") from None
        self.syntax = f.syntax or "proto2"
        pending = []  # (message full name, field number, ProtoField with a relative type name)
        for el in f.file_elements:
            if isinstance(el, ast.Package):
                self.package = el.name
            elif isinstance(el, ast.Import):
                self.imports.append(el.name)
        if not any(isinstance(el, (ast.Message, ast.Enum)) for el in f.file_elements):
            raise SchemaParseError("proto file defines no message or enum")

        def field(full, fl, oneof=None):
            if isinstance(fl, ast.MapField):
                return ProtoField(fl.name, f"map<{fl.key_type},{fl.value_type}>", "map", "repeated", None)
            card = fl.cardinality.value.lower() if fl.cardinality else ""
            kind = "scalar" if fl.type in _SCALARS else "named"
            return ProtoField(fl.name, fl.type, kind, card, oneof)

        def walk(elements, prefix):
            for el in elements:
                if isinstance(el, ast.Message):
                    full = f"{prefix}.{el.name}" if prefix else el.name
                    fields = self.messages.setdefault(full, {})
                    for sub in el.elements:
                        if isinstance(sub, (ast.Field, ast.MapField)):
                            fields[sub.number] = field(full, sub)
                        elif isinstance(sub, ast.OneOf):
                            for fl in sub.elements:
                                if isinstance(fl, ast.Field):
                                    fields[fl.number] = field(full, fl, sub.name)
                    walk(el.elements, full)
                elif isinstance(el, ast.Enum):
                    full = f"{prefix}.{el.name}" if prefix else el.name
                    self.enums[full] = {v.name: v.number for v in el.elements if isinstance(v, ast.EnumValue)}

        walk(f.file_elements, self.package)
        # resolve named types by protobuf scoping: innermost scope outwards
        for mname, fields in self.messages.items():
            for num, fl in list(fields.items()):
                if fl.kind != "named":
                    continue
                full = self._resolve(fl.type, mname)
                kind = "enum" if full in self.enums or self.external.get(full) == "enum" else "message"
                fields[num] = fl._replace(type=full, kind=kind)

    def _resolve(self, name: str, scope: str) -> str:
        if name.startswith("."):
            return name[1:]
        parts = scope.split(".")
        while parts:
            cand = ".".join(parts + [name])
            if cand in self.messages or cand in self.enums or cand in self.external:
                return cand
            parts.pop()
        return name  # fully qualified already, or from an import not given as a reference

    # -- forms ---------------------------------------------------------------------------
    def canonical(self) -> str:
        return self.text.strip()

    def normalized(self) -> str:
        return self.canonical()

    def serialized(self) -> str:
        if self._fdp is None:
            self._fdp = self._build_descriptor()
        return base64.standard_b64encode(self._fdp.SerializeToString()).decode("ascii")

    def _build_descriptor(self):
        from google.protobuf import descriptor_pb2
        T = descriptor_pb2.FieldDescriptorProto
        fdp = descriptor_pb2.FileDescriptorProto(name="schema.proto", package=self.package, syntax=self.syntax,
                                                 dependency=self.imports)
        by_name: dict[str, object] = {}
        labels = {"repeated": T.LABEL_REPEATED, "required": T.LABEL_REQUIRED}
        for full in sorted(set(self.messages) | set(self.enums), key=lambda n: n.count(".")):
            rel = full[len(self.package) + 1:] if self.package else full
            parent_name, _, short = rel.rpartition(".")
            parent = by_name.get(f"{self.package}.{parent_name}" if self.package and parent_name else parent_name)
            if full in self.enums:
                e = (parent.enum_type if parent is not None else fdp.enum_type).add(name=short)
                for vname, num in self.enums[full].items():
                    e.value.add(name=vname, number=num)
                continue
            m = (parent.nested_type if parent is not None else fdp.message_type).add(name=short)
            by_name[full] = m
            oneofs: dict[str, int] = {}
            for num, fl in sorted(self.messages[full].items()):
                f = m.field.add(name=fl.name, number=num, label=labels.get(fl.label, T.LABEL_OPTIONAL))
                if fl.kind == "scalar":
                    f.type = T.Type.Value("TYPE_" + fl.type.upper())
                elif fl.kind == "map":
                    k, v = fl.type[4:-1].split(",")
                    entry = m.nested_type.add(name="".join(p.capitalize() for p in fl.name.split("_")) + "Entry")
                    entry.options.map_entry = True
                    for i, (n, t) in enumerate((("key", k.strip()), ("value", v.strip())), 1):
                        ef = entry.field.add(name=n, number=i, label=T.LABEL_OPTIONAL)
                        if t in _SCALARS:
                            ef.type = T.Type.Value("TYPE_" + t.upper())
                        else:
                            full_t = self._resolve(t, full)
                            enum = full_t in self.enums or self.external.get(full_t) == "enum"
                            ef.type = T.TYPE_ENUM if enum else T.TYPE_MESSAGE
                            ef.type_name = "." + full_t
                    f.type, f.type_name = T.TYPE_MESSAGE, f".{full}.{entry.name}"
                else:
                    f.type = T.TYPE_ENUM if fl.kind == "enum" else T.TYPE_MESSAGE
                    f.type_name = "." + fl.type
                if fl.oneof is not None:
                    if fl.oneof not in oneofs:
                        oneofs[fl.oneof] = len(m.oneof_decl)
                        m.oneof_decl.add(name=fl.oneof)
                    f.oneof_index = oneofs[fl.oneof]
                elif fl.label == "optional" and self.syntax == "proto3":
                    f.proto3_optional = True
            for f in m.field:  # synthetic oneofs come after all real ones
                if f.proto3_optional:
                    f.oneof_index = len(m.oneof_decl)
                    m.oneof_decl.add(name=f"_{f.name}")
        return fdp

    # -- compatibility -------------------------------------------------------------------
    def incompatibilities(self, writer: "ProtobufSchema") -> list[str]:
        out: list[tuple[str, str]] = []
        if self.package != writer.package:
            out.append(("PACKAGE_CHANGED", f"package {writer.package!r} changed to {self.package!r}"))
        for mname, wfields in writer.messages.items():
            rfields = self.messages.get(mname)
            if rfields is None:
                out.append(("MESSAGE_REMOVED", f"message {mname} removed"))
                continue
            moved: list[int] = []
            for num, wf in wfields.items():
                rf = rfields.get(num)
                where = f"field {num} of {mname}"
                if rf is None:
                    if wf.label == "required":
                        out.append(("REQUIRED_FIELD_REMOVED", f"required {where} removed"))
                    continue
                kinds = {rf.kind, wf.kind}
                if rf.kind == wf.kind == "scalar":
                    if _GROUP[rf.type] != _GROUP[wf.type]:
                        out.append(("FIELD_SCALAR_KIND_CHANGED", f"{where}: {wf.type} changed to {rf.type}"))
                elif kinds == {"scalar", "enum"}:
                    scalar = rf.type if rf.kind == "scalar" else wf.type
                    if _GROUP[scalar] != "varint":  # an enum is a varint on the wire
                        out.append(("FIELD_KIND_CHANGED", f"{where}: {wf.kind} changed to {rf.kind}"))
                elif rf.kind != wf.kind:
                    out.append(("FIELD_KIND_CHANGED", f"{where}: {wf.kind} changed to {rf.kind}"))
                elif rf.type != wf.type:
                    out.append(("FIELD_NAMED_TYPE_CHANGED", f"{where}: {wf.type} changed to {rf.type}"))
                if (rf.label == "repeated") != (wf.label == "repeated") and "map" not in (rf.kind, wf.kind):
                    out.append(("FIELD_LABEL_CHANGED", f"{where}: {wf.label or 'singular'} changed to "
                                                       f"{rf.label or 'singular'}"))
                if rf.oneof is not None and wf.oneof is None:
                    moved.append(num)
            if moved:
                existing = any(wf.oneof is not None and wf.oneof == rfields[n].oneof
                               for n in moved for wf in wfields.values())
                if len(moved) > 1:
                    out.append(("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"fields {moved} of {mname} moved into a oneof"))
                elif existing:
                    out.append(("FIELD_MOVED_TO_EXISTING_ONEOF", f"field {moved[0]} of {mname} moved into an existing oneof"))
            for num, rf in rfields.items():
                if num not in wfields and rf.label == "required":
                    out.append(("REQUIRED_FIELD_ADDED", f"required field {num} added to {mname}"))
        return [f"{{errorType:'{k}', description:'{d}'}}" for k, d in out]
