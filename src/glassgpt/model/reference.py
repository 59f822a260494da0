"""The GPT function written out literally in NumPy float64: the independent oracle for ``GPT``.

    X ∈ {0,1}^{n × n_vocab} one-hot,  x₀ = s · X W_E + P            (s = embed_scale)
    per head h, group g = h // (H/G):
        q_h = x W_Q[h] + b_Q[h],  k_g = x W_K[g] + b_K[g],  v_g = x W_V[g] + b_V[g]
        (qk_norm: RMSNorm over d_head with gain o + w; RoPE on the first r dimensions)
        A_h = softmax(cap(q_h k_gᵀ · a) + M),  a = attn_scale or 1/√d_head,
        M[i, j] = −∞ for j > i (and for j ≤ i − w on a sliding layer)
    Attn(x) = Σ_h A_h v_g W_O[h] + b_O
    pre-norm:  x ← x + F₁(Attn(N₁(x))),  x ← x + F₂(MLP(N₂(x)))   (F = N' with sandwich
               norms, else id; parallel residual: x ← x + F₁(Attn(N₁(x))) + F₂(MLP(N₂(x))))
    post-norm: x ← N₁(x + Attn(x)),  x ← N₂(x + MLP(x))
    logits = cap_f(N_f(x) W_U + b_U)                                (N_f for pre-norm only)
    (attention-only models skip the MLP step and its norm N₂; every norm's gain is o + w)

The RoPE frequencies (and their scalings) are written out below from transformers'
``modeling_rope_utils`` formulas, one frequency at a time.

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


def frequency(cfg: Any, i: int, r: int, local: bool) -> tuple[float, float]:
    """(ω_i, a): the inverse frequency of pair i of r rotated dimensions and the factor on
    cos and sin, for the config's ``rope_scaling`` (none on a local layer with its own base)."""
    own_base = local and cfg.rope_local_base is not None
    base = cfg.rope_local_base if own_base else cfg.rope_base
    scaling = "none" if own_base else cfg.rope_scaling
    omega = 1.0 / base ** (2 * i / r)
    f = cfg.rope_factor
    L = cfg.n_ctx if cfg.rope_original_ctx is None else cfg.rope_original_ctx
    if scaling == "linear":
        return omega / f, 1.0
    if scaling == "llama3":
        wavelength = 2 * math.pi / omega
        lo, hi = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        if wavelength < L / hi:  # high frequencies: kept
            return omega, 1.0
        if wavelength > L / lo:  # low frequencies: interpolated
            return omega / f, 1.0
        s = (L / wavelength - lo) / (hi - lo)  # between them: smoothly from one to the other
        return (1 - s) * omega / f + s * omega, 1.0
    if scaling == "yarn":

        def correction_dim(rotations: float) -> float:
            return r * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(cfg.rope_beta_fast)), 0)
        high = min(math.ceil(correction_dim(cfg.rope_beta_slow)), r - 1)
        if low == high:
            high += 0.001
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolation = 1.0 - ramp
        a = 0.1 * math.log(f) + 1.0 if f > 1 else 1.0
        return omega / f * (1 - extrapolation) + omega * extrapolation, a
    return omega, 1.0


def rope(cfg: Any, x: Array, local: bool = False) -> Array:
    """Rotate each pair (x[p, 2i], x[p, 2i+1]), 2i < r = rotary_fraction · d_head, of x
    [n, d_head] by θ = p · ω_i (and scale it by the factor a); the rest unrotated."""
    n, d = x.shape
    r = round(cfg.rotary_fraction * d)
    out = x.copy()
    for p in range(n):
        for i in range(r // 2):
            omega, a = frequency(cfg, i, r, local)
            theta = p * omega
            R = a * np.array(
                [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]]
            )
            out[p, 2 * i : 2 * i + 2] = R @ x[p, 2 * i : 2 * i + 2]
    return out


def norm(cfg: Any, w: Mapping[str, Array], name: str, x: Array, kind: str | None = None) -> Array:
    """LayerNorm (x − μ)/√(σ² + ε) ⊙ (o + w) + b or RMSNorm x/√(mean(x²) + ε) ⊙ (o + w),
    row by row (o = norm_offset)."""
    gain = cfg.norm_offset + w[f"{name}.w"]
    if (kind or cfg.norm) == "layernorm":
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        y = (x - mu) / np.sqrt(var + cfg.norm_eps) * gain
        return y + w[f"{name}.b"] if f"{name}.b" in w else y
    rms = np.sqrt((x**2).mean(axis=-1, keepdims=True) + cfg.norm_eps)
    return x / rms * gain


def attention(
    cfg: Any, w: Mapping[str, Array], name: str, x: Array, sliding: bool = False
) -> Array:
    """Σ_h softmax(cap(q_h k_gᵀ · a) + M) v_g W_O[h] + b_O for x [n, d_model], g = h // (H/G)."""
    n = x.shape[0]
    M = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if j > i or (sliding and j <= i - cfg.sliding_window):
                M[i, j] = -np.inf
    H = cfg.n_heads
    G = H if cfg.n_kv_heads is None else cfg.n_kv_heads
    a = 1.0 / math.sqrt(cfg.d_head) if cfg.attn_scale is None else cfg.attn_scale
    out = np.zeros((n, cfg.d_model))
    for h in range(H):
        g = h // (H // G)
        q = x @ w[f"{name}.W_Q"][h] + _bias(w, f"{name}.b_Q", h)
        k = x @ w[f"{name}.W_K"][g] + _bias(w, f"{name}.b_K", g)
        v = x @ w[f"{name}.W_V"][g] + _bias(w, f"{name}.b_V", g)
        if cfg.qk_norm:
            q = norm(cfg, w, f"{name}.q_norm", q, "rmsnorm")
            k = norm(cfg, w, f"{name}.k_norm", k, "rmsnorm")
        if cfg.positional == "rope":
            q, k = rope(cfg, q, sliding), rope(cfg, k, sliding)
        scores = q @ k.T * a
        if cfg.attn_softcap is not None:
            scores = cfg.attn_softcap * np.tanh(scores / cfg.attn_softcap)
        A = softmax(scores + M)  # [n, n]
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
    x = cfg.embed_scale * (one_hot(tokens, cfg.n_vocab) @ w["embed.W_E"])  # [n, d_model]
    if cfg.positional == "learned":
        x = x + w["pos_embed.W_P"][:n]
    elif cfg.positional == "sinusoidal":
        x = x + sinusoidal(n, cfg.d_model)
    kinds = cfg.layer_types or (
        ("sliding" if cfg.sliding_window is not None else "full",) * cfg.n_layers
    )
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}"
        sliding = kinds[layer] == "sliding"

        def after(name: str, y: Array, p: str = p) -> Array:  # N' of a sandwich, else identity
            return norm(cfg, w, f"{p}.{name}", y) if cfg.sandwich_norm else y

        if cfg.norm_placement == "pre":
            attn = after(
                "ln1_post", attention(cfg, w, f"{p}.attn", norm(cfg, w, f"{p}.ln1", x), sliding)
            )
            if cfg.parallel_residual:
                if not cfg.attn_only:
                    attn = attn + after(
                        "ln2_post", mlp(cfg, w, f"{p}.mlp", norm(cfg, w, f"{p}.ln2", x))
                    )
                x = x + attn
                continue
            x = x + attn
            if not cfg.attn_only:
                x = x + after("ln2_post", mlp(cfg, w, f"{p}.mlp", norm(cfg, w, f"{p}.ln2", x)))
        else:
            x = norm(cfg, w, f"{p}.ln1", x + attention(cfg, w, f"{p}.attn", x))
            if not cfg.attn_only:
                x = norm(cfg, w, f"{p}.ln2", x + mlp(cfg, w, f"{p}.mlp", x))
    if cfg.norm_placement == "pre":
        x = norm(cfg, w, "ln_final", x)
    W_U = w["embed.W_E"].T if cfg.tie_embeddings else w["unembed.W_U"]
    logits = x @ W_U + _bias(w, "unembed.b_U")
    if cfg.final_softcap is not None:
        logits = cfg.final_softcap * np.tanh(logits / cfg.final_softcap)
    return logits


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
