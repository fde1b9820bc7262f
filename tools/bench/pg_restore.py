"""The PostgreSQL sink's restore of one partition's state (not a timed test): seconds, rows/s, RSS, longest step.

One schema is filled once (COPY) with KEYS state rows of partition 0, shaped like running_totals_pg's (key
"account-<i>", value "[count,sum]"). Then each run is a fresh process (so RSS is its own) that takes p0 over as the
runner does: fence, then restore steps of RESTORE_STEP_MS (keyset pages, `PostgresTask.restore_step`) until done;
`--modes single` also runs the restore as it was before issue 11: one statement reading every row in one REPEATABLE
READ transaction inside the assignment callback. Medians over the runs; the load average is printed with each run.

    python -m tools.bench.pg_restore --keys 1000000 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid

import psycopg
import psycopg_pool
from psycopg import sql

from pipeline.examples.running_totals_pg import TotalsSink
from pipeline.examples.running_totals_pg import app as totals_pg
from pipeline.metrics import Metrics
from pipeline.settings import Settings
from pipeline.sinks.postgres.schema import STATE, connection_kwargs, ensure_schema
from pipeline.sinks.postgres.task import PostgresTask, PostgresTaskContext
from pipeline.state import PartitionState

DEFAULT_DSN = "postgresql://pipeline:pipeline@127.0.0.1:55432/pipeline"
APP_ID, TOPIC = "bench-restore", "bench-restore-in"


def fill(dsn: str, schema: str, keys: int) -> float:
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        ensure_schema(conn, schema, TotalsSink.tables)
        statement = sql.SQL("COPY {} (app_id, topic, input_partition, key, value) FROM STDIN")
        with conn.cursor() as cur, cur.copy(statement.format(STATE.ident(schema))) as copy:
            for i in range(keys):
                copy.write_row((APP_ID, TOPIC, 0, f"account-{i}", b"[%d,%d]" % (i % 97 + 1, i * 7)))
        conn.execute(sql.SQL("ANALYZE {}").format(STATE.ident(schema)))
    return time.monotonic() - started


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def child(dsn: str, schema: str, mode: str, step_ms: int) -> dict:
    """One take-over of p0 in this process; what it cost."""
    settings = Settings(sink="postgres", postgres_dsn=dsn, postgres_schema=schema, restore_step_ms=step_ms)
    kwargs = {**connection_kwargs(settings, "bench-restore"), "autocommit": True}
    with psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=1, kwargs=kwargs) as pool:
        ctx = PostgresTaskContext(totals_pg, settings, APP_ID, TOPIC, pool, TotalsSink(), Metrics(), "bench")
        task = PostgresTask(ctx, 0)
        before = rss_mb()
        started = time.monotonic()
        task.fence()
        steps, longest = 0, 0.0
        if mode == "single":
            longest = single_statement(pool, schema, task.state)
            steps = 1
        else:
            while True:
                step_started = time.monotonic()
                done = task.restore_step(step_ms / 1000)
                steps, longest = steps + 1, max(longest, time.monotonic() - step_started)
                if done:
                    break
        seconds = time.monotonic() - started
        keys = len(task.state)
    after = rss_mb()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "keys": keys,
        "seconds": seconds,
        "rows_per_s": keys / seconds,
        "steps": steps,
        "longest_step_ms": longest * 1000,
        "rss_before_mb": before,
        "rss_after_mb": after,
        "peak_rss_mb": peak,
        "bytes_per_key": (after - before) * 1024 * 1024 / max(keys, 1),
        "loadavg": os.getloadavg()[0],
    }


def single_statement(pool: psycopg_pool.ConnectionPool, schema: str, state: PartitionState) -> float:
    """The restore before issue 11: every row in one statement, one snapshot; returns its duration."""
    started = time.monotonic()
    query = sql.SQL("SELECT key, value FROM {} WHERE app_id = %s AND topic = %s AND input_partition = %s")
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SET LOCAL statement_timeout = 0")  # one statement for every row: the default 30 s may not do
        with conn.cursor() as cur:
            cur.execute(query.format(STATE.ident(schema)), (APP_ID, TOPIC, 0))
            state.load((key, bytes(value)) for key, value in cur)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.pg_restore", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("POSTGRES_DSN", DEFAULT_DSN))
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="stepped,single")
    parser.add_argument("--restore-step-ms", type=int, default=200)
    parser.add_argument("--child", nargs=2, metavar=("SCHEMA", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.dsn, args.child[0], args.child[1], args.restore_step_ms)))
        return 0
    schema = f"bench_restore_{uuid.uuid4().hex[:8]}"
    print(
        f"filling {args.keys:,} state rows of p0 (COPY) into {schema}: {fill(args.dsn, schema, args.keys):.1f}s",
        flush=True,
    )
    results: dict[str, list[dict]] = {mode: [] for mode in args.modes.split(",")}
    try:
        for run in range(args.runs):
            for mode in results:  # interleaved: both modes see the same moments of a shared machine
                done = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tools.bench.pg_restore",
                        "--dsn",
                        args.dsn,
                        "--restore-step-ms",
                        str(args.restore_step_ms),
                        "--child",
                        schema,
                        mode,
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                result = json.loads(done.stdout)
                results[mode].append(result)
                print(
                    f"run {run + 1} {mode:<8} {result['seconds']:6.2f}s {result['rows_per_s']:>10,.0f} rows/s "
                    f"RSS +{result['rss_after_mb'] - result['rss_before_mb']:.0f} MB "
                    f"({result['bytes_per_key']:.0f} B/key, peak {result['peak_rss_mb']:.0f} MB) "
                    f"{result['steps']} steps, longest {result['longest_step_ms']:.0f} ms, "
                    f"load {result['loadavg']:.2f}",
                    flush=True,
                )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"\nmedians of {args.runs} runs, {args.keys:,} keys, RESTORE_STEP_MS={args.restore_step_ms}:")
    for mode, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "mode"}
        print(
            f"  {mode:<8} {med['seconds']:.2f}s  {med['rows_per_s']:,.0f} rows/s  RSS +"
            f"{med['rss_after_mb'] - med['rss_before_mb']:.0f} MB ({med['bytes_per_key']:.0f} B/key), peak "
            f"{med['peak_rss_mb']:.0f} MB; longest pause of the poll loop {med['longest_step_ms']:.0f} ms; "
            f"load average {med['loadavg']:.2f} (range {min(r['loadavg'] for r in rows):.2f}-"
            f"{max(r['loadavg'] for r in rows):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
