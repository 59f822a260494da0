"""glassgpt.model: the GPT function, tokens → logits, as pure math (no I/O, no globals)."""

from glassgpt.model.config import GPTConfig

__all__ = ["GPTConfig"]
