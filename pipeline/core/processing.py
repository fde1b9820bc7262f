"""Turning one input record into outputs, the same way in both sinks: decode, call `process`, and on failure undo,
back off and try again, then dead-letter or stop (docs/guarantees.md: no-silent-skip).

Each sink makes the first attempt itself, inline in its batch loop (the Kafka sink's loop is the hot path: no extra
call per record). Only a failure takes the shared path, `Attempts.retry`, which returns the outputs of a later
attempt that succeeded or the DeadLetter to write; where the dead letter goes is the sink's business (produced into
the open Kafka transaction, or a row in the PostgreSQL batch's transaction: either way it commits with the offset
that moves past the record).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter

from pipeline.app import App, CodeError, Record, Reject
from pipeline.core.deadletter import DeadLetter
from pipeline.kafka.records import Consumed
from pipeline.retry import Backoff, retry
from pipeline.serde import RegistryUnavailable, SchemaError
from pipeline.settings import Settings
from pipeline.state import PartitionState

log = logging.getLogger(__name__)
Outputs = TypeVar("Outputs")


class PoisonRecordStop(Exception):
    """A record kept failing and on_poison=stop."""

    fix = "Fix the record or the code and restart; nothing from it on was committed."


class InputRecordsDeleted(PoisonRecordStop):
    """Input records were deleted before p processed them: p stops where they were, as for a poison record
    (docs/guarantees.md: no-silent-skip)."""

    def __init__(self, topic: str, partition: int, position: int | None, group: str, detail: str) -> None:
        super().__init__(
            f"{topic}[{partition}]: the records from offset {position} on were deleted before they were processed "
            f"(the topic's retention, or delete_records; {detail})"
        )
        self.fix = (
            "They are lost for this pipeline, and p stops rather than skip them silently. To go on from what is "
            f"left: kafka-consumer-groups --group {group} --topic {topic}:{partition} --reset-offsets --to-earliest "
            "--execute, then restart. To prevent it: an input retention longer than the pipeline can fall behind."
        )


class CodeStop(PoisonRecordStop):
    """A CodeError: the App's code fails every record (or timer) the same way, so p stops at once, whatever
    ON_POISON says, instead of dead-lettering its whole input (docs/guarantees.md: fail-fast)."""

    def __init__(self, where: str, error: CodeError) -> None:
        super().__init__(f"{where}: {error} (a mistake in the code: every record would fail the same way)")
        self.fix = f"Fix it: {error.fix}; then restart. Nothing from here on was committed."


# Errors that another attempt cannot change: a Reject and a SchemaError are dead-lettered at once, a CodeError stops p,
# and a registry that does not answer is waited for by the sink (never a dead letter).
FINAL = (Reject, CodeError, SchemaError, RegistryUnavailable)


def record_from_message(app: App, msg: Consumed) -> Record:
    """A consumed message as the Record `process` receives (decoding may raise: the record is then poison)."""
    return app.decode(
        msg.key(), msg.value(), msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], msg.headers()
    )


def stop_message(partition: int, position: int | None, error: Exception) -> str:
    """What says p stopped, where, why and what to do: the runners' ERROR and the test driver's PartitionStopped."""
    fix = getattr(error, "fix", PoisonRecordStop.fix)
    at = "its first record" if position is None else f"offset {position}"
    return f"p{partition}: STOPPED at {at}: {error}. {fix}"


def log_stop(partition: int, position: int | None, error: Exception) -> None:
    """The ERROR that says p stopped (the runners' and the test driver's)."""
    log.error("%s", stop_message(partition, position, error))


def where(msg: Consumed) -> str:
    """A record's coordinates as errors name them: topic[partition]@offset."""
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


@dataclass(frozen=True)
class Attempts:
    """How a record whose first attempt failed is tried again: up to `max_attempts` attempts in all, the back-off
    doubling from `backoff_s`, then a dead letter (or PoisonRecordStop with on_poison=stop)."""

    max_attempts: int
    backoff_s: float
    stop_on_poison: bool
    errors: Counter  # failed attempts of this partition
    dead_letters: Counter
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def of(
        cls, settings: Settings, errors: Counter, dead_letters: Counter, sleep: Callable[[float], None] = time.sleep
    ) -> Attempts:
        return cls(
            settings.processing_max_attempts,
            settings.processing_backoff_ms / 1000,
            settings.on_poison == "stop",
            errors,
            dead_letters,
            sleep,
        )

    def retry(
        self, state: PartitionState, msg: Consumed, error: Exception, try_once: Callable[[], Outputs]
    ) -> Outputs | DeadLetter:
        """Called right after the first attempt at `msg` failed with `error`, its state changes still in place.
        Each attempt's changes are undone before the next, so every attempt (and the dead letter) sees the state as
        it was before the record. `try_once` decodes and processes the record again and returns its outputs.
        A Reject is final: the record is dead-lettered at once, with the Reject's error type; so is a SchemaError (a
        registry serde cannot decode it: error type `schema`). RegistryUnavailable is raised as it is, its changes
        undone: the schema registry did not answer, which says nothing about the record (the sink waits and tries
        it again later; never a dead letter)."""
        if isinstance(error, (CodeError, RegistryUnavailable)):
            state.undo_record()
            if isinstance(error, RegistryUnavailable):
                raise error
            raise CodeStop(where(msg), error) from error
        if isinstance(error, Reject):  # final at the first attempt: what `retry` would do, without its machinery
            state.undo_record()
            return self._reject(msg, error, 1)
        made = 0  # attempts made so far

        def failed(error: Exception, failures: int, delay: float | None) -> None:
            nonlocal made
            made = failures
            state.undo_record()
            if not isinstance(error, Reject):
                self.errors.inc()

        def attempt() -> Outputs:
            state.begin_record()
            return try_once()

        try:
            return retry(
                attempt,
                retriable=lambda e: not isinstance(e, FINAL),
                backoff=Backoff(self.backoff_s),
                attempts=self.max_attempts,
                first_error=error,
                on_failure=failed,
                sleep=self.sleep,
            )
        except Reject as reject:
            return self._reject(msg, reject, made)
        except SchemaError as undecodable:
            return self._give_up(msg, undecodable, made)
        except RegistryUnavailable:
            raise
        except CodeError as mistake:  # found by a retry (it checks what process returned): p stops at once
            raise CodeStop(where(msg), mistake) from mistake
        except Exception as last:  # user code or decoding, every attempt: poison
            return self._give_up(msg, last, made)

    def _reject(self, msg: Consumed, reject: Reject, attempts: int) -> DeadLetter:
        self.dead_letters.inc()
        return DeadLetter(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            reject.error_type,
            str(reject),
            attempts,
            rejected=True,
        )

    def _give_up(self, msg: Consumed, error: Exception, attempts: int) -> DeadLetter:
        at = where(msg)
        if self.stop_on_poison:
            raise PoisonRecordStop(f"{at} failed {attempts} times: {type(error).__name__}: {error}") from error
        self.dead_letters.inc()
        log.warning("dead-lettered %s after %d attempts: %s: %s", at, attempts, type(error).__name__, error)
        schema = isinstance(error, SchemaError)
        return DeadLetter(
            msg.topic(),
            msg.partition(),
            msg.offset(),
            msg.key(),
            msg.value(),
            SchemaError.error_type if schema else type(error).__name__,
            str(error),
            attempts,
            schema_id=error.schema_id if isinstance(error, SchemaError) else None,
        )
