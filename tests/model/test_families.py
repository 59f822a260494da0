"""The decoder-only families' fields of GPTConfig: each one, and the families' combinations
(tiny Llama 3, Qwen 2, Qwen 3, Mistral, Gemma 2, Gemma 3 and GPT-NeoX shapes), against the
NumPy reference in float64, with KV-cache decoding equal to the full forward, through the
sample engine, in describe, and in the config's validation and round-trip."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from glassgpt.config import parse_toml
from glassgpt.errors import ConfigError
from glassgpt.model import GPT, GPTConfig, reference
from glassgpt.model.accounting import count_parameters
from glassgpt.model.describe import describe
from glassgpt.model.precision import cast
from glassgpt.sample import engine
from glassgpt.sample.cache import KVCache
from glassgpt.sample.generation import generate
from glassgpt.train.config import dump_toml

from .helpers import numpy_weights, random_model, random_tokens

BASE: dict[str, Any] = {
    "n_vocab": 17,
    "n_ctx": 12,
    "d_model": 16,
    "n_layers": 2,
    "n_heads": 4,
    "d_mlp": 24,
    "unembed_bias": True,
}
ROPE = {"positional": "rope", "rope_base": 50.0}

FIELDS: dict[str, dict[str, Any]] = {
    "n_kv_heads=1": {"n_kv_heads": 1},
    "n_kv_heads=2": {"n_kv_heads": 2, **ROPE},
    "qkv_bias": {"bias": False, "qkv_bias": True},
    "qk_norm": {"qk_norm": True, **ROPE},
    "rotary_fraction": {"rotary_fraction": 0.5, **ROPE},
    "rope_scaling=linear": {"rope_scaling": "linear", "rope_factor": 3.0, **ROPE},
    "rope_scaling=llama3": {
        "rope_scaling": "llama3", "rope_factor": 8.0, "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0, "rope_original_ctx": 16, **ROPE,
    },
    "rope_scaling=yarn": {
        "rope_scaling": "yarn", "rope_factor": 4.0, "rope_original_ctx": 6, "d_model": 32,
        "rope_beta_fast": 8.0, "rope_beta_slow": 0.5, **ROPE,
    },
    "parallel_residual": {"parallel_residual": True},
    "embed_scale": {"embed_scale": 4.0},
    "norm_offset": {"norm_offset": 1.0, "norm": "rmsnorm", "qk_norm": True, **ROPE},
    "sandwich_norm": {"sandwich_norm": True},
    "attn_softcap": {"attn_softcap": 0.7},
    "final_softcap": {"final_softcap": 1.5},
    "attn_scale": {"attn_scale": 0.9},
    "sliding_window": {"sliding_window": 3},
    "layer_types": {"sliding_window": 2, "layer_types": ("full", "sliding")},
    "rope_local_base": {
        "sliding_window": 3, "layer_types": ("sliding", "full"), "rope_local_base": 7.0, **ROPE,
    },
}  # fmt: skip

_LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "bias": False, "tie_embeddings": False, **ROPE}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama3": {
        **_LLAMA, "n_kv_heads": 2, "rope_scaling": "llama3", "rope_factor": 8.0,
        "rope_original_ctx": 8,
    },
    "qwen2": {**_LLAMA, "n_kv_heads": 2, "qkv_bias": True, "tie_embeddings": True},
    "qwen3": {**_LLAMA, "n_kv_heads": 1, "qk_norm": True, "d_head": 8},
    "mistral": {**_LLAMA, "n_kv_heads": 2, "sliding_window": 4},
    "gemma2": {
        **_LLAMA, "mlp": "geglu", "tie_embeddings": True, "n_kv_heads": 2,
        "embed_scale": 4.0, "norm_offset": 1.0, "sandwich_norm": True, "attn_softcap": 2.0,
        "final_softcap": 3.0, "attn_scale": 0.3, "sliding_window": 3,
        "layer_types": ("sliding", "full"), "d_head": 8,
    },
    "gemma3": {
        **_LLAMA, "mlp": "geglu", "tie_embeddings": True, "n_kv_heads": 1, "qk_norm": True,
        "embed_scale": 4.0, "norm_offset": 1.0, "sandwich_norm": True, "attn_scale": 0.3,
        "sliding_window": 3, "layer_types": ("sliding", "full"), "rope_local_base": 10.0,
        "rope_scaling": "linear", "rope_factor": 8.0,
    },
    "neox": {
        "positional": "rope", "rotary_fraction": 0.5, "parallel_residual": True,
        "mlp": "gelu", "tie_embeddings": False,
    },
}  # fmt: skip
CASES = {**FIELDS, **{f"family={k}": v for k, v in FAMILIES.items()}}


def config(**fields: Any) -> GPTConfig:
    return GPTConfig(**{**BASE, **fields})


@pytest.mark.parametrize("case", CASES)
def test_equals_the_reference_and_decodes_as_it_forwards(case: str) -> None:
    cfg = config(**CASES[case])
    assert cfg.family_fields(), "each case sets a family field"
    model = random_model(cfg, seed=7)
    tokens = random_tokens(cfg, batch=2, length=cfg.n_ctx)
    with torch.no_grad():
        full = model(tokens)
    expected = reference.forward(cfg, numpy_weights(model), tokens.numpy())
    np.testing.assert_allclose(full.numpy(), expected, rtol=0, atol=1e-10)
    assert np.abs(expected).max() > 0.1
    # a prompt, then single tokens through the KV cache: the same logits
    cache = KVCache.for_model(model, batch_size=2)
    steps = [tokens[:, :5]] + [tokens[:, t : t + 1] for t in range(5, cfg.n_ctx)]
    with torch.no_grad():
        decoded = torch.cat([model(step, cache=cache) for step in steps], dim=1)
    np.testing.assert_allclose(decoded.numpy(), full.numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", ["n_kv_heads=2", "family=qwen3"])
def test_grouped_keys_and_values_are_hooked_and_cached_per_group(case: str) -> None:
    cfg = config(**CASES[case])
    G = cfg.kv_heads
    model = random_model(cfg)
    seen: dict[str, torch.Tensor] = {}
    names = ["blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.q", "blocks.0.attn.pattern"]
    with model.hooks({n: lambda t, n: seen.setdefault(n, t) for n in names}), torch.no_grad():
        model(random_tokens(cfg, 1, 5))
    assert seen["blocks.0.attn.k"].shape == seen["blocks.0.attn.v"].shape == (1, 5, G, cfg.d_head)
    assert seen["blocks.0.attn.q"].shape == (1, 5, cfg.n_heads, cfg.d_head)
    assert seen["blocks.0.attn.pattern"].shape == (1, cfg.n_heads, 5, 5)
    attn = model.blocks[0].attn
    assert attn.W_K.shape == attn.W_V.shape == (G, cfg.d_model, cfg.d_head)
    # a state dict loads back into the same shapes (W_QKV fused from the three views)
    twin = GPT(cfg).double()
    twin.load_state_dict(model.state_dict())
    assert torch.equal(twin.blocks[0].attn.W_QKV, attn.W_QKV)


def test_parallel_block_has_no_resid_mid_and_sandwich_norms_are_hooked() -> None:
    names = GPT(config(parallel_residual=True, sandwich_norm=True)).hook_names()
    assert "blocks.0.resid_mid" not in names
    i = names.index
    assert i("blocks.0.attn.result") < i("blocks.0.ln1_post.scale") < i("blocks.0.attn_out")
    assert i("blocks.0.mlp.post") < i("blocks.0.ln2_post.scale") < i("blocks.0.mlp_out")


def test_a_norm_offset_model_starts_with_unit_gains() -> None:
    model = GPT(config(norm_offset=1.0, qk_norm=True, **ROPE))
    gains = [m.gain for m in model.modules() if hasattr(m, "gain")]
    assert len(gains) == 2 * 2 + 2 * 2 + 1 and all(bool((g == 1).all()) for g in gains)


@pytest.mark.parametrize("case", CASES)
def test_the_sample_engine_decodes_what_the_plain_forward_gives(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(**CASES[case])
    model = cast(random_model(cfg, seed=3, dtype=torch.float32), "float32")
    prompt = [1, 2, 3]
    engine._SAID.clear()
    out = generate(model, prompt, max_new_tokens=6, temperature=0.0)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == ids[len(prompt) :]
    choice = engine.choose(model)
    uncovered = engine.uncovered(model)  # the fields the replayed step leaves eager
    if engine.unreplayable_model(GPT(config())) is not None:  # the kernels are not built
        assert choice.kind == "eager"
    elif uncovered is None:  # every field a compiled call: the ids above were replayed
        assert choice.kind == "replayed", choice.why
    else:  # say why, naming the field
        assert choice.kind == "eager" and choice.why == uncovered
        assert "does not cover" in uncovered
        assert any(f in uncovered for f in cfg.family_fields())
        assert "decoding eagerly" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n_kv_heads": 3}, "n_kv_heads"),
        ({"n_kv_heads": 0}, "n_kv_heads"),
        ({"qkv_bias": True}, "qkv_bias"),
        ({"rotary_fraction": 0.0}, "rotary_fraction"),
        ({"rotary_fraction": 0.3, **ROPE}, "rotary_fraction"),
        ({"rope_scaling": "dynamic", **ROPE}, "rope_scaling"),
        ({"rope_scaling": "linear"}, "rope_scaling"),
        ({"rope_factor": 0.0}, "rope_factor"),
        ({"rope_high_freq_factor": 0.5}, "rope_high_freq_factor"),
        ({"rope_original_ctx": 0}, "rope_original_ctx"),
        ({"rope_beta_slow": -1.0}, "rope_beta_fast"),
        ({"parallel_residual": True, "norm_placement": "post"}, "parallel_residual"),
        ({"sandwich_norm": True, "norm_placement": "post"}, "sandwich_norm"),
        ({"embed_scale": 0.0}, "embed_scale"),
        ({"norm_offset": math.inf}, "norm_offset"),
        ({"attn_softcap": 0.0}, "attn_softcap"),
        ({"final_softcap": -1.0}, "final_softcap"),
        ({"attn_scale": 0.0}, "attn_scale"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"layer_types": ("full",)}, "layer_types"),
        ({"layer_types": ("full", "local"), "sliding_window": 2}, "layer_types"),
        ({"layer_types": ("full", "sliding")}, "layer_types"),
        ({"rope_local_base": 10.0}, "rope_local_base"),
        ({"rope_local_base": 1.0, **ROPE}, "rope_local_base"),
    ],
)
def test_each_field_is_validated_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as e:
        config(**fields)
    assert e.value.field == named


@pytest.mark.parametrize("case", CASES)
def test_config_round_trips_through_dict_and_toml(case: str) -> None:
    cfg = config(**CASES[case])
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg
    assert GPTConfig.from_dict(parse_toml(dump_toml(cfg.to_dict()), "config.toml")) == cfg


def test_an_old_config_without_the_fields_loads_as_the_plain_function() -> None:
    old = {k: v for k, v in config().to_dict().items() if k in BASE or k == "positional"}
    cfg = GPTConfig.from_dict(old)
    assert cfg.family_fields() == [] and cfg.kv_heads == cfg.n_heads
    assert cfg.layer_kinds == ("full", "full")


def test_describe_counts_a_grouped_query_model_by_hand() -> None:
    d, L, H, G, dh, dm, V = 64, 3, 8, 2, 8, 128, 100
    cfg = GPTConfig(n_vocab=V, n_ctx=32, d_model=d, n_layers=L, n_heads=H, n_kv_heads=G,
                    d_mlp=dm, **_LLAMA, qk_norm=True)  # fmt: skip
    by_hand = V * d + L * (d + d * H * dh + 2 * d * G * dh + H * dh * d + 2 * dh + d + 3 * d * dm)
    by_hand += d + d * V  # N_f, W_U
    assert count_parameters(cfg) == by_hand == sum(p.numel() for p in GPT(cfg).parameters())
    assert f"N = {by_hand:,} parameters" in describe(cfg)


DESCRIBED: dict[str, tuple[dict[str, Any], str]] = {
    "n_kv_heads": ({"n_kv_heads": 2}, "the 4 query heads share G = n_kv_heads = 2"),
    "qkv_bias": ({"bias": False, "qkv_bias": True}, "k_h = x W_K[h] + b_K[h]"),
    "qk_norm": ({"qk_norm": True, **ROPE}, "q_h ← q_h / √(mean(q_h²) + ε) ⊙ (w_q)"),
    "rotary_fraction": ({"rotary_fraction": 0.5, **ROPE}, "2i < r = 2 (the other 2"),
    "rope_scaling": (FIELDS["rope_scaling=llama3"], "(llama3)"),
    "yarn": (FIELDS["rope_scaling=yarn"], "a = 0.1 ln 4 + 1   (yarn)"),
    "parallel_residual": ({"parallel_residual": True}, "x_ℓ = x_{ℓ−1} + Attn_ℓ(N1_ℓ(x_{ℓ−1})) + MLP_ℓ(N2_ℓ(x_{ℓ−1}))"),
    "embed_scale": ({"embed_scale": 4.0}, "s = embed_scale = 4"),
    "norm_offset": ({"norm_offset": 1.0}, "⊙ (1 + w)"),
    "sandwich_norm": ({"sandwich_norm": True}, "x_mid = x_{ℓ−1} + N1'_ℓ(Attn_ℓ(N1_ℓ(x_{ℓ−1})))"),
    "attn_softcap": ({"attn_softcap": 50.0}, "c·tanh((q_h k_hᵀ / √d_head) / c) (c = attn_softcap = 50)"),
    "final_softcap": ({"final_softcap": 30.0}, "c = final_softcap = 30"),
    "attn_scale": ({"attn_scale": 0.25}, "q_h k_hᵀ · 0.25"),
    "sliding_window": ({"sliding_window": 3, "layer_types": ("sliding", "full")}, "sliding layers ℓ ∈ {1}: M[i, j] = 0 iff i − 3 < j ≤ i"),
    "rope_local_base": (FIELDS["rope_local_base"], "sliding layers: θ_i = 7^{−2i/4}"),
}  # fmt: skip


@pytest.mark.parametrize("field", DESCRIBED)
def test_describe_writes_each_fields_equation(field: str) -> None:
    fields, equation = DESCRIBED[field]
    cfg = config(**fields)
    text = describe(cfg)
    assert equation in text
    plain = {k: v for k, v in fields.items() if k in ("positional", "rope_base", "bias", "d_model")}
    assert equation not in describe(config(**plain))
    assert int(text.split("N = ")[1].split(" ")[0].replace(",", "")) == sum(
        p.numel() for p in GPT(cfg).parameters()
    )
    assert "\\begin{align*}" in describe(cfg, fmt="latex")


@pytest.mark.parametrize("case", CASES)
def test_a_left_padded_batch_decodes_each_prompt_as_alone(case: str) -> None:
    model = cast(random_model(config(**CASES[case]), seed=3, dtype=torch.float32), "float32")
    prompts = [[1, 2, 3, 4, 5], [6, 7]]  # the second row padded by 3: its window and groups
    batch = generate(model, prompts, max_new_tokens=5, temperature=0.0)
    assert batch == [generate(model, p, max_new_tokens=5, temperature=0.0) for p in prompts]
