"""Which attention kernel a shape takes on a device: the rule and its thresholds.

``glassgpt.kernels.attention`` dispatches by this rule and ``glassgpt.model.accounting``
asks it which tensors autograd will keep, so the two cannot disagree. Pure Python: no tensor
is made.

On a CPU (measured with PyTorch 2.x):

- dropout on the pattern sends PyTorch's fused kernel to its float32 math fallback;
- on a CPU without bf16 arithmetic (no AVX-512 BF16, no AMX) every bf16 attention takes
  float32 copies of q, k and v (PyTorch's bf16 products there are many times slower than
  its float32 ones, see ``glassgpt.kernels.bf16``), z rounded back to bf16;
- bf16 heads narrower than ``SMALL_HEAD`` avoid PyTorch's bf16 fused kernel, slower there
  than its float32 one: up to ``EXPLICIT_MAX_KEYS`` keys (no mask of their own) they take the
  explicit product in bf16 with the softmax in float32, longer ones the float32 fused kernel. (In float32 the explicit product
  measured faster alone but slower inside a training step, so float32 keeps the fused one.)

- float32 inference (no autograd) with at most ``FEW_QUERIES`` queries, a decoding step,
  takes glassgpt's own kernel (``kernels/_attend.c``) when it is built: PyTorch's fused
  kernel spends a large part of such a call setting up for one query.
- other float32 causal self-attention (queries and keys at the same positions, no mask of
  the caller's, no dropout) with heads up to ``CAUSAL_MAX_HEAD`` wide and up to
  ``CAUSAL_MAX_KEYS`` positions, training or not, takes glassgpt's causal kernel
  (``kernels/_flash.c``) when it is built: PyTorch's CPU flash kernel runs small heads far
  below the core's rate. It is faster up to 512 positions and no faster at 1024, where its
  per-head scratch (two T × T blocks) leaves the caches (``bench/attention_train.py``). It
  keeps what the fused kernel keeps (q, k, v, z and the row log-sum-exps), except where
  :func:`keeps_probabilities`: for rows of up to 4 d_head keys it keeps P itself [B, H, T,
  T rounded up to 16] instead of the log-sum-exps, and its backward skips recomputing it.

On a GPU every shape takes PyTorch's fused kernel in the compute dtype.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from glassgpt.kernels.extensions import built, extension

SMALL_HEAD = 64  # below this d_head, CPU bf16 attention avoids PyTorch's bf16 fused kernel ...
EXPLICIT_MAX_KEYS = 128  # ... and up to this many keys runs the explicit product
FEW_QUERIES = 8  # float32 inference with up to this many queries: glassgpt's decoding kernel
CAUSAL_MAX_HEAD = 128  # float32 causal self-attention up to this d_head ...
CAUSAL_MAX_KEYS = 512  # ... and this many positions: glassgpt's causal kernel

AttentionPath = Literal[
    "fused", "math", "explicit_bf16", "fused_float32", "few_queries", "causal_small"
]


def is_bf16(dtype: Any) -> bool:
    """Whether ``dtype`` (a ``torch.dtype`` or a name) is bfloat16.

    >>> is_bf16("bf16"), is_bf16("float32")
    (True, False)
    """
    return str(dtype).removeprefix("torch.").lower() in ("bfloat16", "bf16")


def attention_path(
    device: str, dtype: Any, d_head: int, n_keys: int, *, masked: bool = False,
    dropout: bool = False, n_queries: int | None = None, inference: bool = False,
    few_queries_kernel: bool = False, causal_kernel: bool = False, native_bf16: bool = True,
) -> AttentionPath:  # fmt: skip
    """The kernel that computes z = softmax(q kᵀ/√d_head + M) v on ``device`` (a device type,
    ``"cpu"`` or ``"cuda"``) with compute ``dtype``, for heads of ``d_head`` and ``n_keys`` keys.

    ``masked``: the caller's own mask (a padded batch) replaces the causal one; ``dropout``:
    dropout on the pattern; ``n_queries``, ``inference`` (no autograd) and
    ``few_queries_kernel`` (glassgpt's decoding kernel is built) choose ``few_queries``;
    ``n_queries`` equal to ``n_keys`` (self-attention, offset 0) and ``causal_kernel``
    (glassgpt's causal kernel is built) ``causal_small``. ``native_bf16``: the CPU has bf16
    arithmetic (AVX-512 BF16 or AMX); without it every bf16 attention takes float32 copies.

    - ``fused``: PyTorch's fused kernel in ``dtype``;
    - ``math``: the same call, which PyTorch sends to its math fallback (CPU, dropout);
    - ``explicit_bf16``: the explicit product in bf16, softmax in float32 (CPU, small bf16
      heads, no mask of the caller's, no dropout, up to ``EXPLICIT_MAX_KEYS`` keys);
    - ``fused_float32``: float32 copies (CPU, the other small bf16 heads, and every bf16
      head on a CPU without bf16 arithmetic), by the kernel float32 q, k, v would take
      (the fused one, glassgpt's decoding or causal kernel; with dropout the float32 math
      fallback);
    - ``few_queries``: glassgpt's decoding kernel (CPU, float32, inference, no dropout, at most
      ``FEW_QUERIES`` queries);
    - ``causal_small``: glassgpt's causal kernel (CPU, float32, no mask of the caller's, no
      dropout, queries at the keys' positions, d_head ≤ ``CAUSAL_MAX_HEAD``, at most
      ``CAUSAL_MAX_KEYS`` keys), forward and backward.

    >>> attention_path("cpu", "bf16", 32, 64), attention_path("cpu", "bf16", 32, 256)
    ('explicit_bf16', 'fused_float32')
    >>> attention_path("cpu", "bf16", 32, 64, native_bf16=False)
    'fused_float32'
    >>> attention_path("cuda", "bf16", 32, 64), attention_path("cpu", "float32", 32, 64)
    ('fused', 'fused')
    >>> attention_path("cpu", "float32", 64, 80, n_queries=1, inference=True,
    ...                few_queries_kernel=True)
    'few_queries'
    >>> attention_path("cpu", "float32", 32, 128, n_queries=128, causal_kernel=True)
    'causal_small'
    """
    if device != "cpu":
        return "fused"
    few = n_queries is not None and n_queries <= FEW_QUERIES and inference and not dropout
    if few and few_queries_kernel and str(dtype).removeprefix("torch.") in ("float32", "fp32"):
        return "few_queries"
    if causal_kernel and _causal_small(dtype, d_head, n_keys, n_queries, masked, dropout):
        return "causal_small"
    if is_bf16(dtype) and (d_head < SMALL_HEAD or not native_bf16):
        if native_bf16 and not masked and not dropout and n_keys <= EXPLICIT_MAX_KEYS:
            return "explicit_bf16"
        return "fused_float32"  # with dropout: the float32 math fallback
    return "math" if dropout else "fused"


def _causal_small(
    dtype: Any, d_head: int, n_keys: int, n_queries: int | None, masked: bool, dropout: bool
) -> bool:
    """Whether glassgpt's causal kernel takes the shape (see :func:`attention_path`)."""
    if (
        masked
        or dropout
        or n_queries != n_keys
        or str(dtype).removeprefix("torch.") not in ("float32", "fp32")
    ):
        return False
    return d_head <= CAUSAL_MAX_HEAD and n_keys <= CAUSAL_MAX_KEYS


def kept_p_width(n_keys: int) -> int:
    """The row width of the P that glassgpt's causal kernel keeps: the keys rounded up to 16."""
    return (n_keys + 15) // 16 * 16


def keeps_probabilities(n_keys: int, d_head: int) -> bool:
    """Whether glassgpt's causal kernel keeps P for the backward in training: while P (rows
    of :func:`kept_p_width`) is at most 4/3 of q, k and v together (heads rounded up to 8),
    that is T ≤ 4 d_head, so that the attention's saved tensors at most double."""
    return kept_p_width(n_keys) <= 4 * ((d_head + 7) // 8 * 8)


def compiled_causal() -> bool:
    """Whether glassgpt's causal attention kernel (``kernels/_flash.c``) is built."""
    return built("_flash")


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (x86 ``flags``, Arm
    ``Features``); None where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively: AVX-512 BF16 or AMX (x86), or the bf16
    instructions (Arm), by :func:`cpu_flags`. Where they are unknown, True: PyTorch's own
    bf16 kernels are kept."""
    flags = cpu_flags()
    return True if flags is None else bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cpu_paths() -> dict[str, str]:
    """The path each precision's decoding products take on this CPU, in words (what
    ``bench/generate.py`` prints beside its figures):

    - float32: ``_gemv``'s AVX-512F panels (up to 32 rows a call), its AVX2 + FMA ones,
      or the portable loops;
    - bf16: the same float32 kernels reading bf16 weights (each widened exactly by a shift:
      decoding is bound by reading the weights, and float32 products keep the activations
      float32), and for prompts PyTorch's bf16 products (oneDNN: AVX512_BF16 or AMX) where
      the CPU has bf16 arithmetic, float32 products of widened copies elsewhere;
    - int8: ``_int8``'s AVX512-VNNI kernels (16-bit pairs by ``vpdpwssd``), its AVX-512VL or
      AVX2 ones (``vpmaddwd``), or the portable loop. AMX tiles are not used (no AMX CPU to
      test them on).
    """
    gemv, int8 = extension("_gemv"), extension("_int8")
    if gemv is None:
        f32 = "PyTorch (no _gemv)"
    elif gemv.kernel() == "portable":
        f32 = "portable loops"
    else:
        f32 = "AVX-512F panels" if gemv.panels_rows() > 1 else "AVX2+FMA panels"
    prompts = "oneDNN bf16 prompts" if native_bf16() else "float32 prompts"
    flags = cpu_flags() or frozenset()
    amx = "present, unused" if "amx_tile" in flags else "absent"
    return {
        "float32": f32,
        "bf16": f"bf16 weights in the {f32}, {prompts}",
        "int8": "PyTorch float32 (no _int8)" if int8 is None else int8.kernel(),
        "AMX": amx,
    }


def compiled_gelu() -> bool:
    """Whether glassgpt's own GELU kernel (``kernels/_gelu.h``, in ``_rowwise``) is built: a
    float32 tanh GELU on a CPU then keeps only its input for the backward
    (``glassgpt.kernels.activations``)."""
    return built("_rowwise")
