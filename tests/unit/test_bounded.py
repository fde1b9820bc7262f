"""A client call that does not return by its deadline (pipeline/kafka/bounded.py): librdkafka's commit_transaction,
given 10 s, once blocked 270 s after a coordinator died, and the poll loop with it."""

from __future__ import annotations

import threading

import pytest

from pipeline.kafka.bounded import CallHung, grace_s, within


def test_the_result_and_the_error_of_a_call_reach_the_caller() -> None:
    assert within(1.0, lambda a, b: a + b, 2, 3) == 5

    def refused() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        within(1.0, refused)


def test_a_call_that_outlives_its_time_out_and_the_grace_is_given_up() -> None:
    stuck = threading.Event()
    with pytest.raises(CallHung, match=r"wait did not return within 1\.1 s"):
        within(0.1, stuck.wait, 30)
    assert within(0.1, lambda: "next") == "next"  # on another worker: the stuck one is never handed a call again
    stuck.set()


def test_the_grace_grows_with_the_time_out() -> None:
    assert grace_s(0.1) == 1.0 and grace_s(10.0) == 5.0
