"""From logits to the next-token distribution: penalties, temperature, truncation.

For logits z ∈ ℝ^V of one sequence, with c_i the count of token i in the context so far:

    repetition (CTRL):   z_i ← z_i / r  if z_i > 0 else z_i · r        (for every i with c_i > 0)
    frequency:           z_i ← z_i − f · c_i
    temperature:         p = softmax(z / T)                             (T → 0: argmax, greedy)
    top-k:               keep the k largest z_i (ties with the k-th kept too)
    top-p (nucleus):     sort p descending, keep the shortest prefix whose mass reaches p_top
                         (a token is kept iff the mass strictly before it is < p_top)
    min-p:               keep tokens with p_i ≥ min_p · max_j p_j
    then renormalise over the kept tokens, and draw.

Removed tokens get logit −∞, so softmax gives them probability 0 and the survivors keep
their ratios. The draw is the inverse CDF of one uniform number u ∈ [0, 1): the first
token whose cumulative mass exceeds u · total (each row its own generator, so a row's
samples do not depend on the other rows of a batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.errors import ConfigError, GlassError


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
        f = self.frequency_penalty
        if not (isinstance(f, (int, float)) and math.isfinite(f)):
            raise ConfigError("frequency_penalty", f"must be a finite number (0 = off), got {f!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """Whether the logits depend on the token counts."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0


def apply_penalties(logits: Tensor, counts: Tensor, repetition: float, frequency: float) -> Tensor:
    """Repetition and frequency penalties; logits [B, V] float, counts [B, V] (tokens so far).

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
    return out


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (and any tied with the k-th); the rest → −∞.

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    if k >= logits.shape[-1]:
        return logits
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
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each sorted token
    drop_sorted = before >= p  # the first token has 0 before it and is always kept
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


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
    """The processed logits [B, V] (float32): penalties, temperature, top-k, top-p, min-p.

    softmax of the result is the distribution that ``draw`` samples. With temperature 0 only
    the penalties are applied (the caller takes the argmax).
    """
    z = logits.float()
    if cfg.penalised and counts is not None:
        z = apply_penalties(z, counts, cfg.repetition_penalty, cfg.frequency_penalty)
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


def next_token(
    logits: Tensor,
    cfg: SamplingConfig,
    counts: Tensor | None,
    generators: Sequence[torch.Generator],
) -> Tensor:
    """The next id per row [B]: the argmax of :func:`next_token_logits` when greedy, else one
    :func:`draw` per row from its own generator. A row without a finite logit raises
    :class:`GlassError`."""
    z = next_token_logits(logits, cfg, counts)  # [B, V] float32
    if cfg.greedy:
        picked = kernels.argmax_rows(z)  # None off a CPU, or with a NaN or an infinite maximum
        if picked is not None:
            return torch.tensor(picked, device=z.device)
        # one pass: a finite row maximum (max propagates NaN) is the argmax
        best, ids = z.max(-1)
        if bool(torch.isfinite(best).all()):
            return ids
    if not bool(torch.isfinite(z).any(-1).all()):
        raise GlassError("the model produced no finite logits (NaN or inf weights?)")
    return z.argmax(-1) if cfg.greedy else draw(z, generators)


def next_token_rows(
    logits: Tensor,
    cfgs: Sequence[SamplingConfig],
    counts: Sequence[Tensor | None],
    generators: Sequence[torch.Generator],
) -> list[int | None]:
    """The next id of each row of ``logits`` [B, V], row b with its own settings ``cfgs[b]``,
    token counts ``counts[b]`` [V] (read only when its settings have penalties) and generator.

    Rows that share their settings go through one :func:`next_token` together. Every
    operation there acts on each row alone, so a row gets the id it would get alone, and a
    batch costs a few tensor operations per distinct setting, not per row. A row without a
    finite logit gets None (its generator untouched); the other rows are unaffected.

    >>> g = [torch.Generator().manual_seed(0) for _ in range(3)]
    >>> z = torch.tensor([[0.0, 5.0], [1.0, 0.0], [float("nan"), float("nan")]])
    >>> next_token_rows(z, [SamplingConfig(temperature=0)] * 3, [None] * 3, g)
    [1, 0, None]
    """
    groups: dict[SamplingConfig, list[int]] = {}
    for b, cfg in enumerate(cfgs):
        groups.setdefault(cfg, []).append(b)
    out: list[int | None] = [None] * len(cfgs)
    for cfg, rows in groups.items():
        for part in (rows, *([b] for b in rows)):  # alone, row by row, only when one fails
            z = logits if len(part) == logits.shape[0] else logits[part]
            c = torch.stack([counts[b] for b in part]) if cfg.penalised else None  # type: ignore[misc]
            try:
                ids = next_token(z, cfg, c, [generators[b] for b in part]).tolist()
            except GlassError:  # raised before any draw: no generator has moved
                continue
            for b, t in zip(part, ids):
                out[b] = t
            if part is rows:
                break
    return out


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


def draw(z: Tensor, generators: Sequence[torch.Generator]) -> Tensor:
    """One token per row from softmax(z) [B, V] by the inverse CDF of a uniform draw per row.

    >>> g = [torch.Generator().manual_seed(0)]
    >>> draw(torch.tensor([[float("-inf"), 0.0, float("-inf")]]), g).tolist()
    [1]
    """
    probs = torch.softmax(z.double(), dim=-1)  # [B, V]
    cdf = probs.cumsum(-1)
    u = torch.stack([torch.rand((), dtype=torch.float64, generator=g) for g in generators])
    u = u.to(cdf.device)[:, None] * cdf[:, -1:]  # [B, 1]
    idx = torch.searchsorted(cdf, u, right=True).clamp_(max=z.shape[-1] - 1)
    # u · total can round up to the total itself: fall back to the last token with mass
    zero = probs.gather(-1, idx) == 0
    if bool(zero.any()):
        last = z.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1, keepdim=True)
        idx = torch.where(zero, last, idx)
    return idx[:, 0]
