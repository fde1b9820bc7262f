"""The registry serdes themselves (pipeline/registry/__init__.py tells how they are declared and bound)."""

from __future__ import annotations

import copy
import io
import json
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pipeline.registry.avro_codec import compile_wire
from pipeline.registry.lookups import Lookup, in_memory, registry_answer
from pipeline.serde import RegistryPending, RegistryUnavailable, SchemaError, background_registry_lookups

SUBJECT_STRATEGIES = ("topic", "record", "topic_record")
LATEST = "latest"
MAGIC_BYTE = 0
# HTTP answers that say nothing about the record: the registry (or what stands before it) cannot serve now.
TRANSIENT_STATUS = (401, 403, 408, 429)


@dataclass
class _Binding:
    """What a bound serde uses: the client, its topic and field, and confluent-kafka's (de)serializer, each made on
    first use (a pinned version is looked up then: never while the App is only being configured)."""

    client: Any
    topic: str
    is_key: bool
    context: Any  # confluent_kafka.serialization.SerializationContext
    serializer: Callable[[Any, Any], bytes | None] | None = None
    deserializer: Callable[[bytes, Any], Any] | None = None
    # AvroSerde's fast path (what confluent-kafka's own path does when no rule applies): the 5 header bytes (magic
    # byte, schema id) -> decode(data),
    # and encode(obj) once the header is known (pipeline/registry/avro_codec.py, else fastavro).
    readers: dict[bytes, Callable[[bytes], Any]] = field(default_factory=dict)
    writer: Callable[[Any], bytes] | None = None
    # Background look-ups (RegistrySerde._look_up_first): ("read", schema id) or ("write", None) -> the one in
    # flight or answered and not yet seen; and the keys whose answer is in the client's cache. Main thread only.
    lookups: dict[tuple[str, int | None], Lookup] = field(default_factory=dict)
    answered: set[tuple[str, int | None]] = field(default_factory=set)
    in_memory: bool = False  # confluent-kafka's mock client (the test driver's): no HTTP, nothing to wait for


class RegistrySerde:
    """A serde whose bytes are in the Confluent wire format. Options (each checked where the App is defined):

    schema            the schema this serde writes (and reads as, where the format resolves: Avro); None: read only,
                      with each record's writer schema
    subject_strategy  "topic" ({topic}-key, {topic}-value), "record" (the record's full name) or "topic_record"
    auto_register     register the schema under its subject at start-up (off: it must be registered already)
    version           None: the schema given; "latest": the subject's latest version (read and write, looked up once
                      at start-up); an int: that version of the subject, pinned
    """

    format_name: ClassVar[str] = ""

    def __init__(
        self,
        schema: Any = None,
        *,
        subject_strategy: str = "topic",
        auto_register: bool = True,
        version: int | str | None = None,
    ) -> None:
        if subject_strategy not in SUBJECT_STRATEGIES:
            raise ValueError(f"subject_strategy must be one of {SUBJECT_STRATEGIES}, not {subject_strategy!r}")
        if not (version is None or version == LATEST or (isinstance(version, int) and version >= 1)):
            raise ValueError(f"version must be None (the schema given), {LATEST!r} or a version >= 1, not {version!r}")
        if version is not None and auto_register:
            auto_register = False  # a version chosen in the registry is registered there already
        self.schema = schema
        self.subject_strategy = subject_strategy
        self.auto_register = auto_register
        self.version = version
        self._binding: _Binding | None = None

    def __repr__(self) -> str:
        where = f" bound to {self._binding.topic}" if self._binding else ""
        return f"{type(self).__name__}(strategy={self.subject_strategy}, version={self.version}){where}"

    # -- the Serde protocol ------------------------------------------------------------------------------------------
    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        binding = self._bound()
        _refuse_while_down(binding.client)
        try:
            self._look_up_first(binding, ("write", None), lambda: self._writer(binding)(obj, binding.context))
            return self._writer(binding)(obj, binding.context)
        except RegistryUnavailable:
            raise
        except Exception as error:
            if transient(error):
                raise _down(binding.client, error) from error
            raise

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        binding = self._bound()
        _refuse_while_down(binding.client)
        schema_id = wire_schema_id(data)
        try:
            if schema_id is not None:  # without a header, the call fails without asking the registry
                self._look_up_first(binding, ("read", schema_id), lambda: self._reader(binding)(data, binding.context))
            return self._reader(binding)(data, binding.context)
        except RegistryUnavailable:
            raise
        except Exception as error:
            if transient(error):
                raise _down(binding.client, error) from error
            what = f"{self.format_name} {_field(binding.is_key)} of {binding.topic} (schema id {schema_id})"
            raise SchemaError(f"{what}: {describe(error)}", schema_id) from error

    def _look_up_first(self, binding: _Binding, key: tuple[str, int | None], call: Callable[[], Any]) -> None:
        """Where the sink waits for background look-ups (background_registry_lookups), a schema id (or the output
        schema) not answered yet is looked up on a worker thread, one in flight per key: RegistryPending until it
        answers, then the answer decides. Fetched: the caller's own call finds it in the client's cache. No answer:
        RegistryUnavailable (the sink's back-off; the next attempt asks again). The registry's answer about the id
        (a 404: no such schema id): raised as the call would raise it (the record is dead-lettered as `schema`)."""
        if binding.in_memory or key in binding.answered or not background_registry_lookups.get():
            return
        lookup = binding.lookups.get(key)
        if lookup is None:
            lookup = binding.lookups[key] = Lookup(call)
        if not lookup.done.is_set():
            what = f"schema id {key[1]}" if key[0] == "read" else "the output schema"
            raise RegistryPending(f"schema registry: {what} of {binding.topic} being looked up", lookup.done)
        del binding.lookups[key]
        error = lookup.error
        if error is not None and transient(error):
            raise _down(binding.client, error)
        if error is not None and registry_answer(error):
            raise error
        binding.answered.add(key)  # anything else came after the fetch: the caller's call meets it again, cached

    # -- binding -----------------------------------------------------------------------------------------------------
    @property
    def bound(self) -> bool:
        return self._binding is not None

    def bind(self, client: Any, topic: str, is_key: bool) -> RegistrySerde:
        """A copy of this serde for `topic`'s key or value on `client`. No request is made here."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        bound = copy.copy(self)
        context = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
        bound._binding = _Binding(client, topic, is_key, context, in_memory=in_memory(client))
        return bound

    def _bound(self) -> _Binding:
        if self._binding is None:
            raise TypeError(
                f"{self!r} is not bound to a schema registry: pipeline run binds it (SCHEMA_REGISTRY_URL), the "
                "test driver to an in-memory client; elsewhere pipeline.registry.bind(app, client)"
            )
        return self._binding

    def _writer(self, binding: _Binding) -> Callable[[Any, Any], bytes | None]:
        """confluent-kafka's serializer, made once: the schema given, the subject's latest or a pinned version."""
        if binding.serializer is None:
            if self.schema is None and self.version is None:
                raise TypeError(f"{self!r} has no schema to write with: give it one (schema=...)")
            conf: dict[str, Any] = {
                "subject.name.strategy": _strategy(self.subject_strategy),
                "auto.register.schemas": self.auto_register,
            }
            if self.version == LATEST:
                conf["use.latest.version"] = True
            elif isinstance(self.version, int):
                conf["use.schema.id"] = self.pinned(binding).schema_id
            binding.serializer = self._serializer(binding.client, conf)
        return binding.serializer

    def _reader(self, binding: _Binding) -> Callable[[bytes, Any], Any]:
        """confluent-kafka's deserializer, made once: read as the schema given, the subject's latest version, or
        a pinned one (each record's writer schema is fetched by its id, once per id)."""
        if binding.deserializer is None:
            conf: dict[str, Any] = {"subject.name.strategy": _strategy(self.subject_strategy)}
            reader_schema = self.schema
            if self.version == LATEST:
                conf["use.latest.version"] = True
            elif isinstance(self.version, int) and not isinstance(self, ProtobufSerde):
                reader_schema = self.pinned(binding).schema.schema_str
            binding.deserializer = self._deserializer(binding.client, conf, reader_schema)
        return binding.deserializer

    def pinned(self, binding: _Binding) -> Any:
        """The RegisteredSchema of the pinned version of this serde's subject."""
        return binding.client.get_version(self.subject(binding.topic, binding.is_key), self.version)

    # -- the subject and the schema ----------------------------------------------------------------------------------
    def subject(self, topic: str, is_key: bool) -> str:
        """The subject this serde's schema lives under for `topic`'s key or value."""
        field = "key" if is_key else "value"
        if self.subject_strategy == "topic":
            return f"{topic}-{field}"
        name = self.record_name()
        if name is None:
            raise ValueError(f"{self!r}: subject_strategy={self.subject_strategy!r} needs a named record schema")
        return name if self.subject_strategy == "record" else f"{topic}-{name}"

    def record_name(self) -> str | None:
        """The full name of the record the schema describes (None: unnamed)."""
        return None

    def _serializer(self, client: Any, conf: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _deserializer(self, client: Any, conf: dict[str, Any], reader_schema: Any) -> Any:
        raise NotImplementedError


class AvroSerde(RegistrySerde):
    """Avro: values are dicts (records) or plain values (a "string" key schema: str). `schema`: the .avsc text.
    Read with a schema, records of an older or newer writer schema are resolved to it (Avro schema resolution).

    The first record of each schema id goes through confluent-kafka's AvroSerializer / AvroDeserializer (which
    register, look up and fetch the schema, and run a schema's rules). After it, when no rule can apply (a schema of
    our own to write; a writer schema without a rule set or references to read, read as the schema given or a pinned
    version), the same bytes are written and read with fastavro directly: confluent-kafka's per-call work (subject
    names, cache locks, expanding the schema for rules) cost 45-60x JSON per call (BENCHMARKS.md). The interop tests
    read our bytes with confluent-kafka's own deserializer."""

    format_name = "avro"

    def record_name(self) -> str | None:
        parsed = json.loads(self.schema) if isinstance(self.schema, str) else None
        if not isinstance(parsed, dict) or "name" not in parsed:
            return None
        name, namespace = str(parsed["name"]), parsed.get("namespace")
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def serialize(self, obj: Any) -> bytes | None:
        binding = self._binding
        encode = binding.writer if binding is not None else None
        if encode is None or obj is None:
            encoded = super().serialize(obj)
            if encoded is not None and binding is not None and self.version is None:
                binding.writer = self._fast_writer(encoded[:5])
            return encoded
        return encode(obj)

    def deserialize(self, data: bytes | None) -> Any:
        binding = self._binding
        if binding is None or data is None:
            return super().deserialize(data)
        decode = binding.readers.get(data[:5])
        if decode is None:  # the first record of its schema id (or no header: its error as it is)
            value = super().deserialize(data)
            if (schema_id := wire_schema_id(data)) is not None:
                self._learn_reader(binding, schema_id, data[:5])
            return value
        try:
            return decode(data)
        except Exception as error:
            schema_id = wire_schema_id(data)
            what = f"avro {_field(binding.is_key)} of {binding.topic} (schema id {schema_id})"
            raise SchemaError(f"{what}: {describe(error)}", schema_id) from error

    def _fast_writer(self, header: bytes) -> Callable[[Any], bytes] | None:
        """What confluent-kafka's serializer does for a schema of our own (it runs rules only for a registry
        version: `version` set), with the header it wrote: our schema's compiled codec, else fastavro's writer."""
        from fastavro import parse_schema, schemaless_writer

        parsed = parse_schema(json.loads(self.schema))
        if _is_bytes(parsed):
            return None
        compiled = compile_wire(parsed, header)
        if compiled is not None:
            return compiled[1]

        def fastavro_encode(obj: Any) -> bytes:
            out = io.BytesIO()
            out.write(header)
            schemaless_writer(out, parsed, obj)
            return out.getvalue()

        return fastavro_encode

    def _learn_reader(self, binding: _Binding, schema_id: int, header: bytes) -> None:
        """After confluent-kafka's deserializer read a record of `schema_id`: its fast path, if no rule applies."""
        if self.version == LATEST:  # read as the subject's latest version: its migration rules stay confluent's
            return
        from fastavro import parse_schema, schemaless_reader
        from fastavro.schema import to_parsing_canonical_form

        subject = self.subject(binding.topic, binding.is_key) if self.subject_strategy == "topic" else None
        try:
            written = binding.client.get_schema(schema_id, subject)  # in the client's cache since the read
        except Exception:  # learnt at the next record of this id instead: the fast path is an optimisation
            return
        if written.rule_set is not None or written.references:
            return
        reader_text = self.pinned(binding).schema.schema_str if isinstance(self.version, int) else self.schema
        writer = parse_schema(json.loads(written.schema_str))
        reader = parse_schema(json.loads(reader_text)) if reader_text is not None else None
        if reader is not None and to_parsing_canonical_form(reader) == to_parsing_canonical_form(writer):
            reader = None  # the same names, types and order (docs, defaults aside): read as written
        if _is_bytes(writer) or _is_bytes(reader):
            return
        compiled = compile_wire(writer, header) if reader is None else None
        if compiled is not None:
            binding.readers[header] = compiled[0]
        else:
            binding.readers[header] = lambda data: schemaless_reader(io.BytesIO(data[5:]), writer, reader)

    def _serializer(self, client: Any, conf: dict[str, Any]) -> Any:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return AvroSerializer(client, self.schema, conf=conf)

    def _deserializer(self, client: Any, conf: dict[str, Any], reader_schema: Any) -> Any:
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(client, reader_schema, conf=conf)


def _is_bytes(schema: Any) -> bool:
    """confluent-kafka writes a "bytes" schema's value raw (no length): such schemas keep its own path."""
    return schema == "bytes" or (isinstance(schema, dict) and schema.get("type") == "bytes")


class ProtobufSerde(RegistrySerde):
    """Protobuf: `schema` is the generated message class (a _pb2 module's); values are its messages."""

    format_name = "protobuf"

    def __init__(self, message_type: Any, **options: Any) -> None:
        if message_type is None or not hasattr(message_type, "DESCRIPTOR"):
            raise ValueError(f"ProtobufSerde needs a generated message class (a _pb2 module's), not {message_type!r}")
        super().__init__(message_type, **options)

    def record_name(self) -> str | None:
        return str(self.schema.DESCRIPTOR.full_name)

    def _serializer(self, client: Any, conf: dict[str, Any]) -> Any:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

        return ProtobufSerializer(self.schema, client, conf=conf)

    def _deserializer(self, client: Any, conf: dict[str, Any], reader_schema: Any) -> Any:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

        return ProtobufDeserializer(self.schema, conf=conf, schema_registry_client=client)


class JsonSchemaSerde(RegistrySerde):
    """JSON Schema: values are what json.loads gives; each is validated against the schema (the .json text)."""

    format_name = "json"

    def record_name(self) -> str | None:
        parsed = json.loads(self.schema) if isinstance(self.schema, str) else None
        return str(parsed["title"]) if isinstance(parsed, dict) and "title" in parsed else None

    def _serializer(self, client: Any, conf: dict[str, Any]) -> Any:
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        return JSONSerializer(self.schema, client, conf=conf)

    def _deserializer(self, client: Any, conf: dict[str, Any], reader_schema: Any) -> Any:
        from confluent_kafka.schema_registry.json_schema import JSONDeserializer

        return JSONDeserializer(reader_schema, schema_registry_client=client, conf=conf)


def _strategy(name: str) -> Any:
    from confluent_kafka.schema_registry import (
        record_subject_name_strategy,
        topic_record_subject_name_strategy,
        topic_subject_name_strategy,
    )

    strategies = {
        "topic": topic_subject_name_strategy,
        "record": record_subject_name_strategy,
        "topic_record": topic_record_subject_name_strategy,
    }
    return strategies[name]


# -- errors ----------------------------------------------------------------------------------------------------------
def wire_schema_id(data: bytes) -> int | None:
    """The schema id in the Confluent wire format's header; None when the bytes do not start with one."""
    if len(data) < 5 or data[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(data[1:5], "big")


def transient(error: BaseException) -> bool:
    """Whether `error` says the registry cannot serve now (no answer, a time-out, 5xx, refused credentials), rather
    than something about the record: retry later, never dead-letter."""
    from confluent_kafka.schema_registry import SchemaRegistryError
    from confluent_kafka.schema_registry.common._httpx_compat import httpx

    if isinstance(error, httpx.TransportError):
        return True
    if isinstance(error, SchemaRegistryError):
        status = error.http_status_code
        return status in TRANSIENT_STATUS or status >= 500
    return False


def describe(error: BaseException) -> str:
    """An error as one line: its type and message (the client's errors never hold the credentials: they travel in
    the Authorization header only, and SCHEMA_REGISTRY_URL may not carry any)."""
    return f"{type(error).__name__}: {error}"


# After a request that got no answer, nothing asks the same client again for HOLD_S: a partition whose record needs
# the registry then waits at once, instead of each asking in turn (where the look-up runs on the loop's thread, each
# would block it for SCHEMA_REGISTRY_TIMEOUT_MS: 48 partitions x 5 s would outlast MAX_POLL_INTERVAL_MS). Records
# whose schemas are known (Avro's fast path) never come here. Keyed by the client (weakly: a client's id could be
# reused by a new one): one registry, one verdict.
HOLD_S = 2.0
_down_until: weakref.WeakKeyDictionary[Any, tuple[float, str]] = weakref.WeakKeyDictionary()


def _refuse_while_down(client: Any) -> None:
    held = _down_until.get(client)
    if held is not None and time.monotonic() < held[0]:
        raise RegistryUnavailable(f"schema registry: {held[1]} (less than {HOLD_S:.0f} s ago: not asked again yet)")


def _down(client: Any, error: BaseException) -> RegistryUnavailable:
    _down_until[client] = (time.monotonic() + HOLD_S, describe(error))
    return RegistryUnavailable(f"schema registry: {describe(error)}")


def _field(is_key: bool) -> str:
    return "key" if is_key else "value"
