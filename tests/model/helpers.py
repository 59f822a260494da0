"""Shared helpers for the model tests: tiny configs and randomised parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from glassgpt.model import GPT, GPTConfig

TINY: dict[str, Any] = {
    "n_vocab": 13,
    "n_ctx": 8,
    "d_model": 8,
    "n_layers": 2,
    "n_heads": 2,
    "d_mlp": 12,
    "unembed_bias": True,  # every parameter, b_U too (the default has none, as GPT-2)
}


def tiny_config(**overrides: Any) -> GPTConfig:
    return GPTConfig(**{**TINY, **overrides})


def random_model(config: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float64) -> GPT:
    """A GPT whose every parameter (biases and norm weights too) is random and O(1),
    so that each term of the math shows in the logits."""
    torch.manual_seed(seed)
    model = GPT(config).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if name.endswith((".w",)) else 0.4
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
            p.copy_((1.0 if name.endswith(".w") else 0.0) + scale * noise)
    return model.eval()


def numpy_weights(model: GPT) -> dict[str, np.ndarray]:
    return {k: v.detach().to(torch.float64).numpy() for k, v in model.state_dict().items()}


def random_tokens(config: GPTConfig, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.n_vocab, (batch, length), generator=gen)
