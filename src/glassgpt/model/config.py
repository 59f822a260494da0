"""GPTConfig: the hyper-parameters of f_θ : V^n → Δ(V)^n, n ≤ n_ctx, and every variant the math admits.

Shapes (row vectors, ``x @ W``): W_E [n_vocab, d_model], W_P [n_ctx, d_model],
W_Q/W_K/W_V [n_heads, d_model, d_head], W_O [n_heads, d_head, d_model],
W_in [d_model, d_mlp], W_out [d_mlp, d_model], W_U [d_model, n_vocab].

Variants, each one field on one code path:

- ``positional``: ``learned`` (x₀ = X W_E + W_P), ``sinusoidal`` (PE(p, 2i) = sin(p / 10000^(2i/d_model)),
  PE(p, 2i+1) = cos(p / 10000^(2i/d_model))), ``rope`` (q and k rotated by position, base
  ``rope_base``), ``none`` (positions only through the causal mask).
- ``norm``: ``layernorm`` (N(x) = (x − μ)/√(σ² + ε) ⊙ w + b) or ``rmsnorm`` (x/√(mean(x²) + ε) ⊙ w).
- ``norm_placement``: ``pre`` (x + f(N(x)), with a final N before W_U) or ``post`` (N(x + f(x))).
- ``mlp``: ``relu``/``relu2`` (max(0, x)²)/``gelu``/``gelu_tanh`` (σ(x W_in + b_in) W_out + b_out) or ``gated``
  ((σ(x W_gate + b_gate) ⊙ σ'(x W_in + b_in)) W_out + b_out, σ = ``mlp_gate``,
  σ' = ``mlp_value``); ``swiglu`` (σ = silu, σ' = identity) and ``geglu`` (σ = gelu,
  σ' = identity) are the named cases.
- ``tie_embeddings``: W_U = W_Eᵀ. ``bias``: every b_* present or absent; ``unembed_bias``:
  b_U present when ``bias`` is (default false: GPT-2 has no b_U, so every model exports).
- ``attn_only``: blocks without the MLP sublayer (x_out = x_mid; no ln2, no mlp weights), the
  attention-only models of the circuits literature.

The decoder-only families (Llama, Qwen, Mistral, Gemma, GPT-NeoX) differ by these fields:

- ``n_kv_heads`` = G (default n_heads): grouped-query attention. W_K, W_V [G, d_model, d_head]
  (b_K, b_V [G, d_head]); query head h reads the keys and values of group h // (n_heads / G).
- ``qkv_bias``: b_Q, b_K, b_V without the other biases (``bias`` false; Qwen 2).
- ``qk_norm``: q_h ← RMSNorm(q_h) ⊙ w_q, k_h ← RMSNorm(k_h) ⊙ w_k over d_head, weights
  [d_head] shared by the heads, before the rotation (Qwen 3, Gemma 3).
- ``rotary_fraction``: RoPE on the first r = rotary_fraction · d_head dimensions of each
  head (r even), the others unrotated (GPT-NeoX's ``rotary_pct``).
- ``rope_scaling`` (``none``, ``linear``, ``llama3``, ``yarn``) with ``rope_factor``,
  ``rope_low_freq_factor``, ``rope_high_freq_factor``, ``rope_original_ctx`` (default
  n_ctx), ``rope_beta_fast``, ``rope_beta_slow``: the inverse frequencies of transformers'
  ``modeling_rope_utils`` (YaRN's attention factor included; see ``layers.rope_frequencies``).
- ``parallel_residual``: x_out = x + Attn(N₁(x)) + MLP(N₂(x)) (GPT-NeoX).
- ``embed_scale`` = s: x₀ = s · X W_E (+ P) (Gemma: √d_model).
- ``norm_offset`` = o: every norm (q/k-norms too) is N(x) ⊙ (o + w) (Gemma: 1 + w).
- ``sandwich_norm``: a norm after each sublayer too, x + N'(f(N(x))) (Gemma 2, 3).
- ``attn_softcap``, ``final_softcap`` = c: c·tanh(z/c) on the attention scores (before the
  mask) and on the logits (Gemma 2).
- ``attn_scale``: the scores are q kᵀ · attn_scale instead of q kᵀ/√d_head (Gemma's
  query_pre_attn_scalar^−½).
- ``sliding_window`` = w, ``layer_types`` (each ``full`` or ``sliding``; default all
  ``sliding`` when w is set, else all ``full``), ``rope_local_base``: on sliding layers query
  i sees key j iff i − w < j ≤ i (transformers' ``sliding_window_overlay``), and rotates by
  plain RoPE at ``rope_local_base`` when it is set (Gemma 3's local layers; no scaling).

Every default is the function without the variant, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from glassgpt.config import check, from_dict, to_dict
from glassgpt.errors import ConfigError

Positional = Literal["learned", "sinusoidal", "rope", "none"]
Norm = Literal["layernorm", "rmsnorm"]
Placement = Literal["pre", "post"]
MLPKind = Literal["relu", "relu2", "gelu", "gelu_tanh", "gated", "swiglu", "geglu"]
Activation = Literal["sigmoid", "relu", "relu2", "gelu", "gelu_tanh", "silu", "tanh", "identity"]
RopeScaling = Literal["none", "linear", "llama3", "yarn"]

POSITIONALS: tuple[str, ...] = ("learned", "sinusoidal", "rope", "none")
NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")
PLACEMENTS: tuple[str, ...] = ("pre", "post")
MLPS: tuple[str, ...] = ("relu", "relu2", "gelu", "gelu_tanh", "gated", "swiglu", "geglu")
ROPE_SCALINGS: tuple[str, ...] = ("none", "linear", "llama3", "yarn")
LAYER_TYPES: tuple[str, ...] = ("full", "sliding")


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of the GPT function; validated on construction (errors name the field).

    >>> c = GPTConfig(n_vocab=65, n_ctx=8, d_model=12, n_layers=1, n_heads=3)
    >>> (c.d_head, c.d_mlp)
    (4, 48)
    >>> GPTConfig(d_model=10, n_heads=3)
    Traceback (most recent call last):
    ...
    glassgpt.errors.ConfigError: n_heads: n_heads=3 does not divide d_model=10; set d_head explicitly
    """

    n_vocab: int = 50257
    n_ctx: int = 1024
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_head: int | None = None  # default d_model / n_heads
    d_mlp: int | None = None  # default 4 · d_model
    positional: Positional = "learned"
    rope_base: float = 10000.0
    norm: Norm = "layernorm"
    norm_placement: Placement = "pre"
    norm_eps: float = 1e-5
    mlp: MLPKind = "gelu_tanh"
    mlp_gate: Activation = "sigmoid"  # σ on the gate arm x W_gate + b_gate (mlp = "gated")
    mlp_value: Activation = "sigmoid"  # σ' on the value arm x W_in + b_in (mlp = "gated")
    tie_embeddings: bool = True
    bias: bool = True
    unembed_bias: bool = False  # b_U (only where bias is true); none, as GPT-2's lm_head
    attn_only: bool = False  # no MLP sublayer in any block
    dropout: float = 0.0
    init_std: float = 0.02
    # -- the decoder-only families (see the module docstring) --
    n_kv_heads: int | None = None  # G; default n_heads (read ``kv_heads``)
    qkv_bias: bool = False  # b_Q, b_K, b_V where ``bias`` is false (Qwen 2)
    qk_norm: bool = False  # RMSNorm of each head's q and k over d_head
    rotary_fraction: float = 1.0  # RoPE on the first rotary_fraction · d_head dimensions
    rope_scaling: RopeScaling = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_ctx: int | None = None  # llama3, yarn; default n_ctx
    rope_beta_fast: float = 32.0  # yarn
    rope_beta_slow: float = 1.0  # yarn
    parallel_residual: bool = False  # x + Attn(N₁(x)) + MLP(N₂(x))
    embed_scale: float = 1.0  # x₀ = s · X W_E
    norm_offset: float = 0.0  # N(x) ⊙ (offset + w)
    sandwich_norm: bool = False  # x + N'(f(N(x)))
    attn_softcap: float | None = None  # c·tanh(scores/c)
    final_softcap: float | None = None  # c·tanh(logits/c)
    attn_scale: float | None = None  # default 1/√d_head
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = (
        None  # "full" | "sliding" per layer (read ``layer_kinds``)
    )
    rope_local_base: float | None = None  # the RoPE base of sliding layers

    def __post_init__(self) -> None:
        for name in ("n_vocab", "n_ctx", "d_model", "n_layers", "n_heads"):
            value = getattr(self, name)
            check(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                name,
                f"must be a positive integer, got {value!r}",
            )
        _check_choice("positional", self.positional, POSITIONALS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("norm_placement", self.norm_placement, PLACEMENTS)
        _check_choice("mlp", self.mlp, MLPS)
        _check_choice("mlp_gate", self.mlp_gate, ACTIVATIONS)
        _check_choice("mlp_value", self.mlp_value, ACTIVATIONS)
        if self.d_head is None:
            check(
                self.d_model % self.n_heads == 0,
                "n_heads",
                f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                "set d_head explicitly",
            )
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        check(
            isinstance(self.d_head, int) and self.d_head >= 1,
            "d_head",
            f"must be a positive integer, got {self.d_head!r}",
        )
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        check(
            isinstance(self.d_mlp, int) and self.d_mlp >= 1,
            "d_mlp",
            f"must be a positive integer, got {self.d_mlp!r}",
        )
        if self.positional == "sinusoidal":
            check(
                self.d_model % 2 == 0,
                "d_model",
                f"sinusoidal positions need an even d_model, got {self.d_model}",
            )
        if self.positional == "rope":
            check(
                self.d_head % 2 == 0,  # type: ignore[operator]
                "d_head",
                f"rope rotates pairs of dimensions and needs an even d_head, got {self.d_head}",
            )
            check(self.rope_base > 1.0, "rope_base", f"must be > 1, got {self.rope_base}")
        check(self.norm_eps > 0.0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        check(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        check(self.init_std > 0.0, "init_std", f"must be > 0, got {self.init_std}")
        self._check_families()

    def _check_families(self) -> None:
        """The fields of the decoder-only families (each error names its field)."""
        H, G, dh = self.n_heads, self.n_kv_heads, self.d_head
        if G is not None:
            check(
                isinstance(G, int) and not isinstance(G, bool) and G >= 1 and H % G == 0,
                "n_kv_heads",
                f"must be a positive integer dividing n_heads={H}, got {G!r}",
            )
        check(
            not (self.qkv_bias and self.bias),
            "qkv_bias",
            "biases on q, k, v only are for bias = false (bias = true already has them)",
        )
        r = self.rotary_fraction
        check(0.0 < r <= 1.0, "rotary_fraction", f"must be in (0, 1], got {r}")
        if self.positional == "rope":
            check(
                abs(r * dh - self.rotary_dims) < 1e-9  # type: ignore[operator]
                and self.rotary_dims % 2 == 0
                and self.rotary_dims >= 2,
                "rotary_fraction",
                f"rotary_fraction · d_head = {r * dh:g} must be an even integer ≥ 2",  # type: ignore[operator]
            )
        _check_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check(self.rope_factor > 0.0, "rope_factor", f"must be > 0, got {self.rope_factor}")
        if self.rope_scaling in ("linear", "llama3", "yarn"):
            check(self.positional == "rope", "rope_scaling", "needs positional = rope")
        check(
            self.rope_high_freq_factor > self.rope_low_freq_factor > 0.0,
            "rope_high_freq_factor",
            f"must exceed rope_low_freq_factor > 0, got {self.rope_high_freq_factor} and "
            f"{self.rope_low_freq_factor}",
        )
        ctx = self.rope_original_ctx
        check(
            ctx is None or (isinstance(ctx, int) and not isinstance(ctx, bool) and ctx >= 1),
            "rope_original_ctx",
            f"must be a positive integer, got {ctx!r}",
        )
        check(
            self.rope_beta_fast > 0.0 and self.rope_beta_slow > 0.0,
            "rope_beta_fast",
            f"rope_beta_fast and rope_beta_slow must be > 0, got {self.rope_beta_fast} and "
            f"{self.rope_beta_slow}",
        )
        check(
            not self.parallel_residual or self.norm_placement == "pre",
            "parallel_residual",
            "needs norm_placement = pre",
        )
        check(
            not self.sandwich_norm or self.norm_placement == "pre",
            "sandwich_norm",
            "needs norm_placement = pre",
        )
        check(self.embed_scale > 0.0, "embed_scale", f"must be > 0, got {self.embed_scale}")
        check(math.isfinite(self.norm_offset), "norm_offset", "must be finite")
        for name in ("attn_softcap", "final_softcap", "attn_scale"):
            value = getattr(self, name)
            check(value is None or value > 0.0, name, f"must be > 0 or unset, got {value}")
        w = self.sliding_window
        check(
            w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 1),
            "sliding_window",
            f"must be a positive integer, got {w!r}",
        )
        if self.layer_types is not None:
            kinds = tuple(self.layer_types)
            object.__setattr__(self, "layer_types", kinds)
            check(
                len(kinds) == self.n_layers,
                "layer_types",
                f"needs one entry per layer ({self.n_layers}), got {len(kinds)}",
            )
            for kind in kinds:
                _check_choice("layer_types", kind, LAYER_TYPES)
            check(
                w is not None or "sliding" not in kinds,
                "layer_types",
                "a sliding layer needs sliding_window",
            )
        base = self.rope_local_base
        if base is not None:
            check(base > 1.0, "rope_local_base", f"must be > 1, got {base}")
            check(self.positional == "rope", "rope_local_base", "needs positional = rope")

    # -- the families' resolved fields -----------------------------------------------------
    def family_fields(self) -> list[str]:
        """The decoder-only family fields set away from their defaults (the variants a fast
        path written before them may not cover).

        >>> GPTConfig().family_fields(), GPTConfig(n_kv_heads=4, final_softcap=30.0).family_fields()
        ([], ['n_kv_heads', 'final_softcap'])
        """
        out = []
        for name in FAMILY_FIELDS:
            value, default = getattr(self, name), _DEFAULTS[name]
            if name == "n_kv_heads":
                value, default = self.kv_heads, self.n_heads
            if name == "layer_types":  # an explicit list that says what the default says
                kind = "sliding" if self.sliding_window is not None else "full"
                value, default = self.layer_kinds, (kind,) * self.n_layers
            if value != default:
                out.append(name)
        return out

    @property
    def kv_heads(self) -> int:
        """G, the number of key/value heads (n_kv_heads, default n_heads).

        >>> GPTConfig(n_heads=12, n_kv_heads=4).kv_heads, GPTConfig(n_heads=12).kv_heads
        (4, 12)
        """
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def rotary_dims(self) -> int:
        """r = rotary_fraction · d_head, the rotated dimensions of each head.

        >>> GPTConfig(d_model=64, n_heads=2, rotary_fraction=0.25).rotary_dims
        8
        """
        return round(self.rotary_fraction * self.d_head)  # type: ignore[operator]

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's ``full`` or ``sliding`` (layer_types, or its default).

        >>> GPTConfig(n_layers=2, sliding_window=4).layer_kinds
        ('sliding', 'sliding')
        """
        if self.layer_types is not None:
            return self.layer_types
        return ("sliding" if self.sliding_window is not None else "full",) * self.n_layers

    # -- the resolved variant -------------------------------------------------------------
    @property
    def gated(self) -> bool:
        """True for the gated MLP family (gated, swiglu, geglu)."""
        return self.mlp in ("gated", "swiglu", "geglu")

    @property
    def mlp_activations(self) -> tuple[str, str | None]:
        """(σ, σ'): the activation (of the gate arm, if gated) and, for gated MLPs, of the value arm.

        >>> GPTConfig(mlp="swiglu").mlp_activations
        ('silu', 'identity')
        >>> GPTConfig(mlp="relu").mlp_activations
        ('relu', None)
        """
        if self.mlp == "swiglu":
            return ("silu", "identity")
        if self.mlp == "geglu":
            return ("gelu", "identity")
        if self.mlp == "gated":
            return (self.mlp_gate, self.mlp_value)
        return (self.mlp, None)

    @property
    def final_norm(self) -> bool:
        """Pre-norm models apply a final norm before W_U; post-norm models end normalised."""
        return self.norm_placement == "pre"

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named preset (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``,
        ``shakespeare-char``, ``cpu-tiny``), with optional field overrides.

        >>> GPTConfig.preset("gpt2-xl").n_heads
        25
        """
        if name not in PRESETS:
            raise ConfigError("preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, prefix: str = "") -> GPTConfig:
        """Build from a plain mapping (a TOML table); unknown keys raise naming the key."""
        return from_dict(cls, data, prefix=prefix)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config as a plain dict (d_head and d_mlp filled in)."""
        return to_dict(self)

    def replace(self, **changes: Any) -> GPTConfig:
        """A copy with some fields changed (re-validated)."""
        return dataclasses.replace(self, **changes)


FAMILY_FIELDS: tuple[str, ...] = (
    "n_kv_heads", "qkv_bias", "qk_norm", "rotary_fraction", "rope_scaling", "parallel_residual",
    "embed_scale", "norm_offset", "sandwich_norm", "attn_softcap", "final_softcap", "attn_scale",
    "sliding_window", "layer_types", "rope_local_base",
)  # fmt: skip
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig)}

ACTIVATIONS: tuple[str, ...] = (
    "sigmoid",
    "relu",
    "relu2",
    "gelu",
    "gelu_tanh",
    "silu",
    "tanh",
    "identity",
)

_GPT2 = {
    "n_vocab": 50257,
    "n_ctx": 1024,
    "mlp": "gelu_tanh",
    "tie_embeddings": True,
    "unembed_bias": False,  # GPT-2's lm_head has no bias
}

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {**_GPT2, "d_model": 768, "n_layers": 12, "n_heads": 12},
    "gpt2-medium": {**_GPT2, "d_model": 1024, "n_layers": 24, "n_heads": 16},
    "gpt2-large": {**_GPT2, "d_model": 1280, "n_layers": 36, "n_heads": 20},
    "gpt2-xl": {**_GPT2, "d_model": 1600, "n_layers": 48, "n_heads": 25},
    # nanoGPT's Tiny Shakespeare character model (its vocabulary has 65 symbols).
    "shakespeare-char": {
        "n_vocab": 65,
        "n_ctx": 256,
        "d_model": 384,
        "n_layers": 6,
        "n_heads": 6,
        "dropout": 0.2,
    },
    # Small enough to train in minutes on 2 CPU cores.
    "cpu-tiny": {
        "n_vocab": 65,
        "n_ctx": 64,
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
    },
}


def _check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(field, f"must be one of {', '.join(choices)}; got {value!r}")
