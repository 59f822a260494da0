"""Prompts admitted together: the scheduler encodes the common stretch of prompts that
loaded as many cached positions in one forward, and each row's keys, values and logits are
those of its prompt encoded alone (``KVCache``, as ``generate`` prefills), up to a wider
matmul's rounding; a held batch of mixed lengths and settings then decodes each request's
own tokens, as ``generate`` gives them (learned positions, RoPE with grouped key/value heads
and sliding-window layers, a Llama-like model: ``test_prefix``'s families, in float64)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from tests.serve.conftest import Collected
from tests.serve.test_prefix import FAMILIES, model_of
from torch import Tensor

from glassgpt import kernels
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import attach_kernels
from glassgpt.sample.cache import KVCache
from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.generation import generate
from glassgpt.serve.scheduler import Job, Scheduler
from glassgpt.serve.slots import SlotCache
from glassgpt.tokenizer import CharTokenizer

TOK = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,"))


def tiny() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=TOK.n_vocab, n_ctx=64, d_model=32, n_layers=2, n_heads=4))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def alone(model: GPT, ids: list[int]) -> tuple[Tensor, KVCache]:
    cache = KVCache.for_model(model, 1, len(ids), last_only=True)
    with torch.inference_mode():
        return model(torch.tensor([ids]), cache=cache)[0, -1], cache


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prompts_encoded_together_equal_each_alone(family: str) -> None:
    try:
        model = model_of(family)  # float64: only the summation order differs
    except Exception as e:  # a family field this checkout's config does not have
        pytest.skip(f"{family}: {e}")
    sched = Scheduler(model, TOK, slots=8, max_context=64)
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(0, TOK.n_vocab, (n,), generator=gen).tolist()

    system = ids(sched.prefix.block * 2)  # two blocks, cached by a first prompt
    sched._prefill_many([system + ids(3)], 0)
    # sorted as _admit_all sorts them: no prefix (lengths 4, 9, 9, 20), then the cached one
    prompts = [ids(4), ids(9), ids(9), ids(20), system + ids(5), system + ids(11)]
    before = sched.prompt_forwards
    got = sched._prefill_many(prompts, 2)  # into slots 2..7
    # lengths 4, 9, 9, 20: the two 9s together, the others alone; the cached pair (after 32
    # loaded, 5 and 11 left) each alone
    assert sched.prompt_forwards - before == 5
    assert sched.prefix.hits == 2
    assert sched.cache.lengths[2:8].tolist() == [len(p) for p in prompts]
    for b, p in enumerate(prompts):
        logits, cache = alone(sched.decoding, p)
        torch.testing.assert_close(got[b], logits, rtol=0, atol=1e-12)
        for mine, theirs in zip(sched.cache.layers, cache.layers, strict=True):
            n = len(p)
            for got_kv, want in ((mine.k[2 + b, :, :n], theirs.k[0, :, :n]),
                                 (mine.v[2 + b, :, :n], theirs.v[0, :, :n])):  # fmt: skip
                torch.testing.assert_close(got_kv, want, rtol=0, atol=1e-12)


@pytest.mark.skipif(not kernels.has_small_batch_kernel(), reason="no compiled panel kernel here")
def test_prompts_encoded_together_are_each_alone_bit_for_bit_in_float32() -> None:
    """Packed float32 weights, as ``serve`` packs them: prompts of one length share forwards of
    at most PREFILL_TOKENS rows, whose products give each row its own sums."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(n_vocab=TOK.n_vocab, n_ctx=64, d_model=64, n_layers=2, n_heads=4)).eval()
    assert attach_kernels(model) > 1
    sched = Scheduler(model, TOK, slots=8, max_context=64)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, TOK.n_vocab, (n,), generator=gen).tolist() for n in (16, 16, 16, 16, 7, 30)]  # fmt: skip
    before = sched.prompt_forwards
    got = sched._prefill_many(prompts, 0)
    assert sched.prompt_forwards - before == 3  # the four of 16 in one forward
    for b, p in enumerate(prompts):
        logits, cache = alone(sched.decoding, p)
        assert torch.equal(got[b], logits), b
        for mine, theirs in zip(sched.cache.layers, cache.layers, strict=True):
            assert torch.equal(mine.k[b, :, : len(p)], theirs.k[0, :, : len(p)])
            assert torch.equal(mine.v[b, :, : len(p)], theirs.v[0, :, : len(p)])


@pytest.mark.skipif(not kernels.has_small_batch_kernel(), reason="no compiled panel kernel here")
@pytest.mark.parametrize("B", [9, 24])
def test_a_step_of_many_rows_is_each_rows_step_alone_bit_for_bit(B: int) -> None:
    """Packed float32 weights: a decoding step of B slots equals each slot's step alone (its
    products, norms and GELU take kernels whose rows do not see each other)."""
    torch.manual_seed(5)
    model = GPT(GPTConfig(n_vocab=TOK.n_vocab, n_ctx=32, d_model=64, n_layers=2, n_heads=4)).eval()
    assert attach_kernels(model) > 1
    gen = torch.Generator().manual_seed(6)
    prompts = torch.randint(0, TOK.n_vocab, (B, 5), generator=gen)
    nxt = torch.randint(0, TOK.n_vocab, (B, 1), generator=gen)
    many, each = SlotCache.for_model(model, B), []
    with torch.inference_mode():
        for b in range(B):
            _, cache = alone(model, prompts[b].tolist())
            many.load(b, cache)
            one = SlotCache.for_model(model, 1)
            one.load(0, cache)
            each.append(model(nxt[b : b + 1], cache=one)[0, -1])
        together = model(nxt, cache=many)[:, -1]
    assert all(torch.equal(together[b], each[b]) for b in range(B))


def test_a_held_batch_of_mixed_prompts_decodes_what_generate_does() -> None:
    model = tiny()
    sched = Scheduler(model, TOK, slots=8, max_context=64)
    texts = ["the cat", "a", "the dog", "hello there", "abc", "the cow", "zz", "one two"]
    settings = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.9, top_p=0.8),
                SamplingConfig(temperature=1.1, top_k=5), SamplingConfig(temperature=0.0,
                repetition_penalty=1.5), SamplingConfig(temperature=0.7, min_p=0.1),
                SamplingConfig(temperature=1.0, presence_penalty=1.0),
                SamplingConfig(temperature=0.0, logit_bias={3: 5.0}),
                SamplingConfig(temperature=1.3)]  # fmt: skip
    got = Collected(len(texts))
    sched.start()
    try:
        with sched.lock:  # the first job waits at its prefill, the others queue behind it
            for i, (text, cfg) in enumerate(zip(texts, settings)):
                sched.submit(Job(TOK.encode(text), cfg, max_tokens=10, seed=i, emit=got.emit_to(i)))
            while sched.pending < len(texts):
                threading.Event().wait(0.01)
        got.wait()
    finally:
        sched.close()
    assert sched.prompt_forwards < len(texts)  # the queued ones shared forwards
    assert sched.widest >= len(texts) - 1
    for i, (text, cfg) in enumerate(zip(texts, settings)):
        names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                 "frequency_penalty", "presence_penalty", "logit_bias")  # fmt: skip
        opts = {k: getattr(cfg, k) for k in names}
        want = generate(model, TOK.encode(text), max_new_tokens=10, seed=i, **opts)
        assert got.outs[i] == want, (i, text)


def test_a_job_that_fails_in_a_batch_fails_alone() -> None:
    """A setting the sampler refuses (a logit bias past the vocabulary, which the API would
    have answered with a 400) ends that job with an error; its batch mates decode."""
    model = tiny()
    sched = Scheduler(model, TOK, slots=8, max_context=64)
    good = SamplingConfig(temperature=0.0)
    settings = [good, SamplingConfig(logit_bias={TOK.n_vocab + 3: 1.0}), good]
    got = Collected(len(settings))
    errors: list[str] = []

    def emit_to(i: int) -> Any:
        inner = got.emit_to(i)

        def emit(kind: str, payload: Any) -> None:
            if kind == "error":
                errors.append(payload)
            inner(kind, payload)

        return emit

    jobs = [Job(TOK.encode("the cat"), cfg, max_tokens=5, seed=0, emit=emit_to(i))
            for i, cfg in enumerate(settings)]  # fmt: skip
    sched._admit_all(jobs)
    while sched.active:
        sched._step()
    got.wait(timeout=1)
    assert len(errors) == 1 and "logit_bias" in errors[0]
    want = generate(model, TOK.encode("the cat"), max_new_tokens=5, temperature=0.0)
    assert got.outs[0] == got.outs[2] == want and got.outs[1] == []
