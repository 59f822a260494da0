"""A two-layer attention-only model learns an induction head, and the induction score finds it.

A real training run (300 AdamW steps, a few seconds on CPU). Each training sequence is random
tokens, then a random segment of 2–8 distinct tokens, then the segment again; the loss is taken
where the repetition makes the next token predictable (inside the second copy). The segment's
length and place vary, so no fixed position or offset predicts it: only the two-layer circuit
does (a previous-token head in layer 0, and a layer-1 head whose keys read it).

Initialisation that makes this quick: token and position embeddings N(0, 1) (the residual
stream starts with well-separated directions; the default 0.02 leaves the run on a plateau for
thousands of steps) and an untied unembedding (a tied one with N(0, 1) embeddings starts from
confidently wrong logits).
"""

from __future__ import annotations

import pytest
import torch

from glassgpt.inspect import head_scores, per_token_loss, repeated_random_tokens, run_with_hooks
from glassgpt.model import GPT
from glassgpt.train.synthetic import train_synthetic

V, T = 32, 16


def train(steps: int, seed: int) -> GPT:
    """The study's toy model (``glassgpt.train.synthetic.train_synthetic``): sequences of
    random tokens, then a segment of 2–8 distinct tokens, then the segment again."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster than several
    try:
        return train_synthetic(steps, seed=seed, n_vocab=V, n_ctx=T)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_training_develops_an_induction_head_that_the_score_finds() -> None:
    untrained = head_scores(train(0, seed=0), seq_len=8)
    assert untrained.induction.max() < 0.4

    model = train(300, seed=0)
    scores = head_scores(model, seq_len=8, seed=123)  # fresh sequences, n = 8
    layer, _, value = scores.best("induction")
    assert layer == 1 and value > 0.6  # layer 0 cannot do induction: it sees only tokens
    assert scores.previous_token[0].max() > 0.4  # the head it composes with

    # The heads it marks do the work: on repeated random tokens the second half is predicted,
    # and removing the output of every head scoring above 0.5 (its z set to 0) undoes that.
    tokens = repeated_random_tokens(V, 8, batch=16, seed=7)
    loss = per_token_loss(model, tokens)  # [16, 15]; position t predicts token t + 1
    first, second = loss[:, :7].mean(), loss[:, 8:].mean()
    assert first > 2.5 and second < 1.0

    marked = scores.induction[1] > 0.5

    def ablate(z: torch.Tensor, name: str) -> torch.Tensor:
        z = z.clone()
        z[:, :, marked] = 0.0
        return z

    logits = run_with_hooks(model, tokens, {"blocks.1.attn.z": ablate})
    logp = torch.log_softmax(logits[:, 8:-1], -1).gather(-1, tokens[:, 9:, None])[..., 0]
    assert -logp.mean() > 2.0
