"""What bench/generate.py prints beside its figures: each precision's decoding path on this
CPU (``glassgpt.kernels.cpu_paths``), following the kernels actually in use as each variant
is forced, as the kernels' own tests force them."""

from __future__ import annotations

import pytest

from glassgpt import kernels
from glassgpt.kernels import policy
from glassgpt.kernels.extensions import extension


def test_cpu_flags_are_the_kernel_flags_linux_lists() -> None:
    flags = policy.cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo here")
    assert policy.native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    gemv = extension("_gemv")
    if gemv is not None and "avx2" in flags and "fma" in flags:
        assert gemv.has_avx2()


def test_cpu_paths_follow_the_forced_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    gemv = extension("_gemv")
    if gemv is None or not gemv.has_avx2():
        pytest.skip("glassgpt's AVX2 kernels are not in use here")
    wide = gemv.wide_registers(True)
    try:
        first = kernels.cpu_paths()["float32"]
        assert first == ("AVX-512F panels" if wide else "AVX2+FMA panels")
        gemv.wide_registers(False)
        assert kernels.cpu_paths()["float32"] == "AVX2+FMA panels"
        gemv.use_portable(True)
        paths = kernels.cpu_paths()
        assert paths["float32"] == "portable loops" and "portable loops" in paths["bf16"]
    finally:
        gemv.use_portable(False)
        gemv.wide_registers(True)
    with kernels.hidden("_gemv", "_int8"):
        paths = kernels.cpu_paths()
        assert paths["float32"] == "PyTorch (no _gemv)" and "no _int8" in paths["int8"]
    for native, prompts in ((True, "oneDNN bf16 prompts"), (False, "float32 prompts")):
        monkeypatch.setattr(policy, "native_bf16", lambda native=native: native)
        assert kernels.cpu_paths()["bf16"].endswith(prompts)
