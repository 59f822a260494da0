"""Training memory per rank of W data-parallel ranks: replicated (DDP) or fully sharded (FSDP).

With N parameters stored in s bytes (float32: 4), N_b those of one block and N_r the rest
(embeddings, final norm, unembedding), s_c the bytes of the compute copies (2 under bf16
mixed precision, else s), and A the activations of one rank's micro-batch
(:func:`glassgpt.model.memory.activation_bytes`, the same under both):

    DDP   weights N·s,   gradients N·s,   optimizer 8·N (+4·N master if s < 4),
          buckets N·s    (DDP copies the gradients into its all-reduce buckets)
    FSDP  weights ⌈N/W⌉·s, gradients ⌈N/W⌉·s, optimizer 8·⌈N/W⌉ (+…), each rank its shards;
          gathered 2·(N_r + 2·N_b)·s_c   (whole parameters while they compute: the root's, kept
          through the step, and two blocks', the one computing and the one prefetched; as much
          again for their gradients before the reduce-scatter)

⌈N/W⌉ is taken per parameter (the largest rank's share). The gathered term is an estimate of
the peak, not a measurement. Pure Python, like :mod:`glassgpt.model.memory`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from glassgpt.errors import ConfigError
from glassgpt.model.accounting import parameter_shapes
from glassgpt.model.config import GPTConfig
from glassgpt.model.memory import estimate_training_memory, itemsize

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
    """One rank's bytes (the module docstring's formulas) at micro-batch B = ``batch_size``
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
