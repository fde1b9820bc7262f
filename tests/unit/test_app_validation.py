"""An App checks itself when it is built (pipeline/app_checks.py; docs/guarantees.md: fail-fast): each mistake is an
error naming the argument and the fix, at the line that builds the App."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from pipeline.app import App, CodeError, Output, Record, State
from pipeline.state.versions import StateVersionError
from pipeline.testing.driver import AppDriver, PartitionStopped


def process(state: State, record: Record) -> Iterable[Output]:
    state[record.key] = record.value
    return [Output(record.value)]


MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "name not a str": ({"name": 123}, "App name must be a non-empty str"),
    "empty name": ({"name": ""}, "App name must be a non-empty str"),
    "process not callable": ({"process": "x"}, "process must be a function process(state, record)"),
    "process with one argument": ({"process": lambda record: []}, "process cannot be called as process(state"),
    "on_timer with three": ({"on_timer": lambda s, t, x: []}, "on_timer cannot be called as on_timer(state, timer)"),
    "migrate not callable": ({"migrate": 1, "state_version": 2}, "migrate must be a function migrate(version"),
    "input is the output": ({"output_topic": "in"}, "output_topic 'in' is also read"),
    "illegal topic": ({"input_topic": "in put"}, "'in put' is not a Kafka topic name"),
    "dot topic": ({"output_topic": ".."}, "'..' is not a Kafka topic name"),
    "long topic": ({"output_topic": "x" * 250}, "is not a Kafka topic name"),
    "topic not a str": ({"output_topic": 5}, "output_topic must be a str"),
    "serde not a serde": ({"value_serde": "json"}, "value_serde must be a Serde"),
    "state_version 2 without migrate": ({"state_version": 2}, "state_version=2 needs migrate(version, value)"),
    "state_version a str": ({"state_version": "2"}, "state_version must be a int"),
    "stateful not a bool": ({"stateful": "no"}, "stateful must be a bool"),
    "ttl a float": ({"state_ttl_ms": 1.5}, "state_ttl_ms must be an int"),
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_is_refused_when_the_app_is_built_naming_the_argument(mistake: str) -> None:
    arguments, said = MISTAKES[mistake]
    with pytest.raises(ValueError, match=None) as refused:
        App(**{"name": "app", "input_topic": "in", "output_topic": "out", "process": process, **arguments})
    assert said in str(refused.value)


def test_a_good_app_with_every_function_is_accepted() -> None:
    App(
        "app",
        "in.v1",
        "out_v1-x",
        process,
        on_timer=lambda state, timer: [],
        migrate=lambda version, value: value,
        state_version=2,
        generate=lambda count, partitions, seed, **extra: [],
        check=lambda run: [],
    )


@pytest.mark.usefixtures("state_store")  # on both stores (tests/unit/conftest.py)
def test_a_migrate_that_returns_none_is_refused_with_a_clear_error(state_store: str) -> None:
    driver = AppDriver(App("v", "in", "out", process))
    driver.send("a", {"n": 1})
    with pytest.raises(PartitionStopped, match=r"migrate\(1, value of state key 'a'\) returned None") as stopped:
        driver.deploy(App("v", "in", "out", process, state_version=2, migrate=lambda version, value: None))
        # On disk the restore migrates nothing (a restart never rewrites every key): the first read of 'a' does, and
        # its failure stops p there, as a mistake in the code (CodeError), never a dead letter.
        driver.send("a", {"n": 2})
    cause = stopped.value.__cause__
    if state_store == "disk":  # CodeStop <- CodeError("migrate") <- the StateVersionError
        assert cause is not None and isinstance(cause.__cause__, CodeError), cause
        assert cause.__cause__.function == "migrate"
        cause = cause.__cause__.__cause__
    assert isinstance(cause, StateVersionError)
    assert not driver.dead_letters
