"""Head scores on patterns with a known answer, and on a model whose heads are set by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.inspect import head_scores, repeated_random_tokens
from glassgpt.inspect.heads import pattern_scores


def one_hot_pattern(T: int, offset: int) -> torch.Tensor:
    """Each query i attends entirely to key i − offset (or to key 0 when that is before 0)."""
    p = torch.zeros(T, T)
    for i in range(T):
        p[i, max(i - offset, 0)] = 1.0
    return p


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (1, {"previous_token": 1.0, "duplicate_token": 0.0, "induction": 0.0}),
        (6, {"previous_token": 1 / 11, "duplicate_token": 1.0, "induction": 0.0}),
        (5, {"previous_token": 1 / 11, "duplicate_token": 0.0, "induction": 1.0}),
    ],
)
def test_scores_of_exact_mechanisms(offset: int, expected: dict) -> None:
    """n = 6: previous token is offset 1, duplicate offset n, induction offset n − 1.

    Queries i < offset sit on key 0, which counts for the previous-token score only at i = 1.
    """
    scores = pattern_scores(one_hot_pattern(12, offset), 6)
    for name, value in expected.items():
        assert abs(float(scores[name]) - value) < 1e-6, name


def test_uniform_attention_scores_the_mean_of_one_over_position() -> None:
    T, n = 10, 5
    p = torch.tril(torch.ones(T, T))
    p = p / p.sum(-1, keepdim=True)
    s = pattern_scores(p, n)
    assert abs(float(s["previous_token"]) - sum(1 / (i + 1) for i in range(1, T)) / (T - 1)) < 1e-6
    assert abs(float(s["induction"]) - sum(1 / (i + 1) for i in range(n, T)) / n) < 1e-6


def test_repeated_random_tokens() -> None:
    t = repeated_random_tokens(40, 12, batch=5, seed=3)
    assert t.shape == (5, 24)
    assert torch.equal(t[:, :12], t[:, 12:])
    assert all(len(set(row[:12].tolist())) == 12 for row in t)  # distinct: n ≤ n_vocab
    assert torch.equal(t, repeated_random_tokens(40, 12, batch=5, seed=3))
    assert not torch.equal(t, repeated_random_tokens(40, 12, batch=5, seed=4))
    low = repeated_random_tokens(10, 30, batch=2, low=3)  # more tokens than ids: with repeats
    assert low.min() >= 3 and low.max() < 10


def test_a_hand_set_previous_token_head_is_found(tiny: SimpleNamespace) -> None:
    """Head 1 of layer 0 attends to the previous position through learned positions alone."""
    cfg = tiny.config(n_vocab=40, n_ctx=16, d_model=32, n_heads=2, positional="learned")
    model = tiny.model(cfg, seed=0, dtype=torch.float32)
    with torch.no_grad():
        model.embed.W_E.zero_()  # the residual holds positions only
        P = torch.eye(16, 32) * 10.0  # position p → basis vector p
        model.pos_embed.W_P.copy_(P)
        attn = model.blocks[0].attn
        attn.b_Q.zero_()
        attn.b_K.zero_()
        attn.W_Q[1].zero_()
        attn.W_K[1].zero_()
        # LayerNorm centres and scales the one-hot positions: ln1(e_p) ∝ e_p − 1/32. The query
        # of position p points at basis p − 1 of the keys: q_p · k_j large iff j = p − 1.
        for p in range(1, 16):
            attn.W_Q[1, p, p - 1] = 8.0
            attn.W_K[1, p - 1, p - 1] = 8.0
        model.blocks[0].ln1.w.fill_(1.0)
        model.blocks[0].ln1.b.zero_()
    s = head_scores(model, seq_len=8, batch=4)
    assert s.previous_token[0, 1] > 0.99
    assert s.best("previous_token")[:2] == (0, 1)
    assert s.induction[0, 1] < 0.01


def test_bad_head_score_inputs_raise(tiny: SimpleNamespace) -> None:
    model = tiny.model(tiny.config())
    with pytest.raises(GlassError, match="longer than the context n_ctx=8"):
        head_scores(model, seq_len=5)
    with pytest.raises(GlassError, match="first half repeated"):
        head_scores(model, tokens=torch.tensor([[1, 2, 3, 4]]))
    with pytest.raises(GlassError, match="unknown head score"):
        head_scores(model, seq_len=3).best("copying")
