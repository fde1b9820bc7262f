"""`python -m tools.bench.big_state`: restore of a big partition state on a real broker, and memory per key (issue 11,
item 4; not a timed test).

One changelog partition holds a state of --snapshot-keys + --tail keys:
  snapshot  a full snapshot of --snapshot-keys entries (running_totals' shape: key "account-<8 digits>", value
            "[count,sum]"), written by pipeline/state/snapshot_writer.write_snapshot in one transaction, as the
            pipeline's SNAPSHOT_ON_SHUTDOWN writes it (the compaction job publishes the same chunks and manifest). It
            covers changelog offset 0 and input offset --snapshot-keys: the changelog below it is not written, a
            restore never reads it.
  tail      --tail changes of new keys after it, in transactions of 10 000 changes + a checkpoint (the pipeline's
            commits), so the restored state has --snapshot-keys + --tail keys.
Each restore runs in a fresh process (its RSS and peak are its own): the runner's RestoreManager, started and stepped
(RESTORE_STEP_MS) until done, on the runner's restore consumer. Reported per restore: seconds (snapshot phase + tail
phase), entries/s, the longest step, RSS before / after (steady, after a gc) / peak (ru_maxrss), and memory per key:
(RSS after - RSS before) / keys, (peak - before) / keys, and the objects' own accounting: sys.getsizeof of the
PartitionState's dict, its keys and its values, also rounded up to pymalloc's 16-byte blocks. Medians of --repeat
restores. The snapshot writer's time and peak RSS are reported too (a fresh process as well).

    python -m tools.bench.big_state                                   # 9 M + 1 M = 10 M keys, 2 restores
    python -m tools.bench.big_state --snapshot-keys 900000 --tail 100000 --repeat 3   # 1 M keys, a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from pipeline import settings as settings_module
from pipeline.kafka.clients import client_config, producer_config, restore_consumer_config
from pipeline.serde import JSON
from pipeline.state import PartitionState
from pipeline.state.restore import ChangelogRestore
from pipeline.state.restore_manager import RestoreManager
from pipeline.state.snapshot_writer import write_snapshot
from tools.bench import snapshots

MIB = 1024 * 1024
BLOCK = 16  # pymalloc's alignment: an object of n bytes (n <= 512) takes ceil(n / 16) * 16


def key(k: int) -> str:
    return f"account-{k:08d}"


def value(k: int) -> bytes:
    return b"[%d,%d]" % (k % 97 + 1, k * 31 % 1_000_003)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def settings_for(bootstrap: str, app_id: str) -> settings_module.Settings:
    return settings_module.load(env={}, bootstrap_servers=bootstrap, app_id=app_id, restore_timeout_ms=3_600_000)


# -- preparing the partition (fresh processes) ---------------------------------------------------------------------
def write_snapshot_once(bootstrap: str, app_id: str, keys: int) -> dict:
    """The full snapshot of `keys` entries, as the pipeline writes one on shutdown (entries from a state's dict)."""
    state = PartitionState(JSON)
    state.load({key(k): value(k) for k in range(keys)})
    before = rss_bytes()
    # One transaction for the whole snapshot: at the default TRANSACTION_TIMEOUT_MS (10 s) a 9 M-entry snapshot on a
    # loaded machine was aborted by the broker (fenced) twice; the bench measures the write, so it allows 5 minutes.
    settings = settings_module.load(env={}, bootstrap_servers=bootstrap, app_id=app_id, transaction_timeout_ms=300_000)
    producer = Producer(producer_config(settings, f"{app_id}.snapshot"))
    producer.init_transactions(30)
    producer.begin_transaction()
    started = time.monotonic()
    manifest = write_snapshot(
        producer,
        app_id=app_id,
        snapshot_topic=f"{app_id}-snapshots",
        changelog_topic=f"{app_id}-changelog",
        partition=0,
        entries=state.encoded_items(),
        changelog_offset=0,
        input_offset=keys,
        base=None,
        timeout_s=600,
    )
    producer.commit_transaction(120)
    seconds = time.monotonic() - started
    return {
        "seconds": seconds,
        "entries": manifest.entries,
        "chunks": manifest.chunks,
        "bytes": manifest.bytes,
        "state_rss": before,
        "peak_rss": peak_rss_bytes(),
    }


def tail_changes(first: int, n: int) -> Iterator[tuple[bytes, bytes]]:
    for k in range(first, first + n):
        yield key(k).encode(), value(k)


def prepare(bootstrap: str, snapshot_keys: int, tail: int) -> tuple[snapshots.App, dict]:
    app = snapshots.create(bootstrap, 1)  # topics bench-snap-1x-<id>-{changelog,snapshots}, deleted at the end
    written = in_fresh_process(write_snapshot_once, bootstrap, app.app_id, snapshot_keys)
    log(
        f"snapshot of {written['entries']:,} entries: {written['chunks']} chunks, {written['bytes'] / MIB:.0f} MiB, "
        f"{written['seconds']:.1f} s, writer peak RSS {written['peak_rss'] / MIB:.0f} MiB "
        f"(state alone {written['state_rss'] / MIB:.0f} MiB)"
    )
    app.next_input = snapshot_keys  # the checkpoints of the tail go on from the input the snapshot covers
    snapshots.write(bootstrap, app, tail_changes(snapshot_keys, tail), tail)
    return app, written


# -- one restore (a fresh process) ---------------------------------------------------------------------------------
def accounting(state: PartitionState) -> dict:
    """Bytes of the state's objects: the dict (its table), the keys, the values; raw and in pymalloc blocks."""
    data = state._data  # the bench looks inside on purpose: what the state holds per key
    sizes = {"dict": sys.getsizeof(data), "keys": 0, "values": 0, "keys_blocks": 0, "values_blocks": 0}
    for k, v in data.items():
        key_size, value_size = sys.getsizeof(k), sys.getsizeof(v)
        sizes["keys"] += key_size
        sizes["values"] += value_size
        sizes["keys_blocks"] += -(-key_size // BLOCK) * BLOCK
        sizes["values_blocks"] += -(-value_size // BLOCK) * BLOCK
    return sizes


def restore_once(bootstrap: str, app_id: str, committed: int) -> dict:
    settings = settings_for(bootstrap, app_id)
    manager = RestoreManager(
        settings,
        f"{app_id}-changelog",
        f"{app_id}-snapshots",
        JSON,
        lambda: Consumer(restore_consumer_config(settings, f"{app_id}.restore")),
        lambda: AdminClient(client_config(settings)),
        AdminClient(client_config(settings)),
    )
    gc.collect()
    before = rss_bytes()
    started = time.monotonic()
    manager.start(0, committed)
    steps, longest = 0, 0.0
    finished: list[ChangelogRestore] = []
    while not finished:
        step_started = time.monotonic()
        finished = manager.step()
        steps, longest = steps + 1, max(longest, time.monotonic() - step_started)
    seconds = time.monotonic() - started
    job = finished[0]
    peak = peak_rss_bytes()
    gc.collect()
    after = rss_bytes()
    trimmed = after
    with contextlib.suppress(OSError, AttributeError):  # glibc: what of `after` is freed heap kept by malloc
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = rss_bytes()
    return {
        "rss_trimmed": trimmed,
        "seconds": seconds,
        "snapshot_s": job.snapshot_seconds,
        "tail_s": job.tail_seconds,
        "steps": steps,
        "longest_step_s": longest,
        "keys": len(job.state),
        "snapshot_entries": job.snapshot_entries,
        "changelog_records": job.records,
        "rss_before": before,
        "rss_after": after,
        "peak_rss": peak,
        "objects": accounting(job.state),
    }


def in_fresh_process(function: Callable[..., dict], *arguments: object) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


# -- the table ---------------------------------------------------------------------------------------------------------
def summary(runs: list[dict]) -> list[str]:
    mid = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]
    keys = mid["keys"]
    objects = mid["objects"]
    held = objects["dict"] + objects["keys"] + objects["values"]
    blocks = objects["dict"] + objects["keys_blocks"] + objects["values_blocks"]
    median = statistics.median
    every = " / ".join(f"{r['seconds']:.1f}" for r in runs)
    return [
        f"restore of {keys:,} keys ({mid['snapshot_entries']:,} snapshot entries + {mid['changelog_records']:,} "
        f"changelog records), median of {len(runs)}: {mid['seconds']:.1f} s = {keys / mid['seconds']:,.0f} keys/s "
        f"(snapshot {mid['snapshot_s']:.1f} s = {mid['snapshot_entries'] / mid['snapshot_s']:,.0f} entries/s, tail "
        f"{mid['tail_s']:.1f} s = {mid['changelog_records'] / max(mid['tail_s'], 1e-9):,.0f} records/s); every run "
        f"{every} s; {mid['steps']} steps, longest "
        f"{mid['longest_step_s']:.2f} s",
        f"RSS before {mid['rss_before'] / MIB:.0f} MiB, after {mid['rss_after'] / MIB:.0f} MiB, peak "
        f"{mid['peak_rss'] / MIB:.0f} MiB (medians: after {median(r['rss_after'] for r in runs) / MIB:.0f}, peak "
        f"{median(r['peak_rss'] for r in runs) / MIB:.0f}); after glibc's malloc_trim "
        f"{mid['rss_trimmed'] / MIB:.0f} MiB",
        f"per key: RSS {(mid['rss_after'] - mid['rss_before']) / keys:.0f} B (trimmed "
        f"{(mid['rss_trimmed'] - mid['rss_before']) / keys:.0f} B), "
        f"peak {(mid['peak_rss'] - mid['rss_before']) / keys:.0f} B; objects "
        f"{held / keys:.0f} B (dict {objects['dict'] / keys:.0f} + key {objects['keys'] / keys:.0f} + value "
        f"{objects['values'] / keys:.0f}), in 16-byte blocks {blocks / keys:.0f} B",
    ]


def log(message: str) -> None:
    print(
        f"[{time.strftime('%H:%M:%S')}] {message} (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.big_state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--snapshot-keys", type=int, default=9_000_000)
    parser.add_argument("--tail", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", help="also write every result here")
    parser.add_argument("--keep-topics", action="store_true", help="do not delete the topics at the end")
    args = parser.parse_args(argv)
    bootstrap = args.bootstrap_servers
    app, written = prepare(bootstrap, args.snapshot_keys, args.tail)
    runs: list[dict] = []
    try:
        for _ in range(args.repeat):
            runs.append(in_fresh_process(restore_once, bootstrap, app.app_id, app.next_input))
            log(f"restore: {runs[-1]['seconds']:.1f} s, peak RSS {runs[-1]['peak_rss'] / MIB:.0f} MiB")
    finally:
        if not args.keep_topics:  # a 10 M-key state is hundreds of megabytes on the broker's disk
            admin = AdminClient({"bootstrap.servers": bootstrap})
            topics = [f"{app.app_id}-changelog", f"{app.app_id}-snapshots"]
            for future in admin.delete_topics(topics, request_timeout=30).values():
                future.result(30)
    print("\n".join(summary(runs)))
    print(
        f"snapshot written (write_snapshot, one transaction): {written['entries']:,} entries, {written['chunks']} "
        f"chunks, {written['bytes'] / MIB:.0f} MiB in {written['seconds']:.1f} s = "
        f"{written['entries'] / written['seconds']:,.0f} entries/s; writer RSS {written['state_rss'] / MIB:.0f} MiB "
        f"with the state, peak {written['peak_rss'] / MIB:.0f} MiB"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"written": written, "restores": runs}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
