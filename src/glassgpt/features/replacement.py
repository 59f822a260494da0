"""The local replacement model of one prompt: the MLPs replaced by transcoder features plus an
error node per (layer, position), the attention patterns and the norms' scale factors frozen.

    mlp_out_l = Σ_{s ≤ l} a_s W_dec[s → l] + b_dec[l] + e_l     e_l = MLP_l(u_l) − (the rest)
    N(x)      = (x − μ(x)) · s̄ ⊙ w + b   (LayerNorm; RMSNorm: x · s̄ ⊙ w), s̄ the prompt's s(x)
    Attn_h(x) = Ā_h (N₁(x) W_V[h]) W_O[h]                                Ā_h the prompt's pattern

With a (the features' activations), e and s̄, Ā held at their values on the prompt, the model
is affine in its sources — the token embeddings, each feature's a_s and each error e_l — and
its output equals the model's exactly (the errors absorb what the transcoders miss). The
gradient of any linear read of it (a feature's pre-activation u_l W_enc[:, i], a logit) is
then the direct effect of every source on it (:mod:`glassgpt.features.graphs`).

Transcoders: per-layer ones (:class:`~glassgpt.features.sae.SAE` of arch ``transcoder``,
one per layer, any layer may lack one: its MLP is then all error) or one cross-layer
transcoder (:class:`~glassgpt.features.clt.CLT`), both behind :class:`Transcoders`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, clt_folder
from glassgpt.features.clt import CONFIG_FILE as CLT_FILE
from glassgpt.features.sae import CONFIG_FILE as SAE_FILE
from glassgpt.features.sae import SAE, sae_folder
from glassgpt.features.sites import check_model, mlp_input
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn


class Transcoders:
    """The MLP replacements of a model: for each layer l, the features that read u_l
    (``encode``, ``pre_acts``, ``encoder``), their decoders to layers ≥ l (``decoders``) and
    the bias written to each layer's MLP output (``b_dec``)."""

    def __init__(self, *, layers: Mapping[int, SAE] | None = None, clt: CLT | None = None) -> None:
        if (layers is None) == (clt is None):
            raise GlassError("transcoders: give per-layer transcoders or one CLT")
        self.layers = dict(layers or {})
        self.clt = clt
        self.folders: dict[int, Path] = {}  # layer → the folder it was read from (open_transcoders)
        for layer, sae in self.layers.items():
            if sae.cfg.arch != "transcoder":
                raise GlassError(f"layer {layer}: {sae.cfg.hook} is an SAE of arch {sae.cfg.arch}, not a transcoder")  # fmt: skip

    @property
    def name(self) -> str:
        return "clt" if self.clt is not None else "per-layer transcoders"

    def has(self, layer: int) -> bool:
        return self.clt is not None or layer in self.layers

    def width(self, layer: int) -> int:
        """The number of features that read layer ``layer`` (0 without a transcoder there)."""
        if self.clt is not None:
            return self.clt.cfg.d_sae
        return self.layers[layer].cfg.d_sae if layer in self.layers else 0

    def pre_acts(self, layer: int, u: Tensor) -> Tensor:
        """z = u W_enc + b_enc [..., d_sae] of layer ``layer``'s features."""
        if self.clt is not None:
            return self.clt.pre_acts(u, layer)
        return self.layers[layer].pre_acts(u.to(self.layers[layer].W_enc.dtype))

    def encode(self, layer: int, u: Tensor) -> Tensor:
        """a = σ(z) [..., d_sae] (active features have a = z)."""
        if self.clt is not None:
            return self.clt.encode(u, layer)
        return self.layers[layer].encode(u)

    def encoder(self, layer: int) -> Tensor:
        """W_enc [d_model, d_sae] of layer ``layer``'s features."""
        return self.clt.W_enc[layer] if self.clt is not None else self.layers[layer].W_enc

    def decoders(self, layer: int) -> list[tuple[int, Tensor]]:
        """[(target layer, W_dec [d_sae, d_model])] of layer ``layer``'s features."""
        if self.clt is not None:
            L = self.clt.cfg.n_layers
            return [(t, self.clt.decoder(layer, t)) for t in range(layer, L)]
        return [(layer, self.layers[layer].W_dec)] if layer in self.layers else []

    def b_dec(self, layer: int) -> Tensor | None:
        """The bias added to layer ``layer``'s MLP output (None: no transcoder writes there)."""
        if self.clt is not None:
            return self.clt.b_dec[layer]
        return self.layers[layer].b_dec if layer in self.layers else None

    def check(self, model: GPT) -> None:
        """One line naming both shapes when these transcoders do not fit ``model``."""
        c = model.config
        if c.attn_only:
            raise GlassError("this model is attention-only: it has no MLP to replace")
        if self.clt is not None:
            cfg = self.clt.cfg
            if (cfg.n_layers, cfg.d_model) != (c.n_layers, c.d_model):
                raise GlassError(
                    f"the CLT reads {cfg.n_layers} layers of d_model={cfg.d_model}, but this "
                    f"model has {c.n_layers} layers of d_model={c.d_model}"
                )
            return
        for sae in self.layers.values():
            check_model(sae, model)

    def to(self, dtype: torch.dtype) -> Transcoders:
        """These transcoders in ``dtype`` (a copy)."""
        if self.clt is not None:
            copy = CLT(self.clt.cfg)
            copy.load_state_dict(self.clt.state_dict())
            return Transcoders(clt=copy.to(dtype).eval())
        layers = {}
        for layer, sae in self.layers.items():
            copy = SAE(sae.cfg)
            copy.load_state_dict(sae.state_dict())
            layers[layer] = copy.to(dtype).eval()
        return Transcoders(layers=layers)


def open_transcoders(path: str | Path, *, device: str | torch.device | None = None) -> Transcoders:
    """The transcoders in ``path``: a CLT folder (clt.json), one transcoder's folder
    (sae.json), or a folder of per-layer transcoder folders; one line when there are none."""
    folder = Path(path)
    if not folder.is_dir():
        raise GlassError(f"--transcoders {path}: no such folder")
    if (clt_folder(folder) / CLT_FILE).is_file():
        found = Transcoders(clt=CLT.load(folder, device=device))
        found.folders = dict.fromkeys(range(found.clt.cfg.n_layers), clt_folder(folder))  # type: ignore[union-attr]
        return found
    inner = [folder] if (sae_folder(folder) / SAE_FILE).is_file() else sorted(
        d for d in folder.iterdir() if d.is_dir() and (sae_folder(d) / SAE_FILE).is_file())  # fmt: skip
    if not inner:
        raise GlassError(f"--transcoders {path}: holds no CLT ({CLT_FILE}) and no transcoder folders ({SAE_FILE})")  # fmt: skip
    layers: dict[int, SAE] = {}
    folders: dict[int, Path] = {}
    for d in inner:
        sae = SAE.load(d, device=device)
        if sae.cfg.arch != "transcoder":
            raise GlassError(f"--transcoders {d}: an SAE of arch {sae.cfg.arch} reading {sae.cfg.hook}, not a transcoder")  # fmt: skip
        layer = sae.layer
        if layer is None:
            raise GlassError(f"--transcoders {d}: reads {sae.cfg.hook}, not a layer's MLP")
        if layer in layers:
            raise GlassError(f"--transcoders {path}: two transcoders for layer {layer}")
        layers[layer], folders[layer] = sae, d
    found = Transcoders(layers=layers)
    found.folders = folders
    return found


def mlp_site(model: GPT, layer: int) -> str:
    """The residual the MLP of ``layer`` reads through N₂: resid_mid, or resid_pre (parallel)."""
    return f"blocks.{layer}.{'resid_pre' if model.config.parallel_residual else 'resid_mid'}"


def scale_names(model: GPT) -> list[str]:
    """Every norm's scale factor that is a hook point (the q/k-norms only shape the frozen
    patterns, so they need none)."""
    return [n for n in model.hook_names() if n.endswith(".scale")]


@dataclass
class Frozen:
    """One prompt's local replacement: what is held fixed, and the sources' values. T
    positions, L layers, d = d_model."""

    tokens: Tensor  # [T]
    logits: Tensor  # [T, n_vocab] the replacement model's (= the model's)
    final: Tensor  # [T, d] the residual read by the unembedding (after N_f)
    embed: Tensor  # [T, d] the token nodes' values: s · W_E[token]
    scales: dict[str, Tensor]  # name → s̄ [1, T, 1]
    patterns: dict[str, Tensor]  # name → Ā [1, H, T, T]
    u: list[Tensor]  # per layer, the MLP input u_l [T, d]
    acts: list[Tensor]  # per layer, a_l [T, d_sae] (width 0 without a transcoder)
    errors: Tensor  # [L, T, d]
    writes: Tensor  # [L, T, d] each layer's replacement MLP output (= the MLP's)


def freeze(model: GPT, transcoders: Transcoders, tokens: Tensor | Sequence[int]) -> Frozen:
    """Run the prompt once and hold its patterns, scales, features and errors."""
    transcoders.check(model)
    ids = torch.as_tensor(tokens, dtype=torch.long, device=model.W_U.device).reshape(1, -1)
    L, T = model.config.n_layers, ids.shape[1]
    scales: dict[str, Tensor] = {}
    patterns: dict[str, Tensor] = {}
    got: dict[str, Tensor] = {}
    u: list[Tensor] = []
    acts: list[Tensor] = []
    errors: list[Tensor] = []
    writes: list[Tensor] = []

    def scale(t: Tensor, name: str) -> Tensor:
        scales[name] = t.detach()
        return scales[name]

    def pattern(t: Tensor, name: str) -> Tensor:
        patterns[name] = t.detach()
        return patterns[name]

    def keep(t: Tensor, name: str) -> None:
        got[name] = t.detach()

    def read_u(t: Tensor, name: str) -> None:
        layer = int(name.split(".")[1])
        x = mlp_input(model, layer, t)[0]  # [T, d]
        u.append(x)
        width = transcoders.width(layer)
        acts.append(transcoders.encode(layer, x).to(x.dtype) if width else x.new_zeros(T, 0))

    def replace(t: Tensor, name: str) -> Tensor:
        layer = int(name.split(".")[1])
        recon = reconstruct(transcoders, acts, layer, t[0])
        errors.append(t[0] - recon)
        writes.append(recon + errors[-1])
        return writes[-1][None]

    hooks: dict[str, HookFn] = {n: scale for n in scale_names(model)}
    hooks.update({f"blocks.{l}.attn.pattern": pattern for l in range(L)})
    hooks.update({f"blocks.{l}.mlp_out": replace for l in range(L)})
    hooks.update({mlp_site(model, l): read_u for l in range(L)})
    hooks.update({"embed": keep, final_site(model): keep})
    with torch.no_grad(), _eval(model), model.hooks(hooks):
        logits = model(ids)
    assert isinstance(logits, Tensor)
    return Frozen(ids[0], logits[0], got[final_site(model)][0], got["embed"][0], scales,
                  patterns, u, acts, torch.stack(errors), torch.stack(writes))  # fmt: skip


def reconstruct(transcoders: Transcoders, acts: Sequence[Tensor], layer: int, like: Tensor) -> Tensor:  # fmt: skip
    """Σ_{s ≤ layer} a_s W_dec[s → layer] + b_dec[layer] [T, d] (0 where nothing writes)."""
    out = torch.zeros_like(like)
    for source in range(layer + 1):
        for target, W in transcoders.decoders(source):
            if target == layer and acts[source].shape[-1]:
                out = out + acts[source].to(W.dtype) @ W
    b = transcoders.b_dec(layer)
    return out if b is None else out + b


def final_site(model: GPT) -> str:
    """The residual the unembedding reads: ln_final.out, or the last block's resid_post."""
    return "ln_final.out" if model.config.final_norm else f"blocks.{model.config.n_layers - 1}.resid_post"  # fmt: skip


class _eval:
    """The model in eval mode for the block (no dropout), its mode restored after."""

    def __init__(self, model: GPT) -> None:
        self.model, self.was = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was)


@dataclass
class Linear:
    """What one pass of the frozen model read: u_l [B, T, d] per layer, the final residual
    [B, T, d], each layer's attention output [B, T, d] (when asked), and the logits."""

    u: list[Tensor]
    final: Tensor
    attn_out: list[Tensor]
    logits: Tensor


class _Final(Exception):
    """Raised by the final residual's hook when the logits are not wanted."""


def run_frozen(
    model: GPT, frozen: Frozen, embed: Tensor, writes: Sequence[Tensor], *,
    attn_out: bool = False, logits: bool = True, extra: Mapping[str, HookFn] | None = None,
) -> Linear:  # fmt: skip
    """The frozen (affine) model on B copies of the prompt, with the token embeddings
    ``embed`` [B, T, d] and the MLP outputs ``writes`` (L of [B, T, d]) in place of the
    model's: gradients flow only through the residual stream, the OV circuits and the frozen
    norms. T may be shorter than the prompt: the model is causal, so its first T positions
    are the frozen model of the prompt's first T tokens. ``logits=False`` stops at the final
    residual (``Linear.logits`` is then empty): the unembedding is the costliest product.
    ``extra``: more hooks; on a site this pass already reads, they see what it read."""
    L, (B, T) = model.config.n_layers, embed.shape[:2]
    tokens = frozen.tokens[None, :T].expand(B, -1)
    got: dict[str, Tensor] = {}
    u: list[Tensor] = [embed.new_zeros(0)] * L
    attn: list[Tensor] = [embed.new_zeros(0)] * L

    def scale(_t: Tensor, name: str) -> Tensor:
        return frozen.scales[name][:, :T]

    def pattern(_t: Tensor, name: str) -> Tensor:
        return frozen.patterns[name][..., :T, :T]

    def read_u(t: Tensor, name: str) -> None:
        layer = int(name.split(".")[1])
        u[layer] = mlp_input(model, layer, t)

    def mlp(_t: Tensor, name: str) -> Tensor:
        return writes[int(name.split(".")[1])]

    def keep_attn(t: Tensor, name: str) -> None:
        attn[int(name.split(".")[1])] = t

    def keep(t: Tensor, name: str) -> None:
        got[name] = t
        if not logits:
            raise _Final

    hooks: dict[str, HookFn] = {n: scale for n in scale_names(model)}
    hooks.update({f"blocks.{l}.attn.pattern": pattern for l in range(L)})
    hooks.update({f"blocks.{l}.mlp_out": mlp for l in range(L)})
    hooks.update({mlp_site(model, l): read_u for l in range(L)})
    hooks.update({"embed": lambda _t, _n: embed, final_site(model): keep})
    if attn_out:
        hooks.update({f"blocks.{l}.attn_out": keep_attn for l in range(L)})
    for name, fn in (extra or {}).items():
        hooks[name] = _after(hooks[name], fn) if name in hooks else fn
    out = embed.new_zeros(0)
    try:
        with _eval(model), model.hooks(hooks):
            out = model(tokens)  # type: ignore[assignment]
    except _Final:
        pass
    assert isinstance(out, Tensor)
    return Linear(u, got[final_site(model)], attn, out)


def _after(first: HookFn, then: HookFn) -> HookFn:
    def both(t: Tensor, name: str) -> Tensor | None:
        new = first(t, name)
        t = t if new is None else new
        new = then(t, name)
        return t if new is None else new

    return both


def norm_linear(model: GPT, name: str, x: Tensor, pos: Tensor | slice, frozen: Frozen) -> Tensor:
    """The frozen norm ``name`` (e.g. ``blocks.1.ln2``) as a linear map, without its bias:
    (x − μ(x)) · s̄ ⊙ w (RMSNorm: x · s̄ ⊙ w), x [..., d] at positions ``pos``."""
    norm = model.get_submodule(name)
    s = frozen.scales[f"{name}.scale"][0, pos]  # [..., 1]
    if norm.kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    return x * s * norm.gain
