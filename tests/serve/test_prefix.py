"""Prefix caching (glassgpt.serve.prefix): logits with a cached prefix equal those of the
whole prompt encoded at once (float64, to rounding), for learned positions, RoPE with
grouped key/value heads and sliding-window layers; the scheduler's tokens with a cached
system prompt equal ``generate``'s; eviction keeps to the cap, chains are cut from their
end, and steering (which changes keys and values) bypasses the cache."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.sample.cache import KVCache
from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.generation import generate
from glassgpt.serve.prefix import PrefixCache
from glassgpt.serve.scheduler import Job, Scheduler
from glassgpt.tokenizer import CharTokenizer

FAMILIES = {
    "gpt2": {},
    "gqa-rope-sliding": {
        "positional": "rope",
        "n_heads": 4,
        "n_kv_heads": 2,
        "sliding_window": 6,
        "layer_types": ("sliding", "full"),
    },
    "llama-like": {"positional": "rope", "n_kv_heads": 1, "norm": "rmsnorm", "mlp": "swiglu"},
}


def model_of(family: str, dtype: torch.dtype = torch.float64) -> GPT:
    torch.manual_seed(0)
    cfg = {"n_vocab": 29, "n_ctx": 64, "d_model": 16, "n_layers": 2, "n_heads": 4,
           **FAMILIES[family]}  # fmt: skip
    model = GPT(GPTConfig(**cfg)).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def prefill(model: GPT, prefix: PrefixCache | None, ids: list[int]) -> tuple[int, torch.Tensor]:
    cache = KVCache.for_model(model, 1, len(ids))
    n = prefix.load(ids, cache) if prefix is not None else 0
    with torch.inference_mode():
        logits = model(torch.tensor([ids[n:]]), cache=cache)[0, -1]
    if prefix is not None:
        prefix.store(ids, cache)
    return n, logits


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_with_a_cached_prefix_equal_the_whole_prompts(family: str) -> None:
    try:
        model = model_of(family)
    except Exception as e:  # a family field this checkout's config does not have
        pytest.skip(f"{family}: {e}")
    gen = torch.Generator().manual_seed(1)
    system = torch.randint(0, 29, (37,), generator=gen).tolist()
    prefix = PrefixCache.for_model(model, block=8)
    assert prefill(model, prefix, [*system, 1, 2])[0] == 0
    for tail in ([3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13], []):
        ids = system + tail
        n, cached = prefill(model, prefix, ids)
        assert n == 8 * ((len(ids) - 1) // 8 if len(ids) - 1 < 40 else 4)
        whole = model(torch.tensor([ids]))[0, -1]
        torch.testing.assert_close(cached, whole, rtol=0, atol=1e-12)
    assert prefix.hits == 3


def test_lru_keeps_to_the_cap_and_cuts_chains_from_their_end() -> None:
    model = model_of("gpt2", torch.float32)
    one = 2 * 2 * 4 * 4 * 4 * 4  # k and v: [L=2, G=4, B=4, d_head=4] float32 each
    prefix = PrefixCache.for_model(model, block=4, max_bytes=5 * one)
    a = list(range(13))  # three blocks
    prefill(model, prefix, a)
    assert prefix.block_bytes == one and len(prefix.pool) == 5
    assert len(prefix) == 3 and prefix.bytes == 3 * one
    prefill(model, prefix, list(range(15, 28)))  # three more: one of a's goes
    assert len(prefix) == 5 and prefix.bytes == 5 * one
    # the one to go was a's last block, not its first: a still finds its first two
    assert prefill(model, prefix, a)[0] == 8
    assert prefill(model, PrefixCache.for_model(model, block=4, max_bytes=0), a)[0] == 0
    # a prompt longer than the pool keeps its first blocks, never its later ones alone
    small = PrefixCache.for_model(model, block=4, max_bytes=2 * one)
    prefill(model, small, list(range(17)))
    assert len(small) == 2 and prefill(model, small, list(range(17)))[0] == 8


def serve(model: GPT, tok: Any, prompts: list[list[int]], **kw: Any) -> tuple[list, Scheduler]:
    """Each prompt through the scheduler in turn (greedy and sampled alternately)."""
    scheduler = Scheduler(model, tok, slots=2, max_context=64, **kw)
    outs: list[list[int]] = []
    scheduler.start()
    try:
        for i, prompt in enumerate(prompts):
            out: list[int] = []
            done = threading.Event()

            def emit(kind: str, payload: Any, out: list[int] = out, done: Any = done) -> None:
                if kind == "token":
                    out.append(payload[0])
                else:
                    done.set()

            sampling = SamplingConfig(temperature=0.9 if i % 2 else 0.0)
            scheduler.submit(Job(prompt, sampling, max_tokens=10, seed=i, emit=emit))
            assert done.wait(60)
            outs.append(out)
    finally:
        scheduler.close()
    return outs, scheduler


def test_served_tokens_with_a_cached_system_prompt_equal_generates() -> None:
    tok = CharTokenizer([chr(97 + i) for i in range(29)])
    model = model_of("gqa-rope-sliding", torch.float64)
    system = torch.randint(0, 29, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [[*system, i, i + 1] for i in range(4)]
    outs, scheduler = serve(model, tok, prompts)
    assert scheduler.prefix.hits == 3 and scheduler.prefix.reused == 3 * 32
    want = [generate(model, p, max_new_tokens=10, seed=i, temperature=0.9 if i % 2 else 0.0)
            for i, p in enumerate(prompts)]  # fmt: skip
    assert outs == want


def test_steering_bypasses_the_cache() -> None:
    tok = CharTokenizer([chr(97 + i) for i in range(29)])
    model = model_of("gpt2", torch.float32)

    def push(x: torch.Tensor, **_: Any) -> torch.Tensor:
        return x + 1.0

    prompts = [list(range(20)), list(range(20))]
    _, scheduler = serve(model, tok, prompts, steering={"blocks.0.hook_resid_post": push})
    assert scheduler.prefix.hits == 0 and len(scheduler.prefix) == 0
