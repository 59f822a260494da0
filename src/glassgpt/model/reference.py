"""The GPT function written out literally in NumPy float64: the independent oracle for ``GPT``.

    X ∈ {0,1}^{n × n_vocab} one-hot,  x₀ = X W_E + P
    per head: A_h = softmax(q_h k_hᵀ/√d_head + M),  M[i, j] = −∞ for j > i
    Attn(x) = Σ_h A_h v_h W_O[h] + b_O
    pre-norm:  x ← x + Attn(N₁(x)),  x ← x + MLP(N₂(x));   logits = N_f(x) W_U + b_U
    post-norm: x ← N₁(x + Attn(x)),  x ← N₂(x + MLP(x));   logits = x W_U + b_U
    (attention-only models skip the MLP step and its norm N₂)

Slow on purpose: loops over heads, the mask as a matrix, norms and activations from their
formulas (the exact GELU through ``math.erf``). It imports neither torch nor any glassgpt
code (the config is only read for its fields), so an error in ``GPT`` cannot hide here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Array = np.ndarray


def softmax(x: Array, axis: int = -1) -> Array:
    """exp(x − max) / Σ exp(x − max) along ``axis``; −∞ entries get probability 0.

    >>> softmax(np.array([0.0, np.log(3.0), -np.inf])).round(6).tolist()
    [0.25, 0.75, 0.0]
    """
    z = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return z / np.sum(z, axis=axis, keepdims=True)


_erf = np.vectorize(math.erf)

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "relu2": lambda x: np.maximum(x, 0.0) ** 2,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: (
        0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "identity": lambda x: x,
}


def one_hot(tokens: Array, n_vocab: int) -> Array:
    """X [n, n_vocab] with X[t, tokens[t]] = 1.

    >>> one_hot(np.array([2, 0]), 3).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    X = np.zeros((len(tokens), n_vocab))
    X[np.arange(len(tokens)), tokens] = 1.0
    return X


def sinusoidal(n: int, d: int) -> Array:
    """PE [n, d]: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    PE = np.zeros((n, d))
    for p in range(n):
        for i in range(d // 2):
            angle = p / 10000.0 ** (2 * i / d)
            PE[p, 2 * i] = math.sin(angle)
            PE[p, 2 * i + 1] = math.cos(angle)
    return PE


def rope(x: Array, base: float) -> Array:
    """Rotate each pair (x[p, 2i], x[p, 2i+1]) of x [n, d_head] by θ = p · base^(−2i/d_head)."""
    n, d = x.shape
    out = np.empty_like(x)
    for p in range(n):
        for i in range(d // 2):
            theta = p * base ** (-2 * i / d)
            R = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
            out[p, 2 * i : 2 * i + 2] = R @ x[p, 2 * i : 2 * i + 2]
    return out


def norm(cfg: Any, w: Mapping[str, Array], name: str, x: Array) -> Array:
    """LayerNorm (x − μ)/√(σ² + ε) ⊙ w + b or RMSNorm x/√(mean(x²) + ε) ⊙ w, row by row."""
    if cfg.norm == "layernorm":
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        y = (x - mu) / np.sqrt(var + cfg.norm_eps) * w[f"{name}.w"]
        return y + w[f"{name}.b"] if f"{name}.b" in w else y
    rms = np.sqrt((x**2).mean(axis=-1, keepdims=True) + cfg.norm_eps)
    return x / rms * w[f"{name}.w"]


def attention(cfg: Any, w: Mapping[str, Array], name: str, x: Array) -> Array:
    """Σ_h softmax(q_h k_hᵀ/√d_head + M) v_h W_O[h] + b_O for x [n, d_model]."""
    n = x.shape[0]
    M = np.zeros((n, n))
    M[np.triu_indices(n, k=1)] = -np.inf
    out = np.zeros((n, cfg.d_model))
    for h in range(cfg.n_heads):
        q, k, v = (x @ w[f"{name}.W_{c}"][h] + _bias(w, f"{name}.b_{c}", h) for c in "QKV")
        if cfg.positional == "rope":
            q, k = rope(q, cfg.rope_base), rope(k, cfg.rope_base)
        A = softmax(q @ k.T / math.sqrt(cfg.d_head) + M)  # [n, n]
        out += A @ v @ w[f"{name}.W_O"][h]
    return out + _bias(w, f"{name}.b_O")


def mlp(cfg: Any, w: Mapping[str, Array], name: str, x: Array) -> Array:
    """σ(x W_in + b_in) W_out + b_out, or (σ(x W_gate + b_gate) ⊙ σ'(x W_in + b_in)) W_out + b_out."""
    act, value_act = {
        "swiglu": ("silu", "identity"),
        "geglu": ("gelu", "identity"),
        "gated": (cfg.mlp_gate, cfg.mlp_value),
    }.get(cfg.mlp, (cfg.mlp, None))
    pre = x @ w[f"{name}.W_in"] + _bias(w, f"{name}.b_in")
    if value_act is None:
        hidden = ACTIVATIONS[act](pre)
    else:
        gate = x @ w[f"{name}.W_gate"] + _bias(w, f"{name}.b_gate")
        hidden = ACTIVATIONS[act](gate) * ACTIVATIONS[value_act](pre)
    return hidden @ w[f"{name}.W_out"] + _bias(w, f"{name}.b_out")


def forward(cfg: Any, weights: Mapping[str, Any], tokens: Any) -> Array:
    """Logits [n, n_vocab] for tokens [n] (or [B, n, n_vocab] for tokens [B, n]), float64.

    ``cfg`` is a GPTConfig; ``weights`` maps the GPT state-dict names to arrays.
    """
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:
        return np.stack([forward(cfg, w, row) for row in tokens])
    n = len(tokens)
    x = one_hot(tokens, cfg.n_vocab) @ w["embed.W_E"]  # [n, d_model]
    if cfg.positional == "learned":
        x = x + w["pos_embed.W_P"][:n]
    elif cfg.positional == "sinusoidal":
        x = x + sinusoidal(n, cfg.d_model)
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}"
        if cfg.norm_placement == "pre":
            x = x + attention(cfg, w, f"{p}.attn", norm(cfg, w, f"{p}.ln1", x))
            if not cfg.attn_only:
                x = x + mlp(cfg, w, f"{p}.mlp", norm(cfg, w, f"{p}.ln2", x))
        else:
            x = norm(cfg, w, f"{p}.ln1", x + attention(cfg, w, f"{p}.attn", x))
            if not cfg.attn_only:
                x = norm(cfg, w, f"{p}.ln2", x + mlp(cfg, w, f"{p}.mlp", x))
    if cfg.norm_placement == "pre":
        x = norm(cfg, w, "ln_final", x)
    W_U = w["embed.W_E"].T if cfg.tie_embeddings else w["unembed.W_U"]
    return x @ W_U + _bias(w, "unembed.b_U")


def cross_entropy(logits: Array, targets: Array) -> float:
    """Mean over positions with target ≠ −1 of −log softmax(logits)[target]."""
    logits = logits.reshape(-1, logits.shape[-1])
    targets = np.asarray(targets).reshape(-1)
    keep = targets != -1
    p = softmax(logits[keep])
    return float(-np.mean(np.log(p[np.arange(keep.sum()), targets[keep]])))


def _bias(w: Mapping[str, Array], key: str, head: int | None = None) -> Array | float:
    if key not in w:
        return 0.0
    return w[key] if head is None else w[key][head]
