"""glassgpt's decoding attention (``glassgpt.kernels._attend``): a few queries over cached
keys and values, every shape, stride, mask and thread count against the float64 softmax,
and the seam's routing (float32 inference with few queries takes it, autograd does not)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import attention_door, bf16
from glassgpt.kernels.policy import FEW_QUERIES

pytest.importorskip(
    "glassgpt.kernels._attend", reason="the C extension is not built (no compiler at install)"
)


def _oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: np.ndarray) -> np.ndarray:
    """z = softmax(q kᵀ/√d + M) v in float64, M = −∞ where not allowed; z = 0 for a query
    that may see no key."""
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    scores = q64 @ k64.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    w = np.where(allowed, np.exp(scores - top), 0.0)
    total = w.sum(-1, keepdims=True)
    return np.where(total > 0, (w / np.where(total > 0, total, 1.0)) @ v64, 0.0)


@settings(max_examples=80, deadline=None)
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 4),
    Tq=st.integers(1, FEW_QUERIES),
    extra=st.integers(0, 40),
    D=st.sampled_from([1, 5, 8, 12, 16, 40, 64, 96, 128, 136]),
    masked=st.booleans(),
    cached=st.booleans(),
    threads=st.sampled_from([1, 2, 3]),
    seed=st.integers(0, 2**31),
)
def test_few_queries_is_the_softmax_of_the_allowed_keys(
    B: int, H: int, Tq: int, extra: int, D: int, masked: bool, cached: bool, threads: int,
    seed: int,
) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    Tk = Tq + extra
    offset = Tk - Tq  # the queries are the last Tq positions
    # q as the model makes it: a [B, H, T, D] view of [B, T, H, D]; k, v a cache's first Tk
    # columns of [B, H, capacity, D], or plain contiguous tensors
    q = torch.randn(B, Tq, H, D, generator=gen).transpose(1, 2) * 2
    capacity = Tk + 7 if cached else Tk
    k = torch.randn(B, H, capacity, D, generator=gen)[:, :, :Tk]
    v = torch.randn(B, H, capacity, D, generator=gen)[:, :, :Tk]
    mask = None
    if masked:  # [B, 1, Tq, Tk] like a padded batch's, some rows possibly empty
        mask = torch.rand(B, 1, Tq, Tk, generator=gen) < 0.7
        allowed = np.broadcast_to(mask.numpy(), (B, H, Tq, Tk))
    else:
        i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
        allowed = np.broadcast_to(j <= offset + i, (B, H, Tq, Tk))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        z = attention_door.few_queries(q, k, v, offset, mask)
    finally:
        torch.set_num_threads(before)
    assert z.shape == (B, H, Tq, D)
    np.testing.assert_allclose(z.double().numpy(), _oracle(q, k, v, allowed), rtol=1e-4, atol=1e-5)


def test_a_query_seeing_no_key_gets_zero() -> None:
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.zeros(1, 1, 1, 3, dtype=torch.bool)
    assert torch.equal(attention_door.few_queries(q, k, v, 2, mask), torch.zeros(1, 2, 1, 8))


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = attention_door.few_queries

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attention_door, "few_queries", spy)
    return calls


def test_the_seam_routes_decoding_steps_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    with torch.inference_mode():
        got = attention_door.attention(q, k, v, offset=8)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert calls == [1]
    # autograd, more queries than FEW_QUERIES, and bf16 on a CPU with bf16 arithmetic keep
    # PyTorch's kernel
    monkeypatch.setattr(bf16, "native", lambda: True)
    attention_door.attention(q.requires_grad_(), k, v, offset=8)
    with torch.no_grad():
        long_q = torch.randn(2, 4, FEW_QUERIES + 1, 16)
        attention_door.attention(long_q, k, v, offset=0)
        attention_door.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), offset=8)
    assert calls == [1]
    # without bf16 arithmetic a bf16 step takes it on float32 copies, z rounded to bf16
    monkeypatch.setattr(bf16, "native", lambda: False)
    qb, kb, vb = q.detach().bfloat16(), k.bfloat16(), v.bfloat16()
    with torch.inference_mode():
        z = attention_door.attention(qb, kb, vb, offset=8)
    assert calls == [1, 1] and z.dtype == torch.bfloat16
    ref = torch.nn.functional.scaled_dot_product_attention(qb.double(), kb.double(), vb.double())
    torch.testing.assert_close(z.double(), ref.bfloat16().double(), rtol=8e-3, atol=1e-3)


def test_decoding_through_it_gives_the_full_forward_logits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.sample.cache import KVCache

    calls = _spy(monkeypatch)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=50, n_ctx=32, d_model=32, n_layers=2, n_heads=4)).eval()
    tokens = torch.randint(0, 50, (3, 12))
    pads = [0, 3, 5]  # a left-padded batch: the cache's mask goes to the kernel too
    cache = KVCache.for_model(model, 3, 32, pad=pads)
    with torch.inference_mode():
        full = model(tokens)
        model(tokens[:, :4], cache=cache)
        steps = [model(tokens[:, t : t + 1], cache=cache) for t in range(4, 12)]
    assert len(calls) == 2 * 9  # two layers: the 4-token prefill and eight one-token steps
    for t, logits in zip(range(4, 12), steps, strict=True):
        for b, pad in enumerate(pads):
            if t >= pad:
                want = model(tokens[b : b + 1, pad : t + 1])[0, -1].detach()
                torch.testing.assert_close(logits[b, -1], want, rtol=1e-4, atol=1e-4)
    assert full.shape == (3, 12, 50)


def test_without_the_extension_pytorch_computes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy(monkeypatch)
    # as when no C compiler was there at install
    monkeypatch.setattr(attention_door, "_attend", None)
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with torch.inference_mode():
        got = attention_door.attention(q, k, v, offset=4)
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert calls == []


def _decoding_attention(threads: int, Tk: int = 144) -> tuple[torch.Tensor, tuple[int, ...]]:
    """A SmolLM2-shaped decoding step's attention (9 query heads over 3 key/value heads of
    64, one query over Tk cached keys) through ``_attend`` with ``threads`` threads: z, and
    the process's pacing counts it added (parallel runs, runs on the caller, windows)."""
    from glassgpt.kernels.extensions import extension

    _attend, _gemv = extension("_attend"), extension("_gemv")
    gen = torch.Generator().manual_seed(Tk)
    q = torch.randn(1, 9, 1, 64, generator=gen)
    k, v = (torch.randn(1, 3, Tk + 16, 64, generator=gen) for _ in range(2))
    z = torch.empty(1, 9, 1, 64)
    strides = (*q.stride(), *k.stride(), *v.stride(), 0, 0, 0, 0, *z.stride())
    before = _gemv.pacing_counts()
    _attend.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), 0, z.data_ptr(), 1, 9, 1, Tk, 64,
                   Tk - 1, strides, threads, 0, 3)  # fmt: skip
    counts = tuple(b - a for a, b in zip(before, _gemv.pacing_counts(), strict=True))
    return z, counts


def _threads_run(_gemv: object) -> bool:
    """Whether a product given two threads runs in parallel here (an OpenMP runtime found)."""
    x, P, y = torch.ones(512), torch.ones(512 * 128), torch.empty(128)
    try:
        _gemv.solo_for(0)  # type: ignore[attr-defined]
        before = _gemv.pacing_counts()[0]  # type: ignore[attr-defined]
        _gemv.gemv_panels(x.data_ptr(), P.data_ptr(), 0, y.data_ptr(), 1, 512, 128, 2)  # type: ignore[attr-defined]
        return _gemv.pacing_counts()[0] > before  # type: ignore[attr-defined]
    finally:
        _gemv.solo_for(0)  # type: ignore[attr-defined]


def test_a_decoding_steps_heads_run_on_two_threads_with_the_one_thread_bits() -> None:
    """At SmolLM2's decoding shape (9 heads, 144 keys) the heads are shared by two threads
    (one thread's 221 KB of cached keys and values read at one core's rate took 20-28 µs a
    layer); each head is one item on one thread either way, so z is the same bits."""
    pytest.importorskip("glassgpt.kernels._gemv")
    from glassgpt.kernels.extensions import extension

    _gemv = extension("_gemv")
    if not _threads_run(_gemv):
        pytest.skip("no OpenMP runtime found: every part runs on the caller")
    try:
        _gemv.solo_for(0)
        parallel, counts = _decoding_attention(2)
    finally:
        _gemv.solo_for(0)
    one, _ = _decoding_attention(1)
    assert counts[0] == 1  # one parallel run (the pacing had nothing against it)
    assert torch.equal(parallel, one)


def test_one_pacing_for_the_process() -> None:
    """A window on one thread that the products' pacing began (``_gemv.solo_for``, as after
    slow parallel runs) holds for the attention too: its parts run one after another on the
    caller, counted in the one pacing's counts (each extension kept a pacing of its own
    before, so the attention kept trying its threads while a held core stalled it)."""
    pytest.importorskip("glassgpt.kernels._gemv")
    from glassgpt.kernels.extensions import extension

    _gemv = extension("_gemv")
    try:
        _gemv.solo_for(10**10)
        solo, counts = _decoding_attention(2)
    finally:
        _gemv.solo_for(0)
    assert counts[:2] == (0, 1)
    one, _ = _decoding_attention(1)
    assert torch.equal(solo, one)
