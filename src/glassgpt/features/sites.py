"""Where an SAE sits in the model: its hook, read from a forward pass, and spliced back into one.

    read      x = a_hook(tokens)  [B, T, d_in]  (a per-head site [B, T, H, d] read as [B, T, H·d])
    splice    a_hook ← x̂ = SAE(a_hook)                             (the rest of f computed from x̂)
    transcoder  u = N₂(resid_mid) (pre-norm; post-norm: u = resid_mid; parallel residual:
              u = N₂(resid_pre), as the block has no resid_mid), the MLP's input;
              mlp_out ← ŷ = Transcoder(u)

Names are the model's own (``blocks.1.resid_post``) or TransformerLens's
(``blocks.1.hook_resid_post``). A transcoder is named by its layer's MLP: ``blocks.L.mlp.in``,
``blocks.L.mlp_out`` (or ``blocks.L.hook_mlp_out``, ``blocks.L.ln2.hook_normalized``) all mean
"read u, predict mlp_out" at layer L. A read stops the forward pass after the last site it
needs (the later blocks are never computed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.sae import SAE
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn
from glassgpt.sample.steering import POSITIONLESS, canonical_hook, hook_width

_MLP_NAMES = re.compile(r"blocks\.(\d+)\.(?:mlp\.in|mlp_out|hook_mlp_out|ln2\.hook_normalized|mlp)")


@dataclass(frozen=True)
class Site:
    """A resolved site: ``hook`` read (transcoder: ``blocks.L.mlp.in``), ``out_hook``
    predicted (transcoder only), and their widths."""

    hook: str
    d_in: int
    out_hook: str | None = None
    d_out: int | None = None

    @property
    def layer(self) -> int | None:
        m = re.match(r"blocks\.(\d+)\.", self.hook)
        return int(m.group(1)) if m else None

    @property
    def last(self) -> str:
        """The last activation a read needs."""
        return self.out_hook or self.hook


def _layers(model: GPT) -> str:
    n = model.config.n_layers
    return f"{n} layer{'s' if n != 1 else ''} (blocks.0 … blocks.{n - 1}) of d_model={model.config.d_model}"  # fmt: skip


def _has(model: GPT) -> str:
    """The sites of a block that an SAE can read, as the block really has them (a
    parallel-residual block has no resid_mid)."""
    names = [n.split(".", 2)[-1] for n in model.hook_names() if n.startswith("blocks.0.")]
    readable = [n for n in names if n not in POSITIONLESS and not n.endswith("scale")]
    why = "; a parallel-residual block has no resid_mid" if model.config.parallel_residual else ""
    return f"a block has {', '.join(readable)}{why}"


def resolve_site(model: GPT, hook: str, *, transcoder: bool = False) -> Site:
    """The site ``hook`` names in ``model``; one line naming it when there is none.

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=2, n_heads=2, d_mlp=16))
    >>> resolve_site(model, "blocks.1.hook_resid_post")
    Site(hook='blocks.1.resid_post', d_in=8, out_hook=None, d_out=None)
    >>> resolve_site(model, "blocks.0.hook_mlp_out", transcoder=True)
    Site(hook='blocks.0.mlp.in', d_in=8, out_hook='blocks.0.mlp_out', d_out=8)
    >>> resolve_site(model, "blocks.2.resid_post")
    Traceback (most recent call last):
    ...
    glassgpt.errors.GlassError: --hook blocks.2.resid_post: no such activation in this model (2 layers (blocks.0 … blocks.1) of d_model=8; a block has resid_pre, attn.q, attn.k, attn.v, attn.z, attn.result, attn_out, resid_mid, mlp.pre, mlp.post, mlp_out, resid_post)
    """
    name = hook.strip()
    if transcoder:
        m = _MLP_NAMES.fullmatch(name)
        if m is None:
            raise GlassError(
                f"--hook {hook}: a transcoder replaces one layer's MLP; name it "
                "blocks.L.mlp_out (or blocks.L.mlp.in, blocks.L.hook_mlp_out)"
            )
        layer = int(m.group(1))
        if layer >= model.config.n_layers:
            raise GlassError(f"--hook {hook}: no layer {layer} in this model ({_layers(model)})")
        if model.config.attn_only:
            raise GlassError(f"--hook {hook}: this model is attention-only: it has no MLP")
        d = model.config.d_model
        return Site(f"blocks.{layer}.mlp.in", d, f"blocks.{layer}.mlp_out", d)
    name = canonical_hook(name)
    if name not in model.hook_names():
        raise GlassError(f"--hook {hook}: no such activation in this model ({_layers(model)}; {_has(model)})")  # fmt: skip
    site = name.split(".", 2)[-1] if name.startswith("blocks.") else name
    if site in POSITIONLESS or site.endswith("scale"):
        raise GlassError(f"--hook {hook}: has no vector per token to encode (a pattern or a norm's scale)")  # fmt: skip
    shape, _ = hook_width(model, name)
    return Site(name, math.prod(shape))


def check_model(sae: SAE, model: GPT) -> Site:
    """The SAE's site in ``model``; one line naming both shapes when it does not fit."""
    cfg = sae.cfg
    transcoder = cfg.arch == "transcoder"
    if not cfg.hook:
        raise GlassError("the SAE names no hook (cfg.hook is empty)")
    try:
        site = resolve_site(model, cfg.hook, transcoder=transcoder)
    except GlassError:
        raise GlassError(
            f"the SAE reads {cfg.hook} [d_in={cfg.d_in}], which this model "
            f"({_layers(model)}) does not have"
        ) from None
    if site.d_in != cfg.d_in or (transcoder and site.d_out != cfg.width_out):
        want = f"[d_in={cfg.d_in}" + (f", d_out={cfg.width_out}]" if transcoder else "]")
        has = f"[{site.d_in}" + (f", {site.d_out}]" if transcoder else "]")
        raise GlassError(
            f"the SAE reads {cfg.hook} {want}, but this model's {site.hook} is {has} "
            f"({_layers(model)})"
        )
    return site


def mlp_source(model: GPT, layer: int) -> str:
    """The residual the MLP of ``layer`` reads: ``resid_mid``, or ``resid_pre`` in a
    parallel-residual block (x + Attn(N₁x) + MLP(N₂x): there is no resid_mid)."""
    return f"blocks.{layer}." + ("resid_pre" if model.config.parallel_residual else "resid_mid")


def mlp_input(model: GPT, layer: int, resid: Tensor) -> Tensor:
    """u, the MLP's input at ``layer`` from its :func:`mlp_source` residual: N₂(resid)
    (pre-norm) or resid (post-norm)."""
    if model.config.norm_placement == "post":
        return resid
    return model.blocks[layer].ln2(resid)


class _Enough(Exception):
    """Raised by the last read hook: the rest of the forward pass is not needed."""


@torch.no_grad()
def read(model: GPT, tokens: Tensor, site: Site) -> tuple[Tensor, Tensor | None]:
    """(x [B, T, d_in], y [B, T, d_out] or None): the site's activations on ``tokens``."""
    got: dict[str, Tensor] = {}
    layer = site.layer

    def keep(t: Tensor, name: str) -> None:
        got[name] = t
        if name == site.last:
            raise _Enough

    hooks: dict[str, HookFn] = {}
    if site.out_hook is not None:
        assert layer is not None
        hooks[mlp_source(model, layer)] = keep
        hooks[site.out_hook] = keep
    else:
        hooks[site.hook] = keep
    try:
        with model.hooks(hooks):
            model(tokens)
    except _Enough:
        pass
    B, T = tokens.shape
    if site.out_hook is not None:
        assert layer is not None
        u = mlp_input(model, layer, got[mlp_source(model, layer)])
        return u.reshape(B, T, -1), got[site.out_hook].reshape(B, T, -1)
    return got[site.hook].reshape(B, T, -1), None


def splice_hooks(model: GPT, sae: SAE) -> dict[str, HookFn]:
    """{name: hook} that put the SAE's reconstruction in place of its activation (a
    transcoder's prediction in place of the MLP's output), in the activation's dtype."""
    site = check_model(sae, model)

    def replace(t: Tensor, _name: str) -> Tensor:
        x_hat, _ = sae(t.reshape(*t.shape[:2], -1))
        return x_hat.reshape(t.shape).to(t.dtype)

    if site.out_hook is None:
        return {site.hook: replace}
    layer = site.layer
    assert layer is not None
    seen: dict[str, Tensor] = {}

    def keep(t: Tensor, _name: str) -> None:
        seen["u"] = mlp_input(model, layer, t)

    def predict(t: Tensor, _name: str) -> Tensor:
        y_hat, _ = sae(seen.pop("u"))
        return y_hat.reshape(t.shape).to(t.dtype)

    return {mlp_source(model, layer): keep, site.out_hook: predict}


@contextmanager
def spliced(model: GPT, sae: SAE) -> Iterator[GPT]:
    """``with spliced(model, sae): model(tokens)``: the model with the SAE in its site."""
    with model.hooks(splice_hooks(model, sae)):
        yield model
