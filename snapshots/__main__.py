"""`python -m snapshots`: the `snapshots` command with the interpreter that has the package (Airflow's DAG uses it)."""

import sys

from snapshots.cli import main

sys.exit(main())
