"""Head scores: how much attention each head puts where a known mechanism would put it.

On a batch of random sequences of n tokens repeated once (t₀ … t_{n−1} t₀ … t_{n−1}), with
A the head's pattern [T_q, T_k] averaged over the batch:

    previous token   mean_{1 ≤ i < 2n}  A[i, i − 1]        (attends to the token before)
    duplicate token  mean_{n ≤ i < 2n}  A[i, i − n]        (to the earlier copy of itself)
    induction        mean_{n ≤ i < 2n}  A[i, i − n + 1]    (to the token after its earlier copy)

Each score is an average of attention weights, so it lies in [0, 1]; a head that implements
the mechanism perfectly scores 1. The first half's tokens are distinct whenever n ≤ n_vocab
(a random permutation), so the earlier copy of each token is unique.

Precision: the scores are in the model's dtype (float64 for a float64 model); a bfloat16 or
float16 model's patterns are averaged in float32 and its scores returned in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import evaluating, run_with_cache
from glassgpt.inspect.factored import widened
from glassgpt.model import GPT

SCORES = ("previous_token", "duplicate_token", "induction")


def repeated_random_tokens(
    n_vocab: int, seq_len: int, batch: int = 8, *, seed: int = 0, low: int = 0
) -> Tensor:
    """[batch, 2 · seq_len] random ids in [low, n_vocab), each row's first half repeated.

    >>> t = repeated_random_tokens(50, 4, batch=2, seed=1)
    >>> t.shape, bool((t[:, :4] == t[:, 4:]).all())
    (torch.Size([2, 8]), True)
    """
    span = n_vocab - low
    if seq_len < 2 or batch < 1 or span < 2:
        raise GlassError(
            f"repeated sequences need seq_len ≥ 2, batch ≥ 1 and ≥ 2 ids; got seq_len={seq_len}, "
            f"batch={batch}, ids {low}..{n_vocab - 1}"
        )
    gen = torch.Generator().manual_seed(seed)
    if seq_len <= span:
        half = torch.stack([torch.randperm(span, generator=gen)[:seq_len] for _ in range(batch)])
    else:
        half = torch.randint(0, span, (batch, seq_len), generator=gen)
    half = half + low
    return torch.cat([half, half], dim=1)


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


def pattern_scores(pattern: Tensor, seq_len: int) -> dict[str, Tensor]:
    """The three scores from patterns [..., T, T] of repeated sequences (T = 2 · seq_len) → [...]."""
    T = pattern.shape[-1]
    if 2 * seq_len != T:
        raise GlassError(f"patterns of length {T} are not a sequence of {seq_len} repeated")
    prev = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # [..., T − 1]
    dup = pattern.diagonal(offset=-seq_len, dim1=-2, dim2=-1)  # [..., seq_len]
    ind = pattern.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)[..., 1:]  # query i ≥ seq_len
    return {
        "previous_token": prev.mean(-1),
        "duplicate_token": dup.mean(-1),
        "induction": ind.mean(-1),
    }


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
        _, cache = run_with_cache(model, batch_tokens, "pattern")
    pattern = widened(cache.stack("pattern")).mean(1)  # [L, H, T, T]
    scores = pattern_scores(pattern, n)
    return HeadScores(**scores, tokens=batch_tokens)
