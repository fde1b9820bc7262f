"""`python -m tools.bench.queries`: interactive queries of committed state (issue 34) while the instance processes.

Two pipeline processes of running_totals (QUERY_ENABLED, heartbeats on for the directory) share 3 input partitions;
a producer process feeds them at a paced rate (5,000 rec/s by default). Three phases of `--seconds` each:
    quiet     no queries: the processing rate, the pipeline processes' CPU and the end-to-end latency as the base
    local     `--qps` GETs of one key per second to the instance that owns it (one keep-alive connection)
    routed    the same to the instance that does not: a 307, then the owner (keep-alive connections to both)
Per query phase: the client's latency p50/p99/max; per phase: records processed per second, the processes' CPU
(s per s) and the end-to-end latency's mean from their /metrics. The querier, the producer and the pipeline are
separate processes. Results: BENCHMARKS.md.

    python -m tools.bench.queries                      # 5,000 rec/s, 1,000 queries/s, 20 s per phase
    python -m tools.bench.queries --rate 5000 --qps 1000 --seconds 30
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from pipeline.testing.faults import produce_paced
from pipeline.testing.inputs import account_partition, create_topics, running_totals_records

PARTITIONS = 3
ACCOUNTS = 300
APP = "pipeline.examples.running_totals:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_instance(bootstrap: str, app_id: str, topics: tuple[str, str], port: int, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": bootstrap,
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": topics[0],
        "PIPELINE_OUTPUT_TOPIC": topics[1],
        "PIPELINE_METRICS_PORT": str(port),
        "PIPELINE_QUERY_ENABLED": "true",
        "PIPELINE_QUERY_ADDRESS": f"127.0.0.1:{port}",
        "PIPELINE_QUERY_PARTITIONER": "crc32",  # how running_totals_records places the records
        "PIPELINE_FAILURE_DETECTION_MS": "1000",
    }
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline", "run", APP], env=env, stdout=out, stderr=out)


def get(connection: http.client.HTTPConnection, path: str) -> tuple[int, str]:
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    return response.status, response.getheader("Location") or ""


def metrics(port: int) -> dict[str, float]:
    """The sums of records in, end-to-end latency (sum, count) of one process's /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    return {
        "records": total("pipeline_records_in_total"),
        "e2e_sum": total("pipeline_end_to_end_latency_seconds_sum"),
        "e2e_count": total("pipeline_end_to_end_latency_seconds_count"),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def owner_of(ports: list[int]) -> dict[int, int]:
    """partition -> the port of its owner, asked until every partition answers 200 somewhere and every instance owns
    one (the routed phase needs a partition owned elsewhere)."""
    owners: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while (len(owners) < PARTITIONS or set(owners.values()) != set(ports)) and time.monotonic() < deadline:
        owners = {}
        for port in ports:
            for p in range(PARTITIONS):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                try:
                    if get(connection, f"/state?prefix=x&limit=1&partition={p}")[0] == 200:
                        owners[p] = port
                except (OSError, http.client.HTTPException):
                    pass  # not up yet
                connection.close()
        time.sleep(0.5)
    return owners


def query_phase(
    owners: dict[int, int], ports: list[int], qps: int, seconds: float, routed: bool
) -> tuple[list[float], int, dict[int, int]]:
    """`qps` paced GETs for `seconds`: each answer's latency (ms), the redirect followed; how many were redirected;
    the other statuses and their counts."""
    connections = {port: http.client.HTTPConnection("127.0.0.1", port, timeout=5) for port in ports}
    keys = [f"account-{k}" for k in range(ACCOUNTS)]
    latencies: list[float] = []
    redirected, refused = 0, dict[int, int]()
    started = time.perf_counter()
    for i in range(int(qps * seconds)):
        time.sleep(max(0.0, started + i / qps - time.perf_counter()))
        if time.perf_counter() > started + seconds:
            break  # behind the pace: the phase ends on time all the same (the rate achieved is reported)
        key = keys[i % len(keys)]
        p = account_partition(key.encode(), PARTITIONS)
        first = owners[p] if not routed else next(port for port in ports if port != owners[p])
        path = f"/state/{key}?partition={p}"
        t0 = time.perf_counter()
        status, location = get(connections[first], path)
        if status == 307:
            redirected += 1
            status, _ = get(connections[int(location.split(":")[2].split("/")[0])], path)
        if status in (200, 404):
            latencies.append((time.perf_counter() - t0) * 1000)
        else:  # 503: a rebalance or a directory that does not know the owner yet; counted, not timed
            refused[status] = refused.get(status, 0) + 1
    return latencies, redirected, refused


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.queries", description=__doc__)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--rate", type=int, default=5_000, help="input records per second")
    parser.add_argument("--qps", type=int, default=1_000, help="queries per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the instances are stopped on the way out
    suffix = uuid.uuid4().hex[:8]
    topics = (f"qbench-in-{suffix}", f"qbench-out-{suffix}")
    create_topics(args.bootstrap, dict.fromkeys(topics, PARTITIONS), config={"retention.ms": "-1"})
    warm_up = 15.0
    total_s = warm_up + 3 * args.seconds + 10
    records = list(running_totals_records(int(args.rate * total_s), partitions=PARTITIONS, accounts=ACCOUNTS))
    feeder = multiprocessing.Process(target=produce_paced, args=(args.bootstrap, topics[0], records, total_s))
    logs = Path(tempfile.mkdtemp(prefix="qbench-"))
    ports = [free_port(), free_port()]
    instances = [
        start_instance(args.bootstrap, f"qbench-{suffix}", topics, port, logs / f"{port}.log") for port in ports
    ]
    try:
        feeder.start()
        time.sleep(warm_up)
        print(f"rate {args.rate} rec/s, {args.qps} queries/s, {args.seconds:.0f} s per phase")
        for phase in ("quiet", "local", "routed"):
            owners = owner_of(ports)
            before = [metrics(port) for port in ports], [cpu_seconds(i.pid) for i in instances], time.monotonic()
            latencies: list[float] = []
            if phase == "quiet":
                time.sleep(args.seconds)
            else:
                latencies, redirected, refused = query_phase(owners, ports, args.qps, args.seconds, phase == "routed")
                print(
                    f"        owners {owners}; {redirected} of {len(latencies)} answers redirected; refused {refused}"
                )
            after = [metrics(port) for port in ports], [cpu_seconds(i.pid) for i in instances], time.monotonic()
            report(phase, before, after, latencies)
    finally:
        for instance in instances:
            instance.terminate()
            instance.wait(60)
        feeder.kill()
        print(f"logs: {logs}")
    return 0


def report(phase: str, before: tuple, after: tuple, latencies: list[float]) -> None:
    elapsed = after[2] - before[2]
    records = sum(a["records"] - b["records"] for a, b in zip(after[0], before[0], strict=True))
    count = sum(a["e2e_count"] - b["e2e_count"] for a, b in zip(after[0], before[0], strict=True))
    e2e = sum(a["e2e_sum"] - b["e2e_sum"] for a, b in zip(after[0], before[0], strict=True)) / max(1, count)
    cpu = sum(a - b for a, b in zip(after[1], before[1], strict=True)) / elapsed
    line = f"{phase:7s} processed {records / elapsed:7.0f} rec/s  pipeline CPU {cpu:.2f} s/s"
    line += f"  end-to-end mean {e2e * 1000:5.0f} ms"
    if latencies:
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        line += (
            f"  queries {len(latencies) / elapsed:5.0f}/s p50 {p50:.2f} ms p99 {p99:.2f} ms max {max(latencies):.1f} ms"
        )
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
