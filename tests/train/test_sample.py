from __future__ import annotations

import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.train.run import sample


def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_vocab=13, n_ctx=6, d_model=16, n_layers=1, n_heads=2)).eval()


def test_top_1_is_greedy_decoding_over_a_sliding_window() -> None:
    m = model()
    out = sample(m, [1, 2], 9, top_k=1)
    ids = [1, 2]
    for _ in range(9):  # the oracle: argmax of the last position, context cut to n_ctx
        logits = m(torch.tensor([ids[-6:]]))[0, -1]
        ids.append(int(logits.argmax()))
    assert out == ids[2:]


def test_sampling_uses_only_its_own_generator() -> None:
    m = model()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = sample(m, [3], 20, temperature=1.5, generator=torch.Generator().manual_seed(7))
    b = sample(m, [3], 20, temperature=1.5, generator=torch.Generator().manual_seed(7))
    c = sample(m, [3], 20, temperature=1.5, generator=torch.Generator().manual_seed(8))
    assert a == b != c and all(0 <= i < 13 for i in a)
    assert torch.equal(torch.get_rng_state(), before)


def test_top_k_keeps_draws_among_the_k_likeliest() -> None:
    m = model()
    logits = m(torch.tensor([[4]]))[0, -1]
    allowed = set(torch.topk(logits, 3).indices.tolist())
    gen = torch.Generator().manual_seed(0)
    draws = {sample(m, [4], 1, top_k=3, generator=gen)[0] for _ in range(60)}
    assert draws <= allowed and len(draws) > 1


def test_a_padded_vocabulary_is_never_drawn() -> None:
    m = model()  # n_vocab 13, as if padded beyond a tokenizer of 5 ids
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        out = sample(m, [1], 30, temperature=3.0, generator=gen, n_valid=5)
        assert all(0 <= i < 5 for i in out)
