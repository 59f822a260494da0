"""``to_hf`` and ``glassgpt export --format hf`` of models made in glassgpt: each config is
written as the transformers family that computes it (a RoPE, RMSNorm, SwiGLU model without
biases is a ``LlamaForCausalLM``), which loads with equal logits; a config no family
expresses is refused in one line naming the field, and nothing is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.errors import ConfigError
from glassgpt.interop import from_hf, to_hf
from glassgpt.interop.hf_export import family_for
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BASE = {"n_vocab": 30, "n_ctx": 10, "d_model": 32, "n_layers": 2, "n_heads": 4,
        "init_std": 0.2, "tie_embeddings": False}  # fmt: skip
LLAMA = {**BASE, "positional": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}
GEMMA = {**LLAMA, "mlp": "gated", "mlp_gate": "gelu_tanh", "mlp_value": "identity",
         "norm_offset": 1.0, "sandwich_norm": True, "embed_scale": 32**0.5}  # fmt: skip

FAMILIES = {  # config, the class transformers builds
    "plain Llama": (LLAMA, "LlamaForCausalLM"),
    "grouped, llama3-scaled, tied": ({**LLAMA, "n_kv_heads": 2, "rope_scaling": "llama3",
                                      "rope_factor": 4.0, "rope_original_ctx": 6,
                                      "tie_embeddings": True}, "LlamaForCausalLM"),
    "GeGLU": ({**LLAMA, "mlp": "geglu"}, "LlamaForCausalLM"),
    "every projection biased": ({**LLAMA, "bias": True, "n_kv_heads": 2}, "LlamaForCausalLM"),
    "every layer sliding": ({**LLAMA, "sliding_window": 3}, "MistralForCausalLM"),
    "b_Q, b_K, b_V": ({**LLAMA, "qkv_bias": True, "n_kv_heads": 1}, "Qwen2ForCausalLM"),
    "b_Q, b_K, b_V, mixed windows": ({**LLAMA, "qkv_bias": True, "sliding_window": 3,
                                      "layer_types": ("sliding", "full")}, "Qwen2ForCausalLM"),
    "q/k-norms": ({**LLAMA, "qk_norm": True, "rope_scaling": "yarn", "rope_factor": 2.0},
                  "Qwen3ForCausalLM"),
    "LayerNorm, biases": ({**BASE, "positional": "rope", "mlp": "gelu"}, "GPTNeoXForCausalLM"),
    "no biases, parallel, partial": ({**BASE, "positional": "rope", "bias": False,
                                      "parallel_residual": True, "rotary_fraction": 0.25},
                                     "GPTNeoXForCausalLM"),
    "Gemma 2": ({**GEMMA, "attn_softcap": 1.5, "final_softcap": 2.0, "attn_scale": 12**-0.5,
                 "sliding_window": 3, "layer_types": ("sliding", "full")}, "Gemma2ForCausalLM"),
    "Gemma 3": ({**GEMMA, "qk_norm": True, "sliding_window": 3, "rope_local_base": 50.0,
                 "layer_types": ("sliding", "full"), "rope_scaling": "linear",
                 "rope_factor": 2.0}, "Gemma3ForCausalLM"),
}  # fmt: skip


def _random(config: dict[str, Any]) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_dict(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or name.endswith(("b_QKV", ".w")):  # biases and gains: not 0 and 1
                p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_config_is_written_as_the_family_that_computes_it(name: str, tmp_path: Path) -> None:
    config, architecture = FAMILIES[name]
    model = _random(config)
    to_hf(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [architecture]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == architecture
    x = torch.randint(0, 30, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(x), hf(x).logits
    assert theirs.abs().max() > 0.5
    assert float((ours - theirs).abs().max()) <= 1e-5
    again = from_hf(tmp_path)
    with torch.no_grad():
        assert float((again(x) - ours).abs().max()) <= 1e-5  # (a Gemma's √d: float32's, back)


REFUSED = {  # change to the plain Llama, the field named
    "sinusoidal positions": ({"positional": "sinusoidal"}, "positional"),
    "no positions": ({"positional": "none"}, "positional"),
    "post-norm": ({"norm_placement": "post"}, "norm_placement"),
    "attention only": ({"attn_only": True}, "attn_only"),
    "an ungated MLP with RMSNorm": ({"mlp": "gelu"}, "mlp"),
    "a gated MLP with a gated value": ({"mlp": "gated", "mlp_value": "sigmoid"}, "mlp"),
    "q/k-norms with every bias": ({"bias": True, "qk_norm": True}, "qk_norm"),
    "a parallel Llama": ({"parallel_residual": True}, "parallel_residual"),
    "partial rotary with RMSNorm": ({"rotary_fraction": 0.5}, "rotary_fraction"),
    "q/k-norms and q, k, v biases": ({"qk_norm": True, "qkv_bias": True}, "qkv_bias"),
    "mixed windows in a Llama": ({"sliding_window": 3, "layer_types": ("sliding", "full")},
                                 "layer_types"),
    "a capped Llama": ({"final_softcap": 5.0}, "final_softcap"),
    "a Llama scaled otherwise": ({"attn_scale": 0.1}, "attn_scale"),
    "grouped NeoX": ({"norm": "layernorm", "mlp": "gelu", "bias": True, "n_kv_heads": 2},
                     "n_kv_heads"),
    "gated NeoX": ({"norm": "layernorm", "bias": True}, "mlp"),
    "Gemma 2 with a local base": ({**GEMMA, "sliding_window": 3, "rope_local_base": 9.0},
                                  "rope_local_base"),
    "Gemma 3 with an attention cap": ({**GEMMA, "qk_norm": True, "attn_softcap": 3.0},
                                      "attn_softcap"),
    "a Gemma without √d": ({**GEMMA, "embed_scale": 2.0}, "embed_scale"),
    "a Gemma scaled by no integer": ({**GEMMA, "attn_scale": 0.3}, "attn_scale"),
    "half a Gemma": ({"norm_offset": 1.0}, "sandwich_norm"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_config_no_family_expresses_is_refused_naming_the_field(
    name: str, tmp_path: Path
) -> None:
    change, field = REFUSED[name]
    model = GPT(GPTConfig.from_dict({**LLAMA, **change}))
    with pytest.raises(ConfigError) as info:
        to_hf(model, tmp_path / "out")
    assert info.value.field == field and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_family_for_reads_gpt2_as_before() -> None:
    assert family_for(GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=1, n_heads=2)) == "gpt2"
    with pytest.raises(ConfigError) as info:  # learned positions with a family field
        family_for(GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1))
    assert info.value.field == "n_kv_heads"


@pytest.fixture
def llama_run(tmp_path: Path) -> Path:
    tok = CharTokenizer("abcdefghij ", special_tokens=["<|endoftext|>"])
    model = _random({**LLAMA, "n_vocab": tok.n_vocab, "n_kv_heads": 2})
    return write_run(tmp_path / "run", model, tok)


def test_export_format_hf_writes_a_llama_transformers_loads(
    llama_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    assert main(["export", "-c", str(llama_run), "--format", "hf", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    ids = tok("abc dea")["input_ids"]
    ours = from_hf(out)
    with torch.no_grad():
        x = torch.tensor([ids])
        assert float((ours(x) - hf(x).logits).abs().max()) <= 1e-5


def test_export_of_a_config_no_family_expresses_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = CharTokenizer("abcdefghij ", special_tokens=["<|endoftext|>"])
    model = GPT(GPTConfig.from_dict({**LLAMA, "n_vocab": tok.n_vocab, "positional": "sinusoidal"}))
    run = write_run(tmp_path / "run", model, tok)
    assert main(["export", "-c", str(run), "--format", "hf", "-o", str(tmp_path / "hf")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glassgpt: error: positional: ")
    assert not (tmp_path / "hf" / "model.safetensors").exists()
