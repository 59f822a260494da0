"""Products of many rows on a packed float32 W (a server's batched steps and its prompts): a
row's product does not depend on the rows beside it where the panels take several rows
(AVX-512F), every CPU variant forced in turn; and the row counts that reach oneDNN over
products of every row count are few (each count it sees costs memory kept for good)."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import dense, matmul, onednn, pack, unpack
from glassgpt.kernels.extensions import extension

_gemv = extension("_gemv")

# a 10.7M model's W_QKV and W_out, and an unembedding's partial last panel (65 outputs)
SHAPES = [(384, 1152), (1536, 384), (384, 65)]


@pytest.mark.skipif(_gemv is None or not _gemv.has_avx2(), reason="no AVX2 kernels here")
@pytest.mark.parametrize("variant", ["widest", "avx2", "portable"])
def test_a_rows_product_is_its_own_among_other_rows(variant: str) -> None:
    """With the AVX-512F panels (32 rows a call) every row count up to ``PANEL_BLOCK_ROWS``
    gives each row the bits of its product alone (one-row steps and batched steps agree);
    with the AVX2 or portable ones (one row a call) a row among 2-32 rows (the rows kernel)
    has the bits it has among any other 2-32, near float64 either way."""
    gen = torch.Generator().manual_seed(45)
    try:
        _gemv.use_portable(variant == "portable")
        _gemv.wide_registers(variant == "widest")
        blocks = _gemv.panels_rows() > 1
        for d_in, d_out in SHAPES:
            W, b = torch.randn(d_in, d_out, generator=gen), torch.randn(d_out, generator=gen)
            x = torch.randn(dense.PANEL_BLOCK_ROWS, d_in, generator=gen)
            assert pack(W)
            with torch.no_grad():
                if blocks:
                    want = torch.cat([matmul(x[i : i + 1], W, b) for i in range(len(x))])
                    counts = (2, 8, 9, 16, 17, 24, 32, 33, 48, dense.PANEL_BLOCK_ROWS)
                else:
                    want = torch.cat([matmul(x[i : i + 2], W, b)[:1] for i in range(31)])
                    counts = (2, 9, 16, 24, 31)
                for M in counts:
                    rows = min(M, len(want))
                    got = matmul(x[:M], W, b)[:rows]
                    assert torch.equal(got, want[:rows]), (variant, d_in, d_out, M)
            unpack(W)
            ref = x[: len(want)].double() @ W.double() + b.double()
            torch.testing.assert_close(want.double(), ref, rtol=1e-5, atol=1e-6 * d_in**1.5)
    finally:
        _gemv.use_portable(False)
        _gemv.wide_registers(True)


@pytest.mark.skipif(onednn._KERNEL is None, reason="PyTorch has no oneDNN linear kernel here")
@pytest.mark.parametrize("packed", [False, True])
def test_onednn_sees_few_row_counts_over_every_prompt_length(
    packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Products of every row count 1-256 (a server's prompts a forward) and a few past it
    reach oneDNN at ``bucket_rows`` counts (16 an octave, not one each), and each is still
    x W + b: the padding rows are dropped."""
    monkeypatch.setattr(onednn, "ONEDNN_PREFERRED", True)
    monkeypatch.setattr(onednn, "MIN_MACS", 0)  # a narrow W (a fast test) at every count
    seen: list[int] = []
    kernel = onednn._KERNEL
    monkeypatch.setattr(
        onednn, "_KERNEL", lambda a, *rest: seen.append(a.shape[0]) or kernel(a, *rest)
    )
    gen = torch.Generator().manual_seed(600)
    W, b = torch.randn(16, 48, generator=gen), torch.randn(48, generator=gen)
    x = torch.randn(600, 16, generator=gen)
    ref = x.double() @ W.double() + b.double()
    counts = [*range(1, 257), 300, 400, 511, 600]
    if packed:
        assert pack(W)
    with torch.no_grad():
        for M in counts:
            got = matmul(x[:M].view(M, 1, 16), W, b)
            assert got.shape == (M, 1, 48)
            if M % 37 == 0 or M in (33, 65, 300, 600):
                torch.testing.assert_close(got.view(M, 48).double(), ref[:M], rtol=1e-5,
                                           atol=1e-4)  # fmt: skip
    unpack(W)
    assert seen and set(seen) <= {onednn.bucket_rows(M) for M in counts}
    assert len(set(seen)) <= 16 * (600).bit_length()  # 16 an octave (every count: 259)
