"""Accounting: parameters N and FLOPs per token C of the GPT function.

Parameters: N = Σ over the state_dict of the product of each shape, e.g. for one block
2·d·H·d_head + 2·d·G·d_head (W_Q, W_O; W_K, W_V of the G = n_kv_heads groups)
+ 2·d·d_mlp (+ d·d_mlp gated) + biases + norm weights (+ 2·d_head with qk_norm, + 2·d with
sandwich norms).

FLOPs (matmuls only, 2 per multiply-add, per token, forward, at context length T):

    C_fwd = L · [2·d·(H+2G)·d_head (x W_Q, x W_K, x W_V)
               + 2·H·d_head·T     (q kᵀ, every key counted: the dense convention;
                                   T_l = min(T, sliding_window) on a sliding layer)
               + 2·H·d_head·T     (pattern v)
               + 2·H·d_head·d     (z W_O)
               + 2·k·d·d_mlp]     (k = 2, or 3 for gated MLPs)
          + 2·d·n_vocab           (x W_U)
    C_train = 3 · C_fwd           (the backward pass costs two forwards),

which is ≈ 6·N_non-embedding + 12·L·H·d_head·T per trained token (Kaplan et al.; PaLM).
Lookups (W_E, W_P), norms, softmax and activations are elementwise and not counted. A causal
mask lets a careful kernel skip about half of the two attention terms; we count them whole.

Training memory (bytes of one AdamW step) is in :mod:`glassgpt.model.memory`.

Arithmetic on the config alone: no tensor is made.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import cast

from glassgpt.errors import ConfigError
from glassgpt.model.config import GPTConfig


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
    d, H, dh, _dm, V = c.d_model, c.n_heads, _int(c.d_head), _int(c.d_mlp), c.n_vocab
    G = c.kv_heads
    norm_b = c.norm == "layernorm" and c.bias
    heads = {"Q": H, "K": G, "V": G}
    shapes: dict[str, tuple[int, ...]] = {"embed.W_E": (V, d)}
    if c.positional == "learned":
        shapes["pos_embed.W_P"] = (c.n_ctx, d)
    for l in range(c.n_layers):
        p = f"blocks.{l}."
        shapes[p + "ln1.w"] = (d,)
        if norm_b:
            shapes[p + "ln1.b"] = (d,)
        if c.qk_norm:
            shapes[p + "attn.q_norm.w"] = shapes[p + "attn.k_norm.w"] = (dh,)
        for m in "QKV":
            shapes[p + f"attn.W_{m}"] = (heads[m], d, dh)
        if c.bias or c.qkv_bias:
            for m in "QKV":
                shapes[p + f"attn.b_{m}"] = (heads[m], dh)
        shapes[p + "attn.W_O"] = (H, dh, d)
        if c.bias:
            shapes[p + "attn.b_O"] = (d,)
        if not c.attn_only:
            _mlp_shapes(c, shapes, p)
        if c.sandwich_norm:
            for n in ("ln1_post", "ln2_post")[: 1 if c.attn_only else 2]:
                shapes[p + f"{n}.w"] = (d,)
                if norm_b:
                    shapes[p + f"{n}.b"] = (d,)
    if c.final_norm:
        shapes["ln_final.w"] = (d,)
        if norm_b:
            shapes["ln_final.b"] = (d,)
    if not c.tie_embeddings:
        shapes["unembed.W_U"] = (d, V)
    if c.bias and c.unembed_bias:
        shapes["unembed.b_U"] = (V,)
    return shapes


def _mlp_shapes(c: GPTConfig, shapes: dict[str, tuple[int, ...]], p: str) -> None:
    """N₂ and the MLP of block prefix ``p``, into ``shapes``."""
    d, dm = c.d_model, _int(c.d_mlp)
    shapes[p + "ln2.w"] = (d,)
    if c.norm == "layernorm" and c.bias:
        shapes[p + "ln2.b"] = (d,)
    for arm in ("in", "gate") if c.gated else ("in",):
        shapes[p + f"mlp.W_{arm}"] = (d, dm)
        if c.bias:
            shapes[p + f"mlp.b_{arm}"] = (dm,)
    shapes[p + "mlp.W_out"] = (dm, d)
    if c.bias:
        shapes[p + "mlp.b_out"] = (d,)


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
    attn_qkv: int  # L · 2·d·(H+2G)·d_head
    attn_scores: int  # Σ_l 2·H·d_head·T_l   (q kᵀ)
    attn_mix: int  # Σ_l 2·H·d_head·T_l     (pattern v)
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
    G, w = c.kv_heads, c.sliding_window
    keys = sum(min(T, w) if kind == "sliding" and w else T for kind in c.layer_kinds)  # Σ_l T_l
    arms = 3 if c.gated else 2
    return FlopCount(
        seq_len=T,
        attn_qkv=L * 2 * d * (H + 2 * G) * dh,
        attn_scores=2 * H * dh * keys,
        attn_mix=2 * H * dh * keys,
        attn_out=L * 2 * H * dh * d,
        mlp=0 if c.attn_only else L * 2 * arms * d * dm,
        unembed=2 * d * c.n_vocab,
    )


def summary(config: GPTConfig) -> Mapping[str, int]:
    """The headline numbers: N, non-embedding N, forward and training FLOPs/token at n_ctx."""
    f = flops_per_token(config)
    return {
        "parameters": count_parameters(config),
        "non_embedding_parameters": count_parameters(config, non_embedding=True),
        "forward_flops_per_token": f.forward,
        "training_flops_per_token": f.training,
    }
