"""The model config of a preset, a TOML file or a trained model, resolved as ``train`` does.

The source is a preset (its ``[model]`` table), a TOML file (its ``[model]`` table if it has
one, else the whole file; a ``preset = "NAME"`` key in that table starts from that preset's
model), or a trained model (a run folder, a checkpoint, or an HF GPT-2 folder, opened by
:func:`glassgpt.checkpoint.open_run`); then ``--set key=value`` overrides (``n_layers=2``;
``model.`` may be left out), through :func:`glassgpt.train.resolve.resolve_run`.

>>> config, title = resolve_config("cpu-tiny", None, ["n_layers=1"])
>>> config.n_layers, title
(1, 'cpu-tiny')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glassgpt.checkpoint import open_run
from glassgpt.config import load_toml
from glassgpt.console import say
from glassgpt.errors import ConfigError
from glassgpt.model.config import GPTConfig
from glassgpt.train.config import DataConfig, preset_dict
from glassgpt.train.resolve import preset_model, resolve_run

SECTIONS = ("model.", "train.", "data.", "seed")
CHAR_VOCAB = 256  # shown for a character tokenizer, whose size the data decides


def sectioned(overrides: list[str]) -> list[str]:
    """``n_layers=2`` → ``model.n_layers=2``; keys with a section stay.

    >>> sectioned(["n_layers=2", "train.lr=1e-3"])
    ['model.n_layers=2', 'train.lr=1e-3']
    """
    return [o if o.startswith(SECTIONS) else f"model.{o}" for o in overrides]


def raw_model_table(preset: str | None, config_file: Path | None) -> tuple[dict[str, Any], str]:
    """The raw run config (``[model]`` and the rest) of a preset or TOML file, and a title."""
    if config_file is None:
        raw = preset_dict(str(preset))
        raw.pop("description", None)
        return raw, str(preset)
    data = load_toml(config_file)
    data.pop("description", None)
    raw = data if "model" in data else {"model": data}
    if not isinstance(raw["model"], dict):
        raise ConfigError("model", f"{config_file}: expected a [model] table")
    name = raw["model"].pop("preset", None)
    if name is not None:
        if not isinstance(name, str):
            raise ConfigError("preset", f"expected a preset name, got {name!r}")
        raw["model"] = {**preset_model(name), **raw["model"]}
    return raw, str(config_file)


def trained_model_table(path: Path) -> dict[str, Any]:
    """The ``[model]`` table of a run folder, checkpoint folder, or HF GPT-2 folder."""
    return dict(open_run(path, weights=False).config.get("model", {}))


def resolve_config(
    preset: str | None,
    config_file: Path | None,
    overrides: list[str],
    checkpoint: Path | None = None,
) -> tuple[GPTConfig, str]:
    """The GPTConfig of a preset, TOML file, run or checkpoint, with overrides; and a title.

    Errors name the model field without its ``model.`` prefix. Where the tokenizer decides
    ``n_vocab`` (no explicit value), a BPE preset's ``vocab_size`` stands in for it. A
    folder given as ``config_file`` is a run.
    """
    if config_file is not None and Path(config_file).is_dir():
        checkpoint, config_file = Path(config_file), None
    if checkpoint is not None:
        raw, title = {"model": trained_model_table(Path(checkpoint))}, str(checkpoint)
    else:
        raw, title = raw_model_table(preset, config_file)
    try:
        run = resolve_run(base=raw, overrides=sectioned(overrides))
        config = run.config.model
        if not run.vocab_given and checkpoint is None:
            config = run.with_vocab(stand_in_vocab(run.config.data)).model
    except ConfigError as e:
        if not e.field.startswith("model."):
            raise
        field = e.field.removeprefix("model.")
        raise ConfigError(field, str(e)[len(e.field) + 2 :]) from None
    return config, title


def stand_in_vocab(data: DataConfig) -> int:
    """n_vocab when the tokenizer decides it: a BPE's ``vocab_size``; for a character
    vocabulary (the data's distinct characters), 256, with a note saying so."""
    if data.tokenizer == "bpe":
        return int(data.vocab_size)
    if data.tokenizer == "char":
        say(
            f"a character tokenizer's n_vocab is the data's number of distinct characters; "
            f"shown with {CHAR_VOCAB} (--set n_vocab=N for yours)"
        )
        return CHAR_VOCAB
    return 50257
