"""`pipeline chaos` on the copier (the process fault tests cover running_totals): every fault kind, CI-sized."""

from __future__ import annotations

from pipeline.testing import chaos, faults


def test_chaos_command_gives_a_clean_verdict_for_every_process_fault(kafka_bootstrap, tmp_path, capsys):
    exit_code = chaos.main(
        [
            "pipeline.examples.copier:app",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--log-dir",
            str(tmp_path),
            "--seed",
            "3",
        ]
    )
    table = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()[1]
        for line in table.splitlines()
        if line.split()[:1] in [[name] for name in faults.PROCESS_FAULTS]
    }
    assert rows == dict.fromkeys(faults.PROCESS_FAULTS, "OK"), table
    assert exit_code == 0
