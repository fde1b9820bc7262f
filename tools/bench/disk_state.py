"""`python -m tools.bench.disk_state`: the disk state store (issue 32) against the memory store. Not a timed test.

throughput  running_totals on the real broker, --keys distinct accounts, each written once (every read a miss:
            the disk store's worst case), 3 partitions, the KafkaRunner in a process of its own per store;
            records/s from the first record processed to the last, and the process's peak RSS
rss         --keys keys of running_totals' shape loaded into one partition's disk store (a restore's path, in
            batches), then 200 000 transactions of 5 random updates each through the commit path; RSS after
            each phase and the store's size on disk. Memory bounded by STATE_BLOCK_CACHE_MB and
            STATE_WRITE_BUFFER_MB whatever the number of keys. --state-version 2: the state of an App at state
            version 2 whose loaded keys are version 1's (each read of one migrates it, an identity migrate: the
            cost of migrating on read, not of the App's own migrate)
restart     running_totals on the broker with the disk store until --keys accounts are in it, SIGKILL, 1 000 more
            records, the same command on the same STATE_DIR: seconds from the process's start to its partitions
            restored and to the new records processed (with the memory store for comparison)
supervised  the same under `pipeline run --workers 2`: one worker SIGKILLed, 1 000 more records; seconds from the
            kill to the supervisor's new worker assigned, restored and every record committed (the outage)

python -m tools.bench.disk_state throughput --keys 1000000
python -m tools.bench.disk_state rss --keys 10000000
python -m tools.bench.disk_state restart --keys 1000000
python -m tools.bench.disk_state restart --keys 10000000 --stores disk --restarts 5
python -m tools.bench.disk_state supervised --keys 10000000 --stores disk
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.examples.running_totals import app as totals
from pipeline.serde import JSON
from pipeline.state import PartitionState
from pipeline.state.disk_store import DiskPartitionState, DiskStore, DiskTimedState, StoreMemory
from pipeline.testing import inputs
from pipeline.testing.harness import wait_caught_up

PARTITIONS = 3


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def accounts(keys: int, start: int = 0) -> Iterator[tuple[int, bytes, bytes]]:
    """One record per account, account-<i> for i in start..start+keys, spread over the partitions."""
    for i in range(start, start + keys):
        yield i % PARTITIONS, b"account-%08d" % i, b'{"id": %d, "amount": %d}' % (i, i % 997)


def fresh_topics(bootstrap: str) -> tuple[object, str]:
    suffix = uuid.uuid4().hex[:8]
    app = totals.with_topics(f"disk-in-{suffix}", f"disk-out-{suffix}")
    inputs.create_topics(bootstrap, {app.input_topic: PARTITIONS, app.output_topic: PARTITIONS})
    return app, f"disk-bench-{suffix}"


# -- rss -------------------------------------------------------------------------------------------------------------
def disk_state(store: DiskStore, state_version: int) -> PartitionState:
    """The disk state of an App at `state_version` (above 1: an identity migrate)."""
    if state_version == 1:
        return DiskPartitionState(store, JSON)
    state = DiskTimedState(JSON, version=state_version, migrate=lambda version, value: value)
    state.attach(store)
    return state


def rss(keys: int, updates: int, block_cache_mb: int, write_buffer_mb: int, state_version: int = 1) -> dict[str, float]:
    path = Path(tempfile.mkdtemp(prefix="disk-bench-", dir=os.environ.get("BENCH_DIR")))
    report = {"keys": keys, "state_version": state_version, "rss_start_mb": rss_mb()}
    store = DiskStore(path / "p0", StoreMemory(block_cache_mb, write_buffer_mb))
    state = disk_state(store, state_version)
    started, cpu = time.monotonic(), time.process_time()
    batch: dict[str, bytes | None] = {}
    for i in range(keys):
        batch[f"account-{i:08d}"] = b"[1,%d]" % i
        if len(batch) == 50_000:
            state.load(batch)
            batch = {}
    state.load(batch)
    report |= {"load_s": time.monotonic() - started, "load_cpu_s": time.process_time() - cpu}
    report |= {"rss_after_load_mb": rss_mb()}
    rng, started, cpu = random.Random(1), time.monotonic(), time.process_time()
    for txn in range(updates // 5):
        for _ in range(5):
            state.begin_record()
            key = f"account-{rng.randrange(keys):08d}"
            count, total = state.get(key, [0, 0])
            state[key] = [count + 1, total + txn]
        state.commit()
    report |= {"updates_s": time.monotonic() - started, "updates_cpu_s": time.process_time() - cpu}
    report |= {"rss_after_updates_mb": rss_mb()}
    report |= {"peak_rss_mb": peak_mb(), "disk_mb": store.disk_bytes() / 1e6, "count": store.count}
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return report


# -- restart ---------------------------------------------------------------------------------------------------------
def filled_service(bootstrap: str, store: str, keys: int) -> tuple[object, str, str, dict[str, str]]:
    """Fresh topics with `keys` accounts on the input; the App, its id, a state directory and the environment of a
    `pipeline run` of it on `store` there."""
    app, app_id = fresh_topics(bootstrap)
    inputs.produce(bootstrap, app.input_topic, accounts(keys), partitions=PARTITIONS, timeout_s=900)  # type: ignore[attr-defined]
    state_dir = tempfile.mkdtemp(prefix="disk-bench-", dir=os.environ.get("BENCH_DIR"))
    env = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": bootstrap,
        "PIPELINE_APP_ID": app_id,
        "PIPELINE_INPUT_TOPIC": app.input_topic,  # type: ignore[attr-defined]
        "PIPELINE_OUTPUT_TOPIC": app.output_topic,  # type: ignore[attr-defined]
        "PIPELINE_STATE_STORE": store,
        "PIPELINE_STATE_DIR": state_dir,
        "PIPELINE_SESSION_TIMEOUT_MS": "30000",
    }
    return app, app_id, state_dir, env


def restart(bootstrap: str, store: str, keys: int, restarts: int = 1) -> dict[str, Any]:
    """The first run fills the store; then `restarts` times: SIGKILL, 1 000 more records, the same command again.
    Each restart's seconds, and their medians."""
    app, app_id, state_dir, env = filled_service(bootstrap, store, keys)
    env["PIPELINE_GROUP_INSTANCE_ID"] = "bench-0"  # static: the restarted process takes its partitions back at once
    command = [sys.executable, "-m", "pipeline", "run", "pipeline.examples.running_totals:app"]
    log_path = Path(state_dir) / "first.log"
    first_started = time.time()
    with open(log_path, "wb") as log:
        running = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    assert not wait_caught_up(bootstrap, app_id, app.input_topic, PARTITIONS, 1800)  # type: ignore[attr-defined]
    first_text = log_path.read_text()
    first_restored = max(_log_time(line) for line in first_text.splitlines() if " restored: " in line)
    processing_s = time.time() - first_restored  # from its partitions ready to every record committed
    result: dict[str, Any] = {
        "first_run_records_per_s": keys / processing_s,
        "first_run_cpu_s": _cpu_seconds(running.pid),
        "first_run_wall_s": time.time() - first_started,
    }
    runs = []
    for i in range(restarts):
        running.send_signal(signal.SIGKILL)
        running.wait()
        more = accounts(1_000, keys + 1_000 * i)
        inputs.produce(bootstrap, app.input_topic, more, partitions=PARTITIONS)  # type: ignore[attr-defined]
        running, run = _restarted(bootstrap, app, app_id, command, env, Path(state_dir) / f"restart-{i}.log")
        runs.append(run)
    running.send_signal(signal.SIGTERM)
    running.wait(60)
    shutil.rmtree(state_dir, ignore_errors=True)
    medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    return {**result, **medians, "restarts": runs}


def _restarted(
    bootstrap: str, app: Any, app_id: str, command: list[str], env: dict[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], dict[str, float]]:
    started = time.time()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    assert not wait_caught_up(bootstrap, app_id, app.input_topic, PARTITIONS, 600)
    caught_up = time.time() - started
    text = log_path.read_text()
    restored = [_log_time(line) for line in text.splitlines() if " restored: " in line]
    assigned = [_log_time(line) for line in text.splitlines() if " assigned [" in line]
    return process, {
        "start_to_assigned_s": min(assigned) - started,
        "start_to_restored_s": max(restored) - started,
        "assigned_to_restored_s": max(restored) - min(assigned),
        "start_to_caught_up_s": caught_up,
    }


def supervised(bootstrap: str, store: str, keys: int) -> dict[str, float]:
    """`pipeline run --workers 2` until --keys accounts are in the stores; one worker SIGKILLed, 1 000 more records."""
    app, app_id, state_dir, env = filled_service(bootstrap, store, keys)
    # two workers: one (the default) is the service process itself, with no supervisor to restart it
    command = [sys.executable, "-m", "pipeline", "run", "--workers", "2", "pipeline.examples.running_totals:app"]
    log_path = Path(state_dir) / "supervised.log"
    with open(log_path, "wb") as log:
        supervisor = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert not wait_caught_up(bootstrap, app_id, app.input_topic, PARTITIONS, 1800)  # type: ignore[attr-defined]
        before = len(log_path.read_text().splitlines())
        tasks = Path(f"/proc/{supervisor.pid}/task").iterdir()  # the worker is started from one of its threads
        worker = min(int(child) for task in tasks for child in (task / "children").read_text().split())
        killed = time.time()
        os.kill(worker, signal.SIGKILL)
        inputs.produce(bootstrap, app.input_topic, accounts(1_000, keys), partitions=PARTITIONS)  # type: ignore[attr-defined]
        assert not wait_caught_up(bootstrap, app_id, app.input_topic, PARTITIONS, 600)  # type: ignore[attr-defined]
        caught_up = time.time() - killed
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(60)
    lines = log_path.read_text().splitlines()[before:]
    restored = [_log_time(line) for line in lines if " restored: " in line]
    assigned = [_log_time(line) for line in lines if " assigned [" in line]
    shutil.rmtree(state_dir, ignore_errors=True)
    return {
        "kill_to_assigned_s": min(assigned) - killed,
        "kill_to_restored_s": max(restored) - killed,
        "kill_to_caught_up_s": caught_up,
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process so far (/proc: the machine may be loaded, CPU is not)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _log_time(line: str) -> float:
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    assert stamp, line
    return time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["rss", "restart", "supervised"])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--stores", default="memory,disk")
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--block-cache-mb", type=int, default=64)
    parser.add_argument("--write-buffer-mb", type=int, default=32)
    parser.add_argument("--state-version", type=int, default=1, help="rss: the App's state version")
    parser.add_argument("--restarts", type=int, default=1, help="restart: SIGKILLs and restarts after one fill")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.what == "rss":
        print(json.dumps(rss(args.keys, args.updates, args.block_cache_mb, args.write_buffer_mb, args.state_version)))
        return
    if args.one:
        if args.what == "supervised":
            result = supervised(args.bootstrap_servers, args.one, args.keys)
        else:
            result = restart(args.bootstrap_servers, args.one, args.keys, args.restarts)
        print(json.dumps({"store": args.one, **result}))
        return
    for store in args.stores.split(","):
        subprocess.run([sys.executable, "-m", "tools.bench.disk_state", *sys.argv[1:], "--one", store], check=True)


if __name__ == "__main__":
    main()
