"""The local replacement model and attribution graphs (glassgpt.features.replacement, graphs,
graph_prune), against independent oracles: the model's own logits, the frozen model's reads
with one source removed (the graph is affine, so that difference is the edge exactly), an
exact transcoder (error 0), and the sum of an edge's per-head parts."""

from __future__ import annotations

import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.graph_prune import prune, scores
from glassgpt.features.graphs import Graph, attribute, edge_heads, head_split
from glassgpt.features.replacement import Transcoders, freeze, run_frozen
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.model import GPT, GPTConfig

F64 = torch.float64
PROMPT = [1, 2, 3, 4, 5, 6]
FAMILIES = {
    "gpt2": {},
    "llama-gqa": dict(norm="rmsnorm", positional="rope", n_kv_heads=1, bias=False, mlp="gated",
                      mlp_gate="silu", mlp_value="identity", tie_embeddings=False),
    "neox-parallel": dict(parallel_residual=True, positional="rope", rotary_fraction=0.5),
    "gemma-sandwich": dict(norm="rmsnorm", sandwich_norm=True, norm_offset=1.0, positional="rope",
                           final_softcap=5.0, attn_softcap=3.0, bias=False, embed_scale=2.0),
    "post-norm": dict(norm_placement="post"),  # attention reads resid_pre itself
}  # fmt: skip


def model_of(family: str, seed: int = 0, **kw: object) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(n_vocab=13, n_ctx=8, d_model=8, n_layers=3, n_heads=2, d_mlp=16,
                    **{**FAMILIES[family], **kw})  # fmt: skip
    model = GPT(cfg).to(F64).eval()
    with torch.no_grad():  # weights large enough that every path matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def per_layer(layers: tuple[int, ...] = (0, 2), act: str = "relu") -> Transcoders:
    saes = {l: SAE(SAEConfig(d_in=8, d_sae=12, arch="transcoder", transcoder_activation=act,
                             k=4, hook=f"blocks.{l}.mlp_out", dtype="float64"), seed=l)
            for l in layers}  # fmt: skip
    return Transcoders(layers=saes)


def clt(arch: str = "jumprelu") -> Transcoders:
    cfg = CLTConfig(d_model=8, d_sae=12, n_layers=3, arch=arch, k=3, dtype="float64")
    return Transcoders(clt=CLT(cfg, seed=0))


TRANSCODERS = {"per-layer": per_layer, "clt": clt}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", TRANSCODERS)
def test_replacement_logits_equal_the_models(family: str, kind: str) -> None:
    model, tc = model_of(family), TRANSCODERS[kind]()
    fz = freeze(model, tc, PROMPT)
    want = model(torch.tensor([PROMPT]))[0]
    assert (fz.logits - want).abs().max() < 1e-10
    assert bool(fz.errors.abs().max() > 1e-3)  # the transcoders are far from the MLPs
    # the frozen (affine) model with the prompt's sources: the same logits again
    lin = run_frozen(model, fz, fz.embed[None], [w[None] for w in fz.writes])
    assert (lin.logits[0] - want).abs().max() < 1e-10


def removed_reads(model: GPT, graph: Graph) -> torch.Tensor:
    """r_t(all sources) − r_t(all but s) for every (target t, source s) [N, N], from forward
    passes alone: one row of the batch per source, that source's write taken out."""
    fz, tc = graph.frozen, graph.transcoders
    assert fz is not None and tc is not None
    L, T, d = fz.writes.shape
    n_src = graph.logit_start
    embed = fz.embed.expand(n_src, T, d).clone()
    writes = [fz.writes[l].expand(n_src, T, d).clone() for l in range(L)]
    for s in range(n_src):
        kind, layer, pos, idx = graph.node(s)
        if kind == "feature":
            for target, W in tc.decoders(layer):
                writes[target][s, pos] -= graph.activations[s] * W.detach()[idx]
        elif kind == "error":
            writes[layer][s, pos] -= fz.errors[layer, pos]
        else:
            embed[s, pos] = 0
    with torch.no_grad():
        full = run_frozen(model, fz, fz.embed[None], [w[None] for w in fz.writes])
        cut = run_frozen(model, fz, embed, writes)
    out = torch.zeros(graph.n_nodes, graph.n_nodes, dtype=F64)
    rows = list(range(graph.n_features)) + list(range(graph.logit_start, graph.n_nodes))
    for row, (layer, pos, vec) in zip(rows, graph.specs, strict=True):
        x_full = full.final if layer is None else full.u[layer]
        x_cut = cut.final if layer is None else cut.u[layer]
        out[row, :n_src] = x_full[0, pos] @ vec - x_cut[:, pos] @ vec
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", TRANSCODERS)
def test_every_edge_is_the_direct_effect(family: str, kind: str) -> None:
    model = model_of(family)
    graph = attribute(model, TRANSCODERS[kind](), PROMPT, dtype=F64, batch_size=24)
    A = graph.adjacency
    assert graph.n_features > 20 and len(graph.logit_tokens) >= 2
    assert (A - removed_reads(model, graph)).abs().max() < 1e-8
    # a node's input is the sum of its incoming edges plus its bias term
    assert (A.sum(1) + graph.bias - graph.inputs).abs().max() < 1e-10
    # an active feature's input is its pre-activation: its activation
    assert (graph.inputs[: graph.n_features] - graph.activations).abs().max() < 1e-12
    # errors and tokens have no inputs; nothing reads a logit
    assert not A[graph.error_start : graph.logit_start].any() and not A[:, graph.logit_start :].any()  # fmt: skip


def test_a_llama_from_transformers(tmp_path: object) -> None:
    from tests.interop.hf_cases import CASES, make

    from glassgpt.interop import from_hf

    model = from_hf(make(CASES["llama-gqa2-llama3-untied"]), dtype=F64)
    L, d = model.config.n_layers, model.config.d_model
    cfg = CLTConfig(d_model=d, d_sae=16, n_layers=L, arch="topk", k=3, dtype="float64")
    tc = Transcoders(clt=CLT(cfg, seed=1))
    ids = [3, 9, 27, 1, 40, 7]
    graph = attribute(model, tc, ids, dtype=F64)
    assert (graph.frozen.logits - model(torch.tensor([ids]))[0]).abs().max() < 1e-10
    assert (graph.adjacency - removed_reads(model, graph)).abs().max() < 1e-8
    target = int(graph.adjacency[: graph.n_features].abs().sum(1).argmax())
    source = int(graph.adjacency[target].abs().argmax())
    parts = edge_heads(model, graph, target, source)
    assert abs(sum(parts.values()) - float(graph.adjacency[target, source])) < 1e-10


def exact_transcoders(model: GPT) -> Transcoders:
    """Per-layer transcoders equal to ReLU MLPs: W_enc = W_in, b_enc = b_in, W_dec = W_out,
    b_dec = b_out, σ = ReLU."""
    c = model.config
    saes = {}
    for l, block in enumerate(model.blocks):
        cfg = SAEConfig(d_in=c.d_model, d_sae=c.d_mlp, arch="transcoder",
                        transcoder_activation="relu", hook=f"blocks.{l}.mlp_out", dtype="float64")  # fmt: skip
        sae = SAE(cfg)
        with torch.no_grad():
            sae.W_enc.copy_(block.mlp.W_in)
            sae.b_enc.copy_(block.mlp.b_in)
            sae.W_dec.copy_(block.mlp.W_out)
            sae.b_dec.copy_(block.mlp.b_out)
        saes[l] = sae
    return Transcoders(layers=saes)


def test_perfect_transcoders_leave_the_errors_nothing() -> None:
    model = model_of("gpt2", mlp="relu")
    graph = attribute(model, exact_transcoders(model), PROMPT, dtype=F64)
    assert graph.frozen.errors.abs().max() < 1e-12
    assert graph.adjacency[:, graph.error_start : graph.token_start].abs().max() < 1e-12
    replacement, completeness = scores(graph)
    assert replacement == pytest.approx(1.0, abs=1e-9) and completeness == pytest.approx(1.0, abs=1e-9)  # fmt: skip
    # with random transcoders the errors carry a share, and both scores say so
    rough = attribute(model, per_layer((0, 1, 2)), PROMPT, dtype=F64)
    r, c = scores(rough)
    assert 0 < r < 0.99 and 0 < c < 0.99


def test_pruning_at_one_keeps_everything_and_defaults_prune() -> None:
    model = model_of("gpt2")
    graph = attribute(model, clt(), PROMPT, dtype=F64)
    everything = prune(graph, 1.0, 1.0)
    assert bool(everything.nodes.all()) and bool((everything.edges == (graph.adjacency != 0)).all())
    pruned = prune(graph)
    assert 0 < pruned.n_nodes < graph.n_nodes and 0 < pruned.n_edges < everything.n_edges
    assert bool(pruned.nodes[graph.token_start :].all())  # tokens and logits always kept
    # every kept edge joins kept nodes
    t, s = pruned.edges.nonzero(as_tuple=True)
    assert bool(pruned.nodes[t].all() and pruned.nodes[s].all())
    tighter = prune(graph, 0.5, 0.9)
    assert tighter.n_nodes <= pruned.n_nodes and tighter.n_edges < pruned.n_edges
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(GlassError, match="must be in \\(0, 1\\]"):
            prune(graph, bad)


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa", "neox-parallel", "gemma-sandwich"])
def test_heads_split_every_edge_exactly(family: str) -> None:
    model = model_of(family)
    graph = attribute(model, clt(), PROMPT, dtype=F64)
    A = graph.adjacency
    checked = 0
    for target in [*range(0, graph.n_features, 9), graph.logit_start]:
        sources = A[target].nonzero().flatten().tolist()[::4]
        for source, parts in zip(sources, head_split(model, graph, target, sources), strict=True):
            assert abs(sum(parts.values()) - float(A[target, source])) < 1e-10
            _, _, p_t, _ = graph.node(target)
            _, _, p_s, _ = graph.node(source)
            if p_t != p_s:  # across positions only attention carries an edge
                assert parts["resid"] == 0.0
            checked += 1
    assert checked > 20


def test_head_parts_are_the_heads_own_effect() -> None:
    """Zero a layer-0 head's pattern in the frozen model: every path through it has it as
    its first head, so a token's edge falls by exactly that head's part."""
    model = model_of("gpt2")
    graph = attribute(model, clt(), PROMPT, dtype=F64)
    A, fz = graph.adjacency, graph.frozen
    logit = graph.logit_start
    source = int(A[logit, graph.token_start : graph.logit_start].abs().argmax()) + graph.token_start
    parts = edge_heads(model, graph, logit, source)
    name = "blocks.0.attn.pattern"
    saved = fz.patterns[name].clone()
    fz.patterns[name][:, 1] = 0  # head 0.1 carries nothing
    try:
        cut = attribute_row(model, graph, logit, source)
    finally:
        fz.patterns[name] = saved
    assert abs((float(A[logit, source]) - cut) - parts["0.1"]) < 1e-10
    assert abs(parts["0.1"]) > 1e-6


def attribute_row(model: GPT, graph: Graph, target: int, source: int) -> float:
    """A[target, source] recomputed by removing the source in the (possibly edited) frozen model."""
    fz = graph.frozen
    embed, writes = fz.embed[None].clone(), [w[None].clone() for w in fz.writes]
    _, _, pos, _ = graph.node(source)
    _, read_pos, vec = graph.specs[target - graph.logit_start + graph.n_features]
    with torch.no_grad():
        return _cut(model, fz, embed, writes, pos, read_pos, vec)


def _cut(model: GPT, fz, embed, writes, pos, read_pos, vec) -> float:  # type: ignore[no-untyped-def]
    full = run_frozen(model, fz, embed, writes).final[0, read_pos] @ vec
    embed[0, pos] = 0
    cut = run_frozen(model, fz, embed, writes).final[0, read_pos] @ vec
    return float(full - cut)


def test_capped_graph_keeps_the_full_graphs_edges() -> None:
    model = model_of("gpt2")
    full = attribute(model, clt(), PROMPT, dtype=F64)
    capped = attribute(model, clt(), PROMPT, dtype=F64, max_feature_nodes=15, batch_size=4)
    assert capped.n_features == 15 and capped.n_active == full.n_features
    where = [int(((full.features == f).all(1)).nonzero()) for f in capped.features]
    keep = torch.tensor(where + list(range(full.error_start, full.n_nodes)))
    assert (capped.adjacency - full.adjacency[keep][:, keep]).abs().max() < 1e-12
    # the features chosen are among the most influential ones of the full graph
    from glassgpt.features.graph_prune import influence, logit_weights, normalized

    inf = influence(normalized(full.adjacency), logit_weights(full))[: full.n_features]
    assert inf[where].sum() > inf.sort(descending=True).values[15:30].sum()


def test_the_capped_searchs_influence_is_the_series_over_the_rows_so_far() -> None:
    # a random acyclic graph: 30 features (a feature reads only lower ones), 10 other columns,
    # 3 logits; 12 feature rows computed so far, in a shuffled order
    from glassgpt.features.graph_prune import influence, normalized
    from glassgpt.features.graphs import _partial_influence

    gen = torch.Generator().manual_seed(0)
    n_a, n_cols, n_l = 30, 40, 3
    rows = torch.randn(n_a, n_cols, generator=gen, dtype=F64)
    rows[:, :n_a] = rows[:, :n_a].tril(-1) * (torch.rand(n_a, n_a, generator=gen) < 0.5)
    logit_rows = torch.randn(n_l, n_cols, generator=gen, dtype=F64)
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    chosen = torch.randperm(n_a, generator=gen)[:12].tolist()
    # the oracle: the whole square graph, unchosen features' rows 0, pruning's own series
    A = torch.zeros(n_cols + n_l, n_cols + n_l, dtype=F64)
    A[chosen, :n_cols] = rows[chosen]
    A[n_cols:, :n_cols] = logit_rows
    w = torch.cat([torch.zeros(n_cols, dtype=F64), probs])
    want = influence(normalized(A), w)[:n_cols]
    got = _partial_influence(rows[chosen], chosen, logit_rows, probs)
    direct = _partial_influence(rows[:0], [], logit_rows, probs)
    assert (want - direct).sum() > 0.2 * direct.sum()  # much of it passed on through features
    assert (got - want).abs().max() < 1e-12


def test_a_direction_is_read_like_a_logit_difference() -> None:
    model = model_of("gpt2")
    W_U = model.W_U.detach()
    a, b = 3, 7
    diff = attribute(model, clt(), PROMPT, dtype=F64, directions=[W_U[:, a] - W_U[:, b]])
    each = attribute(model, clt(), PROMPT, dtype=F64, directions=[W_U[:, a], W_U[:, b]])
    assert diff.logit_tokens == [model.config.n_vocab] and float(diff.logit_probs[0]) == 1.0
    row = diff.adjacency[-1, : diff.logit_start]
    assert (row - (each.adjacency[-2, : each.logit_start] - each.adjacency[-1, : each.logit_start])).abs().max() < 1e-10  # fmt: skip
    logits = model(torch.tensor([PROMPT]))[0, -1].detach()
    # input + the bias b_U would add: the logit difference itself (no b_U in this model)
    assert abs(float(diff.inputs[-1]) - float(logits[a] - logits[b])) < 1e-10
    with pytest.raises(GlassError, match="shape"):
        attribute(model, clt(), PROMPT, directions=[torch.ones(3)])


def test_transcoders_from_another_model_are_refused() -> None:
    model = model_of("gpt2")
    wide = Transcoders(clt=CLT(CLTConfig(d_model=16, d_sae=8, n_layers=3)))
    with pytest.raises(GlassError, match=r"d_model=16.*d_model=8"):
        freeze(model, wide, PROMPT)
    deep = per_layer((5,))
    with pytest.raises(GlassError, match=r"blocks\.5"):
        freeze(model, deep, PROMPT)
