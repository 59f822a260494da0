"""Logit lens, direct logit attribution and per-token loss against the model's own logits."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from glassgpt.errors import GlassError
from glassgpt.inspect import direct_logit_attribution, logit_lens, per_token_loss, run_with_cache

PRE_NORM = [
    dict(zip(("norm", "positional", "bias", "tie_embeddings", "attn_only", "mlp"), combo))
    for combo in [
        ("layernorm", "learned", True, True, False, "gelu_tanh"),
        ("layernorm", "rope", False, False, False, "swiglu"),
        ("rmsnorm", "sinusoidal", True, False, False, "relu"),
        ("rmsnorm", "none", False, True, True, "gelu"),
        ("layernorm", "none", True, False, True, "geglu"),
    ]
]


@pytest.mark.parametrize(
    ("variant", "dtype"), list(itertools.product(PRE_NORM, (torch.float32, torch.float64)))
)
def test_attribution_parts_sum_to_the_logits(
    variant: dict, dtype: torch.dtype, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=11, dtype=dtype)
    tokens = tiny.tokens(cfg, 2, cfg.n_ctx)
    with torch.no_grad():
        logits = model(tokens)
    dla = direct_logit_attribution(model, tokens)
    parts = dla.logits()  # [P, B, T, V]
    assert parts.shape == (len(dla.names), 2, cfg.n_ctx, cfg.n_vocab)
    assert (parts.sum(0) - logits).abs().max() <= (1e-5 if dtype == torch.float32 else 1e-12)
    assert logits.abs().max() > 1.0  # the tolerance is small against the logits' size
    heads = [n for n in dla.names if ".attn.h" in n]
    assert len(heads) == cfg.n_layers * cfg.n_heads
    assert ("blocks.0.mlp" in dla.names) != cfg.attn_only
    assert ("pos_embed" in dla.names) == (cfg.positional in ("learned", "sinusoidal"))
    assert ("unembed.b_U" in dla.names) == cfg.bias
    # Selected ids give the same numbers as the full decomposition.
    ids = tiny.tokens(cfg, 2, cfg.n_ctx, seed=5)
    index = ids[None, ..., None].expand(len(parts), -1, -1, 1)  # [P, B, T, 1]
    torch.testing.assert_close(dla.logits(ids), parts.gather(-1, index)[..., 0])
    top3 = logits.topk(3, dim=-1).indices
    torch.testing.assert_close(dla.total(top3), logits.gather(-1, top3), rtol=0, atol=1e-5)


def test_each_head_part_is_that_head_through_the_frozen_final_norm(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=12)
    tokens = tiny.tokens(cfg, 1, 6)
    _, cache = run_with_cache(model, tokens, ["result", "ln_final.scale"])
    dla = direct_logit_attribution(model, tokens)
    r = cache["result", 1][:, :, 2]  # head 2 of layer 1, [B, T, d_model]
    ln = model.ln_final
    want = ((r - r.mean(-1, keepdim=True)) * cache["ln_final.scale"] * ln.w) @ model.W_U
    got = dla.logits()[dla.names.index("blocks.1.attn.h2")]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_attribution_refuses_post_norm_models(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config(norm_placement="post"))
    with pytest.raises(GlassError, match="needs a pre-norm model"):
        direct_logit_attribution(model, [1, 2, 3])


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_logit_lens_ends_at_the_logits_and_starts_at_the_embeddings(
    placement: str, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(norm_placement=placement, tie_embeddings=False)
    model = tiny.model(cfg, seed=13)
    tokens = tiny.tokens(cfg, 2, 7)
    lens = logit_lens(model, tokens)
    assert lens.logits.shape == (cfg.n_layers + 1, 2, 7, cfg.n_vocab)
    assert lens.names == ["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"]
    with torch.no_grad():
        logits = model(tokens)
    torch.testing.assert_close(lens.logits[-1], logits, rtol=0, atol=1e-12)
    x0 = model.embed.W_E[tokens] + model.pos_embed.W_P[:7]
    if placement == "pre":
        x0 = F.layer_norm(x0, (cfg.d_model,), model.ln_final.w, model.ln_final.b, cfg.norm_eps)
    first = x0 @ model.unembed.W_U + model.unembed.b_U
    torch.testing.assert_close(lens.logits[0], first.detach(), rtol=0, atol=1e-12)
    p, ids = lens.top(2)
    assert p.shape == ids.shape == (3, 2, 7, 2)
    assert torch.equal(ids[-1, ..., 0], logits.argmax(-1))


def test_per_token_loss_averages_to_the_model_loss(tiny: SimpleNamespace) -> None:
    cfg = tiny.config()
    model = tiny.model(cfg, seed=14)
    tokens = tiny.tokens(cfg, 3, 8)
    losses = per_token_loss(model, tokens)
    assert losses.shape == (3, 7)
    targets = torch.cat([tokens[:, 1:], torch.full((3, 1), -1)], 1)
    with torch.no_grad():
        _, loss = model(tokens, targets=targets)
    torch.testing.assert_close(losses.mean(), loss, rtol=0, atol=1e-12)
    with pytest.raises(GlassError, match="at least 2 tokens"):
        per_token_loss(model, [4])


def test_inspect_functions_leave_the_model_in_its_mode(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config(dropout=0.5)).train()
    dla = direct_logit_attribution(model, [1, 2, 3])  # eval inside: parts still sum exactly
    with torch.no_grad():
        model.eval()
        logits = model(torch.tensor([[1, 2, 3]]))
        model.train()
    torch.testing.assert_close(dla.total(), logits, rtol=0, atol=1e-12)
    assert model.training
