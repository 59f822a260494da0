"""The matmul seam: packed copies are used only while their weight is unchanged, and never
under autograd; every path computes x W + b (checked against float64 products)."""

from __future__ import annotations

import gc

import pytest
import torch

from glassgpt.kernels import dense, is_packed, matmul, pack, unpack


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 24, generator=gen)
    W = torch.randn(24, 40, generator=gen)  # [d_in, d_out]
    b = torch.randn(40, generator=gen)
    return x, W, b


@pytest.mark.parametrize("transposed", [False, True])
def test_packed_float32_product_is_x_w_plus_b(transposed: bool) -> None:
    x, W, b = _weights()
    stored = W.T.contiguous() if transposed else W  # [d_out, d_in] when transposed
    want = x.double() @ W.double() + b.double()
    assert pack(stored, transposed=transposed) and is_packed(stored, transposed=transposed)
    assert not is_packed(stored, transposed=not transposed)  # orientation is part of the key
    with torch.no_grad():
        got = matmul(x, stored, b, transposed=transposed)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    unpack(stored)
    assert not is_packed(stored, transposed=transposed)


def test_stale_packed_copy_is_never_used(monkeypatch) -> None:
    x, W, b = _weights(1)
    W.requires_grad_(True)
    assert pack(W)
    calls = []
    real = dense._packed
    monkeypatch.setattr(dense, "_packed", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        matmul(x, W, b)
        W.mul_(2.0)  # in place: the packed copy is stale
        assert not is_packed(W)
        got = matmul(x, W, b)
    torch.testing.assert_close(got, x @ W.detach() + b, rtol=1e-5, atol=1e-5)
    n = len(calls)
    y = matmul(x, W, b)  # autograd: the registry is not even consulted
    assert len(calls) == n and y.requires_grad


def test_registry_forgets_a_collected_weight() -> None:
    _, W, _ = _weights(2)
    assert pack(W)
    key = id(W)
    assert key in dense._PACKED
    del W
    gc.collect()
    assert key not in dense._PACKED
