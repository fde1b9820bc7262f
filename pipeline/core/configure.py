"""The App as the settings make it: the one place where App and Settings meet, used by both runners and by every
command that names the App's topics (`pipeline verify`, `chaos`, `acls`), so that they all derive the same names."""

from __future__ import annotations

from pipeline.app import App
from pipeline.registry import uses_registry
from pipeline.settings import ConfigError, Settings


def configured(app: App, settings: Settings) -> App:
    """`app` with TOPIC_SUFFIX, INPUT_TOPIC and OUTPUT_TOPIC applied, and its registry serdes (Avro, Protobuf, JSON
    Schema) bound to their topics and SCHEMA_REGISTRY_URL's client (no request yet: pipeline/registry.py); ConfigError
    naming the setting that does not fit the App."""
    try:
        app = app.configured(settings.topic_suffix, settings.input_topic, settings.output_topic)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if uses_registry(app):
        from pipeline.registry import bind_from_settings

        app = bind_from_settings(app, settings)
    return app
