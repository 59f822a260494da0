"""A decoding step's position-wise maps on its few rows, by ``glassgpt.kernels._rowwise``:

    norm(x, w, b, ε)   (x − μ) · s ⊙ w + b,  s = 1/√(mean((x − μ)²) + ε)   (layer norm)
                       x · s ⊙ w,            s = 1/√(mean(x²) + ε)         (RMS norm)
    gelu_tanh(x)       ½ x (1 + tanh(√(2/π) (x + 0.044715 x³)))
    gelu_many(x, g)    the same (or the exact x Φ(x)) over whole activations, or g ⊙ its
                       derivative (training)
    write_kv(K, V, k, v, n)   K[:, :, n : n + T] = k,  V[:, :, n : n + T] = v   (a KV cache)
    write_kv_rows(K, V, k, v, lengths)   K[b, :, n_b] = k[b, :, 0],  V likewise  (n_b = lengths[b])
    advance(lengths, B, T)    lengths[:B] += T
    sum_squares(ts)    Σ_t Σ x_t²  over many tensors in one parallel pass (‖g‖₂² for clipping)
    scale_(ts, c)      x_t ← c · x_t  for each tensor, likewise
    transposed(x)      xᵀ as a new contiguous tensor, for a contiguous 2-D float32 x
    contiguous_copy(t, dtype)   t as a new contiguous tensor in dtype; a transposed matrix (a
                       weight read from an HF file) by the 8 × 8 block kernels
    rope(x, cos, sin)  each pair (x_2i, x_2i+1), 2i < r, rotated: (a c − b s, a s + b c)
    silu(x)            x σ(x)  (SwiGLU's gate), a decoding step's few rows
    norm_train(x, w, b, eps, centred)   a norm over the last axis, with the row statistics
                       (μ, s) its backward needs;  norm_train_backward(...) → dx, dw, db

On one row of GPT-2 small (768 or 3072 values) PyTorch's layer norm and tanh GELU spend
most of a call setting up, and a decoding step makes 25 norms and 12 GELUs.
They take float32 inference (no autograd) on a CPU, contiguous, up to ``MAX_ROWS`` rows,
one thread; :func:`few_rows` says whether they take an input. The seams
``glassgpt.kernels.norms`` and ``glassgpt.kernels.activations`` ask it and fall back to
PyTorch otherwise (and whenever the extension is not built); ``write_kv`` falls back to
``narrow`` + ``copy_``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glassgpt.kernels import replay
from glassgpt.kernels.extensions import extension

_rowwise = extension(
    "_rowwise"
)  # not built (no C compiler at install): PyTorch's kernels everywhere

# rows of x up to which the compiled kernels run: a decoding step's (a server's 1-64 rows: a row's
# bits then do not depend on its batch, as the panels' products do not, kernels.dense) and a
# short prompt's; one thread, 1.0-1.4x PyTorch's layer norm at 9-64 rows of d 384-768
MAX_ROWS = 64


def built() -> bool:
    """Whether the compiled kernels are there (``glassgpt.kernels._rowwise``)."""
    return _rowwise is not None


def few_rows(x: Tensor, w: Tensor | None = None, b: Tensor | None = None) -> bool:
    """Whether the compiled kernels take x [..., d] and its parameters w, b [d] (None:
    absent): contiguous float32 CPU tensors, 1 ≤ rows ≤ ``MAX_ROWS``, autograd off, not
    compiling. (Called for every norm and GELU: the cheapest checks, no loops.)"""
    if _rowwise is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if x.dtype is not torch.float32 or not x.is_cpu or not x.is_contiguous() or not x.ndim:
        return False
    d = x.shape[-1]
    if not 0 < x.numel() <= MAX_ROWS * d:
        return False
    return _param_ok(w, d) and _param_ok(b, d)


def _param_ok(p: Tensor | None, d: int) -> bool:
    return p is None or (p.dtype is torch.float32 and p.is_cpu and p.is_contiguous()
                         and p.numel() == d)  # fmt: skip


def norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float, *, centred: bool) -> Tensor:
    """Layer norm (``centred``) or RMS norm of each row of x [..., d] (``few_rows`` holds)."""
    assert _rowwise is not None
    y = torch.empty_like(x)
    d = x.shape[-1]
    args = (x.data_ptr(), w.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
            x.numel() // d, d, eps, centred)  # fmt: skip
    _rowwise.norm(*args)
    if replay.RECORDING:
        replay.add(_rowwise.norm, args)
    return y


def gelu_tanh(x: Tensor) -> Tensor:
    """½ x (1 + tanh(√(2/π) (x + 0.044715 x³))) elementwise (``few_rows(x)`` holds)."""
    assert _rowwise is not None
    y = torch.empty_like(x)
    args = (x.data_ptr(), 0, y.data_ptr(), x.numel(), 1, False)  # one thread
    _rowwise.gelu_many(*args)
    if replay.RECORDING:
        replay.add(_rowwise.gelu_many, args)
    return y


def whole_ok(x: Tensor) -> bool:
    """Whether :func:`gelu_many` takes x: a contiguous float32 CPU tensor, not compiling."""
    if _rowwise is None or torch.compiler.is_compiling():
        return False
    return x.dtype is torch.float32 and x.is_cpu and x.is_contiguous()


def gelu_many(x: Tensor, g: Tensor | None = None, *, exact: bool = False) -> Tensor:
    """GELU(x) elementwise, or with ``g`` (x's shape) g ⊙ GELU'(x), the backward; the tanh
    GELU ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), or with ``exact`` x Φ(x) (Φ by erf to
    within 1.5e-7); x, g contiguous float32 on a CPU (``whole_ok``)."""
    assert _rowwise is not None
    y = torch.empty_like(x)
    if g is not None and not (g.shape == x.shape and g.dtype is x.dtype and g.is_cpu):
        raise ValueError(f"gelu_many: g must be float32 of shape {tuple(x.shape)}")
    g = None if g is None else g.contiguous()  # held: its address is read by the kernel
    g_ptr = 0 if g is None else g.data_ptr()
    args = (x.data_ptr(), g_ptr, y.data_ptr(), x.numel(), torch.get_num_threads(), exact)
    _rowwise.gelu_many(*args)
    if replay.RECORDING:
        replay.add(_rowwise.gelu_many, args)
    return y


def gelu_slope(x: Tensor) -> tuple[Tensor, Tensor]:
    """The tanh GELU y = GELU(x) (:func:`gelu_many`'s bits) and its slope d = GELU'(x), in one
    pass over a contiguous float32 CPU x (``whole_ok``): a training step's forward keeps d, so
    that its backward is g ⊙ d, one product, instead of the exps again."""
    assert _rowwise is not None
    y, d = torch.empty_like(x), torch.empty_like(x)
    _rowwise.gelu_slope(
        x.data_ptr(), y.data_ptr(), d.data_ptr(), x.numel(), torch.get_num_threads()
    )
    return y, d


def _buffers(tensors: list[Tensor]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The addresses and lengths of contiguous float32 CPU tensors, else None."""
    if _rowwise is None or torch.compiler.is_compiling():
        return None
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous():
            return None
    return tuple(t.data_ptr() for t in tensors), tuple(t.numel() for t in tensors)


def sum_squares(tensors: list[Tensor]) -> float | None:
    """Σ x² over every value of ``tensors`` (contiguous float32 on a CPU), summed in float64
    in an order that does not depend on the thread count; None where the kernel does not take
    them (another dtype or device, non-contiguous, not built).

    One parallel pass for all of them, where PyTorch takes a norm per tensor and the norm of
    those."""
    buffers = _buffers(tensors)
    if buffers is None:
        return None
    return _rowwise.sum_squares(*buffers, torch.get_num_threads())


def scale_(tensors: list[Tensor], factor: float) -> bool:
    """x ← float32(factor) · x in place for each tensor (contiguous float32 on a CPU), in one
    parallel pass; False (nothing done) where the kernel does not take them."""
    buffers = _buffers(tensors)
    if buffers is None:
        return False
    _rowwise.scale_many(*buffers, float(factor), torch.get_num_threads())
    return True


def trains_norm(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """Whether :func:`norm_train` takes x [..., d] with w, b [d]: contiguous float32 CPU
    tensors (``whole_ok``), at least one row."""
    if not whole_ok(x) or not x.ndim or not x.numel():
        return False
    d = x.shape[-1]
    return _param_ok(w, d) and _param_ok(b, d)


def norm_train(
    x: Tensor, w: Tensor, b: Tensor | None, eps: float, *, centred: bool
) -> tuple[Tensor, Tensor]:
    """y = (x − μ) s ⊙ w + b (``centred``; else x s ⊙ w), with s = 1/√(mean((x − μ)²) + ε),
    over the last axis of x [..., d] (``trains_norm`` holds), each row by :func:`norm`'s
    kernel, rows in blocks, in parallel; and stats [rows, 2]: μ (0 when not centred) and s."""
    assert _rowwise is not None
    d = x.shape[-1]
    rows = x.numel() // d
    y, stats = torch.empty_like(x), torch.empty(rows, 2)
    _rowwise.norm_train(x.data_ptr(), w.data_ptr(), 0 if b is None else b.data_ptr(),
                        y.data_ptr(), stats.data_ptr(), rows, d, float(eps), int(centred),
                        torch.get_num_threads())  # fmt: skip
    return y, stats


def norm_train_backward(
    x: Tensor, w: Tensor, stats: Tensor, g: Tensor, *, centred: bool, bias: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """dx = s (ĝ − mean(ĝ) − x̂ mean(ĝ x̂)) (mean(ĝ) left out when not ``centred``), dw = Σ g x̂
    and db = Σ g over the rows (``bias``; else None), with x̂ = (x − μ) s and ĝ = g ⊙ w, for
    the stats :func:`norm_train` kept. dw and db are summed in blocks of rows, then block by
    block in float64: the same for any thread count."""
    assert _rowwise is not None
    d = x.shape[-1]
    g = g.contiguous()
    dx, dw = torch.empty_like(x), torch.empty(d)
    db = torch.empty(d) if bias else None
    _rowwise.norm_train_backward(x.data_ptr(), w.data_ptr(), stats.data_ptr(), g.data_ptr(),
                                 dx.data_ptr(), dw.data_ptr(),
                                 0 if db is None else db.data_ptr(), x.numel() // d, d,
                                 int(centred), torch.get_num_threads())  # fmt: skip
    return dx, dw, db


def transposed(x: Tensor) -> Tensor | None:
    """xᵀ [cols, rows], contiguous, for a contiguous 2-D float32 CPU x [rows, cols]: 8 × 8
    blocks in registers, in parallel; None where the kernel does not take x.

    oneDNN's product copies a transposed first operand, and ∂W = xᵀ g has one: PyTorch's
    strided copy of it is slow (16 a step at nanoGPT's CPU shape)."""
    if x.ndim != 2 or not whole_ok(x):
        return None
    rows, cols = x.shape
    y = torch.empty(cols, rows, dtype=torch.float32)
    _rowwise.transpose(x.data_ptr(), y.data_ptr(), rows, cols, torch.get_num_threads())
    return y


_BLOCKED = {torch.float32: "transpose", torch.bfloat16: "transpose16", torch.float16: "transpose16"}


def contiguous_copy(t: Tensor, dtype: torch.dtype) -> Tensor:
    """A new contiguous tensor equal to ``t`` in ``dtype``.

    Where t is a transposed matrix, t = M.permute(k, …, n−1, 0, …, k−1) with M contiguous
    (``W.T``, ``W.T.unflatten(0, (H, d_head))``: an HF file's [d_out, d_in] weights seen in
    glassgpt's [d_in, d_out] layout), the copy is one blocked transpose of the matrix
    M [∏ leading, ∏ trailing]: PyTorch's strided ``copy_`` of such a view moves 1–1.5 GB/s,
    the blocks several times that. Anything else, and a cast (whose temporary copy would
    raise a load's peak memory), is ``copy_``."""
    name = _BLOCKED.get(t.dtype)
    if _rowwise is not None and name is not None and dtype == t.dtype and t.is_cpu and t.ndim >= 2 and not t.is_contiguous():  # fmt: skip
        for k in range(1, t.ndim):
            order = [*range(k, t.ndim), *range(k)]
            M = t.permute(order)
            if M.is_contiguous():
                rows, cols = M.shape[: t.ndim - k].numel(), M.shape[t.ndim - k :].numel()
                y = torch.empty(t.shape, dtype=dtype)
                getattr(_rowwise, name)(M.data_ptr(), y.data_ptr(), rows, cols, torch.get_num_threads())  # fmt: skip
                return y
    out = torch.empty(t.shape, dtype=dtype, device=t.device)
    return out.copy_(t)


def write_kv(K: Tensor, V: Tensor, k: Tensor, v: Tensor, n: int) -> None:
    """K[:, :, n : n + T] = k and V[:, :, n : n + T] = v for a KV cache's K, V [B, H, capacity,
    d_head] and a step's k, v [B, H, T, d_head] (any strides): one compiled call for float32
    CPU tensors of up to ``MAX_ROWS`` positions without autograd, ``narrow`` + ``copy_``
    (four PyTorch calls) otherwise."""
    T = k.shape[2] if k.ndim == 4 else 0
    if _kv_ok(K, V, k, v, n, T):
        assert _rowwise is not None
        B, H, _, D = k.shape
        strides = (*K.stride(), *V.stride(), *k.stride(), *v.stride())
        args = (K.data_ptr(), V.data_ptr(), k.data_ptr(), v.data_ptr(), B, H, T, D, n, strides)
        _rowwise.kv_write(*args)
        if replay.RECORDING:
            replay.add(_rowwise.kv_write, args, positional=(8,))  # n
        return
    K.narrow(2, n, T).copy_(k)
    V.narrow(2, n, T).copy_(v)


def _kv_ok(K: Tensor, V: Tensor, k: Tensor, v: Tensor, n: int, T: int) -> bool:
    if _rowwise is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if not 0 < T <= MAX_ROWS or n < 0 or K.ndim != 4 or k.shape != v.shape or K.shape != V.shape:
        return False
    Ks, ks = K.shape, k.shape
    if Ks[0] != ks[0] or Ks[1] != ks[1] or Ks[3] != ks[3] or n + T > Ks[2]:
        return False
    f32 = torch.float32
    return (
        K.dtype is f32
        and V.dtype is f32
        and k.dtype is f32
        and v.dtype is f32
        and (K.is_cpu and V.is_cpu and k.is_cpu and v.is_cpu)
    )


def write_kv_rows(K: Tensor, V: Tensor, k: Tensor, v: Tensor, lengths: Tensor) -> bool:
    """K[b, :, n_b] = k[b, :, 0] and V[b, :, n_b] = v[b, :, 0] for b < B, n_b = lengths[b]
    (int64 [B]; read when the kernel runs), for a cache of per-row lengths (K, V [slots, H,
    capacity, d_head], k, v [B, H, 1, d_head], any strides): one compiled call for float32
    CPU tensors without autograd; returns False (nothing written) otherwise."""
    B = k.shape[0] if k.ndim == 4 else 0
    if not (
        _kv_ok(K[:B], V[:B], k, v, 0, 1)
        and k.shape[2] == 1
        and lengths.dtype is torch.int64
        and lengths.is_cpu
        and lengths.is_contiguous()
        and lengths.shape == (B,)
    ):
        return False
    assert _rowwise is not None
    H, D = k.shape[1], k.shape[3]
    strides = (*K.stride(), *V.stride(), *k.stride(), *v.stride())
    args = (K.data_ptr(), V.data_ptr(), k.data_ptr(), v.data_ptr(), B, H, D, lengths.data_ptr(),
            strides)  # fmt: skip
    _rowwise.kv_write_rows(*args)
    if replay.RECORDING:
        replay.add(_rowwise.kv_write_rows, args)
    return True


def advance(lengths: Tensor, B: int, T: int) -> None:
    """lengths[:B] += T for an int64 tensor: one compiled call on a contiguous CPU tensor
    without autograd (recorded for replay), PyTorch's in-place add otherwise."""
    if (
        _rowwise is None
        or lengths.dtype is not torch.int64
        or not lengths.is_cpu
        or not lengths.is_contiguous()
        or torch.compiler.is_compiling()
        or not 0 <= B <= lengths.numel()
    ):
        lengths[:B] += T
        return
    args = (lengths.data_ptr(), B, T)
    _rowwise.advance(*args)
    if replay.RECORDING:
        replay.add(_rowwise.advance, args)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor | None:
    """x [B, 1, heads, d_head] with each pair (a, b) = (x_2i, x_2i+1), 2i < r, rotated to
    (a c − b s, a s + b c) by cos, sin [1, r/2] or per row [B, 1, r/2]; dimensions ≥ r copied.
    A new contiguous tensor (each product rounded before the sum: the bits of PyTorch's
    pair-by-pair form, an ulp from its complex product); None where the kernel does not take
    these (then PyTorch's operations)."""
    if _rowwise is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    if x.dtype is not torch.float32 or not x.is_cpu or x.ndim != 4 or x.shape[1] != 1:
        return None
    B, _, H, D = x.shape
    half = cos.shape[-1]
    if x.stride(-1) != 1 or 2 * half > D or B * H > 16 * MAX_ROWS:
        return None
    for t in (cos, sin):
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous():
            return None
    if cos.shape != sin.shape or cos.shape not in ((1, half), (B, 1, half)):
        return None
    y = torch.empty(B, 1, H, D)
    cs = half if cos.ndim == 3 else 0
    args = (x.data_ptr(), cos.data_ptr(), sin.data_ptr(), y.data_ptr(), B, H, D, 2 * half,
            x.stride(0), x.stride(2), cs)  # fmt: skip
    _rowwise.rope(*args)
    if replay.RECORDING:
        replay.add(_rowwise.rope, args)
    return y


def silu(x: Tensor) -> Tensor | None:
    """x σ(x) = x / (1 + e^{−x}) elementwise for a decoding step's few rows (``few_rows``);
    None otherwise (then ``F.silu``)."""
    if not few_rows(x):
        return None
    assert _rowwise is not None
    y = torch.empty_like(x)
    args = (x.data_ptr(), y.data_ptr(), x.numel())
    _rowwise.silu(*args)
    if replay.RECORDING:
        replay.add(_rowwise.silu, args)
    return y


def few_heads(x: Tensor, w: Tensor) -> bool:
    """Whether :func:`norm_heads` takes x: a decoding step's q or k [B, 1, heads, d] (float32 on
    a CPU, each row's heads adjacent, up to ``16 · MAX_ROWS`` rows; autograd off), w [d]."""
    if _rowwise is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if x.dtype is not torch.float32 or not x.is_cpu or x.ndim != 4 or x.shape[1] != 1:
        return False
    B, _, H, d = x.shape
    if x.stride(-1) != 1 or x.stride(-2) != d or not 0 < B * H <= 16 * MAX_ROWS:
        return False
    return _param_ok(w, d)


def norm_heads(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """The RMS norm of each head's row of x [B, 1, heads, d] (``few_heads``: rows of one
    position adjacent, the batch's rows apart, as q and k are in the step's qkv), one call a
    batch row, into a contiguous [B, 1, heads, d] (the QK-norm of Qwen3 and Gemma 3)."""
    assert _rowwise is not None
    B, _, H, d = x.shape
    y = torch.empty(B, 1, H, d)
    for b in range(B):
        args = (x.data_ptr() + 4 * b * x.stride(0), w.data_ptr(), 0, y.data_ptr() + 4 * b * H * d,
                H, d, eps, False)  # fmt: skip
        _rowwise.norm(*args)
        if replay.RECORDING:
            replay.add(_rowwise.norm, args)
    return y
