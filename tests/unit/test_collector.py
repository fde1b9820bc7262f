"""The running service's garbage collector (pipeline/core/collector.py): never on another thread than the loop's (a
collection on a librdkafka thread that frees a client aborts the process), and what Python would have collected,
collected by the loop's turns."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

from pipeline.core.collector import FULL_BUDGET, LoopCollector


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collections() -> Iterator[list[tuple[int, int]]]:
    """(generation, thread ident) of every collection while the test runs, with Python's automatic collection on as
    in a service process (tests/conftest.py turns it off during tests)."""
    seen: list[tuple[int, int]] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append((info["generation"], threading.get_ident()))

    gc.collect()
    gc.enable()
    gc.callbacks.append(callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(callback)


def make_garbage(count: int) -> weakref.ref:
    """`count` cycles dropped at once; a weak reference to the first, alive until a collection frees it."""
    first = Cycle()
    ref = weakref.ref(first)
    del first
    for _ in range(count):
        Cycle()
    return ref


def test_another_thread_allocating_never_collects_and_the_loop_turn_does(collections):
    with LoopCollector() as collector:
        refs: list[weakref.ref] = []
        worker = threading.Thread(target=lambda: refs.append(make_garbage(50_000)))  # far past the thresholds
        worker.start()
        worker.join()
        assert not collections, "a collection ran on the allocating thread"
        assert refs[0]() is not None
        for _ in range(3):  # the youngest generation first, then the older ones as their counts grow
            collector.turn()
        assert collections and {thread for _, thread in collections} == {threading.get_ident()}
    gc.collect()  # the cycle survived into an older generation than three turns reach: freed by the next collection
    assert refs[0]() is None
    assert gc.isenabled(), "automatic collection back on after the run"


def test_without_the_collector_the_allocating_thread_collects(collections):
    """The rule above, broken: what a service did before (a collection on whichever thread allocated)."""
    threads: list[int] = []

    def allocate() -> None:
        threads.append(threading.get_ident())
        make_garbage(50_000)

    worker = threading.Thread(target=allocate)
    worker.start()
    worker.join()
    assert threads[0] in {thread for _, thread in collections}


def test_a_turn_collects_only_past_a_threshold(collections):
    with LoopCollector() as collector:
        gc.collect()
        collections.clear()
        collector.turn()
        assert not collections
        make_garbage(gc.get_threshold()[0] + 100)
        collector.turn()
        assert [generation for generation, _ in collections] == [0]


def test_a_full_collection_waits_for_its_budget(collections, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(gc, "get_count", lambda: (0, 0, gc.get_threshold()[2] + 1))  # the oldest over its threshold
    took = 0.5
    real_collect = gc.collect

    def collect(generation: int = 2) -> int:
        now[0] += took if generation == 2 else 0.0
        return real_collect(generation)

    monkeypatch.setattr(gc, "collect", collect)
    with LoopCollector(clock=lambda: now[0]) as collector:
        collector.turn()  # the first full collection: due
        collector.turn()  # right after it: not due, the next generation down is not over its threshold either
        now[0] += FULL_BUDGET * took - 0.01
        collector.turn()
        assert [generation for generation, _ in collections] == [2]
        now[0] += 0.02
        collector.turn()
        assert [generation for generation, _ in collections] == [2, 2]


def test_a_collector_inside_a_process_that_had_collection_off_leaves_it_off():
    gc.disable()
    with LoopCollector():
        pass
    assert not gc.isenabled()
