"""Attribution patching against autograd by hand, exact activation patching, and per-receiver
gradients computed with hooks that cut every other path."""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace

import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.inspect.attribution import attribution_patch
from glassgpt.inspect.cache import run_with_cache, run_with_hooks
from glassgpt.inspect.edges import edge_attribution_patch, edge_names
from glassgpt.inspect.metrics import logit_diff, logprob

VARIANTS = [
    {},
    {"positional": "rope", "norm": "rmsnorm", "bias": False, "mlp": "swiglu"},
    {"attn_only": True, "tie_embeddings": False},
]


def pair(tiny: SimpleNamespace, cfg, B: int = 2, T: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    clean = tiny.tokens(cfg, B, T, seed=1)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 3) % cfg.n_vocab
    corrupted[:, 3] = (clean[:, 3] + 5) % cfg.n_vocab
    return clean, corrupted


def by_hand(model, clean, corrupted, metric, names: list[str]) -> dict[str, torch.Tensor]:
    """∂m/∂a · (a_clean − a_corrupted) elementwise, from plain caches with autograd on."""
    _, cc = run_with_cache(model, clean, names)
    logits, ck = run_with_cache(model, corrupted, names, grad=True, detach=False)
    grads = torch.autograd.grad(metric(logits), [ck[n] for n in names])
    return {n: g * (cc[n] - ck[n].detach()) for n, g in zip(names, grads, strict=True)}


# -- node level ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS[:2])
def test_node_attribution_is_gradient_times_difference(variant: dict, tiny) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=2)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(2, 7)
    sites = ["resid_pre", "resid_mid", "attn_out", "mlp_out", "attn.z", "attn.q", "mlp.post"]
    got = attribution_patch(model, clean, corrupted, metric, sites)
    L = cfg.n_layers
    hand = by_hand(
        model, clean, corrupted, metric, [f"blocks.{l}.{s}" for s in sites for l in range(L)]
    )
    for site in sites:
        prods = [hand[f"blocks.{l}.{site}"] for l in range(L)]
        if site == "mlp.post":
            want = torch.stack([p.sum(0) for p in prods])  # [L, T, d_mlp]: one per neuron
        else:
            want = torch.stack([p.sum((0, -1)) for p in prods])  # [L, T] or [L, T, H]
        torch.testing.assert_close(got[site], want, rtol=1e-10, atol=1e-12)
    assert got["attn.z"].shape == (L, 6, cfg.n_heads)
    cache = run_with_cache(model, clean, [f"blocks.{l}.attn.z" for l in range(L)])[1]
    reused = attribution_patch(model, clean, corrupted, metric, ["attn.z"], clean_cache=cache)
    torch.testing.assert_close(reused["attn.z"], got["attn.z"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_metric_of_one_position_takes_that_positions_logits_alone(variant: dict, tiny) -> None:
    """logit_diff reads the last position: its logits alone are computed, from the last
    block's output there; the same metric as a plain function takes every logit."""
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=4)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(3, 5)
    sites = ["resid_pre", "attn.z", "mlp_out"] if not cfg.attn_only else ["resid_pre", "attn.z"]
    finals: list[tuple[int, ...]] = []  # the final norm's outputs the full unembedding reads
    with model.hooks({"ln_final.out": lambda t, n: finals.append(tuple(t.shape))}):
        fast = attribution_patch(model, clean, corrupted, metric, sites)
        assert finals == []
        plain = attribution_patch(model, clean, corrupted, lambda z: metric(z), sites)
        assert finals == [(2, 6, cfg.d_model)]
    for site in sites:
        torch.testing.assert_close(fast[site], plain[site], rtol=1e-10, atol=1e-12)
    assert fast["attn.z"].abs().sum() > 0


def test_sites_the_fast_path_reads_past_get_their_gradients(tiny: SimpleNamespace) -> None:
    """result: ∂m/∂result_h = ∂m/∂attn_out; pattern: through the explicit z = pattern v."""
    cfg = tiny.config()
    model = tiny.model(cfg, seed=3)
    clean, corrupted = pair(tiny, cfg)
    metric = logprob(4)
    got = attribution_patch(model, clean, corrupted, metric, ["attn.result", "pattern", "embed"])
    for l in range(cfg.n_layers):
        _, cc = run_with_cache(model, clean, [f"blocks.{l}.attn.result"])
        logits, ck = run_with_cache(
            model, corrupted, [f"blocks.{l}.attn_out", f"blocks.{l}.attn.result"], grad=True,
            detach=False,
        )  # fmt: skip
        (g,) = torch.autograd.grad(metric(logits), ck[f"blocks.{l}.attn_out"])
        diff = cc["result", l] - ck["result", l].detach()
        want = torch.einsum("btd,bthd->th", g, diff)
        torch.testing.assert_close(got["attn.result"][l], want, rtol=1e-10, atol=1e-12)
        explicit = copy.deepcopy(model)
        explicit.attn_impl = "explicit"
        name = f"blocks.{l}.attn.pattern"
        prod = by_hand(explicit, clean, corrupted, metric, [name])[name]
        prod = torch.nan_to_num(prod)  # masked entries: 0 · (0 − 0)
        torch.testing.assert_close(got["attn.pattern"][l], prod.sum(0), rtol=1e-10, atol=1e-12)
    want = by_hand(model, clean, corrupted, metric, ["embed"])["embed"].sum((0, -1))
    torch.testing.assert_close(got["embed"], want, rtol=1e-10, atol=1e-12)


def test_node_attribution_tends_to_activation_patching(tiny: SimpleNamespace) -> None:
    """Corrupted = clean with one embedding moved by ε: |attribution − exact patch| = O(ε²)."""
    cfg = tiny.config(tie_embeddings=False)
    base = tiny.model(cfg, seed=4)
    T, a, b = 5, 3, 9
    clean = tiny.tokens(cfg, 1, T, seed=2)
    clean[0, 2] = a
    corrupted = clean.clone()
    corrupted[0, 2] = b
    direction = torch.randn(
        cfg.d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    metric = logit_diff(1, 6)
    sites = ("resid_pre", "attn.z", "mlp_out")
    nodes = [
        (site, l, t, h)
        for site in sites
        for l in range(cfg.n_layers)
        for t in range(T)
        for h in (range(cfg.n_heads) if site == "attn.z" else [None])
    ]
    errors, sizes = [], []
    for eps in (5e-3, 2.5e-3, 1.25e-3):
        model = copy.deepcopy(base)
        with torch.no_grad():
            model.embed.W_E[b] = model.embed.W_E[a] + eps * direction
        attr = attribution_patch(model, clean, corrupted, metric)
        _, cc = run_with_cache(model, clean, list(sites))
        # every node patched in its own row of one batch: row r is node r's patched run
        hooks = {
            f"blocks.{l}.{site}": patch_rows(nodes, site, l, cc[site, l])
            for site in sites
            for l in range(cfg.n_layers)
        }
        runs = run_with_hooks(model, corrupted.expand(len(nodes), T), hooks)
        base_m = metric(run_with_hooks(model, corrupted, {}))
        exact = torch.stack([metric(runs[r : r + 1]) for r in range(len(nodes))]) - base_m
        approx = torch.stack([attr[s][(l, t) if h is None else (l, t, h)] for s, l, t, h in nodes])
        errors.append(float((approx - exact).abs().max()))
        sizes.append(float(exact.abs().max()))
    assert sizes[-1] > 1e-4  # the patches do move the metric
    assert errors[-1] < 2e-3 * sizes[-1]  # relative error → 0 (here O(ε))
    for coarse, fine in itertools.pairwise(errors):
        assert 3.5 < coarse / fine < 5.0  # halving ε quarters the error: O(ε²)


def patch_rows(nodes: list, site: str, layer: int, clean: torch.Tensor):
    """A hook: in row r, node r's entry (position t, head h) takes its clean value."""

    def hook(t: torch.Tensor, name: str) -> torch.Tensor:
        out = t.clone()
        for r, (s, l, pos, h) in enumerate(nodes):
            if (s, l) == (site, layer):
                index = (pos,) if h is None else (pos, h)
                out[(r, *index)] = clean[(0, *index)]
        return out

    return hook


# -- edge level ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_edge_scores_of_a_node_sum_to_its_node_attribution(variant: dict, tiny) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=5)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(2, 7)
    edges = edge_attribution_patch(model, clean, corrupted, metric)
    nodes = attribution_patch(model, clean, corrupted, metric)
    total = dict(zip(edges.upstream, edges.scores.sum(1).tolist(), strict=True))
    want = {"embed": float(nodes["resid_pre"][0].sum())}
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            want[f"blocks.{l}.attn.h{h}"] = float(nodes["attn.z"][l, :, h].sum())
        if not cfg.attn_only:
            want[f"blocks.{l}.mlp"] = float(nodes["mlp_out"][l].sum())
    assert total.keys() == want.keys()
    for name, value in want.items():
        assert total[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert edges.scores.dtype == torch.float64


def sender_diffs(model, clean, corrupted) -> dict[str, torch.Tensor]:
    _, cc = run_with_cache(model, clean)
    _, ck = run_with_cache(model, corrupted)
    out = {"embed": cc["blocks.0.resid_pre"] - ck["blocks.0.resid_pre"]}
    for l, block in enumerate(model.blocks):
        dz = cc["z", l] - ck["z", l]
        for h in range(model.config.n_heads):
            out[f"blocks.{l}.attn.h{h}"] = dz[:, :, h] @ block.attn.W_O[h].detach()
        if block.mlp is not None:
            out[f"blocks.{l}.mlp"] = cc["mlp_out", l] - ck["mlp_out", l]
    return out


def receiver_grad(model, corrupted, metric, receiver: str, ck, embed_hook=None) -> torch.Tensor:
    """∂m/∂x_v through v's own path: a fresh leaf x (its value from the run's cache ``ck``)
    feeds v alone (v's hook value is recomputed from x; everything else keeps its value,
    detached from x)."""
    L = model.config.n_layers
    hooks = {"embed": embed_hook} if embed_hook else {}
    if receiver == "logits":
        x = ck[f"blocks.{L - 1}.resid_post"].clone().requires_grad_(True)
        hooks[f"blocks.{L - 1}.resid_post"] = lambda t, n: x
    else:
        l = int(receiver.split(".")[1])
        block = model.blocks[l]
        if receiver.endswith("mlp.in"):
            x = ck["resid_mid", l].clone().requires_grad_(True)
            mlp = block.mlp
            hooks[f"blocks.{l}.mlp.pre"] = lambda t, n: block.ln2(x) @ mlp.W_in + mlp.b_in
        else:
            h, c = int(receiver.split(".")[3][1:]), receiver[-1]
            x = ck["resid_pre", l].clone().requires_grad_(True)
            W, b = (
                getattr(block.attn, f"W_{c.upper()}")[h],
                getattr(block.attn, f"b_{c.upper()}")[h],
            )

            def swap(t: torch.Tensor, n: str) -> torch.Tensor:
                out = t.detach().clone()
                out[:, :, h] = block.ln1(x) @ W + b
                return out

            hooks[f"blocks.{l}.attn.{c}"] = swap
    logits = run_with_hooks(model, corrupted, hooks, grad=True)
    (g,) = torch.autograd.grad(metric(logits), x)
    return g


def test_edge_scores_equal_per_receiver_gradients_with_other_paths_cut(tiny) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=6)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(5, 0)
    edges = edge_attribution_patch(model, clean, corrupted, metric)
    up, down, allowed = edge_names(model)
    assert (edges.upstream, edges.downstream) == (up, down)
    diffs = sender_diffs(model, clean, corrupted)
    ck = run_with_cache(model, corrupted)[1]
    for j, v in enumerate(down):
        g = receiver_grad(model, corrupted, metric, v, ck)
        for i, u in enumerate(up):
            want = float((diffs[u] * g).sum()) if allowed[i, j] else 0.0
            assert float(edges.scores[i, j]) == pytest.approx(want, rel=1e-9, abs=1e-12), (u, v)
    assert not allowed[up.index("blocks.1.attn.h0"), down.index("blocks.1.attn.h2.k")]
    assert allowed[up.index("blocks.1.attn.h0"), down.index("blocks.1.mlp.in")]
    assert not allowed[up.index("blocks.0.mlp"), down.index("blocks.0.mlp.in")]


def test_eap_ig_with_one_step_is_eap(tiny: SimpleNamespace) -> None:
    cfg = tiny.config(positional="rope")
    model = tiny.model(cfg, seed=7)
    clean, corrupted = pair(tiny, cfg)
    eap = edge_attribution_patch(model, clean, corrupted, logprob(3))
    ig = edge_attribution_patch(model, clean, corrupted, logprob(3), method="eap-ig", steps=1)
    torch.testing.assert_close(ig.scores, eap.scores, rtol=1e-10, atol=1e-13)


def test_eap_ig_averages_gradients_between_corrupted_and_clean(tiny) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=8)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(1, 2)
    steps = 3
    ig = edge_attribution_patch(model, clean, corrupted, metric, method="eap-ig", steps=steps)
    e_clean = model.embed.W_E.detach()[clean]
    e_corrupt = model.embed.W_E.detach()[corrupted]
    diffs = sender_diffs(model, clean, corrupted)
    hooks = [lambda t, n, k=k: e_corrupt + k / steps * (e_clean - e_corrupt) for k in range(steps)]
    caches = [run_with_cache(model, corrupted, hooks={"embed": hook})[1] for hook in hooks]
    for v in ("logits", "blocks.1.attn.h2.q", "blocks.0.mlp.in"):
        g = (
            sum(
                receiver_grad(model, corrupted, metric, v, ck, embed_hook=hook)
                for hook, ck in zip(hooks, caches, strict=True)
            )
            / steps
        )
        j = ig.downstream.index(v)
        for i, u in enumerate(ig.upstream):
            want = float((diffs[u] * g).sum()) if ig.allowed[i, j] else 0.0
            assert float(ig.scores[i, j]) == pytest.approx(want, rel=1e-9, abs=1e-12), (u, v)


def test_eap_ig_is_complete_on_the_embedding(tiny: SimpleNamespace) -> None:
    """Σ_v score(embed → v) = Δx₀ · mean_k ∂m/∂x₀(α_k) → m(clean) − m(corrupted), error O(1/m)."""
    cfg = tiny.config()
    model = tiny.model(cfg, seed=9)
    clean, corrupted = pair(tiny, cfg)
    metric = logit_diff(3, 4)
    gap = float(
        metric(run_with_hooks(model, clean, {})) - metric(run_with_hooks(model, corrupted, {}))
    )
    errors = []
    for steps in (8, 32):
        ig = edge_attribution_patch(model, clean, corrupted, metric, method="eap-ig", steps=steps)
        errors.append(abs(float(ig.scores[0].sum()) - gap))
    assert errors[1] < 0.1 * abs(gap)
    assert errors[1] < 0.4 * errors[0]  # 4× the steps: about ¼ the error


def test_edges_top_and_lookup(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=10, dtype=torch.float32)
    clean, corrupted = pair(tiny, cfg)
    edges = edge_attribution_patch(model, clean, corrupted, logit_diff(2, 7))
    assert edges.scores.dtype == torch.float32
    top = edges.top(5)
    assert len(top) == 5
    sizes = [abs(s) for _, _, s in top]
    assert sizes == sorted(sizes, reverse=True)
    best = edges.scores.abs().masked_fill(~edges.allowed, -1).max()
    assert sizes[0] == pytest.approx(float(best))
    for u, v, s in top:
        assert edges.score(u, v) == s
        assert edges.allowed[edges.upstream.index(u), edges.downstream.index(v)]
    assert len(edges.top(10_000)) == int(edges.allowed.sum())
    with pytest.raises(GlassError, match=r"no node 'blocks\.9\.mlp'"):
        edges.score("blocks.9.mlp", "logits")


def test_the_weights_get_no_gradient_and_keep_their_flags(tiny: SimpleNamespace) -> None:
    """Attribution asks ∂m/∂a only: no parameter gets a .grad, and each keeps requires_grad."""
    cfg = tiny.config()
    model = tiny.model(cfg, seed=11)
    model.embed.W_E.requires_grad_(False)  # a frozen parameter stays frozen
    clean, corrupted = pair(tiny, cfg)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    attribution_patch(model, clean, corrupted, logit_diff(2, 7))
    edge_attribution_patch(model, clean, corrupted, logit_diff(2, 7), method="eap-ig", steps=2)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    assert not flags["embed.W_E"] and sum(flags.values()) == len(flags) - 1


def test_bad_input_raises_one_line(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg)
    clean, corrupted = pair(tiny, cfg)
    m = logit_diff(1, 2)
    with pytest.raises(GlassError, match=r"clean tokens \(2, 6\) and corrupted tokens \(2, 5\)"):
        attribution_patch(model, clean, corrupted[:, :5], m)
    with pytest.raises(GlassError, match="must return one number"):
        attribution_patch(model, clean, corrupted, lambda z: z[:, -1, 0])
    with pytest.raises(GlassError, match=r"unknown activation 'attn\.w'"):
        attribution_patch(model, clean, corrupted, m, ["attn.w"])
    with pytest.raises(GlassError, match=r"clean cache lacks 'blocks\.0\.attn\.z'"):
        attribution_patch(
            model,
            clean,
            corrupted,
            m,
            ["attn.z"],
            clean_cache=run_with_cache(model, clean, ["resid_pre"])[1],
        )
    with pytest.raises(GlassError, match=r"clean cache's 'blocks\.0\.attn\.z' is \(1, 6, 3, 4\)"):
        attribution_patch(
            model, clean, corrupted, m, ["attn.z"], clean_cache=run_with_cache(model, clean[:1])[1]
        )
    with pytest.raises(GlassError, match="unknown edge attribution method 'acdc'"):
        edge_attribution_patch(model, clean, corrupted, m, method="acdc")
    with pytest.raises(GlassError, match="steps ≥ 1"):
        edge_attribution_patch(model, clean, corrupted, m, method="eap-ig", steps=0)
    post = tiny.model(tiny.config(norm_placement="post"))
    with pytest.raises(GlassError, match="needs a pre-norm model"):
        edge_attribution_patch(post, clean, corrupted, m)
    assert attribution_patch(post, clean, corrupted, m)["attn.z"].shape == (2, 6, 3)
