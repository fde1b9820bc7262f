"""STATE_STORE=disk with a real broker, in-process (issue 32): a disk that refuses the state's batch stops the
partition, naming the directory; the restart on the same directory reads the tail the disk missed. State versions on
disk: new code restarted on an older version's store migrates it, its snapshot restores elsewhere, and the old code
refuses the newer state."""

from __future__ import annotations

import uuid

import pytest

from pipeline.state.rocks import DiskStore, StoreFull
from pipeline.state.versions import StateVersionError
from pipeline.testing import checker, inputs
from pipeline.testing.harness import wait_caught_up
from tests.integration.test_restore import fresh_app, make_runner, running
from tests.snapshots.versioned_app import v1, v2
from tests.support import eventually


def test_a_full_disk_stops_the_partition_naming_the_directory_and_the_restart_reads_what_it_missed(
    kafka_bootstrap, tmp_path, monkeypatch, caplog
):
    app, app_id = fresh_app(kafka_bootstrap)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1, seed=1)
    runner = make_runner(app, app_id, kafka_bootstrap, state_store="disk", state_dir=str(tmp_path))
    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 60)
    written = DiskStore.write

    def full(self, entries, count, position=None, checkpoint=None):
        if entries:  # a transaction's batch (RocksDB's own error wrapped as DiskStore._write does)
            raise StoreFull(f"the disk state store in {self.path} cannot be written: IO error: No space left on device")
        written(self, entries, count, position, checkpoint)

    monkeypatch.setattr(DiskStore, "write", full)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1, seed=2)
    runner = make_runner(app, app_id, kafka_bootstrap, state_store="disk", state_dir=str(tmp_path))
    with caplog.at_level("ERROR"), running(runner):
        eventually(lambda: runner.metrics.registry.get_sample_value("pipeline_stopped_partitions") == 1, 60)
    assert f"the disk state store in {tmp_path / app_id / 'p0'} cannot be written" in caplog.text
    assert "STOPPED" in caplog.text and "Free space in STATE_DIR" in caplog.text
    monkeypatch.undo()  # space freed: the restart reads from the changelog what the disk missed
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1, seed=3)
    runner = make_runner(app, app_id, kafka_bootstrap, state_store="disk", state_dir=str(tmp_path))
    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 60)
    assert runner.metrics.restore_records.labels("0")._value.get() > 0  # the tail after the local checkpoint
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()


def test_state_versions_on_disk_migrate_the_local_store_restore_its_snapshot_elsewhere_and_refuse_a_rollback(
    kafka_bootstrap, tmp_path, caplog
):
    suffix = uuid.uuid4().hex[:8]
    old, new = (app.with_topics(f"vdisk-in-{suffix}", f"vdisk-out-{suffix}") for app in (v1, v2))
    app_id = f"vdisk-{suffix}"
    inputs.create_topics(kafka_bootstrap, {new.input_topic: 1, new.output_topic: 1})
    disk = {"state_store": "disk", "state_dir": str(tmp_path / "first")}

    def run(app, seed: int, **overrides):
        inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 500, partitions=1, seed=seed)
        runner = make_runner(app, app_id, kafka_bootstrap, **overrides)
        with caplog.at_level("INFO"), running(runner):
            assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 1, 60)
        return runner

    run(old, 1, **disk)  # version 1's values on the first disk
    caplog.clear()
    runner = run(new, 2, snapshot_on_shutdown=True, **disk)  # version 2 on it: the local store, migrated as read
    assert "p0: local state store in" in caplog.text and "published on shutdown" in caplog.text, caplog.text
    assert runner.metrics.restore_snapshot_entries.labels("0")._value.get() == 0
    runner = run(new, 3, state_store="disk", state_dir=str(tmp_path / "second"))  # its v2 snapshot, on another disk
    assert runner.metrics.restore_snapshot_entries.labels("0")._value.get() > 0
    assert runner.metrics.restore_records.labels("0")._value.get() == 0  # the snapshot covered the whole changelog
    verdict = checker.verify(
        new, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok and verdict.outputs == 1_500, verdict.summary()
    with pytest.raises(StateVersionError, match="written by state version 2, this code is at version 1"):
        make_runner(old, app_id, kafka_bootstrap, **disk).run()  # a rollback on the first disk
