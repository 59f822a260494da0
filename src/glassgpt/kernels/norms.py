"""The norms over the last axis (d values, ε = eps), by the fastest kernel for the input:

    LayerNorm(x) = (x − μ(x)) · s(x) ⊙ w + b,   s(x) = 1/√(σ²(x) + ε)   (σ² biased)
    RMSNorm(x)   = x · s(x) ⊙ w,                s(x) = 1/√(mean(x²) + ε)

A decoding step's few float32 rows take glassgpt's own kernel (``glassgpt.kernels.rowwise``,
without PyTorch's per-call set-up); everything else ``F.layer_norm`` and ``F.rms_norm``.
The two differ only in rounding.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from glassgpt.kernels import rowwise


def layer_norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float) -> Tensor:
    """(x − μ) · s ⊙ w + b over the last axis of x [..., d] (w, b [d]; b None: no bias)."""
    if rowwise.few_rows(x, w, b):
        return rowwise.norm(x, w, b, eps, centred=True)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """x · s ⊙ w over the last axis of x [..., d] (w [d])."""
    if rowwise.few_rows(x, w):
        return rowwise.norm(x, w, None, eps, centred=False)
    return F.rms_norm(x, (x.shape[-1],), w, eps)
