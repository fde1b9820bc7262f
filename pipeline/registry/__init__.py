"""Schema Registry serdes: Avro, Protobuf and JSON Schema in the Confluent wire format (magic byte 0, the schema id in
4 bytes, the payload), through confluent-kafka's own `schema_registry` serializers (the `[registry]` extra).

    from pipeline.registry import AvroSerde
    App(..., value_serde=AvroSerde(), output_value_serde=AvroSerde(Path("total.avsc").read_text()))

A registry serde is declared without a connection. `configured(app, settings)` (pipeline/core/configure.py: every
runner and command goes through it) binds each one to its topic, its field (key or value) and the registry client of
SCHEMA_REGISTRY_URL; `check(app)` then asks the registry at start-up (run_service): reachable, credentials accepted,
each output schema compatible with its subject's latest under the subject's rule (and registered when
auto_register). The test driver binds an in-memory client instead (`bind(app, client)`).

Nothing here imports the registry libraries until a serde is bound: an App without one never loads them.

Per record no registry call: confluent-kafka's client caches schemas by id and registrations by subject; only the
first record of a schema id not seen yet asks. If the registry does not answer then, the record is retried later
(RegistryUnavailable); a record whose schema id the registry does not know, or whose bytes do not decode, is
dead-lettered with error type `schema` (SchemaError).
"""

from __future__ import annotations

from pipeline.registry.binding import (
    bind,
    bind_from_settings,
    bound_for_tests,
    check,
    client_for,
    memory_registry,
    probe,
    registry_serdes,
    unreachable,
    uses_registry,
)
from pipeline.registry.serdes import (
    LATEST,
    SUBJECT_STRATEGIES,
    AvroSerde,
    JsonSchemaSerde,
    ProtobufSerde,
    RegistrySerde,
    describe,
    transient,
    wire_schema_id,
)

__all__ = [
    "LATEST",
    "SUBJECT_STRATEGIES",
    "AvroSerde",
    "JsonSchemaSerde",
    "ProtobufSerde",
    "RegistrySerde",
    "bind",
    "bind_from_settings",
    "bound_for_tests",
    "check",
    "client_for",
    "describe",
    "memory_registry",
    "probe",
    "registry_serdes",
    "transient",
    "unreachable",
    "uses_registry",
    "wire_schema_id",
]
