"""GROUP_PROTOCOL: classic (the clients assign and heartbeat) or consumer (KIP-848: the broker does). librdkafka
refuses the classic protocol's client-side properties under `consumer`, so the input consumer must leave them out."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer

from pipeline.kafka.clients import consumer_config, producer_config
from pipeline.settings import ConfigError, load

CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")


def test_classic_is_the_default_and_keeps_the_client_side_group_settings() -> None:
    # FAILURE_DETECTION_MS off: on (the default), it shortens the heartbeat interval (the last test)
    env = {"PIPELINE_SESSION_TIMEOUT_MS": "7000", "PIPELINE_HEARTBEAT_INTERVAL_MS": "700"}
    s = load(env={**env, "PIPELINE_FAILURE_DETECTION_MS": "0"})
    config = consumer_config(s, "group")
    assert s.group_protocol == "classic" and config["group.protocol"] == "classic"
    assert (config["partition.assignment.strategy"], config["session.timeout.ms"], config["heartbeat.interval.ms"]) == (
        "cooperative-sticky",
        7000,
        700,
    )


def test_consumer_leaves_out_what_librdkafka_refuses_and_librdkafka_accepts_the_rest() -> None:
    s = load(env={"PIPELINE_GROUP_PROTOCOL": "consumer", "PIPELINE_GROUP_INSTANCE_ID": "pod-0"})
    config = consumer_config(s, "group")
    assert config["group.protocol"] == "consumer"
    assert not set(CLASSIC_ONLY) & set(config)
    assert (config["isolation.level"], config["enable.auto.commit"], config["group.instance.id"]) == (
        "read_committed",
        False,
        "pod-0",
    )
    Consumer(config).close()  # librdkafka's own check: `session.timeout.ms` etc. would fail here (_INVALID_ARG)


@pytest.mark.parametrize("extra", CLASSIC_ONLY)
def test_librdkafka_refuses_each_classic_only_property_under_consumer(extra: str) -> None:
    # Why consumer_config leaves them out (confluent-kafka 2.16.1 / librdkafka 2.16.0).
    config = consumer_config(load(env={"PIPELINE_GROUP_PROTOCOL": "consumer"}), "group")
    config[extra] = "cooperative-sticky" if extra == "partition.assignment.strategy" else 10_000
    with pytest.raises(Exception, match="not supported"):
        Consumer(config)


def test_a_bad_group_protocol_or_one_passed_through_to_librdkafka_fails_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="GROUP_PROTOCOL must be classic or consumer, not 'eager'"):
        load(env={"PIPELINE_GROUP_PROTOCOL": "eager"})
    with pytest.raises(ConfigError, match="PIPELINE_KAFKA_GROUP_PROTOCOL: set GROUP_PROTOCOL instead"):
        load(env={"PIPELINE_KAFKA_GROUP_PROTOCOL": "consumer"})


def test_both_producers_linger_5_ms() -> None:
    # exactly_once: the commit sends what lingers at once; at_least_once: 1 ms cost more CPU than it saved (see
    # pipeline/kafka/clients.py and BENCHMARKS.md).
    s = load(env={})
    assert producer_config(s, None)["linger.ms"] == producer_config(s, "app.in.0")["linger.ms"] == 5


def test_with_fast_failure_detection_the_heartbeat_hears_of_a_removal_within_a_quarter_of_the_bound() -> None:
    """A member removed by the detector starts a rebalance the others learn of at their next heartbeat."""
    quick = load(env={"PIPELINE_FAILURE_DETECTION_MS": "1000"})
    assert consumer_config(quick, "group")["heartbeat.interval.ms"] == 250
    slow = load(env={"PIPELINE_FAILURE_DETECTION_MS": "8000", "PIPELINE_SESSION_TIMEOUT_MS": "30000"})
    assert consumer_config(slow, "group")["heartbeat.interval.ms"] == 1000  # never longer than HEARTBEAT_INTERVAL_MS
    assert consumer_config(load(env={}), "group")["heartbeat.interval.ms"] == 250  # on by default, at 1000 ms
    assert consumer_config(load(env={"PIPELINE_FAILURE_DETECTION_MS": "0"}), "group")["heartbeat.interval.ms"] == 1000
