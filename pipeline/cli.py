"""`pipeline run | verify | chaos | topics | acls | snapshots | query`: the command line (`python -m pipeline ...`).

Every command reads the same settings (defaults < --config < PIPELINE_* environment < options) and derives the same
names as `pipeline run`; options go before or after the command's name (pipeline/commands.py)."""

from __future__ import annotations

import argparse
import enum
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline import commands as commands_module
from pipeline.commands import CommandFailed, complete, kafka_text, names_of, run_command, settings_of
from pipeline.loading import load_app
from pipeline.service import configure_logging
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.kafka.acls import Acl


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    chosen = next((word for word in argv if word in COMMANDS), "")
    args = complete(_parser(chosen).parse_args(argv), "info" if chosen == "run" else "warning")
    configure_logging(args.log_level)
    return run_command(f"pipeline {args.command_name}", args.command, args)


# `pipeline bench NAME ...`: a benchmark of the checkout this runs in (tools/bench is not installed with the package).
BENCHES = {"partitions": "tools.bench.backlog"}  # issue 23: a backlog drained at 3, 48 and 384 partitions


def _bench(argv: list[str]) -> int:
    import importlib
    from pathlib import Path

    name = argv[0] if argv else ""
    if name not in BENCHES:
        print(f"pipeline bench: one of {', '.join(BENCHES)}; the others: `python -m tools.bench ...`", file=sys.stderr)
        return 2
    if not (Path.cwd() / "tools" / "bench").is_dir():
        print(
            f"pipeline bench {name}: run it from a checkout of the repository (its tools/bench is not installed with "
            f"the package): `python -m {BENCHES[name]}` there does the same (BENCHMARKS.md)",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(Path.cwd()))  # the instances it starts import the checkout too (PYTHONPATH)
    bench: Callable[[list[str]], int] = importlib.import_module(BENCHES[name]).main
    return bench(argv[1:])


def _parser(chosen: str = "") -> argparse.ArgumentParser:
    """`chosen`: the command named on the command line, whose module-defined options are needed."""
    common = commands_module.common_options()
    parser = argparse.ArgumentParser(prog="pipeline", description=__doc__, parents=[common])
    commands = parser.add_subparsers(required=True, metavar="COMMAND", dest="command_name")

    run = commands.add_parser("run", parents=[common], help="run a service: pipeline run MODULE:ATTR")
    run.add_argument("app", help="import path of the App, e.g. pipeline.examples.running_totals:app")
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
    _add_delegated(commands, common, chosen)
    topics = commands.add_parser("topics", parents=[common], help="create input/output topics: NAME:PARTITIONS ...")
    topics.add_argument("action", choices=["create"])
    topics.add_argument("topics", nargs="+", type=_topic_spec, metavar="NAME:PARTITIONS")
    topics.add_argument("--replication-factor", type=int, default=-1)
    topics.set_defaults(command=_topics)
    _add_acls_parser(commands, common)
    _add_query_parser(commands, common)
    return parser


COMMANDS = ("run", "verify", "chaos", "topics", "acls", "snapshots", "query")
DELEGATED = {
    "verify": ("pipeline.testing.checker", "check a run for exactly-once: pipeline verify MODULE:ATTR"),
    "chaos": ("pipeline.testing.chaos", "fault runs against your service: pipeline chaos MODULE:ATTR"),
    "snapshots": ("snapshots.cli", "full snapshots of the state: snapshots compact (the Spark job) | show"),
}


def _add_delegated(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser, chosen: str
) -> None:
    """verify, chaos and snapshots: their options come from their modules, imported only when that command was
    chosen (the checker loads psycopg, which a Kafka-sink service never does; the compaction job is a separate
    package that depends on this one)."""
    import importlib

    for name, (module_name, summary) in DELEGATED.items():
        command = commands.add_parser(
            name, parents=[common], help=summary, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        if name == chosen:
            module = importlib.import_module(module_name)
            command.description = module.__doc__
            module.add_arguments(command, common)


def _add_acls_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    acls = commands.add_parser(
        "acls",
        parents=[common],
        help="the least-privilege ACLs of a service: print the kafka-acls.sh lines, or grant them (--apply)",
        description=_acls.__doc__,
    )
    acls.add_argument("app", help="import path of the App, e.g. pipeline.examples.running_totals:app")
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
    acls.add_argument(
        "--command-config",
        metavar="FILE",
        help="the admin's client settings for --apply, as for kafka-acls.sh (default: PIPELINE_KAFKA_*)",
    )
    acls.set_defaults(command=_acls)


def _add_query_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    query = commands.add_parser(
        "query", parents=[common], help="a key's committed state from a running service: pipeline query MODULE:ATTR KEY"
    )
    query.add_argument("app", help="import path of the App, e.g. pipeline.examples.running_totals:app")
    query.add_argument("key", nargs="?", help="the state key (omit it with --prefix for a range)")
    query.add_argument(
        "--url", help="an instance, http://host:port (default: QUERY_ADDRESS, else 127.0.0.1:METRICS_PORT)"
    )
    query.add_argument("--prefix", help="a range: the committed keys starting with this, on one partition")
    query.add_argument("--limit", type=_positive, help="a range's most keys (default 100)")
    query.add_argument("--partition", type=int, help="the partition (default: the key's, by QUERY_PARTITIONER)")
    query.add_argument("--min-offset", type=int, help="answer once the partition committed past this input offset")
    query.add_argument(
        "--allow-standby", action="store_true", help="a warm standby copy may answer (the answer says how far behind)"
    )
    query.add_argument("--timeout", type=float, default=10.0, help="seconds, redirects and restores included")
    query.set_defaults(command=_query)


def _query(args: argparse.Namespace) -> int:
    """Prints the answer as JSON; exit 0 when found, 1 when the key is not in the committed state."""
    import json

    from pipeline.query_client import QueryError, query

    load_app(args.app)  # a wrong MODULE:ATTR is reported as for every command
    settings = settings_of(args)
    if not (args.key or args.prefix is not None):
        raise CommandFailed("pipeline query: a KEY, or --prefix for a range")
    url = args.url or f"http://{settings.query_address or f'127.0.0.1:{settings.metrics_port}'}"
    params = {"partition": args.partition, "min_offset": args.min_offset, "prefix": args.prefix, "limit": args.limit}
    params["allow_standby"] = args.allow_standby or None
    ranged = args.prefix is not None  # KEY then names the range's partition
    try:
        answer = query(
            url,
            None if ranged else args.key,
            token=settings.query_token,
            timeout_s=args.timeout,
            partition_key=args.key if ranged else None,
            **params,
        )
    except QueryError as e:
        raise CommandFailed(f"pipeline query {url}: {e}") from None
    print(json.dumps({**answer.body, "asked": answer.hops}, indent=2))
    return 0 if answer.status == 200 else 1


def _run(args: argparse.Namespace) -> int:
    # A SIGTERM while starting (imports, the connection check) is a clean stop too: nothing is owned yet, so there is
    # nothing to commit. Recorded from here on, acted on before the runner starts; the runner then installs its own.
    stop_requested = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop_requested.set())
    app = load_app(args.app)  # first: a wrong MODULE:ATTR is reported before anything else is imported or read

    from pipeline.service import check_app, check_connection, run_service

    settings = settings_of(
        args,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        metrics_port=args.metrics_port,
        sink=args.sink,
    )
    if args.workers > 1:  # each worker runs the service with these settings (pipeline/supervisor.py)
        from pipeline.supervisor import supervise

        check_app(app, settings)  # once here, before any worker starts: what the App cannot do with these settings
        check_connection(settings)  # then whether the cluster answers
        return supervise(
            args.app, settings, args.workers, args.log_level, stop_requested, group=settings.app_id or app.name
        )
    return run_service(app, settings, stop_requested)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return int(text)


def _topic_spec(text: str) -> tuple[str, int]:
    """NAME:PARTITIONS, or NAME for one partition."""
    name, colon, count = text.partition(":")
    if not name or (colon and not (count.isdigit() and int(count) > 0)):
        raise argparse.ArgumentTypeError(f"NAME:PARTITIONS with a positive partition count, not {text!r}")
    return name, int(count or 1)


def _topics(args: argparse.Namespace) -> int:
    """Creates each topic; one that exists already is fine. 1 if any could not be created, each named."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from pipeline.kafka.clients import client_config
    from pipeline.kafka.connect import connect_check

    settings = settings_of(args)
    connect_check(settings)  # an unreachable broker: one error within CONNECT_TIMEOUT_MS
    admin = AdminClient(client_config(settings))
    timeout_s = settings.request_timeout_ms / 1000
    wanted = [NewTopic(name, count, args.replication_factor) for name, count in args.topics]
    failed = []
    for name, future in admin.create_topics(wanted, request_timeout=timeout_s).items():
        try:
            future.result(timeout_s + 1)
            print(f"created {name}")
        except KafkaException as e:
            if e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                print(f"exists  {name}")
                continue
            failed.append(f"{name!r} ({kafka_text(e)})")
        except TimeoutError:
            failed.append(f"{name!r} (no answer within {timeout_s:.0f}s: REQUEST_TIMEOUT_MS)")
    if failed:
        raise CommandFailed(f"cannot create {', '.join(failed)}")
    return 0


def _acls(args: argparse.Namespace) -> int:
    """The ACLs `pipeline run MODULE:ATTR` needs with the same settings (environment, --config, the options here),
    and those of its compaction job (Kafka sink, stateful App), from pipeline/kafka/acls.py."""
    import os
    from pathlib import Path

    from pipeline.core.configure import configured
    from pipeline.kafka import acls as definition

    app = load_app(args.app)
    # The database is never contacted here: a placeholder lets SINK=postgres settings load without a DSN.
    env = {"PIPELINE_POSTGRES_DSN": "not-used-by-acls", **os.environ}
    settings = settings_of(args, env, input_topic=args.input_topic, output_topic=args.output_topic, sink=args.sink)
    app = configured(app, settings)
    names = names_of(app, settings)
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
