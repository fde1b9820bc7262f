"""Start-up checks name the bad setting; the at-least-once baseline loses nothing; metrics and readiness are served."""

from __future__ import annotations

import socket
import urllib.request
import uuid

import pytest

from pipeline import settings
from pipeline.examples.running_totals import app as totals
from pipeline.settings import ConfigError
from pipeline.sinks.kafka.runner import KafkaRunner
from pipeline.testing import checker, inputs
from pipeline.testing.harness import wait_caught_up
from tests.integration.test_restore import fresh_app, running
from tests.support import eventually


def test_missing_input_topic_is_named(kafka_bootstrap):
    app = totals.with_topics(f"absent-{uuid.uuid4().hex[:8]}", "also-absent")
    runner = KafkaRunner(app, settings.load(env={}, bootstrap_servers=kafka_bootstrap, app_id="missing"))
    with pytest.raises(ConfigError, match=r"INPUT_TOPIC: topic 'absent-\w+' does not exist"):
        runner.run()


def test_changelog_with_another_partition_count_is_refused(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap, partitions=3)
    inputs.create_topics(kafka_bootstrap, {f"{app_id}-changelog": 2})
    runner = KafkaRunner(app, settings.load(env={}, bootstrap_servers=kafka_bootstrap, app_id=app_id))
    with pytest.raises(ConfigError, match=r"has 2 partitions but INPUT_TOPIC .* has 3"):
        runner.run()


def test_unreachable_broker_fails_with_a_bounded_clear_error():
    config = settings.load(env={}, bootstrap_servers="127.0.0.1:1", app_id="nowhere", request_timeout_ms=2_000)
    with pytest.raises(ConfigError, match="BOOTSTRAP_SERVERS: no cluster metadata within 2s"):
        KafkaRunner(totals, config).run()


def test_a_metrics_port_another_process_has_is_a_configuration_error_naming_it(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap, partitions=1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = settings.load(env={}, bootstrap_servers=kafka_bootstrap, app_id=app_id, metrics_port=port)
        config = config.with_overrides(metrics_host="127.0.0.1")
        with pytest.raises(ConfigError, match=rf"METRICS_PORT: cannot listen on 127.0.0.1:{port} \(Address already"):
            KafkaRunner(app, config).run()


def test_at_least_once_happy_path_loses_nothing(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap, partitions=3)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 5_000, partitions=3)
    config = settings.load(
        env={}, bootstrap_servers=kafka_bootstrap, app_id=app_id, processing_guarantee="at_least_once"
    )
    with running(KafkaRunner(app, config)):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 3, 60)
    verdict = checker.verify(
        app, kafka_bootstrap, dead_letter_topic=f"{app_id}-dlq", changelog_topic=f"{app_id}-changelog", group_id=app_id
    )
    assert verdict.ok, verdict.summary()


def test_metrics_and_readiness_are_served(kafka_bootstrap):
    app, app_id = fresh_app(kafka_bootstrap, partitions=3)
    inputs.produce_running_totals(kafka_bootstrap, app.input_topic, 3_000, partitions=3)
    runner = KafkaRunner(
        app, settings.load(env={}, bootstrap_servers=kafka_bootstrap, app_id=app_id, metrics_port=19464)
    )

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:19464{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return 0, ""

    with running(runner):
        assert not wait_caught_up(kafka_bootstrap, app_id, app.input_topic, 3, 60)
        eventually(lambda: get("/ready")[0] == 200)
        status, text = get("/metrics")
    assert status == 200
    for name in (
        "pipeline_records_in_total",
        "pipeline_transactions_total",
        "pipeline_commit_latency_seconds",
        "pipeline_consumer_lag",
        "pipeline_restore_duration_seconds",
        "pipeline_dead_letters_total",
        "pipeline_ready 1.0",
    ):
        assert name in text
