"""The installed `pipeline` command finds the user's module the way `python -m` does (the current directory first),
and a wrong MODULE:ATTR is one line on stderr and exit code 2, never a traceback. No broker needed: each command is
stopped right after loading the App by something that needs none (a missing config file, an App without
`generate`, a broker port nobody listens on)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.loading import AppPathError, NotAnApp, load_app

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / ".venv" / "bin" / "pipeline"  # the console script `pip install` wrote, not `python -m pipeline`

# README, "Your own logic": the running-totals service as a user writes it, next to where they run `pipeline`.
MY_SERVICE = """\
from pipeline.app import App, Output

def process(state, record):
    count, total = state.get(record.key, (0, 0))
    state[record.key] = (count + 1, total + record.value["amount"])
    return [Output(key=record.key, value={"count": count + 1, "sum": total + record.value["amount"]})]

app = App(name="running-totals", input_topic="totals-input", output_topic="totals-output", process=process)
"""


@pytest.fixture
def service_dir(tmp_path: Path) -> Path:
    (tmp_path / "my_service.py").write_text(MY_SERVICE)
    return tmp_path


def pipeline(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Nothing that would put the current directory on sys.path for us: the command must do it itself.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_") and k != "PYTHONPATH"}
    return subprocess.run([str(PIPELINE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    return lines[0]


@pytest.fixture(autouse=True)
def installed() -> None:
    if not PIPELINE.exists():
        pytest.skip(f"{PIPELINE} not installed (pip install -e .)")


# -- the module in the current directory is found -------------------------------------------------------------------
def test_run_finds_my_service_in_the_current_directory(service_dir: Path) -> None:
    result = pipeline(service_dir, "run", "my_service:app", "--config", "missing.toml")

    assert (result.returncode, only_line(result.stderr)) == (
        2,
        "configuration error: CONFIG_FILE missing.toml: [Errno 2] No such file or directory: 'missing.toml'",
    )


def test_chaos_finds_my_service_in_the_current_directory(service_dir: Path) -> None:
    result = pipeline(service_dir, "chaos", "my_service:app")

    assert result.returncode == 1
    assert only_line(result.stderr).startswith("running-totals: the App has no `generate`")


def test_verify_finds_my_service_in_the_current_directory(service_dir: Path) -> None:
    result = pipeline(
        service_dir, "verify", "my_service:app", "--bootstrap-servers", f"127.0.0.1:{closed_port()}", "--timeout", "1"
    )

    assert result.returncode == 2
    assert "configuration error: BOOTSTRAP_SERVERS: no cluster metadata" in result.stderr  # asked the broker
    assert "my_service" not in result.stderr and "Traceback" not in result.stderr


# -- a wrong MODULE:ATTR: one line, exit 2 ---------------------------------------------------------------------------
WRONG_PATHS = {
    "nosuchmodule:app": r"'nosuchmodule:app': no module named 'nosuchmodule'",
    "my_service": r"expected MODULE:ATTR .*got 'my_service'",
    "my_service:nope": r"'my_service:nope': my_service has no attribute 'nope'",
    "my_service:process": r"'my_service:process' is a function, not a pipeline\.app\.App",
}


@pytest.mark.parametrize("command", ["run", "verify", "chaos"])
@pytest.mark.parametrize("spec", sorted(WRONG_PATHS))
def test_a_wrong_app_path_is_one_line_and_exit_code_2(service_dir: Path, command: str, spec: str) -> None:
    result = pipeline(service_dir, command, spec)

    line = only_line(result.stderr)
    assert result.returncode == 2, result.stderr
    assert line.startswith(f"pipeline {command}: ")
    assert re.search(WRONG_PATHS[spec], line), line
    assert "Traceback" not in result.stderr


# -- load_app itself ------------------------------------------------------------------------------------------------
def test_load_app_looks_in_the_current_directory_first(service_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(service_dir)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.curdir, str(service_dir))])
    monkeypatch.delitem(sys.modules, "my_service", raising=False)

    app = load_app("my_service:app")

    assert app.name == "running-totals"
    assert sys.path[0] == str(service_dir)
    load_app("my_service:app")
    assert sys.path.count(str(service_dir)) == 1  # once, however often an App is loaded
    del sys.modules["my_service"]


def test_load_app_errors_are_app_path_errors_but_a_missing_dependency_keeps_its_traceback(
    service_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (service_dir / "needs_more.py").write_text("import no_such_dependency_of_the_service\n")
    monkeypatch.chdir(service_dir)
    monkeypatch.setattr(sys, "path", list(sys.path))

    with pytest.raises(AppPathError, match="no module named 'no_such_package'"):
        load_app("no_such_package.service:app")
    with pytest.raises(NotAnApp):
        load_app("pipeline.examples.running_totals:process")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_the_service") as raised:
        load_app("needs_more:app")
    assert not isinstance(raised.value, AppPathError)


def test_chaos_finds_the_local_cluster_script_of_the_checkout() -> None:
    from pipeline.testing import chaos

    assert chaos.KAFKA_SH == ROOT / "deploy" / "local" / "kafka.sh"
