"""Path patching: the corrupted run without receivers, activation patching at the last layer,
and the direct path written out by hand (the sender's clean − corrupted output added to the
receiver's input alone)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgpt.errors import GlassError
from glassgpt.inspect import patching
from glassgpt.inspect.cache import run_with_cache, run_with_hooks
from glassgpt.inspect.metrics import loss
from glassgpt.inspect.paths import FINAL, MLP, Head, Receiver, path_patch, path_patch_heads

VARIANTS = [
    {},
    {"positional": "rope"},
    {"norm_placement": "post"},
    {"attn_only": True, "tie_embeddings": False},
    {"positional": "none", "norm": "rmsnorm", "mlp": "swiglu"},
]


def setup(tiny, variant=None, T=5, seed=0):
    config = tiny.config(n_layers=3, **(variant or {}))
    model = tiny.model(config, seed=seed)
    clean = tiny.tokens(config, 2, T, seed=seed + 1)
    corrupted = clean.clone()
    corrupted[0, 1] = (clean[0, 1] + 1) % config.n_vocab
    corrupted[1, T - 2] = (clean[1, T - 2] + 2) % config.n_vocab
    return model, clean, corrupted, loss(corrupted)


def corrupted_run(model, m, corrupted):
    with torch.no_grad():
        return m(model(corrupted))


@pytest.mark.parametrize("sender", [Head(0, 1), MLP(1), Head(2, 0)])
def test_no_receivers_is_the_corrupted_run(tiny, sender):
    model, clean, corrupted, m = setup(tiny)
    got = path_patch(model, clean, corrupted, m, sender, [])
    assert abs(float(got - corrupted_run(model, m, corrupted))) <= 1e-12


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(variant=st.sampled_from(VARIANTS), seed=st.integers(0, 3))
def test_to_final_from_the_last_layer_is_activation_patching_its_output(tiny, variant, seed):
    model, clean, corrupted, m = setup(tiny, variant, seed=seed)
    _, cache = run_with_cache(model, clean, ["attn.z"])
    acts = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, m)
    paths = path_patch_heads(model, clean, corrupted, m, [FINAL])
    last = model.config.n_layers - 1
    assert float((paths[last] - acts[last]).abs().max()) <= 1e-12
    assert float((acts[last] - corrupted_run(model, m, corrupted)).abs().max()) > 1e-6


def delta_z(model, clean, corrupted, layer, head):
    """(z_clean − z_corrupted)[:, :, head] W_O[head]: the sender's change of output [B, T, d]."""
    _, a = run_with_cache(model, clean, ["attn.z"])
    _, b = run_with_cache(model, corrupted, ["attn.z"])
    dz = (a["z", layer] - b["z", layer])[:, :, head]  # [B, T, d_head]
    return dz @ model.blocks[layer].attn.W_O[head].detach()


@pytest.mark.parametrize("variant", [{"attn_only": True}, {}])
def test_to_final_is_the_direct_path_when_everything_else_is_frozen(tiny, variant):
    model, clean, corrupted, m = setup(tiny, variant)
    L = model.config.n_layers
    delta = delta_z(model, clean, corrupted, 0, 2)

    def add(t, _):
        return t + delta

    want = m(run_with_hooks(model, corrupted, {f"blocks.{L - 1}.resid_post": add}))
    got = path_patch(model, clean, corrupted, m, Head(0, 2), [FINAL], freeze_mlps=True)
    assert abs(float(got - want)) <= 1e-12
    if not model.config.attn_only:  # MLPs recomputed (the default) carry more than that
        free = path_patch(model, clean, corrupted, m, Head(0, 2), [FINAL])
        assert abs(float(free - want)) > 1e-6


@pytest.mark.parametrize("input", ["q", "k", "v"])
def test_to_a_head_input_is_that_input_recomputed_from_the_patched_residual(tiny, input):
    model, clean, corrupted, m = setup(tiny, {"attn_only": True})
    delta = delta_z(model, clean, corrupted, 0, 1)
    _, cache = run_with_cache(model, corrupted, ["resid_pre"])
    attn = model.blocks[2].attn
    x = model.blocks[2].ln1(cache["resid_pre", 2] + delta)  # what head 0 of layer 2 would read
    W, b = attn.qkv_weight(input.upper()), attn.qkv_bias(input.upper())
    new = x @ W[0].detach() + b[0].detach()  # [B, T, d_head]

    def put(t, _):
        out = t.clone()
        out[:, :, 0] = new
        return out

    want = m(run_with_hooks(model, corrupted, {f"blocks.2.attn.{input}": put}))
    got = path_patch(model, clean, corrupted, m, Head(0, 1), [Receiver(2, 0, input)])
    assert abs(float(got - want)) <= 1e-12
    before = path_patch(model, clean, corrupted, m, Head(2, 1), [Receiver(2, 0, input)])
    assert abs(float(before - corrupted_run(model, m, corrupted))) <= 1e-12  # same layer: no path


def test_the_sweep_equals_single_calls_in_any_batches(tiny):
    model, clean, corrupted, m = setup(tiny, {"positional": "rope"})
    receivers = [Receiver(2, 0, "q"), Receiver(1, 2, "v"), FINAL]
    one = path_patch_heads(model, clean, corrupted, m, receivers)
    assert one.shape == (3, 3)
    for size in (1, 4):
        split = path_patch_heads(model, clean, corrupted, m, receivers, batch_size=size)
        assert float((split - one).abs().max()) <= 1e-12
    for layer, head in [(0, 0), (1, 2), (2, 1)]:
        single = path_patch(model, clean, corrupted, m, Head(layer, head), receivers)
        assert abs(float(single - one[layer, head])) <= 1e-12


def test_bad_input_raises_one_line_naming_the_value(tiny):
    model, clean, corrupted, m = setup(tiny, {"attn_only": True})
    cases = [
        (
            lambda: path_patch(model, clean, corrupted[:, :4], m, Head(0, 0), [FINAL]),
            "5 tokens and the corrupted one 4",
        ),
        (lambda: path_patch(model, clean, corrupted, m, Head(0, 3), [FINAL]), "head 3"),
        (lambda: path_patch(model, clean, corrupted, m, Head(7, 0), [FINAL]), "layer 7"),
        (
            lambda: path_patch(model, clean, corrupted, m, Head(0, 0), [Receiver(1, 0, "x")]),
            "'x'",
        ),
        (lambda: path_patch(model, clean, corrupted, m, MLP(0), [FINAL]), "attention-only"),
        (lambda: path_patch(model, clean, corrupted, m, (0, 1), [FINAL]), "(0, 1)"),
    ]
    for call, words in cases:
        with pytest.raises(GlassError) as err:
            call()
        assert words in str(err.value) and "\n" not in str(err.value)
