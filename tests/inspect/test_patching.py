"""Activation patching: every sweep equals an explicit loop of patched runs (one forward per
cell, ``run_with_hooks`` + ``patch_hook``), and TransformerLens 4.3 on the same weights."""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.cache import patch_hook, run_with_cache, run_with_hooks
from glassgpt.inspect.metrics import logit_diff, loss, normalised

ALL = slice(None)
# TransformerLens's name → (site, by)
TL_NAMES = {
    "get_act_patch_resid_pre": ("resid_pre", "layer_pos"),
    "get_act_patch_resid_mid": ("resid_mid", "layer_pos"),
    "get_act_patch_attn_out": ("attn_out", "layer_pos"),
    "get_act_patch_mlp_out": ("mlp_out", "layer_pos"),
    "get_act_patch_attn_head_out_by_pos": ("z", "layer_pos_head"),
    "get_act_patch_attn_head_q_by_pos": ("q", "layer_pos_head"),
    "get_act_patch_attn_head_k_by_pos": ("k", "layer_pos_head"),
    "get_act_patch_attn_head_v_by_pos": ("v", "layer_pos_head"),
    "get_act_patch_attn_head_pattern_by_pos": ("pattern", "layer_head_pos"),
    "get_act_patch_attn_head_pattern_dest_src_pos": ("pattern", "layer_head_dest_src"),
    "get_act_patch_attn_head_out_all_pos": ("z", "layer_head"),
    "get_act_patch_attn_head_q_all_pos": ("q", "layer_head"),
    "get_act_patch_attn_head_k_all_pos": ("k", "layer_head"),
    "get_act_patch_attn_head_v_all_pos": ("v", "layer_head"),
    "get_act_patch_attn_head_pattern_all_pos": ("pattern", "layer_head"),
}
HOOK = {"z": "attn.z", "q": "attn.q", "k": "attn.k", "v": "attn.v", "pattern": "attn.pattern"}


def oracle_index(site: str, by: str, idx: tuple[int, ...]) -> tuple[Any, ...]:
    """The part of the activation (batch axis included) that one cell patches, written out."""
    if site == "pattern":  # [B, H, T_dest, T_src]
        return {
            "layer": lambda: (ALL,),
            "layer_head": lambda: (ALL, idx[0]),
            "layer_head_pos": lambda: (ALL, idx[0], idx[1]),
            "layer_pos_head": lambda: (ALL, idx[1], idx[0]),
            "layer_head_dest_src": lambda: (ALL, idx[0], idx[1], idx[2]),
        }[by]()
    if site in HOOK:  # [B, T, H, d_head]
        return {
            "layer": lambda: (ALL,),
            "layer_head": lambda: (ALL, ALL, idx[0]),
            "layer_pos_head": lambda: (ALL, idx[0], idx[1]),
            "layer_head_pos": lambda: (ALL, idx[1], idx[0]),
        }[by]()
    return {"layer": lambda: (ALL,), "layer_pos": lambda: (ALL, idx[0])}[by]()  # [B, T, d]


def loop(model, corrupted, cache, metric, site: str, by: str) -> torch.Tensor:
    """One patched forward per cell, as TransformerLens does it."""
    L, H, T = model.config.n_layers, model.config.n_heads, corrupted.shape[1]
    sizes = {"pos": T, "head": H, "dest": T, "src": T}
    shape = [sizes[a] for a in by.split("_")[1:]]
    out = torch.zeros(L, *shape, dtype=torch.float64)
    for layer in range(L):
        name = f"blocks.{layer}.{HOOK.get(site, site)}"
        for idx in itertools.product(*[range(n) for n in shape]):
            hook = patch_hook(cache[name], oracle_index(site, by, idx))
            out[(layer, *idx)] = metric(run_with_hooks(model, corrupted, {name: hook}))
    return out


def pair(tiny, config, B: int = 2, T: int = 5, where=(1, 3), seed: int = 1):
    clean = tiny.tokens(config, B, T, seed=seed)
    corrupted = clean.clone()
    for i, pos in enumerate(where):
        corrupted[i % B, pos] = (clean[i % B, pos] + 1 + i) % config.n_vocab
    return clean, corrupted


@pytest.mark.parametrize("name", list(TL_NAMES))
def test_each_function_equals_a_loop_of_patched_runs(tiny, name):
    config = tiny.config(positional="rope")  # RoPE: the recomputed positions need their offset
    model = tiny.model(config)
    T = 4 if name.endswith("dest_src_pos") else 5  # (T² cells)
    clean, corrupted = pair(tiny, config, T=T)
    _, cache = run_with_cache(model, clean)
    metric = loss(corrupted)  # reads every position, so the reused logits count too
    got = getattr(patching, name)(model, corrupted, cache, metric)
    want = loop(model, corrupted, cache, metric, *TL_NAMES[name])
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-12
    assert float(want.std()) > 1e-3  # the cells differ: the test can fail


VARIANTS = [
    {},
    {"positional": "rope"},
    {"positional": "sinusoidal", "norm": "rmsnorm"},
    {"positional": "none", "mlp": "swiglu", "bias": False},
    {"norm_placement": "post"},
    {"attn_only": True, "tie_embeddings": False},
]
SITE_BYS = [(s, b) for s in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
            for b in patching._ALLOWED["vector"]] + [
    (s, b) for s in ("z", "q", "k", "v") for b in patching._ALLOWED["head"]] + [
    ("pattern", b) for b in patching._ALLOWED["pattern"]]  # fmt: skip


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    variant=st.sampled_from(VARIANTS),
    site_by=st.sampled_from(SITE_BYS),
    T=st.integers(2, 6),
    where=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    seed=st.integers(0, 3),
)  # fmt: skip
def test_any_variant_site_and_corruption_equals_the_loop(tiny, variant, site_by, T, where, seed):
    site, by = site_by
    config = tiny.config(**variant)
    if site == "mlp_out" and config.attn_only:
        site = "attn_out"
    model = tiny.model(config, seed=seed)
    clean, corrupted = pair(tiny, config, T=T, where=[w % T for w in where], seed=seed + 1)
    _, cache = run_with_cache(model, clean, [HOOK.get(site, site)])
    metric = loss(corrupted)
    got = patching.activation_patch(model, corrupted, cache, metric, site, by=by)
    want = loop(model, corrupted, cache, metric, site, by)
    assert float((got - want).abs().max()) <= 1e-12


@pytest.mark.parametrize("site, by", [("resid_pre", "layer_pos"), ("z", "layer_pos_head"),
                                      ("pattern", "layer_head"), ("v", "layer_head")])  # fmt: skip
def test_clean_into_clean_is_one_and_corrupted_into_corrupted_is_zero(tiny, site, by):
    config = tiny.config()
    model = tiny.model(config)
    clean, corrupted = pair(tiny, config)
    clean_logits, clean_cache = run_with_cache(model, clean)
    corrupt_logits, corrupt_cache = run_with_cache(model, corrupted)
    m = normalised(logit_diff(2, 7), clean_logits, corrupt_logits)
    ones = patching.activation_patch(model, clean, clean_cache, m, site, by=by)
    zeros = patching.activation_patch(model, corrupted, corrupt_cache, m, site, by=by)
    assert torch.allclose(ones, torch.ones_like(ones), atol=1e-12, rtol=0)
    assert torch.allclose(zeros, torch.zeros_like(zeros), atol=1e-12, rtol=0)
    some = patching.activation_patch(model, corrupted, clean_cache, m, site, by=by)
    assert float((some - 1).abs().max()) > 1e-3 and float(some.abs().max()) > 1e-3


@pytest.mark.parametrize("site, by", [("resid_pre", "layer_pos"), ("k", "layer_pos_head"),
                                      ("pattern", "layer_head_pos")])  # fmt: skip
def test_a_sweep_split_into_batches_equals_one_batch(tiny, site, by):
    config = tiny.config(positional="rope")
    model = tiny.model(config)
    clean, corrupted = pair(tiny, config, T=6, where=(0, 4))
    _, cache = run_with_cache(model, clean)
    metric = logit_diff([1, 2], [3, 4])
    one = patching.activation_patch(model, corrupted, cache, metric, site, by=by, batch_size=10**6)
    for size in (1, 2, 5):
        split = patching.activation_patch(model, corrupted, cache, metric, site, by=by,
                                          batch_size=size)  # fmt: skip
        assert float((split - one).abs().max()) <= 1e-12


def test_every_variants_stack_the_sweeps(tiny):
    config = tiny.config()
    model = tiny.model(config)
    clean, corrupted = pair(tiny, config, T=4)
    _, cache = run_with_cache(model, clean)
    m = logit_diff(1, 2)
    L, H, T = config.n_layers, config.n_heads, 4
    block = patching.get_act_patch_block_every(model, corrupted, cache, m)
    heads = patching.get_act_patch_attn_head_all_pos_every(model, corrupted, cache, m)
    by_pos = patching.get_act_patch_attn_head_by_pos_every(model, corrupted, cache, m)
    assert block.shape == (3, L, T) and heads.shape == (5, L, H) and by_pos.shape == (5, L, T, H)
    assert torch.equal(block[2], patching.get_act_patch_mlp_out(model, corrupted, cache, m))
    assert torch.equal(heads[4], patching.get_act_patch_attn_head_pattern_all_pos(model, corrupted, cache, m))  # fmt: skip
    pattern = patching.get_act_patch_attn_head_pattern_by_pos(model, corrupted, cache, m)
    assert torch.equal(by_pos[4], pattern.transpose(1, 2))


def test_bad_input_raises_one_line_naming_the_value(tiny):
    config = tiny.config(attn_only=True)
    model = tiny.model(config)
    clean, corrupted = pair(tiny, config, T=5)
    _, cache = run_with_cache(model, clean, ["resid_pre"])
    m = logit_diff(1, 2)
    cases = [
        (
            lambda: patching.get_act_patch_resid_pre(model, corrupted[:, :4], cache, m),
            "5 tokens and the corrupted one 4",
        ),
        (
            lambda: patching.activation_patch(model, corrupted, cache, m, "resid_pree"),
            "'resid_pree'",
        ),
        (
            lambda: patching.activation_patch(model, corrupted, cache, m, "z", by="layer_pos"),
            "by='layer_pos'",
        ),
        (lambda: patching.get_act_patch_mlp_out(model, corrupted, cache, m), "attention-only"),
        (
            lambda: patching.get_act_patch_attn_out(model, corrupted, cache, m),
            "names=['attn_out']",
        ),
        (
            lambda: patching.get_act_patch_resid_pre(model, corrupted, cache, m, batch_size=0),
            "got 0",
        ),
    ]
    for call, words in cases:
        with pytest.raises(GlassError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)


def test_the_model_stays_in_its_mode_and_patches_in_eval(tiny):
    config = tiny.config(dropout=0.5)
    model = tiny.model(config)
    clean, corrupted = pair(tiny, config, T=4)
    _, cache = run_with_cache(model.eval(), clean, ["resid_pre"])
    m = logit_diff(1, 2)
    want = patching.get_act_patch_resid_pre(model, corrupted, cache, m)
    model.train()
    got = patching.get_act_patch_resid_pre(model, corrupted, cache, m)
    assert model.training and torch.equal(got, want)


# -- TransformerLens 4.3 on the same weights ------------------------------------------------


def transformer_lens_twin(model):
    """A TransformerBridge around transformers' GPT2LMHeadModel holding ``model``'s weights."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    transformers = pytest.importorskip("transformers")
    builder = pytest.importorskip("transformer_lens.model_bridge.sources._bridge_builder")
    from glassgpt.interop.hf_gpt2 import config_to_hf, state_dict_to_hf

    hf_config = transformers.GPT2Config(**config_to_hf(model.config))
    hf = transformers.GPT2LMHeadModel(hf_config).to(torch.float64)
    hf.load_state_dict(state_dict_to_hf(model), strict=False)
    bridge = builder.build_bridge_from_module(hf.eval(), "GPT2LMHeadModel", hf_config=hf_config)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return bridge


TL_CHECKED = [
    "get_act_patch_resid_pre",
    "get_act_patch_attn_head_out_all_pos",
    "get_act_patch_attn_head_q_by_pos",  # [L, T, H]
    "get_act_patch_attn_head_pattern_all_pos",
]


def test_values_and_shapes_equal_transformer_lens(tiny):
    tlp = pytest.importorskip("transformer_lens.patching")
    config = tiny.config(n_vocab=20, n_heads=4, d_model=16, unembed_bias=False)
    model = tiny.model(config)
    bridge = transformer_lens_twin(model)
    clean, corrupted = pair(tiny, config, B=1, T=3, where=(1,))
    with torch.no_grad():
        assert float((bridge(clean) - model(clean)).abs().max()) < 1e-9
        _, tl_cache = bridge.run_with_cache(clean)
    _, cache = run_with_cache(model, clean)

    def metric(logits):
        return logits[0, -1, 3] - logits[0, -1, 5]

    for name in TL_CHECKED:
        theirs = getattr(tlp, name)(bridge, corrupted, tl_cache, metric)
        ours = getattr(patching, name)(model, corrupted, cache, metric)
        assert ours.shape == theirs.shape, name
        assert torch.allclose(ours.float(), theirs.float(), rtol=1e-5, atol=1e-5), name
