"""The decoding kernels of the decoder-only families: the RoPE rotation (``rowwise.rope``)
against PyTorch's pair-by-pair rotation bit for bit (its complex product, which fuses some
multiply-adds, to an ulp); SiLU (both loops) against
the float64 formula and ``F.silu``; RMS norms over a step's q or k heads read in place; the
decoding attention with grouped key/value heads, a scale, a soft cap and a sliding window
against a float64 oracle; and each seam without its extension (PyTorch's operations)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.kernels import activations, attention_door, norms, rowwise
from glassgpt.model.layers import apply_rope

ext = pytest.importorskip(
    "glassgpt.kernels._rowwise", reason="the C extension is not built (no compiler at install)"
)


def _pairs_rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """PyTorch's pair-by-pair rotation of the first r dims (each product rounded, then summed)."""
    r = 2 * cos.shape[-1]
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    pairs = x[..., :r].unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([rot, x[..., r:]], dim=-1)


def _complex_rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    r = 2 * cos.shape[-1]
    z = torch.view_as_complex(x[..., :r].contiguous().unflatten(-1, (-1, 2)))
    w = torch.complex(cos, sin).unsqueeze(-2)
    return torch.cat([torch.view_as_real(z * w).flatten(-2), x[..., r:]], dim=-1)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 4),
    H=st.integers(1, 12),
    D=st.sampled_from([2, 8, 16, 64, 128]),
    fraction=st.sampled_from([1.0, 0.5, 0.25]),
    per_row=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rope_is_pytorchs_pair_rotation_bit_for_bit(B, H, D, fraction, per_row, strided, seed):
    g = torch.Generator().manual_seed(seed)
    half = max(1, int(D * fraction) // 2)
    wide = torch.randn(B, 1, H + 3 if strided else H, D, generator=g)
    x = wide[:, :, :H]  # q inside a step's qkv: the batch rows apart
    angles = torch.rand(B if per_row else 1, half, generator=g, dtype=torch.float64) * 50
    cos, sin = angles.cos().float(), angles.sin().float()
    if per_row:
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, r/2]
    with torch.inference_mode():
        got = rowwise.rope(x, cos, sin)
    assert got is not None and got.is_contiguous()
    assert torch.equal(got, _pairs_rotated(x, cos, sin))
    torch.testing.assert_close(got, _complex_rotated(x, cos, sin), rtol=1e-6, atol=1e-6)


def test_rope_refuses_what_it_cannot_read_and_apply_rope_falls_back() -> None:
    x, cos, sin = torch.randn(1, 2, 3, 8), torch.randn(2, 4), torch.randn(2, 4)
    with torch.inference_mode():
        assert rowwise.rope(x, cos, sin) is None  # two positions: a prompt's, PyTorch's
        assert rowwise.rope(x[:, :1].double(), cos[:1].double(), sin[:1].double()) is None
    assert rowwise.rope(x[:, :1], cos[:1], sin[:1]) is None  # autograd on
    assert torch.equal(apply_rope(x, cos, sin), _complex_rotated(x, cos, sin))


def test_without_the_extension_rope_silu_and_the_head_norms_are_pytorchs(monkeypatch) -> None:
    x, cos, sin = torch.randn(1, 1, 3, 8), torch.randn(1, 4), torch.randn(1, 4)
    w = torch.rand(8) + 0.5
    with torch.inference_mode():
        want_rope = apply_rope(x, cos, sin)
        monkeypatch.setattr(rowwise, "_rowwise", None)
        assert rowwise.rope(x, cos, sin) is None and not rowwise.few_heads(x, w)
        assert torch.equal(apply_rope(x, cos, sin), _complex_rotated(x, cos, sin))
        torch.testing.assert_close(want_rope, _complex_rotated(x, cos, sin))
        y = torch.randn(2, 40)
        assert torch.equal(activations.silu(y), F.silu(y))
        assert torch.equal(norms.rms_norm(x, w, 1e-6), F.rms_norm(x, (8,), w, 1e-6))


@pytest.mark.parametrize("portable", [False, True], ids=["fast", "portable"])
@pytest.mark.parametrize("n", [1, 7, 8, 13, 3072])
def test_silu_is_the_formula_and_pytorchs(n: int, portable: bool) -> None:
    x = torch.cat([torch.randn(n - 1) * 6, torch.tensor([-100.0])])[:n].reshape(1, n)
    try:
        ext.use_portable(portable)
        with torch.inference_mode():
            got = activations.silu(x)
    finally:
        ext.use_portable(False)
    x64 = x.double().numpy()
    want = x64 / (1.0 + np.exp(-x64))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-6, atol=1e-30)
    torch.testing.assert_close(got, F.silu(x), rtol=2e-6, atol=1e-7)


def test_the_head_norms_read_q_in_place_and_are_the_rms_norm() -> None:
    B, H, G, d = 3, 16, 8, 128  # Qwen3's heads
    qkv = torch.randn(B, 1, H + 2 * G, d)
    q = qkv[:, :, :H]
    w = torch.rand(d) + 0.5
    with torch.inference_mode():
        assert rowwise.few_heads(q, w)
        got = norms.rms_norm(q, w, 1e-6)
    torch.testing.assert_close(got, F.rms_norm(q, (d,), w, 1e-6), rtol=1e-6, atol=1e-6)


def _oracle(q, k, v, allowed, scale, cap) -> np.ndarray:
    """softmax(cap(q kᵀ · scale) + M) v in float64 over [B, H, Tq, ...]; k, v repeated."""
    q64, k64, v64 = (t.double().numpy() for t in (q, k, v))
    s = q64 @ k64.swapaxes(-1, -2) * scale
    if cap:
        s = cap * np.tanh(s / cap)
    s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v64


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    G=st.integers(1, 3),
    ratio=st.sampled_from([1, 2, 3, 4]),
    n=st.integers(1, 40),
    D=st.sampled_from([8, 12, 16, 24, 64]),  # 12: the plain C loop (D not a multiple of 8)
    scale=st.sampled_from([None, 0.05, 0.3]),
    cap=st.sampled_from([None, 2.0, 50.0]),
    window=st.sampled_from([None, 1, 3, 16]),
    seed=st.integers(0, 2**16),
)
def test_the_decoding_attention_with_groups_scale_cap_and_window_is_the_formula(
    B, G, ratio, n, D, scale, cap, window, seed
) -> None:
    g = torch.Generator().manual_seed(seed)
    H = G * ratio
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = torch.randn(B, G, n, D, generator=g), torch.randn(B, G, n, D, generator=g)
    with torch.inference_mode():
        z = attention_door.step_attention(q, k, v, n - 1, None, scale=scale, cap=cap,
                                          window=window)  # fmt: skip
    assert z is not None
    keys = np.arange(n)
    allowed = keys <= n - 1
    if window is not None:
        allowed &= keys > n - 1 - window
    a = 1 / math.sqrt(D) if scale is None else scale
    kr, vr = k.repeat_interleave(ratio, 1), v.repeat_interleave(ratio, 1)
    want = _oracle(q, kr, vr, allowed, a, cap)
    np.testing.assert_allclose(z.double().numpy(), want, rtol=1e-4, atol=2e-5)


def test_step_attention_leaves_what_it_cannot_take_to_the_caller(monkeypatch) -> None:
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 1, 4, 8)
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    with torch.inference_mode():
        assert attention_door.step_attention(q, k, k, 3, mask, cap=5.0) is None
        assert attention_door.step_attention(q.double(), k.double(), k.double(), 3, None) is None
        monkeypatch.setattr(attention_door, "_attend", None)
        assert attention_door.step_attention(q, k, k, 3, None, cap=5.0) is None
        # and the plain seam repeats the groups itself: PyTorch's attention
        got = attention_door.attention(q, k, k, 3)
    want = F.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), k.repeat(1, 2, 1, 1))
    torch.testing.assert_close(got, want)
