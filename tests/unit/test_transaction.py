"""PRODUCERS=per_process: one producer's transaction carries every partition's work, and they commit, abort and break
together (pipeline/sinks/kafka/transaction.py, committed by pipeline/sinks/kafka/commit.py). Against the recording
fakes of tests/fakes.py; the real-broker tests are tests/integration/test_per_process_takeover.py and the fault
suite run in this mode."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, TopicPartition

from pipeline.core.lifecycle import Phase
from pipeline.examples.copier import app as copier
from pipeline.sinks.kafka.commit import abort_and_rewind
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from pipeline.sinks.kafka.transaction import PartitionDropped, Transaction, TransactionAborted
from tests.fakes import (
    ABORTABLE,
    FENCED,
    GROUP_METADATA,
    Calls,
    FakeConsumer,
    FakeProducer,
    Hang,
    kafka_exception,
    kafka_message,
)
from tests.harness import CHANGELOG, INPUT, Harness, kafka_runner, msg


class Shared(Harness):
    """Tasks of one process sharing one transaction, as the runner builds them with PRODUCERS=per_process."""

    def __init__(self, **settings) -> None:
        super().__init__(producers="per_process", **settings)
        self.txn = Transaction(
            self._make_producer("unit.in.process-a"),
            self.settings,
            "unit.in.process-a",
            observe_commit=self.metrics.commit_latency.observe,
            renew_with=lambda: self._make_producer("unit.in.process-a"),  # type: ignore[arg-type,return-value]
        )

    def new_task(self, p: int = 0) -> KafkaTask:
        return KafkaTask(self.ctx, p, self.txn)

    def tasks(self, *partitions: int) -> list[KafkaTask]:
        tasks = [self.new_task(p) for p in partitions]
        for task in tasks:
            task.txn.fence()
            task.start(0)
            task.phase = Phase.RUNNING
        self.calls.clear()
        return tasks


def test_one_producer_fenced_once_for_every_partition() -> None:
    h = Shared()
    tasks = [h.new_task(p) for p in (0, 1, 2)]
    for task in tasks:
        task.txn.fence()
    assert len(h.producers) == 1 and {t.producer for t in tasks} == {h.producers[0]}
    assert h.calls.names() == ["init_transactions"]


def test_partitions_commit_together_in_one_transaction_with_all_their_offsets() -> None:
    h = Shared()
    p0, p1 = h.tasks(0, 1)
    p0.process([msg(0), msg(1)])
    p1.process([msg(0)])
    h.commit(p1)  # the runner commits the transaction: every task in it
    assert h.calls.names().count("begin_transaction") == 1
    assert h.calls.names()[-3:] == ["send_offsets_to_transaction", "flush", "commit_transaction"]
    _, (offsets, group, _), _ = h.calls[-3]
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets] == [(INPUT, 0, 2), (INPUT, 1, 1)]
    assert group is GROUP_METADATA
    assert {r["partition"] for r in h.calls.produced(CHANGELOG)} == {0, 1}  # each its own changelog partition
    assert (p0.committed_offset, p1.committed_offset) == (2, 1)
    assert not h.txn.open
    assert h.metric("pipeline_commit_latency_seconds_count") == 1  # one commit, however many partitions


def test_an_abort_rewinds_every_partition_in_the_transaction() -> None:
    h = Shared()
    p0, p1, p2 = h.tasks(0, 1, 2)
    p0.process([msg(0, amount=5)])
    p1.process([msg(0, amount=7)])
    h.producers[0].fail("send_offsets_to_transaction", kafka_exception(**ABORTABLE))
    with pytest.raises(TransactionAborted):
        h.commit(p0)
    abort_and_rewind(p0)
    assert h.calls.count("abort_transaction") == 1
    assert [("seek", (INPUT, p, 0), {}) in h.calls for p in (0, 1, 2)] == [True, True, False]  # p2 had nothing open
    assert (p0.next_offset, p1.next_offset) == (0, 0)
    assert p0.state.get("acct") is None and p1.state.get("acct") is None
    assert p2.phase is Phase.RUNNING


def test_closing_one_partition_without_commit_aborts_and_rewinds_the_others() -> None:
    h = Shared()
    p0, p1 = h.tasks(0, 1)
    p0.process([msg(0)])
    p1.process([msg(0)])
    h.close(p0, commit=False)  # lost
    assert h.calls.count("abort_transaction") == 1
    assert p0.phase is Phase.CLOSED and p1.phase is Phase.RUNNING  # p1 rewound (seek done) and runs on
    assert ("seek", (INPUT, 1, 0), {}) in h.calls and p1.next_offset == 0


def test_a_fenced_producer_breaks_the_transaction_for_all_its_partitions() -> None:
    h = Shared()
    p0, p1 = h.tasks(0, 1)
    p0.process([msg(0)])
    p1.process([msg(0)])
    h.producers[0].fail("commit_transaction", kafka_exception(**FENCED))
    with pytest.raises(PartitionDropped):
        h.commit(p0)
    assert h.txn.broken  # the runner drops every task sharing it and takes them over with a new producer


def test_per_partition_mode_keeps_a_producer_and_a_transaction_per_partition() -> None:
    h = Harness()
    p0, p1 = h.new_task(0), h.new_task(1)
    assert p0.txn is not p1.txn and len(h.producers) == 2


def test_records_polled_before_another_partitions_abort_rewound_p_are_not_handed_over() -> None:
    """Turn 1: p1 processes offset 10. Turn 2 polled p0@10 and p1@11; p0's produce fails (abortable), the abort rewinds
    p1 to 10 as well, and p1@11, polled before that seek, must not be processed (it would skip offset 10)."""
    calls = Calls()
    consumer = FakeConsumer(committed_offset=10)
    runner = kafka_runner(
        copier, consumer, lambda txn_id: FakeProducer(calls, txn_id), app_id="unit", producers="per_process"
    )
    runner._on_assign(consumer, [TopicPartition(copier.input_topic, p) for p in (0, 1)])
    runner._dispatch([kafka_message(10, partition=1)])
    runner._process_transaction().producer.fail("produce", kafka_exception(**ABORTABLE))
    runner._dispatch([kafka_message(10, partition=0), kafka_message(11, partition=1)])
    assert sorted(consumer.seeks) == [(0, 10), (1, 10)]
    assert (runner.tasks[0].next_offset, runner.tasks[1].next_offset) == (10, 10)
    assert [r["value"] for r in calls.produced()] == [b"v", b"v"]  # p1@10, then p0@10 that failed: nothing else


def per_process_runner(calls: Calls, consumer: FakeConsumer, made: list[FakeProducer]) -> KafkaRunner:
    """A per_process runner on fakes that keeps every producer it makes in `made`, in order."""

    def make(txn_id: str | None) -> FakeProducer:
        made.append(FakeProducer(calls, txn_id))
        return made[-1]

    return kafka_runner(copier, consumer, make, app_id="unit", producers="per_process")


def test_after_an_abort_every_partition_of_the_process_runs_on_one_new_producer() -> None:
    """renew-after-abort (docs/guarantees.md), PRODUCERS=per_process: the process's producer is replaced under the
    same name and initialised once; every task then produces through the new one, the old one gets nothing more."""
    calls, consumer, made = Calls(), FakeConsumer(committed_offset=10), list[FakeProducer]()
    runner = per_process_runner(calls, consumer, made)
    runner._on_assign(consumer, [TopicPartition(copier.input_topic, p) for p in (0, 1)])
    runner._dispatch([kafka_message(10, partition=1)])
    made[0].fail("produce", kafka_exception(**ABORTABLE))
    runner._dispatch([kafka_message(10, partition=0)])
    assert len(made) == 2 and made[1].transactional_id == made[0].transactional_id
    assert calls.names()[-2:] == ["abort_transaction", "init_transactions"]
    assert sorted(consumer.seeks) == [(0, 10), (1, 10)]
    old_records = len(made[0].records)
    runner._dispatch([kafka_message(10, partition=0), kafka_message(10, partition=1)])
    assert {runner.tasks[0].producer, runner.tasks[1].producer} == {made[1]}
    assert len(made[0].records) == old_records and len(made[1].records) == 2


def test_a_partition_lost_mid_transaction_aborts_it_and_the_others_run_on_a_new_producer() -> None:
    h = Shared()
    p0, p1 = h.tasks(0, 1)
    p0.process([msg(0)])
    p1.process([msg(0)])
    h.close(p0, commit=False)  # lost
    assert h.calls.names()[-4:] == ["abort_transaction", "init_transactions", "seek", "flush"]
    assert p1.producer is h.producers[1] and p1.next_offset == 0  # rewound, on the new producer
    p1.process([msg(0)])
    h.commit(p1)
    assert p1.committed_offset == 1 and h.producers[1].records


def test_after_a_lost_membership_the_next_take_over_runs_on_a_new_initialised_producer() -> None:
    """A peer's failure detector removed this process while it was paused and fenced its producer beside the removal;
    nothing was open, so nothing failed here. Rejoined, the process must not take partitions over on that producer
    (fence() would take it for fenced already, and its first transaction failed fatally: a soak's instance exited)."""
    calls, consumer, made = Calls(), FakeConsumer(committed_offset=10), list[FakeProducer]()
    runner = per_process_runner(calls, consumer, made)
    partitions = [TopicPartition(copier.input_topic, p) for p in (0, 1)]
    runner._on_assign(consumer, partitions)
    runner._on_lost(consumer, partitions)  # nothing open: no abort, no error
    calls.clear()
    runner._on_assign(consumer, partitions[:1])
    assert len(made) == 2 and made[1].transactional_id == made[0].transactional_id
    assert calls.names()[0] == "init_transactions"  # before the committed offsets and the restore (fence-first)
    runner._dispatch([kafka_message(10, partition=0)])
    assert runner.tasks[0].producer is made[1]


def test_a_commit_that_never_returns_drops_every_partition_of_the_producer_at_its_deadline() -> None:
    """librdkafka's commit_transaction, given 10 s, once blocked 270 s after the coordinator's broker restarted
    (pipeline/kafka/bounded.py). Past its time-out and the grace the producer is given up: its outcome is unknown, so
    nothing rewinds; the runner drops its partitions and takes them over with a new producer."""
    h = Shared(request_timeout_ms=1000)
    p0, p1 = h.tasks(0, 1)
    p0.process([msg(0)])
    p1.process([msg(0)])
    hang = Hang(at_most_s=10)
    h.producers[0].fail("commit_transaction", hang)
    with pytest.raises(PartitionDropped, match=r"commit_transaction did not return within 2\.0 s"):
        h.commit(p0)  # without the bound: it returns when the hang ends (10 s), and commits
    assert h.txn.broken
    assert (p0.committed_offset, p1.committed_offset) == (0, 0)  # not moved: the outcome is unknown
    hang.released.set()


def test_a_fence_that_never_returns_is_asked_again_on_a_new_producer() -> None:
    h = Shared(request_timeout_ms=1000)
    hang = Hang(at_most_s=10)
    h.producers[0].fail("init_transactions", hang)
    with pytest.raises(KafkaException, match="init_transactions did not return"):
        h.txn.fence()
    assert len(h.producers) == 2 and h.txn.producer is h.producers[1]
    h.txn.fence()  # what takeover.fence does next: the new producer is initialised
    assert h.calls.names().count("init_transactions") == 2
    hang.released.set()
