"""Serialisers: how keys, values and state travel as bytes. Pick one per field of an `App`."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextvars import ContextVar
from decimal import Decimal
from typing import Any, Protocol, cast

import orjson


class SerdeError(ValueError):
    """A payload could not be (de)serialised. Poison input, never a bug in the runner."""


class SchemaError(SerdeError):
    """A registry serde (pipeline/registry.py) cannot decode this record: the schema id it names is unknown to the
    registry, or its bytes do not match the schema (or lack the wire format's header). Retrying cannot help: the
    record is dead-lettered at once, with error type `schema` and `schema_id` (None: no readable header) in
    the eos.dlq.schema.id header."""

    error_type = "schema"

    def __init__(self, message: str, schema_id: int | None = None) -> None:
        super().__init__(message)
        self.schema_id = schema_id


class RegistryUnavailable(Exception):
    """The schema registry did not answer (down, paused, overloaded, 5xx): a transient fault of the service, never
    the record's. The record is tried again later and is never dead-lettered for it (docs/guarantees.md)."""


class RegistryPending(RegistryUnavailable):
    """A registry look-up the record needs (a schema id not cached yet, an output schema's registration) runs on a
    worker thread: the record waits, its partition paused, until `answered` is set, then is tried again. The poll
    loop never waits on HTTP. Raised only where `background_registry_lookups` is on."""

    def __init__(self, message: str, answered: threading.Event) -> None:
        super().__init__(message)
        self.answered = answered


# Whether registry serdes look schemas up on a worker thread (RegistryPending) instead of the calling thread: on
# where the sink pauses the record's partition until the answer comes (the Kafka sink's one-input tasks).
background_registry_lookups: ContextVar[bool] = ContextVar("background_registry_lookups", default=False)


class Serde(Protocol):
    def serialize(self, obj: Any) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> Any: ...


class BytesSerde:
    """Passes bytes through untouched (the copier uses it)."""

    def serialize(self, obj: bytes | None) -> bytes | None:
        return obj

    def deserialize(self, data: bytes | None) -> Any:
        return data


class StringSerde:
    def serialize(self, obj: Any) -> bytes | None:
        return None if obj is None else obj.encode()

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return data.decode()
        except UnicodeDecodeError as e:
            raise SerdeError(f"not UTF-8: {e}") from e


class JsonSerde:
    """JSON via orjson (fast, strict). `JsonSerde(decimal=True)` carries exact numbers such as money.

    decimal=True: a `decimal.Decimal` is written as a JSON number digit for digit, never through a binary float
    (Decimal("0.10") is sent as 0.10), and every JSON number with a fraction or an exponent is read back as a Decimal
    (json's parse_float=Decimal; integers stay int, so write Decimal("5.00") rather than Decimal("5") to keep the
    scale). Reading then goes through the standard library's json, which is slower than orjson (BENCHMARKS.md).
    Without it a Decimal is refused with a TypeError naming the option: it would come back as a float.
    """

    def __init__(self, decimal: bool = False) -> None:
        self.decimal = decimal
        self._default = _decimal_as_number if decimal else _refuse_decimal

    def __repr__(self) -> str:
        return f"JsonSerde(decimal={self.decimal})"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        try:
            return orjson.dumps(obj, default=self._default)
        except orjson.JSONEncodeError as e:
            # orjson's message hides the one raised by `default` (it is the cause): show the cause, which names the fix.
            raise TypeError(str(e.__cause__ or e)) from e

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            if self.decimal:
                return json.loads(data.decode(), parse_float=Decimal, parse_constant=_refuse_constant)
            return orjson.loads(data)
        except (ValueError, UnicodeDecodeError) as e:  # orjson's and json's JSONDecodeError are ValueErrors
            raise SerdeError(f"invalid JSON: {e}") from e


def _decimal_as_number(value: Any) -> orjson.Fragment:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise TypeError(f"Decimal {value} is no JSON number (NaN and infinities are not JSON)")
        return orjson.Fragment(str(value))  # str() of a finite Decimal is a valid JSON number: 1.10, -0, 1E+3
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _refuse_decimal(value: Any) -> Any:
    if isinstance(value, Decimal):
        raise TypeError("a Decimal: use JsonSerde(decimal=True), which keeps it exact (it would come back a float)")
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


BYTES = BytesSerde()
STRING = StringSerde()
JSON = JsonSerde()


def identity(value: Any) -> Any:
    return value


def skip_bytes_deserialize(serde: Serde) -> Callable[[bytes | None], Any] | None:
    """The serde's deserialize, or None when it passes bytes through: the hot path then saves a call per record."""
    return None if isinstance(serde, BytesSerde) else serde.deserialize


def skip_bytes_serialize(serde: Serde) -> Callable[[Any], bytes | None] | None:
    """The serde's serialize, or None when it passes bytes through."""
    return None if isinstance(serde, BytesSerde) else serde.serialize


def fast_deserialize(serde: Serde) -> Callable[[Any], Any] | None:
    """A C function that decodes as the serde does, for the hot path: where it does not raise, it returns what
    `serde.deserialize` returns; where it raises (None, bytes the serde refuses), the caller asks the serde itself,
    which gives the answer (None for None) or raises its own error. None: the serde has no such twin (the type's own
    subclasses included: they may decode otherwise)."""
    kind = type(serde)
    if kind is StringSerde:
        return cast(Callable[[Any], Any], bytes.decode)
    if kind is JsonSerde and not cast(JsonSerde, serde).decimal:
        return cast(Callable[[Any], Any], orjson.loads)
    return None


def fast_serialize(serde: Serde) -> Callable[[Any], Any] | None:
    """A C function that encodes as the serde does, for every value but None (which the serde writes as None, the
    tombstone): where it does not raise, the same bytes as `serde.serialize`; where it raises, the caller asks the serde
    itself. None: the serde has no such twin."""
    kind = type(serde)
    if kind is StringSerde:
        return cast(Callable[[Any], Any], str.encode)
    if kind is JsonSerde and not cast(JsonSerde, serde).decimal:
        return orjson.dumps  # without `default`: it only serves values orjson refuses, and the serde's own call does
    return None
