"""glassgpt.model: the GPT function, tokens → logits, as pure math (no I/O, no globals)."""

from __future__ import annotations

from glassgpt.model.config import GPTConfig
from glassgpt.model.gpt import GPT, TokenError

__all__ = ["GPT", "GPTConfig", "TokenError"]
