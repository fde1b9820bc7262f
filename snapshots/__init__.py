"""Full snapshots of partition state, and the Spark job that compacts them (rules 7 and 9 of EOS-CONTRACT.md).

Without full snapshots, restoring partition p replays p's whole changelog: restore time grows with history. With
them, restore = the latest complete snapshot of p + the changelog since the offset it covers, so it grows with the
state size plus the tail since the last compaction.

Topics (both created by the runner at start-up, with the input's partition count; partition p belongs to input p)
    <app>-changelog   p's state changes and per transaction a checkpoint (pipeline/state/changelog.py), written by the
                      pipeline inside its transactions
    <app>-snapshots   full snapshots of p, written only by the compaction job (`snapshots compact`)

Format (pipeline/state/snapshot_format.py, version 1)
    A snapshot of p is a run of chunk records followed by ONE manifest record, both in partition p. A chunk holds up
    to 512 KiB of raw entries (state key -> encoded state value, opaque bytes) as length arrays + blobs, decoded with a
    few C-level calls per chunk, CRC-32 per chunk; the producer compresses batches (lz4). The manifest (JSON) holds the
    snapshot id, generation, the changelog offset it covers (next offset: the snapshot is the fold of the changelog
    below it), the input offset it covers (the last checkpoint folded in), chunk count, entry count, checksum (CRC-32
    over the chunks' CRCs), format version, created-at, the offset of its first chunk and its predecessor's id.
    A snapshot without a committed manifest does not exist. Chunks are written first with an idempotent producer;
    manifests go last, in one transaction.

Finding the latest (pipeline/state/snapshot_finder.py)
    The snapshot topic's p is scanned back from its last stable offset in growing windows (8, 32, 128, ...), each
    read with read_committed until the consumer's position reaches the window's end: markers, aborted chunks and
    aborted manifests occupy offsets and are stepped over, never "end - 1", never one poll. The newest manifest's
    chunks ([first chunk, manifest)) are verified: all indexes present, CRCs, entry count, checksum; chunks of other
    snapshots in between are skipped by id, duplicates (a retried Spark task) read once. A snapshot that fails is
    skipped with a warning and the previous one is tried; with none left, the base is the empty state at changelog
    offset 0. Every Kafka call has a time-out; a restore that does not finish says which phase and offsets stuck.

Restore (pipeline/state/restore.py), after fencing, in steps of RESTORE_STEP_MS between polls (p stays paused)
    snapshot (scan + load; a second consumer prefetches the changelog tail meanwhile) -> changelog of p from the
    covered offset to its high watermark -> the last checkpoint (from
    the tail, or the snapshot's input offset if the tail has none) must equal the group's committed offset of p. If
    the changelog's low watermark is above the covered offset (or above 0 without a snapshot), p refuses to start
    with a RestoreError that says what is missing and how to repair it. Metrics: pipeline_restore_snapshot_entries
    (entries from the snapshot) and pipeline_restore_records (changelog records read) per partition.

Compaction (snapshots/compact.py): `snapshots compact --bootstrap-servers ... --app-id ...` or spark-submit
    Per partition: base = the newest manifest; changelog range = [base's covered offset, the changelog's last stable
    offset); Spark's Kafka source (read_committed, explicit offsets, failOnDataLoss=true) reads base chunks and
    changelog; a fold per partition (last write wins by changelog offset, tombstones delete, the last checkpoint gives
    the input offset) writes chunks from the executors; the driver publishes all manifests in one transaction with
    transactional.id `<app>.snapshot-publisher`: init_transactions fences a concurrent run, then each partition's
    newest manifest is checked again and a partition is skipped if another run published meanwhile. The snapshot id
    is a hash of (app, partition, base id, changelog range): a rerun with no new changelog records is a no-op, and
    two runs with the same inputs produce the same id. A damaged base is skipped for the previous one.

Snapshot on shutdown (SNAPSHOT_ON_SHUTDOWN=true, pipeline/state/snapshot_writer.py)
    On a clean stop the runner commits what is open, then writes p's state (chunks + manifest) in one more
    transaction of p's own producer, so a fenced owner publishes nothing. It covers the changelog below its last
    committed checkpoint's offset + 1 (known from that record's delivery report; without it, or with nothing new
    since the snapshot p was restored from, no snapshot is written) and the input below the committed offset. A
    compaction planned before it sees a newer manifest when it publishes and skips p; the next compaction uses it as
    its base. Its generation is its base's + 1, so a racing compaction may carry the same number: snapshots are
    ordered by their place in the topic, never by generation.

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
