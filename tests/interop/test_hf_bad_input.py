"""HF folders glassgpt cannot read as they are: each is one line naming the problem.

- a family glassgpt does not implement (Mamba, BERT): its ``model_type`` and the families known;
- a field of a known family that glassgpt cannot express: the field, never a silently
  different function;
- weights missing, unexpected or of the wrong shape: the tensor.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.interop.hf_cases import CASES, make

from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.interop import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SRC = Path(__file__).resolve().parents[2] / "src"
FAMILIES = "gpt2, llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gpt_neox"


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and len(text) < 300, text
    return text


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    make(CASES["llama-gqa2-llama3-untied"]).save_pretrained(folder)
    return folder


def config_of(case: str) -> dict[str, Any]:
    return make(CASES[case]).config.to_dict()


@pytest.mark.parametrize("model_type", ["mamba", "bert"])
def test_a_family_glassgpt_does_not_implement_is_named_with_those_it_knows(
    model_type: str, tmp_path: Path
) -> None:
    kind = {"mamba": transformers.MambaConfig, "bert": transformers.BertConfig}[model_type]
    kind(hidden_size=16, num_hidden_layers=1).save_pretrained(tmp_path)
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError) as info:
        open_run(tmp_path)
    assert one_line(info.value) == (
        f"model_type: {model_type!r} is not a family glassgpt implements; it reads {FAMILIES}"
    )
    with pytest.raises(ConfigError, match=r"model_type: 'mamba'"):
        config_from_hf({"model_type": "mamba"})


def test_the_command_line_says_it_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    transformers.MambaConfig(hidden_size=16, num_hidden_layers=1).save_pretrained(tmp_path)
    save_file({"w": torch.zeros(2)}, tmp_path / "model.safetensors")
    env = dict(os.environ, PYTHONPATH=str(SRC))
    env.pop("GLASSGPT_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "glassgpt", "sample", "-c", str(tmp_path), "--prompt", "x"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"glassgpt: error: model_type: 'mamba' is not a family glassgpt implements; "
        f"it reads {FAMILIES}"
    )


UNEXPRESSIBLE = {  # case, change to its config.json, the field named
    "dynamic rope": ("llama-gqa2-llama3-untied",
                     {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
                     "rope_parameters.rope_type"),
    "longrope, transformers 4's key": ("llama-mha-linear-wide-heads",
                                       {"rope_parameters": None, "rope_theta": 1e4,
                                        "rope_scaling": {"type": "longrope", "factor": 2.0}},
                                       "rope_scaling.rope_type"),
    "an activation": ("llama-gqa2-llama3-untied", {"hidden_act": "quick_gelu"}, "hidden_act"),
    "o bias without MLP biases": ("llama-gqa2-llama3-untied", {"attention_bias": True},
                                  "attention_bias"),
    "MLP biases alone": ("llama-gqa2-llama3-untied", {"mlp_bias": True}, "mlp_bias"),
    "Qwen 3 with attention biases": ("qwen3-gqa2-untied", {"attention_bias": True},
                                     "attention_bias"),
    "partial rotary in a Llama": ("qwen2-gqa2-tied",
                                  {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                       "partial_rotary_factor": 0.5}},
                                  "rope_parameters.partial_rotary_factor"),
    "scaled local RoPE": ("gemma3-local-base-linear-full",
                          {"rope_parameters": {
                              "full_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "sliding_attention": {"rope_type": "linear", "rope_theta": 10.0,
                                                    "factor": 2.0}}},
                          "rope_parameters.sliding_attention.rope_type"),
    "bidirectional": ("gemma3-local-base-linear-full", {"use_bidirectional_attention": True},
                      "use_bidirectional_attention"),
    "DeepSeek's YaRN": ("llama-gqa3-yarn-tied",
                        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0,
                                             "mscale": 1.0, "mscale_all_dim": 0.7}},
                        "rope_parameters.mscale"),
    "NeoX with SiLU": ("neox-parallel-quarter-rotary", {"hidden_act": "silu"}, "hidden_act"),
    "NeoX without attention biases": ("neox-parallel-quarter-rotary", {"attention_bias": False},
                                      "attention_bias"),
    "a quantised checkpoint": ("mistral-gqa4-window3",
                               {"quantization_config": {"quant_method": "gptq"}},
                               "quantization_config"),
    "an HF dropout": ("gemma2-softcaps-window3", {"attention_dropout": 0.1}, "attention_dropout"),
    "sliding layers without a window": ("qwen2-window4-upper-layers",
                                        {"sliding_window": None}, "sliding_window"),
    "layer types of another depth": ("gemma2-untied-uncapped",
                                     {"layer_types": ["full_attention"]}, "layer_types"),
    "a size left out": ("qwen3-gqa2-untied", {"hidden_size": None, "head_dim": None},
                        "hidden_size"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(UNEXPRESSIBLE))
def test_a_field_glassgpt_cannot_express_is_named(name: str) -> None:
    case, change, field = UNEXPRESSIBLE[name]
    d = {**config_of(case), **change}
    d = {k: v for k, v in d.items() if v is not None or k in ("sliding_window",)}
    with pytest.raises(ConfigError) as info:
        config_from_hf(d)
    assert info.value.field == field
    one_line(info.value)


def test_the_dropout_may_be_given_for_an_hf_one() -> None:
    d = {**config_of("gemma2-softcaps-window3"), "attention_dropout": 0.1}
    assert config_from_hf(d, dropout=0.1).dropout == 0.1


def _rewrite(src: Path, dst: Path, change: Any) -> Path:
    """A copy of ``src`` whose weights went through ``change`` (a dict → None)."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


WEIGHTS = {  # change to the state dict, the one line expected
    "missing": (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
                r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight \(of a LlamaForCausalLM\)$"),
    "unexpected": (lambda t: t.update({"model.layers.2.mlp.up_proj.weight": torch.zeros(1)}),
                   r"unexpected tensor model\.layers\.2\.mlp\.up_proj\.weight \(not of a LlamaForCausalLM\)$"),
    "misshapen": (lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)}),
                  r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \(32, 32\); config\.json "
                  r"implies \(16, 32\)$"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_weights_missing_unexpected_or_misshapen_name_the_tensor(
    name: str, llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    change, message = WEIGHTS[name]
    folder = _rewrite(llama, tmp_path / "bad", change)
    with pytest.raises(InputFileError, match=message) as info:
        from_hf(folder)
    one_line(info.value)
    assert main(["sample", "-c", str(folder), "--prompt", "x"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glassgpt: error: ") and re.search(message, err[0])


def test_buffers_of_old_checkpoints_are_not_unexpected(llama: Path, tmp_path: Path) -> None:
    buffer = "model.layers.0.self_attn.rotary_emb.inv_freq"
    folder = _rewrite(llama, tmp_path / "old", lambda t: t.update({buffer: torch.ones(4)}))
    from_hf(folder)


def test_a_tied_config_whose_head_differs_from_the_embedding_is_refused() -> None:
    hf = make(CASES["qwen2-gqa2-tied"])
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    state["lm_head.weight"] += 1.0
    with pytest.raises(ConfigError, match=r"^tie_word_embeddings: "):
        from_hf(state, config=hf.config)


def test_from_hf_of_something_else_is_one_line() -> None:
    with pytest.raises(GlassError, match="expected a folder, a model or a state dict, got int"):
        from_hf(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^config: "):
        from_hf(make(CASES["qwen2-gqa2-tied"]).state_dict())
