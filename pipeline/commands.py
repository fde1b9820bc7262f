"""What every command (`pipeline run | verify | chaos | topics | acls | snapshots`) shares: the options that choose the
settings, accepted before or after the command's name; the settings themselves, read as `pipeline run` reads them
(defaults < --config file < PIPELINE_* environment < options); the names derived from them; and how a command ends:
0, or a non-zero exit code with one line on stderr naming the cause (never a traceback for a mistake of the user's
or an unreachable broker; a bug in the project keeps its traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.app import App
from pipeline.kafka.acls import Names
from pipeline.loading import AppPathError
from pipeline.settings import ConfigError, Settings

# Their defaults are filled in after parsing (complete()): a default set by a subcommand's parser would overwrite the
# value given before the command's name.
COMMON_DEFAULTS: dict[str, Any] = {"config": None, "app_id": None, "bootstrap_servers": None}
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away (`| head`)


class CommandFailed(Exception):
    """The command could not do what it was asked (exit code 1); the message is its one line on stderr."""


def log_level(text: str) -> str:
    level = text.lower()
    if level not in ("debug", "info", "warning", "error", "critical"):
        raise argparse.ArgumentTypeError(f"one of debug, info, warning, error, critical, not {text!r}")
    return level


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every command (and of the top-level one)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("settings (every command, before or after its name)")
    suppress = argparse.SUPPRESS
    group.add_argument(
        "--log-level",
        type=log_level,
        default=suppress,
        help="debug, info, warning, error (default: info for run, else warning)",
    )
    group.add_argument("--config", metavar="FILE", default=suppress, help="TOML settings file (PIPELINE_CONFIG_FILE)")
    group.add_argument(
        "--app-id",
        default=suppress,
        help="the app's id (PIPELINE_APP_ID; default: the App's name): its consumer group and internal topics",
    )
    group.add_argument("--bootstrap-servers", default=suppress, help="PIPELINE_BOOTSTRAP_SERVERS")
    return parent


def complete(args: argparse.Namespace, log_level: str = "warning") -> argparse.Namespace:
    """The common options' defaults, for those not given; `log_level`: the command's (a service logs at INFO, a
    one-shot command only what goes wrong)."""
    for name, default in {**COMMON_DEFAULTS, "log_level": log_level}.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


def settings_of(args: argparse.Namespace, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """The settings `pipeline run` would run with, given the same environment, file and options."""
    return Settings.load(args.config, env, bootstrap_servers=args.bootstrap_servers, app_id=args.app_id, **overrides)


def names_of(app: App, settings: Settings) -> Names:
    """The names `pipeline run` derives for `app` (configured with these settings: pipeline/core/configure.py)."""
    return Names(
        settings.app_id or app.name,
        app.input_topic,
        app.output_topic,
        settings.changelog_topic,
        settings.snapshot_topic,
        settings.dead_letter_topic,
        app.co_partitioned[1:],
        tuple(t.topic for t in app.global_table_specs.values()),
    )


def run_command(name: str, command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs a parsed command; its expected failures become one line on stderr and an exit code."""
    from confluent_kafka import KafkaException

    try:
        code = command(args)
        sys.stdout.flush()  # here, not at exit: a reader gone away is a BrokenPipeError we can still handle
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush writes nowhere
        return EXIT_BROKEN_PIPE
    except AppPathError as e:  # a wrong MODULE:ATTR is a typo, not a crash
        return _fail(f"{name}: {e}", 2)
    except ConfigError as e:
        return _fail(f"configuration error: {e}", 2)
    except CommandFailed as e:
        return _fail(f"{name}: {e}", 1)
    except KafkaException as e:
        return _fail(f"{name}: Kafka error: {kafka_text(e)}", 1)


def kafka_text(e: BaseException) -> str:
    """A KafkaException's error as text (its str() is the KafkaError's repr)."""
    from confluent_kafka import KafkaError

    error = e.args[0] if e.args else None
    return error.str() if isinstance(error, KafkaError) else str(e)


def _fail(line: str, code: int) -> int:
    print(line, file=sys.stderr)
    return code
