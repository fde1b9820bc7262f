"""STATE_STORE=disk with a real broker, in-process (issue 32): a disk that refuses the state's batch stops the
partition, naming the directory; the restart on the same directory reads the tail the disk missed."""

from __future__ import annotations

from pipeline.state.rocks import DiskStore, StoreFull
from pipeline.testing import checker, inputs
from pipeline.testing.harness import wait_caught_up
from tests.integration.test_restore import fresh_app, make_runner, running
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
