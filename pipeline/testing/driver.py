"""The test driver: an App's records through the production code path, with no broker (Kafka Streams'
TopologyTestDriver for this template). Runs in milliseconds.

    driver = AppDriver(app)                                  # 1 input partition; settings as keyword arguments
    driver.send("acct-1", {"id": 1, "amount": 5}, timestamp_ms=1_000)   # -> the outputs that record caused
    driver.advance_wall_clock(5_000)                         # wall-clock timers now due fire -> their outputs
    driver.outputs, driver.dead_letters                      # what is committed (decoded)
    driver.state(), driver.timers(), driver.stream_time()    # partition 0's, by default
    driver.crash()                                           # open transactions lost, state restored
    driver.verify()                                          # the checker's verdict over everything so far
A partition stopped where the runtime stops it raises `PartitionStopped` from the call (on_stop="record": the
runtime's behaviour; pipeline/testing/stops.py). `strict=True` (the pytest plugin's default): a state value changed in
place but not assigned back is an error (pipeline/testing/strict.py). A partition the driver does not have is refused.

Each record goes through `KafkaTask.process` and each commit through `commit_transaction`, the code the Kafka
runner runs (pipeline/sinks/kafka/), against in-memory clients (pipeline/testing/memory.py) whose transactions
commit outputs, changelog and offsets together or not at all. The driver plays the rest of the runner's part: it
fetches the input from the committed position, calls `tick` every turn (wall-clock timers, bursts of due timers),
turns an aborted transaction into a rewind, and takes a crashed partition over like a new owner (fence, committed
offset, restore by folding the committed changelog, checkpoint checked against the offset). By default it commits
after each call.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from confluent_kafka import Message

from pipeline.app import App, Timer
from pipeline.core.deadletter import DeadLetter, dead_letter_topic
from pipeline.core.lifecycle import Phase
from pipeline.core.processing import PoisonRecordStop, log_stop
from pipeline.metrics import Metrics
from pipeline.registry import bound_for_tests
from pipeline.sinks.kafka.commit import abort_and_rewind, commit_transaction
from pipeline.sinks.kafka.inputs import MultiInputTask
from pipeline.sinks.kafka.task import KafkaTask, KafkaTaskContext
from pipeline.sinks.kafka.transaction import Transaction, TransactionAborted, transactional_id
from pipeline.state import PartitionState
from pipeline.state.changelog import Checkpoint, changelog_topic, is_checkpoint
from pipeline.state.tables import TableStore
from pipeline.state.timed import TimedState
from pipeline.state.versions import StateVersionError
from pipeline.testing.memory import MemoryBroker, MemoryConsumer, MemoryProducer
from pipeline.testing.oracle import RunData, TopicDump, Verdict, check
from pipeline.testing.oracle.records import KafkaRecord
from pipeline.testing.produced import Produced, decoded
from pipeline.testing.stops import OnStop, PartitionStopped, Stops
from pipeline.testing.stores import driver_settings
from pipeline.testing.strict import watched

__all__ = ["AppDriver", "PartitionStopped", "Produced"]
REGISTRY_LOOKUP_WAIT_S = 1.0  # a call's wait for a background registry look-up; then the next call takes it up
MAX_TURNS = 100_000  # loop turns per call: an on_timer that keeps scheduling due timers ends here


class AppDriver:
    __test__ = False  # pytest: not a test class

    def __init__(
        self,
        app: App,
        *,
        partitions: int = 1,
        wall_clock_ms: int = 0,
        auto_commit: bool = True,
        strict: bool = False,
        on_stop: OnStop = "raise",
        schema_registry: Any = None,
        **settings: Any,
    ) -> None:
        app, self.schema_registry = bound_for_tests(app, schema_registry)  # registry serdes: in memory by default
        self.app, self.partitions, self.now_ms, self.auto_commit = app, partitions, wall_clock_ms, auto_commit
        self.strict, self.stops = strict, Stops(on_stop)
        # No back-off sleeps between attempts at a failing record unless asked for: a test runs in milliseconds.
        defaults = {"bootstrap_servers": "memory:9092", "app_id": app.name, "processing_backoff_ms": 0}
        self.settings, self._stores = driver_settings(self, app, {**defaults, **settings})  # testing/stores.py
        self.input_topic, self.output_topic = app.input_topic, app.output_topic
        self.topics = app.co_partitioned  # what task p reads partition p of: the inputs, then the tables
        self.changelog_topic, self.dead_letter_topic = changelog_topic(app.name), dead_letter_topic(app.name)
        self.broker = MemoryBroker()
        self.global_tables = {name: TableStore(spec) for name, spec in app.global_table_specs.items()}
        global_topics = [spec.topic for spec in app.global_table_specs.values()]
        for topic in (*self.topics, *global_topics, self.output_topic, self.changelog_topic, self.dead_letter_topic):
            self.broker.create(topic, partitions)
        self.consumer = MemoryConsumer(self.broker)
        self._ctx = KafkaTaskContext(
            self._runtime_app(app),
            self.settings,
            app.name,
            self.input_topic,
            self.output_topic,
            self.changelog_topic,
            self.dead_letter_topic,
            self.consumer,  # type: ignore[arg-type]
            Metrics(),
            wall_clock=lambda: self.now_ms,
            global_tables={name: store.view for name, store in self.global_tables.items()},
        )
        self.tasks: dict[int, KafkaTask] = {}
        for p in range(partitions):
            self._take_over(p)

    # -- input and time ------------------------------------------------------------------------------------------
    def send(
        self,
        key: Any,
        value: Any,
        *,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> list[Produced]:
        """One input record, encoded with its input's serdes (timestamp: the wall clock's now); the outputs it
        caused, including those of timers it made due. Partition: crc32(key) % partitions unless given. `topic`:
        which input (an App with several; default the first)."""
        stream = self.app.stream(topic or self.input_topic)
        return self.send_bytes(
            stream.key_serde.serialize(key),
            stream.value_serde.serialize(value),
            timestamp_ms=timestamp_ms,
            partition=partition,
            headers=headers,
            topic=stream.topic,
        )

    def update_table(
        self, name: str, key: Any, value: Any, *, timestamp_ms: int | None = None, partition: int | None = None
    ) -> list[Produced]:
        """A record of table `name` (value None: the key is deleted). A co-partitioned table's record is taken in
        timestamp order with the inputs, by the task of its partition; a global table's is read at once, as every
        instance's reader would; the outputs caused (a table's update causes none by itself)."""
        spec = self.app.table_specs.get(name) or self.app.global_table_specs[name]
        key_bytes = spec.key_serde.serialize(key)
        value_bytes = None if value is None else spec.value_serde.serialize(value)
        if name in self.global_tables:
            p = self._partition(partition, key_bytes)
            offset = self.broker.reserve(spec.topic, p)
            ts = self.now_ms if timestamp_ms is None else timestamp_ms
            self.broker.append(spec.topic, KafkaRecord(p, offset, key_bytes, value_bytes, (), ts))
            self.global_tables[name].load(key_bytes, value_bytes)
            return self._run()
        return self.send_bytes(key_bytes, value_bytes, timestamp_ms=timestamp_ms, partition=partition, topic=spec.topic)

    def send_bytes(
        self,
        key: bytes | None,
        value: bytes | None,
        *,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> list[Produced]:
        """As `send`, with the record's bytes as they are (e.g. a poison record)."""
        topic = topic or self.input_topic
        p = self._partition(partition, key)
        offset = self.broker.reserve(topic, p)
        ts = self.now_ms if timestamp_ms is None else timestamp_ms
        self.broker.append(topic, KafkaRecord(p, offset, key, value, tuple(headers), ts))
        return self._run()

    def produce(
        self,
        key: Any,
        value: Any,
        *,
        topic: str | None = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        """Appends a record to an input (or a co-partitioned table's topic) without processing it yet: several such
        records are taken in timestamp order by the next `run()` (or `send`)."""
        topic = topic or self.input_topic
        spec: Any = next((t for t in self.app.table_specs.values() if t.topic == topic), None) or self.app.stream(topic)
        key_bytes = spec.key_serde.serialize(key)
        p = self._partition(partition, key_bytes)
        ts = self.now_ms if timestamp_ms is None else timestamp_ms
        value_bytes = None if value is None else spec.value_serde.serialize(value)
        self.broker.append(topic, KafkaRecord(p, self.broker.reserve(topic, p), key_bytes, value_bytes, (), ts))

    def run(self) -> list[Produced]:
        """Processes what `produce` appended; the outputs."""
        return self._run()

    def advance_wall_clock(self, ms: int) -> list[Produced]:
        """Moves the wall clock on; the outputs of the wall-clock timers (and TTL) that became due."""
        self.now_ms += ms
        return self._run()

    # -- transactions and failures -------------------------------------------------------------------------------
    def commit(self) -> None:
        """Commits every partition's open transaction (the driver does after each call unless auto_commit=False).
        A commit that aborts (TEST_ABORT_EVERY) rewinds: the records are processed again and committed."""
        for _ in range(MAX_TURNS):
            rewound = []
            for p, task in self.tasks.items():
                if task.phase is Phase.RUNNING:
                    self._guarded(task, commit_transaction, task.txn, self.consumer)
                    # the commit may have aborted (TEST_ABORT_EVERY); mypy keeps the phase checked above
                    rewound_now = task.phase is Phase.REWINDING  # type: ignore[comparison-overlap]
                    wait = task.registry_wait  # a back-off: the next call's; a look-up: once it answers
                    answered = isinstance(wait, threading.Event) and wait.wait(REGISTRY_LOOKUP_WAIT_S)
                    waiting = wait is not None and not answered
                    if rewound_now or (self._unfetched(p) and not waiting):  # next call, that
                        rewound.append(p)
            if not rewound:
                self.stops.raise_new()  # the stops of the call ending now, once its work is done
                return
            for p in rewound:
                self._pump(p)
        raise RuntimeError(f"transactions still aborting after {MAX_TURNS} attempts")

    def deploy(self, app: App) -> None:
        """New code takes over every partition, as a deploy that stops the old processes hard: open transactions are
        lost; the state is restored from the changelog (and migrated, for a new state version)."""
        self.app = app = bound_for_tests(app, self.schema_registry)[0]
        self._ctx = replace(self._ctx, app=self._runtime_app(app))
        self.crash()

    def crash(self, partition: int | None = None) -> None:
        """The process dies: open transactions are lost. A new owner fences, reads the committed offset and restores
        the state from the committed changelog, then goes on from there."""
        for p in [partition] if partition is not None else list(self.tasks):
            try:
                self._take_over(p)
            except StateVersionError as e:  # at the restore: the runtime's process ends
                self.stops.restore_refused(p, e)
        self._run()

    # -- reading -------------------------------------------------------------------------------------------------
    @property
    def outputs(self) -> list[Produced]:
        """Committed outputs on the output topic, in (partition, offset) order."""
        return [decoded(self.app, self.output_topic, r) for r in self.broker.committed_records(self.output_topic)]

    @property
    def dead_letters(self) -> list[DeadLetter]:
        return [
            DeadLetter.from_record(r.key, r.value, list(r.headers))
            for r in self.broker.committed_records(self.dead_letter_topic)
        ]

    def state(self, partition: int = 0) -> dict[str, Any]:
        """Partition p's state as `process` sees it, decoded (timers and TTL bookkeeping not shown)."""
        state = self.tasks[self._partition(partition, None)].state
        return {key: state[key] for key in state}

    def timers(self, partition: int = 0) -> list[Timer]:
        state = self.tasks[self._partition(partition, None)].state
        return list(state.timers) if isinstance(state, TimedState) else []

    def stream_time(self, partition: int = 0) -> int | None:
        state = self.tasks[self._partition(partition, None)].state
        return state.stream_time_ms if isinstance(state, TimedState) else None

    def committed_offset(self, partition: int = 0) -> int | None:
        return self.broker.group_offsets.get((self.input_topic, partition))

    def run_data(self) -> RunData:
        """Everything committed so far, as the checker reads a real run."""

        def dump(topic: str) -> TopicDump:
            return TopicDump(topic, self.broker.committed_records(topic), self.broker.ends(topic))

        partitions = range(self.partitions)
        return RunData(
            self.input_topic,
            dump(self.input_topic),
            dump(self.output_topic),
            dump(self.dead_letter_topic),
            dump(self.changelog_topic) if self.app.stateful else None,
            {p: self.committed_offset(p) for p in partitions},
            more_inputs={topic: dump(topic) for topic in self.topics[1:]},
            more_committed={t: {p: self.broker.group_offsets.get((t, p)) for p in partitions} for t in self.topics[1:]},
            global_tables={name: dump(spec.topic) for name, spec in self.app.global_table_specs.items()},
        )

    @property
    def stopped(self) -> dict[int, PartitionStopped]:
        """The partitions stopped now, and why (a take-over starts p again)."""
        return self.stops.stopped

    def verify(self) -> Verdict:
        """The checker's verdict (pipeline verify) over everything committed so far; not ok while p is stopped."""
        self.commit()
        return self.stops.judged(check(self.app, self.run_data()))

    # -- the runner's part ---------------------------------------------------------------------------------------
    def _runtime_app(self, app: App) -> App:
        """The App the tasks run: in strict mode, its functions watched (pipeline/testing/strict.py)."""
        serde, on_timer = app.state_serde, app.on_timer
        timer = None if on_timer is None else watched(on_timer, "on_timer", serde)
        return replace(app, process=watched(app.process, "process", serde), on_timer=timer) if self.strict else app

    def _partition(self, partition: int | None, key: bytes | None) -> int:
        """The partition asked for, which must exist, or crc32(key) % partitions."""
        if partition is None:
            return zlib.crc32(key or b"") % self.partitions
        if not isinstance(partition, int) or not 0 <= partition < self.partitions:
            raise ValueError(
                f"partition {partition!r}: this driver has {self.partitions} partition(s), 0..{self.partitions - 1} "
                "(AppDriver(app, partitions=N) for more)"
            )
        return partition

    def _abort_hook(self) -> Callable[[int], bool] | None:
        every = self.settings.test_abort_every  # as the runner: abort every k-th transaction of each partition
        return (lambda n: n % every == 0) if every > 0 else None

    def _take_over(self, p: int) -> None:
        """As the runner's, with a producer per partition (PRODUCERS=per_partition)."""
        txn_id = transactional_id(self.app.name, self.input_topic, p) if self.settings.exactly_once else None
        producer = MemoryProducer(self.broker, txn_id)
        txn = Transaction(producer, self.settings, f"p{p}", self._abort_hook())  # type: ignore[arg-type]
        task = (MultiInputTask if self.app.multi_input else KafkaTask)(self._ctx, p, txn)
        txn.fence()
        committed = {t: self.broker.group_offsets.get((t, p)) for t in self.topics}
        task.start_all(committed, restore=self.app.stateful or bool(self.global_tables))
        for topic, offset in committed.items():
            self.consumer.positions[(topic, p)] = offset or 0
        self.consumer.paused.discard(p)
        self.stops.started(p)
        if task.phase is Phase.RESTORING:
            if self.app.stateful:
                end = self.broker.next_offsets[(self.changelog_topic, p)]
                task.restored(self._restore(p, committed), None, end)
                if isinstance(task, MultiInputTask):
                    task.tables_restored(*self._restore_tables(p))
            else:
                task.restored(task.state)
        self.tasks[p] = task

    def _restore(self, p: int, committed: dict[str, int | None]) -> PartitionState:
        """p's committed changelog folded (docs/guarantees.md: complete-restore: its last checkpoint must name the
        committed offsets)."""
        state, checkpoint = self._stores.fresh(p, self.app.state_serde), None
        for record in self.broker.records[(self.changelog_topic, p)]:
            if is_checkpoint(record.key, list(record.headers)):
                checkpoint = Checkpoint.decode(record.value or b"")
            else:
                state.load([((record.key or b"").decode(), record.value)])
        covered = checkpoint.covers() if checkpoint else dict.fromkeys(committed)
        if any(covered.get(topic) != offset for topic, offset in committed.items()):
            raise AssertionError(
                f"p{p}: the changelog covers input offsets {covered}, the committed offsets are "
                f"{committed}: state and offsets were not committed together"
            )
        self._stores.restored(state, self.broker.next_offsets[(self.changelog_topic, p)], checkpoint)
        return state

    def _restore_tables(self, p: int) -> tuple[dict[str, TableStore], dict[str, int]]:
        """p's co-partitioned tables, read to the end of their topics (pipeline/state/table_restore.py)."""
        stores, positions = {}, {}
        for name, spec in self.app.table_specs.items():
            store = stores[name] = TableStore(spec)
            for record in self.broker.records[(spec.topic, p)]:
                store.load(record.key, record.value)
            positions[spec.topic] = self.broker.next_offsets[(spec.topic, p)]
        return stores, positions

    def _run(self) -> list[Produced]:
        first = len(self.broker.produced)
        for p in self.tasks:
            self._pump(p)
        if self.auto_commit:
            self.commit()
        self.stops.raise_new()
        return [
            decoded(self.app, topic, record)
            for topic, record in self.broker.produced[first:]
            if topic not in (self.changelog_topic, self.dead_letter_topic)
        ]

    def _pump(self, p: int) -> None:
        """Loop turns for p, as the runner's: fetch and process, tick; until nothing is left to do."""
        task = self.tasks[p]
        wait = task.registry_wait
        if not isinstance(wait, threading.Event) or wait.wait(REGISTRY_LOOKUP_WAIT_S):
            task.end_registry_wait()  # after a schema registry fault: the driver's clock does not wait
        for _ in range(MAX_TURNS):
            if task.phase is Phase.REWINDING:
                task.try_seek_back(self.consumer)  # type: ignore[arg-type]
            if task.phase is not Phase.RUNNING:
                return
            batch = self._fetch(p)
            if batch:
                self._guarded(task, task.process, batch)
            self._guarded(task, task.tick, self.now_ms)
            state = task.state
            if not (
                batch
                or task.holding
                or task.phase is Phase.REWINDING  # type: ignore[comparison-overlap]  # process() may rewind p
                or (isinstance(state, TimedState) and state.has_due("wall", self.now_ms))
            ):
                return
        raise RuntimeError(f"p{p}: still busy after {MAX_TURNS} turns (timers scheduling due timers forever?)")

    def _fetch(self, p: int) -> list[Message]:
        """What a poll would hand task p: the records of every topic it reads, from where each stands."""
        if p in self.consumer.paused:
            return []
        fetched = []
        for topic in self.topics:
            position = self.consumer.positions[(topic, p)]
            records = self.broker.records[(topic, p)][position : position + self.settings.poll_max_records]
            if records:
                self.consumer.positions[(topic, p)] = records[-1].offset + 1
            fetched += [
                Message(
                    topic=topic,
                    partition=p,
                    offset=r.offset,
                    key=r.key,
                    value=r.value,
                    timestamp=(1, r.timestamp_ms),
                    headers=list(r.headers) or None,
                )
                for r in records
            ]
        return fetched

    def _unfetched(self, p: int) -> bool:
        """Whether any topic of p holds records not fetched yet (offsets are list indexes: nothing in an input is ever
        aborted)."""
        return any(self.consumer.positions[(t, p)] < len(self.broker.records[(t, p)]) for t in self.topics)

    def _guarded(self, task: KafkaTask, step: Callable[..., None], *args: Any) -> None:
        """As the runner's: an aborted transaction rewinds, a stop (a mistake in the code, ON_POISON=stop, a storm)
        stops p after committing what came before (raised at the call's end). A dropped partition is raised."""
        try:
            step(*args)
        except TransactionAborted:
            abort_and_rewind(task)
        except PoisonRecordStop as e:
            try:
                commit_transaction(task.txn, self.consumer)  # type: ignore[arg-type]
            except TransactionAborted:  # TEST_ABORT_EVERY: p stops at its last commit instead
                abort_and_rewind(task)
            log_stop(task.partition, task.next_offset, e)
            task.stop(str(e))
            self.consumer.paused.add(task.partition)
            self.stops.stopped_at(task.partition, task.next_offset, e)
