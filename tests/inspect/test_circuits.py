"""Circuits from the weights against the model's own activations on one-hot inputs."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.inspect import (
    FactoredMatrix,
    composition_scores,
    copying_score,
    copying_scores,
    ov_circuit,
    qk_circuit,
    run_with_cache,
)
from glassgpt.model import GPT

VARIANTS = [
    {"positional": "none"},
    {"positional": "learned", "norm": "rmsnorm"},
    {"positional": "sinusoidal", "norm_placement": "post", "tie_embeddings": False},
    {"positional": "rope", "bias": False},
    {"positional": "rope", "norm": "rmsnorm", "norm_placement": "post"},
    {"positional": "learned", "attn_only": True},
]


def run_on_embeddings(model: GPT, tokens: torch.Tensor, layer: int, names: str) -> dict:
    """Cache of ``names`` with the residual stream entering ``layer`` = X W_E exactly."""
    hooks = {}
    if layer == 0:
        if model.pos_embed is not None:
            hooks["pos_embed"] = lambda t, name: torch.zeros_like(t)
    else:
        embedded = model.embed.W_E.detach()[tokens]
        hooks[f"blocks.{layer}.resid_pre"] = lambda t, name: embedded
    _, cache = run_with_cache(model, tokens, names, hooks=hooks)
    return cache


@pytest.mark.parametrize(("variant", "layer"), list(itertools.product(VARIANTS, (0, 1))))
def test_qk_circuit_equals_attention_scores_on_one_hot_pairs(
    variant: dict, layer: int, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=3)
    V = cfg.n_vocab
    a, b = torch.meshgrid(torch.arange(V), torch.arange(V), indexing="ij")
    pairs = torch.stack([b.flatten(), a.flatten()], 1)  # sequence [key b, query a]
    cache = run_on_embeddings(model, pairs, layer, f"blocks.{layer}.attn.attn_scores")
    scores = cache["attn_scores", layer][:, :, 1, 0].reshape(V, V, -1)  # [a, b, H]
    qk = qk_circuit(model, layer, distance=1)  # query a at position 1, key b at position 0
    full = qk.full()  # [H, V, V]
    assert full.shape == (cfg.n_heads, V, V)
    torch.testing.assert_close(full, scores.permute(2, 0, 1), rtol=0, atol=1e-10)
    for h in range(cfg.n_heads):
        torch.testing.assert_close(qk_circuit(model, layer, h, distance=1).full(), full[h])


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v["positional"] != "rope"][1:3])
def test_positional_qk_circuit_equals_scores_without_tokens(
    variant: dict, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=4)
    tokens = tiny.tokens(cfg, 1, cfg.n_ctx)
    _, cache = run_with_cache(
        model, tokens, "blocks.0.attn.attn_scores", hooks={"embed": lambda t, n: 0 * t}
    )
    scores = cache["attn_scores", 0][0]  # [H, T, T]
    qk = qk_circuit(model, 0, query="position", key="position").full()
    causal = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).tril()
    torch.testing.assert_close(qk[:, causal], scores[:, causal], rtol=0, atol=1e-10)


@pytest.mark.parametrize(("variant", "layer"), list(itertools.product(VARIANTS, (0, 1))))
def test_ov_circuit_equals_head_output_unembedded_on_one_hot_tokens(
    variant: dict, layer: int, tiny: SimpleNamespace
) -> None:
    cfg = tiny.config(**variant)
    model = tiny.model(cfg, seed=5)
    tokens = torch.arange(cfg.n_vocab)[:, None]  # one token per sequence: attention on it is 1
    cache = run_on_embeddings(model, tokens, layer, f"blocks.{layer}.attn.result")
    r = cache["result", layer][:, 0]  # [V, H, d_model] = (Ê W_V + b_V) W_O per head
    W_U = model.W_U.detach()
    raw = torch.einsum("vhd,dw->hvw", r, W_U)
    torch.testing.assert_close(ov_circuit(model, layer, fold_final_norm=False).full(), raw)
    ln = model.ln_final
    if ln is None:  # post-norm: nothing to fold
        folded = raw
    elif ln.kind == "layernorm":  # (r − mean r) ⊙ w_f, then W_U
        folded = torch.einsum("vhd,dw->hvw", (r - r.mean(-1, keepdim=True)) * ln.w, W_U)
    else:
        folded = torch.einsum("vhd,dw->hvw", r * ln.w, W_U)
    ov = ov_circuit(model, layer)
    torch.testing.assert_close(ov.full(), folded, rtol=0, atol=1e-10)
    torch.testing.assert_close(ov_circuit(model, layer, 2).full(), folded[2], rtol=0, atol=1e-10)


def test_copying_scores_equal_dense_eigenvalues(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config(), seed=6)
    scores = copying_scores(model)
    assert scores.shape == (2, 3)
    for layer, h in itertools.product(range(2), range(3)):
        lam = np.linalg.eigvals(ov_circuit(model, layer, h).full().numpy())
        want = lam.sum().real / np.abs(lam).sum()
        assert abs(float(scores[layer, h]) - want) < 1e-9


def test_copying_score_is_plus_one_for_copying_and_minus_one_for_suppression() -> None:
    A = torch.randn(9, 3, dtype=torch.float64)
    assert abs(float(copying_score(FactoredMatrix(A, A.T))) - 1.0) < 1e-12
    assert abs(float(copying_score(FactoredMatrix(-A, A.T))) + 1.0) < 1e-12


def _folded(model: GPT, layer: int, name: str) -> torch.Tensor:
    """C diag(w) W for pre-norm layernorm, written with explicit matrices."""
    block = model.blocks[layer]
    W = getattr(block.attn, name).detach()  # [H, D, dh]
    D = W.shape[1]
    C = torch.eye(D, dtype=W.dtype) - torch.full((D, D), 1.0 / D, dtype=W.dtype)
    return C @ torch.diag(block.ln1.w.detach()) @ W


@pytest.mark.parametrize("kind", ["q", "k", "v"])
def test_composition_scores_equal_dense_products(kind: str, tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config(n_layers=3), seed=7)
    scores = composition_scores(model, kind)
    assert scores.shape == (3, 3, 3, 3)
    norm = torch.linalg.matrix_norm
    for l1, l2 in itertools.product(range(3), range(3)):
        if l2 <= l1:
            assert scores[l1, :, l2].isnan().all()
            continue
        Wv1, Wo1 = _folded(model, l1, "W_V"), model.blocks[l1].attn.W_O.detach()
        Wq2, Wk2 = _folded(model, l2, "W_Q"), _folded(model, l2, "W_K")
        Wv2, Wo2 = _folded(model, l2, "W_V"), model.blocks[l2].attn.W_O.detach()
        for h1, h2 in itertools.product(range(3), range(3)):
            ov1 = Wv1[h1] @ Wo1[h1]
            qk2 = Wq2[h2] @ Wk2[h2].T
            ov2 = Wv2[h2] @ Wo2[h2]
            want = {
                "q": norm(ov1 @ qk2) / (norm(ov1) * norm(qk2)),
                "k": norm(qk2 @ ov1.T) / (norm(ov1) * norm(qk2)),
                "v": norm(ov1 @ ov2) / (norm(ov1) * norm(ov2)),
            }[kind]
            assert abs(float(scores[l1, h1, l2, h2]) - float(want)) < 1e-10


def test_factored_matrix_answers_equal_the_dense_matrix() -> None:
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(4, 23, 3, generator=gen, dtype=torch.float64)
    B = torch.randn(4, 3, 23, generator=gen, dtype=torch.float64)
    M, dense = FactoredMatrix(A, B), A @ B
    torch.testing.assert_close(M.full(), dense)
    torch.testing.assert_close(M.rows([3, 0]), dense[:, [3, 0]])
    torch.testing.assert_close(M.cols([5]), dense[:, :, [5]])
    torch.testing.assert_close(M.block([1, 2], [7, 8, 9]), dense[:, [1, 2]][:, :, [7, 8, 9]])
    torch.testing.assert_close(M.norm(), torch.linalg.matrix_norm(dense))
    torch.testing.assert_close(M.T.full(), dense.transpose(-1, -2))
    torch.testing.assert_close(M[2].full(), dense[2])
    X = torch.randn(23, 5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close((M @ X).full(), dense @ X)
    torch.testing.assert_close(M.singular_values(), torch.linalg.svdvals(dense)[:, :3])
    lam = M.eigenvalues()  # the 3 non-zero eigenvalues of each 23 × 23 matrix
    for i in range(4):
        dense_lam = np.linalg.eigvals(dense[i].numpy())
        top = sorted(dense_lam, key=abs)[-3:]
        np.testing.assert_allclose(
            np.sort_complex(np.array(top)), np.sort_complex(lam[i].numpy()), atol=1e-9
        )


@pytest.mark.parametrize("largest", [True, False])
def test_top_pairs_scan_in_blocks_equals_dense_top_k(largest: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    A = torch.randn(37, 4, generator=gen, dtype=torch.float64)
    B = torch.randn(4, 29, generator=gen, dtype=torch.float64)
    dense = A @ B
    pairs = FactoredMatrix(A, B).top_pairs(9, largest=largest, block=5)
    values, flat = torch.topk(dense.flatten(), 9, largest=largest)
    assert [(r, c) for r, c, _ in pairs] == [(int(i) // 29, int(i) % 29) for i in flat]
    np.testing.assert_allclose([v for _, _, v in pairs], values.numpy())
    rows = [30, 2, 11]
    sub = FactoredMatrix(A, B).top_pairs(4, rows=rows, block=2)
    _v_sub, f_sub = torch.topk(dense[rows].flatten(), 4)
    assert [(r, c) for r, c, _ in sub] == [(rows[int(i) // 29], int(i) % 29) for i in f_sub]


def test_bad_indices_and_inputs_raise_glass_errors(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config(positional="rope"))
    with pytest.raises(GlassError, match=r"layer 2 is out of range: the model has 2 layers"):
        qk_circuit(model, 2, 0)
    with pytest.raises(GlassError, match=r"head 3 is out of range: each layer has 3 heads"):
        ov_circuit(model, 0, 3)
    with pytest.raises(GlassError, match="position circuits need learned or sinusoidal"):
        qk_circuit(model, 0, 0, query="position", distance=0)
    with pytest.raises(GlassError, match="distance 8 is out of range"):
        qk_circuit(model, 0, 0, distance=8)
    with pytest.raises(GlassError, match="composition kind"):
        composition_scores(model, "x")  # type: ignore[arg-type]
    with pytest.raises(GlassError, match="do not chain"):
        FactoredMatrix(torch.zeros(3, 2), torch.zeros(3, 2))
