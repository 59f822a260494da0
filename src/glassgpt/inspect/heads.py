"""Head scores: how much attention each head puts where a known mechanism would put it.

On a batch of random sequences of n tokens repeated once (t₀ … t_{n−1} t₀ … t_{n−1}), with
A the head's pattern [T_q, T_k] averaged over the batch:

    previous token   mean_{1 ≤ i < 2n}  A[i, i − 1]        (attends to the token before)
    duplicate token  mean_{n ≤ i < 2n}  A[i, i − n]        (to the earlier copy of itself)
    induction        mean_{n ≤ i < 2n}  A[i, i − n + 1]    (to the token after its earlier copy)

Each score is an average of attention weights, so it lies in [0, 1]; a head that implements
the mechanism perfectly scores 1. The first half's tokens are distinct whenever n ≤ n_vocab
(a random permutation), so the earlier copy of each token is unique.

The measurement itself (:func:`repeated_random_tokens`, :func:`pattern_scores`) lives in
:mod:`glassgpt.model.probes`, where the trainer reads the same scores during training.

Precision: the scores are in the model's dtype (float64 for a float64 model); a bfloat16 or
float16 model's patterns are averaged in float32 and its scores returned in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import as_batch, evaluating
from glassgpt.model import GPT
from glassgpt.model.probes import (
    SCORES,
    mean_patterns,
    pattern_scores,
    repeated_random_tokens,
)


@dataclass(frozen=True)
class HeadScores:
    """Each score [n_layers, n_heads]; ``tokens`` the sequences they were measured on."""

    previous_token: Tensor
    duplicate_token: Tensor
    induction: Tensor
    tokens: Tensor

    def as_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in SCORES}

    def best(self, score: str) -> tuple[int, int, float]:
        """(layer, head, value) of the highest-scoring head for ``score``."""
        if score not in SCORES:
            raise GlassError(f"unknown head score {score!r}; known: {', '.join(SCORES)}")
        s = getattr(self, score)
        flat = int(torch.argmax(s))
        layer, head = divmod(flat, s.shape[1])
        return layer, head, float(s[layer, head])


def head_scores(
    model: GPT,
    tokens: Tensor | Sequence[Sequence[int]] | None = None,
    *,
    seq_len: int | None = None,
    batch: int = 8,
    seed: int = 0,
) -> HeadScores:
    """Previous-token, duplicate-token and induction scores of every head.

    ``tokens``: repeated sequences [B, 2n] to measure on; by default ``batch`` random ones with
    n = ``seq_len`` (default min(n_ctx // 2, 32)).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=8, n_layers=2, n_heads=2))
    >>> s = head_scores(model, batch=2)
    >>> s.induction.shape, bool(((0 <= s.induction) & (s.induction <= 1)).all())
    (torch.Size([2, 2]), True)
    """
    cfg = model.config
    if tokens is None:
        n = min(cfg.n_ctx // 2, 32) if seq_len is None else seq_len
        if 2 * n > cfg.n_ctx:
            raise GlassError(
                f"seq_len={n} repeated is {2 * n} tokens, longer than the context n_ctx={cfg.n_ctx}"
            )
        tokens = repeated_random_tokens(cfg.n_vocab, n, batch, seed=seed)
    batch_tokens = torch.as_tensor(tokens, dtype=torch.long)
    if batch_tokens.ndim != 2 or batch_tokens.shape[1] % 2:
        raise GlassError(
            f"head scores need repeated sequences [batch, 2n], got {tuple(batch_tokens.shape)}"
        )
    n = batch_tokens.shape[1] // 2
    if not torch.equal(batch_tokens[:, :n], batch_tokens[:, n:]):
        raise GlassError("head scores need each sequence to be its first half repeated")
    with evaluating(model):
        pattern = mean_patterns(model, as_batch(model, batch_tokens))  # [L, H, T, T]
    scores = pattern_scores(pattern, n)
    return HeadScores(**scores, tokens=batch_tokens)
