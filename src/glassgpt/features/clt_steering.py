"""Intervening on CLT features in the model's real forward pass (not the linear replacement):

    a_l      = CLT.encode(u_l, l)                 u_l the MLP input of this very forward pass
    a'_l     = a_l with the edited entries (layer l, position p, feature i) set to
               ``scale`` · a_l,p,i (zero: scale 0), clamped to ``value``, or a_l,p,i + ``add``
    mlp_out_t ← mlp_out_t + Σ_{s ≤ t} (a'_s − a_s) W_dec[s][t − s]

The MLP's own output is kept (its error term with it), as feature steering by clamping does
(glassgpt.features.steering), so an edit that changes nothing leaves the logits exactly as
they were; the later layers see the change and their features are read again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT
from glassgpt.features.clt_train import check_clt
from glassgpt.features.sites import mlp_input, mlp_source
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn


@dataclass(frozen=True)
class Edit:
    """Feature ``feature`` of ``layer`` at ``pos`` (None: every position): set to ``value``
    when it is given, else raised by ``add`` when that is given, else scaled by ``scale``.

    Adding α writes α · W_dec[l → t] into every MLP output t ≥ l, at every position it
    applies to: an SAE's "add" steering, spread over the layers the feature writes to."""

    layer: int
    feature: int
    pos: int | None = None
    scale: float = 0.0
    value: float | None = None
    add: float | None = None

    def apply(self, a: Tensor) -> Tensor | float:
        """The edited activations of this feature, from its activations ``a``."""
        if self.value is not None:
            return self.value
        return a + self.add if self.add is not None else self.scale * a


def edit_hooks(model: GPT, clt: CLT, edits: Sequence[Edit]) -> dict[str, HookFn]:
    """{name: hook} applying ``edits`` (module docstring) to a forward pass of ``model``."""
    check_clt(clt, model)
    L, S = clt.cfg.n_layers, clt.cfg.d_sae
    for e in edits:
        if not (0 <= e.layer < L and 0 <= e.feature < S):
            raise GlassError(f"feature {e.layer}/{e.feature}: no such CLT feature ({L} layers × {S})")  # fmt: skip
    delta: dict[int, Tensor] = {}
    source_of = {mlp_source(model, l): l for l in range(L)}

    def encode(t: Tensor, name: str) -> None:
        l = source_of[name]
        a = clt.encode(mlp_input(model, l, t), l)  # [B, T, S]
        new = a.clone()
        for e in (e for e in edits if e.layer == l):
            at = slice(None) if e.pos is None else e.pos
            if e.pos is not None and not -a.shape[1] <= e.pos < a.shape[1]:
                raise GlassError(f"position {e.pos}: the prompt has {a.shape[1]} tokens")
            new[:, at, e.feature] = e.apply(a[:, at, e.feature])
        delta[l] = new - a

    def write(t: Tensor, name: str) -> Tensor:
        target = int(name.split(".")[1])
        add = sum(delta[s] @ clt.decoder(s, target) for s in range(target + 1) if s in delta)
        return t + add.to(t.dtype) if isinstance(add, Tensor) else t

    hooks: dict[str, HookFn] = dict.fromkeys(source_of, encode)
    hooks.update({f"blocks.{l}.mlp_out": write for l in range(L)})
    return hooks


@torch.no_grad()
def intervene(model: GPT, clt: CLT, tokens: Tensor, edits: Sequence[Edit]) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(clean logits, edited logits) [T, n_vocab] of ``tokens`` [T]."""
    x = tokens.reshape(1, -1)
    clean = model(x)[0]
    with model.hooks(edit_hooks(model, clt, edits)):
        edited = model(x)[0]
    return clean, edited
