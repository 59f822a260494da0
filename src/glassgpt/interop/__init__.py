"""glassgpt.interop: the model and tokenizer in other formats (HF GPT-2 weights, HF and
tiktoken tokenizer files), read and written.

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
