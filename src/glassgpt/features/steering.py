"""Steering by one latent of an SAE: add its decoder direction, or clamp its activation.

    add     a ← a + α W_dec[i]                                  (glassgpt.sample.steering)
    clamp   a ← a + (c − f_i(a)) W_dec[i]        f = SAE.encode(a)

at every position of the SAE's site a. Clamping keeps the SAE's error term: writing
a = x̂ + e with x̂ = f W_dec + b_dec and e = a − x̂ (what the SAE misses), the clamped
activation is x̂' + e with f_i set to c, since x̂' − x̂ = (c − f_i) W_dec[i]. The other
latents and e are left as they were, so c = f_i(a) changes nothing (unlike splicing x̂ in,
which would also drop e). For a transcoder, f is read from the MLP's input u and the
direction is added to the MLP's output: mlp_out ← mlp_out + (c − f_i(u)) W_dec[i] (add: +
α W_dec[i]). A per-head site (``attn.z``) is read and written flattened to [H · d_head].

The hooks check the SAE's shapes against ``model``; that it was trained on that very model
is checked where the SAE is opened with its model's folder (``serve --sae`` at start-up,
glassgpt.features.identity), since a model in memory does not say which run it is.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.sae import SAE
from glassgpt.features.sites import check_model, mlp_input, mlp_source
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn
from glassgpt.sample.steering import Steer, steering_hooks

Mode = Literal["add", "clamp"]


def feature_hooks(model: GPT, sae: SAE, feature: int, mode: Mode, value: float) -> dict[str, HookFn]:  # fmt: skip
    """{name: hook} steering latent ``feature`` (module docstring): ``mode`` "add" adds
    ``value`` · W_dec[feature]; "clamp" sets f_feature to ``value`` (the error term kept)."""
    site = check_model(sae, model)
    d_sae = sae.cfg.d_sae
    if not 0 <= feature < d_sae:
        raise GlassError(f"feature {feature}: out of range (this SAE has {d_sae} latents)")
    direction = sae.W_dec[feature].detach()
    if mode == "add":
        return steering_hooks(model, [Steer(site.out_hook or site.hook, direction, value)])
    if mode != "clamp":
        raise GlassError(f"mode {mode!r}: must be add or clamp")

    def shift(a: Tensor, source: Tensor) -> Tensor:
        """a + (c − f_i(source)) W_dec[i], in a's shape and dtype."""
        flat = source.reshape(*source.shape[:2], -1)
        with torch.no_grad():
            f_i = sae.encode(flat)[..., feature : feature + 1]  # [B, T, 1]
            d = direction.to(f_i.dtype)
            out = a.reshape(*a.shape[:2], -1).to(f_i.dtype) + (value - f_i) * d
        return out.reshape(a.shape).to(a.dtype)

    if site.out_hook is None:
        return {site.hook: lambda a, _name: shift(a, a)}
    layer = site.layer
    assert layer is not None
    seen: dict[str, Tensor] = {}

    def keep(resid: Tensor, _name: str) -> None:
        seen["u"] = mlp_input(model, layer, resid)

    return {mlp_source(model, layer): keep,
            site.out_hook: lambda y, _name: shift(y, seen.pop("u"))}  # fmt: skip
