"""glassgpt.kernels: every hardware-specific path of the GPT function, behind one seam.

``glassgpt.model`` states the math and calls these functions here for its products:

    matmul(x, W, b)             x W + b          (packed copy | int8 | int4 | oneDNN | F.linear)
    attention(q, k, v, offset)  softmax(q kᵀ/√d_head + M) v   (fused | explicit bf16 |
                                                             few queries | …)
    gelu_tanh(x)                ½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))   (few rows | σ form |
                                                                         F.gelu)
    layer_norm(x, w, b, ε)      (x − μ) · s ⊙ w + b    (few rows | F.layer_norm; rms_norm too)

Each picks its kernel from the device and dtype of its inputs: the rules, with their
thresholds, live in :mod:`glassgpt.kernels.policy` (pure Python), which
``glassgpt.model.accounting`` asks too, so a memory estimate follows the path the kernel
takes on the device it is made for. Packed inference weights are registered explicitly
with :func:`pack` (``glassgpt.model.precision.cast`` does it for an inference copy);
``glassgpt.kernels.int8.pack_int8`` turns a weight into W̃ = q·s (int8, one scale per output
channel) and registers its int8 product, a compiled kernel (``kernels/_int8.c``);
``glassgpt.kernels.int4.pack_int4`` likewise with 4-bit groups of 32 inputs (``_int4.c``). A decoding
step's attention (a few queries, float32, no autograd; grouped key/value heads read in place,
and with a scale, soft cap or sliding window through ``step_attention``) takes
``kernels/_attend.c``; its norms, GELUs, SiLUs, RoPE rotations and KV-cache writes take the
``_rowwise`` extension (``glassgpt.kernels.rowwise``; one
header a family: ``kernels/_norms.h``, ``_gelu.h``, ``_kvcache.h``, …), as do a training
step's float32 norms, tanh GELU and their gradients. Float32 causal self-attention with small
heads (training, a prompt) takes ``kernels/_flash.c`` (``glassgpt.kernels.flash``). The
weights the decoding kernels stream live on 2 MiB pages (``glassgpt.kernels.pages``).
``glassgpt.kernels.checks`` checks token ids without stalling a GPU (a device-side
assertion there). Under ``torch.compile`` the seams take PyTorch's kernels, or, once
``glassgpt.kernels.custom_ops.register()`` has run (the trainer runs it before compiling on
a CPU), oneDNN's products and the causal kernel as custom operators.

This package is the door (:mod:`glassgpt.kernels.door`): code outside it imports only
``glassgpt.kernels`` and the names ``door.__all__`` lists, never a module inside it; ``OPS`` declares each
operation, ``built(extension)`` answers whether a kernel was compiled, ``hidden(...)`` runs a
block without it.
"""

from __future__ import annotations

from glassgpt.kernels.door import *  # noqa: F403  (the declared operations, listed there)
from glassgpt.kernels.door import __all__ as __all__
