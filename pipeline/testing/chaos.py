"""`pipeline chaos MODULE:ATTR`: the fencing and crash tests, run against your own service.

For each fault kind, one run on fresh topics: seed input (your App's `generate`, or records replayed from a
topic), start N instances, feed the input over time while the fault is injected on a seeded schedule, wait until
the group has caught up, stop everything, and ask the checker. One row per fault kind, with the checker's counts.
A run that does not converge in time says so, with the partitions that stayed behind.

Process faults need only a broker. Broker faults (`broker-kill`, `broker-pause`) need the local 3-node cluster
(`deploy/local/kafka.sh --cluster start`), because something must be able to kill and pause a broker.

With the PostgreSQL sink (`--sink postgres --dsn ...`, or PIPELINE_SINK=postgres as for `pipeline run`) each run
writes to a fresh schema `chaos_<id>` of that database (dropped after a clean verdict, kept to look at otherwise),
waits for the offsets table to reach the input's end and asks the table checker; `aborts` (Kafka transactions) does
not apply.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.loading import load_app
from pipeline.settings import Settings
from pipeline.testing import postgres_checker, soak
from pipeline.testing.faults import (
    FAULTS,
    KAFKA_ONLY_FAULTS,
    KAFKA_SH,
    PROCESS_FAULTS,
    Fault,
    Outcome,
    Profile,
    run_fault,
    seed_records,
)


def report(rows: list[tuple[Fault, Outcome, float]]) -> str:
    header = (
        f"{'fault':<13} {'verdict':<8} {'in':>7} {'out':>7} {'dup':>4} {'lost':>4} {'order':>5} "
        f"{'state':>5} {'dlq':>5} {'secs':>5}  what"
    )
    lines = [header, "-" * len(header)]
    for fault, outcome, seconds in rows:
        v = outcome.verdict
        if v is None:
            lines.append(f"{fault.name:<13} {'STUCK':<8} lag per partition {outcome.stuck}")
        else:
            verdict = "OK" if outcome.ok else "FAIL"
            lines.append(
                f"{fault.name:<13} {verdict:<8} {v.inputs:>7} {v.outputs:>7} {v.duplicates.count:>4} "
                f"{v.losses.count:>4} {v.order.count:>5} {v.state.count:>5} {v.dead_letters:>5} {seconds:>5.0f}  "
                f"{fault.description}" + (f"; {len(outcome.phantoms)} phantom reads" if outcome.phantoms else "")
            )
        lines += [f"{'':<13} {'':<8} {line}" for line in outcome.exited]  # a crash the others covered for
    return "\n".join(lines)


def _as_json(fault: Fault, outcome: Outcome) -> dict[str, object]:
    verdict = outcome.verdict.as_dict() if outcome.verdict else None
    return {"fault": fault.name, "ok": outcome.ok, "stuck": outcome.stuck, "exited": outcome.exited, "verdict": verdict}


def _sink_and_faults(
    parser: argparse.ArgumentParser, args: argparse.Namespace, settings: Settings
) -> tuple[postgres_checker.Tables | None, list[str]]:
    """The sink (None: Kafka), chosen as `pipeline run` chooses it, and the faults that apply to it."""
    tables = (
        postgres_checker.Tables(settings.postgres_dsn, settings.postgres_schema)
        if settings.sink == "postgres"
        else None
    )
    applicable = [n for n in PROCESS_FAULTS if not (tables and n in KAFKA_ONLY_FAULTS)]
    names = (args.faults.split(",") if args.faults else applicable) + (
        ["broker-kill", "broker-pause"] if args.cluster else []
    )
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        parser.error(f"unknown faults {unknown}")
    if tables and (args.profile == "soak" or any(n in KAFKA_ONLY_FAULTS for n in names)):
        parser.error(f"with the PostgreSQL sink: no {', '.join(KAFKA_ONLY_FAULTS)}, no --profile soak")
    return tables, names


def add_arguments(parser: argparse.ArgumentParser, common: argparse.ArgumentParser | None = None) -> None:
    """`pipeline chaos`'s own options (the settings' ones come from pipeline/commands.py)."""
    parser.set_defaults(command=run, parser=parser)
    parser.add_argument("app", help="MODULE:ATTR of your App")
    parser.add_argument(
        "--faults",
        help=f"comma-separated, from: {', '.join(FAULTS)} (default: every process fault that applies to the sink)",
    )
    parser.add_argument(
        "--sink",
        choices=["kafka", "postgres"],
        help="the service's sink: default PIPELINE_SINK, as for `pipeline run` (else kafka)",
    )
    parser.add_argument("--dsn", help="PostgreSQL sink: the database (default PIPELINE_POSTGRES_DSN)")
    parser.add_argument(
        "--cluster", action="store_true", help="run against the local 3-node cluster and add the broker faults"
    )
    parser.add_argument(
        "--profile",
        choices=["ci", "long", "soak"],
        default="ci",
        help="soak: one long run, a fault every minute, fails on RSS or fd growth (testing/soak.py)",
    )
    parser.add_argument("--minutes", type=float, default=30, help="soak: how long the input is fed")
    parser.add_argument("--records", type=int, default=1_000_000, help="soak: how many input records")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-dir", default=".run/chaos")
    parser.add_argument("--json", action="store_true", help="also print the verdicts as JSON")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.testing.chaos MODULE:ATTR ...`, as `pipeline chaos`."""
    from pipeline.commands import common_options, complete, run_command

    common = common_options()
    parser = argparse.ArgumentParser(
        prog="pipeline chaos",
        description=__doc__,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, common)
    return run_command("pipeline chaos", run, complete(parser.parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    """The fault runs on fresh topics of their own (each with its own app id); the broker, the sink and the
    client properties are the settings `pipeline run` reads."""
    from pipeline.commands import settings_of
    from pipeline.kafka.connect import connect_check

    parser: argparse.ArgumentParser = args.parser
    app = load_app(args.app)  # a wrong MODULE:ATTR fails here, before any cluster is started
    # STATE_STORE=disk: each instance gets a state directory of its own under the log directory (the harness's Fleet,
    # whatever STATE_DIR says); the command's own settings are given one only so that they validate.
    state_dir = str(Path(args.log_dir) / "state")
    settings = settings_of(args, sink=args.sink, postgres_dsn=args.dsn, state_dir=state_dir)
    profile = Profile() if args.profile == "ci" else Profile(records=100_000, rounds=5, seconds=40)
    tables, names = _sink_and_faults(parser, args, settings)
    if args.profile == "soak":
        rotation = tuple(n for n in names if n in soak.ROTATION)
        if args.cluster or not rotation:
            parser.error(f"--profile soak rotates process faults ({', '.join(soak.ROTATION)}) on one broker")
        soak_profile = soak.SoakProfile(args.records, args.minutes, rotation=rotation)
        connect_check(settings)
        return soak.main(app, args.app, settings.bootstrap_servers, args.seed, Path(args.log_dir), soak_profile)
    records = seed_records(app, profile, args.seed, None)  # before any broker: an App without `generate` fails now
    bootstrap, replication = settings.bootstrap_servers, 1
    if args.cluster:
        subprocess.run([str(KAFKA_SH), "--cluster", "start"], check=True)
        bootstrap = subprocess.run(
            [str(KAFKA_SH), "--cluster", "bootstrap"], check=True, capture_output=True, text=True
        ).stdout.strip()
        replication = 3
    elif any(FAULTS[n].needs_cluster for n in names):
        parser.error("broker faults need --cluster")
    else:
        connect_check(settings)  # an unreachable broker: one error within CONNECT_TIMEOUT_MS
    rows = []
    for name in dict.fromkeys(names):
        started = time.monotonic()
        print(f"[chaos] {name}: {FAULTS[name].description} ...", flush=True)
        outcome = run_fault(
            FAULTS[name],
            app,
            args.app,
            bootstrap,
            profile,
            args.seed,
            records,
            Path(args.log_dir),
            replication,
            tables.dsn if tables else None,
        )
        rows.append((FAULTS[name], outcome, time.monotonic() - started))
        if not outcome.ok:
            print(outcome.logs[-4000:], file=sys.stderr)
    print(report(rows))
    if args.json:
        print(json.dumps([_as_json(f, o) for f, o, _ in rows]))
    return 0 if all(o.ok for _, o, _ in rows) else 1
