"""Accounting: parameters N, FLOPs per token C, and training memory of the GPT function.

Parameters: N = Σ over the state_dict of the product of each shape, e.g. for one block
4·d·H·d_head + 2·d·d_mlp (+ d·d_mlp gated) + biases + norm weights.

FLOPs (matmuls only, 2 per multiply-add, per token, forward, at context length T):

    C_fwd = L · [2·d·3·H·d_head   (x W_Q, x W_K, x W_V)
               + 2·H·d_head·T     (q kᵀ, every key counted: the dense convention)
               + 2·H·d_head·T     (pattern v)
               + 2·H·d_head·d     (z W_O)
               + 2·k·d·d_mlp]     (k = 2, or 3 for gated MLPs)
          + 2·d·n_vocab           (x W_U)
    C_train = 3 · C_fwd           (the backward pass costs two forwards),

which is ≈ 6·N_non-embedding + 12·L·H·d_head·T per trained token (Kaplan et al.; PaLM).
Lookups (W_E, W_P), norms, softmax and activations are elementwise and not counted. A causal
mask lets a careful kernel skip about half of the two attention terms; we count them whole.

Memory for one AdamW step at batch B × T (bytes):

    weights   = N · s_param
    gradients = N · s_param
    optimizer = 2 · 4 · N            (first and second moments in float32)
              + 4 · N if s_param < 4 (a float32 master copy of low-precision weights)
    activations: see :func:`activation_bytes` (what autograd saves for the backward).

Pure Python: no torch import (``describe`` and the trainer's batch check stay cheap).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

from glassgpt.errors import ConfigError
from glassgpt.model.config import GPTConfig

_ITEMSIZE = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
}


def itemsize(dtype: Any) -> int:
    """Bytes per element of a floating dtype given by name or as a ``torch.dtype``.

    >>> [itemsize(d) for d in ("float32", "bf16", "float64")]
    [4, 2, 8]
    """
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _ITEMSIZE:
        raise ConfigError(
            "dtype", f"unknown floating dtype {dtype!r}; known: {', '.join(_ITEMSIZE)}"
        )
    return _ITEMSIZE[name]


def _int(value: int | None) -> int:
    """d_head and d_mlp: ``int | None`` in the type, always filled in by ``GPTConfig``."""
    return cast(int, value)


# -- parameters ----------------------------------------------------------------------------


def parameter_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every ``GPT.state_dict()`` key with its shape, in the order of the forward pass.

    >>> shapes = parameter_shapes(GPTConfig(n_vocab=10, n_ctx=4, d_model=8, n_layers=1, n_heads=2))
    >>> shapes["blocks.0.attn.W_Q"], shapes["blocks.0.mlp.W_out"], "unembed.W_U" in shapes
    ((2, 8, 4), (32, 8), False)
    """
    c = config
    d, H, dh, dm, V = c.d_model, c.n_heads, _int(c.d_head), _int(c.d_mlp), c.n_vocab
    norm_b = c.norm == "layernorm" and c.bias
    shapes: dict[str, tuple[int, ...]] = {"embed.W_E": (V, d)}
    if c.positional == "learned":
        shapes["pos_embed.W_P"] = (c.n_ctx, d)
    for l in range(c.n_layers):
        p = f"blocks.{l}."
        shapes[p + "ln1.w"] = (d,)
        if norm_b:
            shapes[p + "ln1.b"] = (d,)
        for m in "QKV":
            shapes[p + f"attn.W_{m}"] = (H, d, dh)
        if c.bias:
            for m in "QKV":
                shapes[p + f"attn.b_{m}"] = (H, dh)
        shapes[p + "attn.W_O"] = (H, dh, d)
        if c.bias:
            shapes[p + "attn.b_O"] = (d,)
        if c.attn_only:
            continue
        shapes[p + "ln2.w"] = (d,)
        if norm_b:
            shapes[p + "ln2.b"] = (d,)
        arms = ("in", "gate") if c.gated else ("in",)
        for arm in arms:
            shapes[p + f"mlp.W_{arm}"] = (d, dm)
            if c.bias:
                shapes[p + f"mlp.b_{arm}"] = (dm,)
        shapes[p + "mlp.W_out"] = (dm, d)
        if c.bias:
            shapes[p + "mlp.b_out"] = (d,)
    if c.final_norm:
        shapes["ln_final.w"] = (d,)
        if norm_b:
            shapes["ln_final.b"] = (d,)
    if not c.tie_embeddings:
        shapes["unembed.W_U"] = (d, V)
    if c.bias and c.unembed_bias:
        shapes["unembed.b_U"] = (V,)
    return shapes


def _is_embedding(name: str) -> bool:
    return name.startswith(("embed.", "pos_embed.", "unembed."))


def count_parameters(config: GPTConfig, *, non_embedding: bool = False) -> int:
    """N = Σ numel over the state_dict; ``non_embedding`` drops W_E, W_P, W_U and b_U (Kaplan's N).

    >>> c = GPTConfig.preset("gpt2")  # GPT-2 small: tied W_U, no b_U
    >>> count_parameters(c), count_parameters(c, non_embedding=True)
    (124439808, 85056000)
    """
    return sum(
        math.prod(shape)
        for name, shape in parameter_shapes(config).items()
        if not (non_embedding and _is_embedding(name))
    )


@dataclass(frozen=True)
class ParameterRow:
    """One matrix (or vector) of the model: its name with ``{l}`` for per-block ones."""

    name: str
    shape: tuple[int, ...]
    copies: int  # n_layers for per-block parameters, else 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def total(self) -> int:
        return self.numel * self.copies


def parameter_table(config: GPTConfig) -> list[ParameterRow]:
    """The state_dict grouped: one row per distinct parameter, blocks written ``blocks.{l}.…``.

    >>> rows = parameter_table(GPTConfig(n_vocab=10, n_ctx=4, d_model=8, n_layers=3, n_heads=2))
    >>> [(r.name, r.copies) for r in rows][:3]
    [('embed.W_E', 1), ('pos_embed.W_P', 1), ('blocks.{l}.ln1.w', 3)]
    """
    rows: dict[str, ParameterRow] = {}
    for name, shape in parameter_shapes(config).items():
        if name.startswith("blocks."):
            key = "blocks.{l}." + name.split(".", 2)[2]
            if key not in rows:
                rows[key] = ParameterRow(key, shape, config.n_layers)
        else:
            rows[name] = ParameterRow(name, shape, 1)
    return list(rows.values())


# -- FLOPs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlopCount:
    """Matmul FLOPs per token of the forward pass at context length ``seq_len``, by term."""

    seq_len: int
    attn_qkv: int  # L · 2·d·3·H·d_head
    attn_scores: int  # L · 2·H·d_head·T   (q kᵀ)
    attn_mix: int  # L · 2·H·d_head·T     (pattern v)
    attn_out: int  # L · 2·H·d_head·d     (z W_O)
    mlp: int  # L · 2·k·d·d_mlp
    unembed: int  # 2·d·n_vocab

    @property
    def forward(self) -> int:
        """C_fwd: the sum of the terms."""
        return (
            self.attn_qkv
            + self.attn_scores
            + self.attn_mix
            + self.attn_out
            + self.mlp
            + self.unembed
        )

    @property
    def training(self) -> int:
        """C_train = 3·C_fwd (forward + backward, the backward costing two forwards)."""
        return 3 * self.forward

    def terms(self) -> Iterator[tuple[str, int]]:
        """(name, FLOPs) for each term, in forward order."""
        for key, value in asdict(self).items():
            if key != "seq_len":
                yield key, value


def flops_per_token(config: GPTConfig, seq_len: int | None = None) -> FlopCount:
    """Forward matmul FLOPs per token at context length T (default n_ctx); see the module doc.

    >>> f = flops_per_token(GPTConfig.preset("gpt2"), seq_len=1024)
    >>> f.mlp == 12 * 2 * 2 * 768 * 3072, f"{f.forward / 1e6:.0f} MFLOP", f.training == 3 * f.forward
    (True, '285 MFLOP', True)
    """
    c = config
    T = c.n_ctx if seq_len is None else seq_len
    if not (isinstance(T, int) and T >= 1):
        raise ConfigError("seq_len", f"must be a positive integer, got {T!r}")
    d, H, dh, dm, L = c.d_model, c.n_heads, _int(c.d_head), _int(c.d_mlp), c.n_layers
    arms = 3 if c.gated else 2
    return FlopCount(
        seq_len=T,
        attn_qkv=L * 2 * d * 3 * H * dh,
        attn_scores=L * 2 * H * dh * T,
        attn_mix=L * 2 * H * dh * T,
        attn_out=L * 2 * H * dh * d,
        mlp=0 if c.attn_only else L * 2 * arms * d * dm,
        unembed=2 * d * c.n_vocab,
    )


# -- memory --------------------------------------------------------------------------------


def weight_bytes(config: GPTConfig, dtype: Any = "float32") -> int:
    """N · itemsize(dtype).

    >>> weight_bytes(GPTConfig.preset("gpt2", bias=False), "bf16")
    248675328
    """
    return count_parameters(config) * itemsize(dtype)


SMALL_HEAD = 64  # below this d_head, CPU attention avoids PyTorch's bf16 fused kernel ...
EXPLICIT_MAX_KEYS = 128  # ... and up to this many keys runs the explicit product
_SAVES_INPUT = ("gelu", "gelu_tanh", "silu")  # the others' backward needs only their output


def activation_bytes(
    config: GPTConfig,
    batch_size: int,
    seq_len: int,
    dtype: Any = "float32",
    *,
    param_dtype: Any = "float32",
    attn_impl: str = "sdpa",
) -> int:
    """Bytes autograd keeps from the forward pass for the backward, at batch B × T.

    r = itemsize of the weights (and so of the residual stream), s = of the compute dtype
    (s < r under autocast). Per token and block:

    - each norm: its input (r·d), its output as the next matmul's input (s·d), float32
      statistics; RMSNorm (a composite kernel) also keeps x/rms (r·d);
    - attention, fused kernel: the q|k|v buffer and z (s·4·H·d_head), a float32 log-sum-exp
      per head, and with RoPE the rotated q and k (s·2·H·d_head); the explicit path keeps
      q, k, v, z and the pattern (s·H·T), with dropout also its mask and the dropped
      pattern (s·2·H·T); dropout on the pattern sends the fused kernel to its float32
      fallback, which keeps q, k, v, the pattern, its mask and the dropped pattern (4 bytes);
      bf16 CPU heads narrower than 64 take the explicit product up to 128 keys, which keeps
      q, k, v, z, the float32 softmax (4·H·T) and its bf16 copy (s·H·T);
    - MLP: the matmul input of W_out and each activation's input (GELU, SiLU) or output
      (ReLU, sigmoid, tanh): s·2·d_mlp (ReLU s·d_mlp); gated: σ(gate), σ'(value) and
      their product, plus each arm's pre-activation where its σ keeps its input; under
      autocast the two arms cast their input separately (s·d);
    - dropout > 0: a mask like each residual branch (s·d each) and like x₀ (r·d).

    Then the post-norm model's x₀ (s·d), the final norm (pre-norm), the logits (s·n_vocab,
    held by the caller), the cross-entropy's float32 log-probabilities and the int64
    tokens and targets. Once per step: the fused [W_Q | W_K | W_V] built by the forward pass
    (s·3·d·H·d_head per block) and, under autocast, the s-byte copy of every other matmul
    weight. ``tests/model/test_accounting.py`` checks this against what autograd saves.
    """
    c = config
    s, r = itemsize(dtype), itemsize(param_dtype)
    for field, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(field, f"must be a positive integer, got {value!r}")
    if attn_impl not in ("sdpa", "explicit"):
        raise ConfigError("attn_impl", f"must be 'sdpa' or 'explicit', got {attn_impl!r}")
    d, H, dh, dm, T, V = c.d_model, c.n_heads, _int(c.d_head), _int(c.d_mlp), seq_len, c.n_vocab
    dropout, autocast = c.dropout > 0.0, s < r
    norm = r * d + s * d + (8 if c.norm == "layernorm" else 4 + r * d)
    if attn_impl == "explicit":
        attn = s * (4 * H * dh + H * T * (3 if dropout else 1))
    elif dropout:  # the fused kernel falls back to float32 math: q, k, v, pattern, mask, dropped
        attn = 4 * (3 * H * dh + 3 * H * T) + s * H * dh
    elif s == 2 and dh < SMALL_HEAD and T <= EXPLICIT_MAX_KEYS:
        # CPU bf16, small heads, short context: the explicit product; q, k, v, z and the
        # pattern in bf16 plus the softmax's float32 output
        attn = s * 4 * H * dh + (4 + s) * H * T
    elif autocast and dh < SMALL_HEAD:  # longer: the fused kernel in float32
        # float32 q, k, v and z, the bf16 z for W_O, the log-sum-exp
        # (measured: tests/model/test_accounting.py)
        attn = 4 * 4 * H * dh + s * H * dh + 4 * H
    else:
        attn = s * (4 * H * dh + (2 * H * dh if c.positional == "rope" else 0)) + 4 * H
    gate, value = c.mlp_activations
    if value is None:
        mlp = s * dm * (2 if gate in _SAVES_INPUT else 1)
    else:
        kept_inputs = (gate in _SAVES_INPUT) + (value in _SAVES_INPUT)
        mlp = s * dm * (3 + kept_inputs) + (s * d if autocast else 0)
    if c.attn_only:  # no MLP sublayer and no second norm
        per_block = norm + attn + (s * d if dropout else 0)
    else:
        per_block = 2 * norm + attn + mlp + (2 * s * d if dropout else 0)
    per_token = c.n_layers * per_block + s * V + 4 * V + 2 * 8
    per_token += norm if c.final_norm else s * d
    per_token += r * d if dropout else 0
    weights = s * c.n_layers * 3 * d * H * dh
    if autocast:  # a low-precision copy of each matmul weight, kept for the backward
        mlp_w = 0 if c.attn_only else (3 if c.gated else 2) * d * dm
        weights += s * (c.n_layers * (H * dh * d + mlp_w) + d * V)
    return batch_size * seq_len * per_token + weights


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one training step by component (see the module docstring for the formulas)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def as_dict(self) -> dict[str, int]:
        """Each component and the total."""
        return {**asdict(self), "total": self.total}


def estimate_training_memory(
    config: GPTConfig,
    batch_size: int,
    seq_len: int,
    dtype: Any = "float32",
    *,
    param_dtype: Any = "float32",
    attn_impl: str = "sdpa",
) -> MemoryEstimate:
    """Bytes for one AdamW step at batch B × T, with activations in ``dtype`` (the autocast
    dtype, or the weights' dtype without autocast) and weights stored in ``param_dtype``.

    >>> m = estimate_training_memory(GPTConfig.preset("gpt2"), 8, 1024, "bfloat16")
    >>> m.optimizer == 2 * m.weights, format_bytes(m.weights), format_bytes(m.activations)
    (True, '475 MiB', '5.10 GiB')
    """
    n = count_parameters(config)
    p = itemsize(param_dtype)
    master = 4 * n if p < 4 else 0
    return MemoryEstimate(
        weights=n * p,
        gradients=n * p,
        optimizer=8 * n + master,
        activations=activation_bytes(
            config, batch_size, seq_len, dtype, param_dtype=param_dtype, attn_impl=attn_impl
        ),
    )


def format_bytes(n: int) -> str:
    """Binary units, three significant figures.

    >>> format_bytes(3 * 2**30), format_bytes(1536), format_bytes(12), format_bytes(500 * 2**20)
    ('3.00 GiB', '1.50 KiB', '12 B', '500 MiB')
    """
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1000:
            break
        value, unit = value / 1024, bigger
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{decimals}f} {unit}"


def summary(config: GPTConfig) -> Mapping[str, int]:
    """The headline numbers: N, non-embedding N, forward and training FLOPs/token at n_ctx."""
    f = flops_per_token(config)
    return {
        "parameters": count_parameters(config),
        "non_embedding_parameters": count_parameters(config, non_embedding=True),
        "forward_flops_per_token": f.forward,
        "training_flops_per_token": f.training,
    }
