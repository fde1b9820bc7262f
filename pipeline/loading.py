"""Finding an `App` by import path ("module:attr"), as the command line names it."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from pipeline.app import App


class AppPathError(ValueError):
    """MODULE:ATTR names no App: malformed, no such module, no such attribute. A typo, not a crash: the command
    line prints it as one line and exits 2."""


class NotAnApp(AppPathError, TypeError):
    """MODULE:ATTR names something that is not a pipeline.app.App."""


def load_app(spec: str) -> App:
    """The App at `spec` = "package.module:attribute" (the attribute may be dotted: "module:holder.app"). The module
    is looked for as `python -m` looks: the current directory first, then sys.path."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise AppPathError(f"expected MODULE:ATTR (e.g. pipeline.examples.running_totals:app), got {spec!r}")
    obj: object = _import_user_module(module_name, spec)
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as e:
            raise AppPathError(f"{spec!r}: {module_name} has no attribute {attr_path!r}") from e
    if not isinstance(obj, App):
        raise NotAnApp(f"{spec!r} is a {type(obj).__name__}, not a pipeline.app.App")
    return obj


def _import_user_module(module_name: str, spec: str) -> ModuleType:
    _current_directory_first()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(f"{e.name}.")):
            raise  # the module is there but imports something missing: its traceback says where
        raise AppPathError(
            f"{spec!r}: no module named {e.name!r} (looked in the current directory, then sys.path)"
        ) from e


def _current_directory_first() -> None:
    """`python -m pipeline run my_service:app` finds my_service.py in the current directory because `python -m`
    puts that directory first on sys.path. The `pipeline` console script does not (its sys.path[0] is the script's
    own directory), so the same command failed there: do what `python -m` does."""
    here = os.getcwd()
    if not sys.path or os.path.abspath(sys.path[0] or os.curdir) != here:
        sys.path.insert(0, here)
