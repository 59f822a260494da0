"""glassgpt.model: the GPT function, tokens → logits, as pure math (no I/O, no globals).

``GPTConfig`` is light; ``GPT`` (and torch) load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glassgpt.model.config import GPTConfig

if TYPE_CHECKING:
    from glassgpt.model.gpt import GPT, TokenError

__all__ = ["GPT", "GPTConfig", "TokenError"]


def __getattr__(name: str) -> Any:
    if name in ("GPT", "TokenError"):
        from glassgpt.model import gpt

        return getattr(gpt, name)
    raise AttributeError(f"module 'glassgpt.model' has no attribute {name!r}")
