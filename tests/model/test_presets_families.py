"""The family presets are the real models' shapes: each preset's GPTConfig equals what
``from_hf`` maps from the model's own ``config.json`` (written out below from the public
files), and the parameter count that ``describe`` prints (and ``count_parameters``) equals
transformers' count of the same config built on the meta device (no memory, no weights).

The small Llama-shaped preset trains from scratch on the bundled corpus, its loss falling.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from glassgpt.cli import main
from glassgpt.interop import config_from_hf
from glassgpt.model.accounting import count_parameters
from glassgpt.train.model_config import resolve_config
from glassgpt.train.resolve import preset_descriptions

transformers = pytest.importorskip("transformers")

_GEMMA3_LAYERS = (["sliding_attention"] * 5 + ["full_attention"]) * 3

# config.json of each model on the hub (the fields that shape the function; the rest —
# token ids, dtype, use_cache — are left out), with its real parameter count
HF: dict[str, tuple[dict[str, Any], int]] = {
    "smollm2-135m": ({  # HuggingFaceTB/SmolLM2-135M
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000,
        "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True,
        "initializer_range": 0.041666666666666664,
    }, 134_515_008),
    "llama-3.2-1b": ({  # meta-llama/Llama-3.2-1B
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": {
            "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True, "initializer_range": 0.02,
    }, 1_235_814_400),
    "qwen3-0.6b": ({  # Qwen/Qwen3-0.6B
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "max_window_layers": 28,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "sliding_window": None,
        "use_sliding_window": False, "tie_word_embeddings": True, "initializer_range": 0.02,
    }, 596_049_920),
    "pythia-160m": ({  # EleutherAI/pythia-160m
        "model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768,
        "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "rotary_emb_base": 10000,
        "rotary_pct": 0.25, "hidden_act": "gelu", "use_parallel_residual": True,
        "tie_word_embeddings": False, "initializer_range": 0.02,
    }, 162_322_944),
    "gemma-3-270m": ({  # google/gemma-3-270m
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "rope_scaling": None, "sliding_window": 512,
        "layer_types": _GEMMA3_LAYERS, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None, "final_logit_softcapping": None,
        "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": False,
        "tie_word_embeddings": True, "initializer_range": 0.02,
    }, 268_098_176),
}  # fmt: skip


def hf_config(name: str) -> Any:
    """transformers' config object of the model (its own class, its own defaults)."""
    d = dict(HF[name][0])
    return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


def meta_count(config: Any) -> int:
    """transformers' parameter count, the model built on the meta device (a tied W_U once)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(HF))
def test_the_preset_is_what_from_hf_maps_from_the_models_config(name: str) -> None:
    preset, _ = resolve_config(name, None, [])
    assert preset == config_from_hf(hf_config(name))


@pytest.mark.parametrize("name", list(HF))
def test_describe_counts_what_transformers_counts(name: str, capsys) -> None:
    expected = HF[name][1]
    assert meta_count(hf_config(name)) == expected  # the public configs, read right
    config, _ = resolve_config(name, None, [])
    assert count_parameters(config) == expected
    assert main(["describe", "--preset", name]) == 0
    out = capsys.readouterr().out
    printed = re.search(r"^N = ([\d,]+) parameters", out, re.M)
    assert printed is not None and int(printed.group(1).replace(",", "")) == expected


def test_presets_lists_each_with_its_line(capsys) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = dict(preset_descriptions())
    for name in [*HF, "llama-tiny-cpu"]:
        line = next(line for line in out if line.split()[0] == name)
        assert rows[name] and rows[name] in line


def test_llama_tiny_cpu_is_llama_shaped_at_the_default_presets_size() -> None:
    llama, _ = resolve_config("llama-tiny-cpu", None, [])
    default, _ = resolve_config("default", None, [])
    assert (llama.positional, llama.norm, llama.mlp, llama.bias) == (
        "rope",
        "rmsnorm",
        "swiglu",
        False,
    )
    assert (llama.n_heads, llama.kv_heads) == (4, 2)
    for field in ("n_vocab", "n_ctx", "d_model", "n_layers", "n_heads"):
        assert getattr(llama, field) == getattr(default, field), field
    # within 5% of the default's parameters, so it trains in about the same time
    assert count_parameters(llama) == pytest.approx(count_parameters(default), rel=0.05)


def test_llama_tiny_cpu_trains_on_the_bundled_corpus(tmp_path: Path) -> None:
    # the preset's model as it is; shorter windows, a smaller batch and no warmup keep it fast
    out = tmp_path / "run"
    sets = ["train.max_steps=8", "train.warmup_steps=1", "train.batch_size=4", "train.seq_len=32",
            "train.eval_every=8", "train.eval_batches=1", "train.checkpoint_every=8",
            "train.sample_tokens=0", "data.max_bytes=100000"]  # fmt: skip
    args = ["train", "--preset", "llama-tiny-cpu", "-o", str(out)]
    assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < losses[0] - 0.3, losses  # from ≈ ln 512 = 6.24
