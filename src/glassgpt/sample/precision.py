"""``glassgpt.sample.precision``: the old home of :mod:`glassgpt.model.precision`, kept as a name.

The inference casts (bf16, int8) moved to ``glassgpt.model``, so that ``glassgpt.load``
(``glassgpt.interop``) and ``eval`` (``glassgpt.train``) cast a model without importing
``sample``, a stage below them. New code imports them from :mod:`glassgpt.model.precision`.
"""

from __future__ import annotations

from glassgpt.model.precision import (
    DTYPES,
    attach_kernels,
    cast,
    parse_dtype,
    perplexity,
    quantize_int8,
)

__all__ = ["DTYPES", "attach_kernels", "cast", "parse_dtype", "perplexity", "quantize_int8"]
