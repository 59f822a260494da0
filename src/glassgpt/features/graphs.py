"""Attribution graphs: the direct effect of every source node on every target node of a
prompt's local replacement model (:mod:`glassgpt.features.replacement`).

    A[t, s] = a_s Σ_l' W_dec[l_s → l'][i_s] · ∂r_t/∂mlp_out_l'[p_s]     s a feature (l_s, p_s, i_s)
            = e_l[p] · ∂r_t/∂mlp_out_l[p]                               s the error (l, p)
            = s·W_E[x_p] · ∂r_t/∂embed[p]                                s the token at p

where r_t is target t's linear read: a feature's pre-activation z_t = u_l[p] W_enc[:, i] +
b_enc[i], or a logit target's x̂_f[T−1] · (W_U[:, k] − mean_j W_U[:, j]) (x̂_f the residual
the unembedding reads; any direction v in place of the demeaned column). The gradients are
taken in the frozen model, where every source is a constant write, so they carry only direct
effects; a node's input is the sum of its incoming edges plus its bias term (``bias``: its
read with every source set to 0). Nodes in circuit-tracer's order: [features, errors (layer
major, L·T), tokens (T), logit targets]; rows are targets, columns sources.

Targets are computed in batches of ``batch_size`` backward passes (the prompt repeated, one
target per row), as circuit-tracer does. With ``max_feature_nodes`` only that many feature rows
are computed, chosen as they are found influential (the logit rows first, then the features
of most influence on what was computed so far), so memory is O(rows × active features).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.graph_rows import Rows, Spec
from glassgpt.features.replacement import Frozen, Transcoders, freeze, norm_linear, run_frozen
from glassgpt.model import GPT


@dataclass
class Graph:
    """An attribution graph of one prompt (module docstring); N = n_features + L·T + T + n_logits."""

    prompt: str
    tokens: Tensor  # [T]
    n_layers: int
    n_vocab: int
    features: Tensor  # [n_features, 3] (layer, pos, feature index)
    activations: Tensor  # [n_features]
    logit_tokens: list[int]  # vocabulary ids; n_vocab + k for the k-th direction target
    logit_probs: Tensor  # [n_logits] the targets' weights (their probabilities)
    adjacency: Tensor  # [N, N] rows: targets, columns: sources
    inputs: Tensor  # [N] each node's input (features: z; logits: their read; others 0)
    bias: Tensor  # [N] each node's input with every source at 0
    n_active: int = 0  # active features on the prompt (≥ n_features when capped)
    frozen: Frozen | None = field(default=None, repr=False)
    transcoders: Transcoders | None = field(default=None, repr=False)
    specs: list[Spec] = field(default_factory=list, repr=False)  # per row with a read
    n_backward: int = 0  # backward passes run
    notes: list[str] = field(default_factory=list)  # what a memory cap changed

    @property
    def n_features(self) -> int:
        return len(self.features)

    @property
    def n_pos(self) -> int:
        return len(self.tokens)

    @property
    def error_start(self) -> int:
        return self.n_features

    @property
    def token_start(self) -> int:
        return self.n_features + self.n_layers * self.n_pos

    @property
    def logit_start(self) -> int:
        return self.token_start + self.n_pos

    @property
    def n_nodes(self) -> int:
        return self.logit_start + len(self.logit_tokens)

    def node(self, i: int) -> tuple[str, int, int, int]:
        """(kind, layer, pos, index) of node i: ``feature`` (layer, pos, feature), ``error``
        (layer, pos, -1), ``token`` (-1, pos, token id), ``logit`` (n_layers, T−1, vocab id)."""
        if i < self.error_start:
            layer, pos, idx = (int(v) for v in self.features[i])
            return "feature", layer, pos, idx
        if i < self.token_start:
            layer, pos = divmod(i - self.error_start, self.n_pos)
            return "error", layer, pos, -1
        if i < self.logit_start:
            pos = i - self.token_start
            return "token", -1, pos, int(self.tokens[pos])
        return "logit", self.n_layers, self.n_pos - 1, self.logit_tokens[i - self.logit_start]


def salient_logits(logits: Tensor, *, max_logits: int = 10, prob: float = 0.95) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(ids, probabilities) of the fewest top tokens whose probabilities sum to ≥ ``prob``,
    at most ``max_logits``.

    >>> ids, p = salient_logits(torch.tensor([0.0, 3.0, 2.9, -5.0]), prob=0.5)
    >>> ids.tolist()
    [1]
    """
    probs = torch.softmax(logits.double(), -1)
    top = probs.topk(min(max_logits, len(probs)))
    n = int(torch.searchsorted(top.values.cumsum(0), torch.tensor(prob, dtype=torch.float64))) + 1
    n = min(n, len(top.values))
    return top.indices[:n], top.values[:n]


def attribute(
    model: GPT, transcoders: Transcoders, tokens: Tensor | Sequence[int], *, prompt: str = "",
    max_logits: int = 10, logit_prob: float = 0.95, logits: Sequence[int] | None = None,
    directions: Sequence[Tensor] | None = None,
    max_feature_nodes: int | None = None, batch_size: int = 32,
    dtype: torch.dtype = torch.float32, max_memory: float | None = None, offload: bool = False,
) -> Graph:  # fmt: skip
    """The attribution graph of ``tokens`` (module docstring). ``directions``: vectors
    [d_model] read from the final residual at the last position (e.g. W_U[:, a] − W_U[:, b],
    a logit difference), in place of the top logits, each weighted 1/len; ``logits``: these
    token ids' (demeaned) logits in place of the top ones, weighted likewise.

    ``dtype``: the adjacency's (float32, or bfloat16 for half the memory). ``max_memory``
    (bytes): the most the adjacency and the searched rows may take; a graph that needs more
    keeps fewer feature nodes, the most influential, and ``graph.notes`` says so (never an
    error). ``offload``: the transcoders' weights wait on the host while the rows are computed
    (only the active features' encoder and decoder rows stay on the model's device); on a
    CPU model it changes nothing."""
    if batch_size < 1:
        raise GlassError(f"--batch-size: must be ≥ 1, got {batch_size}")
    fz = freeze(model, transcoders, tokens)
    L, T = model.config.n_layers, len(fz.tokens)
    W_U = model.W_U.detach()
    if directions:
        vecs = [torch.as_tensor(v, dtype=W_U.dtype, device=W_U.device) for v in directions]
        for v in vecs:
            if v.shape != (model.config.d_model,):
                raise GlassError(f"a direction must have shape [d_model={model.config.d_model}], got {tuple(v.shape)}")  # fmt: skip
        ids = [model.config.n_vocab + k for k in range(len(vecs))]
        probs = torch.full((len(vecs),), 1.0 / len(vecs), dtype=torch.float64)
    else:
        top, probs = salient_logits(fz.logits[-1], max_logits=max_logits, prob=logit_prob)
        if logits:
            top = torch.tensor(list(logits), dtype=torch.long)
            probs = torch.full((len(top),), 1.0 / len(top), dtype=torch.float64)
        demeaned = W_U - W_U.mean(1, keepdim=True)
        vecs, ids = [demeaned[:, k].clone() for k in top.tolist()], top.tolist()
    logit_specs: list[Spec] = [(None, T - 1, v) for v in vecs]
    active = [a.nonzero() for a in fz.acts]  # per layer [n_l, 2] (pos, idx)
    feats = torch.cat([torch.cat([torch.full_like(a[:, :1], l), a], 1) for l, a in enumerate(active)])  # fmt: skip
    values_by_layer = [fz.acts[l][a[:, 0], a[:, 1]] for l, a in enumerate(active)]
    values = torch.cat(values_by_layer)
    n_a = len(feats)
    # the active features' encoder columns, copied: the full encoders may then leave the device
    enc = [transcoders.encoder(l).detach()[:, a[:, 1]].T.clone() if len(a) else None
           for l, a in enumerate(active)]  # fmt: skip
    feat_specs: list[Spec] = [(l, int(a[j, 0]), enc[l][j]) for l, a in enumerate(active)  # type: ignore[index]
                              for j in range(len(a))]  # fmt: skip
    engine = Rows(model, transcoders, fz, active, values_by_layer, batch_size)
    n_l, n_cols = len(ids), engine.n_cols
    fixed = L * T + T + n_l
    size = torch.tensor([], dtype=dtype).element_size()
    cap = n_a if max_feature_nodes is None else min(max_feature_nodes, n_a)
    notes: list[str] = []
    if max_memory is not None and _need(cap, n_a, fixed, size) > max_memory:
        fit = max(
            (c for c in _candidates(cap) if _need(c, n_a, fixed, size) <= max_memory), default=0
        )
        notes.append(f"{cap} feature nodes need {_need(cap, n_a, fixed, size) / 2**30:.2f} GiB of "
                     f"adjacency, over the memory cap of {max_memory / 2**30:.2f} GiB: the {fit} "
                     f"most influential kept")  # fmt: skip
        cap = fit
    with _offloaded(transcoders, offload and fz.embed.device.type != "cpu"):
        if cap == n_a:  # every row written in place: no copy of the adjacency
            N = n_a + fixed
            A = torch.zeros(N, N, dtype=dtype)  # on the host, whatever the model's device
            engine.fill(feat_specs + logit_specs, A, [*range(n_a), *range(N - n_l, N)])
            chosen = list(range(n_a))
        else:
            logit_rows = torch.zeros(n_l, n_cols, dtype=dtype)
            engine.fill(logit_specs, logit_rows, range(n_l), split=False)

            def compute(idx: list[int]) -> Tensor:
                out = torch.zeros(len(idx), n_cols, dtype=dtype)
                engine.fill([feat_specs[i] for i in idx], out, range(len(idx)), split=False)
                return out

            chosen, feat_rows = _grow(logit_rows, probs, n_a, cap, batch_size, compute)
            sel = torch.tensor(chosen, dtype=torch.long)
            n_f = len(chosen)
            N = n_f + fixed
            A = torch.zeros(N, N, dtype=dtype)
            # the columns kept: the chosen features, every error, every token
            keep_cols = torch.cat([sel, torch.arange(n_a, n_a + L * T + T)])
            for i in range(0, n_f, 1024):  # a slice at a time: no second copy of the rows
                A[i : min(i + 1024, n_f), : n_f + L * T + T] = feat_rows[i : i + 1024][:, keep_cols]
            del feat_rows
            A[N - n_l :, : n_f + L * T + T] = logit_rows[:, keep_cols]
    sel = torch.tensor(chosen, dtype=torch.long)
    n_f = len(chosen)
    specs = [feat_specs[i] for i in chosen] + logit_specs
    inputs = torch.zeros(N, dtype=torch.float64)
    bias = torch.zeros(N, dtype=torch.float64)
    reads = _reads(model, transcoders, fz, specs, zero=False)
    zero = _reads(model, transcoders, fz, specs, zero=True)
    where = torch.cat([torch.arange(n_f), torch.arange(N - n_l, N)])
    inputs[where], bias[where] = reads, zero
    return Graph(prompt, fz.tokens.cpu(), L, model.config.n_vocab, feats[sel].cpu(),
                 values[sel].detach().cpu().double(), ids, probs, A, inputs, bias, n_a, fz,
                 transcoders, specs, engine.n_backward, notes)  # fmt: skip


def _need(cap: int, n_a: int, fixed: int, size: int) -> int:
    """Bytes of the adjacency with ``cap`` feature nodes (and, below all n_a, the rows searched)."""
    if cap >= n_a:
        return (n_a + fixed) ** 2 * size
    return ((cap + fixed) ** 2 + (cap + fixed) * (n_a + fixed)) * size


def _candidates(cap: int) -> list[int]:
    """0 … cap, coarsely: the largest that fits is found to within 1/64 of cap."""
    step = max(1, cap // 64)
    return [*range(0, cap, step), cap]


class _offloaded:
    """The transcoders' weights on the host for the block, back on their device after."""

    def __init__(self, tc: Transcoders, on: bool) -> None:
        self.modules = ([tc.clt] if tc.clt is not None else list(tc.layers.values())) if on else []
        self.devices = [next(m.parameters()).device for m in self.modules]

    def __enter__(self) -> None:
        for m in self.modules:
            m.to("cpu")

    def __exit__(self, *exc: object) -> None:
        for m, device in zip(self.modules, self.devices, strict=True):
            m.to(device)


def _reads(model: GPT, tc: Transcoders, fz: Frozen, specs: list[Spec], *, zero: bool) -> Tensor:
    """Each spec's read in the frozen model [len(specs)] float64: with the prompt's sources,
    or (``zero``) with every source at 0 (the MLP outputs then b_dec alone): the bias terms."""
    L = fz.writes.shape[0]
    if zero:
        embed = torch.zeros_like(fz.embed)[None]
        writes = [_b_dec(tc, l, fz.writes[l])[None] for l in range(L)]
    else:
        embed, writes = fz.embed[None], [fz.writes[l][None] for l in range(L)]
    with torch.no_grad():
        lin = run_frozen(model, fz, embed, writes)
    out = [((lin.final if layer is None else lin.u[layer])[0, pos] @ vec.to(embed.dtype))
           for layer, pos, vec in specs]  # fmt: skip
    return torch.stack(out).double().cpu() if out else torch.zeros(0, dtype=torch.float64)


def _b_dec(tc: Transcoders, layer: int, like: Tensor) -> Tensor:
    """What the MLP output of ``layer`` is with every source at 0: b_dec (or 0) [T, d]."""
    b = tc.b_dec(layer)
    return torch.zeros_like(like) if b is None else b.detach().to(like.dtype).expand_as(like)


def _grow(
    logit_rows: Tensor, probs: Tensor, n_a: int, cap: int, batch: int, compute: Any
) -> tuple[list[int], Tensor]:  # fmt: skip
    """Feature rows chosen by influence: repeatedly the ``batch`` unvisited features of most
    influence on the logits through the rows computed so far, until ``cap``."""
    chosen: list[int] = []
    feat_rows = logit_rows.new_zeros(cap, logit_rows.shape[1])  # filled in place
    work = work_dtype(logit_rows)
    sums = torch.zeros(cap, dtype=work, device=logit_rows.device)  # |row| sums, kept as found
    while len(chosen) < cap:
        n = len(chosen)
        influence = _partial_influence(feat_rows[:n], chosen, logit_rows, probs, sums[:n])[:n_a]
        if chosen:
            influence[torch.tensor(chosen, device=influence.device)] = -1
        take = influence.topk(min(batch, cap - n)).indices.tolist()
        feat_rows[n : n + len(take)] = compute(take)
        sums[n : n + len(take)] = _abs_sums(feat_rows[n : n + len(take)], work)
        chosen += take
    return chosen, feat_rows


def work_dtype(A: Tensor) -> torch.dtype:
    """float64 for a float64 adjacency (or rows), else float32: a large graph's copies stay 4
    bytes."""
    return torch.float64 if A.dtype == torch.float64 else torch.float32


def _abs_sums(rows: Tensor, work: torch.dtype) -> Tensor:
    """Σ_j |rows[i, j]| [n], 1024 rows at a time (no |rows| copy of the whole)."""
    if not len(rows):
        return torch.zeros(0, dtype=work, device=rows.device)
    return torch.cat([rows[i : i + 1024].abs().sum(1, dtype=work) for i in range(0, len(rows), 1024)])  # fmt: skip


def _partial_influence(
    feat_rows: Tensor, chosen: list[int], logit_rows: Tensor, probs: Tensor,
    feat_sums: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Influence on the weighted logits of every column, through the computed rows only:
    w (R̂ + R̂² + …) with R̂ = |rows| row-normalised (``feat_sums``: the feature rows' |·| sums,
    if known). Only chosen features pass influence on, so with S = R̂_f[:, chosen] (their
    block among themselves, n × n) and w₁ = (w R̂_l)[chosen]:

        I = w R̂_l + w₁ (1 + S + S² + …) R̂_f

    The series runs on the small S; the rows [n, n_cols] are read in three passes (their
    chosen columns, then the two products), a slice at a time, never normalised in a copy."""
    dev, work = logit_rows.device, work_dtype(logit_rows)
    inv_l = 1 / _abs_sums(logit_rows, work).clamp_min(1e-10)
    sums = _abs_sums(feat_rows, work) if feat_sums is None else feat_sums
    inv_f = 1 / sums.clamp_min(1e-10)

    def times(w: Tensor, rows: Tensor, inv: Tensor) -> Tensor:  # (w ⊙ inv) @ |rows|
        out = torch.zeros(rows.shape[1], dtype=work, device=dev)
        for i in range(0, len(rows), 1024):
            if bool(w[i : i + 1024].any()):
                out += (w[i : i + 1024] * inv[i : i + 1024]) @ rows[i : i + 1024].abs().to(work)
        return out

    direct = times(probs.to(dev, work), logit_rows, inv_l)
    if not chosen:
        return direct
    cols = torch.tensor(chosen, dtype=torch.long, device=dev)
    S = torch.cat([feat_rows[i : i + 1024][:, cols].abs().to(work) for i in range(0, len(chosen), 1024)])  # fmt: skip
    S *= inv_f[:, None]
    w = direct[cols]
    total = w.clone()
    for _ in range(len(chosen) + 1):  # S is nilpotent (the graph is acyclic)
        w = w @ S
        if not bool(w.any()):
            break
        total += w
    return direct + times(total, feat_rows, inv_f)


def source_writes(graph: Graph, source: int) -> list[tuple[int, int, Tensor]]:
    """What source node ``source`` adds to the residual stream: [(after layer (−1: the
    embedding), pos, vector [d])] (a CLT feature writes to several layers)."""
    fz, tc = graph.frozen, graph.transcoders
    assert fz is not None and tc is not None
    kind, layer, pos, idx = graph.node(source)
    if kind == "feature":
        a = graph.activations[source].to(fz.embed.dtype)
        return [(t, pos, a * W.detach()[idx].to(a.dtype)) for t, W in tc.decoders(layer)]
    if kind == "error":
        return [(layer, pos, fz.errors[layer, pos])]
    if kind == "token":
        return [(-1, pos, fz.embed[pos])]
    raise GlassError(f"node {source} is a logit target: it has no outgoing edges")


def edge_heads(model: GPT, graph: Graph, target: int, source: int) -> dict[str, float]:
    """The edge A[target, source] split by head (:func:`head_split`)."""
    return head_split(model, graph, target, [source])[0]


def head_split(model: GPT, graph: Graph, target: int, sources: Sequence[int]) -> list[dict[str, float]]:  # fmt: skip
    """Each edge A[target, s], s in ``sources``, split by the first attention head its paths pass through:
    {"resid": the part through the residual stream alone (same position), "L.H": the part
    whose first head is head H of layer L (its value read at the source's position, the
    pattern frozen, then on through the frozen model)}; the parts sum to the edge.

    Pre-norm models only (in a post-norm one the residual itself passes through the norms)."""
    fz = graph.frozen
    if fz is None or not graph.specs:
        raise GlassError("this graph holds no replacement model (made by attribute, not loaded)")
    if model.config.norm_placement == "post":
        raise GlassError("edges split by head need a pre-norm model; this one is post-norm")
    row = target if target < graph.n_features else target - graph.logit_start + graph.n_features
    if graph.error_start <= target < graph.logit_start:
        raise GlassError(f"node {target} is an error or token node: it has no incoming edges")
    read_layer, read_pos, vec = graph.specs[row]
    vec = vec.detach()
    L = fz.writes.shape[0]
    embed = fz.embed[None].clone()
    writes = [fz.writes[l][None].clone() for l in range(L)]
    with torch.enable_grad():
        lin = run_frozen(model, fz, embed, writes, attn_out=True)
        x = lin.final if read_layer is None else lin.u[read_layer]
        obj = x[0, read_pos] @ vec.detach().to(x.dtype)
        grads = torch.autograd.grad(obj, lin.attn_out, allow_unused=True)
    return [_parts(model, graph, grads, read_layer, read_pos, vec, s) for s in sources]


@torch.no_grad()
def _parts(
    model: GPT, graph: Graph, grads: Sequence[Tensor | None], read_layer: int | None,
    read_pos: int, vec: Tensor, source: int,
) -> dict[str, float]:  # fmt: skip
    """One source's edge split by head, from the target's gradients at each attention output."""
    fz = graph.frozen
    assert fz is not None
    L = fz.writes.shape[0]
    parts: dict[str, float] = {"resid": 0.0}
    H = model.config.n_heads
    per_group = H // model.config.kv_heads
    for after, pos, w in source_writes(graph, source):
        if pos == read_pos and (read_layer is None or after < read_layer):
            parts["resid"] += float(_read(model, fz, read_layer, pos, w) @ vec.to(w.dtype))
        for layer in range(after + 1, L):
            g = grads[layer]
            if g is None:
                continue
            block = model.blocks[layer]
            xn = norm_linear(model, f"blocks.{layer}.ln1", w, pos, fz)  # [d]
            pattern = fz.patterns[f"blocks.{layer}.attn.pattern"][0, :, :, pos]  # [H, T_q]
            for h in range(H):
                v = xn @ block.attn.W_V[h // per_group].detach().to(w.dtype)  # [d_head]
                out = (pattern[h][:, None] * v) @ block.attn.W_O[h].detach().to(w.dtype)  # [T, d]
                if block.ln1_post is not None:
                    out = norm_linear(model, f"blocks.{layer}.ln1_post", out, slice(None), fz)
                key = f"{layer}.{h}"
                parts[key] = parts.get(key, 0.0) + float((g[0] * out).sum())
    return parts


def _read(model: GPT, fz: Frozen, layer: int | None, pos: int, w: Tensor) -> Tensor:
    """w [d] as the target at ``layer`` reads it at ``pos`` (through the frozen N₂, or N_f)."""
    if layer is not None:
        return norm_linear(model, f"blocks.{layer}.ln2", w, pos, fz)
    if model.config.final_norm:
        return norm_linear(model, "ln_final", w, pos, fz)
    return w
