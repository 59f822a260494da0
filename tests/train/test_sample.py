"""The trainer's periodic sample: ``glassgpt.sample.training.periodic_sampler``, which draws through
``glassgpt.sample.generate`` (deterministic per step, the training RNG untouched, only ids of
the tokenizer's vocabulary)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.sample.training import periodic_sampler
from glassgpt.tokenizer import CharTokenizer
from glassgpt.train.inputs import RunData
from glassgpt.train.resolve import resolve_run

ALPHABET = "abcdefghijklm"  # 13 ids


def model(n_ctx: int = 32) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_vocab=13, n_ctx=n_ctx, d_model=16, n_layers=1, n_heads=2)).eval()


def sampler(alphabet: str = ALPHABET, **train: object) -> tuple[object, CharTokenizer]:
    """``on_eval`` for a run with these ``train.*`` settings, and its tokenizer."""
    tok = CharTokenizer(list(alphabet))
    sets = [f"train.{k}={v}" for k, v in {"sample_prompt": "bc", **train}.items()]
    cfg = resolve_run(preset="cpu-tiny", overrides=["seed=5", *sets]).config
    data = SimpleNamespace(meta=SimpleNamespace(separator_ids=[]))
    return periodic_sampler(cfg, RunData(data, tok, b"")), tok


def ids(text: str | None, tok: CharTokenizer, prompt: str = "bc") -> list[int]:
    assert text is not None and text.startswith("sample: " + prompt)
    return tok.encode(text.removeprefix("sample: " + prompt))


def test_top_1_is_greedy_decoding() -> None:
    m = model()
    on_eval, tok = sampler(sample_tokens=9, sample_top_k=1)
    out = ids(on_eval(m, 10), tok)
    seq = tok.encode("bc")
    for _ in range(9):  # the oracle: argmax of the last position
        logits = m(torch.tensor([seq]))[0, -1]
        seq.append(int(logits.argmax()))
    assert out == seq[2:]


def test_a_sample_is_the_same_for_a_step_and_never_moves_the_training_rng() -> None:
    m = model()
    on_eval, tok = sampler(sample_tokens=20, sample_temperature=1.5, sample_top_k=13)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = on_eval(m, 7), on_eval(m, 7), on_eval(m, 8)  # seeds: seed + step
    assert a == b != c and len(ids(a, tok)) == 20
    assert torch.equal(torch.get_rng_state(), before)


def test_top_k_keeps_draws_among_the_k_likeliest() -> None:
    m = model()
    on_eval, tok = sampler(sample_tokens=1, sample_top_k=3, sample_temperature=1.0)
    logits = m(torch.tensor([tok.encode("bc")]))[0, -1]
    allowed = set(torch.topk(logits, 3).indices.tolist())
    draws = {ids(on_eval(m, step), tok)[0] for step in range(60)}
    assert draws <= allowed and len(draws) > 1


def test_a_padded_vocabulary_is_never_drawn() -> None:
    m = model(n_ctx=8)  # n_vocab 13, as if padded beyond a tokenizer of 5 ids; the window slides
    on_eval, tok = sampler("abcde", sample_tokens=30, sample_temperature=3.0, sample_top_k=13)
    for step in range(5):
        out = ids(on_eval(m, step), tok)
        assert len(out) == 30 and all(0 <= i < 5 for i in out)


def test_no_sample_tokens_no_sample() -> None:
    on_eval, _ = sampler(sample_tokens=0)
    assert on_eval(model(), 1) is None
