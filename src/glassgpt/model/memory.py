"""Training memory of the GPT function: bytes of one AdamW step at batch B × T.

    weights   = N · s_param
    gradients = N · s_param
    optimizer = 2 · 4 · N            (first and second moments in float32)
              + 4 · N if s_param < 4 (a float32 master copy of low-precision weights)
    activations: see :func:`activation_bytes` (what autograd saves for the backward).

Per rank of W data-parallel ranks (:func:`per_rank_memory`), with N_b the parameters of one
block, N_r the rest (embeddings, final norm, unembedding), s_c the bytes of the compute
copies (2 under bf16 mixed precision, else s) and A the activations of one rank's
micro-batch (the same under both):

    DDP   weights N·s,   gradients N·s,   optimizer 8·N (+4·N master if s < 4),
          buckets N·s    (DDP copies the gradients into its all-reduce buckets)
    FSDP  weights ⌈N/W⌉·s, gradients ⌈N/W⌉·s, optimizer 8·⌈N/W⌉ (+…), each rank its shards;
          gathered 2·(N_r + 2·N_b)·s_c   (whole parameters while they compute: the root's, kept
          through the step, and two blocks', the one computing and the one prefetched; as much
          again for their gradients before the reduce-scatter)

⌈N/W⌉ is taken per parameter (the largest rank's share). The gathered term is an estimate of
the peak, not a measurement.

N from :func:`glassgpt.model.accounting.count_parameters`. What each operation keeps for the
backward depends on the kernel it takes on the device: the kernels declare it
(``glassgpt.kernels.norm_kept``, ``attention_kept``, ``activation_kept``), so this module
holds the model's arithmetic and no device rules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from glassgpt import kernels
from glassgpt.errors import ConfigError
from glassgpt.model.accounting import _int, count_parameters, parameter_shapes
from glassgpt.model.config import GPTConfig

_ITEMSIZE = {
    "float64": 8,
    "double": 8,
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
}


def itemsize(dtype: Any) -> int:
    """Bytes per element of a floating dtype given by name or as a ``torch.dtype``.

    >>> [itemsize(d) for d in ("float32", "bf16", "float64")]
    [4, 2, 8]
    """
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _ITEMSIZE:
        raise ConfigError(
            "dtype", f"unknown floating dtype {dtype!r}; known: {', '.join(_ITEMSIZE)}"
        )
    return _ITEMSIZE[name]


def weight_bytes(config: GPTConfig, dtype: Any = "float32") -> int:
    """N · itemsize(dtype).

    >>> weight_bytes(GPTConfig.preset("gpt2", bias=False), "bf16")
    248675328
    """
    return count_parameters(config) * itemsize(dtype)


def activation_bytes(
    config: GPTConfig,
    batch_size: int,
    seq_len: int,
    dtype: Any = "float32",
    *,
    param_dtype: Any = "float32",
    attn_impl: str = "sdpa",
    device: str = "cpu",
) -> int:
    """Bytes autograd keeps from the forward pass for the backward, at batch B × T, on
    ``device`` (a device type: the attention kernel, and so what it keeps, depends on it).

    r = itemsize of the weights (and so of the residual stream), s = of the compute dtype
    (s < r under autocast). Per token and block:

    - each norm: its input (r·d), its output as the next matmul's input (s·d), float32
      statistics; RMSNorm (a composite kernel) also keeps x/rms (r·d), except in float32 on a
      CPU, where glassgpt's kernel keeps what the layer norm keeps (``kernels.norms``);
    - attention, fused kernel: the q|k|v buffer and z (s·4·H·d_head), a float32 log-sum-exp
      per head (glassgpt's float32 causal kernel on a CPU: P instead, 4·H·T rounded up to
      16, where it keeps it, up to 4 d_head keys), and with RoPE the rotated q and k (s·2·H·d_head); the explicit path keeps
      q, k, v, z and the pattern (s·H·T), with dropout also its mask and the dropped
      pattern (s·2·H·T); on a CPU (``glassgpt.kernels.policy``) dropout on the pattern sends
      the fused kernel to its float32 fallback, which keeps q, k, v, the pattern, its mask
      and the dropped pattern (4 bytes), and bf16 heads narrower than 64 take the explicit
      product up to 128 keys, which keeps q, k, v, z, the float32 softmax (4·H·T) and its
      bf16 copy (s·H·T), and the float32 fused kernel beyond;
    - MLP: the matmul input of W_out and each activation's input (GELU, SiLU) or output
      (ReLU, sigmoid, tanh): s·2·d_mlp (ReLU s·d_mlp; the tanh GELU on a CPU in float64, or
      in float32 without glassgpt's GELU kernel, also its gate σ(·), s·3·d_mlp); gated:
      σ(gate), σ'(value) and
      their product, plus each arm's pre-activation where its σ keeps its input; under
      autocast the two arms cast their input separately (s·d);
    - dropout > 0: a mask like each residual branch (s·d each) and like x₀ (r·d).

    Then the post-norm model's x₀ (s·d), the final norm (pre-norm), the logits (s·n_vocab,
    held by the caller), the cross-entropy's float32 log-probabilities and the int64
    tokens and targets. Once per step, under autocast: the s-byte copy of every matmul weight
    (W_QKV, W_O, the MLP's, the unembedding). ``tests/model/test_accounting.py`` checks this
    against what autograd saves.
    """
    c = config
    s, r = itemsize(dtype), itemsize(param_dtype)
    for field, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(field, f"must be a positive integer, got {value!r}")
    if attn_impl not in ("sdpa", "explicit"):
        raise ConfigError("attn_impl", f"must be 'sdpa' or 'explicit', got {attn_impl!r}")
    d, H, dh, dm, T, V = c.d_model, c.n_heads, _int(c.d_head), _int(c.d_mlp), seq_len, c.n_vocab
    dropout, autocast = c.dropout > 0.0, s < r
    norm = kernels.norm_kept(c.norm, d, r, s, device)
    attn = kernels.attention_kept(H, dh, T, s, device, autocast=autocast, dropout=dropout,
                                  explicit=attn_impl == "explicit",
                                  rope=c.positional == "rope")  # fmt: skip
    gate, value = c.mlp_activations
    if value is None:
        mlp = s * dm * (1 + kernels.activation_kept(gate, s, device, autocast=autocast))
    else:
        kept_inputs = sum(kernels.activation_kept(a, s, device, autocast=autocast)
                          for a in (gate, value))  # fmt: skip
        mlp = s * dm * (3 + kept_inputs) + (s * d if autocast else 0)
    mlp += dm * sum(kernels.activation_copy_kept(a, s, device) for a in (gate, value))
    if c.attn_only:  # no MLP sublayer and no second norm
        per_block = norm + attn + (s * d if dropout else 0)
    else:
        per_block = 2 * norm + attn + mlp + (2 * s * d if dropout else 0)
    per_token = c.n_layers * per_block + s * V + 4 * V + 2 * 8
    per_token += norm if c.final_norm else s * d
    per_token += r * d if dropout else 0
    weights = 0
    if autocast:  # a low-precision copy of each matmul weight, kept for the backward
        mlp_w = 0 if c.attn_only else (3 if c.gated else 2) * d * dm
        qkvo = (2 * H + 2 * c.kv_heads) * dh * d  # W_QKV and W_O
        weights = s * (c.n_layers * (qkvo + mlp_w) + d * V)
    return batch_size * seq_len * per_token + weights


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one training step by component (see the module docstring for the formulas)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def as_dict(self) -> dict[str, int]:
        """Each component and the total."""
        return {**asdict(self), "total": self.total}


def estimate_training_memory(
    config: GPTConfig,
    batch_size: int,
    seq_len: int,
    dtype: Any = "float32",
    *,
    param_dtype: Any = "float32",
    attn_impl: str = "sdpa",
    device: str = "cpu",
) -> MemoryEstimate:
    """Bytes for one AdamW step at batch B × T, with activations in ``dtype`` (the autocast
    dtype, or the weights' dtype without autocast) and weights stored in ``param_dtype``, on
    ``device`` (a device type, ``"cpu"`` or ``"cuda"``).

    >>> m = estimate_training_memory(GPTConfig.preset("gpt2"), 8, 1024, "bfloat16", device="cuda")
    >>> m.optimizer == 2 * m.weights, format_bytes(m.weights), format_bytes(m.activations)
    (True, '475 MiB', '5.10 GiB')

    (On a CPU the attention kernels, and so what they keep, depend on the processor: bf16
    without bf16 instructions keeps float32 copies, ``glassgpt.kernels.policy``.)
    """
    n = count_parameters(config)
    p = itemsize(param_dtype)
    master = 4 * n if p < 4 else 0
    return MemoryEstimate(
        weights=n * p,
        gradients=n * p,
        optimizer=8 * n + master,
        activations=activation_bytes(
            config,
            batch_size,
            seq_len,
            dtype,
            param_dtype=param_dtype,
            attn_impl=attn_impl,
            device=device,
        ),
    )


def format_bytes(n: int) -> str:
    """Binary units, three significant figures.

    >>> format_bytes(3 * 2**30), format_bytes(1536), format_bytes(12), format_bytes(500 * 2**20)
    ('3.00 GiB', '1.50 KiB', '12 B', '500 MiB')
    """
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1000:
            break
        value, unit = value / 1024, bigger
    decimals = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{decimals}f} {unit}"


PARALLEL = ("ddp", "fsdp")


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds for one training step, by component."""

    weights: int
    gradients: int
    optimizer: int
    communication: int  # DDP's gradient buckets; FSDP's gathered parameters and gradients
    activations: int

    @property
    def total(self) -> int:
        return (
            self.weights + self.gradients + self.optimizer + self.communication + self.activations
        )

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def shard_count(config: GPTConfig, world_size: int) -> int:
    """Σ over parameters of ⌈numel / W⌉: the most parameters any rank holds under FSDP.

    >>> c = GPTConfig.preset("gpt2")
    >>> shard_count(c, 1) == 124439808, shard_count(c, 8) * 8 - 124439808 < 8 * 200
    (True, True)
    """
    return sum(-(-math.prod(s) // world_size) for s in parameter_shapes(config).values())


def block_parameters(config: GPTConfig) -> int:
    """N_b: the parameters of one block (``blocks.0.*``)."""
    shapes = parameter_shapes(config)
    return sum(math.prod(s) for k, s in shapes.items() if k.startswith("blocks.0."))


def per_rank_memory(
    config: GPTConfig,
    batch_size: int,
    seq_len: int,
    dtype: Any = "float32",
    *,
    world_size: int,
    parallel: str = "ddp",
    param_dtype: Any = "float32",
    device: str = "cuda",
) -> RankMemory:
    """One rank's bytes (the module docstring's per-rank formulas) at micro-batch B = ``batch_size``
    per rank, activations in ``dtype`` (the autocast dtype).

    >>> c = GPTConfig.preset("gpt2")
    >>> ddp = per_rank_memory(c, 8, 1024, "bfloat16", world_size=8, parallel="ddp")
    >>> fsdp = per_rank_memory(c, 8, 1024, "bfloat16", world_size=8, parallel="fsdp")
    >>> ddp.activations == fsdp.activations, round(ddp.optimizer / fsdp.optimizer, 2)
    (True, 8.0)
    """
    if not (isinstance(world_size, int) and not isinstance(world_size, bool) and world_size >= 1):
        raise ConfigError("world_size", f"must be a positive integer, got {world_size!r}")
    if parallel not in PARALLEL:
        raise ConfigError("parallel", f"must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    whole = estimate_training_memory(
        config, batch_size, seq_len, dtype, param_dtype=param_dtype, device=device
    )
    s = itemsize(param_dtype)
    master = 4 if s < 4 else 0
    if parallel == "ddp":
        n = whole.weights // s
        return RankMemory(whole.weights, whole.gradients, whole.optimizer, n * s, whole.activations)
    n_shard = shard_count(config, world_size)
    n_block = block_parameters(config)
    n_root = shard_count(config, 1) - config.n_layers * n_block
    s_c = min(s, itemsize(dtype))  # bf16 autocast: the gathered copies are bf16
    return RankMemory(
        weights=n_shard * s,
        gradients=n_shard * s,
        optimizer=(8 + master) * n_shard,
        communication=2 * (n_root + 2 * n_block) * s_c,
        activations=whole.activations,
    )
