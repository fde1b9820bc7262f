"""`pipeline chaos` fails a run in which an instance exited by itself, whatever the checker says: the others took its
partitions over and exactly once held, but a process died (pipeline/testing/faults.py: Outcome.exited)."""

from __future__ import annotations

import json

from pipeline.testing.chaos import _as_json, report
from pipeline.testing.faults import FAULTS, Outcome
from pipeline.testing.oracle import Verdict

EXITED = "instance-2 exited by itself (code 1): pipeline run: Kafka error: fenced"


def test_a_clean_verdict_with_an_instance_that_exited_by_itself_fails() -> None:
    clean = Verdict(inputs=100, outputs=100, dead_letters=0, changelog_records=0)
    assert Outcome(clean, {}, [], "").ok
    outcome = Outcome(clean, {}, [], "", [EXITED])
    assert not outcome.ok
    text = report([(FAULTS["sigkill"], outcome, 12.0)])
    assert "FAIL" in text and EXITED in text
    assert json.loads(json.dumps(_as_json(FAULTS["sigkill"], outcome)))["exited"] == [EXITED]


def test_a_stuck_run_still_names_the_instance_that_exited() -> None:
    assert EXITED in report([(FAULTS["sigterm"], Outcome(None, {0: 5}, [], "", [EXITED]), 12.0)])
