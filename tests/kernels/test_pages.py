"""``glassgpt.kernels.pages``: copies on 2 MiB pages hold the same values, stay valid for the
tensor's life, and the packed weights that decoding streams live there."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from glassgpt.kernels import dense, pages
from glassgpt.kernels.pages import HUGE_PAGE, SHARED_MAX, SHARED_MIN, huge_page_copy

LINUX_THP = hasattr(mmap, "MADV_HUGEPAGE")


def _thp_setting() -> str | None:
    """The system's transparent huge page setting (``always``, ``madvise``, ``never``)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


def _vma(address: int) -> dict[str, str] | None:
    """The fields of /proc/self/smaps for the mapping holding ``address`` (None: unmapped)."""
    fields: dict[str, str] | None = None
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):  # a mapping's first line: lo-hi ...
                lo, hi = (int(a, 16) for a in head.split("-"))
                if fields is not None:
                    return fields
                fields = {"range": head} if lo <= address < hi else None
            elif fields is not None:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    return fields


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
def test_large_copy_starts_on_a_huge_page_and_outlives_its_mapping_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pages, "_slab", None)  # a fresh slab (KV caches carve from them too)
    t = torch.randn(2 * HUGE_PAGE // 4 + 17)
    c = huge_page_copy(t)
    assert c.data_ptr() % HUGE_PAGE == 0
    gc.collect()  # the mapping lives as long as the tensor does
    c.mul_(2.0)
    assert torch.equal(c, t * 2.0)


@pytest.mark.skipif(
    not LINUX_THP or _thp_setting() not in ("always", "madvise"),
    reason="no transparent huge pages to advise on this system",
)
def test_thin_matrices_share_a_mapping_on_huge_pages_freed_with_the_last_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SmolLM2's bf16 matrices are 0.66-1.8 MB: each under a 2 MiB page of its own
    monkeypatch.setattr(pages, "_slab", None)  # a fresh slab: both fit in it
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randn(576, n, generator=gen).bfloat16() for n in (576, 1536))
    assert SHARED_MIN <= a.nbytes < b.nbytes < SHARED_MAX
    ca, cb = huge_page_copy(a), huge_page_copy(b)
    assert torch.equal(ca, a) and torch.equal(cb, b)
    vma, vmb = _vma(ca.data_ptr()), _vma(cb.data_ptr())
    assert vma is not None and vmb is not None
    assert vma["range"] == vmb["range"]  # one mapping for both
    assert vma["THPeligible"] == "1"
    cb.zero_()  # neighbours, not overlapping
    assert torch.equal(ca, a)
    del ca
    gc.collect()
    assert torch.equal(cb, torch.zeros_like(b))  # the slab lives while one of its tensors does
    address = cb.data_ptr()
    del cb
    gc.collect()
    assert _vma(address) is None  # and no longer


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


def test_huge_page_zeros_elsewhere_are_plain_zeros() -> None:
    t = pages.huge_page_zeros((3, 4), torch.float64, "meta")
    assert t.device.type == "meta" and t.shape == (3, 4) and t.dtype == torch.float64
    small = pages.huge_page_zeros((5,), torch.int64)  # under SHARED_MIN: an ordinary tensor
    assert torch.equal(small, torch.zeros(5, dtype=torch.int64))
