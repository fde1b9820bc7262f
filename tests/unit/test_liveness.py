"""The fast failure detector's verdicts (pipeline/kafka/liveness.py: Peers) on a fake clock, and its settings."""

from __future__ import annotations

import pytest

from pipeline.kafka.liveness import Beat, Peers, kafka_python_config
from pipeline.settings import ConfigError, Settings

BOUND_S = 1.0


def heard_all(peers: Peers, beats: list[Beat], now: float) -> None:
    for beat in beats:
        peers.heard(beat, now)


def test_a_peer_silent_past_the_bound_is_judged_once_with_its_names() -> None:
    me, peer = Beat("me", "m-1"), Beat("b", "m-2", "host-w1", "app.in.process-host-w1")
    peers = Peers("me", BOUND_S)
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        heard_all(peers, [me, peer] if t == 0.0 else [me], t)
        assert peers.silent(t) == []
    peers.heard(me, 1.25)
    assert peers.silent(1.25) == [peer]  # 1.25 s since its last beat
    peers.heard(me, 1.5)
    assert peers.silent(1.5) == []  # acted on once


def test_nobody_is_judged_while_this_process_does_not_hear_itself() -> None:
    peers = Peers("me", BOUND_S)
    heard_all(peers, [Beat("me", "m-1"), Beat("b", "m-2")], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):  # our own beats no longer come back: our reading is stuck
        assert peers.silent(t) == []


def test_a_pause_of_this_process_restarts_every_peers_clock() -> None:
    """Woken from SIGSTOP, everyone looks silent: nobody is judged, and silence counts from the wake-up."""
    me, peer = Beat("me", "m-1"), Beat("b", "m-2")
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, peer], 0.0)
    assert peers.silent(0.0) == []
    peers.heard(me, 5.0)  # the beats queued meanwhile arrive after the wake-up, the peer's too
    assert peers.silent(5.0) == []
    heard_all(peers, [me, peer], 5.25)
    assert peers.silent(5.25) == []


def test_a_clean_stop_and_a_member_that_never_joined_are_not_removed() -> None:
    peers = Peers("me", BOUND_S)
    heard_all(peers, [Beat("me", "m-1"), Beat("b", "m-2", stopping=True), Beat("c")], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):
        peers.heard(Beat("me", "m-1"), t)
        assert peers.silent(t) == []


def test_a_static_member_back_under_a_new_incarnation_keeps_its_producer() -> None:
    """The old incarnation's member goes; its producer's name is the new one's: never fenced."""
    me = Beat("me", "m-1")
    old = Beat("old", "m-2", "host-w1", "app.in.process-host-w1")
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, old], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25):
        heard_all(peers, [me, Beat("new", "m-3", "host-w1", "app.in.process-host-w1")], t)
        dead = peers.silent(t)
    assert dead == [Beat("old", "m-2", "host-w1", "")]


def test_the_bound_must_be_off_or_between_200_ms_and_the_session_timeout() -> None:
    assert Settings(failure_detection_ms=1000).failure_detection_ms == 1000
    for bad in (100, 10_000, -1):
        with pytest.raises(ConfigError, match="FAILURE_DETECTION_MS"):
            Settings(failure_detection_ms=bad)


def test_the_admin_client_gets_the_security_settings_or_start_up_names_the_one_it_cannot() -> None:
    settings = Settings(kafka={"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512"})
    assert kafka_python_config(settings)["sasl_mechanism"] == "SCRAM-SHA-512"
    with pytest.raises(ConfigError, match=r"FAILURE_DETECTION_MS.*sasl\.oauthbearer\.config"):
        kafka_python_config(Settings(kafka={"sasl.oauthbearer.config": "x"}))
