from __future__ import annotations

import pytest

from glassgpt.errors import ConfigError
from glassgpt.model import GPTConfig
from glassgpt.model.config import PRESETS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_round_trip(name: str) -> None:
    cfg = GPTConfig.preset(name)
    assert cfg.d_head * cfg.n_heads == cfg.d_model
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg


def test_gpt2_shapes() -> None:
    cfg = GPTConfig.preset("gpt2")
    assert (cfg.n_vocab, cfg.n_ctx, cfg.d_model, cfg.n_layers, cfg.n_heads) == (
        50257,
        1024,
        768,
        12,
        12,
    )
    assert cfg.d_mlp == 3072


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"d_model": 10, "n_heads": 3}, "n_heads"),
        ({"positional": "sinusoidal", "d_model": 9, "n_heads": 3}, "d_model"),
        ({"positional": "rope", "d_model": 9, "n_heads": 3}, "d_head"),
        ({"n_ctx": 0}, "n_ctx"),
        ({"mlp": "swish"}, "mlp"),
        ({"positional": "alibi"}, "positional"),
        ({"norm": "batchnorm"}, "norm"),
        ({"dropout": 1.0}, "dropout"),
        ({"mlp_gate": "softplus"}, "mlp_gate"),
    ],
)
def test_invalid_configs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        GPTConfig(**kwargs)
    assert e.value.field == field


def test_from_dict_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as e:
        GPTConfig.from_dict({"n_layer": 3})
    assert e.value.field == "n_layer"
    with pytest.raises(ConfigError) as e:
        GPTConfig.preset("gpt5")
    assert e.value.field == "preset"


def test_explicit_d_head_need_not_divide() -> None:
    cfg = GPTConfig(d_model=10, n_heads=3, d_head=4)
    assert cfg.d_head == 4
