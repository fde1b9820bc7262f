"""What both sinks share, and nothing of either: how one input partition is owned and processed.

lifecycle.py    the phases of an owned partition and the one table of moves between them
task.py         Task: per-partition bookkeeping (position, batch, retries) that both sinks' tasks build on
processing.py   a record that fails: undo, back off, try again, then dead-letter or stop (no-silent-skip)
timers.py       due timers fired into the open batch, like records
deadletter.py   the dead-letter record and topic name
provenance.py   the headers that tie every output to the input record (or timer) it came from
loop.py         PollLoop: subscribe, poll, rebalance callbacks, health; the shell of both runners
queries.py      answers to queries of committed state (QUERY_ENABLED) on the health port
"""
