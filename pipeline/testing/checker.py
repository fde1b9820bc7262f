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
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from pipeline.app import App
from pipeline.kafka.offsets import EndOffsetsTimeout, ReadToEndTimeout
from pipeline.loading import load_app
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
) -> Verdict:
    """Drains what the run left in Kafka and checks it. `timeout_s` bounds each drain (they run in parallel) and
    each metadata or offsets request. `extra_config` (security etc.) goes to every client. Raises
    ReadToEndTimeout if a topic cannot be read to its end (an open transaction: verify after the run stopped)."""
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
    """`pipeline verify MODULE:ATTR --bootstrap-servers ...`: 0 if exactly-once holds, 1 if not, 2 if the run
    could not be checked (a topic not readable to its end, the broker not answering, a bad app path)."""
    args = _parser().parse_args(_without_command(argv if argv is not None else sys.argv[1:]))
    try:
        suffix = args.topic_suffix if args.topic_suffix is not None else os.environ.get("PIPELINE_TOPIC_SUFFIX", "")
        app = load_app(args.app).with_topic_suffix(suffix)
        tables = postgres_checker.chosen_tables(args.sink, args.dsn, args.schema, args.config)
        verdict = (
            postgres_checker.verify_tables(
                app,
                args.bootstrap_servers,
                tables.dsn,
                schema=tables.schema,
                input_topic=args.input_topic,
                app_id=args.group_id,
                timeout_s=args.timeout,
            )
            if tables
            else verify(
                app,
                args.bootstrap_servers,
                input_topic=args.input_topic,
                output_topic=args.output_topic,
                dead_letter_topic=args.dead_letter_topic,
                changelog_topic=args.changelog_topic,
                group_id=args.group_id,
                timeout_s=args.timeout,
            )
        )
    except (
        ReadToEndTimeout,
        EndOffsetsTimeout,
        KafkaException,
        LookupError,
        ValueError,
        TypeError,
        psycopg.Error,
    ) as e:
        print(f"pipeline verify: could not check: {e}", file=sys.stderr)
        return 2
    print(verdict.to_json() if args.json else verdict.summary())
    return 0 if verdict.ok else 1


def _without_command(argv: Sequence[str]) -> list[str]:
    return list(argv[1:]) if argv and argv[0] == "verify" else list(argv)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipeline verify", description="Check a finished run for exactly-once.")
    parser.add_argument("app", help="the App by import path, e.g. pipeline.examples.running_totals:app")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    parser.add_argument("--input-topic", help="the input of a one-input App, if the run renamed it")
    parser.add_argument(
        "--topic-suffix",
        help="after every topic the App names, as the run's TOPIC_SUFFIX (default PIPELINE_TOPIC_SUFFIX)",
    )
    parser.add_argument("--output-topic")
    parser.add_argument("--dead-letter-topic")
    parser.add_argument("--changelog-topic")
    parser.add_argument(
        "--group-id", help="the app id (consumer group; the PostgreSQL rows' app_id); default: the app's name"
    )
    parser.add_argument(
        "--sink",
        choices=["kafka", "postgres"],
        help="where the run wrote: default PIPELINE_SINK, as for `pipeline run` (else kafka)",
    )
    parser.add_argument(
        "--config",
        help="TOML config file (PIPELINE_CONFIG_FILE), as for `pipeline run`: the sink, POSTGRES_DSN, POSTGRES_SCHEMA",
    )
    parser.add_argument("--dsn", help="PostgreSQL sink: the database (default PIPELINE_POSTGRES_DSN)")
    parser.add_argument("--schema", help="PostgreSQL sink: the schema (default PIPELINE_POSTGRES_SCHEMA, else public)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per drain (default 60)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    return parser


if __name__ == "__main__":
    sys.exit(main())
