"""glassgpt.inspect on every family, against transformers running the same model (float64):
tiny random Llama (GQA, llama3 rope), Qwen3 (QK-norm), Gemma 3 (sandwich norms, soft-caps,
sliding windows with their own rope base, √d embeddings, 1 + w) and GPT-NeoX (parallel
residual, partial rotary) from ``tests/interop/hf_cases``.

The oracles are transformers' own modules: its hidden states and attention patterns, its
final norm and lm_head, its q/k/v projections with the key/value groups repeated explicitly,
and interventions made by forward hooks (a head zeroed at o_proj's input, a residual
position replaced at a decoder layer's input, a key group replaced at k_proj's output).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.interop.hf_cases import CASES, float64_everywhere, float64_softmax, make

from glassgpt import inspect as gi
from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.cache import patch_hook
from glassgpt.interop import from_hf
from glassgpt.model.layers import softcap
from glassgpt.model.probes import repeated_random_tokens

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = [
    "llama-gqa2-llama3-untied",
    "qwen3-gqa2-untied",
    "gemma3-softcaps-untied-all-sliding",
    "gemma3-local-base-linear-full",
    "neox-parallel-quarter-rotary",
]
V = 41
ATOL = 1e-10


class Pair:
    """glassgpt's model and transformers' (float64 throughout, eager attention)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ours = from_hf(make(CASES[name]), dtype=torch.float64)
        self.hf = float64_everywhere(make(CASES[name]), self.ours)
        self.hf.set_attn_implementation("eager")  # (its patterns are returned only so)
        base = self.hf.base_model
        self.layers = base.layers
        self.embed = getattr(base, "embed_tokens", None) or base.embed_in
        self.final_norm = getattr(base, "norm", None) or base.final_layer_norm
        self.rotary = base.rotary_emb
        self.neox = not hasattr(base, "embed_tokens")
        self.gemma = "gemma" in name

    def attn(self, layer: int) -> Any:
        blk = self.layers[layer]
        return blk.attention if self.neox else blk.self_attn

    def o_proj(self, layer: int) -> Any:
        return self.attn(layer).dense if self.neox else self.attn(layer).o_proj

    def run(self, tokens: torch.Tensor, hooks: list[tuple[Any, Any, bool]] = ()) -> Any:
        """transformers' output on ``tokens`` with (module, hook, pre) hooks attached."""
        handles = [
            m.register_forward_pre_hook(h) if pre else m.register_forward_hook(h)
            for m, h, pre in hooks
        ]
        try:
            with torch.no_grad(), float64_softmax():
                return self.hf(tokens, output_hidden_states=True, output_attentions=True)
        finally:
            for handle in handles:
                handle.remove()

    def gain(self, norm: Any) -> torch.Tensor:
        return 1.0 + norm.weight if self.gemma else norm.weight

    def final_linear(self, y: torch.Tensor) -> torch.Tensor:
        """The final norm's linear part (centring, gain; no scale, no bias), then lm_head."""
        if self.neox:
            y = y - y.mean(-1, keepdim=True)
        return F.linear(y * self.gain(self.final_norm), self.hf.lm_head.weight)


@pytest.fixture(params=FAMILIES, scope="module")
def pair(request: pytest.FixtureRequest) -> Pair:
    return Pair(request.param)


def tokens(B: int = 2, T: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def corrupt(x: torch.Tensor, pos: int = 3) -> torch.Tensor:
    y = x.clone()
    y[:, pos] = (y[:, pos] + 7) % V
    return y


def close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=0, atol=atol)


def test_the_cache_holds_transformers_hidden_states_and_patterns(pair: Pair) -> None:
    x = tokens()
    theirs = pair.run(x)
    logits, cache = gi.run_with_cache(pair.ours, x)
    close(logits, theirs.logits)
    L = pair.ours.config.n_layers
    for layer in range(L):
        close(cache["resid_pre", layer], theirs.hidden_states[layer])
        close(cache["pattern", layer], theirs.attentions[layer])
    close(cache["ln_final.out"], theirs.hidden_states[L])
    assert ("blocks.0.resid_mid" in cache) != pair.ours.config.parallel_residual
    if pair.ours.config.kv_heads < pair.ours.config.n_heads:  # k, v per key/value head
        assert cache["k", 0].shape[2] == pair.ours.config.kv_heads


def test_the_logit_lens_reads_through_the_family_final_norm_and_cap(pair: Pair) -> None:
    x = tokens()
    theirs = pair.run(x)
    lens = gi.logit_lens(pair.ours, x)
    cap = pair.ours.config.final_softcap
    with torch.no_grad():
        for layer in range(pair.ours.config.n_layers):
            want = softcap(pair.hf.lm_head(pair.final_norm(theirs.hidden_states[layer])), cap)
            close(lens.logits[layer], want)
    close(lens.logits[-1], theirs.logits)


def test_direct_logit_attribution_adds_up_to_transformers_logits(pair: Pair) -> None:
    x = tokens()
    theirs = pair.run(x).logits
    dla = gi.direct_logit_attribution(pair.ours, x)
    close(dla.total(), theirs)
    ids = torch.tensor([[[1, 5]] * 8] * 2)
    close(dla.total(ids), theirs.gather(-1, ids))
    heads = [n for n in dla.names if ".attn.h" in n]
    assert len(heads) == pair.ours.config.n_layers * pair.ours.config.n_heads
    if pair.ours.config.final_softcap:  # the cap bites, so the parts add up before it only
        assert (dla.logits().sum(0) - theirs).abs().max() > 1e-3


def test_head_scores_are_transformers_patterns_at_the_mechanisms_offsets(pair: Pair) -> None:
    n = 4
    x = repeated_random_tokens(V, n, 3, seed=2)
    pattern = torch.stack(pair.run(x).attentions).mean(1)  # [L, H, 2n, 2n]
    got = gi.head_scores(pair.ours, x)
    i = torch.arange(n, 2 * n)
    close(got.induction, pattern[:, :, i, i - n + 1].mean(-1))
    close(got.duplicate_token, pattern[:, :, i, i - n].mean(-1))
    j = torch.arange(1, 2 * n)
    close(got.previous_token, pattern[:, :, j, j - 1].mean(-1))


def _zero_head(head: int, d_head: int) -> Any:
    def hook(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        z = args[0].clone()
        z[..., head * d_head : (head + 1) * d_head] = 0
        return (z, *args[1:])

    return hook


@pytest.mark.parametrize("where", [(0, 1), (1, 3)])
def test_zero_ablating_a_head_equals_transformers_with_its_o_proj_input_zeroed(
    pair: Pair, where: tuple[int, int]
) -> None:
    layer, head = where
    x = tokens()
    theirs = pair.run(x, [(pair.o_proj(layer), _zero_head(head, pair.ours.config.d_head), True)])
    ours = gi.run_ablated(pair.ours, x, heads=[where])
    close(ours, theirs.logits)
    assert (ours - pair.run(x).logits).abs().max() > 1e-4  # the ablation changes something


def _projections(pair: Pair, layer: int, ids: torch.Tensor, pos: int) -> tuple[Any, Any, Any]:
    """transformers' q [n, H, d], k and v [n, H, d] (groups repeated) of each token alone at
    position ``pos``, the residual holding its embedding only."""
    cfg = pair.ours.config
    H, G, dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
    attn = pair.attn(layer)
    u = pair.layers[layer].input_layernorm(pair.embed(ids[None]))  # [1, n, D]
    if pair.neox:
        q, k, v = attn.query_key_value(u).view(1, len(ids), H, 3 * dh).chunk(3, dim=-1)
    else:
        q = attn.q_proj(u).view(1, len(ids), H, dh)
        k = attn.k_proj(u).view(1, len(ids), G, dh)
        v = attn.v_proj(u).view(1, len(ids), G, dh)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
    kind = getattr(pair.hf.config, "layer_types", None)
    extra = {"layer_type": kind[layer]} if kind and pair.gemma else {}
    cos, sin = pair.rotary(u, torch.full((1, len(ids)), pos), **extra)
    rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
    r = cos.shape[-1]
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # [1, heads, n, d]
    q_r, k_r = rotate(q[..., :r], k[..., :r], cos, sin)
    q, k = torch.cat([q_r, q[..., r:]], -1), torch.cat([k_r, k[..., r:]], -1)
    k = k.repeat_interleave(H // G, 1)  # the explicit repeat of each group
    v = v.transpose(1, 2).repeat_interleave(H // G, 1)
    return q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_qk_circuit_of_every_head_is_transformers_score_at_a_distance(
    pair: Pair, layer: int
) -> None:
    ids, d = torch.arange(V), 3
    with torch.no_grad():
        q, _, _ = _projections(pair, layer, ids, d)  # queries at position d
        _, k, _ = _projections(pair, layer, ids, 0)  # keys at position 0
        want = torch.einsum("ahd,bhd->hab", q, k) * pair.attn(layer).scaling
    got = gi.qk_circuit(pair.ours, layer, distance=d)  # every head [H, V, V]
    close(got.full(), want)
    close(gi.qk_circuit(pair.ours, layer, 3, distance=d).full(), want[3])
    with pytest.raises(GlassError, match="no position-free QK circuit"):
        gi.qk_circuit(pair.ours, layer, 0)


def test_the_ov_circuit_of_a_grouped_head_is_transformers_direct_path(pair: Pair) -> None:
    cfg = pair.ours.config
    layer, head, dh = 1, 3, cfg.d_head
    with torch.no_grad():
        _, _, v = _projections(pair, layer, torch.arange(V), 0)  # [V, H, d_head]
        z = torch.zeros(V, cfg.n_heads * dh, dtype=torch.float64)
        z[:, head * dh : (head + 1) * dh] = v[:, head]
        y = F.linear(z, pair.o_proj(layer).weight)  # z_h W_O[h] (b_O left out)
        if pair.gemma:  # the sandwich norm's gain
            y = y * pair.gain(pair.layers[layer].post_attention_layernorm)
        want = pair.final_linear(y)
    close(gi.ov_circuit(pair.ours, layer, head).full(), want)
    close(gi.ov_circuit(pair.ours, layer).full()[head], want)


def test_patching_a_key_group_equals_transformers_with_k_proj_patched(pair: Pair) -> None:
    cfg = pair.ours.config
    if pair.neox:
        pytest.skip("GPT-NeoX fuses q, k, v in one projection and has no key groups")
    x = tokens(B=1)
    y = corrupt(x)
    _, cache = gi.run_with_cache(pair.ours, x)
    metric = lambda logits: logits[0, -1, 0] - logits[0, -1, 1]  # noqa: E731
    got = gi.get_act_patch_attn_head_k_all_pos(pair.ours, y, cache, metric)
    assert got.shape == (cfg.n_layers, cfg.kv_heads)
    layer, g, dh = 1, cfg.kv_heads - 1, cfg.d_head
    clean: dict[str, torch.Tensor] = {}
    k_proj = pair.attn(layer).k_proj
    pair.run(x, [(k_proj, lambda m, a, out: clean.setdefault("k", out), False)])

    def patch(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[..., g * dh : (g + 1) * dh] = clean["k"][..., g * dh : (g + 1) * dh]
        return out

    want = metric(pair.run(y, [(k_proj, patch, False)]).logits)
    assert float(abs(got[layer, g] - want)) < ATOL
    assert float(abs(got[layer, g] - metric(pair.run(y).logits))) > 1e-6


def test_patching_the_residual_equals_transformers_with_a_layer_input_replaced(
    pair: Pair,
) -> None:
    x = tokens(B=1)
    y = corrupt(x, pos=2)
    _, cache = gi.run_with_cache(pair.ours, x)
    metric = lambda logits: logits[0, -1, 0] - logits[0, -1, 1]  # noqa: E731
    got = gi.get_act_patch_resid_pre(pair.ours, y, cache, metric)
    clean = pair.run(x).hidden_states
    layer, pos = 1, 2

    def patch(module: Any, args: tuple[torch.Tensor, ...], kwargs: dict) -> Any:
        h = args[0].clone() if args else kwargs["hidden_states"].clone()
        h[:, pos] = clean[layer][:, pos]
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    handle = pair.layers[layer].register_forward_pre_hook(patch, with_kwargs=True)
    try:
        want = metric(pair.run(y).logits)
    finally:
        handle.remove()
    assert float(abs(got[layer, pos] - want)) < ATOL


HOOK = {"z": "attn.z", "q": "attn.q", "k": "attn.k", "v": "attn.v", "pattern": "attn.pattern"}


def _loop(model: Any, y: torch.Tensor, cache: Any, metric: Any, site: str, by: str) -> Any:
    """One patched forward per cell, by run_with_hooks."""
    cfg = model.config
    heads = cfg.kv_heads if site in ("k", "v") else cfg.n_heads
    T = y.shape[1]
    axes = {"layer_pos": [T], "layer_head": [heads], "layer_pos_head": [T, heads],
            "layer_head_pos": [heads, T], "layer_head_dest_src": [heads, T, T]}[by]  # fmt: skip
    out = torch.zeros(cfg.n_layers, *axes, dtype=torch.float64)
    for layer in range(cfg.n_layers):
        name = f"blocks.{layer}.{HOOK.get(site, site)}"
        for idx in np.ndindex(*axes):
            if site == "pattern":
                index = (
                    (slice(None), *idx) if by != "layer_pos_head" else (slice(None), idx[1], idx[0])
                )
            elif by == "layer_pos":
                index = (slice(None), idx[0])
            elif by == "layer_head":
                index = (slice(None), slice(None), idx[0])
            else:
                index = (slice(None), idx[0], idx[1])
            hook = patch_hook(cache[name], index)
            out[(layer, *idx)] = metric(gi.run_with_hooks(model, y, {name: hook}))
    return out


# The sweeps' fast path (a KV prefix, rotary at an offset, each layer's own rope base and
# window, the final cap, k and v per group); tests/inspect/test_patching.py has all 15 on GPT-2.
PATCHING = ["get_act_patch_resid_pre", "get_act_patch_resid_mid", "get_act_patch_attn_head_k_by_pos",
            "get_act_patch_attn_head_pattern_all_pos", "get_act_patch_attn_head_all_pos_every"]  # fmt: skip


@pytest.mark.parametrize("name", PATCHING)
def test_patching_functions_equal_a_loop_of_patched_runs(pair: Pair, name: str) -> None:
    model, cfg = pair.ours, pair.ours.config
    T = 3 if name.endswith("dest_src_pos") else 4
    x = tokens(B=1, T=T, seed=3)
    y = corrupt(x, pos=1)
    _, cache = gi.run_with_cache(model, x)
    metric = lambda logits: logits[0, -1, 0] - logits[0, -1, 1]  # noqa: E731
    fn = getattr(gi, name)
    if name == "get_act_patch_resid_mid" and cfg.parallel_residual:
        with pytest.raises(GlassError, match="no residual stream between attention and MLP"):
            fn(model, y, cache, metric)
        return
    got = fn(model, y, cache, metric)
    if name.endswith("_every"):
        by = "layer_head" if "all_pos" in name else "layer_pos_head"
        sites = ("resid_pre", "attn_out", "mlp_out") if "block" in name else patching.HEAD_SITES
        if "block" in name:
            by = "layer_pos"
        parts = [_loop(model, y, cache, metric, s, by) for s in sites]
        per = cfg.n_heads // cfg.kv_heads
        want = torch.stack([p.repeat_interleave(per, -1) if s in ("k", "v") else p
                            for s, p in zip(sites, parts, strict=True)])  # fmt: skip
    else:
        site, by = patching_site(name)
        want = _loop(model, y, cache, metric, site, by)
    assert got.shape == want.shape
    close(got, want, atol=1e-9)


def patching_site(name: str) -> tuple[str, str]:
    rest = name.removeprefix("get_act_patch_")
    if not rest.startswith("attn_head_"):
        return rest, "layer_pos"
    what, _, how = rest.removeprefix("attn_head_").partition("_")
    site = {"out": "z"}.get(what, what)
    by = {"all_pos": "layer_head", "by_pos": "layer_pos_head", "dest_src_pos": "layer_head_dest_src"}[how]  # fmt: skip
    if site == "pattern" and how == "by_pos":
        by = "layer_head_pos"
    return site, by


def test_edge_attribution_sums_to_each_heads_node_attribution(pair: Pair) -> None:
    x = tokens(B=2, T=6)
    y = corrupt(x, pos=2)
    metric = lambda logits: (logits[:, -1, 0] - logits[:, -1, 1]).mean()  # noqa: E731
    if pair.ours.config.sandwich_norm:
        with pytest.raises(GlassError, match="sandwich norms"):
            gi.edge_attribution_patch(pair.ours, x, y, metric)
        return
    edges = gi.edge_attribution_patch(pair.ours, x, y, metric)
    node = gi.attribution_patch(pair.ours, x, y, metric, ["attn.result"])["attn.result"]
    cfg = pair.ours.config
    for layer in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            u = edges.upstream.index(f"blocks.{layer}.attn.h{h}")
            close(edges.scores[u].sum(), node[layer, :, h].sum(), atol=1e-9)
    if cfg.kv_heads < cfg.n_heads:
        assert "blocks.0.attn.kv0.k" in edges.downstream


def test_path_patching_into_a_heads_keys_patches_its_group(pair: Pair) -> None:
    cfg = pair.ours.config
    if cfg.kv_heads == cfg.n_heads:
        pytest.skip("no key/value groups")
    x = tokens(B=1)
    y = corrupt(x, pos=2)
    metric = lambda logits: logits[0, -1, 0] - logits[0, -1, 1]  # noqa: E731
    _, clean = gi.run_with_cache(pair.ours, x, ["attn.z"])
    sender = patch_hook(clean["z", 0], (slice(None), slice(None), 1))  # head (0, 1) clean
    _, run1 = gi.run_with_cache(
        pair.ours, y, ["blocks.1.attn.k"], hooks={"blocks.0.attn.z": sender}
    )
    per = cfg.n_heads // cfg.kv_heads
    for h in range(cfg.n_heads):  # run 2: only the group of head h gets run 1's keys
        group = patch_hook(run1["k", 1], (slice(None), slice(None), h // per))
        want = metric(gi.run_with_hooks(pair.ours, y, {"blocks.1.attn.k": group}))
        got = gi.path_patch(pair.ours, x, y, metric, gi.Head(0, 1), [gi.Receiver(1, h, "k")])
        assert float(abs(got - want)) < ATOL
