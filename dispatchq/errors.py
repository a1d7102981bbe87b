"""The exceptions dispatchq raises on purpose.

A `UserError` is a mistake in what a person or producer gave us (bad JSON, an unknown
kind, a path outside the checkout roots). The CLI prints it as one line and exits 2;
it is never shown as a traceback. Everything else is a bug or an outage.
"""

from __future__ import annotations


class DispatchqError(Exception):
    """Base class for errors dispatchq raises deliberately."""


class UserError(DispatchqError):
    """Bad input: say what was wrong, in one line, and do nothing else."""


class ConfigError(UserError):
    """The config file is invalid; the message names the kind/section and the field."""


class SettingsError(UserError):
    """An environment setting is invalid; the message names the variable."""
