"""Patching metrics: one number per run of the model, read from its logits.

    logit_diff(a, b)    m = z_T[a] − z_T[b]                      (z the logits at position T)
    logprob(a)          m = log softmax(z_T)[a]
    loss(tokens)        m = mean_t −log softmax(z_t)[token_{t+1}]
    normalised(m, clean, corrupted)   m̂ = (m − m_corrupted) / (m_clean − m_corrupted)

A metric takes the logits of one run, [B, T, n_vocab] (B the prompts of the run, averaged
over), and returns a 0-d tensor, as TransformerLens's ``patching_metric`` does, so a user's
own function works anywhere a metric is asked for. The metrics here also take a stack of
runs, [N, B, T, n_vocab] → [N] (``metric.batched``): a patching sweep runs N patched
forwards in one batch and scores them with one call. ``normalised`` is 0 on the corrupted
run and 1 on the clean run. ``logit_diff`` and ``logprob`` (and ``normalised`` of either) read
one position only and say so (``metric.pos``, ``metric.at``): a sweep then computes the logits
at that position alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from glassgpt.errors import GlassError

MetricFn = Callable[[Tensor], Tensor]


class Metric:
    """A metric of one run (``metric(logits [B, T, n_vocab]) → 0-d``) that also scores a stack of
    runs at once (``metric.batched(logits [N, B, T, n_vocab]) → [N]``).

    ``pos`` and ``at``, for a metric that reads the logits at one position only: that position
    (negative: from the end) and ``at(z [N, B, n_vocab]) → [N]``, the metric from those logits;
    ``ids``: the vocabulary ids that ``at`` reads (None: any; the others may be anything).
    """

    def __init__(
        self, batched: Callable[[Tensor], Tensor], name: str, *, pos: int | None = None,
        at: Callable[[Tensor], Tensor] | None = None, ids: Tensor | None = None,
    ) -> None:  # fmt: skip
        self._batched, self.name = batched, name
        self.pos, self.at = (pos, at) if at is not None else (None, None)
        self.ids = ids if at is not None else None

    def batched(self, logits: Tensor) -> Tensor:
        """[N, B, T, n_vocab] → [N]: the metric of each of N runs."""
        if logits.ndim != 4:
            raise GlassError(
                f"{self.name}: expected logits [N, B, T, n_vocab], got {tuple(logits.shape)}"
            )
        return self._batched(logits)

    def __call__(self, logits: Tensor) -> Tensor:
        if logits.ndim != 3:
            raise GlassError(
                f"{self.name}: expected logits [B, T, n_vocab], got {tuple(logits.shape)}"
            )
        return self._batched(logits[None])[0]

    def __repr__(self) -> str:
        return f"Metric({self.name})"


def score_runs(metric: MetricFn, logits: Tensor) -> Tensor:
    """The metric of each run in ``logits`` [N, B, T, n_vocab] → [N] (one call when it is batched)."""
    if isinstance(metric, Metric):
        return metric.batched(logits)
    return torch.stack([torch.as_tensor(metric(run)).reshape(()) for run in logits])


def _at_position(
    at: Callable[[Tensor], Tensor], pos: int, name: str, ids: Tensor | None = None
) -> Metric:
    """The metric of the logits at ``pos`` alone, ``at(z [N, B, n_vocab]) → [N]`` (reading the
    vocabulary ``ids`` alone, where given).

    >>> m = _at_position(lambda z: z[:, 0, 1], -1, "z[-1, 1]")
    >>> m(torch.arange(6.0).view(1, 2, 3)).item(), m.pos
    (4.0, -1)
    """

    def batched(logits: Tensor) -> Tensor:
        T = logits.shape[2]
        if not -T <= pos < T:
            raise GlassError(f"{name}: position {pos} is out of range for {T} tokens")
        return at(logits[:, :, pos])

    return Metric(batched, name, pos=pos, at=at, ids=ids)


def _widened(logits: Tensor) -> Tensor:
    """Half-precision logits in float32; float32 and float64 as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _ids(tokens: int | Sequence[int] | Tensor, what: str) -> Tensor:
    ids = torch.as_tensor(tokens, dtype=torch.long)
    if ids.ndim > 1:
        raise GlassError(f"{what}: one id, or one per prompt; got shape {tuple(ids.shape)}")
    return ids.reshape(-1)


def _at(logits: Tensor, ids: Tensor, pos: int, what: str) -> Tensor:
    """logits[n, b, pos, ids[b]] → [N, B] (ids [1] or [B]), ids checked against n_vocab."""
    N, B, T, V = logits.shape
    if not -T <= pos < T:
        raise GlassError(f"{what}: position {pos} is out of range for {T} tokens")
    if ids.numel() not in (1, B):
        raise GlassError(f"{what}: {ids.numel()} ids for {B} prompts")
    if int(ids.min()) < 0 or int(ids.max()) >= V:
        bad = int(ids[(ids < 0) | (ids >= V)][0])
        raise GlassError(f"{what}: token id {bad} is out of range [0, {V})")
    z = logits[:, :, pos, :]  # [N, B, n_vocab]
    index = ids.to(z.device).expand(B)[None, :, None].expand(N, B, 1)
    return z.gather(-1, index)[..., 0]


def logit_diff(
    answer: int | Sequence[int] | Tensor,
    wrong: int | Sequence[int] | Tensor,
    pos: int = -1,
    *,
    name: str | None = None,
) -> Metric:
    """z_pos[answer] − z_pos[wrong], averaged over the prompts (ids: one, or one per prompt);
    ``name`` names it in messages (default ``logit_diff([ids], [ids])``; a command gives the
    tokens' text).

    >>> z = torch.zeros(1, 2, 4); z[0, -1] = torch.tensor([0.0, 3.0, 1.0, 0.0])
    >>> float(logit_diff(1, 2)(z))
    2.0
    """
    a, b = _ids(answer, "answer"), _ids(wrong, "wrong answer")

    def at(z: Tensor) -> Tensor:  # [N, B, n_vocab], the logits at pos
        z = _widened(z[:, :, None])
        return (_at(z, a, 0, "answer") - _at(z, b, 0, "wrong answer")).mean(-1)

    ids = torch.cat([a, b]).unique()
    return _at_position(at, pos, name or f"logit_diff({a.tolist()}, {b.tolist()})", ids)


def logprob(
    answer: int | Sequence[int] | Tensor, pos: int = -1, *, name: str | None = None
) -> Metric:
    """log softmax(z_pos)[answer], averaged over the prompts (in at least float32); ``name``
    as in :func:`logit_diff`.

    >>> z = torch.zeros(1, 1, 4)
    >>> round(float(logprob(2)(z)), 4)  # log(1/4)
    -1.3863
    """
    a = _ids(answer, "answer")

    def at(z: Tensor) -> Tensor:  # [N, B, n_vocab], the logits at pos
        return _at(_widened(z[:, :, None]).log_softmax(-1), a, 0, "answer").mean(-1)

    return _at_position(at, pos, name or f"logprob({a.tolist()})")


def loss(tokens: Tensor | Sequence[int] | Sequence[Sequence[int]]) -> Metric:
    """The mean next-token cross-entropy of ``tokens`` ([T] or [B, T]) under the run's logits.

    >>> z = torch.zeros(1, 3, 5)
    >>> round(float(loss([1, 2, 3])(z)), 4)  # log 5
    1.6094
    """
    ids = torch.as_tensor(tokens, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise GlassError(f"loss: tokens must be [T] or [B, T] with T ≥ 2, got {tuple(ids.shape)}")

    def batched(logits: Tensor) -> Tensor:
        N, B, T, _ = logits.shape
        if tuple(ids.shape) != (B, T) and (ids.shape[0] != 1 or ids.shape[1] != T):
            raise GlassError(f"loss: tokens {tuple(ids.shape)} do not match logits [B={B}, T={T}]")
        z = _widened(logits)
        targets = ids.to(z.device).expand(B, T)[:, 1:]
        logp = z[:, :, :-1].log_softmax(-1)  # [N, B, T − 1, n_vocab]
        nll = -logp.gather(-1, targets[None, ..., None].expand(N, B, T - 1, 1))[..., 0]
        return nll.mean((1, 2))

    return Metric(batched, "loss")


def normalised(metric: MetricFn, clean_logits: Tensor, corrupted_logits: Tensor) -> Metric:
    """(m − m_corrupted) / (m_clean − m_corrupted): 0 on the corrupted run, 1 on the clean one.

    >>> clean, corrupt = torch.zeros(1, 1, 3), torch.zeros(1, 1, 3)
    >>> clean[0, 0, 0] = 2.0
    >>> m = normalised(logit_diff(0, 1), clean, corrupt)
    >>> float(m(clean)), float(m(corrupt)), float(m(clean / 2))
    (1.0, 0.0, 0.5)
    """
    low = score_runs(metric, corrupted_logits[None])[0]
    high = score_runs(metric, clean_logits[None])[0]
    span = high - low
    if float(span) == 0.0:
        raise GlassError(
            f"cannot normalise {getattr(metric, 'name', 'the metric')}: it is {float(high):.6g} "
            "on both the clean and the corrupted run"
        )

    def batched(logits: Tensor) -> Tensor:
        return (score_runs(metric, logits) - low.to(logits.device)) / span.to(logits.device)

    name = f"normalised({getattr(metric, 'name', 'metric')})"
    if isinstance(metric, Metric) and metric.at is not None and metric.pos is not None:
        inner, pos = metric.at, metric.pos

        def at(z: Tensor) -> Tensor:
            return (inner(z) - low.to(z.device)) / span.to(z.device)

        return Metric(batched, name, pos=pos, at=at, ids=metric.ids)
    return Metric(batched, name)


SMALL_GAP = 0.25  # of the metric's scale: below it, m̂'s denominator is mostly noise


def small_gap(m_clean: float, m_corrupted: float) -> bool:
    """Whether the clean and corrupted runs differ too little in the metric for m̂ to mean much.

        small  ⇔  |m_clean − m_corrupted| < SMALL_GAP · max(|m_clean|, |m_corrupted|, 1)

    The scale is the metric's own size, and at least 1 (logit differences and log-probabilities
    are in nats), so two values near 0 are not "far apart" when they differ by 0.01. m̂ divides
    by the gap: a small one turns any change of m into an m̂ far outside [0, 1].

    >>> small_gap(2.329, 2.543), small_gap(3.5, -3.5), small_gap(0.01, 0.3), small_gap(-0.1, -0.9)
    (True, False, False, False)
    """
    gap = abs(m_clean - m_corrupted)
    return gap < SMALL_GAP * max(abs(m_clean), abs(m_corrupted), 1.0)
