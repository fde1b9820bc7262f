"""Finding an `App` by import path ("module:attr"), as the command line names it."""

from __future__ import annotations

import importlib

from pipeline.app import App


def load_app(spec: str) -> App:
    """The App at `spec` = "package.module:attribute" (the attribute may be dotted: "module:holder.app")."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"expected MODULE:ATTR (e.g. pipeline.examples.running_totals:app), got {spec!r}")
    obj: object = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as e:
            raise ValueError(f"{spec!r}: {module_name} has no attribute {attr_path!r}") from e
    if not isinstance(obj, App):
        raise TypeError(f"{spec!r} is a {type(obj).__name__}, not a pipeline.app.App")
    return obj
