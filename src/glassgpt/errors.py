"""Errors that reach the user as one line.

Every problem caused by the user's input (files, config values, checkpoints, prompts, ids)
raises a :class:`GlassError` whose message names the problem; the CLI prints it as
``glassgpt: error: <message>`` and exits non-zero, never with a traceback.
"""

from __future__ import annotations


class GlassError(Exception):
    """A problem with the user's input, described in one line."""


class ConfigError(GlassError, ValueError):
    """An invalid configuration value; the message starts with the field's name.

    >>> str(ConfigError("model.n_heads", "must divide d_model=10, got 3"))
    'model.n_heads: must divide d_model=10, got 3'
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class InputFileError(GlassError, OSError):
    """A missing, empty, unreadable or non-UTF-8 input file; the message names the file."""
