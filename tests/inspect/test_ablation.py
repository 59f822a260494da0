"""Ablations against independent oracles: edited weights, a NumPy forward pass, hand-made hooks."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.inspect.ablation import ablation_hooks, run_ablated
from glassgpt.inspect.cache import patch_hook, run_with_cache, run_with_hooks
from glassgpt.model import reference as ref


def plain(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


def edited(model, edit) -> object:
    """A copy of ``model`` whose parameters ``edit(copy)`` changed in place."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        edit(other)
    return other


# -- ablating nothing ------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["zero", "mean", "resample"])
def test_ablating_nothing_is_bit_identical(how: str, tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, dtype=torch.float32)
    tokens = tiny.tokens(cfg, 3, 7)
    other = tiny.tokens(cfg, 3, 7, seed=5)
    everything = {
        "heads": [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)],
        "mlps": list(range(cfg.n_layers)),
    }
    assert ablation_hooks(model, how=how, reference=other) == {}
    assert ablation_hooks(model, how=how, reference=other, keep=True, **everything) == {}
    want = plain(model, tokens)
    assert torch.equal(run_ablated(model, tokens, how=how, reference=other), want)
    assert torch.equal(
        run_ablated(model, tokens, how=how, reference=other, keep=True, **everything), want
    )


# -- zero ablation = edited weights ----------------------------------------------------------
@pytest.mark.parametrize("variant", [{}, {"positional": "rope", "norm": "rmsnorm"}])
def test_zero_head_equals_zeroing_its_output_weights(variant: dict, tiny: SimpleNamespace) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=3)
    tokens = tiny.tokens(cfg, 2, cfg.n_ctx)
    heads = [(0, 1), (1, 0), (1, 2)]
    got = run_ablated(model, tokens, heads=heads)

    def no_W_O(m) -> None:  # z_h W_O[h] = 0; b_O (shared by the heads) stays
        for l, h in heads:
            m.blocks[l].attn.W_O[h] = 0.0

    def no_values(m) -> None:  # v_h = 0 ⇒ z_h = pattern v_h = 0
        for l, h in heads:
            m.blocks[l].attn.W_V[h] = 0.0
            m.blocks[l].attn.b_V[h] = 0.0

    assert not torch.allclose(got, plain(model, tokens))
    with model.hooks(ablation_hooks(model, heads=heads)):  # the hooks work on the model itself
        assert torch.equal(plain(model, tokens), got)
    for edit in (no_W_O, no_values):
        torch.testing.assert_close(got, plain(edited(model, edit), tokens), rtol=0, atol=1e-12)


def test_zero_neurons_and_mlps_equal_zeroing_their_weights(tiny: SimpleNamespace) -> None:
    cfg = tiny.config(mlp="swiglu")
    model = tiny.model(cfg, seed=4)
    tokens = tiny.tokens(cfg, 2, 6)
    neurons = [(0, 3), (0, 7), (1, 15)]

    def no_rows(m) -> None:  # neuron i is read by row i of W_out [d_mlp, d_model]
        for l, i in neurons:
            m.blocks[l].mlp.W_out[i] = 0.0

    got = run_ablated(model, tokens, neurons=neurons)
    torch.testing.assert_close(got, plain(edited(model, no_rows), tokens), rtol=0, atol=1e-12)

    def no_mlp(m) -> None:
        m.blocks[1].mlp.W_out.zero_()
        m.blocks[1].mlp.b_out.zero_()

    got = run_ablated(model, tokens, mlps=[1])
    torch.testing.assert_close(got, plain(edited(model, no_mlp), tokens), rtol=0, atol=1e-12)


# -- mean ablation against NumPy -------------------------------------------------------------
def numpy_forward(cfg, w, tokens: np.ndarray, replace=None, record=None) -> np.ndarray:
    """Logits [B, T, V] in float64, heads looped; ``replace[(l, h)](z [B, T, d_head])`` gives
    the head's new z, ``record[(l, h)]`` receives the head's (unreplaced) z."""
    T = tokens.shape[1]
    x = np.stack([ref.one_hot(row, cfg.n_vocab) for row in tokens]) @ w["embed.W_E"]
    x = x + w["pos_embed.W_P"][:T]
    M = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(cfg.n_layers):
        p = f"blocks.{l}"
        u = ref.norm(cfg, w, f"{p}.ln1", x)
        out = np.zeros_like(x) + w[f"{p}.attn.b_O"]
        for h in range(cfg.n_heads):
            q, k, v = (u @ w[f"{p}.attn.W_{c}"][h] + w[f"{p}.attn.b_{c}"][h] for c in "QKV")
            A = ref.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(cfg.d_head) + M)
            z = A @ v  # [B, T, d_head]
            if record is not None:
                record[(l, h)] = z
            if replace and (l, h) in replace:
                z = replace[(l, h)](z)
            out = out + z @ w[f"{p}.attn.W_O"][h]
        x = x + out
        x = x + ref.mlp(cfg, w, f"{p}.mlp", ref.norm(cfg, w, f"{p}.ln2", x))
    x = ref.norm(cfg, w, "ln_final", x)
    return x @ w["embed.W_E"].T + w["unembed.b_U"]


@pytest.mark.parametrize("mean_over", ["batch_pos", "batch"])
def test_mean_ablation_with_the_batch_own_mean_matches_numpy(
    mean_over: str, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=5)
    tokens = tiny.tokens(cfg, 4, 6)
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    toks = tokens.numpy()
    z: dict = {}
    np.testing.assert_allclose(numpy_forward(cfg, w, toks, record=z), plain(model, tokens))
    axes = (0, 1) if mean_over == "batch_pos" else (0,)
    heads = [(0, 2), (1, 1)]
    means = {lh: z[lh].mean(axis=axes) for lh in heads}
    replace = {lh: (lambda zz, lh=lh: np.broadcast_to(means[lh], zz.shape)) for lh in heads}
    want = numpy_forward(cfg, w, toks, replace=replace)
    got = run_ablated(model, tokens, heads=heads, how="mean", mean_over=mean_over)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-10)
    assert not np.allclose(want, numpy_forward(cfg, w, toks), atol=1e-3)


def test_mean_over_a_dataset_of_batches_of_unequal_lengths(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=6)
    tokens = tiny.tokens(cfg, 2, 5)
    data = [tiny.tokens(cfg, 3, 8, seed=7), tiny.tokens(cfg, 2, 5, seed=8)]
    caches = [run_with_cache(model, b, ["blocks.1.mlp_out", "blocks.0.mlp.post"])[1] for b in data]
    for over in ("batch_pos", "batch"):
        if over == "batch_pos":  # every (prompt, position) of both batches, one vector
            mlp = torch.cat([c["blocks.1.mlp_out"].flatten(0, 1) for c in caches]).mean(0)
            post = torch.cat([c["blocks.0.mlp.post"].flatten(0, 1) for c in caches]).mean(0)
        else:  # positions 0..4 are seen by all 5 prompts (the run is 5 long)
            mlp = torch.cat([c["blocks.1.mlp_out"][:, :5] for c in caches]).mean(0)
            post = torch.cat([c["blocks.0.mlp.post"][:, :5] for c in caches]).mean(0)
        post_src = post.expand(2, 5, -1).clone()
        hooks = {
            "blocks.1.mlp_out": patch_hook(mlp.expand(2, 5, -1).clone()),
            "blocks.0.mlp.post": patch_hook(post_src, (..., [1, 4])),
        }
        want = run_with_hooks(model, tokens, hooks)
        got = run_ablated(
            model, tokens, mlps=[1], neurons=[(0, 1), (0, 4)], how="mean", reference=iter(data),
            mean_over=over,
        )  # fmt: skip
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_mean_ablation_rounds_once_to_the_model_dtype(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=2, dtype=torch.float32)
    tokens = tiny.tokens(cfg, 3, 6)
    got = run_ablated(model, tokens, heads=[(1, 0)], how="mean")
    assert got.dtype == torch.float32
    z = run_with_cache(model, tokens, ["blocks.1.attn.z"])[1]["blocks.1.attn.z"]
    mean = z.double().mean((0, 1)).float().expand_as(z).clone()
    want = run_with_hooks(
        model, tokens, {"blocks.1.attn.z": patch_hook(mean, (slice(None), slice(None), 0))}
    )
    assert torch.equal(got, want)


# -- resample ablation -----------------------------------------------------------------------
def test_resample_from_the_same_prompt_changes_nothing(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, dtype=torch.float32)
    tokens = tiny.tokens(cfg, 3, 7)
    heads = [(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    got = run_ablated(
        model, tokens, heads=heads, mlps=[0, 1], neurons=[(0, 2)], how="resample", reference=tokens
    )
    assert torch.equal(got, plain(model, tokens))


def test_resample_puts_in_the_reference_rows_activation(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=9)
    tokens, other = tiny.tokens(cfg, 3, 6), tiny.tokens(cfg, 4, 8, seed=3)
    z = run_with_cache(model, other, ["blocks.0.attn.z"])[1]["blocks.0.attn.z"]  # [4, 8, H, dh]
    permutation = torch.randperm(4, generator=torch.Generator().manual_seed(5))
    cases = [  # (reference, shuffle, the reference row each run row receives)
        (other[:3], False, [0, 1, 2]),  # row-matched
        (other[:1], False, [0, 0, 0]),  # one prompt for every row
        (other, True, permutation[:3].tolist()),  # a seeded permutation of the 4 rows
    ]
    for reference, shuffle, rows in cases:
        src = z[rows, :6]  # the first 6 positions of the 8-token reference (causal)
        want = run_with_hooks(
            model, tokens, {"blocks.0.attn.z": patch_hook(src, (slice(None), slice(None), 1))}
        )
        got = run_ablated(
            model, tokens, heads=[(0, 1)], how="resample", reference=reference,
            shuffle=shuffle, seed=5,
        )  # fmt: skip
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# -- keep: the circuit is what is listed ----------------------------------------------------
def test_keep_ablates_exactly_the_complement(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=12)
    tokens = tiny.tokens(cfg, 2, 6)
    kept = [(0, 0), (1, 2)]
    complement = [(l, h) for l in range(2) for h in range(3) if (l, h) not in kept]
    neurons_kept = [(1, 0), (1, 5)]
    neurons_rest = [(1, i) for i in range(cfg.d_mlp) if i not in (0, 5)]
    for how in ("zero", "mean"):
        got = run_ablated(model, tokens, heads=kept, neurons=neurons_kept, keep=True, how=how)
        want = run_ablated(model, tokens, heads=complement, mlps=[0], neurons=neurons_rest, how=how)
        assert torch.equal(got, want)


def test_keep_every_head_of_an_attention_only_model_changes_nothing(tiny: SimpleNamespace) -> None:
    cfg = tiny.config(attn_only=True)
    model = tiny.model(cfg)
    tokens = tiny.tokens(cfg, 2, 6)
    heads = [(l, h) for l in range(2) for h in range(3)]
    assert torch.equal(run_ablated(model, tokens, heads=heads, keep=True), plain(model, tokens))
    one_missing = run_ablated(model, tokens, heads=heads[1:], keep=True)
    torch.testing.assert_close(one_missing, run_ablated(model, tokens, heads=heads[:1]))


# -- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"heads": [(2, 0)]}, "layer 2 is out of range"),
        ({"heads": [(0, 3)]}, "head 3 is out of range"),
        ({"heads": [(0,)]}, "must be a pair"),
        ({"mlps": [-1]}, "MLP layer -1 is out of range"),
        ({"neurons": [(1, 16)]}, "neuron 16 is out of range"),
        ({"heads": [(0, 1.5)]}, "1.5 is not an integer"),
        ({"heads": [(0, 0)], "how": "noise"}, "unknown ablation 'noise'"),
        ({"heads": [(0, 0)], "how": "mean", "mean_over": "pos"}, "unknown mean_over 'pos'"),
        ({"heads": [(0, 0)], "how": "resample"}, "needs reference tokens"),
        ({"head": [(0, 0)]}, "unknown ablation option 'head'"),
    ],
)
def test_bad_input_raises_one_line(kwargs: dict, message: str, tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg)
    with pytest.raises(GlassError, match=message):
        run_ablated(model, tiny.tokens(cfg, 1, 4), **kwargs)


def test_bad_references_and_attention_only_raise(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg)
    tokens = tiny.tokens(cfg, 2, 6)
    with pytest.raises(GlassError, match="reference has 4 positions, the run 6"):
        run_ablated(model, tokens, heads=[(0, 0)], how="resample", reference=tokens[:, :4])
    with pytest.raises(GlassError, match="reference has 3 prompts, the run 2"):
        run_ablated(model, tokens, mlps=[0], how="resample", reference=tiny.tokens(cfg, 3, 6))
    with pytest.raises(GlassError, match="reference has 4 positions, the run 6"):
        run_ablated(model, tokens, mlps=[0], how="mean", mean_over="batch", reference=tokens[:, :4])
    with pytest.raises(GlassError, match="needs reference tokens"):
        ablation_hooks(model, heads=[(0, 0)], how="mean")
    with pytest.raises(GlassError, match="one reference batch"):
        run_ablated(model, tokens, heads=[(0, 0)], how="resample", reference=[tokens, tokens])
    attn_only = tiny.model(tiny.config(attn_only=True))
    with pytest.raises(GlassError, match="cannot ablate MLP 1: the model is attention-only"):
        ablation_hooks(attn_only, mlps=[1])
    with pytest.raises(GlassError, match=r"cannot ablate neuron \(0, 2\)"):
        ablation_hooks(attn_only, neurons=[(0, 2)])
