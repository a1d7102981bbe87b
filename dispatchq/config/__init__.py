"""The YAML config: which kinds of judgement exist, how each tier answers them, the rules
engine, and the credentials sessions may run under.

`model` describes the file (a pydantic model, and the JSON Schema editors read);
`load` reads it (which file, YAML 1.2) and builds the `Config` the rest of the code reads;
`credentials` checks, on the machine that runs sessions, that each credential's file reads.
"""

from __future__ import annotations

from dispatchq.config.credentials import credential_file_problems
from dispatchq.config.imports import import_check
from dispatchq.config.load import (
    Config,
    config_error,
    config_source,
    kind_digest,
    load_config,
    load_pool,
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
    "credential_file_problems",
    "import_check",
    "kind_digest",
    "load_config",
    "load_pool",
    "parse_config",
    "read_document",
]
