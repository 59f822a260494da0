"""glassgpt.kernels: every hardware-specific path of the GPT function, behind one seam.

``glassgpt.model`` states the math and calls these functions here for its products:

    matmul(x, W, b)             x W + b          (packed copy | int8 | oneDNN | F.linear)
    attention(q, k, v, offset)  softmax(q kᵀ/√d_head + M) v   (fused | explicit bf16 |
                                                             few queries | …)
    gelu_tanh(x)                ½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))   (few rows | σ form |
                                                                         F.gelu)
    layer_norm(x, w, b, ε)      (x − μ) · s ⊙ w + b    (few rows | F.layer_norm; rms_norm too)

Each picks its kernel from the device and dtype of its inputs: the rules, with their
thresholds and measurements, live in :mod:`glassgpt.kernels.policy` (pure Python), which
``glassgpt.model.accounting`` asks too, so a memory estimate follows the path the kernel
takes on the device it is made for. Packed inference weights are registered explicitly
with :func:`pack` (``glassgpt.model.precision.cast`` does it for an inference copy);
``glassgpt.kernels.int8.pack_int8`` turns a weight into W̃ = q·s (int8, one scale per output
channel) and registers its int8 product, a compiled kernel (``kernels/_int8.c``). A decoding
step's attention (a few queries, float32, no autograd) takes ``kernels/_attend.c``; its norms,
GELUs and KV-cache writes take the ``_rowwise`` extension (``glassgpt.kernels.rowwise``; one
header a family: ``kernels/_norms.h``, ``_gelu.h``, ``_kvcache.h``, …), as do a training
step's float32 norms, tanh GELU and their gradients. Float32 causal self-attention with small
heads (training, a prompt) takes ``kernels/_flash.c`` (``glassgpt.kernels.flash``). The
weights the decoding kernels stream live on 2 MiB pages (``glassgpt.kernels.pages``).
``glassgpt.kernels.checks`` checks token ids without stalling a GPU (a device-side
assertion there). Under ``torch.compile`` the seams take PyTorch's kernels, or, once
``glassgpt.kernels.custom_ops.register()`` has run (the trainer runs it before compiling on
a CPU), oneDNN's products and the causal kernel as custom operators.

This package is the door (:mod:`glassgpt.kernels.door`): code outside it imports only
``glassgpt.kernels`` and the names below, never a module inside it; ``OPS`` declares each
operation, ``built(extension)`` answers whether a kernel was compiled, ``hidden(...)`` runs a
block without it. Importing this package is cheap; torch loads on first use of a function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glassgpt.kernels.door import EXTENSIONS, OPS, Op, built, extension, hidden
from glassgpt.kernels.policy import (
    EXPLICIT_MAX_KEYS,
    SMALL_HEAD,
    attention_path,
    compiled_causal,
    compiled_gelu,
    keeps_probabilities,
    kept_p_width,
    native_bf16,
)

if TYPE_CHECKING:
    from glassgpt.kernels.activations import gelu_exact, gelu_tanh
    from glassgpt.kernels.attention_door import attention
    from glassgpt.kernels.bf16 import cache_dtype
    from glassgpt.kernels.checks import id_out_of_range
    from glassgpt.kernels.dense import has_small_batch_kernel, is_packed, matmul, pack, unpack
    from glassgpt.kernels.door import register_custom_ops
    from glassgpt.kernels.int8 import pack_int8
    from glassgpt.kernels.norms import layer_norm, rms_norm
    from glassgpt.kernels.replay import Call as ReplayCall
    from glassgpt.kernels.replay import Recorder, StepMode, argmax_at, embed_call
    from glassgpt.kernels.replay import start as start_recording
    from glassgpt.kernels.replay import stop as stop_recording
    from glassgpt.kernels.rowwise import (
        advance,
        argmax_rows,
        scale_,
        sum_squares,
        write_kv,
        write_kv_rows,
    )
    from glassgpt.kernels.saved import (
        activation_copy_kept,
        activation_kept,
        attention_kept,
        norm_kept,
    )

# name → (module of glassgpt.kernels, its attribute): imported on first use
_LAZY = {
    "attention": ("attention_door", "attention"),
    "matmul": ("dense", "matmul"),
    "pack": ("dense", "pack"),
    "unpack": ("dense", "unpack"),
    "is_packed": ("dense", "is_packed"),
    "has_small_batch_kernel": ("dense", "has_small_batch_kernel"),
    "gelu_tanh": ("activations", "gelu_tanh"),
    "gelu_exact": ("activations", "gelu_exact"),
    "layer_norm": ("norms", "layer_norm"),
    "rms_norm": ("norms", "rms_norm"),
    "cache_dtype": ("bf16", "cache_dtype"),
    "id_out_of_range": ("checks", "id_out_of_range"),
    "pack_int8": ("int8", "pack_int8"),
    "write_kv": ("rowwise", "write_kv"),
    "write_kv_rows": ("rowwise", "write_kv_rows"),
    "advance": ("rowwise", "advance"),
    "argmax_rows": ("rowwise", "argmax_rows"),
    "sum_squares": ("rowwise", "sum_squares"),
    "scale_": ("rowwise", "scale_"),
    "register_custom_ops": ("door", "register_custom_ops"),
    "Recorder": ("replay", "Recorder"),
    "StepMode": ("replay", "StepMode"),
    "ReplayCall": ("replay", "Call"),
    "start_recording": ("replay", "start"),
    "stop_recording": ("replay", "stop"),
    "embed_call": ("replay", "embed_call"),
    "argmax_at": ("replay", "argmax_at"),
    "activation_kept": ("saved", "activation_kept"),
    "activation_copy_kept": ("saved", "activation_copy_kept"),
    "attention_kept": ("saved", "attention_kept"),
    "norm_kept": ("saved", "norm_kept"),
}

__all__ = [
    "EXPLICIT_MAX_KEYS",
    "EXTENSIONS",
    "OPS",
    "SMALL_HEAD",
    "Op",
    "Recorder",
    "ReplayCall",
    "StepMode",
    "activation_copy_kept",
    "activation_kept",
    "advance",
    "argmax_at",
    "argmax_rows",
    "attention",
    "attention_kept",
    "attention_path",
    "built",
    "cache_dtype",
    "compiled_causal",
    "compiled_gelu",
    "embed_call",
    "extension",
    "gelu_exact",
    "gelu_tanh",
    "has_small_batch_kernel",
    "hidden",
    "id_out_of_range",
    "is_packed",
    "keeps_probabilities",
    "kept_p_width",
    "layer_norm",
    "matmul",
    "native_bf16",
    "norm_kept",
    "pack",
    "pack_int8",
    "register_custom_ops",
    "rms_norm",
    "scale_",
    "start_recording",
    "stop_recording",
    "sum_squares",
    "unpack",
    "write_kv",
    "write_kv_rows",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"glassgpt.kernels.{module}"), attr)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'glassgpt.kernels' has no attribute {name!r}")
