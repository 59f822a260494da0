"""Named activations of the GPT function, and the hooks that read or replace them.

Each intermediate value of f_θ has a name (``blocks.0.attn.pattern``, ``blocks.3.resid_mid``…).
A hook is a function ``fn(tensor, name) -> tensor | None`` attached for the duration of a
``with model.hooks({name: fn}):`` block; it sees the activation as it is computed and may
return a replacement (None keeps it). Each site is one :class:`HookPoint` call, a dict
lookup that does nothing when nothing is attached; values that the fast path never
materialises (the norm scale, per-head results, attention scores and pattern) are computed
only when hooked.

A hook that returns its input (or None) never changes the computation: the logits stay
bit-identical. A hook that returns a new tensor makes everything downstream computed from it.

Shapes (B batch, T positions, H heads):

    embed, pos_embed, blocks.{l}.resid_pre / attn_out / resid_mid / mlp_out / resid_post,
    ln_final.out                                    [B, T, d_model]
    blocks.{l}.ln1.scale / ln2.scale, ln_final.scale [B, T, 1]   (also ln1_post / ln2_post
                                                    with sandwich norms)
    blocks.{l}.attn.q / z                           [B, T, H, d_head]  (q after qk-norm, RoPE)
    blocks.{l}.attn.k / v                           [B, T, G, d_head]  (G = n_kv_heads)
    blocks.{l}.attn.attn_scores / pattern           [B, H, T_q, T_k]   (scores masked with −∞)
    blocks.{l}.attn.result                          [B, T, H, d_model] (z_h W_O[h])
    blocks.{l}.mlp.pre / pre_gate / post            [B, T, d_mlp]

A parallel-residual block (GPT-NeoX) has no resid_mid. With sandwich norms attn_out and
mlp_out are the sublayers' outputs after their second norm (what the residual adds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor

from glassgpt.errors import ConfigError
from glassgpt.model.config import GPTConfig

HookFn = Callable[[Tensor, str], "Tensor | None"]
Hooks = dict[str, HookFn]  # one dict per model, shared by reference with every submodule

BLOCK_SITES = (
    "resid_pre",
    "ln1.scale",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.attn_scores",
    "attn.pattern",
    "attn.z",
    "attn.result",
    "attn_out",
    "resid_mid",
    "ln2.scale",
    "mlp.pre",
    "mlp.pre_gate",
    "mlp.post",
    "mlp_out",
    "resid_post",
)
MLP_SITES = frozenset({"ln2.scale", "mlp.pre", "mlp.pre_gate", "mlp.post", "mlp_out"})


def hook_names(config: GPTConfig) -> list[str]:
    """Every activation name that exists for this config, in the order it is computed.

    >>> names = hook_names(GPTConfig(n_layers=1, positional="rope"))
    >>> names[:3], names[-1]
    (['embed', 'blocks.0.resid_pre', 'blocks.0.ln1.scale'], 'ln_final.out')
    >>> "blocks.0.mlp.pre_gate" in names
    False
    """
    names = ["embed"]
    if config.positional in ("learned", "sinusoidal"):
        names.append("pos_embed")
    sites = [s for s in BLOCK_SITES if config.gated or s != "mlp.pre_gate"]
    if config.attn_only:
        sites = [s for s in sites if s not in MLP_SITES]
    if config.parallel_residual:  # x + Attn(N₁(x)) + MLP(N₂(x)): no x_mid
        sites.remove("resid_mid")
    if config.sandwich_norm:  # N' between each sublayer and its output
        sites.insert(sites.index("attn_out"), "ln1_post.scale")
        if "mlp_out" in sites:
            sites.insert(sites.index("mlp_out"), "ln2_post.scale")
    if config.norm_placement == "post":  # N₁ follows the attention residual, N₂ the MLP's
        for norm, after in (("ln1.scale", "attn_out"), ("ln2.scale", "mlp_out")):
            if norm not in sites:
                continue
            sites.remove(norm)
            sites.insert(sites.index(after) + 1, norm)
    for layer in range(config.n_layers):
        names += [f"blocks.{layer}.{site}" for site in sites]
    if config.final_norm:
        names += ["ln_final.scale", "ln_final.out"]
    return names


class HookPoint:
    """One named activation: ``point(x)`` is x, or what the hook attached under ``name``
    makes of it (None from the hook keeps x). Nothing happens when nothing is attached.

    >>> hooks: Hooks = {}
    >>> point = HookPoint(hooks, "blocks.0.resid_mid")
    >>> import torch
    >>> x = torch.ones(2)
    >>> point(x) is x, point.active
    (True, False)
    >>> hooks["blocks.0.resid_mid"] = lambda t, name: 2 * t
    >>> point(x).tolist(), point.active
    ([2.0, 2.0], True)
    """

    __slots__ = ("hooks", "name")

    def __init__(self, hooks: Hooks, name: str) -> None:
        self.hooks, self.name = hooks, name  # the model's shared dict, by reference

    @property
    def active(self) -> bool:
        """Whether a hook is attached here (values the fast path never forms are then built)."""
        return self.name in self.hooks

    def __call__(self, x: Tensor) -> Tensor:
        fn = self.hooks.get(self.name)  # one lookup: a decoding step passes ~170 points
        if fn is None:
            return x
        out = fn(x, self.name)
        return x if out is None else out

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r})"


@contextmanager
def attach(hooks: Hooks, fns: Mapping[str, HookFn], valid: frozenset[str]) -> Iterator[None]:
    """Attach ``fns`` to the shared ``hooks`` dict for the block; unknown names raise."""
    for name, fn in fns.items():
        if name not in valid:
            raise ConfigError(
                "hooks", f"unknown activation {name!r} for this config; see model.hook_names()"
            )
        if not callable(fn):
            raise ConfigError("hooks", f"the hook for {name!r} is not callable")
        if name in hooks:
            raise ConfigError("hooks", f"{name!r} is already hooked")
    hooks.update(fns)
    try:
        yield
    finally:
        for name in fns:
            hooks.pop(name, None)
