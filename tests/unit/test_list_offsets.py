"""ListOffsets answers are offsets only when they are not negative (pipeline/kafka/offsets.py: known). While a broker
of the 3-node cluster restarted, a restore's snapshot scan got a negative one, assigned offset -8 and its process
exited (a fault test's exit check found it)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.kafka.offsets import EndOffsetsTimeout, stable_end_offsets, watermarks


class Answers:
    """AdminClient.list_offsets, answering each ask with the next offset of `answers` for every partition."""

    def __init__(self, *answers: int | KafkaError) -> None:
        self.answers = list(answers)
        self.asks = 0

    def list_offsets(self, request: dict[TopicPartition, Any], **kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        offset = self.answers[min(self.asks, len(self.answers) - 1)]
        self.asks += 1
        futures: dict[TopicPartition, Future[Any]] = {}
        for tp in request:
            futures[tp] = Future()
            if isinstance(offset, KafkaError):
                futures[tp].set_exception(KafkaException(offset))
            else:
                futures[tp].set_result(SimpleNamespace(offset=offset))
        return futures

    def list_topics(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_a_negative_watermark_is_asked_again_until_a_real_one_comes() -> None:
    admin = Answers(-1001, 5)
    assert watermarks(admin, "snapshots", [0, 1], timeout_s=5) == {0: 5, 1: 5}  # type: ignore[arg-type]
    assert admin.asks == 2


def test_a_watermark_that_stays_negative_is_end_offsets_not_known() -> None:
    with pytest.raises(EndOffsetsTimeout, match="-1"):
        watermarks(Answers(-1), "snapshots", [0], timeout_s=0.3)  # type: ignore[arg-type]


def test_a_negative_stable_end_is_end_offsets_not_known() -> None:
    with pytest.raises(EndOffsetsTimeout, match="snapshots"):
        stable_end_offsets(Answers(-1), "snapshots", [0], timeout_s=1)  # type: ignore[arg-type]
    assert stable_end_offsets(Answers(12), "snapshots", [0], timeout_s=1) == {0: 12}  # type: ignore[arg-type]


def test_a_new_leader_whose_high_watermark_has_not_caught_up_is_asked_again() -> None:
    admin = Answers(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE), 9)
    assert watermarks(admin, "in", [0], timeout_s=5) == {0: 9}  # type: ignore[arg-type]
    assert admin.asks == 2
