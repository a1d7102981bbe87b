"""The YAML config: which kinds of judgement exist, how each tier answers them, the rules engine.

`model` describes the file (a pydantic model, and the JSON Schema editors read);
`load` reads it (which file, YAML 1.2) and builds the `Config` the rest of the code reads.
"""

from __future__ import annotations

from dispatchq.config.imports import import_check
from dispatchq.config.load import (
    Config,
    config_error,
    config_source,
    load_config,
    parse_config,
    read_document,
)
from dispatchq.config.model import ConfigFile, config_schema

__all__ = [
    "Config",
    "ConfigFile",
    "config_error",
    "config_schema",
    "config_source",
    "import_check",
    "load_config",
    "parse_config",
    "read_document",
]
