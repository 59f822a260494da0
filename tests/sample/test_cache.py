"""The KV cache: step-by-step logits equal full recomputation, for every positional variant."""

from __future__ import annotations

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.model.config import POSITIONALS
from glassgpt.sample.cache import CacheFullError, KVCache

TOL = 1e-5


def tiny(positional: str, **kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        n_vocab=37, n_ctx=24, d_model=16, n_layers=2, n_heads=2, positional=positional, **kw
    )
    model = GPT(cfg).eval()
    with torch.no_grad():  # larger weights than the init, so positions matter visibly
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def stepwise(model: GPT, tokens: torch.Tensor, chunks: list[int], **kw: object) -> torch.Tensor:
    """Logits [B, T, V] computed chunk by chunk through one cache."""
    cache = KVCache.for_model(model, tokens.shape[0], **kw)  # type: ignore[arg-type]
    out, start = [], 0
    with torch.no_grad():
        for c in chunks:
            out.append(model(tokens[:, start : start + c], cache=cache))
            start += c
    assert cache.length == start == tokens.shape[1]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("positional", POSITIONALS)
def test_cached_logits_equal_recomputation(positional: str, placement: str) -> None:
    model = tiny(positional, norm_placement=placement)
    tokens = torch.randint(0, 37, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
    for chunks in ([20], [1] * 20, [5, 1, 1, 7, 6]):
        diff = (stepwise(model, tokens, chunks) - full).abs().max().item()
        assert diff <= TOL, (chunks, diff)
    # The check is sensitive: caching keys at the wrong positions changes the logits.
    if positional != "none":
        cache = KVCache.for_model(model, 3)
        with torch.no_grad():
            model(tokens[:, 1:5], cache=cache)  # positions 0..3 for tokens 1..4: shifted
            shifted = model(tokens[:, 5:6], cache=cache)
        assert (shifted[:, 0] - full[:, 5]).abs().max().item() > 1e-3


@pytest.mark.parametrize("positional", POSITIONALS)
def test_explicit_path_with_cache_equals_fused(positional: str) -> None:
    model = tiny(positional, rope_base=100.0)
    tokens = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(2))
    fused = stepwise(model, tokens, [4, 1, 7])
    model.attn_impl = "explicit"
    explicit = stepwise(model, tokens, [4, 1, 7])
    assert (fused - explicit).abs().max().item() <= TOL


@pytest.mark.parametrize("positional", POSITIONALS)
def test_left_padded_batch_equals_each_row_alone(positional: str) -> None:
    model = tiny(positional)
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, 37, (n,), generator=g) for n in (9, 4, 1, 6)]
    T = max(len(r) for r in rows) + 5  # prompt columns, then 5 decoding steps
    extra = torch.randint(0, 37, (len(rows), 5), generator=g)
    pad = [T - 5 - len(r) for r in rows]
    tokens = torch.stack(
        [torch.cat([torch.zeros(p, dtype=torch.long), r, e]) for p, r, e in zip(pad, rows, extra)]
    )
    batched = stepwise(model, tokens, [T - 5, 1, 1, 2, 1], pad=pad)
    for b, (p, r, e) in enumerate(zip(pad, rows, extra)):
        alone = torch.cat([r, e])[None]
        with torch.no_grad():
            want = model(alone)[0]
        got = batched[b, p:]
        assert torch.isfinite(batched[b]).all()
        assert (got - want).abs().max().item() <= TOL, b


def test_last_only_returns_the_last_position() -> None:
    model = tiny("rope")
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(4))
    cache = KVCache.for_model(model, 2, last_only=True)
    with torch.no_grad():
        got = model(tokens, cache=cache)
        want = model(tokens)[:, -1:]
    assert got.shape == (2, 1, 37)
    assert (got - want).abs().max().item() <= TOL


def test_cache_overflow_and_batch_mismatch_raise() -> None:
    model = tiny("learned")
    cache = KVCache.for_model(model, 1, capacity=6)
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
        with pytest.raises(CacheFullError, match="capacity 6"):
            model(torch.zeros(1, 2, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="batch of 1"):
            model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    with pytest.raises(CacheFullError, match="n_ctx=24"):
        KVCache.for_model(model, 1, capacity=25)


def test_hooks_see_only_the_new_positions_during_a_cached_step() -> None:
    model = tiny("rope")
    seen: dict[str, torch.Size] = {}
    cache = KVCache.for_model(model, 1)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=cache)
        names = ("blocks.0.attn.k", "blocks.1.attn.pattern")
        with model.hooks({n: (lambda t, n: seen.__setitem__(n, t.shape)) for n in names}):
            model(torch.tensor([[4]]), cache=cache)
    assert seen["blocks.0.attn.k"] == (1, 1, 2, 8)  # [B, T_new, H, d_head]
    assert seen["blocks.1.attn.pattern"] == (1, 2, 1, 4)  # [B, H, T_q, T_k]: keys 0..3


def test_fused_qkv_copy_follows_in_place_weight_changes() -> None:
    model = tiny("learned")
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(tokens)
        model.blocks[0].attn.W_K.mul_(2.0)  # in place: same storage, new version
        after = model(tokens)
        fresh = GPT(model.config).eval()
        fresh.load_state_dict(model.state_dict())
        want = fresh(tokens)
    assert (after - before).abs().max().item() > 1e-3
    assert torch.equal(after, want)


def test_kv_cache_implements_the_model_protocol() -> None:
    from glassgpt.model.cache import KVCacheProtocol, LayerKV

    cache = KVCache.for_model(tiny("rope"), 1)
    assert isinstance(cache, KVCacheProtocol)
    assert all(isinstance(layer, LayerKV) for layer in cache.layers)
    assert not isinstance(object(), KVCacheProtocol)


@pytest.mark.parametrize(
    "kw",
    [{}, {"positional": "rope", "norm": "rmsnorm", "mlp": "swiglu"}],
    ids=["gpt2", "rope-rms-swiglu"],
)
def test_decoding_steps_with_reading_hooks_are_bit_identical(kw: dict) -> None:
    """One token a step (the compiled few-row kernels where built: norms, GELU, KV writes):
    every activation hooked by a reader leaves the logits bit-identical, and they agree with
    recomputing the whole sequence."""
    kw = dict(kw)
    model = tiny(kw.pop("positional", "learned"), **kw)
    tokens = torch.randint(0, 37, (1, 9), generator=torch.Generator().manual_seed(3))
    plain = stepwise(model, tokens, [3] + [1] * 6)
    seen: list[str] = []
    readers = dict.fromkeys(model.hook_names(), lambda t, name: seen.append(name))
    with model.hooks(readers):
        hooked = stepwise(model, tokens, [3] + [1] * 6)
    assert torch.equal(hooked, plain) and set(seen) == set(model.hook_names())
    with torch.no_grad():
        torch.testing.assert_close(plain, model(tokens), rtol=TOL, atol=TOL)
