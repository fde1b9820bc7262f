"""An App checks itself when it is built (docs/guarantees.md: fail-fast): a wrong type, a function that cannot be
called as the runtime calls it, a topic name Kafka refuses, an input that is also the output, a state version without
its migrate. Each error names the argument and the fix, at the line that builds the App, before anything runs."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

# The App is passed in, never imported: pipeline/app.py calls these from App.__post_init__ (no import circle).
App = Any

# Kafka's legal topic names: up to 249 of these characters, and neither "." nor "..".
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
SERDES = ("key_serde", "value_serde", "output_key_serde", "output_value_serde", "state_serde")
# The App's functions: how many positional arguments the runtime passes, and what they are.
FUNCTIONS = {
    "process": (2, "process(state, record) -> outputs"),
    "on_timer": (2, "on_timer(state, timer) -> outputs"),
    "migrate": (2, "migrate(version, value) -> value"),
    "generate": (3, "generate(count, partitions, seed) -> records"),
    "check": (1, "check(run) -> problems"),
}


class AppError(ValueError):
    """An App built with an argument it cannot run with."""


def check_app(app: App) -> None:
    """Raises AppError naming the first argument that is wrong and how to fix it."""
    if not isinstance(app.name, str) or not app.name:
        raise AppError(
            f"App name must be a non-empty str (the consumer group and transactional.id prefix), not {app.name!r}"
        )
    where = f"App {app.name!r}"
    _check_types(app, where)
    for name, (arity, usage) in FUNCTIONS.items():
        function = getattr(app, name)
        if function is not None:
            _check_function(where, name, function, arity, usage)
    for name in SERDES:
        _check_serde(where, name, getattr(app, name))
    if app.state_version > 1 and app.migrate is None:
        raise AppError(
            f"{where}: state_version={app.state_version} needs migrate(version, value) -> value, which turns a state "
            "value written at an older version into the current one"
        )


def check_topics(app: App) -> None:
    """The topics an App names, once its inputs are normalised: legal names, the output none of the inputs."""
    where = f"App {app.name!r}"
    read = [*app.co_partitioned, *(t.topic for t in app.global_table_specs.values())]
    for topic in [*read, *([app.output_topic] if app.output_topic else [])]:
        if not isinstance(topic, str) or not TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
            raise AppError(
                f"{where}: {topic!r} is not a Kafka topic name: up to 249 letters, digits, '.', '_' or '-' "
                "(and neither '.' nor '..')"
            )
    if app.output_topic in read:
        raise AppError(
            f"{where}: output_topic {app.output_topic!r} is also read (an input or a table): every output would be "
            "processed again, for ever; write to another topic"
        )


def _check_types(app: App, where: str) -> None:
    checked = (
        ("stateful", bool),
        ("state_version", int),
        ("state_ttl_granularity_ms", int),
        ("output_topic", str),
        ("input_topic", str),
    )
    for name, kind in checked:
        value = getattr(app, name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise AppError(f"{where}: {name} must be a {kind.__name__}, not {type(value).__name__} {value!r}")
    if app.state_ttl_ms is not None and (not isinstance(app.state_ttl_ms, int) or isinstance(app.state_ttl_ms, bool)):
        raise AppError(f"{where}: state_ttl_ms must be an int (milliseconds) or None, not {app.state_ttl_ms!r}")


def _check_function(where: str, name: str, function: Any, arity: int, usage: str) -> None:
    if not callable(function):
        raise AppError(f"{where}: {name} must be a function {usage}, not {type(function).__name__} {function!r:.60}")
    try:
        inspect.signature(function).bind(*range(arity))
    except TypeError as e:
        raise AppError(f"{where}: {name} cannot be called as {usage} ({e}): give it {arity} argument(s)") from e
    except ValueError:  # no signature to read (some builtins): called as it is
        pass


def _check_serde(where: str, name: str, serde: Any) -> None:
    methods: list[Callable[..., Any] | None] = [getattr(serde, m, None) for m in ("serialize", "deserialize")]
    if not all(callable(m) for m in methods):
        raise AppError(
            f"{where}: {name} must be a Serde (serialize(obj) -> bytes and deserialize(bytes) -> obj, e.g. "
            f"pipeline.serde.JSON), not {type(serde).__name__} {serde!r:.60}"
        )
