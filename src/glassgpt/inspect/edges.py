"""Edge attribution patching: activation patching to first order, for every edge at once.

Edge level (EAP, Syed et al. 2023). In a pre-norm model the residual stream that node v
reads is a sum of upstream outputs, x_v = Σ_{u before v} out_u (+ biases). Patching the edge
u → v (v alone reads u's clean output) changes the metric by, to first order,

    score(u → v) = Σ_{b,t} (out_u,clean − out_u,corrupted)[b, t] · g_v[b, t],
    g_v = ∂m/∂x_v    (the gradient through v's own path only)

Upstream nodes u: ``embed`` (x₀ = token + position embeddings), each head
``blocks.l.attn.h{h}`` (out = z_h W_O[h]), each MLP ``blocks.l.mlp`` (out = mlp_out).
Downstream nodes v: each head's query, key and value input ``blocks.l.attn.h{h}.q|k|v``
(grouped-query: ``h{h}.q`` per query head, ``kv{g}.k|v`` per key/value head g),
each MLP's input ``blocks.l.mlp.in``, and ``logits`` (the final residual, read by N_f W_U).
The model has no per-head input hooks, so g_v is computed exactly from the gradients at
the hooks that exist and the norm's vector-Jacobian product, by autograd:

    g_{l,h,q} = ∂/∂x Σ ⟨∂m/∂q_h, RoPE(N₁(x) W_Q[h] + b_Q[h])⟩ |_{x = resid_pre_l}
              = J_{N₁}(x)ᵀ (R⁻¹ ∂m/∂q_h) W_Q[h]ᵀ                    (likewise k, v)
    g_{l,mlp} = J_{N₂}(x)ᵀ (∂m/∂pre W_inᵀ + ∂m/∂pre_gate W_gateᵀ)    at x = resid_mid_l
                                              (resid_pre_l in a parallel block, GPT-NeoX)
    g_logits  = ∂m/∂resid_post_{L−1}

(∂m/∂q_h, ∂m/∂pre … from the model's hooks attn.q/k/v, mlp.pre/pre_gate). Summed over
every downstream node of u, the scores give u's node attribution: Σ_v g_v = ∂m/∂out_u.

EAP-IG (Hanna, Pezzelle & Belinkov 2024, "Have Faith in Faithfulness"): the gradients are
averaged over m points on the straight line from the corrupted to the clean input
embeddings, as in the paper's EAP-IG (its "inputs" variant; the later per-activation
variant is not implemented here):

    g_v^IG = (1/m) Σ_{k=0}^{m−1} g_v(x₀ = x₀,corrupted + (k/m)(x₀,clean − x₀,corrupted))

(a left Riemann sum, k/m as in the authors' code, so m = 1 is EAP at the corrupted run);
all m runs and the clean run form one batch, one forward and one backward. For the
``embed`` node, Σ_v score^IG(embed → v) → m(clean) − m(corrupted) as m → ∞ (completeness).

Direction (as TransformerLens): the base run is the corrupted one, clean values are patched
in. Edge level refuses post-norm models and sandwich norms (Gemma): their residual is not a
sum of the outputs. (q/k-norms, partial or per-layer rotary are in the autograd step.)
Scores are in the model's dtype (a bfloat16 or float16 model's in float32), as node
attribution's (``glassgpt.inspect.attribution``, whose run helpers these share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.attribution import (
    MetricFn,
    _derived,
    _grads,
    _pair_batches,
    _root,
    _weights_frozen,
)
from glassgpt.inspect.cache import ActivationCache, HookFn, evaluating, run_with_cache
from glassgpt.inspect.metrics import score_runs
from glassgpt.model import GPT
from glassgpt.model.gpt import Block
from glassgpt.model.layers import apply_rope, linear


@dataclass(frozen=True)
class Edges:
    """Edge scores ``scores`` [n_upstream, n_downstream] (0 where ``allowed`` is False: v
    reads the residual before u writes it), with the nodes' names."""

    scores: Tensor
    upstream: list[str]
    downstream: list[str]
    allowed: Tensor

    def score(self, upstream: str, downstream: str) -> float:
        """The score of one edge, by its nodes' names."""
        for name, names in ((upstream, self.upstream), (downstream, self.downstream)):
            if name not in names:
                raise GlassError(f"no node {name!r} (e.g. {', '.join(names[:3])}, ...)")
        return float(self.scores[self.upstream.index(upstream), self.downstream.index(downstream)])

    def top(self, k: int = 10, *, absolute: bool = True) -> list[tuple[str, str, float]]:
        """The k allowed edges of largest |score| (or largest score): (upstream, downstream, score)."""
        key = self.scores.abs() if absolute else self.scores
        key = key.masked_fill(~self.allowed, float("-inf")).flatten()
        n = min(k, int(self.allowed.sum()))
        flat = self.scores.flatten()
        n_down = len(self.downstream)
        return [
            (self.upstream[i // n_down], self.downstream[i % n_down], float(flat[i]))
            for i in torch.topk(key.float(), n).indices.tolist()
        ]


def edge_names(model: GPT) -> tuple[list[str], list[str], Tensor]:
    """(upstream names, downstream names, allowed [n_up, n_down]) of the model's edge graph.

    >>> from glassgpt.model import GPTConfig
    >>> up, down, ok = edge_names(GPT(GPTConfig(n_vocab=5, n_ctx=4, d_model=4, n_layers=1, n_heads=1)))
    >>> up, down
    (['embed', 'blocks.0.attn.h0', 'blocks.0.mlp'], ['blocks.0.attn.h0.q', 'blocks.0.attn.h0.k', 'blocks.0.attn.h0.v', 'blocks.0.mlp.in', 'logits'])
    >>> ok.int().tolist()
    [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1]]
    """
    cfg = model.config
    up, down = ["embed"], []
    up_at, down_at = [-1.0], []  # where a node writes / reads: head at l, MLP at l + ½
    for layer in range(cfg.n_layers):
        up += [f"blocks.{layer}.attn.h{h}" for h in range(cfg.n_heads)]
        up_at += [layer] * cfg.n_heads
        inputs = _head_inputs(cfg.n_heads, cfg.kv_heads)
        down += [f"blocks.{layer}.attn.{node}" for node in inputs]
        down_at += [layer] * len(inputs)
        if not cfg.attn_only:
            up.append(f"blocks.{layer}.mlp")
            up_at.append(layer + 0.5)
            down.append(f"blocks.{layer}.mlp.in")
            down_at.append(layer if cfg.parallel_residual else layer + 0.5)
    down.append("logits")
    down_at.append(float(cfg.n_layers))
    allowed = torch.tensor(up_at)[:, None] < torch.tensor(down_at)[None, :]
    return up, down, allowed


def _head_inputs(H: int, G: int) -> list[str]:
    """An attention's receiving nodes: h{h}.q|k|v per head; if G < H, h{h}.q, then kv{g}.k|v.

    >>> _head_inputs(2, 2), _head_inputs(2, 1)
    (['h0.q', 'h0.k', 'h0.v', 'h1.q', 'h1.k', 'h1.v'], ['h0.q', 'h1.q', 'kv0.k', 'kv0.v'])
    """
    if G == H:
        return [f"h{h}.{m}" for h in range(H) for m in "qkv"]
    return [f"h{h}.q" for h in range(H)] + [f"kv{g}.{m}" for g in range(G) for m in "kv"]


def edge_attribution_patch(
    model: GPT,
    clean_tokens: Tensor | Sequence[int],
    corrupted_tokens: Tensor | Sequence[int],
    metric: MetricFn,
    method: Literal["eap", "eap-ig"] = "eap",
    steps: int = 5,
) -> Edges:
    """Every edge's score (out_u,clean − out_u,corrupted) · g_v (EAP), or with g_v averaged
    over ``steps`` points between the corrupted and clean embeddings (EAP-IG); see the
    module's docstring for g_v. One forward (clean + each step, stacked) and one backward.

    >>> from glassgpt.model import GPTConfig
    >>> from glassgpt.inspect.metrics import logit_diff
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2)).eval()
    >>> edges = edge_attribution_patch(model, [1, 2, 3], [1, 4, 3], logit_diff(5, 6))
    >>> edges.scores.shape, len(edges.upstream), len(edges.downstream)
    (torch.Size([7, 15]), 7, 15)
    """
    if method not in ("eap", "eap-ig"):
        raise GlassError(f"unknown edge attribution method {method!r}; choose eap or eap-ig")
    if method == "eap-ig" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise GlassError(f"eap-ig needs steps ≥ 1 (an integer), got {steps!r}")
    if model.config.norm_placement != "pre":
        raise GlassError(
            "edge attribution needs a pre-norm model: in a post-norm model the residual a node "
            "reads is normalised after the sum, not a sum of the upstream outputs"
        )
    if model.config.sandwich_norm:
        raise GlassError(
            "edge attribution needs each head's output to join the residual as it is: with "
            "sandwich norms (Gemma) the heads pass a norm together first; use attribution_patch"
        )
    m = steps if method == "eap-ig" else 1
    clean, corrupted = _pair_batches(model, clean_tokens, corrupted_tokens)
    B = clean.shape[0]
    cfg = model.config
    L = cfg.n_layers
    names = ["blocks.0.resid_pre"]
    for layer in range(L):
        p = f"blocks.{layer}."
        names += [p + "resid_pre", p + "attn.q", p + "attn.k", p + "attn.v", p + "attn.z"]
        if not cfg.attn_only:
            names += [p + "mlp.pre", p + "mlp_out"]
            if not cfg.parallel_residual:
                names.append(p + "resid_mid")
            if cfg.gated:
                names.append(p + "mlp.pre_gate")
    names.append(f"blocks.{L - 1}.resid_post")
    names = list(dict.fromkeys(names))
    hooks: dict[str, HookFn] = {}
    hooks["embed"] = _root(_interpolating(B, m) if method == "eap-ig" else None)
    tokens = torch.cat([clean] + [corrupted] * m)  # [(1 + m)·B, T]
    with evaluating(model), _weights_frozen(model):
        logits, cache = run_with_cache(model, tokens, names, hooks=hooks, detach=False, grad=True)
        T, V = logits.shape[1:]
        total = score_runs(metric, logits[B:].reshape(m, B, T, V)).sum()
        grad_names = [
            n for n in names if n.rsplit(".", 1)[-1] in ("q", "k", "v", "pre", "pre_gate")
        ]
        grad_names.append(f"blocks.{L - 1}.resid_post")
        g = dict(zip(grad_names, _grads(total, [cache[n] for n in grad_names]), strict=True))
        receivers = _receiver_grads(model, cache, g, B, m)  # [n_down, B, T, d_model]
    with torch.no_grad():
        senders = _sender_diffs(model, cache, B)  # [n_up, B, T, d_model]
        dtype = _derived(receivers.dtype)
        scores = senders.flatten(1).to(dtype) @ receivers.flatten(1).to(dtype).T  # [up, down]
    up, down, allowed = edge_names(model)
    allowed = allowed.to(scores.device)
    scores = scores.masked_fill(~allowed, 0.0)
    return Edges(scores, up, down, allowed)


def _interpolating(B: int, m: int) -> HookFn:
    """The token embeddings of run k (rows B(k+1) … B(k+2) − 1) moved to
    e_corrupted + (k/m)(e_clean − e_corrupted); rows 0 … B − 1 are the clean run."""

    def hook(t: Tensor, name: str) -> Tensor:
        clean, corrupt = t[:B], t[B : 2 * B]
        alpha = torch.arange(m, dtype=t.dtype, device=t.device) / m  # [m]
        moved = corrupt[None] + alpha[:, None, None, None] * (clean - corrupt)[None]
        return torch.cat([clean, moved.flatten(0, 1)])

    return hook


def _receiver_grads(
    model: GPT, cache: ActivationCache, g: dict[str, Tensor], B: int, m: int
) -> Tensor:
    """g_v for every downstream node, averaged over the m runs: [n_down, B, T, d_model]."""
    L = model.config.n_layers
    out: list[Tensor] = []
    for layer in range(L):
        block = cast(Block, model.blocks[layer])
        p = f"blocks.{layer}."
        x = cache[p + "resid_pre"][B:].detach()  # [m·B, T, d_model]
        rotary = model.rotary
        if model.rotary_local is not None and block.kind == "sliding":
            rotary = model.rotary_local  # a sliding layer's own base
        rope = None if rotary is None else rotary(x.shape[1], 0, dtype=x.dtype, device=x.device)
        gqkv = [g[p + f"attn.{c}"][B:] for c in "qkv"]  # [m·B, T, H | G | G, d_head]
        heads = _head_input_grads(block, x, gqkv, rope)  # [m·B, T, n_inputs, d_model]
        heads = heads.unflatten(0, (m, B)).mean(0)  # [B, T, n_inputs, d_model]
        out += list(heads.movedim(2, 0))  # n_inputs × [B, T, d_model]
        if block.mlp is not None:
            mid = "resid_pre" if model.config.parallel_residual else "resid_mid"
            x = cache[p + mid][B:].detach()
            gate = g.get(p + "mlp.pre_gate")
            grad = _mlp_input_grad(
                block, x, g[p + "mlp.pre"][B:], None if gate is None else gate[B:]
            )
            out.append(grad.unflatten(0, (m, B)).mean(0))
    final = g[f"blocks.{L - 1}.resid_post"][B:]
    out.append(final.unflatten(0, (m, B)).mean(0))
    return torch.stack(out)


def _head_input_grads(
    block: Block, x: Tensor, gqkv: list[Tensor], rope: tuple[Tensor, Tensor] | None
) -> Tensor:
    """∂/∂x Σ_c ⟨G_c, RoPE(n(N₁(x) W_c + b_c))⟩ separately for each of the H + 2G inputs c (the
    H query heads', the G key/value heads'; n the q/k-norm where the model has one), at x
    [N, T, d_model]: one copy of x per input, → [N, T, n_inputs, d_model] in the order of
    :func:`_head_inputs`."""
    attn = block.attn
    H, G = attn.n_heads, attn.n_kv_heads
    N, T, D = x.shape
    W = torch.cat([attn.W_Q, attn.W_K, attn.W_V]).detach()  # [H + 2G, d_model, d_head]
    b = None if attn.b_QKV is None else attn.b_QKV.detach().reshape(-1, attn.d_head)  # [H+2G, ·]
    with torch.enable_grad():
        X = x[:, :, None, :].expand(N, T, H + 2 * G, D).clone().requires_grad_(True)
        u = block.ln1(X)  # [N, T, H + 2G, d_model]
        qkv = torch.einsum("ntcd,cde->ntce", u, W)  # [N, T, H + 2G, d_head]
        if b is not None:
            qkv = qkv + b
        q, k, v = qkv.split([H, G, G], dim=2)
        if attn.q_norm is not None and attn.k_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        s = sum((a * ga.detach()).sum() for a, ga in zip((q, k, v), gqkv, strict=True))
        (gX,) = torch.autograd.grad(s, X)
    gq, gk, gv = gX.split([H, G, G], dim=2)
    if G == H:  # h0.q, h0.k, h0.v, h1.q, …
        return torch.stack([gq, gk, gv], dim=3).flatten(2, 3)
    return torch.cat([gq, torch.stack([gk, gv], dim=3).flatten(2, 3)], dim=2)  # qs, then kv


def _mlp_input_grad(block: Block, x: Tensor, gpre: Tensor, ggate: Tensor | None) -> Tensor:
    """∂/∂x (⟨G_pre, N₂(x) W_in + b_in⟩ + ⟨G_gate, N₂(x) W_gate + b_gate⟩) at x [N, T, d_model]."""
    mlp = block.mlp
    assert mlp is not None
    with torch.enable_grad():
        X = x.clone().requires_grad_(True)
        u = block.ln2(X)
        s = (linear(u, mlp.W_in.detach(), _d(mlp.b_in)) * gpre.detach()).sum()
        if ggate is not None:
            s = s + (linear(u, mlp.W_gate.detach(), _d(mlp.b_gate)) * ggate.detach()).sum()
        (gX,) = torch.autograd.grad(s, X)
    return gX


def _sender_diffs(model: GPT, cache: ActivationCache, B: int) -> Tensor:
    """out_u,clean − out_u,corrupted for every upstream node: [n_up, B, T, d_model]."""
    rows = lambda name: (cache[name][:B].detach(), cache[name][B : 2 * B].detach())  # noqa: E731
    clean, corrupt = rows("blocks.0.resid_pre")
    out = [clean - corrupt]  # x₀
    for layer in range(model.config.n_layers):
        block = cast(Block, model.blocks[layer])
        zc, zk = rows(f"blocks.{layer}.attn.z")  # [B, T, H, d_head]
        dz = zc - zk
        out += list(torch.einsum("bthe,hed->hbtd", dz, block.attn.W_O.detach()))
        if block.mlp is not None:
            c, k = rows(f"blocks.{layer}.mlp_out")
            out.append(c - k)
    return torch.stack(out)


def _d(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()
