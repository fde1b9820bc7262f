"""The Spark job that compacts full snapshots: each partition's latest snapshot + the changelog since -> the next one.

The format, how a restore finds and verifies the newest complete snapshot, and the pipeline's own snapshot on
shutdown belong to the runtime: pipeline/state/snapshot_format.py. This package only writes that format, with the
runtime's chunk emitter and verifier (pipeline/state/snapshot_writer.py `emit_chunks`, snapshot_format.py
`ChunkSet`), and depends on the runtime, never the reverse (docs/guarantees.md: complete-restore,
all-or-nothing-snapshots).

    snapshots compact --bootstrap-servers HOST:9092 --app-id APP [--master local[2]] [--keep-history]
    spark-submit --jars <kafka connector jars> snapshots/submit.py --bootstrap-servers ... --app-id APP
    snapshots show --bootstrap-servers HOST:9092 --app-id APP          (also `pipeline snapshots ...`)

A run (`compact.compact`), per partition p of `<app>-changelog`:
    1. plan.py (driver): base = the newest usable manifest; changelog range = [base's covered offset, the
       changelog's last stable offset). Nothing new: skipped. The snapshot id is a hash of (app, p, base id,
       changelog range): a rerun with no new changelog records is a no-op, and two runs with the same inputs produce
       the same id.
    2. fold.py (Spark): Spark's Kafka source (read_committed, explicit offsets, failOnDataLoss=true) reads the base's
       chunks and the changelog; a fold per partition (last write wins by changelog offset, tombstones delete, the
       last checkpoint gives the input offset) writes chunks from the executors. A damaged base is skipped for the
       previous one.
    3. publish.py (driver): all manifests in one transaction with transactional.id `<app>.snapshot-publisher`:
       init_transactions fences a concurrent run, then each partition's newest manifest is checked again and a
       partition is skipped if another run (or the pipeline's snapshot on shutdown) published meanwhile.
    4. retention.py (driver): deletion below the previous generation, see below.
options.py holds the run's options and its clients' configuration, report.py what it prints, cli.py the commands.

Retention: who deletes what, and why it is safe
    Both internal topics are created with retention.ms=-1 and retention.bytes=-1: Kafka never deletes from them by
    time or size, because a gap would make restore impossible. Deletion is done only by the compaction job, with
    AdminClient.delete_records, after it has published generation g on base B (the previous valid generation):
      - snapshot topic: records below B's first chunk (generations older than B)
      - changelog: records below B's covered offset
    So at any time the topics hold two complete generations, B and g, and the changelog from B's covered offset on:
    if g turns out damaged, restore falls back to B and still finds every change since. Nothing is deleted after the
    first generation, and `--keep-history` turns deletion off. A restore that has records deleted under it (it began
    on an older generation) starts over (auto.offset.reset=error makes that an error, never a silent jump).
    Do not set retention.ms on the changelog: if records disappear that no snapshot covers, p refuses to start.
    Known limit: the checker (`pipeline verify`) folds the changelog from its start, so once the job has deleted
    from a changelog, its state check reports the keys last written below the deleted offset; verify runs with
    `--keep-history` compactions (or before the second generation).

Scheduling (deploy/compaction/): a Kubernetes CronJob running spark-submit, a cron line, an Airflow DAG. The job is
safe at any time while the pipeline runs; the pipeline needs no restart (its next restore of p uses the newest
snapshot). Benchmarks: `python -m tools.bench.snapshots` (BENCHMARKS.md).
"""
