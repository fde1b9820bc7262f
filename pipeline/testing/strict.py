"""The test driver's strict mode (AppDriver(app, strict=True)): `process` and `on_timer` see their state through a
watcher that remembers every value they read, and after the call checks that none was changed in place without being
assigned back. State values are stored encoded, so `state[k]` is a fresh copy: `state[k]["n"] += 1` alone changes
nothing, which the runtime cannot see and the test would only notice as a wrong total much later."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeline.app import CodeError, Output, State, StateTimers, checked_outputs
from pipeline.serde import Serde

UNASSIGNED_FIX = "assign it back: value = state[key]; value[...] = ...; state[key] = value"


class WatchedState(State):
    """A State that records what is read, for the check after the call."""

    def __init__(self, state: State, serde: Serde) -> None:
        self._state, self._serde = state, serde
        self.read: dict[str, tuple[Any, bytes | None]] = {}  # key -> (the object handed out, its bytes then)

    def _seen(self, key: str, value: Any) -> Any:
        if value is not None:
            self.read[key] = (value, self._serde.serialize(value))
        return value

    def __getitem__(self, key: str) -> Any:
        return self._seen(key, self._state[key])

    def get(self, key: str, default: Any = None) -> Any:
        value = self._state.get(key)
        return default if value is None else self._seen(key, value)

    def __setitem__(self, key: str, value: Any) -> None:
        self.read.pop(key, None)  # assigned: whatever was read before is replaced
        self._state[key] = value

    def __delitem__(self, key: str) -> None:
        self.read.pop(key, None)
        del self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, key: object) -> bool:
        return key in self._state

    @property
    def timers(self) -> StateTimers:
        return self._state.timers

    def __getattr__(self, name: str) -> Any:  # tables, and what the runtime's own state adds
        return getattr(self._state, name)

    def check(self, function: str) -> None:
        for key, (value, then) in self.read.items():
            if self._serde.serialize(value) != then:
                raise CodeError(
                    function, f"changed the value of state[{key!r}] in place without assigning it", UNASSIGNED_FIX
                )


def watched(function: Callable[[State, Any], Iterable[Output]], name: str, serde: Serde) -> Callable[..., list[Output]]:
    """`function` (process or on_timer) with its state watched, and what it returns checked."""

    def call(state: State, argument: Any) -> list[Output]:
        watcher = WatchedState(state, serde)
        outputs = checked_outputs(name, function(watcher, argument))  # a generator runs here, still watched
        watcher.check(name)
        return outputs

    return call
