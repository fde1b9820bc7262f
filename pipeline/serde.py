"""Serialisers: how keys, values and state travel as bytes. Pick one per field of an `App`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson


class SerdeError(ValueError):
    """A payload could not be (de)serialised. Poison input, never a bug in the runner."""


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
    """JSON via orjson (fast, strict)."""

    def serialize(self, obj: Any) -> bytes | None:
        return None if obj is None else orjson.dumps(obj)

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise SerdeError(f"invalid JSON: {e}") from e


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
