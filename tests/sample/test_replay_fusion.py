"""A replayed step's fused calls (glassgpt.kernels.fusion): in a SwiGLU model at a width where
the products run on two threads and split panels between them (576 = 9 panels of 64), every
block's W_O and W_out product takes its residual sum along, and W_in, W_gate, the SiLU and the
gated product are one call. The replay still equals the eager step bit for bit, float32 and
bf16 weights (the decoding copy's bf16 panels under float32 activations)."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import extension, rowwise
from glassgpt.model import precision
from glassgpt.model.precision import decoding_copy
from glassgpt.sample.replay import ReplayedStep

from .test_replay import model_of, prefilled, replay_against_eager

_gemv = extension("_gemv")
pytestmark = pytest.mark.skipif(
    not rowwise.built() or _gemv is None, reason="glassgpt's kernels are not built"
)

SWIGLU = {"positional": "rope", "norm": "rmsnorm", "bias": False, "mlp": "swiglu",
          "n_kv_heads": 2, "d_model": 128, "d_mlp": 576, "n_heads": 4}  # fmt: skip


def _model(dtype: str, monkeypatch: pytest.MonkeyPatch):
    if dtype == "float32":
        return model_of("float32", **SWIGLU)
    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)  # (small: bf16 panels all the same)
    found = decoding_copy(model_of("bf16", **SWIGLU))
    assert found is not None
    return found[0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_fused_replay_equals_the_eager_steps_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, dtype: str, threads: int
) -> None:
    model = _model(dtype, monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prompt = torch.tensor([[1, 2, 3]])
        step, _ = ReplayedStep.record(model, prefilled(model, prompt), torch.tensor([[4]]))
        assert step is not None, ReplayedStep.why_not
        fns = [fn for fn, _, _ in step.calls]
        L = model.config.n_layers
        assert fns.count(_gemv.gemv_panels_glu) == L and fns.count(_gemv.gemv_panels_add) == 2 * L
        assert extension("_rowwise").silu not in fns
        replay_against_eager(model, steps=12)
    finally:
        torch.set_num_threads(before)
