"""A stop (SIGTERM) that comes while the group's assignment waits to be served: the consumer's close serves it, and
the runner takes nothing over, then ends cleanly. A CI fault run's instance exited with code 1 on SIGTERM: taken
over inside the close, the partitions' committed offsets timed out (the closing consumer no longer asks)."""

from __future__ import annotations

import logging

import pytest

from pipeline.core.loop import PollLoop
from pipeline.testing.harness import group_owners
from tests.integration.test_restore import fresh_app, make_runner
from tests.support import eventually


def stop_while_an_assignment_waits(runner: PollLoop, bootstrap: str, partitions: int, caplog) -> None:
    """Runs `runner` whose first turn does not poll: the broker assigns every partition, the assignment waits in the
    consumer, and the stop comes. The run must end without an error and without taking a partition over."""

    def first_turn() -> None:
        owned = lambda: sorted(p for ps in group_owners(bootstrap, runner.app_id).values() for p in ps)  # noqa: E731
        eventually(lambda: owned() == list(range(partitions)))
        runner.stop()

    runner._loop_once = first_turn  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, "pipeline"):
        runner.run()
    assert "after the stop was asked: left to the next owner" in caplog.text, caplog.text
    assert "restored" not in caplog.text, caplog.text
    assert not runner._owned_partitions()


@pytest.mark.parametrize("producers", ["per_process", "per_partition"])
def test_a_stop_while_an_assignment_waits_takes_nothing_over_and_ends_cleanly(kafka_bootstrap, caplog, producers):
    app, app_id = fresh_app(kafka_bootstrap, partitions=3)
    stop_while_an_assignment_waits(
        make_runner(app, app_id, kafka_bootstrap, producers=producers), kafka_bootstrap, 3, caplog
    )
