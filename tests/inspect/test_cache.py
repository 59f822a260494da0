"""run_with_cache / run_with_hooks: the recorded activations are the model's, hooks patch them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from glassgpt.errors import GlassError
from glassgpt.inspect import patch_hook, resolve_names, run_with_cache, run_with_hooks
from glassgpt.inspect.cache import run_to_cache

VARIANTS = [
    {},
    {"norm": "rmsnorm", "bias": False, "positional": "rope"},
    {"norm_placement": "post", "tie_embeddings": False, "positional": "sinusoidal"},
    {"attn_only": True, "positional": "none"},
    {"mlp": "swiglu"},
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_recording_every_activation_leaves_logits_bit_identical(
    variant: dict, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, dtype=torch.float32)
    tokens = tiny.tokens(cfg, 2, cfg.n_ctx)
    with torch.no_grad():
        plain = model(tokens)
    logits, cache = run_with_cache(model, tokens)  # every name: explicit pattern, scales, results
    assert list(cache) == model.hook_names()
    assert torch.equal(logits, plain)
    identity = {name: (lambda t, name: t) for name in model.hook_names()}
    assert torch.equal(run_with_hooks(model, tokens, identity), plain)
    assert not model._hook_fns  # nothing left attached: the next forward pays nothing


@pytest.mark.parametrize("variant", VARIANTS)
def test_run_to_cache_records_the_same_values_and_computes_nothing_after_them(
    variant: dict, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, dtype=torch.float32)
    tokens = tiny.tokens(cfg, 2, 5)
    names = ["blocks.0.attn.z", "blocks.0.resid_mid", "blocks.0.resid_post"]
    names = [n for n in names if n in model.hook_names()]
    _, full = run_with_cache(model, tokens, names)
    later: list[str] = []
    spy = {"blocks.1.resid_pre": lambda t, n: later.append(n)}
    with model.hooks(spy):
        got = run_to_cache(model, tokens, names)
    assert list(got) == names and later == []  # the second block never ran
    for n in names:
        assert torch.equal(got[n], full[n])
    assert not model._hook_fns


def test_cached_values_are_the_equations(tiny: SimpleNamespace) -> None:
    """Each cached value against its defining equation, recomputed from its inputs (float64)."""
    cfg = tiny.config()
    model = tiny.model(cfg)
    tokens = tiny.tokens(cfg, 2, 7)
    _, c = run_with_cache(model, tokens)
    blk = model.blocks[1]
    x = c["blocks.1.resid_pre"]
    assert torch.equal(x, c["blocks.0.resid_post"])
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    scale = 1 / torch.sqrt(var + cfg.norm_eps)
    torch.testing.assert_close(c["blocks.1.ln1.scale"], scale, rtol=0, atol=1e-12)
    xn = (x - mu) * scale * blk.ln1.w + blk.ln1.b
    q = torch.einsum("btd,hde->bthe", xn, blk.attn.W_Q) + blk.attn.b_Q
    k = torch.einsum("btd,hde->bthe", xn, blk.attn.W_K) + blk.attn.b_K
    v = torch.einsum("btd,hde->bthe", xn, blk.attn.W_V) + blk.attn.b_V
    for name, want in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(c[name, 1], want, rtol=0, atol=1e-12)
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg.d_head)
    causal = torch.ones(7, 7, dtype=torch.bool).triu(1)
    torch.testing.assert_close(
        c["attn_scores", 1], scores.masked_fill(causal, -math.inf), rtol=0, atol=1e-12
    )
    pattern = torch.softmax(c["attn_scores", 1], -1)
    torch.testing.assert_close(c["pattern", 1], pattern, rtol=0, atol=1e-12)
    z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
    torch.testing.assert_close(c["z", 1], z, rtol=0, atol=1e-12)
    result = torch.einsum("bthe,hed->bthd", z, blk.attn.W_O)
    torch.testing.assert_close(c["result", 1], result, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        c["blocks.1.attn_out"], result.sum(2) + blk.attn.b_O, rtol=0, atol=1e-12
    )
    mid = x + c["blocks.1.attn_out"]
    torch.testing.assert_close(c["blocks.1.resid_mid"], mid, rtol=0, atol=1e-12)
    pre = c["blocks.1.mlp.pre"]
    torch.testing.assert_close(
        c["blocks.1.mlp.post"], F.gelu(pre, approximate="tanh"), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        c["blocks.1.resid_post"], mid + c["blocks.1.mlp_out"], rtol=0, atol=1e-12
    )


def test_names_resolve_by_site_and_pattern_and_unknown_ones_raise(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config())
    assert resolve_names(model, "pattern") == ["blocks.0.attn.pattern", "blocks.1.attn.pattern"]
    assert resolve_names(model, ["blocks.1.resid_post", "embed"]) == [
        "embed",
        "blocks.1.resid_post",
    ]
    assert resolve_names(model, "blocks.1.mlp.*") == [
        "blocks.1.mlp.pre",
        "blocks.1.mlp.post",
    ]
    with pytest.raises(GlassError, match=r"unknown activation 'blocks\.9\.resid_pre'"):
        run_with_cache(model, [1, 2], "blocks.9.resid_pre")
    with pytest.raises(GlassError, match=r"unknown activation 'mlp\.pre_gate'"):
        resolve_names(model, "mlp.pre_gate")  # only gated MLPs have it
    assert not model._hook_fns


def test_cache_indexing_and_missing_names(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config())
    _, cache = run_with_cache(model, [3, 1, 4], ["z", "resid_post"])
    assert cache["z", 0].shape == (1, 3, 3, 4)
    assert cache.stack("resid_post").shape == (2, 1, 3, 12)
    with pytest.raises(GlassError, match="not in this cache"):
        cache["blocks.0.attn.pattern"]
    with pytest.raises(GlassError, match="layer 2 is out of range"):
        cache["z", 2]


def test_patching_the_final_residual_gives_the_source_run_logits_exactly(
    tiny: SimpleNamespace,
) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, dtype=torch.float32)
    clean, corrupt = tiny.tokens(cfg, 1, 6, seed=1), tiny.tokens(cfg, 1, 6, seed=2)
    clean_logits, clean_cache = run_with_cache(model, clean, "resid_post")
    name = "blocks.1.resid_post"
    patched = run_with_hooks(model, corrupt, {name: patch_hook(clean_cache[name])})
    assert torch.equal(patched, clean_logits)


def test_patching_one_position_changes_only_that_position_and_later(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg)
    clean, corrupt = tiny.tokens(cfg, 1, 6, seed=1), tiny.tokens(cfg, 1, 6, seed=2)
    _, clean_cache = run_with_cache(model, clean, "resid_pre")
    corrupt_logits = run_with_hooks(model, corrupt, {})
    name = "blocks.1.resid_pre"
    hook = patch_hook(clean_cache[name], (slice(None), 3))
    logits, cache = run_with_cache(model, corrupt, name, hooks={name: hook})
    assert torch.equal(cache[name][:, 3], clean_cache[name][:, 3])  # the cache holds the patch
    assert torch.equal(logits[:, :3], corrupt_logits[:, :3])  # causal: earlier ones untouched
    assert (logits[:, 3:] - corrupt_logits[:, 3:]).abs().amax(-1).min() > 1e-6


def test_patching_one_head_changes_the_output_by_that_heads_difference(
    tiny: SimpleNamespace,
) -> None:
    cfg = tiny.config(n_layers=1)
    model = tiny.model(cfg)
    clean, corrupt = tiny.tokens(cfg, 1, 5, seed=1), tiny.tokens(cfg, 1, 5, seed=2)
    _, clean_cache = run_with_cache(model, clean, "result")
    _, corrupt_cache = run_with_cache(model, corrupt, ["result", "attn_out"])
    hook = patch_hook(clean_cache["result", 0], (slice(None), slice(None), 1))  # head 1
    _, patched = run_with_cache(model, corrupt, "attn_out", hooks={"result": hook})
    delta = clean_cache["result", 0][:, :, 1] - corrupt_cache["result", 0][:, :, 1]
    torch.testing.assert_close(
        patched["blocks.0.attn_out"], corrupt_cache["blocks.0.attn_out"] + delta, rtol=0, atol=1e-12
    )


def test_bad_patch_shape_and_bad_tokens_raise_glass_errors(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config())
    hook = patch_hook(torch.zeros(1, 2, 12))
    with pytest.raises(GlassError, match="source shape"):
        run_with_hooks(model, [1, 2, 3], {"blocks.0.resid_pre": hook})
    with pytest.raises(GlassError, match="exceeds n_ctx"):
        run_with_cache(model, list(range(9)))
    with pytest.raises(GlassError, match="out of range"):
        run_with_cache(model, [1, 99])
    assert not model._hook_fns
