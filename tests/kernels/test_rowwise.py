"""glassgpt's kernels for a decoding step's few rows (``glassgpt.kernels._rowwise``): the norms
and the tanh GELU against float64 NumPy formulas and PyTorch's kernels (stated tolerances),
odd sizes, both the AVX2 and the portable loops; the KV-cache write against narrow + copy_;
and the seams' routing (few float32 rows without autograd take them, everything else PyTorch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import activations, norms, rowwise, sampling
from glassgpt.kernels.rowwise import MAX_ROWS, few_rows

ext = pytest.importorskip(
    "glassgpt.kernels._rowwise", reason="the C extension is not built (no compiler at install)"
)


@pytest.fixture(params=[False, True], ids=["fast", "portable"])
def portable(request: pytest.FixtureRequest):
    assert ext.use_portable(request.param) == ("portable" if request.param else ext.kernel())
    yield request.param
    ext.use_portable(False)


def _norm_np(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float, centred: bool):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True) if centred else 0.0
    s = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return (x - mu) * s * w + (0.0 if b is None else b)


def _gelu_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, MAX_ROWS),
    d=st.integers(1, 200),
    centred=st.booleans(),
    bias=st.booleans(),
    shift=st.sampled_from([0.0, 5.0]),
    fast=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_norm_is_the_formula_and_pytorchs(rows, d, centred, bias, shift, fast, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=gen) * 3 + shift
    w = torch.randn(d, generator=gen)
    b = torch.randn(d, generator=gen) if bias and centred else None  # RMSNorm has no bias
    ext.use_portable(not fast)
    try:
        with torch.no_grad():
            got = rowwise.norm(x, w, b, 1e-5, centred=centred)
    finally:
        ext.use_portable(False)
    b_np = None if b is None else b.numpy()
    want = _norm_np(x.numpy(), w.numpy(), b_np, 1e-5, centred)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=2e-5)
    if centred:
        torch.testing.assert_close(got, F.layer_norm(x, (d,), w, b, 1e-5), rtol=1e-5, atol=2e-5)
    else:
        torch.testing.assert_close(got, F.rms_norm(x, (d,), w, 1e-5), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 3072, 3075])
def test_gelu_is_the_tanh_formula_and_pytorchs(n: int, portable: bool) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * 4
    x[: min(n, 6)] = torch.tensor([0.0, -12.0, 12.0, -40.0, 40.0, -0.5])[: min(n, 6)]  # tails
    with torch.no_grad():
        got = rowwise.gelu_tanh(x)
    np.testing.assert_allclose(got.numpy(), _gelu_np(x.numpy()), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(got, F.gelu(x, approximate="tanh"), rtol=2e-6, atol=2e-6)


def test_gelu_and_norm_keep_nan_and_inf(portable: bool) -> None:
    x = torch.tensor([float("nan"), float("inf"), 1.0, -2.0] * 3)
    with torch.no_grad():
        y = rowwise.gelu_tanh(x)
        n = rowwise.norm(x[None], torch.ones(12), None, 1e-5, centred=True)
    assert y[0].isnan() and y[1] == float("inf")
    torch.testing.assert_close(y[2:4], F.gelu(x[2:4], approximate="tanh"), rtol=2e-6, atol=2e-6)
    assert n.isnan().all()  # as F.layer_norm: a non-finite value spoils its whole row


def test_few_rows_takes_only_float32_inference_rows_it_can_read() -> None:
    x, w = torch.randn(2, 1, 16), torch.ones(16)
    with torch.no_grad():
        assert few_rows(x, w, None) and few_rows(x)
        assert not few_rows(torch.randn(MAX_ROWS + 1, 16), w)  # many rows: PyTorch's threads
        assert not few_rows(x.double(), w.double())
        assert not few_rows(x.transpose(0, 2))  # not contiguous
        assert not few_rows(x, torch.ones(15))  # a parameter of the wrong size
        assert not few_rows(x, w.double())
        assert not few_rows(torch.randn(0, 16)) and not few_rows(torch.tensor(1.0))
    assert not few_rows(x, w)  # autograd on


def test_the_seams_take_the_kernel_for_few_rows_and_pytorch_otherwise(monkeypatch) -> None:
    calls: list[str] = []
    norm, gelu = rowwise.norm, rowwise.gelu_tanh
    monkeypatch.setattr(rowwise, "norm", lambda *a, **k: calls.append("norm") or norm(*a, **k))
    monkeypatch.setattr(rowwise, "gelu_tanh", lambda x: calls.append("gelu") or gelu(x))
    x, w, b = torch.randn(1, 1, 24), torch.randn(24), torch.randn(24)
    with torch.inference_mode():
        ln, rms = norms.layer_norm(x, w, b, 1e-5), norms.rms_norm(x, w, 1e-6)
        g = activations.gelu_tanh(x)
    assert calls == ["norm", "norm", "gelu"]
    torch.testing.assert_close(g, F.gelu(x, approximate="tanh"), rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(ln, F.layer_norm(x, (24,), w, b, 1e-5), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(rms, F.rms_norm(x, (24,), w, 1e-6), rtol=1e-5, atol=2e-5)
    calls.clear()
    x.requires_grad_(True)  # training: PyTorch's kernels, which autograd can go through
    norms.layer_norm(x, w, b, 1e-5).sum().backward()
    assert x.grad is not None and calls == []


def test_without_the_extension_the_seams_use_pytorch(monkeypatch) -> None:
    monkeypatch.setattr(rowwise, "_rowwise", None)
    x, w = torch.randn(1, 8), torch.randn(8)
    with torch.no_grad():
        assert not few_rows(x, w)
        assert torch.equal(norms.layer_norm(x, w, None, 1e-5), F.layer_norm(x, (8,), w, None))
        K, V = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
        k = torch.randn(1, 2, 1, 8)
        rowwise.write_kv(K, V, k, 2 * k, 3)
    assert torch.equal(K[:, :, 3:], k) and torch.equal(V[:, :, 3:], 2 * k)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 4),
    T=st.integers(1, MAX_ROWS + 2),
    D=st.integers(1, 20),
    room=st.integers(0, 5),
    layout=st.sampled_from(["BHTD", "BTHD", "fused"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_write_kv_is_narrow_and_copy(B, H, T, D, room, layout, dtype, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = room
    cap = n + T + 2
    K, V = torch.randn(B, H, cap, D, generator=gen), torch.randn(B, H, cap, D, generator=gen)
    K, V = K.to(dtype), V.to(dtype)
    if layout == "BHTD":
        k, v = (torch.randn(B, H, T, D, generator=gen, dtype=dtype) for _ in range(2))
    elif layout == "BTHD":  # the model's transposed views
        k, v = (torch.randn(B, T, H, D, generator=gen, dtype=dtype).transpose(1, 2)
                for _ in range(2))  # fmt: skip
    else:  # q|k|v of one product, read as [3, B, H, T, D]
        qkv = torch.randn(B, T, 3, H, D, generator=gen, dtype=dtype).permute(2, 0, 3, 1, 4)
        k, v = qkv[1], qkv[2]
    want_K, want_V = K.clone(), V.clone()
    want_K.narrow(2, n, T).copy_(k)
    want_V.narrow(2, n, T).copy_(v)
    with torch.no_grad():
        rowwise.write_kv(K, V, k, v, n)
    assert torch.equal(K, want_K) and torch.equal(V, want_V)


def test_write_kv_past_the_capacity_raises_as_narrow_does() -> None:
    K, V = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8)
    with torch.no_grad(), pytest.raises(RuntimeError):
        rowwise.write_kv(K, V, torch.ones(1, 1, 2, 8), torch.ones(1, 1, 2, 8), 3)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40_000), min_size=0, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_sum_squares_is_the_float64_sum_for_any_thread_count(sizes: list[int], seed: int) -> None:
    """Buffers of any length (empty, one value, over a chunk of 16,384): Σ x² as float64 NumPy
    sums it, and bit for bit the same on 1, 2 and 3 threads."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(n, generator=gen) * 3 for n in sizes]
    want = sum(float((t.double().numpy() ** 2).sum()) for t in tensors)
    before = torch.get_num_threads()
    got = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            got.append(rowwise.sum_squares(tensors))
    finally:
        torch.set_num_threads(before)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert got[0] == got[1] == got[2]


def test_sum_squares_and_scale_take_the_portable_loops_too(portable: bool) -> None:
    tensors = [torch.randn(5, 7), torch.randn(33_000), torch.randn(1)]
    want = sum(float(t.double().square().sum()) for t in tensors)
    assert rowwise.sum_squares(tensors) == pytest.approx(want, rel=1e-12)
    copies = [t.clone() for t in tensors]
    assert rowwise.scale_(tensors, 0.3)
    for t, c in zip(tensors, copies, strict=True):
        assert torch.equal(t, c * torch.tensor(0.3, dtype=torch.float32))  # float32 c, one product


def test_sum_squares_keeps_nan_and_inf_and_refuses_what_it_cannot_read() -> None:
    assert math.isnan(rowwise.sum_squares([torch.ones(3), torch.tensor([math.nan])]))
    assert rowwise.sum_squares([torch.tensor([math.inf, 1.0])]) == math.inf
    assert rowwise.sum_squares([]) == 0.0
    for other in (
        torch.ones(4, 4).t(),
        torch.ones(3, dtype=torch.float64),
        torch.ones(3).bfloat16(),
    ):
        assert rowwise.sum_squares([torch.ones(3), other]) is None
        assert not rowwise.scale_([other], 2.0)
    with pytest.raises(TypeError, match="equal length"):
        ext.sum_squares((0,), (), 1)
    with pytest.raises(ValueError, match="lengths >= 0"):
        ext.scale_many((torch.ones(1).data_ptr(),), (-1,), 2.0, 1)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(0, 70), cols=st.integers(0, 70), threads=st.integers(1, 3))
def test_transposed_is_numpys_transpose_for_any_shape(rows: int, cols: int, threads: int) -> None:
    """Shapes on and off the 8 × 8 blocks (and empty), split among 1-3 threads: every value
    lands where NumPy's transpose puts it, on the AVX2 blocks and the portable loop alike."""
    x = torch.randn(rows, cols)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for portable_loop in (False, True):
            ext.use_portable(portable_loop)
            y = rowwise.transposed(x)
            assert y.shape == (cols, rows) and y.is_contiguous()
            np.testing.assert_array_equal(y.numpy(), x.numpy().T)
    finally:
        ext.use_portable(False)
        torch.set_num_threads(before)


def test_transposed_refuses_what_it_cannot_read() -> None:
    for other in (torch.ones(4, 6).t(), torch.ones(3, 4, 5), torch.ones(3, 4).double()):
        assert rowwise.transposed(other) is None
    with pytest.raises(ValueError, match="rows >= 0"):
        ext.transpose(0, 0, -1, 3, 1)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 45), cols=st.integers(1, 45), heads=st.sampled_from([1, 3]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    to=st.sampled_from([None, torch.float32, torch.float64]), threads=st.integers(1, 3),
)  # fmt: skip
def test_contiguous_copy_is_the_views_values(rows, cols, heads, dtype, to, threads) -> None:
    """An HF weight's views as the importer takes them (``W.T`` and ``W.T.unflatten(0, (H,
    d))``, 16-bit or float32, cast or not), on and off the 8 × 8 blocks and split among 1-3
    threads: the copy is contiguous and holds the view's values, bit for bit, on the SSE2/AVX2
    blocks and the portable loops alike (a cast takes ``copy_``)."""
    W = torch.randn(rows, cols * heads).to(dtype)
    want_dtype = to or dtype
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for view in (W.T, W.T.unflatten(0, (heads, cols)), W[:, :cols].T):
            want = view.to(want_dtype).contiguous()
            for portable_loop in (False, True):
                ext.use_portable(portable_loop)
                got = rowwise.contiguous_copy(view, want_dtype)
                assert got.is_contiguous() and got.dtype == want_dtype
                assert torch.equal(got, want)
    finally:
        ext.use_portable(False)
        torch.set_num_threads(before)


def test_contiguous_copy_of_anything_else_is_copy() -> None:
    for t in (torch.arange(12.0).view(3, 4), torch.arange(24.0).view(2, 3, 4).permute(1, 0, 2),
              torch.arange(6, dtype=torch.int32).view(2, 3).T):  # fmt: skip
        got = rowwise.contiguous_copy(t, t.dtype)
        assert got.is_contiguous() and torch.equal(got, t) and got.data_ptr() != t.data_ptr()
    with pytest.raises(ValueError, match="rows >= 0"):
        ext.transpose16(0, 0, -1, 3, 1)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    V=st.integers(1, 150),
    cut=st.integers(0, 20),
    levels=st.integers(1, 6),
    special=st.sampled_from(["none", "nan", "inf", "-inf", "all -inf"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_argmax_rows_is_numpys_first_largest(rows, V, cut, levels, special, seed) -> None:
    """Few distinct values (many ties), row lengths on and off the 8-wide lanes, over the
    first n = V − cut values of rows V apart: each row's id is NumPy's argmax of those (its
    first largest value), on the AVX2 lanes and the portable loop alike; a row with a NaN or
    an infinite largest value among them sends every row to PyTorch (None)."""
    rng = np.random.default_rng(seed)
    z = rng.integers(-levels, levels, size=(rows, V)).astype(np.float32)
    r, i = rng.integers(rows), rng.integers(V)
    if special == "all -inf":
        z[r] = -np.inf
    elif special != "none":
        z[r, i] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[special]
    n = max(1, V - cut)
    seen = z[:, :n]
    finite = not np.isnan(seen).any() and np.isfinite(seen.max(-1)).all()
    try:
        for portable_loop in (False, True):
            ext.use_portable(portable_loop)
            ids = sampling.argmax_rows(torch.from_numpy(z), n)
            if not finite:
                assert ids is None
            else:
                assert ids == seen.argmax(-1).tolist()
                assert ids == torch.from_numpy(seen).max(-1).indices.tolist()
    finally:
        ext.use_portable(False)


def test_argmax_rows_refuses_what_it_cannot_read() -> None:
    for other in (torch.ones(4, 6).t(), torch.ones(3), torch.ones(3, 4).double(), torch.ones(2, 0)):
        assert sampling.argmax_rows(other) is None
    assert sampling.argmax_rows(torch.ones(3, 4), 0) is None
    with pytest.raises(ValueError, match="0 < V <= stride"):
        ext.argmax_rows(0, 1, 0, 4)
    with pytest.raises(ValueError, match="0 < V <= stride"):
        ext.argmax_rows(0, 2, 5, 4)
