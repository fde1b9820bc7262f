"""A partition's state and how it survives: the in-memory store, its changelog, full snapshots and restore.

store.py            PartitionState: values kept encoded, undo logs per record and per transaction
disk_store.py       STATE_STORE=disk: the same contract with the committed state in RocksDB, the open transaction's
                    writes held in memory and written in one batch after the sink's commit (KIP-892)
rocks.py            one partition's RocksDB and its bookkeeping (local checkpoint, key count), the shared memory
local_stores.py     a process's disk stores: STATE_DIR locked, what a restore of p starts from, their metrics
changelog.py        the changelog record format (state changes + one checkpoint per transaction)
snapshot_format.py  full snapshots: chunks + one manifest, and ChunkSet, the one chunk verifier (the restore and
                    the Spark job in snapshots/ both use it)
snapshot_finder.py  finding the newest complete snapshot of a partition, in short steps
snapshot_writer.py  emit_chunks, the one chunk emitter (also used by the Spark job), and write_snapshot for a
                    running pipeline (SNAPSHOT_ON_SHUTDOWN)
changelog_apply.py  the fold of changelog records into a state, shared by restores and standby copies
restore.py          one partition's restore = newest complete snapshot (or a standby copy) + changelog since
restore_setup.py    what a restore asks before it reads (its bounds, never waited for) and StandbyCopy
restore_checks.py   what a restore refuses: a changelog deleted below its snapshot, a checkpoint off the group's offset
restore_manager.py  every restore of one runner, stepped between polls within one budget (RestoreManager)
standby.py          warm standby copies of other members' partitions (STANDBY_REPLICAS): placed, warmed, followed
timed.py            TimedState: timers, stream time and TTL deadlines kept as reserved state entries, so they
                    travel with the state (changelog, snapshots, restore, compaction)
versions.py         state schema versions: values tagged with the version that wrote them, migrated at restore
                    (on disk: as they are read)
tables.py           tables as `process` reads them (TableView), and a co-partitioned table's undoable store
table_restore.py    a task's co-partitioned tables rebuilt from their own topics
global_tables.py    global tables: read whole before the group is joined, then followed
"""

from pipeline.state.store import PartitionState

__all__ = ["PartitionState"]
