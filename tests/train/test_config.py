from __future__ import annotations

import sys

import pytest

from glassgpt.errors import ConfigError
from glassgpt.train.config import (
    RunConfig,
    TrainConfig,
    build_run_config,
    config_diff,
    dump_toml,
    load_run_config,
    preset_names,
    raw_run_config,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_presets_ship_and_validate() -> None:
    names = preset_names()
    shipped = {"default", "cpu-tiny", "shakespeare-char-cpu", "shakespeare-char-fast"}
    assert shipped | {"shakespeare-char-speedrun"} <= set(names)
    for name in names:
        cfg = load_run_config(preset=name)
        assert isinstance(cfg, RunConfig)
        assert cfg.seq_len <= cfg.model.n_ctx


@pytest.mark.parametrize(
    "name", ["default", "shakespeare-char-cpu", "shakespeare-char-speedrun", "cpu-tiny"]
)
def test_resolved_config_round_trips_through_toml(name: str) -> None:
    cfg = build_run_config(raw_run_config(preset=name), n_vocab=97)
    text = dump_toml(cfg.to_dict())
    again = build_run_config(tomllib.loads(text))  # the standard library's reader is the oracle
    assert again == cfg
    assert again.model.n_vocab == 97


def test_dump_toml_escapes_strings() -> None:
    text = dump_toml({"s": 'a"b\\c\n\t√', "t": {"x": [1.5, True, "y"]}})
    assert tomllib.loads(text) == {"s": 'a"b\\c\n\t√', "t": {"x": [1.5, True, "y"]}}


def test_overrides_and_data_paths_apply_in_order() -> None:
    cfg = load_run_config(
        preset="cpu-tiny", data_paths=["a.txt"], overrides=["train.lr=0.5", "model.n_layers=3"]
    )
    assert (cfg.train.lr, cfg.model.n_layers, cfg.data.paths) == (0.5, 3, ("a.txt",))
    cfg = load_run_config(preset="cpu-tiny", data_paths=["a.txt"], overrides=["data.paths=[]"])
    assert cfg.data.paths == ()


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("train.batch_size=0", "train.batch_size"),
        ("train.nope=1", "train.nope"),
        ("train.precision=fp8", "train.precision"),
        ("train.grad_accum=5", "train.grad_accum"),  # does not divide batch_size 8
        ("train.min_lr=1.0", "train.min_lr"),
        ("train.seq_len=4096", "train.seq_len"),  # longer than model.n_ctx
        ("train.device=tpu", "train.device"),
        ("model.n_heads=3", "n_heads"),
        ("data.val_fraction=1.5", "data.val_fraction"),
    ],
)
def test_bad_values_name_their_key(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_run_config(preset="cpu-tiny", overrides=[override])
    assert field in str(e.value)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="cpu-tiny"):
        load_run_config(preset="no-such-preset")


def test_n_vocab_comes_from_the_tokenizer_and_may_only_pad() -> None:
    raw = raw_run_config(preset="cpu-tiny")
    assert build_run_config(raw, n_vocab=70).model.n_vocab == 70
    padded = raw_run_config(preset="cpu-tiny", overrides=["model.n_vocab=128"])
    assert build_run_config(padded, n_vocab=70).model.n_vocab == 128
    with pytest.raises(ConfigError, match=r"model\.n_vocab"):
        build_run_config(
            raw_run_config(preset="cpu-tiny", overrides=["model.n_vocab=50"]), n_vocab=70
        )


def test_config_diff_lists_changed_dotted_keys() -> None:
    a = load_run_config(preset="cpu-tiny")
    b = load_run_config(preset="cpu-tiny", overrides=["model.d_model=32", "train.max_steps=7"])
    assert config_diff(a, b) == {
        "model.d_model": (64, 32),
        "model.d_head": (32, 16),  # derived fields follow
        "model.d_mlp": (256, 128),
        "train.max_steps": (200, 7),
    }
    assert config_diff(a, a) == {}


def test_train_config_defaults_decay_to_max_steps() -> None:
    assert TrainConfig(max_steps=123).total_decay_steps == 123
    assert TrainConfig(max_steps=123, decay_steps=50).total_decay_steps == 50


def test_the_gpu_preset_pads_the_vocabulary_and_accumulates_half_a_million_tokens() -> None:
    cfg = build_run_config(raw_run_config(preset="gpt2-gpu"), n_vocab=50257)
    assert cfg.model.n_vocab == 50304  # a multiple of 64
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == (768, 12, 12)
    assert cfg.train.batch_size * cfg.seq_len == 524_288
    assert cfg.train.batch_size // cfg.train.grad_accum == 32
    assert (cfg.train.device, cfg.train.precision, cfg.train.compile) == ("cuda", "bf16", None)
    assert build_run_config(raw_run_config(preset="gpt2-gpu"), n_vocab=16384).model.n_vocab == 16384


def test_vocabulary_padding_rounds_up_and_an_explicit_n_vocab_wins() -> None:
    raw = raw_run_config(preset="cpu-tiny", overrides=["data.pad_vocab_to=64"])
    assert build_run_config(raw, n_vocab=65).model.n_vocab == 128
    assert build_run_config(raw, n_vocab=64).model.n_vocab == 64
    raw = raw_run_config(preset="cpu-tiny", overrides=["data.pad_vocab_to=64", "model.n_vocab=70"])
    assert build_run_config(raw, n_vocab=65).model.n_vocab == 70
    for bad in ("0", "true", "'x'"):
        raw = raw_run_config(preset="cpu-tiny", overrides=[f"data.pad_vocab_to={bad}"])
        with pytest.raises(ConfigError, match=r"data\.pad_vocab_to"):
            build_run_config(raw, n_vocab=65)


def test_sections_scalars_seeds_and_empty_files_are_named_errors(tmp_path) -> None:
    cases = {
        "model=3": "model: expected a table",
        "seed=9223372036854775808": "seed: must be in [0, 2^63)",
        "model.n_ctx=0": "model.n_ctx: must be a positive integer",
        "train.max_steps=-1": "train.max_steps:",
    }
    for override, start in cases.items():
        with pytest.raises(ConfigError) as e:
            build_run_config(raw_run_config(preset="cpu-tiny", overrides=[override]))
        assert str(e.value).startswith(start), (override, str(e.value))
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\ndescription = 'x'\n")
    with pytest.raises(ConfigError, match=r"--config: .* sets nothing"):
        raw_run_config(config_file=empty)
