"""The attention equations of ``describe``: q, k, v per head (groups, q/k-norms), the
rotation and its frequencies (partial, scaled, local), the scores (scale, soft-cap, sliding
window), the pattern and Attn(x), each as a Unicode and a LaTeX form. Pure Python."""

from __future__ import annotations

from glassgpt.model.config import GPTConfig
from glassgpt.model.document import Math


def attention_equations(c: GPTConfig) -> list[Math]:
    """q, k, v per head (groups, q/k-norm, RoPE), scores, pattern, z and Attn(x)."""
    eqs: list[Math] = []
    H, G = c.n_heads, c.kv_heads
    g_u, g_t = ("h", "h") if G == H else ("g", "g")
    for m in "qkv":
        head_u, head_t = ("h", "h") if m == "q" else (g_u, g_t)
        bm = f" + b_{m.upper()}[{head_u}]" if c.bias or c.qkv_bias else ""
        eqs.append(Math(f"{m}_{head_u} = x W_{m.upper()}[{head_u}]{bm}",
                        rf"{m}_{head_t} &= x W_{m.upper()}[{head_t}]{bm}"))  # fmt: skip
    if G != H:
        eqs.append(Math(
            f"g = ⌊h / {H // G}⌋:   the {H} query heads share G = n_kv_heads = {G} key/value heads",
            rf"g &= \lfloor h / {H // G} \rfloor \quad \text{{(grouped-query: }} G = {G}\text{{)}}",
        ))  # fmt: skip
    if c.qk_norm:
        o = f"{c.norm_offset:g} + " if c.norm_offset else ""
        eqs.append(Math(
            f"q_h ← q_h / √(mean(q_h²) + ε) ⊙ ({o}w_q),   k_{g_u} ← the same with w_k   (qk_norm, over d_head)",
            rf"q_h &\leftarrow \frac{{q_h}}{{\sqrt{{\overline{{q_h^2}} + \epsilon}}}} \odot ({o}w_q), \quad k_{g_t} \text{{ likewise with }} w_k",
        ))  # fmt: skip
    if c.positional == "rope":
        eqs += _rope_equations(c, g_u)
    a_u, a_t = ("/ √d_head", r"/ \sqrt{d_{head}}") if c.attn_scale is None else (
        f"· {c.attn_scale:g}", rf"\cdot {c.attn_scale:g}")  # fmt: skip
    qk_u, qk_t = f"q_h k_{g_u}ᵀ {a_u}", rf"q_h k_{g_t}^{{\top}} {a_t}"
    if c.attn_softcap is not None:
        k = f"{c.attn_softcap:g}"
        qk_u, qk_t = f"c·tanh(({qk_u}) / c)", rf"c \tanh\big(({qk_t}) / c\big)"
        qk_u += f" (c = attn_softcap = {k})"
    eqs.append(Math(
        f"scores_h = {qk_u} + M,   M[i, j] = 0 if j ≤ i else −∞",
        rf"\mathrm{{scores}}_h &= {qk_t} + M, \quad M_{{ij}} = 0 \text{{ if }} j \leq i \text{{, else }} -\infty",
    ))  # fmt: skip
    if c.sliding_window is not None:
        kinds = c.layer_kinds
        which = ", ".join(str(i + 1) for i, kind in enumerate(kinds) if kind == "sliding")
        w = c.sliding_window
        eqs.append(Math(
            f"sliding layers ℓ ∈ {{{which}}}: M[i, j] = 0 iff i − {w} < j ≤ i   (window w = {w})",
            rf"M^{{\text{{sliding}}}}_{{ij}} &= 0 \iff i - {w} < j \leq i \quad \ell \in \{{{which}\}}",
        ))  # fmt: skip
    bo = " + b_O" if c.bias else ""
    eqs += [
        Math(
            f"pattern_h = softmax(scores_h) row-wise,   z_h = pattern_h v_{g_u}",
            rf"\mathrm{{pattern}}_h &= \operatorname{{softmax}}(\mathrm{{scores}}_h), \quad z_h = \mathrm{{pattern}}_h\, v_{g_t}",
        ),
        Math(f"Attn(x) = Σ_h z_h W_O[h]{bo}", rf"\mathrm{{Attn}}(x) &= \sum_h z_h W_O[h]{bo}"),
    ]
    return eqs


def _rope_equations(c: GPTConfig, g: str) -> list[Math]:
    """The rotation of q and k: the rotated dimensions, the frequencies and their scaling."""
    r = c.rotary_dims
    local = c.rope_local_base is not None and "sliding" in c.layer_kinds
    if r == c.d_head and c.rope_scaling == "none" and not local:
        return [Math(
            f"(q_h[p,2i], q_h[p,2i+1]) ← rotation by p θ_i, θ_i = {c.rope_base:g}^{{−2i/d_head}}  (the same for k_{g})",
            rf"(q_{{p,2i}}, q_{{p,2i+1}}) &\leftarrow R(p\,\theta_i)\,(q_{{p,2i}}, q_{{p,2i+1}}), \quad \theta_i = {c.rope_base:g}^{{-2i/d_{{head}}}} \quad \text{{(and }}k\text{{)}}",
        )]  # fmt: skip
    part = (
        "" if r == c.d_head else f", 2i < r = {r} (the other {c.d_head - r} dimensions unrotated)"
    )
    part_t = "" if r == c.d_head else rf", 2i < r = {r}"
    eqs = [Math(
        f"(q_h[p,2i], q_h[p,2i+1]) ← rotation by p θ_i, scaled by a{part}  (the same for k_{g})",
        rf"(q_{{p,2i}}, q_{{p,2i+1}}) &\leftarrow a\,R(p\,\theta_i)\,(q_{{p,2i}}, q_{{p,2i+1}}){part_t} \quad \text{{(and }}k\text{{)}}",
    )]  # fmt: skip
    b, f = f"{c.rope_base:g}", f"{c.rope_factor:g}"
    L = c.n_ctx if c.rope_original_ctx is None else c.rope_original_ctx
    base_u, base_t = f"θ⁰_i = {b}^{{−2i/{r}}}", rf"\theta^0_i = {b}^{{-2i/{r}}}"
    rule = {
        "none": ("θ_i = θ⁰_i,   a = 1", r"\theta_i = \theta^0_i, \; a = 1"),
        "linear": (
            f"θ_i = θ⁰_i / {f},   a = 1   (linear)",
            rf"\theta_i = \theta^0_i / {f}, \; a = 1",
        ),
        "llama3": (
            f"θ_i = θ⁰_i if λ_i < {L}/{c.rope_high_freq_factor:g}, θ⁰_i/{f} if λ_i > {L}/{c.rope_low_freq_factor:g}, "
            f"else (1 − s) θ⁰_i/{f} + s θ⁰_i, s = ({L}/λ_i − {c.rope_low_freq_factor:g})/"
            f"({c.rope_high_freq_factor:g} − {c.rope_low_freq_factor:g}), λ_i = 2π/θ⁰_i,   a = 1   (llama3)",
            rf"\theta_i = \text{{llama3}}(\theta^0_i; f = {f}, L = {L}), \; a = 1",
        ),
        "yarn": (
            f"θ_i = θ⁰_i/{f} · (1 − e_i) + θ⁰_i e_i, e_i = 1 − clamp((i − lo)/(hi − lo), 0, 1), "
            f"lo, hi from β = {c.rope_beta_fast:g}, {c.rope_beta_slow:g} at L = {L},   a = 0.1 ln {f} + 1   (yarn)",
            rf"\theta_i = \text{{yarn}}(\theta^0_i; f = {f}, L = {L}), \; a = 0.1 \ln {f} + 1",
        ),
    }[c.rope_scaling]
    eqs.append(Math(f"{base_u},   {rule[0]}", rf"{base_t}, &\quad {rule[1]}"))
    if c.rope_local_base is not None and "sliding" in c.layer_kinds:
        lb = f"{c.rope_local_base:g}"
        eqs.append(Math(f"sliding layers: θ_i = {lb}^{{−2i/{r}}},   a = 1   (rope_local_base)",
                        rf"\theta^{{\text{{sliding}}}}_i &= {lb}^{{-2i/{r}}}"))  # fmt: skip
    return eqs
