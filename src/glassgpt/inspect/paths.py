"""Path patching (Wang et al. 2022, "Interpretability in the Wild", §3.1 and appendix B).

The effect of a sender s on the metric through receivers R only:

    run 1   x_corrupted with s ← s(x_clean), every other head's z frozen at its corrupted
            value (MLPs recomputed, or frozen too with ``freeze_mlps``); record each
            receiver's input r* (head h's q, k or v at layer l; FINAL: the last block's output)
    run 2   x_corrupted with each receiver's input r ← r*
    value   m(logits of run 2)

so the sender's change reaches the receivers along paths through the residual stream (and
through MLPs, which Wang et al. leave unfrozen: the default) but through no other head.
Direction as everywhere here: the base run is the corrupted prompt, the sender carries its
clean value. No receivers: the corrupted run. A receiver in the sender's layer or before it
sees no change. :func:`path_patch_heads` sweeps every head as the sender in batches (all
runs 1 of a batch as one forward, then all runs 2): [n_layers, n_heads].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import ActivationCache, as_batch, evaluating, run_with_cache
from glassgpt.inspect.metrics import MetricFn, score_runs
from glassgpt.inspect.patching import rows_that_fit
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn


@dataclass(frozen=True)
class Head:
    """Attention head ``head`` of layer ``layer`` (its output z, all positions)."""

    layer: int
    head: int


@dataclass(frozen=True)
class MLP:
    """The MLP of layer ``layer`` (its output, all positions)."""

    layer: int


@dataclass(frozen=True)
class Receiver:
    """The ``input`` (q, k or v) of head ``head`` at layer ``layer`` (under grouped-query
    attention head h's k and v are its group's, h // (H/G), shared with the group's heads)."""

    layer: int
    head: int
    input: str


@dataclass(frozen=True)
class _Final:
    def __repr__(self) -> str:
        return "FINAL"


FINAL = _Final()  # the final residual stream (the last block's output), read by the unembedding
Sender = Head | MLP
Target = Receiver | _Final


def path_patch(
    model: GPT,
    clean_tokens: Tensor | Sequence[int],
    corrupted_tokens: Tensor | Sequence[int],
    metric: MetricFn,
    sender: Sender,
    receivers: Sequence[Target],
    *,
    freeze_mlps: bool = False,
) -> Tensor:
    """The metric with ``sender``'s clean value reaching ``receivers`` only (0-d).

    >>> from glassgpt.model import GPTConfig
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> m = lambda z: z[0, -1, 0]
    >>> with torch.no_grad():  # the inference path path_patch takes (kernels differ with autograd)
    ...     corrupted_run = float(m(model(torch.tensor([[1, 5, 3]]))))
    >>> float(path_patch(model, [1, 2, 3], [1, 5, 3], m, Head(0, 1), [])) == corrupted_run
    True
    >>> float(path_patch(model, [1, 2, 3], [1, 5, 3], m, Head(0, 1), [FINAL])) != corrupted_run
    True
    """
    return _path_rows(model, clean_tokens, corrupted_tokens, metric, [sender], receivers,
                      freeze_mlps, None)[0]  # fmt: skip


def path_patch_heads(
    model: GPT,
    clean_tokens: Tensor | Sequence[int],
    corrupted_tokens: Tensor | Sequence[int],
    metric: MetricFn,
    receivers: Sequence[Target],
    *,
    freeze_mlps: bool = False,
    batch_size: int | None = None,
) -> Tensor:
    """Path patching from every head to ``receivers`` → [n_layers, n_heads]."""
    L, H = model.config.n_layers, model.config.n_heads
    senders: list[Sender] = [Head(layer, h) for layer in range(L) for h in range(H)]
    values = _path_rows(model, clean_tokens, corrupted_tokens, metric, senders, receivers,
                        freeze_mlps, batch_size)  # fmt: skip
    return values.reshape(L, H)


def _check(model: GPT, senders: Sequence[Sender], receivers: Sequence[Target]) -> None:
    L, H = model.config.n_layers, model.config.n_heads

    def layer_ok(layer: object, what: str) -> None:
        if not isinstance(layer, int) or not 0 <= layer < L:
            raise GlassError(f"{what}: layer {layer!r} is out of range [0, {L})")

    def head_ok(head: object, what: str) -> None:
        if not isinstance(head, int) or not 0 <= head < H:
            raise GlassError(f"{what}: head {head!r} is out of range [0, {H})")

    for s in senders:
        if isinstance(s, Head):
            layer_ok(s.layer, repr(s)), head_ok(s.head, repr(s))
        elif isinstance(s, MLP):
            layer_ok(s.layer, repr(s))
            if model.config.attn_only:
                raise GlassError(f"{s!r}: this model is attention-only (it has no MLP)")
        else:
            raise GlassError(f"a sender must be Head(layer, head) or MLP(layer), got {s!r}")
    for r in receivers:
        if isinstance(r, Receiver):
            layer_ok(r.layer, repr(r)), head_ok(r.head, repr(r))
            if r.input not in ("q", "k", "v"):
                raise GlassError(f"{r!r}: input must be 'q', 'k' or 'v', got {r.input!r}")
        elif r is not FINAL:
            raise GlassError(f"a receiver must be Receiver(layer, head, 'q'|'k'|'v') or FINAL, "
                             f"got {r!r}")  # fmt: skip


def _path_rows(
    model: GPT,
    clean_tokens: Tensor | Sequence[int],
    corrupted_tokens: Tensor | Sequence[int],
    metric: MetricFn,
    senders: list[Sender],
    receivers: Sequence[Target],
    freeze_mlps: bool,
    batch_size: int | None,
) -> Tensor:
    """The path-patched metric for each sender → [len(senders)]."""
    receivers = list(receivers)
    _check(model, senders, receivers)
    clean, corrupted = as_batch(model, clean_tokens), as_batch(model, corrupted_tokens)
    if clean.shape != corrupted.shape:
        raise GlassError(
            f"the clean prompt has {clean.shape[1]} tokens and the corrupted one "
            f"{corrupted.shape[1]} (batches {clean.shape[0]} and {corrupted.shape[0]}): "
            "path patching needs prompts of the same shape"
        )
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise GlassError(f"batch_size must be a positive integer, got {batch_size!r}")
    names = ["attn.z"] if model.config.attn_only else ["attn.z", "mlp_out"]
    B, T = corrupted.shape
    with evaluating(model), torch.no_grad():
        base, corrupt_cache = run_with_cache(model, corrupted, names)
        if not receivers:
            value = score_runs(metric, base[None])[0]
            return value.expand(len(senders)).clone()
        _, clean_cache = run_with_cache(model, clean, names)
        size = batch_size or max(1, rows_that_fit(model, B, T, T) // 2)
        out = []
        for lo in range(0, len(senders), size):
            chunk = senders[lo : lo + size]
            recorded = _sender_run(model, corrupted, chunk, receivers, clean_cache,
                                   corrupt_cache, freeze_mlps)  # fmt: skip
            logits = _receiver_run(model, corrupted, len(chunk), receivers, recorded)
            out.append(score_runs(metric, logits.view(len(chunk), B, T, -1)))
    return torch.cat(out)


def _sender_run(
    model: GPT,
    corrupted: Tensor,
    senders: list[Sender],
    receivers: list[Target],
    clean: ActivationCache,
    corrupt: ActivationCache,
    freeze_mlps: bool,
) -> dict[str, Tensor]:
    """Run 1 for each sender (one row of the batch each): the receivers' inputs, by name."""
    n = len(senders)
    L = model.config.n_layers
    hooks: dict[str, HookFn] = {}
    for layer in range(L):
        heads = [
            (i, s.head) for i, s in enumerate(senders) if isinstance(s, Head) and s.layer == layer
        ]
        hooks[f"blocks.{layer}.attn.z"] = _frozen(corrupt[f"blocks.{layer}.attn.z"],
                                                  clean[f"blocks.{layer}.attn.z"], heads, n)  # fmt: skip
        if model.config.attn_only:
            continue
        mlps = [(i, None) for i, s in enumerate(senders) if s == MLP(layer)]
        if freeze_mlps or mlps:
            name = f"blocks.{layer}.mlp_out"
            hooks[name] = _frozen(corrupt[name], clean[name], mlps, n, keep=not freeze_mlps)
    recorded: dict[str, Tensor] = {}

    def record(t: Tensor, name: str) -> None:
        recorded[name] = t

    for r in receivers:
        hooks[_input_name(r, L)] = record
    with model.hooks(hooks):
        model(corrupted.repeat(n, 1))
    return recorded


def _input_name(r: Target, n_layers: int) -> str:
    """The activation a receiver reads: a head's q, k or v, or the last block's output."""
    if isinstance(r, Receiver):
        return f"blocks.{r.layer}.attn.{r.input}"
    return f"blocks.{n_layers - 1}.resid_post"


def _frozen(
    corrupt: Tensor, clean: Tensor, rows: list[tuple[int, int | None]], n: int, keep: bool = False
) -> HookFn:
    """A hook setting the activation to its corrupted value in every row (or keeping the
    computed one, ``keep``), then the clean value of rows' heads (or whole activations)."""
    B = corrupt.shape[0]

    def hook(t: Tensor, _: str) -> Tensor:
        out = t.clone() if keep else corrupt.repeat(n, *([1] * (corrupt.ndim - 1)))
        for i, head in rows:
            part = slice(i * B, (i + 1) * B)
            if head is None:
                out[part] = clean
            else:
                out[part, :, head] = clean[:, :, head]
        return out

    return hook


def _receiver_run(
    model: GPT, corrupted: Tensor, n: int, receivers: list[Target], recorded: dict[str, Tensor]
) -> Tensor:
    """Run 2: the corrupted prompt (n rows) with each receiver's input from run 1 → logits."""
    L = model.config.n_layers
    by_name: dict[str, list[int | None]] = {}
    for r in receivers:
        head = r.head if isinstance(r, Receiver) else None
        if head is not None and r.input in ("k", "v"):  # type: ignore[union-attr]
            head //= model.config.n_heads // model.config.kv_heads  # its key/value group
        by_name.setdefault(_input_name(r, L), []).append(head)

    def patch(t: Tensor, name: str) -> Tensor:
        source = recorded[name]
        out = t.clone()
        for head in by_name[name]:
            if head is None:
                out = source
            else:
                out[:, :, head] = source[:, :, head]
        return out

    with model.hooks({name: patch for name in by_name}):
        logits = model(corrupted.repeat(n, 1))
    assert isinstance(logits, Tensor)
    return logits
