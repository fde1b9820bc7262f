"""`pipeline chaos` with the PostgreSQL sink, CI-sized: the process faults against running_totals_pg, each run judged
by the table checker (docs/guarantees.md: pg-epoch-fence)."""

from __future__ import annotations

import pytest

from pipeline.testing import chaos

pytestmark = pytest.mark.postgres
FAULTS = ["sigkill", "sigterm", "zombie", "scale"]


def test_chaos_command_with_the_postgres_sink_gives_a_clean_table_verdict(
    kafka_bootstrap, postgres_dsn, tmp_path, capsys
):
    exit_code = chaos.main(
        [
            "pipeline.examples.running_totals_pg:app",
            "--sink",
            "postgres",
            "--dsn",
            postgres_dsn,
            "--bootstrap-servers",
            kafka_bootstrap,
            "--log-dir",
            str(tmp_path),
            "--seed",
            "3",
            "--faults",
            ",".join(FAULTS),
        ]
    )
    table = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()[1]
        for line in table.splitlines()
        if line.split()[:1] in [[name] for name in FAULTS]
    }
    assert rows == dict.fromkeys(FAULTS, "OK"), table
    assert exit_code == 0
