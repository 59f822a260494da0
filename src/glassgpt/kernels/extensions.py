"""Which of glassgpt's compiled extensions are built, asked one way, and hidden for tests.

    extension("_rowwise") → the module, or None (not built: no C compiler at install; or hidden)

Every kernel module takes its extension from :func:`extension`, so that :func:`hidden` can
run any kernel operation on its PyTorch fallback (``glassgpt.kernels.door``).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

EXTENSIONS = ("_gemv", "_attend", "_int8", "_int4", "_rowwise", "_flash", "_program")
_hidden: set[str] = set()


def extension(name: str) -> ModuleType | None:
    """The compiled extension ``glassgpt.kernels.<name>``, or None where it was not built
    (no C compiler at install) or is hidden."""
    if name not in EXTENSIONS:
        raise ValueError(f"unknown kernel extension {name!r}; known: {', '.join(EXTENSIONS)}")
    if name in _hidden:
        return None
    try:
        return importlib.import_module(f"glassgpt.kernels.{name}")
    except ImportError:
        return None


def built(name: str) -> bool:
    """Whether the extension ``name`` (one of :data:`EXTENSIONS`) is built and not hidden."""
    return extension(name) is not None


_warned: set[str] = set()


def warn_unbuilt(name: str, dtype: str) -> None:
    """Warn, once per extension, that ``dtype``'s products run in float32 because the
    extension ``name`` is not built (the caller's caller is named, as the seam's user)."""
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"the {dtype} kernel glassgpt.kernels.{name} is not built (installed without a C "
            f"compiler?): {dtype} products run in float32 from the same weights (same results, "
            "float32 speed)",
            RuntimeWarning,
            stacklevel=3,
        )


@contextmanager
def hidden(*names: str) -> Iterator[None]:
    """Run the block as if the extensions ``names`` were not built: every kernel module's
    reference to them reads None (and :func:`built` says False), as after an install without
    a C compiler. Not for use while another thread runs kernels."""
    for name in names:
        extension(name)  # (checks the name)
    saved: list[tuple[ModuleType, str, Any]] = []
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("glassgpt.kernels."):
            for name in names:
                value = module.__dict__.get(name)
                if isinstance(value, ModuleType):
                    saved.append((module, name, value))
                    setattr(module, name, None)
    before = set(_hidden)
    _hidden.update(names)
    try:
        yield
    finally:
        _hidden.clear()
        _hidden.update(before)
        for module, name, value in saved:
            setattr(module, name, value)
