"""One way to resolve a run: preset → TOML → ``--data`` → ``--set`` → validation → data.

    run = resolve_run(preset="cpu-tiny", overrides=["train.lr=3e-3"])   # validated once
    run.config                      # RunConfig (model.n_vocab as given, or its default)
    run.with_vocab(tokenizer.n_vocab)   # the final config, once the data's tokenizer is known

``train``, ``sweep``, ``describe`` and ``scaling predict`` all start here; a sweep hands each
run its ``raw`` table (a TOML file), never ``--set`` strings to parse again. The presets
shipped in ``glassgpt/presets`` are the one list that ``train``, ``describe`` and
``glassgpt presets`` share.

>>> run = resolve_run(preset="cpu-tiny", overrides=["seed=7"])
>>> (run.config.seed, run.with_vocab(65).model.n_vocab)
(7, 65)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassgpt.config import apply_overrides, check, merge
from glassgpt.errors import ConfigError
from glassgpt.train.config import (
    RunConfig,
    build_run_config,
    padded_vocab,
    preset_dict,
    preset_names,
    raw_run_config,
)


@dataclass(frozen=True)
class ResolvedRun:
    """A run config resolved and validated once: ``raw`` (what the sources said) and
    ``config`` (the typed, validated RunConfig)."""

    raw: dict[str, Any]
    config: RunConfig

    @property
    def vocab_given(self) -> bool:
        """Whether ``model.n_vocab`` was set explicitly (else the tokenizer decides it)."""
        return "n_vocab" in self.raw.get("model", {})

    def with_vocab(self, n_vocab: int) -> RunConfig:
        """The config once the tokenizer's ``n_vocab`` is known: ``model.n_vocab`` becomes it
        (rounded up to ``data.pad_vocab_to``) unless set explicitly, which may pad but never
        cut the vocabulary."""
        cfg = self.config
        if self.vocab_given:
            check(
                cfg.model.n_vocab >= n_vocab,
                "model.n_vocab",
                f"{cfg.model.n_vocab} is smaller than the tokenizer's vocabulary of {n_vocab}",
            )
            return cfg
        model = cfg.model.replace(n_vocab=padded_vocab(n_vocab, cfg.data.pad_vocab_to))
        return cfg.replace(model=model)


def resolve_run(
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    data_paths: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
    base: Mapping[str, Any] | None = None,
) -> ResolvedRun:
    """Resolve and validate a run config.

    ``base`` (a raw config: a checkpoint's saved one, or a sweep run's) replaces the preset or
    file; ``--data`` and ``--set`` apply on top of whichever it is.
    """
    if base is None:
        raw = raw_run_config(
            preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
        )
    else:
        raw = dict(base)
        if data_paths:
            raw = merge(raw, {"data": {"paths": [str(p) for p in data_paths]}})
        raw = apply_overrides(raw, list(overrides))
    return ResolvedRun(raw, build_run_config(raw))


def preset_model(name: str) -> dict[str, Any]:
    """The ``[model]`` table of a shipped preset (an unknown name lists the known ones)."""
    table = preset_dict(name).get("model", {})
    if not isinstance(table, dict):
        raise ConfigError("preset", f"{name}: its model entry is not a table")
    return table


def preset_descriptions() -> list[tuple[str, str]]:
    """(name, one-line description) of every shipped preset, in name order."""
    return [(name, str(preset_dict(name).get("description", ""))) for name in preset_names()]
