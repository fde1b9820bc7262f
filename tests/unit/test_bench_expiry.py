"""`python -m tools.bench.expiry` measures what it says: both Apps take the same records through MultiInputTask and
commit them, order_expiry's generated input comes in timestamp order (streamed, not held whole in memory), and its
state stays bounded by the TTL (a smoke run of the memory part)."""

from __future__ import annotations

import itertools

from pipeline.examples import order_expiry
from tools.bench import expiry


def test_generate_streams_records_in_timestamp_order() -> None:
    stamps = [ts for *_, ts in order_expiry.generate(5_000, 3, 1)]
    assert stamps == sorted(stamps) and len(stamps) >= 5_000


def test_both_apps_process_the_same_records() -> None:
    generated = list(expiry.records(3_000))
    orders = sum(1 for topic, *_ in generated if topic == order_expiry.ORDERS)
    fills = expiry.throughput(expiry.fills_app(), generated, orders)
    expiring = expiry.throughput(order_expiry.app, generated, orders)
    assert fills.records == expiring.records == len(generated)
    assert fills.produced > 1_000 and expiring.produced > fills.produced  # its expiries, timers and TTL entries


def test_the_state_stays_bounded_by_the_ttl() -> None:
    task, _ = expiry.new_task(order_expiry.app)
    sizes = []
    messages = expiry.as_messages(order_expiry.app, expiry.records(10**9))
    for done in expiry.run_batches(task, itertools.islice(messages, 40_000)):
        if done % 10_000 == 0:
            sizes.append(len(task.state._data))
    assert max(sizes[1:]) < 1.5 * min(sizes[1:]), sizes  # 40 k records: about 11 k orders, 2,800 s of stream time
