"""The fast failure detector's verdicts (pipeline/kafka/liveness.py: Peers) on a fake clock, and its settings."""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import Producer

from pipeline.kafka.kafka_python import kafka_python_config
from pipeline.kafka.liveness import Beat, Liveness, Peers
from pipeline.settings import ConfigError, Settings
from pipeline.testing.inputs import create_topics
from tests.support import eventually

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


def test_a_peer_removed_once_is_judged_again_after_it_rejoined() -> None:
    """Paused, removed, resumed: it rejoins under a new member id, and its next silence is acted on too. Not before
    it rejoined: its old member id is gone from the group already."""
    me, peer, rejoined = Beat("me", "m-1"), Beat("b", "m-2"), Beat("b", "m-3")
    peers = Peers("me", BOUND_S)
    judged: list[tuple[float, str]] = []
    for step in range(25):  # the peer beats at 0-0.5 s, 2-2.5 s as before, 4-4.5 s rejoined; silent in between
        t = step * 0.25
        beat = peer if t <= 0.5 or 2.0 <= t <= 2.5 else rejoined if 4.0 <= t <= 4.5 else None
        heard_all(peers, [me, beat] if beat else [me], t)
        judged += [(t, b.member_id) for b in peers.silent(t)]
    assert judged == [(1.75, "m-2"), (5.75, "m-3")]  # not at 3.75: m-2 was removed already


def test_nobody_is_judged_while_this_process_does_not_hear_itself() -> None:
    peers = Peers("me", BOUND_S)
    heard_all(peers, [Beat("me", "m-1"), Beat("b", "m-2")], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):  # our own beats no longer come back: our reading is stuck
        assert peers.silent(t) == []


def test_a_stalled_heartbeat_topic_judges_nobody_even_when_this_process_heard_itself_last() -> None:
    """A broker killed stalls the topic for everyone. The peer's last beat before the stall landed a turn before this
    process's own: with the whole bound as the test of hearing itself, the peer was judged at 3.0 s (a cluster test
    fenced a live peer at every broker kill). After the stall, the peer's producer retries a turn behind ours."""
    me, peer = Beat("me", "m-1"), Beat("b", "m-2")
    peers = Peers("me", BOUND_S)
    judged: list[float] = []
    for step in range(40):  # turns of 0.25 s; the topic delivers nothing from 2.0 s to 4.0 s
        t = step * 0.25
        heard = [me] if t <= 2.0 or t >= 4.0 else []
        if t <= 1.75 or t >= 4.5:
            heard.append(peer)
        heard_all(peers, heard, t)
        judged += [t for _ in peers.silent(t)]
    assert judged == []


def test_after_a_stall_a_peer_silent_for_a_whole_bound_is_judged() -> None:
    me, peer = Beat("me", "m-1"), Beat("b", "m-2")
    peers = Peers("me", BOUND_S)
    judged: list[float] = []
    for step in range(40):  # as above, but the peer died in the stall
        t = step * 0.25
        heard_all(peers, ([me] if t <= 2.0 or t >= 4.0 else []) + ([peer] if t <= 1.75 else []), t)
        judged += [t for _ in peers.silent(t)]
    assert judged == [5.25]  # a bound after the first turn that heard this process again (4.0 s), at the next turn


def test_a_pause_of_this_process_restarts_every_peers_clock() -> None:
    """Woken from SIGSTOP, everyone looks silent: nobody is judged, and silence counts from the wake-up."""
    me, peer = Beat("me", "m-1"), Beat("b", "m-2")
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, peer], 0.0)
    assert peers.silent(0.0) == []
    peers.heard(me, 5.0)  # the beats queued meanwhile arrive after the wake-up, the peer's too
    assert peers.silent(5.0) == []
    assert peers.starved and peers.why.startswith("this process's liveness thread did not run for 5000 ms")
    heard_all(peers, [me, peer], 5.25)
    assert peers.silent(5.25) == [] and not peers.starved


def test_a_clean_stop_and_a_member_that_never_joined_are_not_removed() -> None:
    peers = Peers("me", BOUND_S)
    heard_all(peers, [Beat("me", "m-1"), Beat("b", "m-2", stopping=True), Beat("c")], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):
        peers.heard(Beat("me", "m-1"), t)
        assert peers.silent(t) == []


def test_a_static_member_back_under_a_new_incarnation_is_left_to_it() -> None:
    """Restarted under its GROUP_INSTANCE_ID and beating before the old one's silence reaches the bound, still
    starting (no member id yet) and then joined: the old incarnation is neither fenced nor removed, ever (the new one
    took its place in the group, and fenced its producer itself)."""
    me = Beat("me", "m-1")
    old = Beat("old", "m-2", "host-w1", "app.in.process-host-w1")
    starting, joined = (
        Beat("new", "", "host-w1", old.transactional_id),
        Beat("new", "m-3", "host-w1", old.transactional_id),
    )
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, old], 0.0)
    for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0):
        heard_all(peers, [me, starting if t < 2.0 else joined], t)
        assert peers.silent(t) == [], t
    assert ("old", "m-2") in peers.judged  # done with: not judged again once the new one falls silent
    dead = []
    for t in (3.25, 3.5, 3.75, 4.0, 4.25, 4.5):
        peers.heard(me, t)
        dead += peers.silent(t)
    assert dead == [joined]


def test_a_new_incarnation_that_dies_before_joining_no_longer_shields_the_old_one() -> None:
    me = Beat("me", "m-1")
    old = Beat("old", "m-2", "host-w1", "app.in.process-host-w1")
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, old], 0.0)
    heard_all(peers, [me, Beat("new", "", "host-w1", old.transactional_id)], 0.5)
    assert peers.silent(0.5) == []
    for t in (0.75, 1.0, 1.25, 1.5):  # the new one beats no more (it died while starting)
        peers.heard(me, t)
        assert peers.silent(t) == [], t
    peers.heard(me, 1.75)
    assert peers.silent(1.75) == [old]  # fenced and removed, as any silent peer
    stopped = Peers("me", BOUND_S)
    heard_all(stopped, [me, old], 0.0)
    heard_all(stopped, [me, Beat("new", "", "host-w1", stopping=True)], 0.5)
    for t in (0.75, 1.0):
        stopped.heard(me, t)
        assert stopped.silent(t) == [], t
    stopped.heard(me, 1.25)
    assert stopped.silent(1.25) == [old]  # stopped while starting (a configuration error): no shield either


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
    # on by default: a cluster reached with hostname verification off must not need FAILURE_DETECTION_MS=0
    for algorithm, check in (("none", False), ("https", True)):
        verify = Settings(kafka={"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": algorithm})
        assert kafka_python_config(verify)["ssl_check_hostname"] is check


def test_fast_failure_detection_is_on_by_default_and_0_turns_it_off() -> None:
    """Issue 33: a user who sets nothing gets the fast take-over (1000 ms: BENCHMARKS.md, the soaks behind it)."""
    assert Settings().failure_detection_ms == 1000
    assert Settings(failure_detection_ms=0).failure_detection_ms == 0
    # the shortest session time-out still leaves the default bound room below it
    assert Settings(session_timeout_ms=6000, heartbeat_interval_ms=2000).failure_detection_ms == 1000


def test_the_supervisors_announcement_keeps_the_place_until_the_new_process_beats_itself() -> None:
    """The supervisor says at once that it restarts host-w1 (starting_ms: the session time-out, 10 s here); the new
    process beats itself only 3 s later (slow to start), joins, and the old incarnation was never judged. Had the
    new process died before its first beat, the old one would be judged once the announcement lapsed."""
    me = Beat("me", "m-1")
    old = Beat("old", "m-2", "host-w1", "app.in.process-host-w1")
    peers = Peers("me", BOUND_S)
    heard_all(peers, [me, old, Beat("said", instance_id="host-w1", starting_ms=10_000)], 0.0)
    dead = []
    for step in range(1, 21):
        t = step * 0.25
        new = [Beat("new", "m-3" if t >= 4.0 else "", "host-w1", old.transactional_id)] if t >= 3.0 else []
        heard_all(peers, [me, *new], t)
        dead += peers.silent(t)
    assert dead == []
    lapsing = Peers("me", BOUND_S)
    heard_all(lapsing, [me, old, Beat("said", instance_id="host-w1", starting_ms=2_000)], 0.0)
    for step in range(1, 10):
        lapsing.heard(me, step * 0.25)
        dead += lapsing.silent(step * 0.25)
    assert dead == [old]  # at 2.25 s: the new process never beat within the announced 2 s


def test_a_beat_of_a_later_version_is_read_and_garbage_is_not() -> None:
    later = b'{"incarnation": "x", "member_id": "m", "instance_id": "", "transactional_id": "", "zone": "b"}'
    assert Beat.decode(later) == Beat("x", "m")
    assert Beat.decode(b"[1]") is None and Beat.decode(b"not json") is None


def test_the_runner_tells_the_heartbeat_its_member_id() -> None:
    """Liveness.joined, called from the rebalance callback: the beat names the member from then on (never asked from
    the heartbeat thread, where memberid() waits for the poll loop's poll)."""
    liveness = Liveness(
        Settings(failure_detection_ms=1000, group_instance_id="host-w0"),
        {"bootstrap.servers": "127.0.0.1:1"},  # nothing is sent: the thread is not started
        "app",
        "app-liveness",
        remove=lambda beat: "",
        fence=lambda transactional_id: None,
    )
    incarnation = liveness.beat.incarnation
    liveness.joined("")
    assert liveness.beat.member_id == ""
    liveness.joined("m-1")
    assert liveness.beat == Beat(incarnation, "m-1", "host-w0")


def test_a_silent_member_is_removed_without_waiting_for_its_fence() -> None:
    """The removal starts the rebalance; the fence (~0.5 s when it must abort an open transaction) runs beside it on
    a thread of its own, so neither the removal nor this process's own beats wait for it."""
    events: list[str] = []
    fence_may_end = threading.Event()

    def fence(transactional_id: str) -> None:
        events.append(f"fence {transactional_id} started")
        fence_may_end.wait(5)
        events.append("fence done")

    liveness = Liveness(
        Settings(failure_detection_ms=1000),
        {"bootstrap.servers": "127.0.0.1:1"},  # nothing is sent: the thread is not started
        "app",
        "app-liveness",
        remove=lambda beat: events.append(f"removed {beat.member_id}") or "NoError",
        fence=fence,
    )
    liveness._act(Beat("x", "m-1", transactional_id="app.p"), 0.0)
    assert "removed m-1" in events and "fence done" not in events
    fence_may_end.set()
    eventually(lambda: "fence done" in events, timeout_s=5, interval_s=0.01)
    assert "fence app.p started" in events and liveness.removed == [Beat("x", "m-1", transactional_id="app.p")]


@pytest.mark.kafka
def test_a_peer_that_died_just_before_this_process_started_is_heard_and_removed(kafka_bootstrap: str) -> None:
    """A CI run killed a member a second after a new one started: read from the end, the new one had heard none of its
    beats and the group waited the session time-out. The last SESSION_TIMEOUT_MS of beats are read at start."""
    topic = f"liveness-{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, {topic: 1})
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    dead = Beat("dead-incarnation", "m-dead")
    producer.produce(topic, dead.encode(), key=dead.incarnation.encode())
    assert producer.flush(10) == 0
    removed: list[str] = []
    liveness = Liveness(
        Settings(failure_detection_ms=500, session_timeout_ms=6000),
        {"bootstrap.servers": kafka_bootstrap},
        "app",
        topic,
        remove=lambda beat: removed.append(beat.member_id) or "NoError",
        fence=lambda transactional_id: None,
    ).start()
    try:
        eventually(lambda: removed == ["m-dead"], timeout_s=10)
    finally:
        liveness.stop()
