"""Every command fails fast and loud: one line on stderr naming the cause and a non-zero exit code, argument errors as
argparse errors (exit 2), an unreachable broker as one error within CONNECT_TIMEOUT_MS with no librdkafka flood, the
settings' options before or after the command's name, every command in --help, a reader gone away (`| head`) without a
traceback, and the names `pipeline run` derives. No broker: 127.0.0.1:1 is a port nobody listens on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.commands import EXIT_BROKEN_PIPE
from pipeline.kafka.logs import LibrdkafkaLog, RateLimit

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "127.0.0.1:1"
TOTALS = "pipeline.examples.running_totals:app"
CONNECT_TIMEOUT_MS = "2000"


def pipeline(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m pipeline ...` of this checkout, in an environment without the caller's PIPELINE_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    clean |= {"PYTHONPATH": str(ROOT), "PIPELINE_CONNECT_TIMEOUT_MS": CONNECT_TIMEOUT_MS} | (env or {})
    command = [sys.executable, "-m", "pipeline", *args]
    return subprocess.run(command, cwd=ROOT, env=clean, capture_output=True, text=True, timeout=timeout)


def only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-3000:]}"
    return lines[0]


# -- argument errors: argparse's, exit 2, never a traceback ----------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "create", "x:y"],
        ["topics", "create", ":3"],
        ["topics", "create", "x:0"],
        ["topics", "create", "x:"],
        ["--log-level", "loud", "topics", "create", "x:1"],
        ["verify", TOTALS, "--log-level", "loud"],
        ["snapshots", "compact", "--app-id", "a", "--kafka", "no-equals-sign"],
    ],
    ids=["not-a-count", "no-name", "zero", "empty-count", "log-level", "log-level-after", "kafka-pair"],
)
def test_a_wrong_argument_is_one_argparse_error_with_exit_code_2(argv: list[str]) -> None:
    result = pipeline(*argv, "--bootstrap-servers", NOWHERE)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith(("pipeline", "configuration error: --kafka")), result.stderr


# -- an unreachable broker: one line, within the connect timeout, no librdkafka flood --------------------------------
COMMANDS = {
    "topics": ["topics", "create", "a:1"],
    "run": ["run", TOTALS],
    "verify": ["verify", TOTALS],
    "acls": ["acls", TOTALS, "--apply"],
    "chaos": ["chaos", TOTALS, "--faults", "sigkill"],
    "snapshots-show": ["snapshots", "show", "--app-id", "nothing"],
    "snapshots-compact": ["snapshots", "compact", "--app-id", "nothing"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unreachable_broker_is_one_line_naming_it(command: str) -> None:
    result = pipeline(*COMMANDS[command], "--bootstrap-servers", NOWHERE)

    line = only_line(result.stderr)  # no librdkafka line, no traceback
    assert result.returncode == 2
    assert line.startswith("configuration error: BOOTSTRAP_SERVERS: no cluster metadata within 2s from '127.0.0.1:1'")
    assert "Connection refused" in line and "CONNECT_TIMEOUT_MS" in line


def test_at_debug_the_librdkafka_lines_of_an_unreachable_broker_are_few_and_go_through_logging() -> None:
    result = pipeline("--log-level", "debug", "run", TOTALS, "--bootstrap-servers", NOWHERE)

    lines = result.stderr.splitlines()
    assert result.returncode == 2
    assert not [line for line in lines if line.startswith("%")], "librdkafka wrote to stderr itself"
    failures = [line for line in lines if "pipeline.librdkafka: FAIL" in line]
    assert 1 <= len(failures) <= 2, result.stderr  # once per KAFKA_LOG_INTERVAL_MS (10 s) in a 2 s check


def test_a_postgres_sink_refusal_comes_before_the_broker_check() -> None:
    env = {"PIPELINE_SINK": "postgres", "PIPELINE_POSTGRES_DSN": "postgresql://u@127.0.0.1:1/db"}
    result = pipeline("run", "pipeline.examples.windowed_totals:app", "--bootstrap-servers", NOWHERE, env=env)

    assert result.returncode == 2
    assert "Kafka-mode only" in only_line(result.stderr) and "SINK=postgres cannot run" in result.stderr


def test_librdkafka_lines_are_rate_limited_per_kind_and_say_how_many_were_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = LibrdkafkaLog(10)
    log.limit = RateLimit(10, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, "pipeline.librdkafka")
    refused = "[thrd:b/bootstrap]: b/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after {}ms)"
    for ms in range(50):  # fifty clients, or one reconnecting: each line differs only in its numbers
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", f"rdkafka#producer-{ms}", refused.format(ms))
    log.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "rdkafka#consumer-1", "Timed out 1 in-flight requests")
    now[0] = 10.5
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", refused.format(3))

    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == [logging.ERROR, logging.WARNING, logging.ERROR]
    assert messages[0][1].startswith("FAIL [rdkafka#producer-0] [thrd:b/bootstrap]")
    assert messages[2][1].endswith("(49 more like it held back since the last one shown)")


# -- options before or after the command's name; every command in --help ---------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["run", TOTALS],
        ["verify", TOTALS],
        ["chaos", TOTALS],
        ["topics", "create", "a:1"],
        ["acls", TOTALS],
        ["snapshots", "compact"],
        ["snapshots", "show"],
    ],
    ids=lambda argv: "-".join(argv[:2]).split(":")[0].replace("pipeline.examples.", ""),
)
@pytest.mark.parametrize("where", ["after", "before"])
def test_the_settings_options_are_accepted_before_and_after_the_command(argv: list[str], where: str) -> None:
    options = ["--log-level", "debug", "--config", "my.toml", "--app-id", "mine", "--bootstrap-servers", "b:9092"]
    chosen = argv[0]
    full = [*argv, *options] if where == "after" else [*options, *argv]

    args = cli.complete(cli._parser(chosen).parse_args(full))

    assert (args.log_level, args.config, args.app_id, args.bootstrap_servers) == ("debug", "my.toml", "mine", "b:9092")


def test_verify_keeps_group_id_as_the_app_id() -> None:
    args = cli.complete(cli._parser("verify").parse_args(["verify", TOTALS, "--group-id", "mine"]))
    assert args.app_id == "mine"


def test_help_lists_every_command() -> None:
    result = pipeline("--help")

    assert result.returncode == 0
    listed = result.stdout.split("positional arguments:")[1].split("options:")[0]
    for command in cli.COMMANDS:
        assert f"\n    {command} " in listed, f"{command} missing from --help:\n{result.stdout}"


# -- a reader gone away ------------------------------------------------------------------------------------------------
def test_a_reader_that_went_away_ends_the_command_quietly() -> None:
    """`pipeline acls ... | head -1`: the pipe is closed before the command writes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")} | {"PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "acls", TOTALS],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read()

    assert process.wait(60) == EXIT_BROKEN_PIPE, stderr
    assert stderr == ""


# -- the names pipeline run derives --------------------------------------------------------------------------------
def test_acls_derive_the_names_pipeline_run_derives() -> None:
    env = {"PIPELINE_APP_ID": "desk-7", "PIPELINE_TOPIC_SUFFIX": "-staging"}
    result = pipeline("acls", TOTALS, env=env)

    assert result.returncode == 0, result.stderr
    assert "--topic totals-input-staging" in result.stdout and "--topic totals-output-staging" in result.stdout
    assert "--topic desk-7-changelog\n" in result.stdout and "--group desk-7\n" in result.stdout
    assert "# User:desk-7-compaction: snapshots compact --app-id desk-7" in result.stdout


def test_snapshots_need_an_app_id_and_read_it_from_the_settings() -> None:
    missing = pipeline("snapshots", "show", "--bootstrap-servers", NOWHERE)
    named = pipeline("snapshots", "show", env={"PIPELINE_APP_ID": "desk-7", "PIPELINE_BOOTSTRAP_SERVERS": NOWHERE})

    assert missing.returncode == 2 and only_line(missing.stderr).startswith("configuration error: APP_ID is empty")
    assert named.returncode == 2 and "BOOTSTRAP_SERVERS" in only_line(named.stderr)  # got as far as the broker
