"""`python -m tools.bench --phases` times the steps it names and puts every method back (no broker)."""

from __future__ import annotations

from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from tools.bench.phases import OURS, Phases


def test_the_steps_are_timed_while_installed_and_put_back_after() -> None:
    before = {(owner, name): owner.__dict__[name] for owner, name, _ in OURS}
    phases = Phases()
    with phases.installed():
        assert all(owner.__dict__[name] is not before[(owner, name)] for owner, name, _ in OURS)
        assert KafkaTask._process.__name__ == "timed_call" and KafkaRunner._loop_once.__name__ == "timed_call"
    assert {(owner, name): owner.__dict__[name] for owner, name, _ in OURS} == before


def test_a_run_is_reported_per_record_with_the_whole_turn_first_and_the_counts_start_over() -> None:
    phases = Phases()
    busy = phases.timed("process", lambda n: sum(i * i for i in range(n)))
    turn = phases.timed("turn", lambda: busy(200_000))
    turn()
    line = phases.take(1_000)
    assert line.startswith("phases, loop-thread CPU per record: turn ") and ", process " in line
    turn_us, process_us = (float(part.split()[-2]) for part in line.split(": ", 1)[1].split(", "))
    assert turn_us >= process_us > 0
    assert phases.take(1_000) == "phases: nothing timed"
