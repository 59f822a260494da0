"""Versioned JSON documents: ``{"format": NAME, "version": N, ...}``.

A checkpoint's ``state.json``, a data folder's ``meta.json`` and a tokenizer file each name
their format and its version, and a reader accepts only the version it knows. The check is
written once here; each reader parses its file and words its errors.
"""

from __future__ import annotations

from typing import Any

from glassgpt.errors import GlassError, InputFileError


def check_format(
    doc: Any,
    source: object,
    name: str,
    version: int,
    *,
    what: str,
    not_ours: str,
    error: type[GlassError] = InputFileError,
) -> dict[str, Any]:
    """``doc`` if it is a JSON object of format ``name`` at ``version``; else ``error``.

    The messages start with ``source`` (the file): ``not_ours`` when the format is another,
    and ``"<what> version V is not supported"`` when the version is.

    >>> check_format({"format": "f", "version": 2}, "x.json", "f", 1, what="f format",
    ...              not_ours="not an f file")
    Traceback (most recent call last):
    ...
    glassgpt.errors.InputFileError: x.json: f format version 2 is not supported (this glassgpt reads version 1)
    """
    if not isinstance(doc, dict) or doc.get("format") != name:
        raise error(f"{source}: {not_ours}")
    if doc.get("version") != version:
        raise error(
            f"{source}: {what} version {doc.get('version')!r} is not supported "
            f"(this glassgpt reads version {version})"
        )
    return doc
