"""Attention-only blocks (``attn_only=True``): x_out = x_mid, no ln2 and no MLP weights."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from glassgpt.model import reference
from glassgpt.model.config import NORMS, PLACEMENTS, POSITIONALS

from .helpers import numpy_weights, random_model, random_tokens, tiny_config

GRID = list(itertools.product(POSITIONALS, NORMS, PLACEMENTS, (True, False), (True, False)))


@pytest.mark.parametrize(("positional", "norm", "placement", "tie", "bias"), GRID)
def test_attn_only_matches_reference(
    positional: str, norm: str, placement: str, tie: bool, bias: bool
) -> None:
    cfg = tiny_config(
        positional=positional,
        norm=norm,
        norm_placement=placement,
        tie_embeddings=tie,
        bias=bias,
        attn_only=True,
    )
    model = random_model(cfg, seed=7)
    tokens = random_tokens(cfg, batch=2, length=cfg.n_ctx)
    with torch.no_grad():
        logits = model(tokens).numpy()
    expected = reference.forward(cfg, numpy_weights(model), tokens.numpy())
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-9)
    assert np.abs(expected).max() > 0.1


def test_attn_only_has_no_mlp_weights_or_activations() -> None:
    full, attn = tiny_config(), tiny_config(attn_only=True)
    keys = set(random_model(attn).state_dict())
    dropped = set(random_model(full).state_dict()) - keys
    assert dropped and all(".ln2." in k or ".mlp." in k for k in dropped)
    assert not any(".ln2." in k or ".mlp." in k for k in keys)
    names = random_model(attn).hook_names()
    assert "blocks.0.resid_mid" in names and "blocks.1.resid_post" in names
    assert not any(".mlp" in n or ".ln2." in n for n in names)


def test_attn_only_resid_post_equals_resid_mid() -> None:
    cfg = tiny_config(attn_only=True)
    model = random_model(cfg, seed=3)
    seen: dict[str, torch.Tensor] = {}
    keep = {
        n: (lambda t, n: seen.__setitem__(n, t))
        for n in ("blocks.1.resid_mid", "blocks.1.resid_post")
    }
    with torch.no_grad(), model.hooks(keep):
        model(random_tokens(cfg, batch=1, length=5))
    assert torch.equal(seen["blocks.1.resid_mid"], seen["blocks.1.resid_post"])
