"""Training compute as the scaling law counts it: C ≈ 6 N D.

One forward pass costs about 2 FLOPs per parameter per token (a multiply and an add in each
matrix product) and the backward pass twice that, so training N parameters on D tokens costs
about 6 N D. It leaves out attention's context-dependent term; the exact count per token,
that term included, is :func:`glassgpt.model.accounting.flops_per_token` (whose
``.training`` is 3 × the forward). The law's compute axis, its compute-optimal allocation,
and the ``flops`` a sweep records all use this one definition.
"""

from __future__ import annotations

from typing import Any

FLOPS_PER_PARAM_TOKEN = 6  # 2 forward + 4 backward


def training_flops(n_params: Any, n_tokens: Any) -> Any:
    """C = 6 N D, for numbers or NumPy arrays.

    >>> training_flops(124e6, 1e9)
    7.44e+17
    """
    return float(FLOPS_PER_PARAM_TOKEN) * n_params * n_tokens
