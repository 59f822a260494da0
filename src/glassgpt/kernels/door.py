"""The declared interface of glassgpt's kernels: every operation that code outside
``glassgpt.kernels`` uses, what it needs built, and what it keeps for the backward pass.

    op(x) = kernel(x)     where the extension is built and the op's predicate takes x
            fallback(x)   else (PyTorch's operations: the same function)

Each :class:`Op` names its function (the seam callers use), the compiled extension it may
run on (``kernels/<extension>.c``), its predicate (which inputs the kernel takes), its
variant under ``torch.compile`` (a custom operator, or PyTorch's kernels) and what it saves
for the backward (in bytes per token: :mod:`glassgpt.kernels.saved`, which the memory estimate
asks). Whether an extension is built is asked one way, :func:`built`; tests run
any operation with its extension hidden (:func:`hidden`, from
:mod:`glassgpt.kernels.extensions`) to check the fallback computes the
same thing. Code outside ``glassgpt.kernels`` imports only the package, which re-exports
these functions (``tests/test_imports.py`` forbids reaching past it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glassgpt.kernels import custom_ops
from glassgpt.kernels.activations import gelu_exact, gelu_tanh, silu
from glassgpt.kernels.attention_door import attention, step_attention
from glassgpt.kernels.bf16 import cache_dtype
from glassgpt.kernels.checks import id_out_of_range
from glassgpt.kernels.dense import (
    PANEL_BLOCK_ROWS,
    alias,
    has_small_batch_kernel,
    is_packed,
    matmul,
    pack,
    unpack,
)
from glassgpt.kernels.extensions import EXTENSIONS, built, extension, hidden
from glassgpt.kernels.fusion import fuse as fuse_calls
from glassgpt.kernels.greedy import UnembedInt8, greedy_call, greedy_variant, unembedding
from glassgpt.kernels.int4 import pack_int4
from glassgpt.kernels.int8 import pack_int8
from glassgpt.kernels.norms import layer_norm, rms_norm
from glassgpt.kernels.pages import huge_page_zeros
from glassgpt.kernels.policy import (
    EXPLICIT_MAX_KEYS,
    SMALL_HEAD,
    attention_path,
    compiled_causal,
    compiled_gelu,
    cpu_paths,
    keeps_probabilities,
    kept_p_width,
    native_bf16,
)
from glassgpt.kernels.program import Program, compile_calls
from glassgpt.kernels.replay import Call as ReplayCall
from glassgpt.kernels.replay import (
    Recorder,
    StepMode,
    argmax_at,
    embed_call,
    scale_call,
    take_rows_call,
)
from glassgpt.kernels.replay import start as start_recording
from glassgpt.kernels.replay import stop as stop_recording
from glassgpt.kernels.rowwise import (
    advance,
    contiguous_copy,
    rope,
    scale_,
    sum_squares,
    write_kv,
    write_kv_rows,
)
from glassgpt.kernels.sampling import (
    argmax_rows,
    draw_rows,
    finite_rows,
    min_p_fill,
    top_k_fill,
    top_p_drop,
    top_p_fill,
)
from glassgpt.kernels.saved import (
    activation_copy_kept,
    activation_kept,
    attention_kept,
    norm_kept,
)

__all__ = [
    "EXPLICIT_MAX_KEYS",
    "EXTENSIONS",
    "OPS",
    "PANEL_BLOCK_ROWS",
    "SMALL_HEAD",
    "Op",
    "Program",
    "Recorder",
    "ReplayCall",
    "StepMode",
    "UnembedInt8",
    "activation_copy_kept",
    "activation_kept",
    "advance",
    "alias",
    "argmax_at",
    "argmax_rows",
    "attention",
    "attention_kept",
    "attention_path",
    "built",
    "cache_dtype",
    "compile_calls",
    "compiled_causal",
    "compiled_gelu",
    "contiguous_copy",
    "cpu_paths",
    "draw_rows",
    "embed_call",
    "extension",
    "finite_rows",
    "fuse_calls",
    "gelu_exact",
    "gelu_tanh",
    "greedy_call",
    "greedy_variant",
    "has_small_batch_kernel",
    "hidden",
    "huge_page_zeros",
    "id_out_of_range",
    "is_packed",
    "keeps_probabilities",
    "kept_p_width",
    "layer_norm",
    "matmul",
    "min_p_fill",
    "native_bf16",
    "norm_kept",
    "pack",
    "pack_int4",
    "pack_int8",
    "register_custom_ops",
    "rms_norm",
    "rope",
    "scale_",
    "scale_call",
    "silu",
    "start_recording",
    "step_attention",
    "stop_recording",
    "sum_squares",
    "take_rows_call",
    "top_k_fill",
    "top_p_drop",
    "top_p_fill",
    "unembedding",
    "unpack",
    "write_kv",
    "write_kv_rows",
]


@dataclass(frozen=True)
class Op:
    """One kernel operation as callers see it (see the module docstring)."""

    name: str
    function: str  # "module:function" in glassgpt.kernels, the seam
    extension: str | None  # the compiled extension it may run on; None: PyTorch only
    takes: str  # which inputs the compiled kernel takes (else the fallback)
    compiled: str  # under torch.compile
    saves: str  # what it keeps for the backward pass ("nothing": inference only)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn()(*args, **kwargs)

    def fn(self) -> Callable[..., Any]:
        module, _, name = self.function.partition(":")
        return getattr(sys.modules[f"glassgpt.kernels.{module}"], name)  # imported above

    def built(self) -> bool:
        return self.extension is None or built(self.extension)


PYTORCH = "PyTorch's kernels"
INFERENCE = "nothing (inference, no autograd)"

OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op("matmul", "dense:matmul", "_gemv",
           "a packed CPU weight (float32/bf16) and up to SMALL_BATCH rows of x; oneDNN's "
           "float32 products otherwise on a CPU",
           "glassgpt::linear once register_custom_ops() has run, else " + PYTORCH,
           "x, or xᵀ where d_in < d_out (onednn.keeps_transpose), and W"),
        Op("attention", "attention_door:attention", "_attend",
           "a few float32 queries over a KV cache, no autograd (the decoding step); float32 "
           "causal training attention with small heads goes to _flash",
           "glassgpt::causal_attention once registered, else " + PYTORCH,
           "q, k, v, z and P where T ≤ 4 d_head, else the row log-sum-exps"),
        Op("step_attention", "attention_door:step_attention", "_attend",
           "a decoding step's float32 queries with a scale, soft cap or sliding window, no "
           "mask, no autograd (else None: the model's explicit path)", PYTORCH, INFERENCE),
        Op("causal_attention", "flash:causal_attention", "_flash",
           "float32 CPU q, k, v of one [B, H, T, d_head] shape",
           "glassgpt::causal_attention (registered)",
           "q, k, v, z and P where T ≤ 4 d_head, else the row log-sum-exps"),
        Op("gelu_tanh", "activations:gelu_tanh", "_rowwise",
           "float32 CPU activations: a decoding step's few rows, or a training step's whole "
           "tensor (and its gradient)", PYTORCH,
           "its input only where _rowwise is built (the slope recomputed), else autograd's"),
        Op("gelu_exact", "activations:gelu_exact", "_rowwise",
           "float32 CPU activations of a training step", PYTORCH,
           "its input only where _rowwise is built, else autograd's"),
        Op("silu", "activations:silu", "_rowwise",
           "a decoding step's few float32 CPU rows, no autograd", PYTORCH,
           "autograd's (the kernel is inference only)"),
        Op("rope", "rowwise:rope", "_rowwise",
           "a decoding step's float32 CPU q or k [B, 1, heads, d_head], no autograd (the "
           "model's own PyTorch rotation otherwise: an ulp apart at most)", PYTORCH, INFERENCE),
        Op("layer_norm", "norms:layer_norm", "_rowwise",
           "float32 CPU rows: a decoding step's few, or a training step's", PYTORCH,
           "x̂'s mean and 1/σ per row (the kernel), or autograd's"),
        Op("rms_norm", "norms:rms_norm", "_rowwise",
           "float32 CPU rows: a decoding step's few, or a training step's", PYTORCH,
           "1/rms per row (the kernel), or autograd's"),
        Op("write_kv", "rowwise:write_kv", "_rowwise",
           "float32 CPU caches, no autograd", PYTORCH, INFERENCE),
        Op("write_kv_rows", "rowwise:write_kv_rows", "_rowwise",
           "float32 CPU slot caches, each row at its own length", PYTORCH, INFERENCE),
        Op("advance", "rowwise:advance", "_rowwise",
           "a contiguous int64 CPU length vector", PYTORCH, INFERENCE),
        Op("argmax_rows", "sampling:argmax_rows", "_rowwise",
           "float32 CPU logits [B, V] with no NaN and a finite maximum", PYTORCH, INFERENCE),
        Op("contiguous_copy", "rowwise:contiguous_copy", "_rowwise",
           "a CPU float32, bf16 or float16 transposed matrix (blocked transpose)", PYTORCH,
           INFERENCE),
        Op("sum_squares", "rowwise:sum_squares", "_rowwise",
           "contiguous float32 CPU gradients (the clipping norm, in float64)", PYTORCH,
           INFERENCE),
        Op("scale_", "rowwise:scale_", "_rowwise",
           "contiguous float32 CPU gradients (clipping)", PYTORCH, INFERENCE),
        Op("pack", "dense:pack", "_gemv",
           "a float32 or bf16 CPU weight: packed copies for inference products", PYTORCH,
           "nothing: the weight itself is what autograd sees"),
        Op("pack_int8", "int8:pack_int8", "_int8",
           "a float32 CPU weight: W̃ = q·s, products read q (float ones where not built)",
           PYTORCH, INFERENCE),
        Op("pack_int4", "int4:pack_int4", "_int4",
           "a float32 CPU weight: W̃ = q·d (groups of 32 inputs, float16 d), products read the "
           "nibbles (float ones where not built)", PYTORCH, INFERENCE),
        Op("record_step", "replay:Recorder", "_rowwise",
           "a float32 CPU decoding step whose every operation is a compiled call, a view, "
           "an allocation or a float32 residual sum", "not recorded", INFERENCE),
        Op("run_step", "program:compile_calls", "_program",
           "a replayed step's recorded calls (kernels/_program.c: those with a C "
           "implementation run with the GIL let go once; else the Python loop)",
           "not recorded", INFERENCE),
    )
}  # fmt: skip


def register_custom_ops() -> None:
    """Register the float32 CPU kernels as custom operators for ``torch.compile``
    (``glassgpt.kernels.custom_ops``); idempotent."""
    custom_ops.register()
