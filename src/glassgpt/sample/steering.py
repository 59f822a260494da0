"""Steering vectors: x_l ← x_l + α v at one named activation, at every position, while sampling.

    steered forward:   x_l(t) ← x_l(t) + Σ_i α_i v_i      for every position t
    contrastive v:     v = mean_{p ∈ P} a_l(p) − mean_{n ∈ N} a_l(n)
                       a_l(p) = x_l of prompt p at its last position, or its mean over positions

``x_l`` is any activation with a per-position vector (``blocks.1.resid_post`` [B, T, d_model],
``blocks.0.mlp.post`` [B, T, d_mlp], ``blocks.0.attn.z`` [B, T, H, d_head], …; see
``glassgpt.model.hooks``). Several steers at the same activation add up. The shift is a
hook (:func:`steering_hooks`), so everything downstream is computed from the steered value;
under a KV cache the cached keys and values of earlier positions are steered too, and the
tokens equal those of recomputing the whole sequence at each step under the same hooks.
With hooks attached, generation takes the eager decoding path (no CUDA graph, no replayed
step), which gives the same logits as the fast paths bit for bit when α = 0.

    steer = parse_steer("happy.safetensors:blocks.1.resid_post:4")
    ids = generate(model, prompt, steer=[steer])          # or, around any forward:
    with model.hooks(steering_hooks(model, [steer])): ...

The vector files are safetensors (one tensor, or one named ``vector``), NumPy ``.npy`` or
PyTorch ``.pt`` (a tensor, or a dict with one tensor or ``vector``). TransformerLens's
spellings of the names (``blocks.1.hook_resid_post``, ``ln_final.hook_normalized``) are read
as glassgpt's.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import safetensors.torch
import torch
from torch import Tensor

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.model.gpt import GPT
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.special import start_id

HookFn = Callable[[Tensor, str], "Tensor | None"]
VECTOR_KEY = "vector"
POSITIONLESS = ("attn.attn_scores", "attn.pattern")  # [B, H, T_q, T_k]: no vector per position


@dataclass(frozen=True)
class Steer:
    """Add ``alpha · vector`` to the activation ``hook`` at every position.

    >>> s = Steer("blocks.1.hook_resid_post", torch.ones(4), 2)
    >>> s.hook, s.alpha
    ('blocks.1.resid_post', 2.0)
    """

    hook: str
    vector: Tensor  # [d_model], or the activation's own width (d_mlp, n_heads × d_head, …)
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.hook, str) or not self.hook:
            raise ConfigError("hook", f"must be an activation name, got {self.hook!r}")
        object.__setattr__(self, "hook", canonical_hook(self.hook))
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a):
            raise ConfigError("alpha", f"must be a finite number, got {a!r}")
        object.__setattr__(self, "alpha", float(a))
        v = self.vector
        if not isinstance(v, Tensor) or not (v.dtype.is_floating_point and v.numel() > 0):
            what = f"{v.dtype} {tuple(v.shape)}" if isinstance(v, Tensor) else type(v).__name__
            raise ConfigError("vector", f"must be a non-empty float tensor, got {what}")
        bad = ~torch.isfinite(v)
        if bad.any():
            i = int(bad.reshape(-1).nonzero()[0])
            value = v.reshape(-1)[i].item()
            raise ConfigError("vector", f"entry {i} is {value} ({int(bad.sum())} not finite)")


_TL_SITES = {"hook_embed": "embed", "hook_pos_embed": "pos_embed",
             "ln_final.hook_normalized": "ln_final.out", "ln_final.hook_scale": "ln_final.scale"}  # fmt: skip
_TL_BLOCK = re.compile(
    r"blocks\.(\d+)\.(?:(attn|mlp|ln1|ln2)\.)?hook_"
    r"(resid_pre|resid_mid|resid_post|attn_out|mlp_out|q|k|v|z|result|attn_scores|pattern|post|scale)"
)


def canonical_hook(name: str) -> str:
    """glassgpt's name of an activation also spelled TransformerLens's way (others unchanged).

    >>> canonical_hook("blocks.3.attn.hook_z"), canonical_hook("ln_final.hook_normalized")
    ('blocks.3.attn.z', 'ln_final.out')
    >>> canonical_hook("blocks.0.resid_post")
    'blocks.0.resid_post'
    """
    name = name.strip()
    if name in _TL_SITES:
        return _TL_SITES[name]
    m = _TL_BLOCK.fullmatch(name)
    if m is None:
        return name
    layer, module, site = m.groups()
    return f"blocks.{layer}." + (f"{module}.{site}" if module else site)


def hook_width(model: GPT, name: str) -> tuple[tuple[int, ...], str]:
    """(trailing shape of the activation ``name`` at one position, its description); raises
    naming the name when the model has no such activation or it has no vector per position.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=2, n_heads=2))
    >>> hook_width(model, "blocks.1.attn.z")
    ((2, 4), 'n_heads × d_head = 2 × 4 = 8')
    """
    config = model.config
    names = model.hook_names()
    if name not in names:
        raise GlassError(
            f"unknown hook {name!r} for this model (e.g. embed, blocks.0.resid_pre … "
            f"blocks.{config.n_layers - 1}.resid_post, blocks.0.mlp.post; every name: "
            "model.hook_names())"
        )
    site = name.split(".", 2)[-1] if name.startswith("blocks.") else name
    if site in POSITIONLESS:
        raise GlassError(f"{name} is [B, H, T_q, T_k], with no vector per position to steer")
    d, H, dh, dm = config.d_model, config.n_heads, config.d_head, config.d_mlp
    if site.endswith("scale"):
        return (1,), "1 (a norm's scale)"
    if site in ("attn.q", "attn.k", "attn.v", "attn.z"):
        return (H, dh), f"n_heads × d_head = {H} × {dh} = {H * dh}"
    if site == "attn.result":
        return (H, d), f"n_heads × d_model = {H} × {d} = {H * d}"
    if site.startswith("mlp."):
        return (dm,), f"d_mlp = {dm}"
    return (d,), f"d_model = {d}"


def steering_hooks(model: GPT, steers: Sequence[Steer]) -> dict[str, HookFn]:
    """{name: hook adding Σ α v (the steers at that name) at every position}; a vector whose
    width is not the activation's raises, naming both.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=4, n_layers=1, n_heads=2))
    >>> v = torch.tensor([1.0, 0.0, 0.0, 0.0])
    >>> hooks = steering_hooks(model, [Steer("embed", v, 2), Steer("embed", v, 0.5)])
    >>> hooks["embed"](torch.zeros(1, 2, 4), "embed")[0, :, 0].tolist()
    [2.5, 2.5]
    """
    deltas: dict[str, Tensor] = {}
    for s in steers:
        if not isinstance(s, Steer):
            raise GlassError(f"steer must be a Steer, got {type(s).__name__}")
        shape, described = hook_width(model, s.hook)
        n = s.vector.numel()
        if n != math.prod(shape):
            raise GlassError(
                f"the steering vector for {s.hook} has width {n} "
                f"{tuple(s.vector.shape)}, but {s.hook} has width {described}"
            )
        delta = s.alpha * s.vector.detach().to("cpu", torch.float64).reshape(shape)
        deltas[s.hook] = deltas[s.hook] + delta if s.hook in deltas else delta
    return {name: _adder(delta) for name, delta in deltas.items()}


def _adder(delta: Tensor) -> HookFn:
    """The hook x ↦ x + delta (delta cast once to each dtype and device it meets)."""
    copies: dict[tuple[torch.dtype, torch.device], Tensor] = {}

    def add(x: Tensor, _name: str) -> Tensor:
        key = (x.dtype, x.device)
        d = copies.get(key)
        if d is None:
            with torch.inference_mode(False):  # a plain tensor, usable in and out of it
                d = copies[key] = delta.to(device=x.device, dtype=x.dtype)
        return x + d

    return add


@contextmanager
def steered(model: GPT, steers: Sequence[Steer]) -> Iterator[GPT]:
    """``with steered(model, steers):`` every forward in the block is steered."""
    with model.hooks(steering_hooks(model, steers)):
        yield model


# -- vectors from files -------------------------------------------------------------------
def parse_steer(spec: str) -> Steer:
    """``FILE:HOOK:ALPHA`` → :class:`Steer` (split at the last two colons); a bad part raises
    one line naming it. The hook is checked against a model by :func:`steering_hooks`."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise GlassError(f"steer {spec!r}: expected FILE:HOOK:ALPHA, e.g. v.safetensors:"
                         "blocks.1.resid_post:4")  # fmt: skip
    path, hook, alpha_text = parts
    try:
        alpha = float(alpha_text)
    except ValueError:
        raise GlassError(f"steer {spec!r}: alpha {alpha_text!r} is not a number") from None
    if not math.isfinite(alpha):
        raise GlassError(f"steer {spec!r}: alpha must be finite, got {alpha_text!r}")
    vector = load_vector(path)
    try:
        return Steer(hook, vector, alpha)
    except ConfigError as e:
        raise GlassError(f"steer {spec!r}: {path}: {e}") from None


def load_vector(path: str | Path) -> Tensor:
    """The tensor in a ``.safetensors``, ``.npy`` or ``.pt`` file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: no such vector file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            found: Any = safetensors.torch.load(path.read_bytes())
        elif suffix == ".npy":
            array = np.load(path, allow_pickle=False)
            if not np.issubdtype(array.dtype, np.floating):
                raise GlassError(f"{path}: holds {array.dtype} values, not floats")
            found = torch.from_numpy(array.copy())
        elif suffix in (".pt", ".pth"):
            found = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise GlassError(f"{path}: unknown vector format (use .safetensors, .npy or .pt)")
    except GlassError:
        raise
    except Exception as e:  # each reader has its own errors for a corrupt file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputFileError(f"{path}: not a readable {suffix} file ({first})") from None
    if isinstance(found, dict):
        tensors = {k: v for k, v in found.items() if isinstance(v, Tensor)}
        if VECTOR_KEY in tensors:
            found = tensors[VECTOR_KEY]
        elif len(tensors) == 1:
            found = next(iter(tensors.values()))
        else:
            raise GlassError(f"{path}: holds {len(tensors)} tensors "
                             f"({', '.join(sorted(tensors)) or 'none'}); name one 'vector'")  # fmt: skip
    if not isinstance(found, Tensor):
        raise GlassError(f"{path}: holds a {type(found).__name__}, not a tensor")
    if not found.dtype.is_floating_point:
        raise GlassError(f"{path}: holds {found.dtype} values, not floats")
    return found


def save_vector(path: str | Path, vector: Tensor, metadata: dict[str, str] | None = None) -> None:
    """Write ``vector`` (atomically) as safetensors (key ``vector``), ``.npy`` or ``.pt``."""
    path = Path(path)
    v = vector.detach().to("cpu").contiguous()
    suffix = path.suffix.lower()
    if suffix == ".npy":
        buf = io.BytesIO()
        np.save(buf, v.numpy(), allow_pickle=False)
        data = buf.getvalue()
    elif suffix in (".pt", ".pth"):
        buf = io.BytesIO()
        torch.save({VECTOR_KEY: v}, buf)
        data = buf.getvalue()
    elif suffix == ".safetensors":
        data = safetensors.torch.save({VECTOR_KEY: v}, metadata=metadata)
    else:
        raise GlassError(f"{path}: unknown vector format (use .safetensors, .npy or .pt)")
    atomic_write(path, data)


# -- vectors from contrastive prompts -----------------------------------------------------
def contrastive_vector(
    model: GPT,
    tokenizer: Any,
    positive: Sequence[str | Sequence[int]],
    negative: Sequence[str | Sequence[int]],
    hook: str,
    pos: Literal["mean", "last"] = "mean",
) -> Tensor:
    """v = mean over ``positive`` of a(p) − mean over ``negative`` of a(n), where a(p) is the
    activation ``hook`` of prompt p alone at its last position (``pos="last"``) or averaged
    over its positions (``"mean"``). Prompts are texts (encoded by ``tokenizer``) or id lists.
    Returns the activation's width ([d_model] for the residual stream) in the model's dtype.
    """
    name = canonical_hook(hook)
    shape, _ = hook_width(model, name)
    if pos not in ("mean", "last"):
        raise ConfigError("pos", f"must be mean or last, got {pos!r}")
    for which, prompts in (("positive", positive), ("negative", negative)):
        if isinstance(prompts, str) or not prompts:
            raise ConfigError(which, "needs at least one prompt (a list of texts)")
    means = [_mean_activation(model, tokenizer, prompts, name, shape, pos)
             for prompts in (positive, negative)]  # fmt: skip
    dtype = next(model.parameters()).dtype
    return (means[0] - means[1]).to(dtype if dtype.is_floating_point else torch.float32)


def _mean_activation(
    model: GPT, tokenizer: Any, prompts: Sequence[Any], name: str, shape: tuple[int, ...], pos: str
) -> Tensor:
    """mean over ``prompts`` of a(p) (float64, on the CPU)."""
    device = next(model.parameters()).device
    total = torch.zeros(shape, dtype=torch.float64)
    seen: list[Tensor] = []

    def grab(x: Tensor, _name: str) -> None:
        seen.append(x)

    n_ctx = model.config.n_ctx
    training = model.training
    model.eval()
    try:
        for p in prompts:
            if isinstance(p, str):
                if tokenizer is None:
                    raise GlassError("text prompts need a tokenizer")
                ids = tokenizer.encode(p, allowed_special="all")
            else:
                ids = [int(t) for t in p]
            ids = ids or [start_id(tokenizer)]
            if len(ids) > n_ctx:
                raise GlassError(f"a prompt of {len(ids)} tokens is longer than the model's "
                                 f"context n_ctx={n_ctx}: {_short(p)}")  # fmt: skip
            seen.clear()
            tokens = torch.tensor([ids], dtype=torch.long, device=device)
            with torch.inference_mode(), model.hooks({name: grab}):
                model(tokens)
            act = seen[0][0].to("cpu", torch.float64)  # [T, *shape]
            total += act[-1] if pos == "last" else act.mean(dim=0)
    finally:
        if training:
            model.train()
    return total / len(prompts)


def _short(p: Any) -> str:
    text = repr(p)
    return text if len(text) <= 40 else text[:37] + "…"
