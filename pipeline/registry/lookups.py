"""Background registry look-ups of the registry serdes (RegistrySerde._look_up_first, pipeline/registry/serdes.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Lookup:
    """One registry look-up on its own daemon thread: `call` is the serde's own (de)serializer call on the record
    that needed it, which fetches (or registers) the schema into the client's cache. A daemon, so that a hung
    registry never holds the process at exit (each request ends within SCHEMA_REGISTRY_TIMEOUT_MS anyway)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(call,), name="registry-lookup", daemon=True).start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            call()
        except BaseException as error:  # handed to the loop's thread, which decides (RegistrySerde._look_up_first)
            self.error = error
        finally:
            self.done.set()


def registry_answer(error: BaseException) -> bool:
    """An error the registry answered with (a 404 for an unknown schema id, say), rather than one of the record's."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    return isinstance(error, SchemaRegistryError)


def in_memory(client: Any) -> bool:
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient

    return isinstance(client, MockSchemaRegistryClient)
