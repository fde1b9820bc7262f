"""`python -m tools.bench.expiry`: what an event-time timer per order costs with two inputs (issue 31), no broker.

throughput  order_expiry against order_fills on the same records (order_expiry.generate, one partition; the orders'
            extra ttl_ms is ignored by order_fills, whose global accounts table is empty), each through
            `MultiInputTask.process` (the merge, the timers, the TTL) into a producer that drops everything, a
            commit every BATCH records staging the changelog (state changes and checkpoint) as the runner's does.
            Best of --passes per App, then the ratio by records per second, and the cost per order (the difference
            over the number of orders). Stable to a few per cent where broker runs on the shared machine vary by
            +-30 % (tools/bench/overhead.py says why).
memory      order_expiry over --orders orders (records generated as they are consumed, so the input costs no memory),
            the state's entries and the process's resident memory every --every orders: with the 300 s state TTL
            they stay flat, whatever the number of orders ever seen.

    python -m tools.bench.expiry                              # both parts (~5 min on 2 shared cores)
    python -m tools.bench.expiry --part throughput --records 50000 --passes 1   # a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

from confluent_kafka import Consumer, Message, Producer

from pipeline import settings as settings_module
from pipeline.app import App, Stream
from pipeline.core.lifecycle import Phase
from pipeline.examples import order_expiry, order_fills
from pipeline.kafka.records import Consumed
from pipeline.metrics import Metrics
from pipeline.sinks.kafka.inputs import MultiInputTask
from pipeline.sinks.kafka.task import KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction
from tools.bench.overhead import NullProducer

BATCH = 5_000


class IdleConsumer:
    """What a task asks of its consumer while it processes: pauses (a burst of timers) cost nothing."""

    def pause(self, partitions: Any) -> None:
        pass

    def resume(self, partitions: Any) -> None:
        pass


@dataclass(frozen=True)
class Pass:
    app: str
    records: int
    orders: int
    seconds: float
    produced: int

    @property
    def per_second(self) -> float:
        return self.records / self.seconds


START_MS = 1_700_000_000_000  # no broker here: fixed event times (the default is relative to now, and to n)


def records(n: int, seed: int = 7) -> Iterator[tuple[str, bytes, bytes, int]]:
    """order_expiry's generated input, one partition: (its topic, key, value, timestamp)."""
    for topic, _, key, value, ts in order_expiry.generate(n, 1, seed, START_MS):
        yield topic, key, value, ts


def as_messages(app: App, generated: Iterable[tuple[str, bytes, bytes, int]]) -> Iterator[Consumed]:
    """The records as a task of `app` fetches them: order_expiry's topics renamed to `app`'s inputs, in order."""
    topics = dict(zip((order_expiry.ORDERS, order_expiry.FILLS), (s.topic for s in app.streams), strict=True))
    offsets = dict.fromkeys(topics.values(), 0)
    for topic, key, value, ts in generated:
        name = topics[topic]
        offset, offsets[name] = offsets[name], offsets[name] + 1
        message = Message(topic=name, partition=0, offset=offset, key=key, value=value, timestamp=(1, ts))
        yield cast(Consumed, message)


def new_task(app: App) -> tuple[MultiInputTask, NullProducer]:
    # No back-off between attempts at a malformed record (1 % of the fills): its sleeps are not processing.
    settings = settings_module.load(
        env={}, bootstrap_servers="unused:9092", app_id="bench", max_task_idle_ms=-1, processing_backoff_ms=0
    )
    producer = NullProducer()
    ctx = KafkaTaskContext(
        app,
        settings,
        "bench",
        app.input_topic,
        app.output_topic,
        "bench-changelog",
        "bench-dlq",
        cast(Consumer, IdleConsumer()),
        Metrics(),
        global_tables={name: {} for name in app.global_table_specs},
    )
    txn = Transaction(cast(Producer, producer), settings, "bench")
    task = MultiInputTask(ctx, 0, txn)
    task.start_all(dict.fromkeys(app.co_partitioned, 0), restore=True)
    task.restored(task.state, None, None)  # no restore: the state starts empty
    task.phase = Phase.RUNNING  # no consumer to seek: the position is the start
    return task, producer


def run_batches(task: MultiInputTask, messages: Iterable[Consumed]) -> Iterator[int]:
    """Processes and commits BATCH records at a time (the changelog staged, then committed); yields the count."""
    done = 0
    iterator = iter(messages)
    while batch := list(itertools.islice(iterator, BATCH)):
        task.process(batch)
        while task.holding:  # a burst of due timers: the loop's turns
            task.tick(0)
        task.prepare_commit()
        task.committed()
        task.txn.end()
        done += len(batch)
        yield done


def throughput(app: App, generated: list[tuple[str, bytes, bytes, int]], orders: int) -> Pass:
    messages = list(as_messages(app, generated))
    task, producer = new_task(app)
    started = time.process_time()
    for _ in run_batches(task, messages):
        pass
    return Pass(app.name, len(messages), orders, time.process_time() - started, producer.produced)


def fills_app() -> App:
    """order_fills as it is, its inputs holding order_expiry's records (an order's ttl_ms is ignored)."""
    return replace(order_fills.app, input_topic="", inputs=[Stream(order_fills.ORDERS), Stream(order_fills.FILLS)])


def part_throughput(count: int, passes: int) -> None:
    generated = list(records(count))
    orders = sum(1 for topic, *_ in generated if topic == order_expiry.ORDERS)
    best: dict[str, Pass] = {}
    for _ in range(passes):
        for app in (fills_app(), order_expiry.app):
            result = throughput(app, generated, orders)
            if app.name not in best or result.seconds < best[app.name].seconds:
                best[app.name] = result
    fills, expiry = best[order_fills.app.name], best[order_expiry.app.name]
    for result in (fills, expiry):
        us = result.seconds / result.records * 1e6
        print(
            f"{result.app:14} {result.records:9,} records {result.per_second:10,.0f} rec/s {us:6.2f} us/record "
            f"{result.produced:9,} produced"
        )
    per_order = (expiry.seconds - fills.seconds) / orders * 1e6
    print(
        f"order_expiry / order_fills by rec/s: {expiry.per_second / fills.per_second:.2f}x; "
        f"{orders:,} orders, {per_order:.1f} us more per order (its timer, TTL and status)"
    )


def resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def part_memory(orders: int, every: int) -> None:
    task, _ = new_task(order_expiry.app)
    seen = 0

    def counted(generated: Iterable[tuple[str, bytes, bytes, int]]) -> Iterator[tuple[str, bytes, bytes, int]]:
        nonlocal seen
        for item in generated:
            if item[0] == order_expiry.ORDERS:
                seen += 1
            yield item

    print(f"{'orders':>10} {'records':>10} {'state entries':>14} {'user keys':>10} {'RSS MB':>8}")
    mark = every
    started = time.process_time()
    for done in run_batches(task, as_messages(order_expiry.app, counted(records(10**12)))):
        if seen >= mark:
            state = task.state
            print(
                f"{seen:>10,} {done:>10,} {len(state._data):>14,} {len(state):>10,} {resident_mb():>8.0f}", flush=True
            )
            mark += every
        if seen >= orders:
            break
    print(f"{time.process_time() - started:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("throughput", "memory", "both"), default="both")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # a line per dead letter otherwise
    if args.part in ("throughput", "both"):
        part_throughput(args.records, args.passes)
    if args.part in ("memory", "both"):
        part_memory(args.orders, args.every)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
