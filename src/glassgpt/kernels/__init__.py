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
with :func:`pack` (``glassgpt.sample.precision.cast`` does it for an inference copy);
``glassgpt.kernels.int8.pack_int8`` turns a weight into W̃ = q·s (int8, one scale per output
channel) and registers its int8 product, a compiled kernel (``kernels/_int8.c``). A decoding
step's attention (a few queries, float32, no autograd) takes ``kernels/_attend.c``; its norms,
GELUs and KV-cache writes take ``kernels/_rowwise.c`` (``glassgpt.kernels.rowwise``), as do a
training step's float32 tanh GELU and its gradient. Float32 causal self-attention with small
heads (training, a prompt) takes ``kernels/_flash.c`` (``glassgpt.kernels.flash``). The
weights the decoding kernels stream live on 2 MiB pages (``glassgpt.kernels.pages``).
``glassgpt.kernels.checks`` checks token ids without stalling a GPU (a device-side
assertion there). Under ``torch.compile`` the seams take PyTorch's kernels, or, once
``glassgpt.kernels.custom_ops.register()`` has run (the trainer runs it before compiling on
a CPU), oneDNN's products and the causal kernel as custom operators.

Importing this package is cheap; torch loads on first use of a function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glassgpt.kernels.policy import EXPLICIT_MAX_KEYS, SMALL_HEAD, attention_path

if TYPE_CHECKING:
    from glassgpt.kernels.activations import gelu_tanh
    from glassgpt.kernels.dense import has_small_batch_kernel, is_packed, matmul, pack, unpack
    from glassgpt.kernels.norms import layer_norm, rms_norm
    from glassgpt.kernels.sdpa import attention

__all__ = [
    "EXPLICIT_MAX_KEYS",
    "SMALL_HEAD",
    "attention",
    "attention_path",
    "gelu_tanh",
    "has_small_batch_kernel",
    "is_packed",
    "layer_norm",
    "matmul",
    "pack",
    "rms_norm",
    "unpack",
]

_LAZY = {"attention": "sdpa", "matmul": "dense", "pack": "dense", "unpack": "dense",
         "is_packed": "dense", "has_small_batch_kernel": "dense",
         "gelu_tanh": "activations", "layer_norm": "norms", "rms_norm": "norms"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"glassgpt.kernels.{_LAZY[name]}"), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'glassgpt.kernels' has no attribute {name!r}")
