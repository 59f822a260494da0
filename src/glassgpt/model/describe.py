"""describe: the function f_θ : V^n → Δ(V)^n of one GPTConfig, written out as mathematics.

f = softmax ∘ U ∘ N_f ∘ B_L ∘ ⋯ ∘ B_1 ∘ E ∘ onehot, each map with its domain, codomain and
shapes, the block equations of the configured variants, the parameter table, FLOPs per token
and training memory (from :mod:`glassgpt.model.accounting`). The document is built once as
equations that carry both a Unicode form and a LaTeX form, then rendered as Markdown (Unicode
equations in text blocks, readable in a terminal) or as a standalone LaTeX document (align*)
(the document's parts and both renderers: :mod:`glassgpt.model.document`).
Pure Python: no torch import.
"""

from __future__ import annotations

from typing import Literal

from glassgpt.errors import ConfigError
from glassgpt.model.accounting import count_parameters, flops_per_token, parameter_table
from glassgpt.model.attention_equations import attention_equations
from glassgpt.model.config import GPTConfig
from glassgpt.model.document import Cell, Math, Section, latex, markdown
from glassgpt.model.memory import (
    estimate_training_memory,
    format_bytes,
    per_rank_memory,
    weight_bytes,
)

Format = Literal["markdown", "latex"]
FORMATS: tuple[str, ...] = ("markdown", "latex")


def _R(*dims: int | str) -> Math:
    return Math(
        "ℝ^{" + "×".join(map(str, dims)) + "}",
        r"\mathbb{R}^{" + r"\times ".join(map(str, dims)) + "}",
    )


def _tex_num(x: float) -> str:
    r"""A float in TeX: ``1e-05`` → ``10^{-5}``, ``2.5e-06`` → ``2.5 \cdot 10^{-6}``."""
    mantissa, _, exponent = f"{x:g}".partition("e")
    if not exponent:
        return mantissa
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \cdot {power}"


def _n(x: int) -> str:
    return f"{x:,}"


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


_ACT = {  # σ(x) for each activation name: (unicode, tex)
    "relu": ("max(0, x)", r"\max(0, x)"),
    "relu2": ("max(0, x)²", r"\max(0, x)^2"),
    "gelu": (
        "x Φ(x) = x · ½(1 + erf(x/√2))",
        r"x\,\Phi(x) = \frac{x}{2}\left(1 + \operatorname{erf}(x/\sqrt{2})\right)",
    ),
    "gelu_tanh": (
        "½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))",
        r"\frac{x}{2}\left(1 + \tanh\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)",
    ),
    "sigmoid": ("1 / (1 + e^{−x})", r"1 / (1 + e^{-x})"),
    "silu": ("x / (1 + e^{−x})", r"x / (1 + e^{-x})"),
    "tanh": ("tanh(x)", r"\tanh(x)"),
    "identity": ("x", "x"),
}


def _words(text: str) -> Math:
    return Math(text, rf"\text{{{text}}}")


def _maps(c: GPTConfig) -> Section:
    V, Rd, RV = c.n_vocab, _R("n", c.d_model), _R("n", c.n_vocab)
    X01 = Math(f"{{0,1}}^{{n×{V}}}", rf"\{{0,1\}}^{{n\times {V}}}")
    pe = {"learned": ("W_P[:n]", "W_P[{:}n]"), "sinusoidal": ("PE[:n]", "PE[{:}n]")}
    pe_u, pe_t = (f" + {pe[c.positional][i]}" if c.positional in pe else "" for i in (0, 1))
    wu = Math("W_Eᵀ", r"W_E^{\top}") if c.tie_embeddings else Math("W_U", "W_U")
    bu = " + b_U" if c.bias and c.unembed_bias else ""
    bo = " + b_O" if c.bias else ""
    rows = [
        (Math("onehot", r"\operatorname{onehot}"), Math("V^n", r"\mathcal{V}^n"), X01,
         Math("X[i, t_i] = 1", r"X_{i,t_i} = 1")),
        (Math("E", "E"), X01, Rd, Math(f"E(X) = X W_E{pe_u}", f"E(X) = X W_E{pe_t}")),
        (Math("N", "N"), Rd, Rd, _words(f"row-wise {c.norm}")),
        (Math("A_{ℓ,h}", r"A_{\ell,h}"), Rd, _R("n", c.d_head),
         Math(f"one head, h = 1, …, {c.n_heads}", rf"\text{{one head, }} h = 1, \ldots, {c.n_heads}")),
        (Math("Attn_ℓ", r"\mathrm{Attn}_\ell"), Rd, Rd,
         Math(f"Σ_h A_{{ℓ,h}}(x) W_O[h]{bo}", rf"\sum_h A_{{\ell,h}}(x) W_O[h]{bo}")),
        (Math("MLP_ℓ", r"\mathrm{MLP}_\ell"), Rd,
         Math(f"{_R('n', c.d_mlp).text} → {Rd.text}", rf"{_R('n', c.d_mlp).tex} \to {Rd.tex}"),
         _words("position-wise")),
        (Math("B_ℓ", r"B_\ell"), Rd, Rd,
         Math(f"ℓ = 1, …, {c.n_layers}", rf"\ell = 1, \ldots, {c.n_layers}")),
        (Math("U", "U"), Rd, RV, Math(f"U(x) = x {wu.text}{bu}", f"U(x) = x {wu.tex}{bu}")),
        (Math("softmax", r"\operatorname{softmax}"), RV, Math("Δ(V)^n", r"\Delta(\mathcal{V})^n"),
         _words("row-wise")),
    ]  # fmt: skip
    width = max(len(name.text) for name, *_ in rows)
    eqs = [
        Math(
            f"{name.text.ljust(width)} : {dom.text} → {cod.text},   {defn.text}",
            rf"{name.tex} &: {dom.tex} \to {cod.tex}, &\quad {defn.tex}",
        )
        for name, dom, cod, defn in rows
    ]
    nf_u, nf_t = (" ∘ N_f", r" \circ N_f") if c.final_norm else ("", "")
    L = c.n_layers
    eqs.append(
        Math(
            f"f = softmax ∘ U{nf_u} ∘ B_{L} ∘ ⋯ ∘ B_1 ∘ E ∘ onehot : V^n → Δ(V)^n",
            rf"f &= \operatorname{{softmax}} \circ U{nf_t} \circ B_{{{L}}} \circ \cdots \circ B_1"
            r" \circ E \circ \operatorname{onehot} : \mathcal{V}^n \to \Delta(\mathcal{V})^n",
        )
    )
    prose: list[Cell] = [
        "Tokens ", Math("t ∈ V^n", r"t \in \mathcal{V}^n"), " with ",
        Math(f"V = {{0, …, {V - 1}}}", rf"\mathcal{{V}} = \{{0, \ldots, {V - 1}\}}"), " and ",
        Math(f"1 ≤ n ≤ n_ctx = {c.n_ctx}", rf"1 \leq n \leq n_{{ctx}} = {c.n_ctx}"),
        "; row vectors, weights act on the right (x W).",
    ]  # fmt: skip
    return Section("Maps", prose=prose, equations=eqs)


def _stream_equations(c: GPTConfig) -> list[Math]:
    """x_0, the block of the configured norm placement, and the logits."""
    eqs: list[Math] = []
    b = c.bias
    pos = {
        "learned": Math("x_0 = X W_E + W_P[:n]", r"x_0 &= X W_E + W_P[{:}n]"),
        "sinusoidal": Math(
            "x_0 = X W_E + PE[:n],  PE[p, 2i] = sin(p / 10000^{2i/d}),  PE[p, 2i+1] = cos(p / 10000^{2i/d})",
            r"x_0 &= X W_E + PE[{:}n], \quad PE_{p,2i} = \sin(p / 10000^{2i/d}), \quad PE_{p,2i+1} = \cos(p / 10000^{2i/d})",
        ),
        "rope": Math(
            "x_0 = X W_E   (positions enter by rotating q and k)",
            r"x_0 &= X W_E \quad \text{(positions enter by rotating } q, k\text{)}",
        ),
        "none": Math(
            "x_0 = X W_E   (positions enter only through the mask M)",
            r"x_0 &= X W_E \quad \text{(positions enter only through the mask } M\text{)}",
        ),
    }
    x0 = pos[c.positional]
    if c.embed_scale != 1.0:
        k = f"{c.embed_scale:g}"
        x0 = Math(x0.text.replace("X W_E", "s · X W_E", 1) + f",   s = embed_scale = {k}",
                  x0.tex.replace("X W_E", r"s\, X W_E", 1) + rf", \quad s = {k}")  # fmt: skip
    eqs.append(x0)
    L = c.n_layers
    if c.parallel_residual:
        a_u, a_t = (
            (
                "N1'_ℓ(Attn_ℓ(N1_ℓ(x_{ℓ−1})))",
                r"N'_{1,\ell}(\mathrm{Attn}_\ell(N_{1,\ell}(x_{\ell-1})))",
            )
            if c.sandwich_norm
            else ("Attn_ℓ(N1_ℓ(x_{ℓ−1}))", r"\mathrm{Attn}_\ell(N_{1,\ell}(x_{\ell-1}))")
        )
        m_u, m_t = (
            (
                "N2'_ℓ(MLP_ℓ(N2_ℓ(x_{ℓ−1})))",
                r"N'_{2,\ell}(\mathrm{MLP}_\ell(N_{2,\ell}(x_{\ell-1})))",
            )
            if c.sandwich_norm
            else ("MLP_ℓ(N2_ℓ(x_{ℓ−1}))", r"\mathrm{MLP}_\ell(N_{2,\ell}(x_{\ell-1}))")
        )
        eqs.append(Math(
            f"x_ℓ = x_{{ℓ−1}} + {a_u} + {m_u},   ℓ = 1, …, {L}   (parallel residual)",
            rf"x_\ell &= x_{{\ell-1}} + {a_t} + {m_t}, \quad \ell = 1, \ldots, {L}",
        ))  # fmt: skip
    elif c.sandwich_norm:
        eqs += [
            Math("x_mid = x_{ℓ−1} + N1'_ℓ(Attn_ℓ(N1_ℓ(x_{ℓ−1})))   (a norm after each sublayer too)",
                 r"x_{mid} &= x_{\ell-1} + N'_{1,\ell}(\mathrm{Attn}_\ell(N_{1,\ell}(x_{\ell-1})))"),
            Math(f"x_ℓ = x_mid + N2'_ℓ(MLP_ℓ(N2_ℓ(x_mid))),   ℓ = 1, …, {L}",
                 rf"x_\ell &= x_{{mid}} + N'_{{2,\ell}}(\mathrm{{MLP}}_\ell(N_{{2,\ell}}(x_{{mid}}))), \quad \ell = 1, \ldots, {L}"),
        ]  # fmt: skip
    elif c.norm_placement == "pre":
        mid = Math(
            "x_mid = x_{ℓ−1} + Attn_ℓ(N1_ℓ(x_{ℓ−1}))",
            r"x_{mid} &= x_{\ell-1} + \mathrm{Attn}_\ell(N_{1,\ell}(x_{\ell-1}))",
        )
        out = Math(
            f"x_ℓ = x_mid + MLP_ℓ(N2_ℓ(x_mid)),   ℓ = 1, …, {L}",
            rf"x_\ell &= x_{{mid}} + \mathrm{{MLP}}_\ell(N_{{2,\ell}}(x_{{mid}})), \quad \ell = 1, \ldots, {L}",
        )
    else:
        mid = Math(
            "x_mid = N1_ℓ(x_{ℓ−1} + Attn_ℓ(x_{ℓ−1}))",
            r"x_{mid} &= N_{1,\ell}(x_{\ell-1} + \mathrm{Attn}_\ell(x_{\ell-1}))",
        )
        out = Math(
            f"x_ℓ = N2_ℓ(x_mid + MLP_ℓ(x_mid)),   ℓ = 1, …, {L}",
            rf"x_\ell &= N_{{2,\ell}}(x_{{mid}} + \mathrm{{MLP}}_\ell(x_{{mid}})), \quad \ell = 1, \ldots, {L}",
        )
    if not (c.parallel_residual or c.sandwich_norm):
        eqs += [mid, out]  # fmt: skip
    wu_u, wu_t = ("W_Eᵀ", r"W_E^{\top}") if c.tie_embeddings else ("W_U", "W_U")
    bu = " + b_U" if b and c.unembed_bias else ""
    nf_u, nf_t = ("N_f(x_L)", "N_f(x_L)") if c.final_norm else ("x_L", "x_L")
    eqs.append(
        Math(
            f"logits = {nf_u} {wu_u}{bu},   p = softmax(logits) row-wise",
            rf"\mathrm{{logits}} &= {nf_t}\, {wu_t}{bu}, \quad p = \operatorname{{softmax}}(\mathrm{{logits}})",
        )
    )
    if c.final_softcap is not None:
        k = f"{c.final_softcap:g}"
        eqs[-1] = Math(
            f"logits = c·tanh(({nf_u} {wu_u}{bu}) / c),   c = final_softcap = {k},   p = softmax(logits) row-wise",
            rf"\mathrm{{logits}} &= c \tanh\big({nf_t}\, {wu_t}{bu} / c\big), \quad c = {k}",
        )  # fmt: skip
    return eqs


def _norm_equation(c: GPTConfig) -> Math:
    """N(x): LayerNorm or RMSNorm."""
    eqs: list[Math] = []
    b = c.bias
    nb_u, nb_t = (" + b", " + b") if b else ("", "")
    if c.norm == "layernorm":
        eqs.append(
            Math(
                f"N(x) = (x − μ(x)) / √(σ²(x) + ε) ⊙ w{nb_u},   μ, σ² over the d = {c.d_model} features, ε = {c.norm_eps:g}",
                rf"N(x) &= \frac{{x - \mu(x)}}{{\sqrt{{\sigma^2(x) + \epsilon}}}} \odot w{nb_t}, \quad \epsilon = {_tex_num(c.norm_eps)}",
            )
        )
    else:
        eqs.append(
            Math(
                f"N(x) = x / √(mean(x²) + ε) ⊙ w,   ε = {c.norm_eps:g}",
                rf"N(x) &= \frac{{x}}{{\sqrt{{\overline{{x^2}} + \epsilon}}}} \odot w, \quad \epsilon = {_tex_num(c.norm_eps)}",
            )
        )
    if c.norm_offset:
        o = f"{c.norm_offset:g}"
        eqs[0] = Math(eqs[0].text.replace("⊙ w", f"⊙ ({o} + w)") + "   (norm_offset: every norm)",
                      eqs[0].tex.replace(r"\odot w", rf"\odot ({o} + w)"))  # fmt: skip
    return eqs[0]


def _mlp_equations(c: GPTConfig) -> list[Math]:
    """MLP(x) and its activations."""
    eqs: list[Math] = []
    b = c.bias
    gate, value = c.mlp_activations
    bi, bg, bout = (" + b_in", " + b_gate", " + b_out") if b else ("", "", "")
    sig = Math(
        f"σ(x) = {_ACT[gate][0]}   ({gate})",
        rf"\sigma(x) &= {_ACT[gate][1]} \quad \text{{({gate.replace('_', ' ')})}}",
    )
    if value is None:
        eqs += [
            Math(
                f"MLP(x) = σ(x W_in{bi}) W_out{bout}",
                rf"\mathrm{{MLP}}(x) &= \sigma(x W_{{in}}{bi}) W_{{out}}{bout}",
            ),
            sig,
        ]
    else:
        eqs += [
            Math(
                f"MLP(x) = (σ(x W_gate{bg}) ⊙ σ'(x W_in{bi})) W_out{bout}",
                rf"\mathrm{{MLP}}(x) &= \left(\sigma(x W_{{gate}}{bg}) \odot \sigma'(x W_{{in}}{bi})\right) W_{{out}}{bout}",
            ),
            sig,
            Math(
                f"σ'(x) = {_ACT[value][0]}   ({value})",
                rf"\sigma'(x) &= {_ACT[value][1]} \quad \text{{({value.replace('_', ' ')})}}",
            ),
        ]
    return eqs


def _equations(c: GPTConfig) -> Section:
    eqs = [*_stream_equations(c), _norm_equation(c), *attention_equations(c)]
    eqs += _mlp_equations(c)
    b = c.bias
    prose: list[Cell] = [
        f"Variant: {c.positional} positions, {c.norm}, {c.norm_placement}-norm, MLP {c.mlp}, "
        f"{'tied' if c.tie_embeddings else 'untied'} embeddings, {'with' if b else 'no'} biases; "
        "in the attention and MLP lines x is the norm's output (pre-norm) or the block's input (post-norm).",
    ]
    if c.dropout > 0:
        prose.append(
            f" In training, dropout (p = {c.dropout:g}) acts on x_0, the attention pattern and each residual branch."
        )
    return Section("Block equations", prose=prose, equations=eqs)


def _parameters(c: GPTConfig) -> Section:
    rows: list[tuple[Cell, ...]] = [
        (r.name, "×".join(map(str, r.shape)), _n(r.numel), str(r.copies), _n(r.total))
        for r in parameter_table(c)
    ]
    n, ne = count_parameters(c), count_parameters(c, non_embedding=True)
    rows.append(("total N", "", "", "", _n(n)))
    rows.append(("non-embedding N (no W_E, W_P, W_U, b_U)", "", "", "", _n(ne)))
    return Section(
        "Parameters",
        prose=[f"N = {_n(n)} parameters (≈ {_si(n, '')})."],
        header=("parameter", "shape", "numel", "copies", "total"),
        rows=rows,
    )


def _flops(c: GPTConfig, seq_len: int) -> Section:
    f = flops_per_token(c, seq_len)
    formulas = {
        "attn_qkv": Math("L·2·d·(H+2G)·d_head", r"L \cdot 2 d (H + 2G) d_{head}")
        if c.kv_heads != c.n_heads
        else Math("L·2·d·3·H·d_head", r"L \cdot 2 d \cdot 3 H d_{head}"),
        "attn_scores": Math("Σ_ℓ 2·H·d_head·T_ℓ", r"\sum_\ell 2 H d_{head} T_\ell")
        if c.sliding_window
        else Math("L·2·H·d_head·T", r"L \cdot 2 H d_{head} T"),
        "attn_mix": Math("Σ_ℓ 2·H·d_head·T_ℓ", r"\sum_\ell 2 H d_{head} T_\ell")
        if c.sliding_window
        else Math("L·2·H·d_head·T", r"L \cdot 2 H d_{head} T"),
        "attn_out": Math("L·2·H·d_head·d", r"L \cdot 2 H d_{head} d"),
        "mlp": Math(
            f"L·2·{3 if c.gated else 2}·d·d_mlp",
            rf"L \cdot 2 \cdot {3 if c.gated else 2}\, d\, d_{{mlp}}",
        ),
        "unembed": Math("2·d·n_vocab", r"2 d\, n_{vocab}"),
    }
    rows: list[tuple[Cell, ...]] = [(name, formulas[name], _n(v)) for name, v in f.terms()]
    rows.append(("forward", Math("C_fwd", r"C_{fwd}"), _n(f.forward)))
    rows.append(("training (forward + backward)", Math("3·C_fwd", r"3 C_{fwd}"), _n(f.training)))
    six_n = 6 * count_parameters(c, non_embedding=True)
    prose: list[Cell] = [
        f"Matmul FLOPs per token (2 per multiply-add) at context T = {seq_len}, every key counted; "
        f"forward {_si(f.forward, 'FLOP')}, training {_si(f.training, 'FLOP')} per token "
        f"(6·N_non-embedding alone: {_si(six_n, 'FLOP')}).",
    ]
    return Section("FLOPs per token", prose=prose, header=("term", "formula", "FLOPs"), rows=rows)


def _memory(c: GPTConfig, batch_size: int, seq_len: int) -> Section:
    fp32 = estimate_training_memory(c, batch_size, seq_len, "float32")
    bf16 = estimate_training_memory(c, batch_size, seq_len, "bfloat16")
    rows: list[tuple[Cell, ...]] = [
        (key, format_bytes(a), format_bytes(b))
        for (key, a), b in zip(fp32.as_dict().items(), bf16.as_dict().values())
    ]
    prose: list[Cell] = [
        f"Weights alone: {format_bytes(weight_bytes(c, 'float32'))} in float32, "
        f"{format_bytes(weight_bytes(c, 'bfloat16'))} in bfloat16. One AdamW training step at batch "
        f"B = {batch_size}, T = {seq_len} (float32 weights, two float32 moments; activations as saved "
        "for the backward pass):",
    ]
    return Section(
        "Memory", prose=prose, header=("component", "float32", "bf16 autocast"), rows=rows
    )


def _per_rank(c: GPTConfig, batch_size: int, seq_len: int, world_size: int) -> Section:
    ddp, fsdp = (
        per_rank_memory(c, batch_size, seq_len, "bfloat16", world_size=world_size, parallel=p)
        for p in ("ddp", "fsdp")
    )
    rows: list[tuple[Cell, ...]] = [
        (key, format_bytes(a), format_bytes(b))
        for (key, a), b in zip(ddp.as_dict().items(), fsdp.as_dict().values())
    ]
    prose: list[Cell] = [
        f"Each of W = {world_size} ranks, at B = {batch_size} sequences per rank, T = {seq_len}, "
        "bf16 autocast over float32 weights (train.parallel): DDP keeps everything whole on "
        "every rank; FSDP keeps 1/W of the weights, gradients and AdamW moments, and gathers "
        "whole parameters a block at a time (communication: DDP's gradient buckets, FSDP's "
        "gathered blocks, an estimate). Activations are the same.",
    ]
    return Section(
        f"Memory per rank (W = {world_size})", prose=prose, header=("component", "DDP", "FSDP"),
        rows=rows,
    )  # fmt: skip


def build(
    config: GPTConfig,
    *,
    seq_len: int | None = None,
    batch_size: int = 8,
    name: str = "",
    world_size: int | None = None,
) -> list[Section]:
    """The document's sections for ``config`` (T = seq_len, default n_ctx; memory at batch B;
    with ``world_size``, the memory of each of that many data-parallel ranks)."""
    T = config.n_ctx if seq_len is None else seq_len
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise ConfigError("batch_size", f"must be a positive integer, got {batch_size!r}")
    c = config
    legend = (
        f"d = d_model = {c.d_model}, L = n_layers = {c.n_layers}, H = n_heads = {c.n_heads}, "
        + (f"G = n_kv_heads = {c.kv_heads}, " if c.kv_heads != c.n_heads else "")
        + f"d_head = {c.d_head}, d_mlp = {c.d_mlp}, n_vocab = {c.n_vocab}, n_ctx = {c.n_ctx}."
    )
    head = Section(
        f"GPT function{': ' + name if name else ''}",
        prose=[legend],
        header=("field", "value"),
        rows=[(k, str(v)) for k, v in c.to_dict().items()],
    )
    sections = [head, _maps(c), _equations(c), _parameters(c), _flops(c, T)]
    sections.append(_memory(c, batch_size, T))
    if world_size is not None:
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ConfigError("world_size", f"must be a positive integer, got {world_size!r}")
        sections.append(_per_rank(c, batch_size, T, world_size))
    return sections


def describe(
    config: GPTConfig,
    *,
    fmt: str = "markdown",
    seq_len: int | None = None,
    batch_size: int = 8,
    name: str = "",
    world_size: int | None = None,
) -> str:
    """The config's function as Markdown (default) or a standalone LaTeX document.

    >>> text = describe(GPTConfig.preset("cpu-tiny"))
    >>> text.splitlines()[0], "x_mid = x_{ℓ−1} + Attn_ℓ(N1_ℓ(x_{ℓ−1}))" in text
    ('# GPT function', True)
    """
    if fmt not in FORMATS:
        raise ConfigError("format", f"must be one of {', '.join(FORMATS)}; got {fmt!r}")
    sections = build(
        config, seq_len=seq_len, batch_size=batch_size, name=name, world_size=world_size
    )
    return markdown(sections) if fmt == "markdown" else latex(sections)
