"""glassgpt.sample: from logits to text — x_{t+1} ~ softmax(f_θ(x_≤t)_t / T), with a KV cache.

    model, tok = glassgpt.load(path)
    ids = glassgpt.sample.generate(model, tok.encode("To be"), max_new_tokens=50, top_p=0.9)
    for t in glassgpt.sample.stream(model, tok.encode("To be"), temperature=0.8): ...

Importing this package is cheap; torch loads on first use of a function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassgpt.sample.cache import KVCache
    from glassgpt.sample.filters import SamplingConfig
    from glassgpt.sample.generation import GenerationConfig, generate, stream

__all__ = ["GenerationConfig", "KVCache", "SamplingConfig", "generate", "stream"]

_HOMES = {
    "KVCache": "glassgpt.sample.cache",
    "SamplingConfig": "glassgpt.sample.filters",
    "GenerationConfig": "glassgpt.sample.generation",
    "generate": "glassgpt.sample.generation",
    "stream": "glassgpt.sample.generation",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'glassgpt.sample' has no attribute {name!r}")
