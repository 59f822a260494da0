"""GPT (float64) against the NumPy reference, for every combination of the variants."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from glassgpt.model import reference
from glassgpt.model.config import MLPS, NORMS, PLACEMENTS, POSITIONALS

from .helpers import numpy_weights, random_model, random_tokens, tiny_config

COMBOS = list(itertools.product(POSITIONALS, NORMS, PLACEMENTS, MLPS, (True, False), (True, False)))


@pytest.mark.parametrize(("positional", "norm", "placement", "mlp", "tie", "bias"), COMBOS)
def test_logits_match_reference(
    positional: str, norm: str, placement: str, mlp: str, tie: bool, bias: bool
) -> None:
    cfg = tiny_config(
        positional=positional,
        norm=norm,
        norm_placement=placement,
        mlp=mlp,
        tie_embeddings=tie,
        bias=bias,
    )
    model = random_model(cfg, seed=len(COMBOS))
    tokens = random_tokens(cfg, batch=2, length=cfg.n_ctx)
    with torch.no_grad():
        logits = model(tokens).numpy()
    expected = reference.forward(cfg, numpy_weights(model), tokens.numpy())
    assert logits.shape == expected.shape == (2, cfg.n_ctx, cfg.n_vocab)
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-9)
    # The logits are O(1), so an absolute tolerance of 1e-9 is a real check.
    assert np.abs(expected).max() > 0.1


@pytest.mark.parametrize(
    ("gate", "value"), [("sigmoid", "sigmoid"), ("relu", "tanh"), ("gelu_tanh", "silu")]
)
def test_general_gated_mlp_matches_reference(gate: str, value: str) -> None:
    cfg = tiny_config(mlp="gated", mlp_gate=gate, mlp_value=value)
    model = random_model(cfg, seed=3)
    tokens = random_tokens(cfg, batch=1, length=5)
    with torch.no_grad():
        logits = model(tokens).numpy()
    np.testing.assert_allclose(
        logits, reference.forward(cfg, numpy_weights(model), tokens.numpy()), rtol=0, atol=1e-9
    )


def test_reference_accepts_one_dimensional_tokens() -> None:
    cfg = tiny_config()
    model = random_model(cfg)
    tokens = random_tokens(cfg, batch=1, length=6)
    w = numpy_weights(model)
    np.testing.assert_array_equal(
        reference.forward(cfg, w, tokens[0].numpy()), reference.forward(cfg, w, tokens.numpy())[0]
    )


def test_uneven_d_head_and_odd_lengths_match_reference() -> None:
    cfg = tiny_config(d_model=9, n_heads=2, d_head=4, n_layers=1, positional="rope")
    model = random_model(cfg, seed=5)
    for length in (1, 3, 7):
        tokens = random_tokens(cfg, batch=1, length=length, seed=length)
        with torch.no_grad():
            logits = model(tokens).numpy()
        np.testing.assert_allclose(
            logits, reference.forward(cfg, numpy_weights(model), tokens.numpy()), atol=1e-9, rtol=0
        )


def test_loss_matches_reference_cross_entropy() -> None:
    cfg = tiny_config()
    model = random_model(cfg, seed=2)
    tokens = random_tokens(cfg, batch=3, length=6)
    targets = random_tokens(cfg, batch=3, length=6, seed=9)
    targets[0, :2] = -1
    targets[2, 5] = -1
    with torch.no_grad():
        logits, loss = model(tokens, targets=targets)
    expected = reference.cross_entropy(
        reference.forward(cfg, numpy_weights(model), tokens.numpy()), targets.numpy()
    )
    assert abs(loss.item() - expected) < 1e-9
    # Ignored targets change nothing: the same loss from the kept positions alone.
    keep = targets != -1
    direct = torch.nn.functional.cross_entropy(logits[keep], targets[keep])
    assert abs(direct.item() - expected) < 1e-9


def test_reference_is_independent_of_torch() -> None:
    """The oracle imports neither torch nor the model it checks (read from its source: the
    package ``glassgpt.model`` itself imports the model)."""
    import ast

    import glassgpt.model.reference as reference

    tree = ast.parse(Path(reference.__file__).read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "numpy" in names
    assert not [n for n in names if n.startswith(("torch", "glassgpt"))], names
