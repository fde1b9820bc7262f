"""The database transaction that commits one partition's batch of the PostgreSQL sink; the runner
(pipeline/sinks/postgres/runner.py) decides when."""

from __future__ import annotations

import time

from pipeline.sinks.postgres.task import Fenced, PostgresTask, WriteFailed, first_line


def commit_batch(task: PostgresTask) -> None:
    """Writes p's batch in ONE database transaction, or raises Fenced / WriteFailed with nothing of it kept (then the
    task must not be used again: the runner takes p over anew, from what the tables say)."""
    if not task.batch_open:
        return
    ctx, started = task.ctx, time.monotonic()
    try:
        with task.connection() as conn, conn.transaction(), conn.cursor() as cur:
            # 1. p's offset row moves only if p's epoch is still ours (docs/guarantees.md: pg-epoch-fence): first, so
            #    that a zombie fails at once, and the row stays locked until the COMMIT (a new owner's fence waits).
            task.advance_offset(cur)
            # 2. The outputs, through the App's TableSink.
            if task.rows:
                ctx.sink.write(cur, ctx.target, task.rows)
            # 3. p's changed state keys: upserts and deletes.
            task.write_state(cur)
            # 4. The batch's dead letters.
            task.write_dead_letters(cur)
        # 5. COMMIT, leaving the block: all of it, or none of it.
    except Fenced:
        ctx.metrics.transactions.labels(task.label, "fenced").inc()
        raise
    except Exception as e:  # server gone, COMMIT outcome unknown, or the sink's statement failed
        ctx.metrics.transactions.labels(task.label, "failed").inc()
        raise WriteFailed(f"{type(e).__name__}: {first_line(e)}") from e
    ctx.metrics.commit_latency.observe(time.monotonic() - started)
    # 6. The state and the committed offset move forward.
    task.batch_committed()
