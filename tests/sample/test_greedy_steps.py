"""Greedy decoding through the replayed step's bounded pick (``glassgpt.sample.replay.
GreedySteps``, ``Decoder.step_greedy``): ``generate``'s ids equal with the int8 pick on and
off and with eager decoding, the steps that picked so counted, a logits-returning step after
them unchanged, and a model whose last call is no panels product (a final soft cap) decoded
as before."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import rowwise
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.engine import Decoder
from glassgpt.sample.generation import generate, stream

pytestmark = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")

PROMPTS = [[1, 2, 3, 4], [5, 6, 7, 8]]  # (one length: a left-padded batch decodes eagerly)


def peaked(dtype: str = "float32", **overrides: object) -> GPT:
    """A tiny model over 11 panels of vocabulary whose logits spread like a trained model's
    (each row of W_U scaled by e^N(0, 1)): the bound leaves few candidates."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{"n_vocab": 700, "n_ctx": 64, "d_model": 32, "n_layers": 2,
                             "n_heads": 4, **overrides}))  # type: ignore[arg-type]  # fmt: skip
    with torch.no_grad():
        model.W_U.mul_(torch.exp(torch.randn(model.W_U.shape[1])))
    return cast(model, dtype)


@pytest.mark.parametrize("rows", [PROMPTS[:1], PROMPTS])
def test_generate_ids_equal_with_the_int8_pick_on_and_off_and_eagerly(rows) -> None:
    model = peaked()
    on = stream(model, rows, max_new_tokens=30, temperature=0, stop_ids=())
    got = list(on)
    counts = on.decoder.greedy_steps  # type: ignore[attr-defined]
    assert counts is not None and counts.steps == 28 and counts.full < counts.steps
    assert 0 < counts.candidates < counts.steps * len(rows) * 50  # few: bounded picks
    want = list(stream(model, rows, max_new_tokens=30, temperature=0, int8_argmax=False))
    assert got == want
    eager = generate(model, rows, max_new_tokens=30, temperature=0, replay=False)
    assert generate(model, rows, max_new_tokens=30, temperature=0) == eager


def test_a_flat_random_model_falls_back_to_the_full_product_with_the_same_ids() -> None:
    torch.manual_seed(1)
    model = GPT(GPTConfig(n_vocab=3000, n_ctx=64, d_model=16, n_layers=1, n_heads=2))
    with torch.no_grad():
        W = model.W_U  # every row alike: logits within the int8 error of each other
        W.copy_(W[:, :1] + 1e-5 * torch.randn_like(W))
    model = cast(model, "float32")
    on = stream(model, PROMPTS[:1], max_new_tokens=12, temperature=0)
    got = list(on)
    g = on.decoder.greedy_steps  # type: ignore[attr-defined]
    assert g.full == g.steps == g.MISSES and g.plain == 10 - g.MISSES  # then plain steps
    assert got == list(stream(model, PROMPTS[:1], max_new_tokens=12, temperature=0,
                              int8_argmax=False))  # fmt: skip


def test_a_logits_step_after_greedy_steps_computes_what_it_did() -> None:
    model = peaked()
    decoders = [Decoder.start(model, 1, 40) for _ in range(2)]
    with torch.inference_mode():
        for d in decoders:
            model(torch.tensor([PROMPTS[1]]), cache=d.cache)
    greedy, plain = decoders
    ids = [9]
    for _ in range(8):
        picked, logits = greedy.step_greedy(ids, 700)
        assert picked is not None or logits is not None
        theirs = plain.step(ids)
        want = plain.greedy(theirs, 700)
        assert picked == want
        ids = picked
    assert (
        greedy.greedy_steps is not None
        and greedy.greedy_steps.steps == 7
        and greedy.greedy_steps.full < 7
    )
    assert torch.equal(greedy.step(ids), plain.step(ids))


def test_a_final_soft_cap_keeps_the_plain_pick() -> None:
    """Its logits are c·tanh(z/c) after the product (rounding may tie two of them): the
    recording's last call is not the product, so no bounded pick, and the same ids."""
    model = peaked(final_softcap=5.0)
    on = stream(model, PROMPTS[:1], max_new_tokens=10, temperature=0)
    got = list(on)
    assert on.decoder.kind == "replayed" and on.decoder.greedy_steps is None  # type: ignore[attr-defined]
    assert got == list(stream(model, PROMPTS[:1], max_new_tokens=10, temperature=0, replay=False))


def test_steps_that_keep_taking_the_full_product_rest_from_the_int8_pass() -> None:
    torch.manual_seed(1)
    model = GPT(GPTConfig(n_vocab=3000, n_ctx=128, d_model=16, n_layers=1, n_heads=2))
    with torch.no_grad():
        W = model.W_U
        W.copy_(W[:, :1] + 1e-5 * torch.randn_like(W))
    model = cast(model, "float32")
    on = stream(model, PROMPTS[:1], max_new_tokens=72, temperature=0)  # 70 steps after the
    got = list(on)  # recorded one: 4 on the full product, 64 plain, then 2 on the int8 pass
    g = on.decoder.greedy_steps  # type: ignore[attr-defined]
    assert g.full == g.steps == g.MISSES + 2 and g.plain == g.REST
    assert got == list(stream(model, PROMPTS[:1], max_new_tokens=72, temperature=0,
                              int8_argmax=False))  # fmt: skip


def test_more_rows_than_the_pick_gains_at_keep_the_plain_step() -> None:
    """Five float32 rows (``kernels.greedy.MAX_ROWS``: the products turn bound by their
    multiply-adds, which the int8 pass makes as many of): no int8 pick, the same ids."""
    model = peaked()
    rows = [[1 + r, 2, 3, 4] for r in range(5)]
    on = stream(model, rows, max_new_tokens=6, temperature=0)
    got = list(on)
    assert on.decoder.kind == "replayed" and on.decoder.greedy_steps is None  # type: ignore[attr-defined]
    assert got == list(stream(model, rows, max_new_tokens=6, temperature=0, replay=False))
