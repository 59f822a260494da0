"""The held-out perplexity of a model as it decodes: every logit computed by the decoding
kernels (one id a step on a KV cache), which whole-window perplexity never reaches.

    ppl = exp(−1/N Σ_t log p(x_{t+1} | x_≤t))      each p from a one-token step
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from glassgpt.errors import GlassError
from glassgpt.model import GPT
from glassgpt.sample.cache import KVCache


def decoded_perplexity(model: GPT, ids: torch.Tensor, L: int = 64, rows: int = 8) -> float:
    """exp(mean next-token cross-entropy) over windows of L ids, each decoded one id a step
    on a KV cache, ``rows`` windows at a time: every product has ≤ 8 rows of x, so a packed
    copy's decoding kernels (int8, int4, bf16 panels) compute every logit
    (``glassgpt.model.precision.perplexity`` runs whole windows, whose products take the
    float32 path)."""
    n = (ids.numel() - 1) // L
    if n < 1:
        raise GlassError(f"need more than {L} tokens to measure perplexity, got {ids.numel()}")
    x, y = ids[: n * L].view(n, L), ids[1 : n * L + 1].view(n, L)
    nll = 0.0
    with torch.inference_mode():
        for i in range(0, n, rows):
            cache = KVCache.for_model(model, x[i : i + rows].shape[0], L)
            for t in range(L):
                z = model(x[i : i + rows, t : t + 1], cache=cache)[:, 0].float()
                nll += float(F.cross_entropy(z, y[i : i + rows, t], reduction="sum"))
    return math.exp(nll / (n * L))
