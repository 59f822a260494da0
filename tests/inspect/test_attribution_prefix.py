"""Attribution patching of prompt pairs that share a prefix, read at one position
(``glassgpt.inspect.attribution_suffix``), against the explicit computation: a clean cache,
then a corrupted forward and backward over every position with autograd (float64)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.interop.hf_cases import CASES, make

from glassgpt.inspect.attribution import attribution_patch
from glassgpt.inspect.attribution_suffix import first_difference
from glassgpt.inspect.cache import run_with_cache
from glassgpt.inspect.metrics import logit_diff, logprob
from glassgpt.interop import from_hf

VARIANTS = [
    {},
    {"positional": "rope", "norm": "rmsnorm", "bias": False, "mlp": "swiglu", "n_kv_heads": 1},
    {"attn_only": True, "positional": "sinusoidal"},
    {"parallel_residual": True, "positional": "rope"},
    {"norm_placement": "post"},
    {"positional": "rope", "sliding_window": 3},
]
SITES = ["resid_pre", "ln1.scale", "attn.q", "attn.k", "attn.v", "attn.z", "attn_out",
         "resid_mid", "mlp.post", "mlp_out", "resid_post"]  # fmt: skip
# {row: positions where the corrupted prompt differs}: at 0, at the last position alone, at
# several, and rows whose first differences differ
DIFFERS = [{0: [0]}, {0: [5], 1: [5]}, {0: [2, 4], 1: [3]}, {0: [4], 1: [1, 4]}]


def corrupt(clean: torch.Tensor, differ: dict[int, list[int]], n_vocab: int) -> torch.Tensor:
    corrupted = clean.clone()
    for row, positions in differ.items():
        for pos in positions:
            corrupted[row, pos] = (clean[row, pos] + 1 + pos) % n_vocab
    return corrupted


def explicit(model, clean, corrupted, metric, sites: list[str]) -> dict[str, torch.Tensor]:
    """Σ over prompts (and features) of ∂m/∂a · (a_clean − a_corrupted), from full runs."""
    L = model.config.n_layers
    names = [n for n in model.hook_names() if n.startswith("blocks.") and n.split(".", 2)[2] in sites]  # fmt: skip
    # a norm's scale is a side computation unless its hook returns it (then it is used)
    used = {n: lambda t, _: t.view_as(t) for n in names if n.endswith("scale")}
    _, cc = run_with_cache(model, clean, names)
    logits, ck = run_with_cache(model, corrupted, names, hooks=used, grad=True, detach=False)
    grads = torch.autograd.grad(metric(logits), [ck[n] for n in names])
    prods = {n: g * (cc[n] - ck[n].detach()) for n, g in zip(names, grads, strict=True)}
    out = {}
    for site in sites:
        layers = [prods[f"blocks.{l}.{site}"] for l in range(L)]
        keep_last = site == "mlp.post"  # one score per neuron
        out[site] = torch.stack([p.sum(0) if keep_last else p.sum((0, -1)) for p in layers])
    return out


def sites_of(model) -> list[str]:
    have = {n.split(".", 2)[2] for n in model.hook_names() if n.startswith("blocks.0.")}
    return [s for s in SITES if s in have]


@pytest.mark.parametrize("differ", DIFFERS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_shared_prefix_attribution_equals_the_explicit_computation(
    variant: dict, differ: dict, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=5)
    clean = tiny.tokens(cfg, 2, 6, seed=3)
    corrupted = corrupt(clean, differ, cfg.n_vocab)
    sites = sites_of(model)
    for metric in (logit_diff(2, 7), logprob(4, pos=3)):
        got = attribution_patch(model, clean, corrupted, metric, sites)
        want = explicit(model, clean, corrupted, metric, sites)
        for site in sites:
            torch.testing.assert_close(got[site], want[site], rtol=1e-9, atol=1e-11)
    if first_difference(clean, corrupted) < 5:
        assert got["attn.z"].abs().sum() > 0


def test_the_prefix_and_the_positions_after_the_metric_are_not_recomputed(tiny) -> None:
    """The clean run covers positions 0 … r, the corrupted one first difference … r."""
    cfg = tiny.config()
    model = tiny.model(cfg, seed=6)
    clean = tiny.tokens(cfg, 2, 7, seed=4)
    corrupted = corrupt(clean, {0: [3, 5], 1: [2]}, cfg.n_vocab)
    seen: list[tuple[int, ...]] = []
    with model.hooks({"blocks.0.resid_pre": lambda t, n: seen.append(tuple(t.shape[:2]))}):
        attribution_patch(model, clean, corrupted, logprob(1, pos=4), ["attn.z"])
    assert seen == [(2, 5), (2, 3)]  # clean 0 … 4; corrupted 2 … 4
    seen.clear()
    with model.hooks({"blocks.0.resid_pre": lambda t, n: seen.append(tuple(t.shape[:2]))}):
        attribution_patch(model, clean, corrupted, lambda z: logprob(1, pos=4)(z), ["attn.z"])
    assert seen == [(2, 7), (2, 7)]  # a plain function may read any position: every one


def test_equal_prompts_and_a_metric_before_the_difference_score_zero(tiny) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=7)
    clean = tiny.tokens(cfg, 1, 6, seed=2)
    for corrupted, metric in ((clean, logit_diff(1, 2)), (corrupt(clean, {0: [4]}, 11), logprob(3, pos=2))):  # fmt: skip
        got = attribution_patch(model, clean, corrupted, metric, ["attn.z", "resid_pre"])
        assert got["attn.z"].abs().max() == 0 and got["resid_pre"].abs().max() == 0


def test_first_difference() -> None:
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert first_difference(a, a) == 4
    assert first_difference(a, torch.tensor([[1, 2, 3, 5], [1, 0, 3, 4]])) == 1
    assert first_difference(a, torch.tensor([[0, 2, 3, 4], [1, 2, 3, 4]])) == 0


@pytest.mark.parametrize(
    "family", ["llama-gqa2-llama3-untied", "gemma3-softcaps-untied-all-sliding", "neox-parallel-quarter-rotary"]
)  # fmt: skip
def test_families_equal_the_explicit_computation(family: str) -> None:
    """Grouped-query attention with llama3 RoPE, Gemma 3's sliding windows with their own
    rope base and sandwich norms, GPT-NeoX's parallel blocks with partial rotary."""
    pytest.importorskip("transformers")
    model = from_hf(make(CASES[family]), dtype=torch.float64).eval()
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, model.config.n_vocab, (2, 7), generator=gen)
    corrupted = corrupt(clean, {0: [2, 5], 1: [3]}, model.config.n_vocab)
    sites = [
        s for s in ("resid_pre", "attn.q", "attn.k", "attn.z", "mlp_out") if s in sites_of(model)
    ]
    metric = logit_diff(1, 4)
    got = attribution_patch(model, clean, corrupted, metric, sites)
    want = explicit(model, clean, corrupted, metric, sites)
    for site in sites:
        torch.testing.assert_close(got[site], want[site], rtol=1e-9, atol=1e-11)


def test_per_head_results_take_the_attention_outputs_gradient(tiny) -> None:
    """attn.result (computed on the side of the fused attention): ∂m/∂result_h = ∂m/∂attn_out."""
    cfg = tiny.config(positional="rope")
    model = tiny.model(cfg, seed=8)
    clean = tiny.tokens(cfg, 2, 6, seed=5)
    corrupted = corrupt(clean, {0: [2], 1: [3, 4]}, cfg.n_vocab)
    metric = logprob(3)
    got = attribution_patch(model, clean, corrupted, metric, ["attn.result"])["attn.result"]
    for l in range(cfg.n_layers):
        _, cc = run_with_cache(model, clean, [f"blocks.{l}.attn.result"])
        names = [f"blocks.{l}.attn_out", f"blocks.{l}.attn.result"]
        logits, ck = run_with_cache(model, corrupted, names, grad=True, detach=False)
        (g,) = torch.autograd.grad(metric(logits), ck[names[0]])
        want = torch.einsum("btd,bthd->th", g, cc[names[1]] - ck[names[1]].detach())
        torch.testing.assert_close(got[l], want, rtol=1e-9, atol=1e-11)
    assert got[:, :2].abs().max() == 0 and got[:, 2:].abs().sum() > 0
