"""Inference precision: the same function with weights (and activations) in another dtype.

    bf16:  W̃ = round_bf16(W) (8-bit mantissa, float32's exponent range), every activation in
           bf16; the cross-entropy and sampling in float32.
    int8:  each projection W [d_in, d_out] (W_QKV, W_O, W_in, W_gate, W_out and the
           unembedding W_U, or W_E when tied) becomes W̃ = q·s with one scale per output
           channel, s_j = max_i |W[i, j]| / 127 and q = round(W / s) ∈ int8; activations,
           norms, embeddings (W_E, W_P) and biases stay float32. A CPU product reads q:
           y = (x q)·s + b (``glassgpt.kernels.int8``).
    int4:  each block projection becomes W̃ = q·d, q ∈ [−8, 7] with one float16 scale per
           group of 32 inputs (``glassgpt.kernels.int4``); the unembedding int8 (see
           :func:`quantize_int4`); the rest as int8.

On a CPU a bf16 model decodes with float32 activations over its bf16 weights
(:func:`decoding_copy`), which its replayed steps need; small models in float32.

At batch 1 a decoding step reads every weight once and does two flops per weight read, so its
time is bounded by memory bandwidth: bf16 halves the bytes read per token, int8 quarters
them. The price is rounding, measured as the perplexity change on held-out text
(:func:`perplexity`).
"""

from __future__ import annotations

import copy
import math
import typing
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.errors import ConfigError, GlassError

if TYPE_CHECKING:
    from glassgpt.model.gpt import GPT, Block

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "int8": torch.int8,  # weights only: see cast
    "int4": torch.quint4x2,  # weights only (4-bit groups): see cast
}


def parse_dtype(name: str) -> torch.dtype:
    """``"bf16"`` → torch.bfloat16 (and float32, float16 under their usual names; ``"int8"``
    → torch.int8, int8 weights with float32 compute; ``"int4"`` → torch.quint4x2, its
    marker: 4-bit weights with float32 compute)."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ConfigError("dtype", f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def cast(model: GPT, dtype: torch.dtype | str, *, pack: bool = True, inplace: bool = False) -> GPT:
    """An inference copy of ``model`` (eval mode) with weights and computation in ``dtype``.

    The original is left as it is (with ``inplace``, ``model`` itself is cast). With ``pack`` (on a CPU with oneDNN), the copy's
    projections' products read pre-packed copies (see :func:`attach_kernels`): the same
    products, from a layout the CPU's GEMV kernels stream fastest.

    ``int8`` (CPU only): a float32 copy whose projections are W̃ = q·s (module docstring), so
    every reader of the weights (hooks, inspection, the tied embedding) computes the same
    function; each projection's inference product is registered with the kernel seam as
    y = (x q)·s + b, read from int8 weights whatever ``pack`` says. ``int4`` likewise, with
    4-bit block projections (:func:`quantize_int4`).
    """
    dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    p = next(model.parameters())
    if dtype == torch.float16 and p.device.type == "cpu":
        raise GlassError("float16 inference needs a GPU; use bf16 on a CPU")
    if dtype in (torch.int8, torch.quint4x2):
        name = "int8" if dtype == torch.int8 else "int4"
        if p.device.type != "cpu":
            raise GlassError(
                f"{name} weights run on a CPU only (got {p.device}); use bf16 on a GPU"
            )
        copy_ = (model if inplace else copy.deepcopy(model)).to(torch.float32).eval()
        (quantize_int8 if dtype == torch.int8 else quantize_int4)(copy_)
        return copy_
    copy_ = (model if inplace else copy.deepcopy(model)).to(dtype).eval()
    if pack:
        attach_kernels(copy_)
    return copy_


def quantize_int8(model: GPT) -> int:
    """Replace a float32 CPU model's projections by W̃ = q·s in place and register their int8
    products with the kernel seam (``glassgpt.kernels.int8.pack_int8``); returns how many."""

    tied = model.unembed.W_U is None
    unembed = model.embed.W_E if tied else model.unembed.W_U
    assert unembed is not None
    n = int(kernels.pack_int8(unembed, transposed=tied))
    return n + sum(kernels.pack_int8(W) for W in _projections(model))


def quantize_int4(model: GPT, *, unembed: str = "int8") -> int:
    """Replace a float32 CPU model's block projections by int4 W̃ = q·d in place (groups of 32
    inputs, ``glassgpt.kernels.pack_int4``) and the unembedding (W_E when tied) by int8 or,
    with ``unembed="int4"``, int4 too; returns how many. The unembedding stays int8 by
    default: it sets every logit, and int4 there costs more perplexity than all the blocks'
    (docs/performance.md, "int4")."""
    tied = model.unembed.W_U is None
    W_U = model.embed.W_E if tied else model.unembed.W_U
    assert W_U is not None
    pack_unembed = kernels.pack_int4 if unembed == "int4" else kernels.pack_int8
    n = int(pack_unembed(W_U, transposed=tied))
    return n + sum(kernels.pack_int4(W) for W in _projections(model))


def _projections(model: GPT) -> list[Tensor]:
    """Every block's W_QKV, W_O and MLP weights (W_in, W_out, and W_gate if gated)."""
    mats: list[Tensor] = []
    for block in _blocks(model):
        mlp, attn = block.mlp, block.attn
        mats += [attn.W_QKV, attn.W_O]
        if mlp is not None:
            mats += [mlp.W_in, mlp.W_out] + ([mlp.W_gate] if mlp.gated else [])
    return mats


def attach_kernels(model: GPT) -> int:
    """Register packed copies of an inference model's projections (CPU) with the kernel seam
    (``glassgpt.kernels.pack``); returns how many.

    - bfloat16: every projection (W_QKV, W_O, W_in, W_gate, W_out, the unembedding) gets a
      bf16 panel copy that glassgpt's small-batch kernel streams for a decoding step's rows,
      made at its first decoding step (loading holds the weights once); prompts take
      PyTorch's bf16 products where the CPU has bf16 arithmetic, else float32 products
      (``glassgpt.kernels.dense.pack``). Decoding runs on :func:`decoding_copy`.
    - float32: every projection takes glassgpt's own small-batch kernel when it is built
      (decoding streams each weight once, in its stored layout); without it, only the
      unembedding is packed: a contiguous copy of W_U (= W_Eᵀ when tied), the layout in
      which one token's x W_U streams fastest.

    The weights themselves are untouched (so hooks, training and the embedding see them);
    a packed copy goes unused as soon as its weight changes in place.
    """
    p = next(model.parameters())
    if p.device.type != "cpu" or p.dtype not in (torch.float32, torch.bfloat16):
        return 0
    tied = model.unembed.W_U is None
    unembed = model.embed.W_E if tied else model.unembed.W_U
    assert unembed is not None
    if not kernels.pack(unembed, transposed=tied):
        return 0
    if p.dtype == torch.float32 and not kernels.has_small_batch_kernel():
        return 1
    return 1 + sum(kernels.pack(W) for W in _projections(model))


# Below this many projection weights a bf16 model decodes in float32 on a CPU: its weights
# stream from the core's own caches, where halving the bytes gains nothing and widening each
# bf16 weight costs (bench/generate.py --dtypes, 2 threads of a Zen 4 EPYC under load: 0.8M
# weights decoded 1.5x slower in bf16 than in float32, 3.1M 1.4x faster, the README's
# default model (10.6M) 1.9x faster, GPT-2 small 2.1x).
BF16_MIN_WEIGHTS = 2_000_000


def decoding_copy(model: GPT) -> tuple[GPT, str] | None:
    """For a bf16 model on a CPU, a copy that decodes the same weights with float32
    activations, and in a few words what it computes; None for other models.

        x_{l+1} = Block_l(x_l) in float32,  every product x W̃ + b with W̃ = round_bf16(W)

    The projections (W_QKV, W_O, W_in, W_gate, W_out, an untied W_U) are the model's own bf16
    tensors, shared, not copied; their products take float32 x (``glassgpt.kernels.pack``'s
    bf16 panels); the rest (embeddings, norms, biases) are float32 copies of the bf16
    values, and the tied unembedding reads the bf16 W_E's panels. Every operation of its
    one-token step is then one that a replayed step records (``glassgpt.sample.replay``).
    A model with fewer than :data:`BF16_MIN_WEIGHTS` projection weights gets a float32 copy
    instead (``cast(model, "float32")``), faster there.
    """
    W_E = model.embed.W_E
    if W_E.device.type != "cpu" or W_E.dtype != torch.bfloat16:
        return None
    tied = model.unembed.W_U is None
    shared = _projections(model) + ([] if tied else [model.unembed.W_U])
    n = sum(W.numel() for W in shared)
    if n < BF16_MIN_WEIGHTS:
        return cast(model, "float32"), f"float32 (a model of {n / 1e6:.1f}M projection weights " \
            "decodes faster in float32 than in bf16 on a CPU)"  # fmt: skip
    for W in shared:
        if not kernels.is_packed(W):
            kernels.pack(W)
    if tied and not kernels.is_packed(W_E, transposed=True):
        kernels.pack(W_E, transposed=True)
    twin = copy.deepcopy(model, {id(W): W for W in shared}).eval()
    ids = {id(W) for W in shared}
    with torch.no_grad():
        for t in (*twin.parameters(), *twin.buffers()):
            if id(t) not in ids and t.is_floating_point() and t.dtype != torch.float32:
                t.data = t.data.float()
    if tied:
        kernels.alias(twin.embed.W_E, W_E, transposed=True)
    return twin, "bf16 weights with float32 activations"


def _blocks(model: GPT) -> list[Block]:
    return [typing.cast("Block", block) for block in model.blocks]


def perplexity(model: GPT, tokens: Tensor, seq_len: int | None = None) -> float:
    """exp(mean next-token cross-entropy) over non-overlapping windows of a 1-D id tensor.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=7, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    >>> ppl = perplexity(model, torch.randint(0, 7, (100,)))
    >>> 6.5 < ppl < 7.5       # an untrained model is close to uniform over 7 ids
    True
    """
    n_ctx = model.config.n_ctx
    L = min(seq_len or n_ctx, n_ctx)
    n = (tokens.numel() - 1) // L
    if n < 1:
        raise GlassError(f"need more than {L} tokens to measure perplexity, got {tokens.numel()}")
    x = tokens[: n * L].view(n, L)
    y = tokens[1 : n * L + 1].view(n, L)
    device = next(model.parameters()).device
    total, batch = 0.0, 8
    with torch.inference_mode():
        for i in range(0, n, batch):
            xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
            _, loss = model(xb, yb)
            total += float(loss) * xb.shape[0]
    return math.exp(total / n)
