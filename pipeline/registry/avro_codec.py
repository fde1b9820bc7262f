"""Avro's binary encoding for the simplest schemas, compiled to Python closures: a string, a long, an int, a boolean, a
double, or a record of those. For such schemas it reads and writes the same bytes as fastavro (tests/unit/
test_registry_serdes.py compares them on random values) at a fraction of its per-call cost, which dominates for small
records (BENCHMARKS.md: "Avro and Protobuf topics"). Any other schema (unions, arrays, maps, logical types, nested
records, schema resolution) is not compiled: AvroSerde uses fastavro for it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

Reader = Callable[[bytes, int], tuple[Any, int]]  # (data, position) -> (value, the position after it)
Writer = Callable[[bytearray, Any], None]  # appends the value's encoding

_DOUBLE = struct.Struct("<d")
_LONG_RANGE = (-(2**63), 2**63 - 1)
_INT_RANGE = (-(2**31), 2**31 - 1)


def compile_schema(schema: Any) -> tuple[Reader, Writer] | None:
    """(reader, writer) for a parsed schema (fastavro's parse_schema) of the supported shapes, else None."""
    fields = _fields(schema)
    return None if fields is None else _generate(fields, None)


def compile_wire(schema: Any, header: bytes) -> tuple[Callable[[bytes], Any], Callable[[Any], bytes]] | None:
    """(decode(data), encode(value)) of whole messages in the wire format: `header` (magic byte, schema id) and the
    encoding. decode skips the header it was looked up by; encode writes `header`. None: not a supported shape."""
    fields = _fields(schema)
    return None if fields is None else _generate(fields, header)


Field = tuple[str | None, str, Reader, Writer]  # (name: None for a primitive schema's single value, type, codec)


def _fields(schema: Any) -> tuple[Field, ...] | None:
    if isinstance(schema, dict) and schema.get("type") == "record":
        fields: list[Field] = []
        for f in schema.get("fields", ()):
            codec = _primitive(f.get("type"))
            if codec is None or not isinstance(f.get("name"), str) or "default" in f:  # fastavro fills defaults in
                return None
            fields.append((f["name"], _type_name(f["type"]), *codec))
        return tuple(fields)
    codec = _primitive(schema)
    return None if codec is None else ((None, _type_name(schema), *codec),)


def _type_name(schema: Any) -> Any:
    """ "long" for "long" and for {"type": "long"} (the same schema)."""
    return schema.get("type") if isinstance(schema, dict) and set(schema) <= {"type"} else schema


def _primitive(schema: Any) -> tuple[Reader, Writer] | None:
    schema = _type_name(schema)
    codecs: dict[str, tuple[Reader, Writer]] = {
        "long": (_read_long, _long_writer(_LONG_RANGE)),
        "int": (_read_long, _long_writer(_INT_RANGE)),
        "string": (_read_string, _write_string),
        "boolean": (_read_boolean, _write_boolean),
        "double": (_read_double, _write_double),
    }
    return codecs.get(schema) if isinstance(schema, str) else None


def _generate(fields: tuple[Field, ...], header: bytes | None) -> Any:
    """A reader and a writer generated as one function each, the varints and strings inline (as dataclasses
    generates __init__): a call per field cost more than the field's decoding. header None: read(data, pos) ->
    (value, pos) and write(out, value); else whole messages, decode(data) -> value and encode(value) -> bytes. Names
    are Avro names (parse_schema checked them: letters, digits, underscores), embedded with repr()."""
    read = ["def read(data, pos):"] if header is None else ["def read(data):", "    pos = 5"]
    write = ["def write(out, obj):"] if header is None else ["def write(obj):", "    out = bytearray(HEADER)"]
    helpers: dict[str, Any] = {"_write_length": _write_length, "HEADER": header}
    for i, (name, kind, read_field, write_field) in enumerate(fields):
        source = "obj" if name is None else f"obj[{name!r}]"
        if kind in ("long", "int"):
            read += _varint_read(f"f{i}")
            write += _long_write(source, kind)
        elif kind == "string":
            read += [*_varint_read("size"), *_STRING_READ, f"    f{i} = data[pos:end].decode()", "    pos = end"]
            write += [f"    value = {source}", *_STRING_WRITE]
        else:
            helpers[f"r{i}"], helpers[f"w{i}"] = read_field, write_field
            read.append(f"    f{i}, pos = r{i}(data, pos)")
            write.append(f"    w{i}(out, {source})")
    value = "f0" if fields[0][0] is None else "{" + ", ".join(f"{n!r}: f{i}" for i, (n, *_) in enumerate(fields)) + "}"
    read.append(f"    return {value}, pos" if header is None else f"    return {value}")
    write.append("    return None" if header is None else "    return bytes(out)")
    namespace = dict(helpers)
    exec("\n".join(read) + "\n\n" + "\n".join(write), namespace)  # the source generated above
    return namespace["read"], namespace["write"]


def _long_write(source: str, kind: str) -> list[str]:
    low, high = _LONG_RANGE if kind == "long" else _INT_RANGE
    return [
        f"    value = {source}",
        f"    if type(value) is not int or not {low} <= value <= {high}:",
        f"        raise ValueError(f'{{value!r}} is not an Avro {kind}')",
        "    n = (value << 1) ^ (value >> 63)",
        "    if n < 0x80:",  # one, two or three bytes (values below 2**20) without a loop: most counts and ids
        "        out.append(n)",
        "    elif n < 0x4000:",
        "        out += bytes(((n & 0x7F) | 0x80, n >> 7))",
        "    elif n < 0x200000:",
        "        out += bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))",
        "    else:",
        "        while n > 0x7F:",
        "            out.append((n & 0x7F) | 0x80)",
        "            n >>= 7",
        "        out.append(n)",
    ]


_STRING_READ = [
    "    end = pos + size",
    "    if size < 0 or end > len(data):",
    "        raise ValueError(f'a string of {size} bytes where {len(data) - pos} are left')",
]
_STRING_WRITE = [
    "    if type(value) is not str:",
    "        raise ValueError(f'{value!r} is not an Avro string')",
    "    encoded = value.encode()",
    "    if len(encoded) < 64:",
    "        out.append(len(encoded) << 1)",
    "    else:",
    "        _write_length(out, len(encoded))",
    "    out += encoded",
]


def _varint_read(target: str) -> list[str]:
    """Source lines decoding a zig-zag varint at data[pos] into `target`, pos moved past it."""
    return [
        "    b = data[pos]",
        "    pos += 1",
        "    n = b & 0x7F",
        "    shift = 7",
        "    while b & 0x80:",
        "        b = data[pos]",
        "        pos += 1",
        "        n |= (b & 0x7F) << shift",
        "        shift += 7",
        f"    {target} = (n >> 1) ^ -(n & 1)",
    ]


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (long and int alike)."""
    b = data[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), pos


def _long_writer(bounds: tuple[int, int]) -> Writer:
    low, high = bounds

    def write(out: bytearray, value: Any) -> None:
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"{value!r} is not an Avro {'long' if high > 2**31 else 'int'}")
        if 0 <= value < 64:  # one byte, the common case
            out.append(value << 1)
            return
        n = (value << 1) ^ (value >> 63)
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)

    return write


def _read_string(data: bytes, pos: int) -> tuple[str, int]:
    size, pos = _read_long(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise ValueError(f"a string of {size} bytes where {len(data) - pos} are left")
    return data[pos:end].decode(), end


def _write_string(out: bytearray, value: Any) -> None:
    if type(value) is not str:
        raise ValueError(f"{value!r} is not an Avro string")
    encoded = value.encode()
    if len(encoded) < 64:  # a one-byte length, the usual case
        out.append(len(encoded) << 1)
    else:
        _write_length(out, len(encoded))
    out += encoded


_write_length = _long_writer(_LONG_RANGE)


def _read_boolean(data: bytes, pos: int) -> tuple[bool, int]:
    return data[pos] != 0, pos + 1


def _write_boolean(out: bytearray, value: Any) -> None:
    if type(value) is not bool:
        raise ValueError(f"{value!r} is not an Avro boolean")
    out.append(1 if value else 0)


def _read_double(data: bytes, pos: int) -> tuple[float, int]:
    return _DOUBLE.unpack_from(data, pos)[0], pos + 8


def _write_double(out: bytearray, value: Any) -> None:
    if type(value) not in (float, int) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not an Avro double")
    out += _DOUBLE.pack(value)
