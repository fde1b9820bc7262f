"""`python -m tools.bench.timers`: what timers cost on a real broker (issue 10), two parts in one run.

throughput  windowed_totals with 100 k open windows against running_totals on the same input, exactly_once, 100 ms
            commit interval, 3 input partitions (tools/bench/throughput.py's runner measurement: from the first input
            record processed to the last). The input: --accounts accounts, one record each per 10 s window, all of
            a window's records stamped in its first 2 s (within the grace). So a window closes only when the first
            record of the window after next arrives: after the first window, between 1x and 2x --accounts windows
            (one state key and one stream-time timer each) are open at every moment, and each window change fires
            a burst of --accounts timers (one output each). The two apps alternate, --repeat rounds; medians, and
            the ratio of every round.
restore     a cold restore of one changelog partition through the runner's RestoreManager (new consumer, new
            state, stepped as between polls) plus what the task does with a restored state (`restored_state`:
            TimedState.adopt queues the timers), each restore in a fresh process (its peak RSS is its own):
              timers  windowed_totals' state with --timers open windows (half as many accounts, each with its
                      current and previous window): --timers window keys + --timers pending timers + stream time
              plain   running_totals' state with --timers keys
            each from the whole changelog, and from a full snapshot of it (state/snapshot_writer.write_snapshot, as
            SNAPSHOT_ON_SHUTDOWN writes it) with an empty tail. Medians of --repeat restores.

    python -m tools.bench.timers                          # both parts, defaults below (~10 min on 2 shared cores)
    python -m tools.bench.timers --part throughput --records 200000 --accounts 50000 --repeat 1   # a smoke run
    python -m tools.bench.timers --part restore --timers 100000 --repeat 1
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline import settings as settings_module
from pipeline.app import App
from pipeline.examples import running_totals, windowed_totals
from pipeline.examples.windowed_totals import GRACE_MS, WINDOW_MS
from pipeline.kafka.clients import client_config, producer_config, restore_consumer_config
from pipeline.kafka.offsets import high_watermarks
from pipeline.kafka.topics import CHANGELOG_CONFIG, SNAPSHOT_CONFIG
from pipeline.metrics import Metrics
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.state.restore_manager import RestoreManager
from pipeline.state.snapshot_writer import write_snapshot
from pipeline.state.timed import STREAM_TIME_KEY, TIMER_PREFIXES, restored_state
from pipeline.testing.inputs import account_partition, create_topics, produce
from tools.bench import snapshots
from tools.bench.throughput import (
    PARTITIONS,
    STOP_TIMEOUT_S,
    BenchError,
    Cell,
    Result,
    Run,
    Worker,
    _rate,
    cleanup,
    load_line,
    make_runner,
    measure,
    median,
    records_in,
)

APPS: dict[str, App] = {"windowed_totals": windowed_totals.app, "running_totals": running_totals.app}
OPEN_SPAN_MS = GRACE_MS - 1  # a window's records are stamped in its first OPEN_SPAN_MS: no window closes early


# -- throughput --------------------------------------------------------------------------------------------------------
def open_window_records(n: int, accounts: int, partitions: int) -> Iterator[tuple[int, bytes, bytes, int]]:
    """Record i: account i % accounts, in window i // accounts, stamped in that window's first OPEN_SPAN_MS, in
    order. Window w closes at stream time window_end + grace, which only the first record of window w + 2 reaches.
    Event time ends about now: the broker deletes input older than retention.ms by its timestamps."""
    windows = -(-n // accounts)
    now = time.time_ns() // 1_000_000
    start_ms = now - now % WINDOW_MS - windows * WINDOW_MS
    keys = [b"account-%d" % k for k in range(accounts)]
    parts = [account_partition(key, partitions) for key in keys]
    for i in range(n):
        window, k = divmod(i, accounts)
        yield (
            parts[k],
            keys[k],
            b'{"id":%d,"amount":%d}' % (i, i % 1000 - 100),
            start_ms + window * WINDOW_MS + k * OPEN_SPAN_MS // accounts,
        )


def expected_windows(n: int, accounts: int) -> int:
    """Windows closed (timers fired, outputs) by the end of the input: every window but the last two."""
    return max(0, -(-n // accounts) - 2) * accounts


def opened_windows(n: int, accounts: int) -> int:
    """(account, window) pairs that had a record: one window per account per `accounts` records."""
    return (n // accounts) * accounts + min(n % accounts, accounts)


class PendingTimers:
    """Samples the pending stream timers of the runner's partitions (the heaps' lengths: windowed_totals never moves
    or cancels a timer and fired ones are popped, so they are exact) alongside the progress that measure() polls.
    `lowest`: the fewest pending timers a partition held for each of its accounts, once past its first window (per
    partition: the partitions progress unevenly, so their sum can dip while one of them fires a burst)."""

    def __init__(self, runner: KafkaRunner, accounts: Mapping[int, int]) -> None:
        self.runner, self.accounts = runner, accounts
        self.highest = self.last = 0
        self.lowest: float | None = None
        self.cpu_started: tuple[float, int] | None = None  # (process CPU seconds, records) at the first progress

    def progress(self) -> int:
        count = records_in(self.runner.metrics)
        if self.cpu_started is None and count > 0:
            self.cpu_started = (time.process_time(), count)
        total = 0
        for p, task in list(self.runner.tasks.items()):
            pending = len(getattr(task.state, "_queues", {}).get("stream", ()))
            total += pending
            if (task.next_offset or 0) > self.accounts[p] * 1.05 and pending:  # into its second window
                ratio = pending / self.accounts[p]
                self.lowest = ratio if self.lowest is None else min(self.lowest, ratio)
        self.highest, self.last = max(self.highest, total), total
        return count


@dataclass(frozen=True)
class Sample:
    result: Result
    outputs: int = 0  # outputs of `process` (records_out: timer outputs are not counted there)
    closed_windows: int = 0  # windowed_totals: windows opened by the input minus timers still pending at the end
    pending_max: int = 0
    pending_lowest: float | None = None  # see PendingTimers.lowest
    cpu_us: float | None = None  # this process's CPU time (all threads, librdkafka's too) per record measured


def run_once(name: str, records: int, accounts: int, bootstrap: str, timeout_s: float) -> Sample:
    """One measured run of APPS[name] on fresh topics filled with open_window_records."""
    run_id = f"bench-timers-{name.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    run = Run(Cell(name, "100B", "100ms", records), "eos", bootstrap, run_id, {})
    create_topics(bootstrap, {run.input_topic: PARTITIONS, run.output_topic: PARTITIONS})
    try:
        run = replace(
            run,
            counts=produce(
                bootstrap,
                run.input_topic,
                open_window_records(records, accounts, PARTITIONS),
                partitions=PARTITIONS,
                timeout_s=120,
            ),
        )
        runner = make_runner(run, APPS[name])
        worker = Worker(runner.run, f"runner-{run_id}")
        pending = PendingTimers(runner, {p: max(1, n * accounts // records) for p, n in run.counts.items()})
        try:
            result = measure(pending.progress, records, worker, timeout_s).with_commits(runner.metrics)
            assert pending.cpu_started is not None  # measure() returned: progress was seen
            cpu_s, first = time.process_time() - pending.cpu_started[0], pending.cpu_started[1]
            pending.progress()
            outputs = counter_total(runner.metrics, "records_out")
        finally:
            runner.stop()
            worker.join(STOP_TIMEOUT_S)
        closed = opened_windows(records, accounts) - pending.last if APPS[name].timed else 0
        return Sample(result, outputs, closed, pending.highest, pending.lowest, 1e6 * cpu_s / max(1, records - first))
    except BenchError as e:
        return Sample(Result(None, error=str(e)))
    finally:
        cleanup(run)


def counter_total(metrics: Metrics, name: str) -> int:
    samples = (s for m in getattr(metrics, name).collect() for s in m.samples if s.name.endswith("_total"))
    return int(sum(s.value for s in samples))


def throughput(args: argparse.Namespace) -> list[str]:
    runs: dict[str, list[Sample]] = {name: [] for name in APPS}
    for _ in range(args.repeat):  # alternating, so that a burst of load elsewhere hits both alike
        for name in APPS:
            started = time.monotonic()
            sample = run_once(name, args.records, args.accounts, args.bootstrap_servers, args.timeout)
            runs[name].append(sample)
            log(
                f"{name}: {_rate(sample.result.rate)} rec/s over {sample.result.seconds:.1f}s, CPU "
                f"{sample.cpu_us or 0:.1f} us/record, {sample.outputs} outputs, {sample.closed_windows} windows "
                f"closed, pending timers max {sample.pending_max}, lowest per account {sample.pending_lowest} (run "
                f"took {time.monotonic() - started:.0f}s, {load_line('now')}) {sample.result.error}"
            )
    return throughput_table(runs, args)


def throughput_table(runs: dict[str, list[Sample]], args: argparse.Namespace) -> list[str]:
    lines = [
        "| app | median rec/s | every run rec/s | median CPU us/record | measured s | outputs of process | "
        "windows closed | pending timers: most / fewest per account | transactions |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, samples in runs.items():
        chosen = median([s.result for s in samples])
        sample = next((s for s in samples if s.result.rate == chosen.rate), samples[0])
        every = " / ".join(_rate(r) for r in chosen.runs)
        cpu = statistics.median(s.cpu_us for s in samples if s.cpu_us) if any(s.cpu_us for s in samples) else 0
        lowest = "-" if sample.pending_lowest is None else f"{sample.pending_lowest:.2f}"
        lines.append(
            f"| {name} | {_rate(chosen.rate)} | {every} | {cpu:.1f} | {chosen.seconds:.1f} | "
            f"{sample.outputs:,} | {sample.closed_windows:,} | {sample.pending_max:,} / {lowest} | "
            f"{chosen.transactions} |"
        )
    rounds = list(zip(*runs.values(), strict=True))  # (windowed, totals) of each round
    rates = [w.result.rate / t.result.rate for w, t in rounds if w.result.rate and t.result.rate]
    cpus = [t.cpu_us / w.cpu_us for w, t in rounds if w.cpu_us and t.cpu_us]
    for what, ratios in (("rec/s", rates), ("CPU per record, inverted", cpus)):
        every = " / ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"\nwindowed_totals / running_totals by {what}, per round: {every}; median {statistics.median(ratios):.2f}"
            if ratios
            else f"\nno ratio by {what}: a run failed"
        )
    lines += [
        f"\n{args.records:,} records, {args.accounts:,} accounts; windows expected closed: "
        f"{expected_windows(args.records, args.accounts):,}",
        *[f"- {name}: {s.result.error}" for name, samples in runs.items() for s in samples if s.result.error],
    ]
    return lines


# -- restore -----------------------------------------------------------------------------------------------------------
def timer_state(timers: int) -> Iterator[tuple[bytes, bytes]]:
    """windowed_totals' state with `timers` open windows: timers // 2 accounts, each with its current window and the
    previous one (still in its grace), as the TimedState stores them (docs/guarantees.md: timers-exactly-once)."""
    now = time.time_ns() // 1_000_000
    current = now - now % WINDOW_MS
    for k in range(timers):
        start = current - (k % 2) * WINDOW_MS
        key = b"account-%07d@%d" % (k // 2, start)
        yield key, b"[%d,%d]" % (k % 7 + 1, k)
        yield TIMER_PREFIXES["stream"].encode() + key, b"%d" % (start + WINDOW_MS + GRACE_MS)
    yield STREAM_TIME_KEY.encode(), b"%d" % (current + GRACE_MS - 1)


@dataclass
class Partition:
    """One app id's changelog (partition 0) and snapshot topic, written by `prepare_restore`."""

    kind: str  # "timers" | "plain"
    app: snapshots.App
    entries: int = 0
    changelog_end: int = 0
    snapshot_s: float = 0.0

    @property
    def app_name(self) -> str:
        return "windowed_totals" if self.kind == "timers" else "running_totals"


def prepare_restore(bootstrap: str, kind: str, timers: int) -> Partition:
    """Writes the state to a fresh changelog (transactions of 10 000 changes + a checkpoint, like the pipeline's
    commits), then a full snapshot of it covering the whole changelog."""
    app = snapshots.App(f"bench-timers-restore-{kind}-{uuid.uuid4().hex[:6]}", 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [
        NewTopic(f"{app.app_id}-changelog", 1, 1, config=CHANGELOG_CONFIG),
        NewTopic(f"{app.app_id}-snapshots", 1, 1, config=SNAPSHOT_CONFIG),
    ]
    for future in admin.create_topics(topics).values():
        future.result(30)
    entries = list(timer_state(timers) if kind == "timers" else snapshots.history(timers, 1))
    snapshots.write(bootstrap, app, iter(entries), len(entries))
    part = Partition(kind, app, len(entries))
    part.changelog_end = high_watermarks(admin, f"{app.app_id}-changelog", [0], 30)[0]
    settings = restore_settings(bootstrap, app.app_id)
    producer = Producer(producer_config(settings, f"{app.app_id}.snapshot"))
    producer.init_transactions(30)
    producer.begin_transaction()
    started = time.monotonic()
    write_snapshot(
        producer,
        app_id=app.app_id,
        snapshot_topic=f"{app.app_id}-snapshots",
        changelog_topic=f"{app.app_id}-changelog",
        partition=0,
        entries=((key.decode(), value) for key, value in entries),
        changelog_offset=part.changelog_end,
        input_offset=app.next_input,
        base=None,
        timeout_s=120,
    )
    producer.commit_transaction(60)
    part.snapshot_s = time.monotonic() - started
    log(f"{app.app_id}: full snapshot of {len(entries)} entries written in {part.snapshot_s:.1f}s")
    return part


def restore_settings(bootstrap: str, app_id: str) -> settings_module.Settings:
    return settings_module.load(env={}, bootstrap_servers=bootstrap, app_id=app_id, restore_timeout_ms=600_000)


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident set size now (VmRSS) or at its peak (VmHWM), in MB. Not ru_maxrss: Linux carries it
    over an exec from the process that forked, here the bench itself, which held the whole state it wrote."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def restore_once(bootstrap: str, app_id: str, app_name: str, committed: int, with_snapshot: bool) -> dict:
    """In a fresh process: restores partition 0 as the runner does (RestoreManager stepped until done, then
    `restored_state`, which queues the timers); seconds, counts and peak RSS."""
    settings = restore_settings(bootstrap, app_id)
    app = APPS[app_name]
    manager = RestoreManager(
        settings,
        f"{app_id}-changelog",
        f"{app_id}-snapshots" if with_snapshot else None,
        app.state_serde,
        lambda: Consumer(restore_consumer_config(settings, f"{app_id}.restore")),
        lambda: AdminClient(client_config(settings)),
        AdminClient(client_config(settings)),
    )
    before = rss_mb()
    started = time.monotonic()
    manager.start(0, committed)
    steps, finished = 1, manager.step()
    while not finished:
        steps, finished = steps + 1, manager.step()
    restored = time.monotonic()
    job = finished[0]
    state = restored_state(app, job.state, "p0")
    ended = time.monotonic()
    pending = len(getattr(state, "_queues", {}).get("stream", ()))
    return {
        "seconds": ended - started,
        "restore_s": restored - started,
        "adopt_s": ended - restored,
        "snapshot_entries": job.snapshot_entries,
        "changelog_records": job.records,
        "keys": len(state),
        "pending_timers": pending,
        "steps": steps,
        "rss_before_mb": before,
        "peak_rss_mb": rss_mb("VmHWM"),
    }


def restore(args: argparse.Namespace) -> list[str]:
    parts = [prepare_restore(args.bootstrap_servers, kind, args.timers) for kind in ("timers", "plain")]
    results: dict[tuple[str, bool], list[dict]] = {}
    try:
        for _ in range(args.repeat):
            for part in parts:
                for with_snapshot in (False, True):
                    result = in_fresh_process(
                        restore_once,
                        args.bootstrap_servers,
                        part.app.app_id,
                        part.app_name,
                        part.app.next_input,
                        with_snapshot,
                    )
                    results.setdefault((part.kind, with_snapshot), []).append(result)
                    log(
                        f"restore {part.kind} {'snapshot' if with_snapshot else 'changelog'}: {result} "
                        f"({load_line('now')})"
                    )
    finally:
        if not args.keep_topics:
            delete_topics(args.bootstrap_servers, [part.app.app_id for part in parts])
    return restore_table(parts, results)


def in_fresh_process(function: Callable[..., dict], *arguments: object) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


def restore_table(parts: Sequence[Partition], results: dict[tuple[str, bool], list[dict]]) -> list[str]:
    lines = [
        "| state | from | entries | median s (restore + adopt) | entries/s | every run s | peak RSS MB (before) "
        "| pending timers |",
        "|---|---|---:|---|---:|---|---|---:|",
    ]
    for part in parts:
        for with_snapshot in (False, True):
            runs = sorted(results[(part.kind, with_snapshot)], key=lambda r: r["seconds"])
            mid = runs[(len(runs) - 1) // 2]
            entries = mid["snapshot_entries"] if with_snapshot else mid["changelog_records"]
            every = " / ".join(f"{r['seconds']:.2f}" for r in results[(part.kind, with_snapshot)])
            lines.append(
                f"| {part.kind} ({part.app_name}) | {'full snapshot' if with_snapshot else 'changelog'} | "
                f"{entries:,} | {mid['seconds']:.2f} ({mid['restore_s']:.2f} + {mid['adopt_s']:.2f}) | "
                f"{entries / mid['seconds']:,.0f} | {every} | {mid['peak_rss_mb']:.0f} "
                f"({mid['rss_before_mb']:.0f}) | {mid['pending_timers']:,} |"
            )
    lines += [
        f"- {part.kind}: {part.entries:,} state entries, changelog end {part.changelog_end:,}, full snapshot "
        f"written in {part.snapshot_s:.1f}s"
        for part in parts
    ]
    return lines


def delete_topics(bootstrap: str, app_ids: Sequence[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [f"{app_id}-{kind}" for app_id in app_ids for kind in ("changelog", "snapshots")]
    for future in admin.delete_topics(topics, request_timeout=30).values():
        future.result(30)


# -- command line ------------------------------------------------------------------------------------------------------
def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.timers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--part", choices=["both", "throughput", "restore"], default="both")
    parser.add_argument("--records", type=int, default=500_000, help="input records per throughput run")
    parser.add_argument("--accounts", type=int, default=100_000, help="accounts: open windows per 10 s window")
    parser.add_argument("--timers", type=int, default=1_000_000, help="pending timers (and plain keys) restored")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for one throughput run")
    parser.add_argument("--keep-topics", action="store_true", help="keep the restore part's topics")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.repeat = max(1, args.repeat)
    lines = [f"_{load_line('at the start')}_", ""]
    if args.part in ("both", "throughput"):
        lines += ["### windowed_totals throughput with open windows", "", *throughput(args), ""]
    if args.part in ("both", "restore"):
        lines += [f"### Restore of {args.timers:,} pending timers", "", *restore(args), ""]
    print("\n".join([*lines, f"_{load_line('at the end')}_"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
