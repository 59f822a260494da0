"""Small stand-ins for the trainer's collaborators: a language model and a batch source.

The trainer promises to work with any ``model(x, y) -> (logits, loss)`` and any iterator of
(x, y) batches with ``state_dict``; these are the smallest such things, written here so the
trainer's tests do not depend on glassgpt.model or glassgpt.data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class TinyLM(nn.Module):
    """logits = dropout(E[x] + P[pos]) W + b: a bigram model with positions and dropout."""

    def __init__(self, n_vocab: int = 16, d: int = 8, n_ctx: int = 16, dropout: float = 0.1):
        super().__init__()
        self.E = nn.Parameter(torch.randn(n_vocab, d) * 0.1)
        self.P = nn.Parameter(torch.randn(n_ctx, d) * 0.1)
        self.W = nn.Parameter(torch.randn(d, n_vocab) * 0.1)
        self.b = nn.Parameter(torch.zeros(n_vocab))
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.drop(self.E[x] + self.P[: x.shape[1]])
        logits = h @ self.W + self.b
        loss = None
        if y is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)
        return logits, loss


class WindowSampler:
    """Random windows of a token array, from a seeded PCG64 stream with a restorable state.

    With ``world_size`` W it draws the global batch's offsets and keeps rows rank::W, so W
    ranks together see exactly the single-process batch.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.tokens = tokens
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.rng.integers(0, len(self.tokens) - self.seq_len - 1, self.batch_size)
        starts = starts[self.rank :: self.world_size]
        x = np.stack([self.tokens[s : s + self.seq_len] for s in starts])
        y = np.stack([self.tokens[s + 1 : s + 1 + self.seq_len] for s in starts])
        return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


def markov_tokens(n: int, n_vocab: int = 16, seed: int = 0) -> np.ndarray:
    """A token stream with learnable structure: t+1 = (t + 1) mod V with probability 0.9."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    out[0] = 0
    noise = rng.integers(0, n_vocab, n)
    keep = rng.random(n) < 0.9
    for i in range(1, n):
        out[i] = (out[i - 1] + 1) % n_vocab if keep[i] else noise[i]
    return out
