"""The slot cache: rows of different lengths decoded in one step give each row's own logits."""

from __future__ import annotations

import pytest
import torch
from tests.kernels.test_pages import LINUX_THP, _thp_setting, _vma

from glassgpt.kernels.pages import SHARED_MIN
from glassgpt.model import GPT, GPTConfig
from glassgpt.sample.cache import KVCache
from glassgpt.serve.slots import SlotCache


def load(model: GPT, cache: SlotCache, seqs: list[list[int]]) -> None:
    """Prefill each sequence alone (as the scheduler does) into slots 0, 1, …"""
    for b, s in enumerate(seqs):
        pre = KVCache.for_model(model, 1, len(s))
        model(torch.tensor([s]), cache=pre)
        cache.load(b, pre)


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "none"])
def test_batched_steps_equal_whole_sequences(positional: str) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=23, n_ctx=24, d_model=16, n_layers=2, n_heads=2,
                    positional=positional)  # fmt: skip
    model = GPT(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 23, (n,), generator=gen).tolist() for n in (3, 9, 1, 14)]
    cache = SlotCache.for_model(model, slots=5)
    with torch.no_grad():
        load(model, cache, seqs)
        for _ in range(6):  # six batched steps; each row continues with a random token
            new = torch.randint(0, 23, (len(seqs),), generator=gen).tolist()
            got = model(torch.tensor(new)[:, None], cache=cache)[:, -1]  # [B, V]
            for b, t in enumerate(new):
                seqs[b].append(t)
                whole = model(torch.tensor([seqs[b]]))[0, -1]
                torch.testing.assert_close(got[b], whole, atol=2e-5, rtol=1e-4)
    assert cache.lengths[:4].tolist() == [len(s) for s in seqs]


def test_move_keeps_the_sequence() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=11, n_ctx=12, d_model=8, n_layers=1, n_heads=2)).eval()
    seqs = [[1, 2, 3], [4, 5, 6, 7, 8]]
    cache = SlotCache.for_model(model, slots=2)
    with torch.no_grad():
        load(model, cache, seqs)
        cache.move(1, 0)  # the second sequence now alone, in slot 0
        got = model(torch.tensor([[9]]), cache=cache)[0, -1]
        torch.testing.assert_close(got, model(torch.tensor([[*seqs[1], 9]]))[0, -1],
                                   atol=2e-5, rtol=1e-4)  # fmt: skip
    assert cache.lengths[0] == 6


def test_replayed_slot_steps_equal_eager_ones_bit_for_bit() -> None:
    """A step recorded over slots of different lengths replays, bit for bit, as the lengths
    move on and after a sequence leaves (a new recording for the smaller batch)."""
    from glassgpt.kernels import rowwise
    from glassgpt.model.precision import cast
    from glassgpt.sample.replay import ReplayedStep

    if not rowwise.built():
        pytest.skip("glassgpt's kernels are not built")
    torch.manual_seed(0)
    model = cast(GPT(GPTConfig(n_vocab=29, n_ctx=32, d_model=16, n_layers=2, n_heads=2)), "float32")
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 29, (n,), generator=gen).tolist() for n in (3, 11, 1)]
    mine, theirs = SlotCache.for_model(model, slots=4), SlotCache.for_model(model, slots=4)
    with torch.inference_mode():
        for cache in (mine, theirs):
            load(model, cache, seqs)
        steps: dict[int, ReplayedStep] = {}
        for i in range(8):
            if i == 4:  # the second sequence leaves; the last moves into its slot
                for cache in (mine, theirs):
                    cache.move(2, 1)
            B = 3 if i < 4 else 2
            new = torch.randint(0, 29, (B, 1), generator=gen)
            if B not in steps:
                step, got = ReplayedStep.record(model, mine, new)
                assert step is not None, ReplayedStep.why_not
                steps[B] = step
            else:
                got = steps[B](new)
            assert torch.equal(got, model(new, cache=theirs))
    assert torch.equal(mine.lengths, theirs.lengths)
    assert mine.lengths[:2].tolist() == [3 + 8, 1 + 8]


def test_a_bf16_model_decodes_over_its_slots() -> None:
    """A bf16 inference copy's slot steps (its cache float32 on a CPU without bf16 arithmetic)
    give each row its own logits, to bf16's rounding."""
    from glassgpt.model.precision import cast

    torch.manual_seed(0)
    model = cast(GPT(GPTConfig(n_vocab=29, n_ctx=32, d_model=16, n_layers=2, n_heads=2)), "bf16")
    seqs = [[1, 2, 3], [4]]
    cache = SlotCache.for_model(model, slots=2)
    with torch.inference_mode():
        load(model, cache, seqs)
        got = model(torch.tensor([[5], [6]]), cache=cache)[:, -1].float()
        for b, (s, t) in enumerate(zip(seqs, (5, 6))):
            alone = model(torch.tensor([[*s, t]]))[0, -1].float()
            torch.testing.assert_close(got[b], alone, atol=0.05, rtol=0.05)
    assert cache.lengths.tolist() == [4, 2]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_prompt_encoded_into_its_slot_is_a_fresh_caches(family: str) -> None:
    """``prompt_cache``: a prompt encoded straight into a used slot gives, bit for bit, the
    logits and keys and values of a new ``KVCache`` of the prompt's own length (as
    ``generate`` sizes it), whatever the slot held before; the other slots are untouched."""
    extra = {"positional": "rope", "n_kv_heads": 1, "norm": "rmsnorm", "mlp": "swiglu"}
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=23, n_ctx=24, d_model=16, n_layers=2, n_heads=2,
                    **(extra if family == "llama" else {}))  # type: ignore[arg-type]  # fmt: skip
    model = GPT(cfg).eval()
    cache = SlotCache.for_model(model, slots=3)
    for layer in cache.layers:  # what earlier sequences left behind
        layer.k.normal_(), layer.v.normal_()
    before = [(layer.k.clone(), layer.v.clone()) for layer in cache.layers]
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    fresh = KVCache.for_model(model, 1, prompt.shape[1], last_only=True)
    into = cache.prompt_cache(1, model)
    with torch.inference_mode():
        want, got = model(prompt, cache=fresh), model(prompt, cache=into)
    cache.admit(1, into)
    assert torch.equal(got, want) and int(cache.lengths[1]) == prompt.shape[1] == into.length
    for layer, theirs, (k0, v0) in zip(cache.layers, fresh.layers, before, strict=True):
        n = prompt.shape[1]
        assert torch.equal(layer.k[1, :, :n], theirs.k[0]) and torch.equal(
            layer.v[1, :, :n], theirs.v[0]
        )
        for b in (0, 2):
            assert torch.equal(layer.k[b], k0[b]) and torch.equal(layer.v[b], v0[b])


@pytest.mark.skipif(
    not LINUX_THP or _thp_setting() not in ("always", "madvise"),
    reason="no transparent huge pages to advise on this system",
)
def test_kv_caches_are_zeros_on_huge_pages() -> None:
    """generate's cache and the server's slots hold their keys and values in memory advised
    for 2 MiB pages (a step's attention reads them in short runs far apart), zeroed."""
    cfg = GPTConfig(n_vocab=65, n_ctx=256, d_model=96, n_layers=2, n_heads=4)
    caches = [KVCache(cfg, 4), SlotCache(cfg, 8)]
    for cache in caches:
        for layer in cache.layers:
            for t in (layer.k, layer.v):
                assert t.nbytes >= SHARED_MIN and torch.count_nonzero(t) == 0
                vma = _vma(t.data_ptr())
                assert vma is not None and vma["THPeligible"] == "1"
