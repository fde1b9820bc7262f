"""`snapshots compact | show` (also `pipeline snapshots ...`).

snapshots compact --bootstrap-servers HOST:9092 --app-id APP [--master local[2]] [--keep-history]
snapshots show    --bootstrap-servers HOST:9092 --app-id APP
"""

from __future__ import annotations

import argparse
import logging
import sys

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from pipeline.state.snapshot_format import snapshot_topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="snapshots", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    from snapshots import compact

    job = commands.add_parser("compact", help="fold the latest snapshots and the changelog into new snapshots")
    compact.add_arguments(job)
    job.set_defaults(command=compact.run)
    show = commands.add_parser("show", help="list the manifests of each partition, newest first")
    show.add_argument("--bootstrap-servers", required=True)
    show.add_argument("--app-id", required=True)
    show.add_argument("--snapshot-topic", default="")
    show.add_argument("--timeout", type=float, default=30.0)
    show.set_defaults(command=_show)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("snapshots").setLevel(logging.INFO)  # also under `pipeline snapshots` (root at WARNING)
    return int(args.command(args))


def _show(args: argparse.Namespace) -> int:
    from pipeline.kafka.offsets import CheckedConsumer, low_watermarks, stable_end_offsets
    from pipeline.state.snapshot_finder import scan_all

    topic = args.snapshot_topic or snapshot_topic(args.app_id)
    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    metadata = admin.list_topics(timeout=args.timeout).topics
    if topic not in metadata:
        print(f"{topic}: no such topic", file=sys.stderr)
        return 1
    partitions = sorted(metadata[topic].partitions)
    lows = low_watermarks(admin, topic, partitions, args.timeout)
    ends = stable_end_offsets(admin, topic, partitions, args.timeout)
    consumer = CheckedConsumer(
        Consumer(
            {
                "bootstrap.servers": args.bootstrap_servers,
                "group.id": f"{args.app_id}.show",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )
    )
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


if __name__ == "__main__":
    sys.exit(main())
