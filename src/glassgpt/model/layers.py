"""The position-wise maps of a GPT block: norms, activations, the MLP, and positional tables.

Norms (over the last axis, d = d_model, ε = norm_eps):
    LayerNorm(x) = (x − μ(x)) · s(x) ⊙ w + b,   s(x) = 1/√(σ²(x) + ε)   (σ² biased)
    RMSNorm(x)   = x · s(x) ⊙ w,                s(x) = 1/√(mean(x²) + ε)
MLP (row vectors):
    plain:  σ(x W_in + b_in) W_out + b_out
    gated:  (σ(x W_gate + b_gate) ⊙ σ'(x W_in + b_in)) W_out + b_out
Positions:
    sinusoidal  PE[p, 2i] = sin(p / 10000^(2i/d)),  PE[p, 2i+1] = cos(p / 10000^(2i/d))
    RoPE        each pair (x_2i, x_2i+1) of a query/key at position p is rotated by the angle
                p · base^(−2i/d_head).

Every module computes with fused PyTorch kernels (F.layer_norm, F.rms_norm, F.gelu); the
scale factor s(x) is computed, and handed to a hook, only when someone hooks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassgpt.model.config import GPTConfig
from glassgpt.model.hooks import Hooks, run_hook
from glassgpt.model.onednn import OneDNNLinear, use_onednn


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))."""
    return F.gelu(x, approximate="tanh")


def identity(x: Tensor) -> Tensor:
    return x


# Module-level functions (no lambdas), so that a whole model can be pickled.
ACTIVATION_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "gelu": F.gelu,  # exact: x Φ(x) = ½ x (1 + erf(x/√2))
    "gelu_tanh": gelu_tanh,
    "silu": F.silu,
    "tanh": torch.tanh,
    "identity": identity,
}


def weight_key(W: Tensor) -> tuple[int, ...]:
    """(version counter, storage address) of W; inference tensors have no version counter."""
    return (W.data_ptr(),) if W.is_inference() else (W._version, W.data_ptr())


def linear(x: Tensor, W: Tensor, b: Tensor | None = None, *, transposed: bool = False) -> Tensor:
    """x W + b for W [d_in, d_out] (a 3-D W such as W_O [H, d_head, d_model] is read as
    [H·d_head, d_model]); ``transposed``: W is [d_out, d_in] and the product is x Wᵀ + b.

    A weight may carry an inference kernel, ``W.kernel = (key, fn)`` (attached by
    ``glassgpt.sample.precision``): ``fn(x, b)`` computes the same product from a pre-packed
    copy of W. It is used only without autograd, for inputs of W's dtype, and while W is the
    tensor it was built from (``key`` = ``weight_key(W)`` when it was attached). Float32 products
    on CPUs go through oneDNN when that is faster (``glassgpt.model.onednn``).
    """
    kernel = getattr(W, "kernel", None)
    if (
        kernel is not None
        and not torch.is_grad_enabled()
        and x.dtype == W.dtype
        and kernel[0] == weight_key(W)
    ):
        return kernel[1](x, b)
    W2 = W.flatten(0, -2) if W.ndim > 2 else W
    if use_onednn(x, W2):
        return OneDNNLinear.apply(x, W2, b, transposed)
    return F.linear(x, W2 if transposed else W2.T, b)


class Embed(nn.Module):
    """The token embedding W_E [n_vocab, d_model]: X W_E selects row x_t for token t."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(config.n_vocab, config.d_model))

    def forward(self, tokens: Tensor) -> Tensor:  # [B, T] int -> [B, T, d_model]
        return F.embedding(tokens, self.W_E)


class Unembed(nn.Module):
    """logits = x W_U + b_U, with W_U [d_model, n_vocab], or W_U = W_Eᵀ when tied (no W_U here)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, v = config.d_model, config.n_vocab
        self.W_U = None if config.tie_embeddings else nn.Parameter(torch.empty(d, v))
        self.b_U = nn.Parameter(torch.zeros(v)) if config.bias and config.unembed_bias else None

    def forward(self, x: Tensor, W_E: Tensor) -> Tensor:  # [B, T, d_model] -> [B, T, n_vocab]
        if self.W_U is None:
            return linear(x, W_E, self.b_U, transposed=True)  # x W_Eᵀ + b_U
        return linear(x, self.W_U, self.b_U)


class Norm(nn.Module):
    """LayerNorm or RMSNorm over d_model, with weight ``w`` (and ``b`` for a biased LayerNorm).

    The hook ``<name>.scale`` sees s(x) with shape [..., 1]; a hook returning a new tensor
    makes the output (x − μ) · s ⊙ w + b (or x · s ⊙ w) with its tensor in place of s.
    """

    def __init__(self, config: GPTConfig, hooks: Hooks, name: str) -> None:
        super().__init__()
        d = config.d_model
        self.kind = config.norm
        self.eps = config.norm_eps
        self.w = nn.Parameter(torch.ones(d))
        self.b = (
            nn.Parameter(torch.zeros(d)) if config.bias and config.norm == "layernorm" else None
        )
        self.hooks = hooks
        self.hook_scale = f"{name}.scale"

    def extra_repr(self) -> str:
        return f"{self.kind}, d={self.w.shape[0]}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:  # [..., d_model] -> [..., d_model]
        if self.kind == "layernorm":
            out = F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
        else:
            out = F.rms_norm(x, (x.shape[-1],), self.w, self.eps)
        if self.hooks and self.hook_scale in self.hooks:
            out = self._hooked(x, out)
        return out

    def _hooked(self, x: Tensor, out: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.kind == "layernorm":
            centred = xf - xf.mean(-1, keepdim=True)
            scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., 1]
        else:
            centred = xf
            scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        new = run_hook(self.hooks, self.hook_scale, scale)
        if new is scale:
            return out
        y = centred * new * self.w
        if self.b is not None:
            y = y + self.b
        return y.to(out.dtype)


class MLP(nn.Module):
    """The position-wise MLP: σ(x W_in + b_in) W_out + b_out, or its gated form."""

    def __init__(self, config: GPTConfig, hooks: Hooks, name: str) -> None:
        super().__init__()
        d, m = config.d_model, config.d_mlp
        assert d is not None and m is not None
        self.W_in = nn.Parameter(torch.empty(d, m))  # [d_model, d_mlp]
        self.b_in = nn.Parameter(torch.zeros(m)) if config.bias else None
        act, value_act = config.mlp_activations
        self.gated = config.gated
        if self.gated:
            self.W_gate = nn.Parameter(torch.empty(d, m))  # [d_model, d_mlp]
            self.b_gate = nn.Parameter(torch.zeros(m)) if config.bias else None
        self.W_out = nn.Parameter(torch.empty(m, d))  # [d_mlp, d_model]
        self.b_out = nn.Parameter(torch.zeros(d)) if config.bias else None
        self.act = ACTIVATION_FNS[act]
        self.value_act = ACTIVATION_FNS[value_act] if value_act is not None else None
        self.hooks = hooks
        self.hook_pre, self.hook_post = f"{name}.pre", f"{name}.post"
        self.hook_pre_gate = f"{name}.pre_gate"
        self.kind = config.mlp

    def extra_repr(self) -> str:
        d, m = self.W_in.shape
        return f"{self.kind}, {d} → {m} → {d}"

    def forward(self, x: Tensor) -> Tensor:  # [B, T, d_model] -> [B, T, d_model]
        hooks = self.hooks
        pre = linear(x, self.W_in, self.b_in)  # [B, T, d_mlp]
        if hooks:
            pre = run_hook(hooks, self.hook_pre, pre)
        if self.gated:
            gate = linear(x, self.W_gate, self.b_gate)  # [B, T, d_mlp]
            if hooks:
                gate = run_hook(hooks, self.hook_pre_gate, gate)
            post = self.act(gate) * self.value_act(pre)  # type: ignore[misc]
        else:
            post = self.act(pre)
        if hooks:
            post = run_hook(hooks, self.hook_post, post)
        return linear(post, self.W_out, self.b_out)


def sinusoidal_table(n_ctx: int, d_model: int) -> Tensor:
    """PE [n_ctx, d_model] in float64: PE[p, 2i] = sin(p/10000^(2i/d)), PE[p, 2i+1] = cos(·).

    >>> sinusoidal_table(3, 4)[:, 0].tolist() == [0.0, math.sin(1.0), math.sin(2.0)]
    True
    """
    p = torch.arange(n_ctx, dtype=torch.float64)[:, None]  # [n_ctx, 1]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # [d_model/2]
    angle = p / torch.pow(10000.0, two_i / d_model)  # [n_ctx, d_model/2]
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(n_ctx, d_model)


def rope_tables(n_ctx: int, d_head: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the RoPE angles p · base^(−2i/d_head), each [n_ctx, d_head/2], float64."""
    p = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    inv_freq = torch.pow(base, -torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    angle = p * inv_freq  # [n_ctx, d_head/2]
    return angle.cos(), angle.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1) of x [B, T, H, d_head] by the angle in cos/sin
    [T, d_head/2] (or [B, T, d_head/2] for per-row positions).

    (a, b) ↦ (a cos θ − b sin θ, a sin θ + b cos θ).
    """
    pairs = x.unflatten(-1, (-1, 2))  # [B, T, H, d_head/2, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, d_head/2] or per row [B, T, 1, d_head/2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


class _Table(nn.Module):
    """Holds fixed tables as non-persistent buffers, rebuilt in float64 on every ``.to()``.

    Rebuilding (instead of casting) keeps full precision when a model is moved from float32
    to float64, so the float64 model matches the NumPy reference to rounding.
    """

    def _tables(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def _build(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> None:
        for key, table in self._tables().items():
            self.register_buffer(key, table.to(device=device, dtype=dtype), persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> _Table:
        super()._apply(fn, recurse)
        ref = next(iter(self.buffers()))
        self._build(ref.device, ref.dtype)
        return self


class SinusoidalPE(_Table):
    """The fixed table PE [n_ctx, d_model] (buffer ``PE``, not in the state dict)."""

    PE: Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_ctx, self.d_model = config.n_ctx, config.d_model
        self._build(dtype=torch.get_default_dtype())

    def _tables(self) -> dict[str, Tensor]:
        return {"PE": sinusoidal_table(self.n_ctx, self.d_model)}

    def forward(self, T: int, offset: int | Tensor = 0) -> Tensor:  # -> [T, d_model]
        """PE[offset : offset + T], or PE[positions] [B, T, d_model] for per-row positions."""
        return self.PE[offset] if isinstance(offset, Tensor) else self.PE[offset : offset + T]


class LearnedPE(nn.Module):
    """Learned positions W_P [n_ctx, d_model]."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.W_P = nn.Parameter(torch.empty(config.n_ctx, config.d_model))

    def forward(self, T: int, offset: int | Tensor = 0) -> Tensor:  # -> [T, d_model]
        """W_P[offset : offset + T], or W_P[positions] [B, T, d_model] for per-row positions."""
        return self.W_P[offset] if isinstance(offset, Tensor) else self.W_P[offset : offset + T]


class Rotary(_Table):
    """The RoPE tables cos, sin [n_ctx, d_head/2] (buffers, not in the state dict)."""

    cos: Tensor
    sin: Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.d_head is not None
        self.n_ctx, self.d_head, self.base = config.n_ctx, config.d_head, config.rope_base
        self._build(dtype=torch.get_default_dtype())

    def _tables(self) -> dict[str, Tensor]:
        cos, sin = rope_tables(self.n_ctx, self.d_head, self.base)
        return {"cos": cos, "sin": sin}

    def forward(self, T: int, offset: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """cos, sin [T, d_head/2] from ``offset``, or [B, T, d_head/2] at per-row positions."""
        if isinstance(offset, Tensor):
            return self.cos[offset], self.sin[offset]
        return self.cos[offset : offset + T], self.sin[offset : offset + T]


def init_normal_(t: Tensor, std: float) -> None:
    """Fill with N(0, std²) in place, without building a graph."""
    with torch.no_grad():
        t.normal_(0.0, std)


def residual_std(config: GPTConfig) -> float:
    """GPT-2's std for the residual-output projections W_O and W_out: init_std / √(2 n_layers)."""
    return config.init_std / math.sqrt(2 * config.n_layers)
