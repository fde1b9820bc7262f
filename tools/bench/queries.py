"""`python -m tools.bench.queries`: interactive queries of committed state (issue 34) while the instance processes.

Two pipeline processes of running_totals (QUERY_ENABLED, heartbeats on for the directory) share 3 input partitions;
a producer process feeds them at a paced rate (5,000 rec/s by default). Three phases of `--seconds` each:
    quiet     no queries: the processing rate, the pipeline processes' CPU and the end-to-end latency as the base
    local     `--qps` GETs of one key per second to the instance that owns it
    routed    the same to the instance that does not: a 307, then the owner
The queries are paced open loop by `--clients` querier processes, each with kept-alive connections to both instances
and every `--clients`-th slot of one schedule: a slow answer delays its own process, not the pace (a single closed
loop could not keep 1,000/s and measured its own queueing). Per query phase: the latency p50/p99/max from each
query's send to its answer, the rate achieved, how many queries left late and the querier's own wait for a core
once an answer arrived (Linux: the kernel's receive timestamp); per phase: records processed per
second, the processes' CPU (s per s) and the end-to-end latency's mean from their /metrics. The querier, the
producer and the pipeline are separate processes. Results: BENCHMARKS.md.

    python -m tools.bench.queries                      # 5,000 rec/s, 1,000 queries/s, 20 s per phase, 2 queriers
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
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.query_client import QueryError, query
from pipeline.testing.faults import produce_paced
from pipeline.testing.inputs import account_partition, create_topics, running_totals_records

PARTITIONS = 3
ACCOUNTS = 300
APP = "pipeline.examples.running_totals:app"
SO_TIMESTAMPNS = 35  # Linux's socket option (and control message type): not named by Python's socket module


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
        "PIPELINE_FAILURE_DETECTION_MS": "3000",  # the directory; 1000 removed members at load 8
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


@dataclass(frozen=True)
class Pace:
    """One query phase's schedule, shared by its querier processes: slot i at start + i/qps, for `seconds`, to the
    owner of the key's partition (`owners`: partition -> port) or, `routed`, to the other instance; `library`: each
    query by pipeline.query_client.query instead of the raw sockets."""

    owners: dict[int, int]
    ports: list[int]
    qps: int
    seconds: float
    routed: bool
    clients: int
    library: bool = False
    start: float = 0.0


@dataclass
class Tally:
    """What one or all queriers of a phase saw: each timed answer's latency (ms, from its send, the redirect
    followed), how many were redirected, the other statuses and their counts, how many queries left more than 1 ms
    after their slot, and per timed answer the querier's own wait (ms): from the answer's arrival in its socket to
    the querier reading it (both answers of a redirect), the part of the latency that is the querier waiting for a
    core, not the instance."""

    latencies: list[float] = field(default_factory=list)
    redirected: int = 0
    refused: dict[int, int] = field(default_factory=dict)
    late: int = 0
    waits: list[float] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.latencies += other.latencies
        self.redirected += other.redirected
        for status, count in other.refused.items():
            self.refused[status] = self.refused.get(status, 0) + count
        self.late += other.late
        self.waits += other.waits


def query_phase(pace: Pace) -> Tally:
    """`pace.qps` GETs a second for `pace.seconds`, open loop: `pace.clients` querier processes, each on its own
    kept-alive connections, take every `clients`-th slot of one schedule, so that a slow answer delays only its own
    process's next query, not the pace (the rate achieved is reported)."""
    pace = replace(pace, start=time.monotonic() + 3.0)  # CLOCK_MONOTONIC in every process; the queriers are up by then
    # spawn, not fork: a fork of this process (threads of the Kafka clients, the pool's own) once left a querier
    # stuck on a lock copied held, and the copy of the input's records is not needed there
    with multiprocessing.get_context("spawn").Pool(pace.clients) as pool:
        parts = pool.starmap(query_slots, [(pace, j) for j in range(pace.clients)])
    tally = Tally()
    for part in parts:
        tally.add(part)
    return tally


def query_slots(pace: Pace, j: int) -> Tally:
    """One querier process of query_phase: the slots j, j + clients, ... of the schedule."""
    connections = {port: Raw(port) for port in pace.ports}
    keys = [f"account-{k}" for k in range(ACCOUNTS)]
    tally = Tally()
    for i in range(j, int(pace.qps * pace.seconds), pace.clients):
        slot = pace.start + i / pace.qps
        time.sleep(max(0.0, slot - time.monotonic()))
        t0 = time.monotonic()
        if t0 > pace.start + pace.seconds:
            break  # behind the pace: the phase ends on time all the same (the rate achieved is reported)
        tally.late += t0 - slot > 0.001
        key = keys[i % len(keys)]
        p = account_partition(key.encode(), PARTITIONS)
        first = pace.owners[p] if not pace.routed else next(port for port in pace.ports if port != pace.owners[p])
        if pace.library:
            (status, hops), waited = library_get(first, key, p), None
        else:
            status, waited, hops = raw_get(connections, first, f"/state/{key}?partition={p}")
        tally.redirected += hops > 1
        if status in (200, 404):
            tally.latencies.append((time.monotonic() - t0) * 1000)
            if waited is not None:
                tally.waits.append(waited * 1000)
        else:  # 503: a rebalance or a directory that does not know the owner yet; counted, not timed
            tally.refused[status] = tally.refused.get(status, 0) + 1
    return tally


def raw_get(connections: dict[int, Raw], port: int, path: str) -> tuple[int, float, int]:
    """(status, the querier's own wait in seconds, instances asked) of one query on the raw sockets, a 307 followed."""
    status, location = connections[port].get(path)
    waited = connections[port].waited
    if status != 307:
        return status, waited, 1
    owner = connections[int(location.split(":")[2].split("/")[0])]
    status, _ = owner.get(path)
    return status, waited + owner.waited, 2


def library_get(port: int, key: str, p: int) -> tuple[int, int]:
    """(status, instances asked) of one query by the package's client."""
    try:
        answer = query(f"http://127.0.0.1:{port}", key, partition=p, timeout_s=0.5)
    except QueryError as e:
        return e.status, 1
    return answer.status, len(answer.hops)


class Raw:
    """A kept-alive HTTP/1.1 connection that sends one prepared GET and reads the answer by its Content-Length: a
    few syscalls and no header parser, so that the querier's own CPU (http.client parses headers with the email
    package) does not
    compete with the instances for the 2 cores and its latency is mostly the server's."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The kernel's receive time of each chunk (Linux): how long the answer waited in the socket for this process
        # to get a core (and the GIL-free recv to return) is the querier's own share of the latency.
        self.timestamps = sys.platform == "linux"
        if self.timestamps:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.waited = 0.0  # of the last answer: from its last chunk's arrival to this process reading it (s)

    def get(self, path: str) -> tuple[int, str]:
        """(status, Location or "")."""
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, body = data.partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:])
        while len(body) < int(fields["Content-Length"]):
            body += self._recv()
        return int(head[9:12]), fields.get("Location", "")

    def _recv(self) -> bytes:
        if self.timestamps:
            chunk, ancillary, _, _ = self.sock.recvmsg(65536, 64)
            read_at = time.time()
            for level, kind, data in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                    seconds, nanoseconds = struct.unpack("qq", data[:16])
                    self.waited = max(0.0, read_at - seconds - nanoseconds / 1e9)
        else:
            chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the instance closed the connection")
        return chunk


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.queries", description=__doc__)
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--rate", type=int, default=5_000, help="input records per second")
    parser.add_argument("--qps", type=int, default=1_000, help="queries per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    # 2: each querier process costs CPU on the same cores (4 gave p99 13-15 ms where 2 gave 8.7 and 1 gave 6.3, the
    # one falling behind its schedule more often); BENCHMARKS.md
    parser.add_argument("--clients", type=int, default=2, help="querier processes sharing the pace")
    parser.add_argument(
        "--library", action="store_true", help="query with pipeline.query_client (http.client) instead of raw sockets"
    )
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
                tally = query_phase(
                    Pace(owners, ports, args.qps, args.seconds, phase == "routed", args.clients, args.library)
                )
                latencies, waits = tally.latencies, tally.waits
                print(
                    f"        owners {owners}; {tally.redirected} of {len(latencies)} answers redirected; refused "
                    f"{tally.refused}; {tally.late} queries sent over 1 ms after their slot; the querier's own wait "
                    "after an answer arrived "
                    + (f"p50 {percentile(waits, 0.5):.2f} p99 {percentile(waits, 0.99):.2f} ms" if any(waits) else "-")
                )
            after = [metrics(port) for port in ports], [cpu_seconds(i.pid) for i in instances], time.monotonic()
            report(phase, before, after, latencies, args.seconds)
    finally:
        for instance in instances:  # all at once: one stopped alone hands its partitions to the other first
            instance.terminate()
        for instance in instances:
            try:
                instance.wait(60)
            except subprocess.TimeoutExpired:
                instance.kill()
        feeder.kill()
        print(f"logs: {logs}")
    return 0


def report(phase: str, before: tuple, after: tuple, latencies: list[float], seconds: float) -> None:
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
            f"  queries {len(latencies) / seconds:5.0f}/s p50 {p50:.2f} ms p99 {p99:.2f} ms max {max(latencies):.1f} ms"
        )
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
