"""glassgpt.sample: from logits to text — x_{t+1} ~ softmax(f_θ(x_≤t)_t / T), with a KV cache.

model, tok = glassgpt.load(path)
ids = glassgpt.sample.generate(model, tok.encode("To be"), max_new_tokens=50, top_p=0.9)
for t in glassgpt.sample.stream(model, tok.encode("To be"), temperature=0.8): ...
"""

from __future__ import annotations

from glassgpt.sample.cache import KVCache
from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.generation import GenerationConfig, generate, stream

__all__ = ["GenerationConfig", "KVCache", "SamplingConfig", "generate", "stream"]
