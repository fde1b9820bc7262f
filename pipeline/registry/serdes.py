"""The registry serdes themselves (pipeline/registry/__init__.py tells how they are declared and bound)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.serde import RegistryUnavailable, SchemaError

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
        try:
            return self._writer(binding)(obj, binding.context)
        except Exception as error:
            if transient(error):
                raise RegistryUnavailable(f"schema registry: {describe(error)}") from error
            raise

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        binding = self._bound()
        try:
            return self._reader(binding)(data, binding.context)
        except Exception as error:
            if transient(error):
                raise RegistryUnavailable(f"schema registry: {describe(error)}") from error
            schema_id = wire_schema_id(data)
            what = f"{self.format_name} {_field(binding.is_key)} of {binding.topic} (schema id {schema_id})"
            raise SchemaError(f"{what}: {describe(error)}", schema_id) from error

    # -- binding -----------------------------------------------------------------------------------------------------
    @property
    def bound(self) -> bool:
        return self._binding is not None

    def bind(self, client: Any, topic: str, is_key: bool) -> RegistrySerde:
        """A copy of this serde for `topic`'s key or value on `client`. No request is made here."""
        from confluent_kafka.serialization import MessageField, SerializationContext

        bound = copy.copy(self)
        context = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
        bound._binding = _Binding(client, topic, is_key, context)
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
    Read with a schema, records of an older or newer writer schema are resolved to it (Avro schema resolution)."""

    format_name = "avro"

    def record_name(self) -> str | None:
        import json

        parsed = json.loads(self.schema) if isinstance(self.schema, str) else None
        if not isinstance(parsed, dict) or "name" not in parsed:
            return None
        name, namespace = str(parsed["name"]), parsed.get("namespace")
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def _serializer(self, client: Any, conf: dict[str, Any]) -> Any:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        return AvroSerializer(client, self.schema, conf=conf)

    def _deserializer(self, client: Any, conf: dict[str, Any], reader_schema: Any) -> Any:
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        return AvroDeserializer(client, reader_schema, conf=conf)


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
        import json

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


def _field(is_key: bool) -> str:
    return "key" if is_key else "value"
