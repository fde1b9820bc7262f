"""The stalled-partition watchdog (pipeline/core/stall.py; docs/guarantees.md: no-silent-stall): an owned partition,
not stopped, with work waiting, that does not move for STALL_WARNING_MS says so once per period, counts in
pipeline_stalled_partitions, and says when it moves again. No broker: a fake clock and the shared fake consumer."""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from confluent_kafka import IsolationLevel, TopicPartition

from pipeline.core.lifecycle import Phase
from pipeline.core.stall import NOT_FETCHED_YET, BrokerEnds, LoopWatch, Seen, StallWatch
from pipeline.examples.copier import app as copier
from pipeline.metrics import Metrics
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.sinks.kafka.task import KafkaTask
from tests.fakes import FakeClock, FakeConsumer, NullProducer
from tests.harness import kafka_runner

LIMIT_MS = 30_000


def stalled(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("pipeline_stalled_partitions")


def seen(progress: object, waiting: bool = True, phase: Phase = Phase.RUNNING) -> Seen:
    return Seen(phase, progress, waiting, lambda: "position 5, high watermark 9")


def look_for(watch: StallWatch, clock: FakeClock, seconds: int, by_p: Mapping[int, Seen]) -> None:
    """As the poll loop does: once a second."""
    for _ in range(seconds):
        clock.now += 1
        watch.look(by_p)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def watch(clock: FakeClock, metrics: Metrics) -> StallWatch:
    return StallWatch(LIMIT_MS, metrics.stalled, clock)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_one_warning_per_period_while_it_lasts_then_an_info_when_it_moves(watch, clock, metrics, caplog) -> None:
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    watch.look({3: seen(5), 4: seen(7)})
    look_for(watch, clock, 29, {3: seen(5), 4: seen(7)})
    assert warnings(caplog) == [] and stalled(metrics) == 0
    look_for(watch, clock, 1, {3: seen(5), 4: seen(7)})
    assert len(warnings(caplog)) == 2 and stalled(metrics) == 2
    message = warnings(caplog)[0]
    for part in ("p3 stalled", "RUNNING", "no progress for 30 s", "position 5, high watermark 9", "STALL_WARNING_MS"):
        assert part in message
    assert "broker" in message and "pipeline_consumer_lag" in message  # what to check
    look_for(watch, clock, 29, {3: seen(5), 4: seen(7)})
    assert len(warnings(caplog)) == 2, "once per period, not once per look"
    look_for(watch, clock, 1, {3: seen(5), 4: seen(7)})
    assert len(warnings(caplog)) == 4 and "no progress for 60 s" in warnings(caplog)[2]

    look_for(watch, clock, 25, {3: seen(6), 4: seen(7)})  # p3 moved once, p4 never
    assert "p3 moves again after 61 s without progress" in caplog.text
    assert watch.stalled == [4] and stalled(metrics) == 1


def test_a_partition_that_moves_or_has_nothing_to_do_is_never_stalled(watch, clock, metrics, caplog) -> None:
    for second in range(120):
        clock.now += 1
        watch.look({0: seen(second), 1: seen(5, waiting=False), 2: seen(9, phase=Phase.STOPPED)})
    assert warnings(caplog) == [] and stalled(metrics) == 0


def test_the_clock_starts_when_input_arrives(watch, clock, caplog) -> None:
    look_for(watch, clock, 100, {0: seen(5, waiting=False)})
    look_for(watch, clock, 30, {0: seen(5)})  # seen waiting at the first of these looks
    assert warnings(caplog) == []
    look_for(watch, clock, 1, {0: seen(5)})
    assert len(warnings(caplog)) == 1 and "no progress for 130 s" in warnings(caplog)[0]


def test_a_loop_that_did_not_turn_is_no_stall_of_its_partitions(watch, clock, caplog) -> None:
    # The loop watch reports a loop blocked in a call; its partitions did not move because nothing ran.
    watch.look({0: seen(5)})
    clock.now += 60
    watch.look({0: seen(5)})
    look_for(watch, clock, 29, {0: seen(5)})
    assert warnings(caplog) == []
    look_for(watch, clock, 1, {0: seen(5)})
    assert "p0 stalled: RUNNING, no progress for 90 s" in warnings(caplog)[0]


def test_a_restore_that_reads_is_no_stall_however_long(watch, clock, caplog) -> None:
    for records in range(200):
        clock.now += 1
        watch.look({0: seen(("restore", records), phase=Phase.RESTORING)})
    assert warnings(caplog) == []
    look_for(watch, clock, 31, {0: seen(("restore", 200), phase=Phase.RESTORING)})
    assert "p0 stalled: RESTORING" in warnings(caplog)[0]


def test_a_stall_ends_when_p_stops_or_goes(watch, clock, metrics, caplog) -> None:
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    look_for(watch, clock, 31, {0: seen(5), 1: seen(5)})  # the first look starts the clock
    assert stalled(metrics) == 2
    look_for(watch, clock, 1, {0: seen(5, phase=Phase.STOPPED)})
    assert stalled(metrics) == 0
    assert "p0 has nothing to do any more (STOPPED) after 31 s without progress" in caplog.text
    assert "p1 is no longer owned after 31 s without progress" in caplog.text


def test_0_turns_it_off(clock, metrics, caplog) -> None:
    watch = StallWatch(0, metrics.stalled, clock)
    look_for(watch, clock, 300, {0: seen(5)})
    assert warnings(caplog) == [] and watch.stalled == []


# -- the poll loop's look: what the consumer knows locally -----------------------------------------------------------
def runner_on(consumer: FakeConsumer, clock: FakeClock) -> KafkaRunner:
    runner = kafka_runner(copier, consumer, lambda _: NullProducer(), app_id="stall", producers="per_process")
    runner.stall = StallWatch(LIMIT_MS, runner.metrics.stalled, clock)
    runner.ends = BrokerEnds(LIMIT_MS / 1000, 10, clock)
    for p in range(2):
        runner.tasks[p] = task = KafkaTask(runner.ctx, p, runner._transaction_for(p))
        task.start(0)
        consumer.assigned.add((copier.input_topic, p))
    return runner


def loop_for(runner: KafkaRunner, clock: FakeClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.now += 1
        runner._next_gauge_update = 0.0  # the loop looks once a second of the real clock: here, of the fake one
        runner._update_gauges()


def test_off_the_loop_asks_the_consumer_for_no_positions_and_still_sets_the_lag(clock, caplog) -> None:
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    runner.stall = StallWatch(0, runner.metrics.stalled, clock)
    asked: list[list[TopicPartition]] = []
    consumer.position = lambda tps: asked.append(tps) or []  # type: ignore[method-assign,func-returns-value]
    consumer.watermarks = {(topic, 0): (0, 50), (topic, 1): (0, 50)}
    runner.tasks[0].next_offset = runner.tasks[1].next_offset = 20
    loop_for(runner, clock, 31)
    assert asked == [] and warnings(caplog) == []
    assert runner.metrics.lag.labels("0")._value.get() == 30


def test_an_idle_partition_of_a_transactional_input_reads_no_lag(clock) -> None:
    # p0's last record is at 49, its commit marker at 50: p0's position stops at 50, the consumer's moved past the
    # marker to 51, the high watermark. p1 has 5 records fetched but not handed out yet.
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    consumer.watermarks = {(topic, 0): (0, 51), (topic, 1): (0, 51)}
    consumer.positions = {(topic, 0): 51, (topic, 1): 46}
    runner.tasks[0].next_offset, runner.tasks[1].next_offset = 50, 46
    loop_for(runner, clock, 1)
    assert runner.metrics.lag.labels("0")._value.get() == 0
    assert runner.metrics.lag.labels("1")._value.get() == 5
    assert runner.metrics.input_lag.labels(topic, "0")._value.get() == 0


def test_the_loop_warns_of_a_partition_the_fetcher_left_behind(clock, caplog) -> None:
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    consumer.watermarks = {(topic, 0): (0, 50), (topic, 1): (0, 50)}
    consumer.positions = {(topic, 0): 20, (topic, 1): 20}
    runner.tasks[0].next_offset = runner.tasks[1].next_offset = 20
    runner._pause(1)
    loop_for(runner, clock, 31)  # the first look starts the clock
    assert [m.split(":")[0] for m in warnings(caplog)] == ["p0 stalled", "p1 stalled"]
    assert (
        f"{topic}[position 20, consumer at 20, high watermark 50]; not paused; assigned in the consumer"
        in (warnings(caplog)[0])
    )
    assert "; paused by this process;" in warnings(caplog)[1]
    assert stalled(runner.metrics) == 2

    consumer.positions[(topic, 0)] = 30  # fetched and handed out: p0 moves
    runner.tasks[0].next_offset = 30
    consumer.assigned.discard((topic, 1))
    loop_for(runner, clock, 1)
    assert "p0 moves again after 31 s without progress" in caplog.text
    assert stalled(runner.metrics) == 1
    loop_for(runner, clock, 30)
    assert "NOT assigned in the consumer" in [w for w in warnings(caplog) if w.startswith("p1")][-1]


def test_a_partition_the_consumer_never_fetched_says_its_prefetch_may_be_full(clock, caplog) -> None:
    # A drain of 384 partitions left some unfetched for 32 s, behind the others' records in the consumer's prefetch.
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    consumer.watermarks = {(topic, 0): (0, 50), (topic, 1): (0, 50)}
    runner._pause(1)
    loop_for(runner, clock, 31)
    p0, p1 = (next(w for w in warnings(caplog) if w.startswith(f"p{p} ")) for p in (0, 1))
    assert "consumer at None" in p0 and NOT_FETCHED_YET in p0
    assert NOT_FETCHED_YET not in p1  # paused by this process: that is why


def test_a_commit_marker_after_the_last_record_is_no_input_waiting(clock, caplog) -> None:
    # A transactional input: the last record at 4, its commit marker at 5. p's position stops at 5, the consumer's
    # goes past the marker to 6 = the high watermark. Red when the look compares p's position with the watermark.
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    consumer.watermarks = {(topic, 0): (0, 6), (topic, 1): (0, 6)}
    consumer.positions = {(topic, 0): 6, (topic, 1): 6}
    runner.tasks[0].next_offset = runner.tasks[1].next_offset = 5
    loop_for(runner, clock, 120)
    assert warnings(caplog) == [] and stalled(runner.metrics) == 0


def test_unknown_watermarks_are_no_stall_and_a_stopped_partition_has_its_own_gauge(clock, caplog) -> None:
    consumer, topic = FakeConsumer(), copier.input_topic
    runner = runner_on(consumer, clock)
    consumer.watermarks = {(topic, 1): (0, 50)}  # p0: never fetched
    runner.tasks[1].stop("poison")
    loop_for(runner, clock, 120)
    assert warnings(caplog) == [] and stalled(runner.metrics) == 0


class FakeAdmin:
    """list_offsets as the admin client answers it: a future per partition, set by the test."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[tuple[str, int]], object]] = []
        self.futures: dict[tuple[str, int], Future[object]] = {}

    def list_offsets(self, request: dict[TopicPartition, object], **kwargs: object) -> dict[TopicPartition, Future]:
        self.asked.append((sorted((tp.topic, tp.partition) for tp in request), kwargs["isolation_level"]))
        self.futures = {(tp.topic, tp.partition): Future() for tp in request}
        return {TopicPartition(t, p): f for (t, p), f in self.futures.items()}

    def answer(self, ends: dict[int, int]) -> None:
        for (_, p), future in self.futures.items():
            future.set_result(types.SimpleNamespace(offset=ends[p]))


def runner_asking(clock: FakeClock, high: int) -> tuple[FakeConsumer, str, FakeAdmin, KafkaRunner]:
    """A copier runner with an admin client to ask, p0 and p1 at offset 20, their cached high watermark `high`."""
    consumer, topic, admin = FakeConsumer(), copier.input_topic, FakeAdmin()
    runner = runner_on(consumer, clock)
    runner._admin_client = lambda: admin  # type: ignore[method-assign,assignment,return-value]
    consumer.watermarks = {(topic, 0): (0, high), (topic, 1): (0, high)}
    consumer.positions = {(topic, 0): 20, (topic, 1): 20}
    runner.tasks[0].next_offset = runner.tasks[1].next_offset = 20
    return consumer, topic, admin, runner


def test_a_partition_that_looks_caught_up_is_checked_against_the_broker(clock, caplog) -> None:
    # The fetcher got no response for p0 since offset 20: its cached high watermark stayed 20, and p0 looks caught up
    # (so does pipeline_consumer_lag). The broker says 50. Red without BrokerEnds.
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    consumer, topic, admin, runner = runner_asking(clock, high=20)
    loop_for(runner, clock, 30)
    assert admin.asked == [] and warnings(caplog) == []
    loop_for(runner, clock, 1)  # quiet for a period: asked, once, for both
    assert admin.asked == [([(topic, 0), (topic, 1)], IsolationLevel.READ_COMMITTED)]
    loop_for(runner, clock, 5)  # no answer yet: nothing asked again, nothing said
    assert len(admin.asked) == 1 and warnings(caplog) == []
    admin.answer({0: 50, 1: 20})
    loop_for(runner, clock, 31)
    assert [w.split(":")[0] for w in warnings(caplog)] == ["p0 stalled"]
    assert (
        "high watermark 20, the broker's last stable offset 50: the cached high watermark is out of date"
        in warnings(caplog)[0]
    )
    assert len(admin.asked) == 2, "once per period"

    consumer.positions[(topic, 0)] = 51  # past the end asked for
    loop_for(runner, clock, 1)
    assert "p0 moves again" in caplog.text and stalled(runner.metrics) == 0
    assert (topic, 0) not in runner.ends.ends


def test_the_broker_tells_an_open_transaction_from_records_not_fetched(clock, caplog) -> None:
    _, _, admin, runner = runner_asking(clock, high=50)
    loop_for(runner, clock, 31)
    admin.answer({0: 20, 1: 50})
    loop_for(runner, clock, 30)
    held = [w for w in warnings(caplog) if w.startswith("p0") and "the broker's last stable offset" in w]
    not_fetched = [w for w in warnings(caplog) if w.startswith("p1") and "the broker's last stable offset" in w]
    assert "last stable offset 20: an open transaction upstream holds p's records back" in held[0]
    assert "last stable offset 50: records readable on the broker, not fetched" in not_fetched[0]


# -- the poll loop itself stuck ---------------------------------------------------------------------------------------
def test_a_loop_that_stops_turning_is_reported_with_where_it_is_stuck(clock, caplog) -> None:
    caplog.set_level(logging.INFO, "pipeline.core.stall")
    turned = [clock.now]
    release, inside = threading.Event(), threading.Event()
    watch = LoopWatch(LIMIT_MS, lambda: turned[0], clock)

    def a_commit_that_never_returns() -> None:
        inside.set()
        release.wait(30)

    def loop() -> None:
        watch._loop_thread = threading.get_ident()  # what start() does, without its thread: the test checks
        a_commit_that_never_returns()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        assert inside.wait(10)
        for _ in range(29):
            clock.now += 1
            watch.check()
        assert warnings(caplog) == []
        for _ in range(31):
            clock.now += 1
            watch.check()
        assert len(warnings(caplog)) == 2, "once per period"
        assert "the poll loop has not turned for 30 s" in warnings(caplog)[0]
        assert "It is in: a_commit_that_never_returns (test_stall.py:" in warnings(caplog)[0]
        assert "threading.py" not in warnings(caplog)[0], "the standard library's frames say nothing"
    finally:
        release.set()
        thread.join(10)
    turned[0] = clock.now
    watch.check()
    assert "the poll loop turns again after 60 s" in caplog.text


def test_the_loop_watch_thread_starts_and_stops_with_the_loop_and_not_at_0(clock) -> None:
    watch = LoopWatch(LIMIT_MS, lambda: clock.now, clock)
    watch.start()
    assert watch._thread is not None and watch._thread.is_alive()
    watch.stop()
    assert not watch._thread.is_alive()
    off = LoopWatch(0, lambda: clock.now, clock)
    off.start()
    assert off._thread is None
    off.stop()


def test_a_loop_waiting_on_its_commit_threads_names_where_they_are_stuck(clock, caplog) -> None:
    """Per-partition transactions commit on a pool: the loop's own frames then only say it waits for the pool (a
    full-suite run showed `_commit_due` for 90 s and nothing more)."""
    release, inside = threading.Event(), threading.Event()
    watch = LoopWatch(LIMIT_MS, lambda: 0.0, clock)

    def a_commit_transaction_that_never_returns() -> None:
        inside.set()
        release.wait(30)

    pool = ThreadPoolExecutor(1, thread_name_prefix="commit")
    try:

        def loop() -> None:
            watch._loop_thread = threading.get_ident()
            pool.submit(a_commit_transaction_that_never_returns).result(30)

        thread = threading.Thread(target=loop)
        thread.start()
        assert inside.wait(10)
        clock.now += 31
        watch.check()
        warning = warnings(caplog)[0]
        assert "It is in: loop (test_stall.py:" in warning
        assert "[commit_0] a_commit_transaction_that_never_returns (test_stall.py:" in warning
    finally:
        release.set()
        thread.join(10)
        pool.shutdown()
