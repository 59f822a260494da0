"""From logits to the next-token distribution: penalties, temperature, truncation.

For logits z ∈ ℝ^V of one sequence, with c_i the count of token i in the context so far:

    repetition (CTRL):   z_i ← z_i / r  if z_i > 0 else z_i · r        (for every i with c_i > 0)
    frequency, presence: z_i ← z_i − f · c_i − a · [c_i > 0]
    logit bias:          z_i ← z_i + β_i
    temperature:         p = softmax(z / T)                             (T → 0: argmax, greedy)
    top-k:               keep the k largest z_i (ties with the k-th kept too)
    top-p (nucleus):     sort p descending, keep the shortest prefix whose mass reaches p_top
                         (a token is kept iff the mass strictly before it is < p_top)
    min-p:               keep tokens with p_i ≥ min_p · max_j p_j
    then renormalise over the kept tokens, and draw.

Removed tokens get logit −∞, so softmax gives them probability 0 and the survivors keep
their ratios. The draw is the inverse CDF of one uniform number u ∈ [0, 1): the first
token whose cumulative mass exceeds u · total. u comes from ``sample.rows.uniforms``, a
counter-based generator of the row's seed and how many tokens it has drawn, so a row's
samples do not depend on the other rows of a batch. ``sample.rows`` applies all of this to
a batch whose rows have different settings, as tensors over the batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    """The controls of the next-token distribution; validated (errors name the field).

    >>> SamplingConfig(top_p=1.5)
    Traceback (most recent call last):
    ...
    glassgpt.errors.ConfigError: top_p: must be in (0, 1], got 1.5
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Any = ()  # {id: β} or ((id, β), …); kept as sorted pairs (hashable)

    def __post_init__(self) -> None:
        t = self.temperature
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ConfigError("temperature", f"must be a finite number ≥ 0 (0 = greedy), got {t!r}")
        k = self.top_k
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ConfigError("top_k", f"must be an integer ≥ 1, got {k!r}")
        for name in ("top_p", "min_p"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0.0 < v <= 1.0):
                raise ConfigError(name, f"must be in (0, 1], got {v!r}")
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ConfigError("repetition_penalty", f"must be > 0 (1 = off), got {r!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            f = getattr(self, name)
            if not (isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f)):
                raise ConfigError(name, f"must be a finite number (0 = off), got {f!r}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """Whether the logits depend on the token counts."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


def _bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    """{id: β} (or pairs) as sorted (id, β) pairs; raises naming logit_bias.

    >>> _bias_pairs({3: -100, 1: 2.5})
    ((1, 2.5), (3, -100.0))
    """
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        pairs = sorted((i, float(b)) for i, b in items)
    except (TypeError, ValueError):
        raise ConfigError("logit_bias", f"must map token ids to numbers, got {bias!r}") from None
    for i, b in pairs:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0 or not math.isfinite(b):
            raise ConfigError("logit_bias", f"must map token ids ≥ 0 to finite numbers, got {i!r}: {b!r}")  # fmt: skip
    return tuple(pairs)


def apply_penalties(
    logits: Tensor, counts: Tensor, repetition: float, frequency: float, presence: float = 0.0
) -> Tensor:
    """Repetition, frequency and presence penalties; logits [B, V] float, counts [B, V].

    >>> z = torch.tensor([[2.0, -2.0, 1.0]])
    >>> apply_penalties(z, torch.tensor([[1, 1, 0]]), repetition=2.0, frequency=0.5).tolist()
    [[0.5, -4.5, 1.0]]
    """
    out = logits
    if repetition != 1.0:
        seen = counts > 0
        penalised = torch.where(out > 0, out / repetition, out * repetition)
        out = torch.where(seen, penalised, out)
    if frequency != 0.0:
        out = out - frequency * counts.to(out.dtype)
    if presence != 0.0:
        out = out - presence * (counts > 0).to(out.dtype)
    return out


def apply_bias(logits: Tensor, bias: tuple[tuple[int, float], ...]) -> Tensor:
    """logits [B, V] with β_i added to column i for each (i, β_i) of ``bias``.

    >>> apply_bias(torch.zeros(1, 3), ((2, -1.5),)).tolist()
    [[0.0, 0.0, -1.5]]
    """
    if not bias:
        return logits
    ids = [i for i, _ in bias]
    if max(ids) >= logits.shape[-1]:
        raise ConfigError("logit_bias", f"token id {max(ids)} is out of range [0, {logits.shape[-1]})")  # fmt: skip
    row = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    row[ids] = torch.tensor([b for _, b in bias], dtype=logits.dtype, device=logits.device)
    return logits + row


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (and any tied with the k-th); the rest → −∞.

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    if k >= logits.shape[-1]:
        return logits
    if logits.ndim == 2 and k > 0:  # the same bits by the compiled heap (no torch.topk)
        filled = kernels.top_k_fill(logits, torch.full(logits.shape[:1], k))
        if filled is not None:
            return filled
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus: keep the most probable tokens until their mass reaches p; the rest → −∞.

    >>> z = torch.log(torch.tensor([[0.1, 0.5, 0.15, 0.25]]))
    >>> torch.isfinite(top_p_filter(z, 0.7)).tolist()   # 0.5 + 0.25 ≥ 0.7
    [[False, True, False, True]]
    """
    if p >= 1.0:
        return logits
    probs = torch.softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    rows = probs.reshape(-1, probs.shape[-1])
    # p in the probabilities' dtype: what comparing them with the Python float p does
    each = torch.full(rows.shape[:1], p, dtype=probs.dtype, device=probs.device)
    return logits.masked_fill(top_p_drop(rows, each).view(probs.shape), float("-inf"))


def top_p_drop(probs: Tensor, p: Tensor) -> Tensor:
    """The tokens top-p drops [B, V] (bool) from probabilities [B, V] and each row's p_b [B]
    (in the probabilities' dtype): sort a row descending (ties in index order), and drop a
    token where the mass before it, cumsum − itself, is ≥ p_b.

    The first token has 0 before it and is always kept. A float32 row on a CPU takes the
    compiled kernel (``kernels.top_p_drop``: the same bits, without sorting the
    vocabulary); anything else PyTorch's sort (:func:`sorted_drop`).

    >>> top_p_drop(torch.tensor([[0.1, 0.5, 0.15, 0.25]]), torch.tensor([0.7])).tolist()
    [[True, False, True, False]]
    """
    drop = kernels.top_p_drop(probs, p)
    return sorted_drop(probs, p) if drop is None else drop


def sorted_drop(probs: Tensor, p: Tensor) -> Tensor:
    """:func:`top_p_drop` by PyTorch's sort of each row (any dtype or device)."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
    return torch.zeros_like(before, dtype=torch.bool).scatter_(-1, order, before >= p[:, None])


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the largest; the rest → −∞.

    >>> z = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    >>> torch.isfinite(min_p_filter(z, 0.4)).tolist()   # threshold 0.24
    [[True, True, False]]
    """
    # p_i ≥ min_p · p_max  ⇔  z_i − z_max ≥ log(min_p)  (the softmax normaliser cancels)
    z_max = logits.max(dim=-1, keepdim=True).values
    return logits.masked_fill(logits - z_max < math.log(min_p), float("-inf"))


def next_token_logits(logits: Tensor, cfg: SamplingConfig, counts: Tensor | None = None) -> Tensor:
    """The processed logits [B, V] (float32): penalties, logit bias, temperature, top-k,
    top-p, min-p (one setting for every row; ``sample.rows`` takes one per row).

    softmax of the result is the distribution that ``draw`` samples. With temperature 0 only
    the penalties are applied (the caller takes the argmax).
    """
    z = logits.float()
    if cfg.penalised and counts is not None:
        z = apply_penalties(z, counts, cfg.repetition_penalty, cfg.frequency_penalty,
                            cfg.presence_penalty)  # fmt: skip
    z = apply_bias(z, cfg.logit_bias)
    if cfg.greedy:
        return z
    if cfg.temperature != 1.0:
        z = z / cfg.temperature
    if cfg.top_k is not None:
        z = top_k_filter(z, cfg.top_k)
    if cfg.top_p is not None:
        z = top_p_filter(z, cfg.top_p)
    if cfg.min_p is not None:
        z = min_p_filter(z, cfg.min_p)
    return z


def mask_padded(logits: Tensor, n_valid: int) -> Tensor:
    """logits [B, V] with every id ≥ ``n_valid`` (a vocabulary padded beyond the tokenizer's)
    at −∞, so that it is never drawn.

    >>> mask_padded(torch.tensor([[1.0, 2.0, 3.0]]), 2).tolist()
    [[1.0, 2.0, -inf]]
    """
    if n_valid >= logits.shape[-1]:
        return logits
    beyond = torch.arange(n_valid, logits.shape[-1], device=logits.device)
    return logits.float().index_fill(-1, beyond, -math.inf)


def probabilities(logits: Tensor, cfg: SamplingConfig, counts: Tensor | None = None) -> Tensor:
    """softmax of :func:`next_token_logits` [B, V] (one-hot at the argmax when greedy).

    >>> cfg = SamplingConfig(temperature=0.5, top_k=2)
    >>> p = probabilities(torch.tensor([[0.0, 1.0, 2.0]]), cfg)  # ∝ (0, e², e⁴)
    >>> [round(x, 6) for x in p[0].tolist()], round(math.exp(2) / (math.exp(2) + math.exp(4)), 6)
    ([0.0, 0.119203, 0.880797], 0.119203)
    """
    z = next_token_logits(logits, cfg, counts)
    if cfg.greedy:
        return torch.zeros_like(z).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(z, dim=-1)


def draw(z: Tensor, u: Tensor) -> Tensor:
    """One token per row from softmax(z) [B, V] by the inverse CDF of row b's uniform u[b]
    (float64 in [0, 1)): the first token whose cumulative mass exceeds u[b] · total.

    >>> z = torch.log(torch.tensor([[0.25, 0.5, 0.25]]))
    >>> draw(z.expand(3, -1), torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)).tolist()
    [0, 1, 2]
    """
    probs = torch.softmax(z.double(), dim=-1)  # [B, V]
    cdf = probs.cumsum(-1)
    picked = kernels.draw_rows(probs, cdf, u)  # the rest in one compiled call, its bits
    if picked is not None:
        return picked
    u = u.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]  # [B, 1]
    idx = torch.searchsorted(cdf, u, right=True).clamp_(max=z.shape[-1] - 1)
    # u · total can round up to the total itself: fall back to the last token with mass
    zero = probs.gather(-1, idx) == 0
    if bool(zero.any()):
        last = z.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1, keepdim=True)
        idx = torch.where(zero, last, idx)
    return idx[:, 0]
