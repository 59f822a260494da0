"""glassgpt.interop: the model and tokenizer from their files: glassgpt's checkpoints
(:mod:`glassgpt.interop.loading`, behind ``glassgpt.load``) and other formats of the same
objects (HF GPT-2 weights, tokenizer files). The stage just below ``model``, so that
``train``, ``sample``, ``inspect`` and ``serve`` all load models from here.

``from_hf(folder_or_model) -> GPT`` and ``to_hf(model, folder)`` load lazily, so importing
this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassgpt.interop.hf_gpt2 import from_hf, to_hf

__all__ = ["from_hf", "to_hf"]


def __getattr__(name: str) -> Any:
    if name in ("from_hf", "to_hf"):
        from glassgpt.interop import hf_gpt2

        return getattr(hf_gpt2, name)
    raise AttributeError(f"module 'glassgpt.interop' has no attribute {name!r}")
