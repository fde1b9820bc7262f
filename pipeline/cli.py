"""`pipeline run | verify | chaos | topics | acls` — the command line (also `python -m pipeline ...`)."""

from __future__ import annotations

import argparse
import enum
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.loading import AppPathError, load_app
from pipeline.service import configure_logging
from pipeline.settings import ConfigError, Settings

if TYPE_CHECKING:
    from pipeline.kafka.acls import Acl


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        print(
            "benchmarks are not installed with the package: from a checkout, run `python -m tools.bench "
            f"{' '.join(argv[1:])}`".rstrip()
            + " (BENCHMARKS.md)",
            file=sys.stderr,
        )
        return 2
    try:
        return _dispatch(argv)
    except AppPathError as e:  # a wrong MODULE:ATTR is a typo, not a crash: one line, no traceback
        command = next((word for word in argv if word in ("run", "verify", "chaos", "acls")), "")
        print(f"pipeline {command}: {e}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    # Commands with their own argument parsers. The compaction job (snapshots) is a separate package that depends on
    # this one, so it is named here, never imported at the top.
    delegated = {"verify": "pipeline.testing.checker", "chaos": "pipeline.testing.chaos", "snapshots": "snapshots.cli"}
    if argv[:1] and argv[0] in delegated:
        import importlib

        configure_logging("WARNING")
        command: Callable[[list[str]], int] = importlib.import_module(delegated[argv[0]]).main
        return command(argv[1:])
    args = _parser().parse_args(argv)
    configure_logging(args.log_level)
    run: Callable[[argparse.Namespace], int] = args.command
    try:
        return run(args)
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
    run.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="N supervised processes of the group on this host, one metrics endpoint (default 1: this "
        "process runs the service itself)",
    )
    run.set_defaults(command=_run)

    commands.add_parser("verify", help="check a run for exactly-once: pipeline verify MODULE:ATTR --help")
    commands.add_parser("chaos", help="fault runs against your service: pipeline chaos MODULE:ATTR --help")

    topics = commands.add_parser("topics", help="create input/output topics: NAME:PARTITIONS ...")
    topics.add_argument("action", choices=["create"])
    topics.add_argument("topics", nargs="+", metavar="NAME:PARTITIONS")
    topics.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.set_defaults(command=_topics)

    _add_acls_parser(commands)
    return parser


def _add_acls_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acls = commands.add_parser(
        "acls",
        help="the least-privilege ACLs of a service: print the kafka-acls.sh lines, or grant them (--apply)",
        description=_acls.__doc__,
    )
    acls.add_argument("app", help="import path of the App, e.g. pipeline.examples.running_totals:app")
    acls.add_argument("--config", help="TOML config file (PIPELINE_CONFIG_FILE), as for `pipeline run`")
    acls.add_argument("--app-id")
    acls.add_argument("--input-topic")
    acls.add_argument("--output-topic")
    acls.add_argument("--sink", choices=["kafka", "postgres"])
    acls.add_argument("--principal", help="the service's principal (default User:<app id>)")
    acls.add_argument("--compaction-principal", help="the compaction job's (default User:<app id>-compaction)")
    acls.add_argument(
        "--no-create-topics",
        action="store_true",
        help="the internal topics are created beforehand: no CREATE for the service",
    )
    acls.add_argument(
        "--keep-history", action="store_true", help="the compaction job runs with --keep-history: no DELETE for it"
    )
    acls.add_argument("--apply", action="store_true", help="grant them with the admin client instead of printing")
    acls.add_argument("--bootstrap-servers")
    acls.add_argument(
        "--command-config",
        metavar="FILE",
        help="the admin's client settings for --apply, as for kafka-acls.sh (default: PIPELINE_KAFKA_*)",
    )
    acls.set_defaults(command=_acls)


def _run(args: argparse.Namespace) -> int:
    # A SIGTERM while starting (imports, the connection check) is a clean stop too: nothing is owned yet, so there is
    # nothing to commit. Recorded from here on, acted on before the runner starts; the runner then installs its own.
    stop_requested = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_requested.set())
    app = load_app(args.app)  # first: a wrong MODULE:ATTR is reported before anything else is imported or read

    from pipeline import settings as settings_module
    from pipeline.service import check_connection, run_service

    settings = settings_module.load(
        args.config,
        bootstrap_servers=args.bootstrap_servers,
        app_id=args.app_id,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        metrics_port=args.metrics_port,
        sink=args.sink,
    )
    if args.workers > 1:  # each worker runs the service with these settings (pipeline/supervisor.py)
        from pipeline.supervisor import supervise

        check_connection(settings)  # once here, before any worker starts
        return supervise(
            args.app, settings, args.workers, args.log_level, stop_requested, group=settings.app_id or app.name
        )
    return run_service(app, settings, stop_requested)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return int(text)


def _topics(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

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


def _acls(args: argparse.Namespace) -> int:
    """The ACLs `pipeline run MODULE:ATTR` needs with the same settings (environment, --config, the options here),
    and those of its compaction job (Kafka sink, stateful App), from pipeline/kafka/acls.py."""
    import os
    from pathlib import Path

    from pipeline import settings as settings_module
    from pipeline.kafka import acls as definition

    app = load_app(args.app)
    # The database is never contacted here: a placeholder lets SINK=postgres settings load without a DSN.
    env = {"PIPELINE_POSTGRES_DSN": "not-used-by-acls", **os.environ}
    settings = settings_module.load(
        args.config,
        env,
        bootstrap_servers=args.bootstrap_servers,
        app_id=args.app_id,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        sink=args.sink,
    )
    names = definition.Names(
        settings.app_id or app.name,
        settings.input_topic or app.input_topic,
        settings.output_topic or app.output_topic,
        settings.changelog_topic,
        settings.snapshot_topic,
        settings.dead_letter_topic,
    )
    grants = [
        (
            args.principal or f"User:{names.app_id}",
            f"pipeline run {args.app} ({settings.sink} sink)",
            definition.service_acls(
                names, settings, stateful=app.stateful, create_internal_topics=not args.no_create_topics
            ),
        )
    ]
    if settings.sink == "kafka" and app.stateful:
        grants.append(
            (
                args.compaction_principal or f"User:{names.app_id}-compaction",
                f"snapshots compact --app-id {names.app_id}",
                definition.compaction_acls(names, keep_history=args.keep_history),
            )
        )
    if not args.apply:
        print(f'ACLS="kafka-acls.sh --bootstrap-server {settings.bootstrap_servers} --command-config admin.properties"')
        for principal, what, acls in grants:
            print(f"# {principal}: {what}")
            print("\n".join(definition.kafka_acls_lines(principal, acls)))
        return 0
    if args.command_config:
        settings = settings.with_overrides(kafka=definition.admin_properties(Path(args.command_config)))
    return _grant(settings, grants)


def _grant(admin_settings: Settings, grants: list[tuple[str, str, list[Acl]]]) -> int:
    """create_acls with the admin's settings; one line per binding granted or refused."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ResourcePatternType

    from pipeline.kafka.acls import bindings
    from pipeline.kafka.clients import client_config
    from pipeline.kafka.connect import connect_check

    connect_check(admin_settings)
    admin = AdminClient(client_config(admin_settings))
    timeout_s = admin_settings.request_timeout_ms / 1000
    failed = 0
    for principal, _, acls in grants:
        for binding, future in admin.create_acls(bindings(principal, acls)).items():
            prefixed = " (prefixed)" if binding.resource_pattern_type == ResourcePatternType.PREFIXED else ""
            resource = f"{_name(binding.restype).lower()} {binding.name!r}{prefixed}"
            what = f"{_name(binding.operation)} on {resource} to {principal}"
            try:
                future.result(timeout_s)
                print(f"granted {what}")
            except KafkaException as e:
                failed += 1
                print(f"pipeline acls: cannot grant {what}: {e.args[0]}", file=sys.stderr)
    return 1 if failed else 0


def _name(value: enum.Enum | str | int) -> str:
    """An admin binding's resource type or operation (enums in practice; its stubs allow str and int too)."""
    return value.name if isinstance(value, enum.Enum) else str(value)
