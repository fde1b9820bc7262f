"""`snapshots compact | show` (also `pipeline snapshots ...`).

snapshots compact [--app-id APP] [--bootstrap-servers HOST:9092] [--master local[2]] [--keep-history]
snapshots show    [--app-id APP] [--bootstrap-servers HOST:9092]

The app id, brokers, internal topics' names and Kafka client properties (credentials included) are the settings
`pipeline run` reads: PIPELINE_APP_ID, PIPELINE_BOOTSTRAP_SERVERS, PIPELINE_CHANGELOG_TOPIC, PIPELINE_KAFKA_*, a
--config file, the options. Secrets never go on a command line (`ps` shows it to every local user).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline.commands import common_options, complete, run_command
from snapshots.options import Options


def add_arguments(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """The `compact` and `show` subcommands, each with the settings' options of every command."""
    from snapshots import compact

    commands = parser.add_subparsers(required=True, metavar="COMMAND", dest="snapshots_command")
    job = commands.add_parser(
        "compact", parents=[common], help="fold the latest snapshots and the changelog into new snapshots"
    )
    compact.add_arguments(job)
    job.set_defaults(command=_logged(compact.run))
    show = commands.add_parser("show", parents=[common], help="list the manifests of each partition, newest first")
    show.add_argument("--snapshot-topic", default="")
    show.add_argument("--timeout", type=float, default=30.0)
    show.set_defaults(command=_logged(_show))


def _logged(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, with the job's progress lines shown."""

    def run(args: argparse.Namespace) -> int:
        logging.getLogger("snapshots").setLevel(logging.INFO)  # also under `pipeline snapshots` (root at WARNING)
        return command(args)

    return run


def main(argv: list[str] | None = None) -> int:
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="snapshots", description=__doc__, parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, common)
    args = complete(parser.parse_args(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_command(f"snapshots {args.snapshots_command}", args.command, args)


def _show(args: argparse.Namespace) -> int:
    from pipeline.kafka.connect import connect_check
    from pipeline.kafka.offsets import CheckedConsumer, low_watermarks, stable_end_offsets
    from pipeline.state.snapshot_finder import scan_all
    from snapshots.compact import job_settings

    settings = job_settings(args)
    connect_check(settings)
    opts = Options(
        settings.bootstrap_servers, settings.app_id, snapshot_topic=settings.snapshot_topic, kafka=dict(settings.kafka)
    )
    topic = opts.snapshots
    admin = AdminClient(opts.client())
    metadata = admin.list_topics(timeout=args.timeout).topics
    if topic not in metadata:
        print(f"{topic}: no such topic", file=sys.stderr)
        return 1
    partitions = sorted(metadata[topic].partitions)
    lows = low_watermarks(admin, topic, partitions, args.timeout)
    ends = stable_end_offsets(admin, topic, partitions, args.timeout)
    consumer = CheckedConsumer(Consumer({**opts.consumer_config(), "group.id": f"{opts.app_id}.show"}))
    try:
        for p in partitions:
            scan = scan_all(consumer, topic, p, lows[p], ends[p], args.timeout)
            print(f"{topic}[{p}] offsets {lows[p]}..{ends[p]}: {len(scan.candidates)} manifests")
            for offset, m in scan.candidates:
                print(
                    f"  @{offset} {m.snapshot_id} generation {m.generation}: {m.entries} entries in {m.chunks} "
                    f"chunks from @{m.first_chunk_offset}, covers changelog < {m.changelog_offset}, input < "
                    f"{m.input_offset}, created {m.created_at}"
                )
    finally:
        consumer.close()
    return 0


__all__ = ["Options", "add_arguments", "main"]

if __name__ == "__main__":
    sys.exit(main())
