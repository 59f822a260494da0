"""The memory model per rank (glassgpt.model.memory) against the parameters of a real GPT
and the whole-model estimate; ``glassgpt describe --world-size``."""

from __future__ import annotations

import math

import pytest

from glassgpt.cli import main
from glassgpt.errors import ConfigError
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.memory import (
    block_parameters,
    estimate_training_memory,
    per_rank_memory,
    shard_count,
)

CONFIGS = [
    GPTConfig.preset("cpu-tiny"),
    GPTConfig(n_vocab=50, n_ctx=16, d_model=24, n_layers=3, n_heads=3, bias=False, mlp="gated"),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shards_cover_the_parameters_once(config: GPTConfig, world: int) -> None:
    model = GPT(config)
    tensors = list(model.state_dict().values())
    n = sum(t.numel() for t in tensors)
    assert shard_count(config, world) == sum(math.ceil(t.numel() / world) for t in tensors)
    assert n <= world * shard_count(config, world) < n + world * len(tensors)
    assert block_parameters(config) == sum(p.numel() for p in model.blocks[0].parameters())


@pytest.mark.parametrize("config", CONFIGS)
def test_ddp_is_the_whole_model_and_fsdp_divides_the_state(config: GPTConfig) -> None:
    whole = estimate_training_memory(config, 4, 16, "bfloat16", device="cuda")
    ddp = per_rank_memory(config, 4, 16, "bfloat16", world_size=4, parallel="ddp")
    fsdp = per_rank_memory(config, 4, 16, "bfloat16", world_size=4, parallel="fsdp")
    assert (ddp.weights, ddp.gradients, ddp.optimizer) == (
        whole.weights,
        whole.gradients,
        whole.optimizer,
    )
    assert ddp.communication == whole.gradients  # DDP's buckets: a copy of the gradients
    assert ddp.activations == fsdp.activations == whole.activations
    k = shard_count(config, 4)
    assert (fsdp.weights, fsdp.gradients, fsdp.optimizer) == (4 * k, 4 * k, 8 * k)
    n_block = block_parameters(config)
    n_root = shard_count(config, 1) - config.n_layers * n_block
    assert fsdp.communication == 2 * (n_root + 2 * n_block) * 2  # bf16 gathered copies
    assert fsdp.total == sum(v for key, v in fsdp.as_dict().items() if key != "total")


def test_bad_world_size_and_parallel_name_the_field() -> None:
    config = CONFIGS[0]
    with pytest.raises(ConfigError, match="world_size"):
        per_rank_memory(config, 1, 8, world_size=0)
    with pytest.raises(ConfigError, match="parallel"):
        per_rank_memory(config, 1, 8, world_size=2, parallel="zero")


def test_describe_world_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["describe", "--preset", "gpt2", "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("## Memory per rank (W = 4)") :]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
        for line in section.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    assert rows["component"] == ["DDP", "FSDP"]
    assert rows["activations"][0] == rows["activations"][1]
    assert main(["describe", "--preset", "gpt2"]) == 0
    assert "Memory per rank" not in capsys.readouterr().out
