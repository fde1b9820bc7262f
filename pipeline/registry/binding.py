"""Binding an App's registry serdes to a registry client, and the start-up check (pipeline/registry/__init__.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from pipeline.registry.serdes import RegistrySerde, _field, describe, transient
from pipeline.retry import Backoff, retry
from pipeline.serde import Serde
from pipeline.settings import ConfigError, Settings

if TYPE_CHECKING:
    from pipeline.app import App

log = logging.getLogger(__name__)
START_UP_ATTEMPTS = 4  # a schema's start-up check, asked again 0.2, 0.4 and 0.8 s after a 5xx or no answer

# -- binding an App --------------------------------------------------------------------------------------------------
_clients: dict[tuple[str, str, int], Any] = {}
_clients_lock = threading.Lock()


def client_for(settings: Settings) -> Any:
    """The registry client of SCHEMA_REGISTRY_URL, one per process and connection settings (its caches shared by
    every serde: a schema is fetched once per process). No request is made here."""
    url = settings.schema_registry_url
    if not url:
        raise ConfigError(
            "SCHEMA_REGISTRY_URL is empty: this App has registry serdes (Avro, Protobuf or JSON Schema topics)"
        )
    key = (url, str(settings.schema_registry_user_info), settings.schema_registry_timeout_ms)
    with _clients_lock:
        if key not in _clients:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            conf: dict[str, Any] = {
                "url": url,
                "timeout": settings.schema_registry_timeout_ms / 1000,
                "max.retries": 0,  # the runner's own back-off retries (pipeline/core/processing.py)
            }
            if settings.schema_registry_user_info:
                conf["basic.auth.user.info"] = str(settings.schema_registry_user_info)
            _clients[key] = SchemaRegistryClient(conf)
        return _clients[key]


def memory_registry() -> Any:
    """An in-memory registry client (confluent-kafka's mock): the test driver's default. It keeps schemas and ids
    as a registry does, but checks no compatibility: claims about compatibility are tested against a real one."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": "mock://driver"})  # a mock:// URL: the mock, its own store


def bound_for_tests(app: App, client: Any = None) -> tuple[App, Any]:
    """The test driver's binding: the App's registry serdes bound to `client`, by default a new in-memory one (made
    only for an App that has any); and the client."""
    if not uses_registry(app):
        return app, client
    client = memory_registry() if client is None else client
    return bind(app, client), client


def registry_serdes(app: App) -> Iterator[tuple[str, str, bool, RegistrySerde]]:
    """(role, topic, is_key, serde) of every registry serde the App declares: its inputs' ("input"), its tables'
    ("table") and its outputs' ("output", on the output topic)."""
    for stream in app.streams:
        for is_key, serde in ((True, stream.key_serde), (False, stream.value_serde)):
            if isinstance(serde, RegistrySerde):
                yield "input", stream.topic, is_key, serde
    for table in (*app.table_specs.values(), *app.global_table_specs.values()):
        for is_key, serde in ((True, table.key_serde), (False, table.value_serde)):
            if isinstance(serde, RegistrySerde):
                yield "table", table.topic, is_key, serde
    for is_key, serde in ((True, app.output_key_serde), (False, app.output_value_serde)):
        if isinstance(serde, RegistrySerde):
            yield "output", app.output_topic, is_key, serde


def uses_registry(app: App) -> bool:
    return any(True for _ in registry_serdes(app)) or isinstance(app.state_serde, RegistrySerde)


def bind(app: App, client: Any) -> App:
    """The App with every registry serde bound to `client` and to its topic and field. Serdes bound already (the
    test driver's, a test's own client) are kept."""
    if isinstance(app.state_serde, RegistrySerde):
        raise ConfigError(f"App {app.name!r}: state_serde cannot be a registry serde (state is private: JSON)")

    def bound(serde: Serde, topic: str, is_key: bool) -> Serde:
        if isinstance(serde, RegistrySerde) and not serde.bound:
            return serde.bind(client, topic, is_key)
        return serde

    def bound_table(table: Any) -> Any:
        return replace(
            table,
            key_serde=bound(table.key_serde, table.topic, True),
            value_serde=bound(table.value_serde, table.topic, False),
        )

    streams = tuple(
        replace(s, key_serde=bound(s.key_serde, s.topic, True), value_serde=bound(s.value_serde, s.topic, False))
        for s in app.streams
    )
    return replace(
        app,
        input_topic="",
        inputs=streams,
        tables={name: bound_table(t) for name, t in app.table_specs.items()},
        global_tables={name: bound_table(t) for name, t in app.global_table_specs.items()},
        output_key_serde=bound(app.output_key_serde, app.output_topic, True),
        output_value_serde=bound(app.output_value_serde, app.output_topic, False),
    )


def bind_from_settings(app: App, settings: Settings) -> App:
    """`bind` with the client of SCHEMA_REGISTRY_URL, for an App that has registry serdes not bound yet."""
    if not any(not serde.bound for *_, serde in registry_serdes(app)):
        return app
    return bind(app, client_for(settings))


# -- the start-up check ----------------------------------------------------------------------------------------------
def check(app: App, settings: Settings) -> None:
    """Before anything is consumed (run_service): the registry answers with these credentials, and every output
    schema fits its subject (compatible with the latest version under the subject's rule, then registered; or, with
    auto_register off, registered already; or the pinned or latest version exists). ConfigError naming the setting
    or the subject otherwise (exit 2)."""
    serdes = list(registry_serdes(app))
    if not serdes:
        return
    probe(app, settings)
    for role, topic, is_key, serde in serdes:
        try:
            retry(
                partial(_check_serde, role, topic, is_key, serde),
                retriable=_ask_again,
                backoff=Backoff(0.2),
                attempts=START_UP_ATTEMPTS,
                on_failure=_asking_again,
            )
        except ConfigError:
            raise
        except Exception as error:
            if transient(error):
                raise ConfigError(unreachable(settings, error)) from error
            subject = serde.subject(topic, is_key)
            raise ConfigError(f"{role} {topic} ({_field(is_key)}), subject {subject!r}: {describe(error)}") from error


def _check_serde(role: str, topic: str, is_key: bool, serde: RegistrySerde) -> None:
    if role == "output":
        _check_output(serde, topic, is_key)
    elif serde.version is not None:
        serde._reader(serde._bound())


def _ask_again(error: Exception) -> bool:
    """A registry error at start-up worth one more try: 5xx or no answer, not refused credentials. Apicurio with its
    H2 storage answered 500 (a unique-key violation on its content table) to one of two instances registering
    the same new schema at the same moment; asked again, it found the schema registered."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    refused = isinstance(error, SchemaRegistryError) and error.http_status_code in (401, 403)
    return transient(error) and not refused


def _asking_again(error: Exception, failures: int, delay: float | None) -> None:
    if delay is not None:
        log.warning("schema registry at start-up: %s; asking again in %.1f s", describe(error), delay)


def probe(app: App, settings: Settings) -> None:
    """The registry of the App's serdes answers with these credentials (one request, nothing registered: what
    `pipeline verify` asks before it reads); ConfigError naming the setting otherwise."""
    bound = [serde for *_, serde in registry_serdes(app) if serde.bound]
    if not bound:
        return
    try:
        bound[0]._bound().client.get_subjects()
    except Exception as error:
        raise ConfigError(unreachable(settings, error)) from error


def unreachable(settings: Settings, error: BaseException) -> str:
    """The start-up error of a registry that does not answer, or refuses the credentials: names the setting."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    url = settings.schema_registry_url
    if isinstance(error, SchemaRegistryError) and error.http_status_code in (401, 403):
        if settings.schema_registry_user_info:
            return (
                f"SCHEMA_REGISTRY_USER_INFO: the schema registry at {url} refused the credentials (HTTP "
                f"{error.http_status_code}): give the user:password of an account it accepts"
            )
        return (
            f"SCHEMA_REGISTRY_USER_INFO is empty: the schema registry at {url} asks for credentials (HTTP "
            f"{error.http_status_code}): set it to user:password"
        )
    return (
        f"SCHEMA_REGISTRY_URL={url}: the schema registry did not answer within SCHEMA_REGISTRY_TIMEOUT_MS="
        f"{settings.schema_registry_timeout_ms} ({describe(error)}): is it running there, and reachable?"
    )


def _check_output(serde: RegistrySerde, topic: str, is_key: bool) -> None:
    """An output serde's schema against its subject; its serializer made (and the registration cached) here."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    binding = serde._bound()
    client, subject = binding.client, serde.subject(topic, is_key)
    where = f"output {topic} ({_field(is_key)})"
    writer = serde._writer(binding)
    if serde.version is None:
        # The Schema exactly as the serializer registers it (a primitive Avro schema wrapped, a .proto's file
        # descriptor encoded): registered here, the serializer finds it in the client's cache and asks nothing.
        schema = writer._schema  # type: ignore[attr-defined]
        try:
            compatible = client.test_compatibility(subject, schema)
        except SchemaRegistryError as error:
            if error.http_status_code != 404:  # 404: no such subject yet, nothing to be compatible with
                raise
            compatible = True
        if not compatible:
            raise ConfigError(
                f"{where}: its schema is incompatible with the latest version of subject {subject!r} under the "
                f"subject's compatibility rule ({_compatibility(client, subject)}): make a compatible change, or "
                "write to a new topic (a new subject)"
            )
        if not serde.auto_register:
            try:
                client.lookup_schema(subject, schema)
            except SchemaRegistryError as error:
                if error.http_status_code != 404:
                    raise
                raise ConfigError(
                    f"{where}: its schema is not registered under subject {subject!r}, and auto_register is off: "
                    "register it, or declare the serde with auto_register=True"
                ) from error
        else:
            _register(client, subject, schema)


def _register(client: Any, subject: str, schema: Any) -> None:
    """Registers the output schema under its subject. Two instances starting at once both register a new subject:
    Apicurio answers the second with 409 ("already exists"); the schema is then registered, which a look-up shows."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    try:
        client.register_schema(subject, schema)
    except SchemaRegistryError as error:
        if error.http_status_code != 409:
            raise
        try:
            client.lookup_schema(subject, schema)
        except SchemaRegistryError:
            raise error from None  # not registered by another: the registry's refusal, as it came


def _compatibility(client: Any, subject: str) -> str:
    """The subject's compatibility level, else the registry's global one (for the error message only)."""
    for name in (subject, None):
        try:
            return str(client.get_compatibility(name))
        except Exception:  # the level only makes the message clearer: a failure to read it is no error
            continue
    return "unknown"
