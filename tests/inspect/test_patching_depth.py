"""The patching sweeps at 2, 4 and 12 layers: every one of the 15 functions (and the
``*_every`` stacks) equals the explicit loop of ``run_with_hooks`` patched runs, float64, for a
metric that reads one position and some ids (the sweep then computes those logits alone, and
the last block at that position alone), one that reads one position and every id, and one that
reads every position (``loss``); and on the families' blocks (grouped keys, sliding layers
with their own rope base, soft caps, parallel and sandwich residuals, post-norm)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from tests.inspect.test_patching import HOOK, TL_NAMES

from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.cache import patch_hook, run_with_cache, run_with_hooks
from glassgpt.inspect.metrics import logit_diff, logprob, loss, normalised

ALL = slice(None)


def index_of(site: str, by: str, idx: tuple[int, ...]) -> tuple[Any, ...]:
    """The part of the activation (batch axis included) that one cell patches, written out."""
    if site == "pattern":  # [B, H, T_dest, T_src]
        return {"layer": (ALL,), "layer_head": (ALL, *idx), "layer_head_pos": (ALL, *idx),
                "layer_head_dest_src": (ALL, *idx)}[by]  # fmt: skip
    if site in HOOK:  # [B, T, heads, d_head]
        return {"layer_head": (ALL, ALL, *idx), "layer_pos_head": (ALL, *idx)}[by]
    return (ALL, *idx)  # [B, T, d_model]


def loop_logits(model, corrupted, cache, site: str, by: str) -> dict[tuple[int, ...], Any]:
    """Each cell's logits from its own patched forward (run_with_hooks + patch_hook)."""
    c, T = model.config, corrupted.shape[1]
    heads = c.kv_heads if site in ("k", "v") else c.n_heads
    sizes = {"pos": T, "head": heads, "dest": T, "src": T}
    shape = [sizes[a] for a in patching.BYS[by]]
    out = {}
    for layer in range(c.n_layers):
        name = f"blocks.{layer}.{HOOK.get(site, site)}"
        for idx in itertools.product(*[range(n) for n in shape]):
            hook = patch_hook(cache[name], index_of(site, by, idx))
            out[(layer, *idx)] = run_with_hooks(model, corrupted, {name: hook})
    return out


def metrics(corrupted: torch.Tensor, clean_logits, corrupt_logits) -> dict[str, Any]:
    B = corrupted.shape[0]
    diff = logit_diff(list(range(1, B + 1)), [7] * B)  # one id per prompt
    return {
        "normalised logit_diff at the last position": normalised(
            diff, clean_logits, corrupt_logits
        ),
        "logprob at position 2 (every id)": logprob(3, pos=2),
        "loss (every position)": loss(corrupted),
    }


def check(model, clean, corrupted, names=TL_NAMES) -> None:
    clean_logits, cache = run_with_cache(model, clean)
    corrupt_logits = run_with_hooks(model, corrupted, {})
    ms = metrics(corrupted, clean_logits, corrupt_logits)
    for name in names:
        site, by = TL_NAMES[name]
        if site == "mlp_out" and model.config.attn_only:
            continue
        if site == "resid_mid" and model.config.parallel_residual:
            continue
        runs = loop_logits(model, corrupted, cache, site, by)
        for label, m in ms.items():
            got = getattr(patching, name)(model, corrupted, cache, m)
            want = torch.zeros(got.shape, dtype=torch.float64)
            for idx, logits in runs.items():
                want[idx] = m(logits)
            gap = float((got - want).abs().max())
            assert gap <= 1e-11, f"{name}, {label}: {gap:.1e}"
            if label != "logprob at position 2 (every id)":  # (cells after 2 change nothing)
                assert float(want.std()) > 1e-3, f"{name}, {label}: the cells do not differ"


# At 12 layers, one sweep of each kind of site (the loop's forwards are what take the time).
DEEP = ["get_act_patch_resid_pre", "get_act_patch_mlp_out", "get_act_patch_attn_head_out_all_pos",
        "get_act_patch_attn_head_k_by_pos", "get_act_patch_attn_head_v_all_pos",
        "get_act_patch_attn_head_pattern_all_pos", "get_act_patch_attn_head_pattern_dest_src_pos"]  # fmt: skip


@pytest.mark.parametrize("n_layers", [2, 4, 12])
def test_every_sweep_equals_the_loop_of_patched_runs_at_each_depth(tiny, n_layers):
    config = tiny.config(n_layers=n_layers, positional="rope", n_ctx=8, d_model=8, n_heads=2)
    model = tiny.model(config, seed=n_layers)
    B, T = (2, 4) if n_layers < 12 else (1, 3)
    clean = tiny.tokens(config, B, T, seed=2)
    corrupted = clean.clone()
    corrupted[0, 1] = (clean[0, 1] + 3) % config.n_vocab
    corrupted[B - 1, 2] = (clean[B - 1, 2] + 5) % config.n_vocab
    check(model, clean, corrupted, list(TL_NAMES) if n_layers < 12 else DEEP)


FAMILIES = {
    "grouped keys, qk-norm, sliding layers with their own base, soft caps, sandwich": dict(
        positional="rope", norm="rmsnorm", n_heads=4, n_kv_heads=2, d_model=16, qk_norm=True,
        sliding_window=2, layer_types=("sliding", "full", "sliding"), rope_local_base=100.0,
        attn_softcap=3.0, final_softcap=5.0, sandwich_norm=True, norm_offset=1.0,
        mlp="swiglu", bias=False,
    ),
    "parallel residual, half rotary": dict(
        positional="rope", parallel_residual=True, rotary_fraction=0.5, d_model=12, n_heads=3,
    ),
    "post-norm, attention only, untied": dict(
        norm_placement="post", attn_only=True, tie_embeddings=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_sweeps_equal_the_loop_on_the_families_blocks(tiny, family):
    config = tiny.config(n_layers=3, **FAMILIES[family])
    model = tiny.model(config, seed=5)
    clean = tiny.tokens(config, 1, 4, seed=4)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 4) % config.n_vocab
    check(
        model,
        clean,
        corrupted,
        [*DEEP[:-1], "get_act_patch_resid_mid", "get_act_patch_attn_head_q_by_pos"],
    )


def test_every_stacks_equal_their_sweeps_with_a_one_position_metric(tiny):
    config = tiny.config(n_layers=4, n_kv_heads=1, positional="rope")
    model = tiny.model(config, seed=1)
    clean = tiny.tokens(config, 1, 5, seed=3)
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 1) % config.n_vocab
    _, cache = run_with_cache(model, clean)
    m = logit_diff(1, 2)
    every = patching.get_act_patch_attn_head_all_pos_every(model, corrupted, cache, m)
    for i, site in enumerate(patching.HEAD_SITES):
        one = patching.activation_patch(model, corrupted, cache, m, site, by="layer_head")
        if site in ("k", "v"):  # one key/value group read by every query head
            one = one.expand(-1, config.n_heads)
        assert torch.equal(every[i], one)


def test_an_id_out_of_range_is_named_by_the_metric(tiny):
    config = tiny.config()
    model = tiny.model(config)
    clean = tiny.tokens(config, 1, 4)
    corrupted = clean.clone()
    corrupted[0, 1] = (clean[0, 1] + 1) % config.n_vocab
    _, cache = run_with_cache(model, clean)
    with pytest.raises(GlassError, match=f"token id 99 is out of range \\[0, {config.n_vocab}\\)"):
        patching.get_act_patch_resid_pre(model, corrupted, cache, logit_diff(99, 1))
