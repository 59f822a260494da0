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

The norms and the GELUs are computed by the kernel seams' choice (``glassgpt.kernels.norms``,
``glassgpt.kernels.activations``: fused PyTorch kernels, or glassgpt's own for a decoding
step's few rows and for float32 GELUs on a CPU); the scale factor s(x) is computed, and
handed to a hook, only when someone hooks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassgpt.kernels import gelu_exact as gelu_exact_kernel
from glassgpt.kernels import gelu_tanh as gelu_tanh_kernel
from glassgpt.kernels import layer_norm, matmul, rms_norm
from glassgpt.model.config import GPTConfig
from glassgpt.model.hooks import HookPoint, Hooks


def gelu_tanh(x: Tensor) -> Tensor:
    """GPT-2's GELU: ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))).

    The kernel is the seam's choice (``glassgpt.kernels.activations``)."""
    return gelu_tanh_kernel(x)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU: x Φ(x) = ½ x (1 + erf(x/√2)).

    The kernel is the seam's choice (``glassgpt.kernels.activations``)."""
    return gelu_exact_kernel(x)


def relu2(x: Tensor) -> Tensor:
    """The squared ReLU: max(0, x)²."""
    return F.relu(x).square()


def identity(x: Tensor) -> Tensor:
    return x


# Module-level functions (no lambdas), so that a whole model can be pickled.
ACTIVATION_FNS: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "relu2": relu2,
    "gelu": gelu,  # exact: x Φ(x) = ½ x (1 + erf(x/√2))
    "gelu_tanh": gelu_tanh,
    "silu": F.silu,
    "tanh": torch.tanh,
    "identity": identity,
}


def linear(x: Tensor, W: Tensor, b: Tensor | None = None, *, transposed: bool = False) -> Tensor:
    """x W + b for W [d_in, d_out] (a 3-D W such as W_O [H, d_head, d_model] is read as
    [H·d_head, d_model]); ``transposed``: W is [d_out, d_in] and the product is x Wᵀ + b.

    The kernel that computes it is the kernel seam's choice (``glassgpt.kernels.matmul``).
    """
    return matmul(x, W, b, transposed=transposed)


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
        self.hook_scale = HookPoint(hooks, f"{name}.scale")

    def extra_repr(self) -> str:
        return f"{self.kind}, d={self.w.shape[0]}, eps={self.eps}"

    def forward(self, x: Tensor) -> Tensor:  # [..., d_model] -> [..., d_model]
        if self.kind == "layernorm":
            out = layer_norm(x, self.w, self.b, self.eps)
        else:
            out = rms_norm(x, self.w, self.eps)
        return self._hooked(x, out) if self.hook_scale.active else out

    def _hooked(self, x: Tensor, out: Tensor) -> Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if self.kind == "layernorm":
            centred = xf - xf.mean(-1, keepdim=True)
            scale = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., 1]
        else:
            centred = xf
            scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        new = self.hook_scale(scale)
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
        self.hook_pre, self.hook_post = (
            HookPoint(hooks, f"{name}.pre"),
            HookPoint(hooks, f"{name}.post"),
        )
        self.hook_pre_gate = HookPoint(hooks, f"{name}.pre_gate")
        self.kind = config.mlp

    def extra_repr(self) -> str:
        d, m = self.W_in.shape
        return f"{self.kind}, {d} → {m} → {d}"

    def forward(self, x: Tensor) -> Tensor:  # [B, T, d_model] -> [B, T, d_model]
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))  # [B, T, d_mlp]
        if self.gated:
            gate = self.hook_pre_gate(linear(x, self.W_gate, self.b_gate))  # [B, T, d_mlp]
            post = self.act(gate) * self.value_act(pre)  # type: ignore[misc]
        else:
            post = self.act(pre)
        return linear(self.hook_post(post), self.W_out, self.b_out)


def positions(T: int, offset: int | Tensor, device: torch.device | None) -> Tensor:
    """The absolute positions offset … offset + T − 1 [T], or per-row positions [B, T] as given."""
    if isinstance(offset, Tensor):
        return offset
    return torch.arange(offset, offset + T, device=device)


def sinusoidal_table(pos: Tensor, d_model: int) -> Tensor:
    """PE [..., d_model] in float64 at integer positions ``pos`` [...]:
    PE[p, 2i] = sin(p/10000^(2i/d)), PE[p, 2i+1] = cos(·).

    >>> sinusoidal_table(torch.arange(3), 4)[:, 0].tolist() == [0.0, math.sin(1.0), math.sin(2.0)]
    True
    """
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=pos.device)  # [d_model/2]
    angle = pos[..., None].double() / torch.pow(10000.0, two_i / d_model)  # [..., d_model/2]
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)


def rope_tables(pos: Tensor, d_head: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the RoPE angles p · base^(−2i/d_head) at positions ``pos`` [...],
    each [..., d_head/2], float64."""
    two_i = torch.arange(0, d_head, 2, dtype=torch.float64, device=pos.device)
    angle = pos[..., None].double() * torch.pow(base, -two_i / d_head)  # [..., d_head/2]
    return angle.cos(), angle.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1) of x [B, T, H, d_head] by the angle in cos/sin
    [T, d_head/2] (or [B, T, d_head/2] for per-row positions).

    (a, b) ↦ (a cos θ − b sin θ, a sin θ + b cos θ),

    that is, the complex product (a + ib)(cos θ + i sin θ): computed so, in one pass forward
    and one backward, where x is float32 or float64 and its pairs can be read as complex
    numbers; else pair by pair (and under ``torch.compile``, which fuses these itself).
    """
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, d_head/2] or per row [B, T, 1, d_head/2]
    if _complex_pairs(x) and cos.dtype == x.dtype and not torch.compiler.is_compiling():
        z = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # [B, T, H, d_head/2]
        return torch.view_as_real(z * torch.complex(c, s)).flatten(-2)
    pairs = x.unflatten(-1, (-1, 2))  # [B, T, H, d_head/2, 2]
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def _complex_pairs(x: Tensor) -> bool:
    """Whether x's (x_2i, x_2i+1) pairs can be viewed as complex numbers: a float32 or float64
    x with adjacent pairs, every other stride and the offset even."""
    return (
        x.dtype in (torch.float32, torch.float64)
        and x.stride(-1) == 1
        and x.storage_offset() % 2 == 0
        and all(st % 2 == 0 for st in x.stride()[:-1])
    )


class SinusoidalPE(nn.Module):
    """The fixed table PE [n_ctx, d_model] (no parameter: its rows are computed in float64 at
    the positions asked for, then rounded once to the model's dtype)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_ctx, self.d_model = config.n_ctx, config.d_model

    def extra_repr(self) -> str:
        return f"n_ctx={self.n_ctx}, d_model={self.d_model}"

    def forward(
        self, T: int, offset: int | Tensor = 0, *, dtype: torch.dtype = torch.float64,
        device: torch.device | None = None,
    ) -> Tensor:  # fmt: skip
        """PE[offset : offset + T] [T, d_model], or PE[positions] [B, T, d_model] per row."""
        return sinusoidal_table(positions(T, offset, device), self.d_model).to(dtype)


class LearnedPE(nn.Module):
    """Learned positions W_P [n_ctx, d_model]."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.W_P = nn.Parameter(torch.empty(config.n_ctx, config.d_model))

    def forward(
        self, T: int, offset: int | Tensor = 0, *, dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> Tensor:  # fmt: skip
        """W_P[offset : offset + T] [T, d_model], or W_P[positions] [B, T, d_model] per row
        (``dtype`` and ``device`` are W_P's own; the arguments match the fixed tables')."""
        return self.W_P[offset] if isinstance(offset, Tensor) else self.W_P[offset : offset + T]


class Rotary(nn.Module):
    """The RoPE angles (no parameter: cos and sin computed in float64 at the positions asked
    for, then rounded once to the model's dtype)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.d_head is not None
        self.n_ctx, self.d_head, self.base = config.n_ctx, config.d_head, config.rope_base

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base}"

    def forward(
        self, T: int, offset: int | Tensor = 0, *, dtype: torch.dtype = torch.float64,
        device: torch.device | None = None,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """cos, sin [T, d_head/2] from ``offset``, or [B, T, d_head/2] at per-row positions."""
        cos, sin = rope_tables(positions(T, offset, device), self.d_head, self.base)
        return cos.to(dtype), sin.to(dtype)


def init_normal_(t: Tensor, std: float) -> None:
    """Fill with N(0, std²) in place, without building a graph."""
    with torch.no_grad():
        t.normal_(0.0, std)


def residual_std(config: GPTConfig) -> float:
    """GPT-2's std for the residual-output projections W_O and W_out: init_std / √(2 n_layers)."""
    return config.init_std / math.sqrt(2 * config.n_layers)
