"""`python -m tools.bench.failover`: how long a crash stops the output (issue 22).

Each run: fresh topics (4 input and 4 output partitions), two members of one App's group, a producer process writing
--rate records/s (each value `{"id": <wall-clock produce time>, "amount": 1}`: the copier copies it, running_totals
passes the id on into its output), and a read_committed reader (this process) taking `receive time - produce time` of
every record. After --warmup seconds one member is SIGKILLed; the load goes on for --after seconds, then the reader
drains. Reported per run, over the records received after the kill:
    outage   the worst produce -> visible latency of any record (what the crash cost the slowest record)
    >1s      how many records took over one second
    lost     records produced but never seen (a drain that ended early; 0 in every sound run)
and, as a reference, the worst latency before the kill. The cases:
    restart   `pipeline run --workers 2`: worker 0 is SIGKILLed and the supervisor starts it again in its slot
    takeover  two `pipeline run` processes: one is SIGKILLed, nothing restarts it; the other takes over
--keys K fills the state first: K records of K distinct keys (processed before the load starts), and the load's keys
are drawn from them (K=0: 100 keys). The members import `pipeline` from --tree (default: this checkout): compare
the code of two commits with `git archive <commit> | tar -x -C /tmp/before`. Medians over --repeat runs, the
1-minute load average beside every run (other processes share the cores).

    python -m tools.bench.failover --app running_totals --keys 0,100000 --cases restart,takeover --repeat 3
    python -m tools.bench.failover --env PIPELINE_PRODUCERS=per_partition --env PIPELINE_GROUP_PROTOCOL=consumer
    python -m tools.bench.failover --keys 1000000 --cases takeover --env PIPELINE_STANDBY_REPLICAS=1 \
        --env PIPELINE_STATE_STORE=disk     # each member gets a STATE_DIR of its own under the log directory
Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.testing.inputs import create_topics
from tools.bench.latency import cleanup

PARTITIONS = 4
SMALL_KEYSPACE = 100
APPS = {"running_totals": "pipeline.examples.running_totals:app", "copier": "pipeline.examples.copier:app"}
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    case: str
    keys: int
    load: tuple[float, float] = (0.0, 0.0)
    outage_s: float = 0.0
    over_1s: int = 0
    lost: int = 0
    before_s: float = 0.0  # the worst latency before the kill
    # latency percentiles of the steady state: the second half of the warm-up (both members running; with
    # STANDBY_REPLICAS, each following the other's changelog), to compare settings with a long --warmup
    steady_ms: tuple[float, float] = (0.0, 0.0)  # p50, p99
    error: str = ""


@dataclass
class Members:
    """The two members: one supervisor (case restart) or two processes (case takeover)."""

    processes: list[subprocess.Popen]
    logs: list[Path]
    victim_pid: int = 0
    extra: list[int] = field(default_factory=list)

    def tail(self) -> str:
        return "\n".join(line for p in self.logs for line in p.read_text(errors="replace").splitlines()[-15:])

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def produce(bootstrap: str, topic: str, rate: float, seconds: float, keys: int, done: multiprocessing.Queue) -> None:
    """Runs in its own process: `rate` records/s for `seconds`, keys drawn from `keys` distinct ones."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    rng = random.Random(1)
    started, n, total = time.time(), 0, int(rate * seconds)
    while n < total:
        while n < min(total, int((time.time() - started) * rate) + 1):
            value = orjson.dumps({"id": time.time(), "amount": 1})
            producer.produce(topic, value, key=b"k-%d" % rng.randrange(keys))
            n += 1
        producer.poll(0)
        time.sleep(max(0.0, n / rate - (time.time() - started)))
    producer.flush(60)
    done.put(n)


def prefill(bootstrap: str, topic: str, keys: int) -> None:
    """`keys` records of distinct keys (id 0: not measured)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = orjson.dumps({"id": 0, "amount": 1})
    for k in range(keys):
        while True:
            try:
                producer.produce(topic, value, key=b"k-%d" % k)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)


class Reader:
    """read_committed reader of the output: the produce stamp of every record, with its receive time."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"failover-reader-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])

    def read(self, timeout_s: float) -> Iterator[tuple[float, float]]:
        first = self.consumer.poll(timeout_s)
        if first is None:
            return
        messages = [first, *self.consumer.consume(10_000, 0)]
        now = time.time()
        for m in messages:
            if m.error():
                raise KafkaException(m.error())
            yield now, float(orjson.loads(m.value() or b"")["id"])  # the bench's records all have a value

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True)
class Bench:
    bootstrap: str
    app: str
    tree: Path
    env: Mapping[str, str]
    rate: float
    warmup_s: float
    after_s: float
    log_dir: Path

    def run(self, case: str, keys: int) -> Run:
        result = Run(case, keys, load=(os.getloadavg()[0], 0.0))
        app_id = f"failover-{case}-{keys}-{uuid.uuid4().hex[:6]}"
        topics = (f"{app_id}-in", f"{app_id}-out")
        create_topics(self.bootstrap, dict.fromkeys(topics, PARTITIONS))
        reader = Reader(self.bootstrap, topics[1])
        members: Members | None = None
        try:
            prefill(self.bootstrap, topics[0], keys)
            members = self._start(case, app_id, topics)
            self._wait_ready(members, reader, app_id, topics[0], keys)
            self._measure(result, members, reader, topics[0], keys)
        except RuntimeError as e:
            result.error = str(e)
        finally:
            if members is not None:
                members.stop()
            reader.close()
            cleanup(self.bootstrap, app_id)
        result.load = (result.load[0], os.getloadavg()[0])
        return result

    def _start(self, case: str, app_id: str, topics: tuple[str, str]) -> Members:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.tree), os.environ.get("PYTHONPATH")])),
            "PIPELINE_BOOTSTRAP_SERVERS": self.bootstrap,
            "PIPELINE_APP_ID": app_id,
            "PIPELINE_INPUT_TOPIC": topics[0],
            "PIPELINE_OUTPUT_TOPIC": topics[1],
            **self.env,
        }
        command = [sys.executable, "-m", "pipeline", "--log-level", "info", "run"]
        if case == "restart":
            names = [("sup", [*command, "--workers", "2", APPS[self.app]])]
        else:
            names = [(name, [*command, APPS[self.app]]) for name in ("a", "b")]
        processes, logs = [], []
        for name, argv in names:
            member_env = dict(env)
            if case != "restart" and env.get("PIPELINE_GROUP_INSTANCE_ID"):
                member_env["PIPELINE_GROUP_INSTANCE_ID"] = f"{env['PIPELINE_GROUP_INSTANCE_ID']}-{name}"
            if env.get("PIPELINE_STATE_STORE") == "disk" and not env.get("PIPELINE_STATE_DIR"):
                member_env["PIPELINE_STATE_DIR"] = str(self.log_dir / f"{app_id}-{name}-state")  # one per member
            logs.append(log_path := self.log_dir / f"{app_id}-{name}.log")
            with open(log_path, "wb") as out:
                processes.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.tree,
                        env=member_env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
        return Members(processes, logs)

    def _wait_ready(self, members: Members, reader: Reader, app_id: str, in_topic: str, keys: int) -> None:
        """Until the prefill and a probe record per partition came out, both members are up, and (case restart) the
        victim's pid is known."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _two_members_assigned(self.bootstrap, app_id):
            if any(p.poll() is not None for p in members.processes) or time.monotonic() > deadline:
                raise RuntimeError(f"the group never had two members with partitions:\n{members.tail()}")
            time.sleep(0.5)
        probe = Producer({"bootstrap.servers": self.bootstrap})
        for p in range(PARTITIONS):
            probe.produce(in_topic, orjson.dumps({"id": 0, "amount": 1}), key=b"probe", partition=p)
        probe.flush(10)
        seen, deadline = 0, time.monotonic() + READY_TIMEOUT_S
        while seen < keys + PARTITIONS:
            if any(p.poll() is not None for p in members.processes) or time.monotonic() > deadline:
                raise RuntimeError(f"not ready ({seen}/{keys + PARTITIONS} seen):\n{members.tail()}")
            seen += sum(1 for _ in reader.read(0.2))
        if len(members.processes) == 1:  # the supervisor's workers: slot 0 was started first
            children = sorted(_children(members.processes[0].pid))
            if len(children) != 2:
                raise RuntimeError(f"expected 2 workers, found {children}")
            members.victim_pid = children[0]
        else:
            members.victim_pid = members.processes[0].pid

    def _measure(self, result: Run, members: Members, reader: Reader, in_topic: str, keys: int) -> None:
        context = multiprocessing.get_context("spawn")
        done = context.Queue()
        seconds = self.warmup_s + self.after_s
        args = (self.bootstrap, in_topic, self.rate, seconds, keys or SMALL_KEYSPACE, done)
        producer = context.Process(target=produce, args=args, daemon=True)
        producer.start()
        kill_at, killed_at = time.time() + self.warmup_s, 0.0
        steady_from = kill_at - self.warmup_s / 2
        steady: list[float] = []
        before: list[float] = []
        after: list[float] = []
        total, deadline = None, float("inf")
        while (total is None or len(before) + len(after) < total) and time.monotonic() < deadline:
            if not killed_at and time.time() >= kill_at:
                os.kill(members.victim_pid, signal.SIGKILL)
                killed_at = time.time()
            for received, stamp in reader.read(0.05):
                if stamp > 0:
                    (after if killed_at and received >= killed_at else before).append(received - stamp)
                    if steady_from <= stamp and not killed_at:
                        steady.append(received - stamp)
            if total is None and not done.empty():
                total = done.get()
                deadline = time.monotonic() + DRAIN_TIMEOUT_S
        producer.join(10)
        result.outage_s = max(after, default=0.0)
        result.over_1s = sum(1 for latency in after if latency > 1.0)
        result.before_s = max(before, default=0.0)
        if len(steady) >= 2:
            cuts = statistics.quantiles(steady, n=100)
            result.steady_ms = (cuts[49] * 1000, cuts[98] * 1000)
        result.lost = (total or 0) - len(before) - len(after)


def _two_members_assigned(bootstrap: str, group: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=10)
    except KafkaException:
        return False
    assigned = [m for m in description.members if m.assignment and m.assignment.topic_partitions]
    return len(assigned) == 2 and sum(len(m.assignment.topic_partitions) for m in assigned) == PARTITIONS


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def _median(runs: Sequence[Run], attribute: str) -> float:
    return statistics.median(getattr(r, attribute) for r in runs)


def report(runs: Sequence[Run]) -> str:
    lines = [
        "| case | keys | outage s (median) | >1 s (median) | every run: outage s / >1 s / lost / worst before kill s"
        " / load avg start-end |",
        "|---|---:|---:|---:|---|",
    ]
    for case, keys in dict.fromkeys((r.case, r.keys) for r in runs):
        cell = [r for r in runs if (r.case, r.keys) == (case, keys) and not r.error]
        each = "; ".join(
            f"{r.outage_s:.2f} / {r.over_1s} / {r.lost} / {r.before_s:.2f} / {r.load[0]:.1f}-{r.load[1]:.1f}"
            for r in cell
        )
        if cell:
            lines.append(
                f"| {case} | {keys:,} | {_median(cell, 'outage_s'):.2f} | {_median(cell, 'over_1s'):.0f} | {each} |"
            )
    errors = [f"{r.case}/{r.keys}: {r.error}" for r in runs if r.error]
    return "\n".join(lines + (["", *errors] if errors else []))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.failover", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--app", choices=sorted(APPS), default="running_totals")
    parser.add_argument("--keys", default="0,100000", help="keys of state, comma-separated (default 0,100000)")
    parser.add_argument("--cases", default="restart,takeover", help="restart,takeover (default both)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s (default 2000)")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds of load before the kill (default 8)")
    parser.add_argument("--after", type=float, default=25.0, help="seconds of load after the kill (default 25)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout the members import pipeline from")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the members (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="keep the members' logs here (default: a temporary directory)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as temporary:
        log_dir = args.log_dir or temporary
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        timing = (args.rate, args.warmup, args.after)
        bench = Bench(args.bootstrap_servers, args.app, args.tree.resolve(), env, *timing, Path(log_dir))
        runs: list[Run] = []
        for _ in range(args.repeat):  # the cells alternate within a repeat: each sees the same machine
            for keys in (int(k) for k in args.keys.split(",")):
                for case in args.cases.split(","):
                    runs.append(run := bench.run(case, keys))
                    steady = "/".join(f"{ms:.1f}" for ms in run.steady_ms)
                    print(
                        f"{case} keys={keys}: outage {run.outage_s:.2f} s, >1s {run.over_1s}, lost {run.lost}, before "
                        f"{run.before_s:.2f} s, steady p50/p99 {steady} ms, load {run.load[0]:.1f}-{run.load[1]:.1f} "
                        f"{run.error[:2000]}",
                        flush=True,
                    )
        print(f"\n{args.app}, {args.rate:.0f} rec/s, env {env or '-'}, tree {args.tree}")
        print(report(runs))
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
