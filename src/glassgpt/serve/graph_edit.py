"""Interventions on transcoder features, in the model's real forward pass (not the frozen,
linear one of the graph):

    a' = 0 (zero) | s · a (scale) | v (clamp)          at each edited (layer l, position p, feature i)
    mlp_out_t[p] += (a' − a) W_dec[l → t][i]           for every target layer t the feature writes

a is the feature's activation in this very pass (read from u_l before layer l's MLP), so
an edit upstream moves the activations downstream, attention patterns and norms included.
A per-layer transcoder writes to its own layer; a CLT feature to l … L−1. What the
transcoder misses (the error) stays in mlp_out, so with no edit the pass is the model's.
A continuation is sampled by full forward passes (no KV cache): each pass sees every
position, so the edits, which sit at prompt positions, act the same at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from glassgpt.features.replacement import Transcoders, mlp_site
from glassgpt.features.sites import mlp_input
from glassgpt.model.hooks import HookFn

MODES = ("zero", "scale", "clamp")


@dataclass(frozen=True)
class Edit:
    """Feature ``feature`` of layer ``layer`` at position ``pos``: zeroed, scaled by ``value``
    or clamped to ``value``."""

    layer: int
    pos: int
    feature: int
    mode: str
    value: float = 0.0

    def new(self, a: Tensor) -> Tensor:
        """a' of the module docstring from the pass's own a."""
        if self.mode == "zero":
            return torch.zeros_like(a)
        if self.mode == "scale":
            return a * self.value
        return torch.full_like(a, self.value)


def edit_hooks(model: Any, transcoders: Transcoders, edits: Sequence[Edit]) -> dict[str, HookFn]:
    """The hooks that make ``edits`` in a forward pass of ``model`` (module docstring)."""
    by_layer: dict[int, list[Edit]] = {}
    for e in edits:
        by_layer.setdefault(e.layer, []).append(e)
    deltas: dict[int, list[tuple[int, int, Tensor]]] = {}  # source layer → (pos, i, a' − a [B])

    def read(t: Tensor, name: str) -> None:
        layer = int(name.split(".")[1])
        u = mlp_input(model, layer, t)
        a = transcoders.encode(layer, u)  # [B, T, d_sae]
        deltas[layer] = [(e.pos, e.feature, e.new(a[:, e.pos, e.feature]) - a[:, e.pos, e.feature])
                         for e in by_layer[layer] if e.pos < a.shape[1]]  # fmt: skip

    def write(t: Tensor, name: str) -> Tensor:
        target = int(name.split(".")[1])
        t = t.clone()
        for source, rows in deltas.items():
            W = dict(transcoders.decoders(source)).get(target)
            if W is None:
                continue
            for pos, i, d in rows:
                t[:, pos] += d[:, None].to(t.dtype) * W[i].to(t.dtype)
        return t

    hooks: dict[str, HookFn] = {mlp_site(model, l): read for l in by_layer}
    targets = {t for l in by_layer for t, _ in transcoders.decoders(l)}
    hooks.update({f"blocks.{t}.mlp_out": write for t in sorted(targets)})
    return hooks


def last_logits(model: Any, ids: Sequence[int], hooks: dict[str, HookFn]) -> Tensor:
    """The logits [n_vocab] at the last position of ``ids``, under ``hooks``."""
    tokens = torch.tensor([list(ids)], dtype=torch.long, device=model.W_U.device)
    with model.hooks(hooks):
        return model(tokens)[0, -1]


def sample(
    model: Any, ids: Sequence[int], hooks: dict[str, HookFn], *, n: int, temperature: float,
    seed: int, n_valid: int, stop: int | None = None,
) -> list[int]:  # fmt: skip
    """Up to ``n`` tokens after ``ids``, drawn at ``temperature`` (0: the argmax) from the
    first ``n_valid`` ids with a CPU generator seeded by ``seed``, by full passes under
    ``hooks``; ends at ``stop`` or at the model's context."""
    g = torch.Generator().manual_seed(seed)
    seq, new = list(ids), []
    for _ in range(n):
        if len(seq) >= model.config.n_ctx:
            break
        z = last_logits(model, seq, hooks)[:n_valid].double().cpu()
        if temperature == 0:
            nxt = int(z.argmax())
        else:
            nxt = int(torch.multinomial(torch.softmax(z / temperature, -1), 1, generator=g))
        seq.append(nxt)
        new.append(nxt)
        if nxt == stop:
            break
    return new
