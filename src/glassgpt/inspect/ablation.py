"""Ablations: a component's activation replaced by a value that carries no prompt-specific signal.

    zero       a ← 0
    mean       a ← E_ref[a]            over the reference's prompts b, per position t:  ā_t = mean_b a_{b,t}
                                       or over prompts and positions:                   ā   = mean_{b,t} a_{b,t}
    resample   a_{b,t} ← a^ref_{π(b),t}   the activation of another prompt (π = identity, or a
                                       seeded random permutation of the reference's rows)

Components and where they are replaced (the model's own hooks):

    head (l, h)     blocks.l.attn.z[:, :, h]     (so z_h W_O[h] is replaced; b_O, shared, stays)
    MLP l           blocks.l.mlp_out             (the whole output, b_out included)
    neuron (l, i)   blocks.l.mlp.post[..., i]    (row i of W_out then reads the new value)

``keep=True`` reads the lists as a circuit: everything NOT listed is ablated, namely every
head not in ``heads`` and every MLP not in ``mlps``; an MLP with neurons listed (and not
itself listed) keeps those neurons and has its other neurons ablated. So ``keep=True`` with
every head and every MLP listed ablates nothing.

Reference activations (mean, resample) come from clean, unablated runs of the model on the
``reference`` tokens: one batch [B', T'] or, for ``mean``, an iterable of batches (a dataset),
whose sums are accumulated in float64 and rounded once to the model's dtype. Because the
model is causal, a reference at least as long as the run is used through its first T
positions (``mean_over="batch"`` and ``resample``); ``mean_over="batch_pos"`` averages every
position of every reference prompt into one vector per component and fits any length.

Ablating nothing attaches no hook at all, so the logits are bit-identical to a plain run; the
replacing hooks change only the entries they select (``torch.where``), in the model's dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import HookFn, as_batch, evaluating, run_with_cache, run_with_hooks
from glassgpt.model import GPT

How = Literal["zero", "mean", "resample"]
MeanOver = Literal["batch", "batch_pos"]
HOWS = ("zero", "mean", "resample")
MEAN_OVER = ("batch", "batch_pos")


@dataclass(frozen=True)
class Ablated:
    """What is replaced, per site: ``heads[l]`` head indices of layer l, ``mlps`` whole MLP
    layers, ``neurons[l]`` neuron indices of layer l."""

    heads: dict[int, list[int]]
    mlps: list[int]
    neurons: dict[int, list[int]]

    def sites(self) -> dict[str, tuple[str, list[int] | None]]:
        """{hook name: (kind, indices along the component axis, None = all)}."""
        out: dict[str, tuple[str, list[int] | None]] = {}
        for layer, hs in self.heads.items():
            out[f"blocks.{layer}.attn.z"] = ("heads", hs)
        for layer in self.mlps:
            out[f"blocks.{layer}.mlp_out"] = ("mlp", None)
        for layer, idx in self.neurons.items():
            out[f"blocks.{layer}.mlp.post"] = ("neurons", idx)
        return out


def ablated_components(
    model: GPT,
    heads: Iterable[tuple[int, int]] = (),
    mlps: Iterable[int] = (),
    neurons: Iterable[tuple[int, int]] = (),
    keep: bool = False,
) -> Ablated:
    """The validated components to replace (the lists themselves, or their complement when
    ``keep``); indices out of range, or MLPs of an attention-only model, raise naming the value.

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2, d_mlp=4))
    >>> ablated_components(model, heads=[(1, 0)], mlps=[0], neurons=[(1, 3)], keep=True)
    Ablated(heads={0: [0, 1], 1: [1]}, mlps=[], neurons={1: [0, 1, 2]})
    """
    cfg = model.config
    L, H = cfg.n_layers, cfg.n_heads
    d_mlp = cfg.d_mlp
    assert d_mlp is not None
    head_set = {_pair(x, "head", (L, H), ("layer", "head")) for x in heads}
    mlp_set = {_index(x, "MLP layer", L) for x in mlps}
    neuron_set = {_pair(x, "neuron", (L, d_mlp), ("layer", "neuron")) for x in neurons}
    if cfg.attn_only and (mlp_set or neuron_set):
        what = f"MLP {sorted(mlp_set)[0]}" if mlp_set else f"neuron {sorted(neuron_set)[0]}"
        raise GlassError(f"cannot ablate {what}: the model is attention-only (it has no MLPs)")
    if keep:
        head_set = {(l, h) for l in range(L) for h in range(H)} - head_set
        kept_neurons = neuron_set
        neuron_set = set()
        if not cfg.attn_only:
            for layer in set(range(L)) - mlp_set:
                mine = {i for l, i in kept_neurons if l == layer}
                if mine:
                    neuron_set |= {(layer, i) for i in range(d_mlp) if i not in mine}
            mlp_set = set(range(L)) - mlp_set - {l for l, _ in kept_neurons}
        else:
            mlp_set = set()
    by_layer = lambda pairs: {  # noqa: E731
        layer: sorted(i for l, i in pairs if l == layer) for layer in sorted({l for l, _ in pairs})
    }
    return Ablated(by_layer(head_set), sorted(mlp_set), by_layer(neuron_set))


def ablation_hooks(
    model: GPT,
    *,
    heads: Iterable[tuple[int, int]] = (),
    mlps: Iterable[int] = (),
    neurons: Iterable[tuple[int, int]] = (),
    how: How = "zero",
    reference: Any = None,
    keep: bool = False,
    seed: int = 0,
    mean_over: MeanOver = "batch_pos",
    shuffle: bool = False,
) -> dict[str, HookFn]:
    """Hooks ({activation name: fn}) that ablate the listed components (their complement when
    ``keep``), for ``model.hooks(...)`` or ``run_with_hooks``. Nothing to ablate: ``{}``.

    ``how="mean"`` needs ``reference`` tokens [B', T'] (or an iterable of such batches) and
    averages over ``mean_over``: ``"batch"`` (prompts only, per position; T' ≥ the run's T)
    or ``"batch_pos"`` (prompts and positions). ``how="resample"`` needs ``reference``
    [B', T'] with T' ≥ T: row b of the run gets row b of the reference (B' = B, or B' = 1 for
    every row), or with ``shuffle`` row π(b) for a random permutation π of the B' ≥ B rows
    drawn from ``seed``.

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> sorted(ablation_hooks(model, heads=[(0, 1)], mlps=[1]))
    ['blocks.0.attn.z', 'blocks.1.mlp_out']
    >>> ablation_hooks(model, heads=[(0, 0), (0, 1), (1, 0), (1, 1)], mlps=[0, 1], keep=True)
    {}
    """
    if how not in HOWS:
        raise GlassError(f"unknown ablation {how!r}; choose one of {', '.join(HOWS)}")
    if mean_over not in MEAN_OVER:
        raise GlassError(f"unknown mean_over {mean_over!r}; choose one of {', '.join(MEAN_OVER)}")
    plan = ablated_components(model, heads, mlps, neurons, keep)
    sites = plan.sites()
    if not sites:
        return {}
    if how == "zero":
        return {name: _replacer(kind, idx, _Zero()) for name, (kind, idx) in sites.items()}
    if reference is None:
        raise GlassError(f"{how} ablation needs reference tokens (reference=None)")
    names = list(sites)
    if how == "mean":
        values = _means(model, reference, names, mean_over)
        return {n: _replacer(k, i, values[n]) for n, (k, i) in sites.items()}
    batch = _one_batch(model, reference, "resample")
    with evaluating(model):
        _, cache = run_with_cache(model, batch, names)
    rows = None
    if shuffle:
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randperm(batch.shape[0], generator=gen)
    return {n: _replacer(k, i, _Resample(cache[n], rows)) for n, (k, i) in sites.items()}


def run_ablated(model: GPT, tokens: Tensor | Sequence[int], **ablation: Any) -> Tensor:
    """Logits [B, T, n_vocab] of ``model`` on ``tokens`` with the components ablated (the
    keywords of :func:`ablation_hooks`); a mean ablation without ``reference`` averages over
    ``tokens`` themselves (their clean run).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> run_ablated(model, [1, 2, 3], heads=[(0, 1)], how="mean").shape
    torch.Size([1, 3, 10])
    """
    unknown = sorted(set(ablation) - _KEYWORDS)
    if unknown:
        raise GlassError(
            f"unknown ablation option {unknown[0]!r}; options: {', '.join(sorted(_KEYWORDS))}"
        )
    batch = as_batch(model, tokens)
    if ablation.get("how") == "mean" and ablation.get("reference") is None:
        ablation = {**ablation, "reference": batch}
    hooks = ablation_hooks(model, **ablation)
    with evaluating(model):
        return run_with_hooks(model, batch, hooks)


_KEYWORDS = frozenset(
    ("heads", "mlps", "neurons", "how", "reference", "keep", "seed", "mean_over", "shuffle")
)


@dataclass(frozen=True)
class NextTokenShift:
    """How an intervention moved the next-token distribution at the last position."""

    kl: float  # KL(before ‖ after), nats
    ids: list[int]  # the union of both top-k, most likely before first
    before: list[float]  # p(id) before, one per id
    after: list[float]  # p(id) after


def next_token_shift(before: Tensor, after: Tensor, top: int = 5) -> NextTokenShift:
    """Compare the logits [B, T, n_vocab] of two runs at the first prompt's last position.

    >>> z = torch.tensor([[[0.0, 1.0, 2.0]]])
    >>> s = next_token_shift(z, z, top=1)
    >>> s.kl, s.ids
    (0.0, [2])
    """
    logp_before = before[0, -1].double().log_softmax(-1)  # [n_vocab]
    logp_after = after[0, -1].double().log_softmax(-1)
    kl = float((logp_before.exp() * (logp_before - logp_after)).sum())
    k = min(top, logp_before.shape[0])
    union = {*logp_before.topk(k).indices.tolist(), *logp_after.topk(k).indices.tolist()}
    ids = sorted(union, key=lambda i: -float(logp_before[i]))
    return NextTokenShift(
        kl=kl,
        ids=ids,
        before=[float(logp_before[i].exp()) for i in ids],
        after=[float(logp_after[i].exp()) for i in ids],
    )


# -- the replacement values ------------------------------------------------------------------
class _Zero:
    def __call__(self, t: Tensor, name: str) -> Tensor:
        return torch.zeros((), dtype=t.dtype, device=t.device)


class _Mean:
    """The reference mean: [*features] (over prompts and positions) or [T', *features]."""

    def __init__(self, mean: Tensor, per_position: bool) -> None:
        self.mean, self.per_position = mean, per_position

    def __call__(self, t: Tensor, name: str) -> Tensor:
        mean = self.mean
        if self.per_position:
            T = t.shape[1]
            if mean.shape[0] < T:
                raise GlassError(
                    f"mean ablation of {name!r} per position: the reference has "
                    f"{mean.shape[0]} positions, the run {T}"
                )
            mean = mean[:T]
        return mean.to(dtype=t.dtype, device=t.device)


class _Resample:
    """The reference's activation [B', T', ...], row-matched or through a permutation."""

    def __init__(self, acts: Tensor, rows: Tensor | None) -> None:
        self.acts, self.rows = acts, rows

    def __call__(self, t: Tensor, name: str) -> Tensor:
        B, T = t.shape[:2]
        acts = self.acts
        B_ref, T_ref = acts.shape[:2]
        if T_ref < T:
            raise GlassError(
                f"resample ablation of {name!r}: the reference has {T_ref} positions, the run {T}"
            )
        if self.rows is not None:
            if B_ref < B:
                raise GlassError(
                    f"resample ablation with shuffle: the reference has {B_ref} prompts, "
                    f"the run {B} (it needs at least as many)"
                )
            acts = acts[self.rows[:B].to(acts.device)]
        elif B_ref not in (1, B):
            raise GlassError(
                f"resample ablation of {name!r}: the reference has {B_ref} prompts, the run {B} "
                "(give as many, or 1, or shuffle=True)"
            )
        return acts[:, :T].to(dtype=t.dtype, device=t.device)


def _replacer(kind: str, idx: list[int] | None, value: Any) -> HookFn:
    """A hook: t with the selected components (head axis 2, neuron axis −1, or all) replaced."""

    def hook(t: Tensor, name: str) -> Tensor:
        new = value(t, name)
        if idx is None:
            return new.expand_as(t).clone()
        axis_len = t.shape[2] if kind == "heads" else t.shape[-1]
        mask = torch.zeros(axis_len, dtype=torch.bool, device=t.device)
        mask[idx] = True
        if kind == "heads":
            mask = mask[:, None]  # [H, 1] against [B, T, H, d_head]
        return torch.where(mask, new, t)

    return hook


# -- references ------------------------------------------------------------------------------
def _one_batch(model: GPT, reference: Any, how: str) -> Tensor:
    if not isinstance(reference, Tensor) and _is_batches(reference):
        raise GlassError(f"{how} ablation needs one reference batch [B', T'], not several")
    batch = as_batch(model, reference)
    if batch.ndim != 2:
        raise GlassError(f"reference tokens must be [T] or [B, T], got {tuple(batch.shape)}")
    return batch


def _is_batches(reference: Any) -> bool:
    """Whether ``reference`` is several batches (tensors, or an iterator) rather than tokens."""
    if isinstance(reference, Tensor) or hasattr(reference, "shape"):  # a tensor or an array
        return False
    if isinstance(reference, list | tuple):
        return bool(reference) and all(isinstance(r, Tensor) for r in reference)
    return isinstance(reference, Iterable)


def _means(model: GPT, reference: Any, names: list[str], over: str) -> dict[str, _Mean]:
    """Σ a and the counts over every reference batch, in float64 → the mean per site."""
    batches = list(reference) if _is_batches(reference) else [reference]
    if not batches:
        raise GlassError("mean ablation: the reference holds no batch")
    per_position = over == "batch"
    sums: dict[str, Tensor] = {}
    counts = torch.zeros(0, dtype=torch.float64)  # prompts seen at each position
    with evaluating(model):
        for raw in batches:
            batch = _one_batch(model, raw, "mean")
            _, cache = run_with_cache(model, batch, names)
            B, T = batch.shape
            counts = _add_padded(counts, torch.full((T,), float(B), dtype=torch.float64))
            for name in names:
                a = cache[name].double()  # [B, T, ...]
                s = a.sum(0) if per_position else a.sum((0, 1))
                sums[name] = s if name not in sums else _add_padded(sums[name], s)
    if not per_position:
        return {n: _Mean(s / float(counts.sum()), False) for n, s in sums.items()}
    out = {}
    for name, s in sums.items():
        n = counts.to(s.device).reshape((-1,) + (1,) * (s.ndim - 1))
        out[name] = _Mean(s / n, True)
    return out


def _add_padded(a: Tensor, b: Tensor) -> Tensor:
    """a + b, the shorter along axis 0 padded with zeros (batches of unequal lengths).

    >>> _add_padded(torch.tensor([1.0, 2.0]), torch.tensor([10.0])).tolist()
    [11.0, 2.0]
    """
    if a.ndim == 0 or a.shape[0] == b.shape[0]:
        return a + b
    long, short = (a, b) if a.shape[0] > b.shape[0] else (b, a)
    out = long.clone()
    out[: short.shape[0]] += short.to(out.device)
    return out


def _index(x: Any, what: str, n: int) -> int:
    try:
        if isinstance(x, bool):
            raise TypeError
        i = operator.index(x)
    except TypeError:
        raise GlassError(f"{what} {x!r} is not an integer index") from None
    if not 0 <= i < n:
        raise GlassError(f"{what} {i} is out of range [0, {n})")
    return i


def _pair(x: Any, what: str, sizes: tuple[int, int], parts: tuple[str, str]) -> tuple[int, int]:
    if not isinstance(x, Sequence | Tensor) or len(x) != 2:
        raise GlassError(f"{what} {x!r} must be a pair ({parts[0]}, {parts[1]})")
    a, b = x
    try:
        return _index(a, parts[0], sizes[0]), _index(b, parts[1], sizes[1])
    except GlassError as e:
        raise GlassError(f"{what} {tuple(x)!r}: {e}") from None
