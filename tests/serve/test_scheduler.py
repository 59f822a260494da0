"""The scheduler's decoding steps replayed from their recordings (one per batch size) give
the tokens of its eager steps, for requests that arrive, finish and leave at different times."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.serve.conftest import Collected

from glassgpt.kernels import rowwise
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.filters import SamplingConfig
from glassgpt.serve.scheduler import Job, Scheduler
from glassgpt.tokenizer import CharTokenizer


def served(model: GPT, tok: Any, *, replay: bool) -> tuple[list[list[int]], Scheduler]:
    """Seven requests of different lengths, sampled and greedy, through one scheduler."""
    scheduler = Scheduler(model, tok, slots=4, replay=replay)
    gen = torch.Generator().manual_seed(5)
    got = Collected(7)
    scheduler.start()
    try:
        for i in range(7):
            n = int(torch.randint(1, 12, (), generator=gen))
            prompt = torch.randint(0, model.config.n_vocab, (n,), generator=gen).tolist()
            sampling = SamplingConfig(temperature=0.0 if i % 2 else 0.8, top_k=None)
            job = Job(prompt, sampling, max_tokens=6 + 3 * i, seed=i, emit=got.emit_to(i))
            scheduler.submit(job)
        got.wait()
    finally:
        scheduler.close()
    return got.outs, scheduler


@pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")
def test_replayed_scheduler_steps_give_the_eager_tokens() -> None:
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=48, d_model=32, n_layers=2, n_heads=4))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.25)
    model = cast(model, "float32")
    replayed, scheduler = served(model, tok, replay=True)
    eager, eager_scheduler = served(model, tok, replay=False)
    assert replayed == eager
    assert [len(o) for o in replayed] == [6 + 3 * i for i in range(7)]
    assert any(d.kind == "replayed" for d in scheduler.decoders.values())
    assert all(d.kind == "eager" for d in eager_scheduler.decoders.values())
