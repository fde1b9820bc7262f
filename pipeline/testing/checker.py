"""`pipeline verify MODULE:ATTR`: drain what a finished run left in Kafka, and let the oracle judge it. A run of the
PostgreSQL sink (`--sink postgres`, or PIPELINE_SINK=postgres as for `pipeline run`) is judged from its tables by the
same oracle (pipeline/testing/postgres_checker.py).

The two halves live apart on purpose: pipeline.testing.drain reads Kafka (read_committed, group offsets, changelog
checkpoints) into plain data; pipeline.testing.oracle folds the input offline and checks that plain data, without
any Kafka client or runtime code. This module ties them together: `verify(app, bootstrap)` for tests and tools,
`main` for the command line. Exit codes: 0 exactly-once holds, 1 it does not, 2 the run could not be checked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from pipeline.app import App
from pipeline.kafka.acls import Names
from pipeline.kafka.offsets import EndOffsetsTimeout, ReadToEndTimeout
from pipeline.loading import load_app
from pipeline.registry import bind, probe
from pipeline.serde import RegistryUnavailable
from pipeline.settings import Settings
from pipeline.testing import postgres_checker
from pipeline.testing.drain import Topics, drain_run
from pipeline.testing.oracle import Verdict, check

__all__ = ["Verdict", "main", "verify"]


def verify(
    app: App,
    bootstrap: str,
    *,
    input_topic: str | None = None,
    output_topic: str | None = None,
    dead_letter_topic: str | None = None,
    changelog_topic: str | None = None,
    group_id: str | None = None,
    timeout_s: float = 60.0,
    extra_config: Mapping[str, Any] | None = None,
    schema_registry: Any = None,
) -> Verdict:
    """Drains what the run left in Kafka and checks it. `timeout_s` bounds each drain (they run in parallel) and
    each metadata or offsets request. `extra_config` (security etc.) goes to every client. `schema_registry`: the
    registry client that an App's registry serdes not bound yet decode with (pipeline/registry). Raises
    ReadToEndTimeout if a topic cannot be read to its end (an open transaction: verify after the run stopped)."""
    if schema_registry is not None:
        app = bind(app, schema_registry)
    topics = Topics.for_app(
        app,
        input_topic=input_topic,
        output_topic=output_topic,
        dead_letter_topic_name=dead_letter_topic,
        changelog_topic_name=changelog_topic,
    )
    config = {"bootstrap.servers": bootstrap, **(extra_config or {})}
    run = drain_run(config, topics, group_id or app.name, timeout_s)
    return check(app, run)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pipeline.testing.checker MODULE:ATTR ...`, as `pipeline verify`."""
    from pipeline.commands import common_options, complete, run_command

    common = common_options()
    parser = argparse.ArgumentParser(
        prog="pipeline verify",
        description=__doc__,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser, common)
    args = complete(parser.parse_args(_without_command(argv if argv is not None else sys.argv[1:])))
    return run_command("pipeline verify", run, args)


def run(args: argparse.Namespace) -> int:
    """0 if exactly-once holds, 1 if not, 2 if the run could not be checked (a topic not readable to its end, the
    broker not answering, a bad app path or setting). The run's names come from the settings `pipeline run` reads
    (PIPELINE_APP_ID, --config, ...): the same app id, group, changelog and dead-letter topic."""
    from pipeline.commands import kafka_text, names_of, settings_of
    from pipeline.core.configure import configured
    from pipeline.kafka.clients import client_config
    from pipeline.kafka.connect import connect_check

    app = load_app(args.app)
    settings = settings_of(
        args,
        input_topic=args.input_topic,
        output_topic=args.output_topic,
        topic_suffix=args.topic_suffix,
        dead_letter_topic=args.dead_letter_topic,
        changelog_topic=args.changelog_topic,
        sink=args.sink,
        postgres_dsn=args.dsn,
        postgres_schema=args.schema,
    )
    app = configured(app, settings)
    names = names_of(app, settings)
    connect_check(settings)  # an unreachable broker: one error within CONNECT_TIMEOUT_MS
    probe(app, settings)  # an App with registry serdes: its registry answers (ConfigError naming the setting)
    extra = {k: v for k, v in client_config(settings).items() if k != "bootstrap.servers"}
    try:
        verdict = _verdict(app, settings, names, extra, args.timeout)
    except (ReadToEndTimeout, EndOffsetsTimeout, KafkaException, LookupError, psycopg.Error, RegistryUnavailable) as e:
        print(f"pipeline verify: could not check: {kafka_text(e)}", file=sys.stderr)
        return 2
    print(verdict.to_json() if args.json else verdict.summary())
    return 0 if verdict.ok else 1


def _verdict(app: App, settings: Settings, names: Names, extra: dict[str, Any], timeout_s: float) -> Verdict:
    if settings.sink == "postgres":
        return postgres_checker.verify_tables(
            app,
            settings.bootstrap_servers,
            settings.postgres_dsn,
            schema=settings.postgres_schema,
            input_topic=app.input_topic,
            app_id=names.app_id,
            timeout_s=timeout_s,
            extra_config=extra,
        )
    return verify(
        app,
        settings.bootstrap_servers,
        dead_letter_topic=names.dead_letters,
        changelog_topic=names.changelog,
        group_id=names.app_id,
        timeout_s=timeout_s,
        extra_config=extra,
    )


def _without_command(argv: Sequence[str]) -> list[str]:
    return list(argv[1:]) if argv and argv[0] == "verify" else list(argv)


def add_arguments(parser: argparse.ArgumentParser, common: argparse.ArgumentParser | None = None) -> None:
    """`pipeline verify`'s own options (the settings' ones come from pipeline/commands.py)."""
    parser.add_argument("app", help="the App by import path, e.g. pipeline.examples.running_totals:app")
    parser.add_argument("--input-topic", help="the input of a one-input App, if the run renamed it")
    parser.add_argument(
        "--topic-suffix",
        help="after every topic the App names, as the run's TOPIC_SUFFIX (default PIPELINE_TOPIC_SUFFIX)",
    )
    parser.add_argument("--output-topic")
    parser.add_argument("--dead-letter-topic")
    parser.add_argument("--changelog-topic")
    parser.add_argument("--group-id", dest="app_id", default=argparse.SUPPRESS, help="the same as --app-id")
    parser.add_argument(
        "--sink",
        choices=["kafka", "postgres"],
        help="where the run wrote: default PIPELINE_SINK, as for `pipeline run` (else kafka)",
    )
    parser.add_argument("--dsn", help="PostgreSQL sink: the database (default PIPELINE_POSTGRES_DSN)")
    parser.add_argument("--schema", help="PostgreSQL sink: the schema (default PIPELINE_POSTGRES_SCHEMA, else public)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per drain (default 60)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(command=run)


if __name__ == "__main__":
    sys.exit(main())
