"""`pipeline run | verify | chaos | topics` — the command line (also `python -m pipeline ...`)."""

from __future__ import annotations

import argparse
import logging
import sys

from pipeline.loading import AppPathError, load_app
from pipeline.settings import ConfigError

LOG_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        print("benchmarks are not installed with the package: from a checkout, run `python -m tools.bench "
              f"{' '.join(argv[1:])}`".rstrip() + " (BENCHMARKS.md)", file=sys.stderr)
        return 2
    try:
        return _dispatch(argv)
    except AppPathError as e:  # a wrong MODULE:ATTR is a typo, not a crash: one line, no traceback
        command = next((word for word in argv if word in ("run", "verify", "chaos")), "")
        print(f"pipeline {command}: {e}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    # Commands with their own argument parsers. The compaction job (snapshots) is a separate package that depends on
    # this one, so it is named here, never imported at the top.
    delegated = {"verify": "pipeline.testing.checker", "chaos": "pipeline.testing.chaos", "snapshots": "snapshots.cli"}
    if argv[:1] and argv[0] in delegated:
        import importlib

        logging.basicConfig(level="WARNING", format=LOG_FORMAT)
        return importlib.import_module(delegated[argv[0]]).main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    try:
        return args.command(args)
    except ConfigError as e:
        print(f"configuration error: {e}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__)
    parser.add_argument("--log-level", default="info")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run a service: pipeline run MODULE:ATTR")
    run.add_argument("app", help="import path of the App, e.g. pipeline.examples.running_totals:app")
    run.add_argument("--config", help="TOML config file (PIPELINE_CONFIG_FILE)")
    run.add_argument("--bootstrap-servers")
    run.add_argument("--app-id")
    run.add_argument("--input-topic")
    run.add_argument("--output-topic")
    run.add_argument("--metrics-port", type=int)
    run.add_argument("--sink", choices=["kafka", "postgres"], help="where results go (PIPELINE_SINK; default kafka)")
    run.set_defaults(command=_run)

    commands.add_parser("verify", help="check a run for exactly-once: pipeline verify MODULE:ATTR --help")
    commands.add_parser("chaos", help="fault runs against your service: pipeline chaos MODULE:ATTR --help")

    topics = commands.add_parser("topics", help="create input/output topics: NAME:PARTITIONS ...")
    topics.add_argument("action", choices=["create"])
    topics.add_argument("topics", nargs="+", metavar="NAME:PARTITIONS")
    topics.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.set_defaults(command=_topics)
    return parser


def _run(args: argparse.Namespace) -> int:
    app = load_app(args.app)  # first: a wrong MODULE:ATTR is reported before anything else is imported or read

    from pipeline import settings as settings_module

    settings = settings_module.load(
        args.config,
        bootstrap_servers=args.bootstrap_servers,
        app_id=args.app_id,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        metrics_port=args.metrics_port,
        sink=args.sink,
    )
    if settings.sink == "postgres":  # PIPELINE_SINK=postgres or --sink postgres: pipeline/postgres
        from pipeline.postgres.runner import PgRunner

        runner = PgRunner(app, settings)
    else:
        from pipeline.runner import Runner

        runner = Runner(app, settings)
    runner.install_signal_handlers()
    runner.run()
    return 0


def _topics(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    wanted = []
    for spec in args.topics:
        name, _, count = spec.partition(":")
        wanted.append(NewTopic(name, int(count or 1), args.replication_factor))
    for name, future in admin.create_topics(wanted).items():
        try:
            future.result(30)
            print(f"created {name}")
        except Exception as e:  # report each topic, keep going
            print(f"{name}: {e}", file=sys.stderr)
    return 0
