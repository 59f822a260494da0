"""The position-wise maps of a GPT block: norms, activations, the MLP, and positional tables.

Norms (over the last axis, d = d_model, or d_head for the q/k-norms; ε = norm_eps,
o = norm_offset, 0 but for Gemma's 1 + w):
    LayerNorm(x) = (x − μ(x)) · s(x) ⊙ (o + w) + b,   s(x) = 1/√(σ²(x) + ε)   (σ² biased)
    RMSNorm(x)   = x · s(x) ⊙ (o + w),                s(x) = 1/√(mean(x²) + ε)
MLP (row vectors):
    plain:  σ(x W_in + b_in) W_out + b_out
    gated:  (σ(x W_gate + b_gate) ⊙ σ'(x W_in + b_in)) W_out + b_out
Positions:
    sinusoidal  PE[p, 2i] = sin(p / 10000^(2i/d)),  PE[p, 2i+1] = cos(p / 10000^(2i/d))
    RoPE        each pair (x_2i, x_2i+1), 2i < r, of a query/key at position p is rotated by
                the angle p · ω_i, ω_i = base^(−2i/r) (r = rotary_fraction · d_head, the
                dimensions ≥ r unrotated), ω rescaled by ``rope_scaling`` and cos, sin by
                YaRN's attention factor (``rope_frequencies``).

glassgpt pairs adjacent dimensions (2i, 2i+1) (GPT-J's layout); transformers' ``rotate_half``
pairs i with i + r/2. The two are the same function up to a permutation π of each head's
first r dimensions: glassgpt's dimension 2i is HF's i and 2i+1 is HF's i + r/2 (i < r/2; the
rest in place). An importer permutes the columns of each head of W_Q and W_K (and b_Q, b_K,
and the q/k-norm weights) by π; scores q kᵀ, and so the logits, are unchanged by it.

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
from glassgpt.kernels import layer_norm, matmul, rms_norm, silu
from glassgpt.kernels import rope as rope_kernel
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
    "silu": silu,  # F.silu, or glassgpt's kernel for a decoding step's rows
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
    """LayerNorm or RMSNorm over d_model (or ``d``), with weight ``w`` (and ``b`` for a biased
    LayerNorm); the gain is o + w for ``norm_offset`` o ≠ 0. ``kind`` overrides the config's
    (the q/k-norms are RMSNorms whatever it is).

    The hook ``<name>.scale`` sees s(x) with shape [..., 1]; a hook returning a new tensor
    makes the output (x − μ) · s ⊙ w + b (or x · s ⊙ w) with its tensor in place of s.
    """

    def __init__(
        self, config: GPTConfig, hooks: Hooks, name: str, *, d: int | None = None,
        kind: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        d = config.d_model if d is None else d
        self.kind = config.norm if kind is None else kind
        self.eps = config.norm_eps
        self.offset = config.norm_offset
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d)) if config.bias and self.kind == "layernorm" else None
        self.hook_scale = HookPoint(hooks, f"{name}.scale")

    def extra_repr(self) -> str:
        offset = f", offset={self.offset:g}" if self.offset else ""
        return f"{self.kind}, d={self.w.shape[0]}, eps={self.eps}{offset}"

    @property
    def gain(self) -> Tensor:
        """o + w [d] (w itself when o = 0)."""
        return self.w + self.offset if self.offset else self.w

    def forward(self, x: Tensor) -> Tensor:  # [..., d_model] -> [..., d_model]
        if self.kind == "layernorm":
            out = layer_norm(x, self.gain, self.b, self.eps)
        else:
            out = rms_norm(x, self.gain, self.eps)
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
        y = centred * new * self.gain
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
    return rope_angles(pos, rope_frequencies(d_head, base, device=pos.device)[0])


def rope_angles(
    pos: Tensor, inv_freq: Tensor, attention_factor: float = 1.0
) -> tuple[Tensor, Tensor]:
    """a · cos(p ω_i), a · sin(p ω_i) [..., r/2], float64, at positions ``pos`` [...] for the
    inverse frequencies ω [r/2] and the attention factor a (YaRN's; 1 otherwise)."""
    angle = pos[..., None].double() * inv_freq  # [..., r/2]
    if attention_factor == 1.0:
        return angle.cos(), angle.sin()
    return angle.cos() * attention_factor, angle.sin() * attention_factor


def rope_frequencies(
    r: int, base: float, scaling: str = "none", *, factor: float = 1.0,
    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_ctx: int = 1,
    beta_fast: float = 32.0, beta_slow: float = 1.0, device: torch.device | None = None,
) -> tuple[Tensor, float]:  # fmt: skip
    """(ω [r/2] float64, a): the inverse frequencies of the r rotated dimensions and the
    factor on cos and sin, as transformers' ``modeling_rope_utils`` computes them (there in
    float32; here in float64). ω⁰_i = base^(−2i/r), λ_i = 2π/ω⁰_i, f = ``factor``, L = the
    original context:

    - ``none``:   ω = ω⁰;   ``linear``: ω = ω⁰ / f;
    - ``llama3``: ω = ω⁰ where λ < L/high, ω⁰/f where λ > L/low, between them
      (1 − s) ω⁰/f + s ω⁰ with s = (L/λ − low)/(high − low);
    - ``yarn``:   ω = ω⁰/f · (1 − e) + ω⁰ · e, e_i = 1 − clamp((i − lo)/(hi − lo), 0, 1),
      lo = ⌊D(β_fast)⌋ and hi = ⌈D(β_slow)⌉ clipped to [0, r − 1], D(β) = r ln(L/(2πβ)) /
      (2 ln base); a = 0.1 ln f + 1 (f > 1; else 1).

    >>> w, a = rope_frequencies(4, 100.0)
    >>> w.tolist(), a
    ([1.0, 0.1], 1.0)
    >>> rope_frequencies(4, 100.0, "linear", factor=2.0)[0].tolist()
    [0.5, 0.05]
    """
    two_i = torch.arange(0, r, 2, dtype=torch.float64, device=device)
    inv = torch.pow(base, -two_i / r)  # [r/2]
    if scaling == "none":
        return inv, 1.0
    if scaling == "linear":
        return inv / factor, 1.0
    if scaling == "llama3":
        wavelen = 2 * math.pi / inv
        low_wl, high_wl = original_ctx / low_freq_factor, original_ctx / high_freq_factor
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        s = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - s) * scaled / factor + s * scaled
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return torch.where(medium, smoothed, scaled), 1.0

    # yarn
    def dim(rotations: float) -> float:
        return r * math.log(original_ctx / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), r - 1)
    if lo == hi:
        hi += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(r // 2, dtype=torch.float64, device=device) - lo) / (hi - lo)).clamp(0, 1)
    extrapolate = 1 - ramp
    inv = inv / factor * (1 - extrapolate) + inv * extrapolate
    return inv, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1), 2i < r, of x [B, T, H, d_head] by the angle in cos/sin
    [T, r/2] (or [B, T, r/2] for per-row positions); dimensions ≥ r pass unrotated.

    (a, b) ↦ (a cos θ − b sin θ, a sin θ + b cos θ),

    that is, the complex product (a + ib)(cos θ + i sin θ): computed so, in one pass forward
    and one backward, where x is float32 or float64 and its pairs can be read as complex
    numbers; else pair by pair (and under ``torch.compile``, which fuses these itself). A
    decoding step's float32 rows take the kernel seam's (``glassgpt.kernels.rope``: the pair
    by pair form's bits, each product rounded before the sum).
    """
    y = rope_kernel(x, cos, sin)
    if y is not None:
        return y
    r = 2 * cos.shape[-1]
    if r < x.shape[-1]:  # partial rotary: the first r dimensions only
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)  # [T, 1, r/2] or per row [B, T, 1, r/2]
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
    for, then rounded once to the model's dtype). ``local``: the sliding layers' plain RoPE at
    ``rope_local_base`` (no scaling)."""

    def __init__(self, config: GPTConfig, *, local: bool = False) -> None:
        super().__init__()
        assert config.d_head is not None
        c = config
        self.n_ctx, self.d_head, self.r = c.n_ctx, c.d_head, c.rotary_dims
        self.base = c.rope_local_base if local and c.rope_local_base else c.rope_base
        self.scaling = "none" if local else c.rope_scaling
        original = c.n_ctx if c.rope_original_ctx is None else c.rope_original_ctx
        self._scaling_args = {
            "factor": c.rope_factor, "low_freq_factor": c.rope_low_freq_factor,
            "high_freq_factor": c.rope_high_freq_factor, "original_ctx": original,
            "beta_fast": c.rope_beta_fast, "beta_slow": c.rope_beta_slow,
        }  # fmt: skip

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling != "none" else ""
        rotated = f", rotated={self.r}" if self.r != self.d_head else ""
        return f"d_head={self.d_head}, base={self.base}{rotated}{scaling}"

    def frequencies(self, device: torch.device | None = None) -> tuple[Tensor, float]:
        """(ω [r/2] float64, the attention factor): see ``rope_frequencies``."""
        return rope_frequencies(
            self.r,
            self.base,
            self.scaling,
            device=device,
            **self._scaling_args,  # type: ignore[arg-type]
        )

    def forward(
        self, T: int, offset: int | Tensor = 0, *, dtype: torch.dtype = torch.float64,
        device: torch.device | None = None,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """cos, sin [T, r/2] from ``offset``, or [B, T, r/2] at per-row positions."""
        pos = positions(T, offset, device)
        cos, sin = rope_angles(pos, *self.frequencies(pos.device))
        return cos.to(dtype), sin.to(dtype)


def softcap(x: Tensor, c: float | None) -> Tensor:
    """c · tanh(x / c) (x itself for c = None).

    >>> softcap(torch.tensor([0.0, 100.0]), 5.0).tolist()
    [0.0, 5.0]
    """
    return x if c is None else torch.tanh(x / c) * c


def init_normal_(t: Tensor, std: float) -> None:
    """Fill with N(0, std²) in place, without building a graph."""
    with torch.no_grad():
        t.normal_(0.0, std)


def norm_init(config: GPTConfig) -> float:
    """The initial norm weight w: 1 − norm_offset, so that every gain o + w starts at 1."""
    return 1.0 - config.norm_offset


def residual_std(config: GPTConfig) -> float:
    """GPT-2's std for the residual-output projections W_O and W_out: init_std / √(2 n_layers)."""
    return config.init_std / math.sqrt(2 * config.n_layers)
