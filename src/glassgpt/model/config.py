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
"""

from __future__ import annotations

import dataclasses
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

POSITIONALS: tuple[str, ...] = ("learned", "sinusoidal", "rope", "none")
NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")
PLACEMENTS: tuple[str, ...] = ("pre", "post")
MLPS: tuple[str, ...] = ("relu", "relu2", "gelu", "gelu_tanh", "gated", "swiglu", "geglu")


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
