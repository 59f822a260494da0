"""``glassgpt.kernels.pages``: copies on 2 MiB pages hold the same values, stay valid for the
tensor's life, and the packed weights that decoding streams live there."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from glassgpt.kernels import dense
from glassgpt.kernels.pages import HUGE_PAGE, huge_page_copy

LINUX_THP = hasattr(mmap, "MADV_HUGEPAGE")


@pytest.mark.parametrize(
    "shape, dtype",
    [((3, 5), torch.float32), ((1024, 1031), torch.float32), ((777, 4099), torch.int8)],
)
def test_copy_has_the_values_shape_and_dtype(shape: tuple[int, int], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    t = torch.randint(-100, 100, shape, generator=gen).to(dtype)
    c = huge_page_copy(t.T)  # a non-contiguous source
    assert torch.equal(c, t.T) and c.dtype == dtype and c.is_contiguous()
    assert c.data_ptr() != t.data_ptr()


@pytest.mark.skipif(not LINUX_THP, reason="no MADV_HUGEPAGE on this system")
def test_large_copy_starts_on_a_huge_page_and_outlives_its_mapping_object() -> None:
    t = torch.randn(2 * HUGE_PAGE // 4 + 17)
    c = huge_page_copy(t)
    assert c.data_ptr() % HUGE_PAGE == 0
    gc.collect()  # the mapping lives as long as the tensor does
    c.mul_(2.0)
    assert torch.equal(c, t * 2.0)


@pytest.mark.skipif(dense._gemv is None, reason="the _gemv extension is not built")
def test_pack_moves_streamed_weights_without_changing_them() -> None:
    gen = torch.Generator().manual_seed(1)
    W = torch.nn.Parameter(torch.randn(768, 1024, generator=gen))  # [d_in, d_out]: read live
    before = W.detach().clone()
    x = torch.randn(2, 768, generator=gen)
    assert dense.pack(W)
    if LINUX_THP:
        assert W.data_ptr() % HUGE_PAGE == 0
    assert torch.equal(W.detach(), before)
    with torch.no_grad():
        torch.testing.assert_close(dense.matmul(x, W), x @ before, rtol=1e-5, atol=1e-4)
    dense.unpack(W)
