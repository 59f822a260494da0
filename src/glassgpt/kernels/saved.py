"""What each kernel operation keeps for the backward pass, per token, on a device.

    bytes kept = f(operation, shapes, itemsizes r (weights) and s (compute), device)

The kernels decide what autograd keeps (glassgpt's compiled GELU keeps its slope, its
causal attention P or the row log-sum-exps, its float32 norms the layer norm's statistics),
so they declare it here, by the same rules (:mod:`glassgpt.kernels.policy`) that pick the
kernel; ``glassgpt.model.memory`` adds these up for a model and holds no device rule.
Pure Python (no torch import), as the accounting that asks it. ``tests/model/
test_accounting.py`` checks the sums against what autograd saves.
"""

from __future__ import annotations

from glassgpt.kernels.policy import (
    attention_path,
    compiled_causal,
    compiled_gelu,
    keeps_probabilities,
    kept_p_width,
    native_bf16,
)

# the others' backward needs only their output
_SAVES_INPUT = ("gelu", "gelu_tanh", "silu", "relu2")


def activation_kept(act: str | None, s: int, device: str, *, autocast: bool) -> int:
    """Tensors of d_mlp per token an activation keeps beyond its output: its input (GELU,
    SiLU; max(0, x) for the squared ReLU; glassgpt's compiled tanh GELU keeps its slope
    instead, as many values), and for the tanh GELU on a CPU in float64 (or float32 without
    glassgpt's compiled GELU kernel) also its gate σ(·) (``glassgpt.kernels.activations``).

    >>> activation_kept("relu", 4, "cpu", autocast=False), activation_kept("gelu", 2, "cuda", autocast=True)
    (0, 1)
    """
    if act not in _SAVES_INPUT:
        return 0
    if act != "gelu_tanh" or device != "cpu" or autocast or s < 4:
        return 1
    return 2 if s == 8 or not compiled_gelu() else 1


def activation_copy_kept(act: str | None, s: int, device: str) -> int:
    """Bytes per d_mlp value a bf16 GELU keeps on a CPU without bf16 arithmetic, where it runs
    glassgpt's float32 kernel on a float32 copy, which it keeps (0 elsewhere)."""
    bf16_cpu = s == 2 and device == "cpu" and act in ("gelu", "gelu_tanh")
    return 4 - s if bf16_cpu and compiled_gelu() and not native_bf16() else 0


def norm_kept(norm: str, d: int, r: int, s: int, device: str) -> int:
    """Bytes per token a norm keeps: its input (r·d), its output as the next product's input
    (s·d), float32 statistics; RMSNorm (a composite of PyTorch's kernels) also keeps x/rms
    (r·d), except in float32 on a CPU, where glassgpt's kernel keeps what the layer norm
    keeps (``glassgpt.kernels.norms``).

    >>> norm_kept("layernorm", 768, 4, 4, "cuda"), norm_kept("rmsnorm", 768, 4, 4, "cuda")
    (6152, 9220)
    """
    compiled_rms = device == "cpu" and r == 4 and compiled_gelu()  # kernels/_rowwise built
    return r * d + s * d + (8 if norm == "layernorm" or compiled_rms else 4 + r * d)


def attention_kept(
    H: int, dh: int, T: int, s: int, device: str, *,
    autocast: bool, dropout: bool, explicit: bool = False, rope: bool = False,
) -> int:  # fmt: skip
    """Bytes per token one attention sublayer keeps (H heads of d_head ``dh``, T keys):

    - the fused kernel: the q|k|v buffer and z (s·4·H·d_head), a float32 log-sum-exp per head
      (glassgpt's float32 causal kernel on a CPU: P instead, 4·H·T rounded up to 16, where it
      keeps it, up to 4 d_head keys), and with RoPE the rotated q and k (s·2·H·d_head);
    - the explicit path (``explicit``): q, k, v, z and the pattern (s·H·T), with dropout also
      its mask and the dropped pattern (s·2·H·T);
    - on a CPU (``glassgpt.kernels.policy``) dropout on the pattern sends the fused kernel to
      its float32 fallback, which keeps q, k, v, the pattern, its mask and the dropped pattern
      (4 bytes), and bf16 heads narrower than 64 take the explicit product up to 128 keys,
      which keeps q, k, v, z, the float32 softmax (4·H·T) and its bf16 copy (s·H·T), and the
      float32 fused kernel beyond.
    """
    causal = compiled_causal()
    path = attention_path(device, "bfloat16" if s == 2 else "float32", dh, T, dropout=dropout,
                          n_queries=T, causal_kernel=causal,
                          native_bf16=device != "cpu" or native_bf16())  # fmt: skip
    if explicit:
        return s * (4 * H * dh + H * T * (3 if dropout else 1))
    # the row log-sum-exps, or the float32 P that glassgpt's causal kernel keeps (also when it
    # runs on float32 copies of bf16 heads)
    kept = 4 * H
    float32_path = attention_path(device, "float32", dh, T, dropout=dropout, n_queries=T,
                                  causal_kernel=causal)  # fmt: skip
    if float32_path == "causal_small" and keeps_probabilities(T, dh):
        kept = 4 * H * kept_p_width(T)
    if dropout and path in ("math", "fused_float32"):
        # the fused kernel falls back to float32 math: q, k, v, pattern, mask, dropped
        return 4 * (3 * H * dh + 3 * H * T) + s * H * dh
    if path == "explicit_bf16":
        # q, k, v, z and the pattern in bf16 plus the softmax's float32 output
        return s * 4 * H * dh + (4 + s) * H * T
    if path == "fused_float32" and autocast:
        # float32 q, k, v and z, the bf16 z for W_O, the log-sum-exp
        # (measured: tests/model/test_accounting.py)
        return 4 * 4 * H * dh + s * H * dh + kept
    return s * (4 * H * dh + (2 * H * dh if rope else 0)) + kept
