"""Greedy decoding's pick argmax_v (x W_U + b_U)_v, exact, reading W_U mostly as int8.

    A_v = s_v Σ_k x_k q_kv + b_v,   |L_v − A_v| ≤ R_v   (``kernels/_greedy.h``)
    candidates = {v : A_v + R_v ≥ max_u (A_u − R_u)},   pick = first argmax of L over them

A greedy step needs the argmax of its logits L, not the logits. :class:`UnembedInt8` keeps
beside the unembedding's float32 (bf16) panels an int8 copy (one scale per vocabulary row)
and, per row, bounds on its error, so that a step reads W_U's int8 bytes, keeps the rows
whose upper bound reaches the best lower bound, and recomputes only their panels with the
product's own panel kernel: the same bits as the full product's logits there, so the pick,
with ``argmax_rows``' rule (the first largest; None on a NaN or an infinite largest), is
the full product's. Where the candidates would cost more than ``max_panels`` panels (flat
logits: a random-weight model's) the full product is computed instead.

:func:`greedy_call` turns a recorded unembedding call (``_gemv.gemv_panels``, or
``gemv_panels_bf16``: a bf16 model's decoding copy) into that pick
(``glassgpt.sample.replay.GreedySteps`` replays it in place of the product).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from glassgpt.kernels.dense import PANEL
from glassgpt.kernels.extensions import extension

_gemv = extension("_gemv")  # not built: nothing recorded, nothing to take

Call = tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]

BOUNDED, FULL, NO_PICK = 0, 1, 2  # how a step picked (out[M]): see greedy_call


# The most rows of x the int8 pick takes, float32 and bf16 W_U: at one row a step's
# unembedding is bound by its bytes, and the pick reads a quarter (a half) of them; with more
# rows the products turn bound by their multiply-adds, which the int8 pass makes as many of
# (each widened from int8 besides). GPT-2 small's W_U, caches flushed between calls, 2
# threads, loaded host: the pick 0.97-3.0× faster than the full float32 product at 1-6
# rows and 1.06× at 8; than the bf16 one 1.7-3.0× at 1-2 rows, 1.09× at 3, 0.46-0.87× at 4-8.
MAX_ROWS = {False: 4, True: 2}


def unembedding(call: Call) -> tuple[int, int, int, bool] | None:
    """(P's address, K, N, half) of a recorded panels product of one call (float32 x, P
    float32 or bf16) of at most ``MAX_ROWS[half]`` rows, None for any other call."""
    half = _panels_product(call)
    args = call[1]
    if half is None or args[4] > MAX_ROWS[half]:
        return None
    return args[1], args[5], args[6], half


def _panels_product(call: Call) -> bool | None:
    """Whether ``call`` is ``gemv_panels_bf16`` (True) or ``gemv_panels`` (False); None:
    neither."""
    fn, args, positional = call
    if _gemv is None or positional or len(args) != 8:
        return None
    return True if fn is _gemv.gemv_panels_bf16 else False if fn is _gemv.gemv_panels else None


class UnembedInt8:
    """The int8 copy Q [⌈N/64⌉, K, 64] of the panels at ``address`` (W [K, N], float32 or
    ``half``: bf16), one scale per column, and per column the bounds on its error (``meta``
    [4, ⌈N/64⌉·64]: scale, ‖e‖₂, max|e|, γ(s‖q‖₂ + ‖w‖₂), each rounded up)."""

    def __init__(self, address: int, K: int, N: int, half: bool, threads: int) -> None:
        assert _gemv is not None
        self.address, self.K, self.N, self.half = address, K, N, half
        self.panels = -(-N // PANEL)
        self.Q = torch.empty(self.panels * K * PANEL, dtype=torch.int8)
        self.meta = torch.empty(4 * self.panels * PANEL, dtype=torch.float32)
        _gemv.greedy_pack(address, int(half), K, N, self.Q.data_ptr(), self.meta.data_ptr(),
                          threads)  # fmt: skip


def greedy_call(
    call: Call, pack: UnembedInt8, n_valid: int, max_panels: int | None = None
) -> tuple[Call, Any]:
    """The recorded unembedding ``call`` as its greedy pick: (a call to replay in its place,
    out: a NumPy view of int64 [M + 2]), for any rows the panels take (:func:`unembedding`
    says where it pays). After the call out[:M] holds each row's pick and out[M] how: BOUNDED
    (y not written as the product would), FULL (the product computed into y: more
    candidates than ``max_panels`` panels, a quarter of them by default, or something not
    finite) or NO_PICK (the product in y holds a NaN or an infinite largest value: the
    caller samples y as it would have); out[M + 1] the candidates counted."""
    assert _gemv is not None and _panels_product(call) is not None
    x, P, b, y, M, K, N, threads = call[1]
    out = torch.zeros(M + 2, dtype=torch.long)
    limit = max(1, pack.panels // 4) if max_panels is None else max_panels
    args = (x, P, b, y, M, K, N, threads, int(pack.half), pack.Q.data_ptr(),
            pack.meta.data_ptr(), min(n_valid, N), out.data_ptr(), limit)  # fmt: skip
    return (_gemv.greedy_unembed, args, ()), out.numpy()  # (read without PyTorch)


def greedy_variant(name: str | None = None) -> str:
    """Force the int8 pass (``"avx512"``, ``"avx2"``, ``"portable"``; None: the best this CPU
    runs) and return the one in use (tests; no call may be in flight)."""
    assert _gemv is not None
    return _gemv.greedy_variant(name)
