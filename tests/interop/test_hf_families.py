"""Every family from an HF folder, against transformers itself: tiny random Llama, Mistral,
Qwen 2, Qwen 3, Gemma 2, Gemma 3 and GPT-NeoX models of several shapes (grouped heads,
partial rotary, sliding windows shorter than the context, soft-caps, tied and untied),
saved by ``save_pretrained`` and opened by ``glassgpt.load``:

- logits equal to transformers' in float64 to 1e-10 (its float32 steps made float64, see
  ``hf_cases``) and in float32 to 1e-5 (transformers as it is);
- greedy continuations equal (``glassgpt.sample.generate`` and ``generate(do_sample=False)``);
- ``to_hf`` writes the same family, which transformers loads with equal logits, and
  ``from_hf`` of it gives back the same state dict.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.interop.hf_cases import CASES, T, float64_everywhere, float64_softmax, make, tokens

import glassgpt
from glassgpt.checkpoint import open_run
from glassgpt.interop import config_from_hf, from_hf, to_hf
from glassgpt.sample import generate

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(params=list(CASES), scope="module")
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(case name, the float32 transformers model, its float64 save_pretrained folder)."""
    case = CASES[request.param]
    hf = make(case)
    folder = tmp_path_factory.mktemp(request.param)
    hf.double().save_pretrained(folder)  # float64 on disk: both precisions load from it
    hf.float()
    return request.param, hf, folder


def test_the_folder_opens_with_transformers_logits_in_float64(saved: Any) -> None:
    name, hf, folder = saved
    model, _ = glassgpt.load(folder, dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64
    reference = float64_everywhere(hf, model)
    x = tokens()
    with torch.no_grad(), float64_softmax():
        ours, theirs = model(x), reference(x).logits
    assert theirs.abs().max() > 0.5  # random weights far from init: a real check
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-10)
    if "softcaps" in name:
        assert theirs.abs().max() < model.config.final_softcap  # the final cap bites


def test_the_folder_opens_with_transformers_logits_in_float32(saved: Any) -> None:
    _, hf, folder = saved
    run = open_run(folder, dtype="float32")
    assert run.kind == "hf" and next(run.model.parameters()).dtype == torch.float32
    x = tokens(seed=2)
    with torch.no_grad():
        diff = (run.model(x) - hf(x).logits).abs().max()
    assert float(diff) <= 1e-5


def test_greedy_continuations_equal_transformers(saved: Any) -> None:
    _, hf, folder = saved
    model, _ = glassgpt.load(folder, dtype="float32")
    prompts = tokens(n=3, seed=3)[:, :4]
    n = T - prompts.shape[1]  # to the end of the context, past every window
    with torch.no_grad():
        theirs = hf.generate(prompts, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    for prompt, expected in zip(prompts, theirs, strict=True):
        ours = generate(model, prompt.tolist(), max_new_tokens=n, temperature=0)
        assert ours == expected[prompt.shape[0] :].tolist()


def test_to_hf_writes_the_family_transformers_loads_and_reads_back(
    saved: Any, tmp_path: Path
) -> None:
    _, hf, folder = saved
    model = from_hf(folder, dtype=torch.float64)
    to_hf(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [type(hf).__name__]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert type(reloaded) is type(hf)
    x = tokens(seed=4)
    with torch.no_grad(), float64_softmax():
        theirs = float64_everywhere(reloaded.eval(), model)(x).logits
        np.testing.assert_allclose(model(x).numpy(), theirs.numpy(), rtol=0, atol=1e-10)
    again = from_hf(tmp_path, dtype=None)
    assert again.config == model.config
    mine = model.state_dict()
    assert again.state_dict().keys() == mine.keys()
    for key, value in again.state_dict().items():
        assert value.dtype == torch.float64 and torch.equal(value, mine[key]), key


def test_the_config_maps_to_the_fields_of_its_family(saved: Any) -> None:
    name, hf, _ = saved
    c = config_from_hf(hf.config)
    assert (c.n_heads, c.kv_heads, c.d_head) == (
        hf.config.num_attention_heads,
        getattr(hf.config, "num_key_value_heads", hf.config.num_attention_heads),
        getattr(hf.config, "head_dim", None)
        or hf.config.hidden_size // hf.config.num_attention_heads,
    )
    assert c.tie_embeddings == hf.config.tie_word_embeddings
    assert c.family_fields()  # every family differs from GPT-2 somewhere
    expected = {
        "mistral": {"layer_kinds": ("sliding",) * c.n_layers, "sliding_window": 3},
        "qwen2-window4": {"layer_kinds": ("full", "sliding", "sliding"), "qkv_bias": True},
        "qwen3": {"qk_norm": True, "qkv_bias": False},
        "gemma2-softcaps": {"attn_softcap": 1.5, "final_softcap": 2.5, "attn_scale": 12**-0.5,
                            "layer_kinds": ("sliding", "full")},
        "gemma3-local": {"rope_local_base": 10.0, "rope_scaling": "linear", "qk_norm": True},
        "neox-parallel": {"parallel_residual": True, "rotary_dims": 2, "norm": "layernorm"},
        "neox-sequential": {"parallel_residual": False, "rotary_dims": 8, "mlp": "gelu_tanh"},
        "llama-gqa2": {"rope_scaling": "llama3", "rope_original_ctx": 8, "rope_base": 500.0},
    }  # fmt: skip
    for prefix, fields in expected.items():
        if name.startswith(prefix):
            assert {k: getattr(c, k) for k in fields} == fields


def test_a_sharded_bf16_folder_loads_each_tensor_in_the_dtype_asked(tmp_path: Path) -> None:
    hf = make(CASES["qwen3-gqa2-untied"])
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.bfloat16().float())  # the float32 model of the bf16 numbers
    hf.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="20KB")
    hf.float()
    assert (tmp_path / "model.safetensors.index.json").is_file()
    x = tokens()
    as_stored = from_hf(tmp_path, dtype=None)
    assert {p.dtype for p in as_stored.parameters()} == {torch.bfloat16}
    model = from_hf(tmp_path)  # float32 by default
    reference = make(CASES["qwen3-gqa2-untied"])  # its float32 rotary buffers, not bf16's
    reference.load_state_dict(hf.state_dict())
    with torch.no_grad():
        diff = (model(x) - reference(x).logits).abs().max()
    assert float(diff) <= 1e-5


def test_a_transformers_model_object_and_its_state_dict_load_too() -> None:
    hf = make(CASES["gemma2-softcaps-window3"])
    x = tokens()
    with torch.no_grad():
        expected = hf(x).logits
        for model in (from_hf(hf), from_hf(hf.state_dict(), config=hf.config.to_dict())):
            assert float((model(x) - expected).abs().max()) <= 1e-5
        headless = from_hf(hf.model.state_dict(), config=hf.config)  # Gemma2Model: tied, no prefix
        assert float((headless(x) - expected).abs().max()) <= 1e-5


def test_a_fine_tuning_step_from_the_import_gives_transformers_loss(saved: Any) -> None:
    """The loss, then one SGD step on each (the same gradients, in each one's layout), then
    the loss again: equal to 1e-5 in float32."""
    _, hf, folder = saved
    hf = copy.deepcopy(hf).train()
    model = from_hf(folder).train()
    x = tokens(n=4, seed=5)
    losses = []
    for m, loss_of in ((model, lambda: model(x[:, :-1], targets=x[:, 1:])[1]),
                       (hf, lambda: hf(x, labels=x).loss)):  # fmt: skip
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        first = loss_of()
        first.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append((float(first), float(loss_of())))
    (ours, ours_after), (theirs, theirs_after) = losses
    assert abs(ours - theirs) <= 1e-5 and abs(ours_after - theirs_after) <= 1e-5
    assert theirs - theirs_after > 1e-3  # the step moved the weights
