"""The fixed-shape cache behind CUDA-graph decoding: its one-token steps, which attend over the
whole capacity through a mask, give the logits of full recomputation (run eagerly here; the
graph replay itself is tested on a GPU in tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.model.config import POSITIONALS
from glassgpt.sample.cache import CacheFullError
from glassgpt.sample.graphs import StaticKVCache


def tiny(positional: str) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=37, n_ctx=24, d_model=16, n_layers=2, n_heads=2, positional=positional)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def static_steps(
    model: GPT, rows: list[list[int]], n_new: int, seed: int = 0
) -> list[torch.Tensor]:
    """Prefill the left-padded prompts eagerly, then ``n_new`` static one-token steps; returns
    each step's last logits [B, V] and checks them against recomputing every row alone."""
    width = max(len(r) for r in rows)
    pads = [width - len(r) for r in rows]
    tokens = torch.tensor([[0] * p + r for p, r in zip(pads, rows)])
    cache = StaticKVCache.for_model(model, len(rows), pad=pads, last_only=True)
    with torch.inference_mode():
        model(tokens, cache=cache)
    g = torch.Generator().manual_seed(seed)
    hist = [list(r) for r in rows]
    out = []
    for _ in range(n_new):
        nxt = torch.randint(0, model.config.n_vocab, (len(rows), 1), generator=g)
        for h, t in zip(hist, nxt[:, 0].tolist()):
            h.append(t)
        cache.static = True
        with torch.inference_mode():
            logits = model(nxt, cache=cache)[:, -1]
        cache.static = False
        out.append(logits)
        for b, h in enumerate(hist):
            alone = model(torch.tensor([h]))[0, -1]
            torch.testing.assert_close(logits[b], alone, rtol=1e-5, atol=1e-5)
    assert cache.length == width + n_new and int(cache.col) == cache.length
    return out


@pytest.mark.parametrize("positional", POSITIONALS)
def test_static_steps_equal_recomputation(positional: str) -> None:
    static_steps(tiny(positional), [[1, 2, 3, 4, 5]], 8)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_static_steps_of_a_padded_batch_equal_each_row_alone(positional: str) -> None:
    static_steps(tiny(positional), [[1, 2, 3, 4, 5, 6], [7], [8, 9, 10]], 6)


def test_reset_keeps_the_tensors_a_graph_reads() -> None:
    model = tiny("learned")
    cache = StaticKVCache.for_model(model, 2, pad=[0, 2], last_only=True)
    col, pad_row = cache.col, cache._pad_row
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3], [0, 0, 4]]), cache=cache)
    cache.reset([1, 0])
    assert cache.col is col and cache._pad_row is pad_row  # updated in place
    assert int(col) == 0 and pad_row.tolist() == [1, 0]
    cache.static = True
    with pytest.raises(CacheFullError, match="static step"):
        model(torch.tensor([[1, 2], [3, 4]]), cache=cache)
