"""`python -m tools.bench.registry`: running_totals on JSON topics vs running_totals_avro on Avro topics behind the
Schema Registry, the same records (running_totals_records: same keys, ids and amounts), exactly_once, 3 partitions,
one KafkaRunner in this process. Rounds alternate the two (the order swapped each round); each rate is measured as
tools/bench/throughput.py measures it (first input record processed to the last); the ratio is Avro / JSON within a
round, and the medians over the rounds. Also the serdes alone, microseconds per call (best of 5).

    python -m tools.bench.registry --records 60000 --repeat 3
    SCHEMA_REGISTRY_URL=http://... python -m tools.bench.registry   # another registry (default: the local one)

Needs a broker (KAFKA_BOOTSTRAP_SERVERS, default 127.0.0.1:9092) and a registry (deploy/local/registry.sh start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit
import uuid

import orjson
from confluent_kafka.schema_registry import SchemaRegistryClient

from pipeline import settings as settings_module
from pipeline.examples import running_totals, running_totals_avro
from pipeline.registry import bind
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing.inputs import create_topics, produce, running_totals_records
from tools.bench.throughput import PARTITIONS, Run, Worker, cleanup, measure, records_in

LOCAL_REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"


def one_round(kind: str, records: int, bootstrap: str, registry_url: str, timeout_s: float) -> tuple[float, float]:
    """(records/s, records per CPU second of this process) of one drain of `records` running-totals inputs, JSON or
    Avro. The CPU rate (start-up included, librdkafka's threads too) moves less with the shared machine's load."""
    run_id = f"bench-registry-{kind}-{uuid.uuid4().hex[:6]}"
    run = Run(None, kind, bootstrap, run_id, {})  # type: ignore[arg-type]  # cleanup needs the names only
    create_topics(bootstrap, {run.input_topic: PARTITIONS, run.output_topic: PARTITIONS})
    rows = list(running_totals_records(records, partitions=PARTITIONS, seed=3))
    app = running_totals.app if kind == "json" else running_totals_avro.app
    settings = settings_module.load(
        env={},
        bootstrap_servers=bootstrap,
        app_id=run_id,
        input_topic=run.input_topic,
        output_topic=run.output_topic,
        schema_registry_url=registry_url,
    )
    if kind == "avro":  # the producer's own client: the pipeline's fetches each schema once, as in production
        key, value = running_totals_avro.input_encoders(settings, SchemaRegistryClient({"url": registry_url}))
        rows = [(p, key(k.decode()), value(orjson.loads(v))) for p, k, v, *_ in rows]
    produce(bootstrap, run.input_topic, rows, partitions=PARTITIONS)
    runner = KafkaRunner(app, settings)
    cpu = time.process_time()
    worker = Worker(runner.run, f"runner-{run_id}")
    try:
        result = measure(lambda: records_in(runner.metrics), records, worker, timeout_s)
        cpu = time.process_time() - cpu
    finally:
        runner.stop()
        worker.join(30)
        cleanup(run)
    assert result.rate is not None, result
    return result.rate, records / cpu


def per_call_us(fn: object) -> float:
    calls = 50_000
    return min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6  # type: ignore[arg-type]


def serde_lines(registry_url: str) -> list[str]:
    """The input value's and the output value's serdes alone, JSON vs Avro (bound to the registry: cached)."""
    app = bind(
        running_totals_avro.app.with_topics("bench-registry-serde-in", "bench-registry-serde-out"),
        SchemaRegistryClient({"url": registry_url}),
    )
    avro_in, avro_out = app.streams[0].value_serde, app.output_value_serde
    json_in, json_out = running_totals.app.value_serde, running_totals.app.output_value_serde
    value, total = {"id": 123456, "amount": 250}, {"id": 123456, "count": 42, "sum": 10_500}
    avro_bytes, json_bytes = avro_in.serialize(value), json_in.serialize(value)
    rows = [
        (
            "deserialize input",
            per_call_us(lambda: json_in.deserialize(json_bytes)),
            per_call_us(lambda: avro_in.deserialize(avro_bytes)),
        ),
        (
            "serialize output",
            per_call_us(lambda: json_out.serialize(total)),
            per_call_us(lambda: avro_out.serialize(total)),
        ),
    ]
    lines = [f"{'':18} {'JSON us':>8} {'Avro us':>8} {'ratio':>6}"]
    lines += [f"{name:18} {j:8.2f} {a:8.2f} {a / j:6.1f}x" for name, j, a in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.registry", description=__doc__)
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    registry_url = os.environ.get("SCHEMA_REGISTRY_URL", LOCAL_REGISTRY)
    print("\n".join(serde_lines(registry_url)), flush=True)
    rates: dict[str, list[float]] = {"json": [], "avro": []}
    cpu_rates: dict[str, list[float]] = {"json": [], "avro": []}
    ratios, cpu_ratios = [], []
    for i in range(args.repeat):
        order = ("json", "avro") if i % 2 == 0 else ("avro", "json")
        got = {kind: one_round(kind, args.records, bootstrap, registry_url, args.timeout) for kind in order}
        for kind, (rate, cpu_rate) in got.items():
            rates[kind].append(rate)
            cpu_rates[kind].append(cpu_rate)
        ratios.append(got["avro"][0] / got["json"][0])
        cpu_ratios.append(got["avro"][1] / got["json"][1])
        print(
            f"round {i + 1}: JSON {got['json'][0]:,.0f} rec/s ({got['json'][1]:,.0f} per CPU s), Avro "
            f"{got['avro'][0]:,.0f} rec/s ({got['avro'][1]:,.0f} per CPU s), ratio {ratios[-1]:.2f} (CPU "
            f"{cpu_ratios[-1]:.2f}) (load {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    med = statistics.median
    print(
        f"median: JSON {med(rates['json']):,.0f} rec/s, Avro {med(rates['avro']):,.0f} rec/s; median of the ratios "
        f"{med(ratios):.2f}; per CPU second JSON {med(cpu_rates['json']):,.0f}, Avro {med(cpu_rates['avro']):,.0f}, "
        f"median of the CPU ratios {med(cpu_ratios):.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
