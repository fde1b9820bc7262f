"""The compaction job: folds the latest full snapshot of each partition and the changelog since into the next one.

    snapshots compact --bootstrap-servers HOST:9092 --app-id APP [--master local[2]] [--keep-history]
    spark-submit --jars <kafka connector jars> snapshots/submit.py --bootstrap-servers ... --app-id APP

Credentials come from the environment (PIPELINE_KAFKA_* for the job's own clients, PIPELINE_SPARK_KAFKA_* for Spark's
Kafka source) or from files, never from the command line, which every local user sees in `ps`.

`compact(spark, Options)` is one run, in the steps of the modules next to this one (the package's docstring tells the
whole story). The live pipeline needs no restart: its next restore of p uses the newest snapshot. The job prints what
it read, wrote and skipped per partition and exits 0 when nothing failed (skips included), 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.commands import common_options, complete, run_command, settings_of
from pipeline.kafka.acls import Names, compaction_acls
from pipeline.kafka.connect import connect_check
from pipeline.kafka.offsets import CheckedConsumer
from pipeline.kafka.permissions import MissingPermission, check
from pipeline.settings import ConfigError, Settings
from pipeline.state.snapshot_format import DEFAULT_CHUNK_BYTES, Manifest
from snapshots import publish  # the module: a test runs another compaction in place of publish_manifests
from snapshots.fold import fold_and_write
from snapshots.options import (
    SPARK_KAFKA_ENV_PREFIX,
    CompactionError,
    Options,
    command_line_properties,
    spark_kafka_properties,
)
from snapshots.plan import ensure_snapshot_topic, plan_partitions
from snapshots.report import PartitionReport, Report
from snapshots.retention import delete_below_base

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["CompactionError", "Options", "PartitionReport", "Report", "add_arguments", "compact", "main", "run"]


def compact(spark: SparkSession, opts: Options, before_commit: Callable[[], None] | None = None) -> Report:
    """One compaction run over every partition of the app's changelog:

    1. plan (driver, snapshots/plan.py): the snapshot topic exists with the changelog's partition count; per
       partition, the newest usable manifest is the base B and [B's covered offset, the changelog's last stable
       offset) the range to fold; a partition with nothing new is skipped, one whose changelog lost records no
       snapshot covers fails.
    2. fold (Spark, snapshots/fold.py): Spark's Kafka source reads B's chunks and the range (read_committed, explicit
       offsets); executors fold the changelog, verify B (`ChunkSet`, as a restore does: a damaged B is replaced by
       the one before it and the partition folded again), and write the new chunks (`emit_chunks`).
    3. publish (driver, snapshots/publish.py): init_transactions on `<app>.snapshot-publisher` fences any other run;
       a partition whose newest manifest changed since step 1 is skipped; the others' manifests are published last,
       in one transaction. `before_commit` (tests) runs inside it, just before its commit.
    4. retention (driver, snapshots/retention.py, unless opts.truncate is off): records below each published
       partition's base B are deleted from both topics, so B, the new generation and the changelog since B remain.
    """
    started = time.monotonic()
    admin = AdminClient(opts.client())
    partitions = ensure_snapshot_topic(admin, opts)
    consumer = CheckedConsumer(Consumer(opts.consumer_config()))
    try:
        plans, reports = plan_partitions(opts, admin, consumer, partitions)  # 1
        written = fold_and_write(spark, opts, plans, reports)  # 2
        published: dict[int, Manifest] = {}
        if written:  # 3
            published = publish.publish_manifests(opts, consumer, admin, plans, written, reports, before_commit)
        if opts.truncate:
            delete_below_base(opts, admin, plans, published, reports)  # 4
    finally:
        consumer.close()
    return Report(dict(sorted(reports.items())), time.monotonic() - started)


# -- command line ----------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's own options; the app id, brokers and Kafka properties are the settings (pipeline/commands.py)."""
    parser.add_argument("--changelog-topic", default="", help="default: CHANGELOG_TOPIC, else <app-id>-changelog")
    parser.add_argument("--snapshot-topic", default="", help="default: SNAPSHOT_TOPIC, else <app-id>-snapshots")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master for a session built here (default local[*]; ignored under spark-submit)",
    )
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES)
    parser.add_argument(
        "--keep-history", action="store_true", help="do not delete below the previous generation after publishing"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for each Kafka request")
    parser.add_argument(
        "--kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka property for the job's own clients, no secret (those: PIPELINE_KAFKA_*, as for "
        "`pipeline run`, or the --config file's [kafka] table)",
    )
    parser.add_argument(
        "--spark-kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Java client property for Spark's Kafka source, no secret (those, e.g. sasl.jaas.config: "
        f"{SPARK_KAFKA_ENV_PREFIX}SASL_JAAS_CONFIG, or --spark-kafka-config)",
    )
    parser.add_argument(
        "--spark-kafka-config",
        metavar="FILE",
        help="Java client properties for Spark's Kafka source (key=value lines, as kafka-acls.sh --command-config); "
        "readable by its owner only (mode 0600)",
    )


def job_settings(args: argparse.Namespace) -> Settings:
    """The settings `pipeline run` reads (environment, --config, options); the app id is required here."""
    changelog, snapshots = getattr(args, "changelog_topic", ""), getattr(args, "snapshot_topic", "")
    settings = settings_of(args, changelog_topic=changelog or None, snapshot_topic=snapshots or None)
    if not settings.app_id:
        raise ConfigError("APP_ID is empty: name the app whose snapshots these are (--app-id or PIPELINE_APP_ID)")
    return settings


def options_from(args: argparse.Namespace, settings: Settings) -> Options:
    kafka = {**settings.kafka, **command_line_properties("--kafka", args.kafka)}
    spark_kafka = spark_kafka_properties(os.environ, args.spark_kafka_config)
    spark_kafka |= command_line_properties("--spark-kafka", args.spark_kafka)
    return Options(
        settings.bootstrap_servers,
        settings.app_id,
        settings.changelog_topic,
        settings.snapshot_topic,
        args.chunk_bytes,
        not args.keep_history,
        args.timeout,
        kafka,
        spark_kafka,
    )


SPARK_STARTING = "compaction: permissions checked, starting Spark"


def run(args: argparse.Namespace) -> int:
    settings = job_settings(args)
    opts = options_from(args, settings)
    connect_check(settings.with_overrides(kafka=opts.kafka))  # an unreachable broker: one error, at once
    try:  # before Spark starts: a missing ACL fails in a second, naming it, with nothing read or written
        check(
            AdminClient(opts.client()),
            compaction_acls(Names(opts.app_id, "", "", opts.changelog, opts.snapshots), keep_history=not opts.truncate),
            opts.timeout_s,
        )
    except MissingPermission as e:
        print(f"compaction failed: {e}", file=sys.stderr)
        return 1
    print(SPARK_STARTING, flush=True)  # Spark's start takes seconds to a minute: say where the job is
    spark = _session(args.master, opts.app_id)
    try:
        report = compact(spark, opts)
    except (CompactionError, KafkaException, TimeoutError) as e:  # EndOffsetsTimeout is a TimeoutError
        print(f"compaction failed: {e}", file=sys.stderr)
        return 1
    print(report.summary(), flush=True)
    return 1 if report.failed else 0


def _session(master: str | None, app_id: str) -> SparkSession:
    from pyspark.sql import SparkSession

    if os.environ.get("PYSPARK_GATEWAY_PORT") and master is None:  # launched by spark-submit: its session
        return SparkSession.builder.appName(f"{app_id}-compaction").getOrCreate()
    from snapshots.spark_session import local_spark_session

    return local_spark_session(f"{app_id}-compaction", master or "local[*]")


def main(argv: list[str] | None = None) -> int:
    """`snapshots compact ...` as snapshots/submit.py runs it under spark-submit."""
    common = common_options()
    parser = argparse.ArgumentParser(prog="compact", description=__doc__, parents=[common])
    add_arguments(parser)
    args = complete(parser.parse_args(argv), "info")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_command("compaction", run, args)


if __name__ == "__main__":  # executors could not unpickle this module's functions from __main__
    sys.exit("spark-submit snapshots/submit.py, not snapshots/compact.py (see snapshots/submit.py)")
