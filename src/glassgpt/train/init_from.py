"""``glassgpt train --init-from DIR``: fine-tune the weights of a glassgpt run or an HF GPT-2
folder, with its architecture and tokenizer (and the tokenizer's ``tokenizer_config.json``,
``generation_config.json`` and ``chat_template.jinja``, which each checkpoint keeps).

The run's ``[model]`` table becomes the source model's config; ``--set model.KEY=VALUE`` may
change only what keeps every weight's shape (``dropout``, ``init_std``, ``norm_eps``,
``rope_base``, …); anything else is refused, naming the field. The user's data is prepared
with the source's tokenizer.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glassgpt.checkpoint import open_run
from glassgpt.config import merge
from glassgpt.errors import ConfigError, GlassError
from glassgpt.model.accounting import parameter_shapes
from glassgpt.model.config import GPTConfig


@dataclass
class InitFrom:
    """The starting point of a fine-tuning run."""

    path: Path
    config: GPTConfig
    state: dict[str, Any]  # the weights, by our parameter names
    tokenizer_json: bytes  # the tokenizer, in glassgpt's file format
    n_vocab_tokenizer: int
    # its tokenizer_config.json, generation_config.json, chat_template.jinja (Run.tokenizer_files)
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)


def load_init(path: str | Path) -> InitFrom:
    """Weights, config and tokenizer of a run, checkpoint or HF GPT-2 folder."""
    folder = Path(path)
    run = open_run(folder)
    model, tok = run.model, run.tokenizer
    assert model is not None
    if tok is None:
        raise GlassError(
            f"--init-from {folder}: has no tokenizer files (tokenizer.json, vocab.json + "
            "merges.txt, or encoder.json + vocab.bpe), so the data cannot be encoded as it was"
        )
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "tokenizer.json"
        tok.save(file)
        tokenizer_json = file.read_bytes()
    return InitFrom(folder, model.config, model.state_dict(), tokenizer_json, tok.n_vocab,
                    run.tokenizer_files)  # fmt: skip


def init_raw(init: InitFrom, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (preset or file: train and data settings) with the source's ``[model]``."""
    out = {k: v for k, v in raw.items() if k != "model"}
    return merge(out, {"model": init.config.to_dict()})


def check_shapes(init: InitFrom, wanted: GPTConfig) -> None:
    """Refuse, naming the field, a model config whose weights have other shapes."""
    if parameter_shapes(wanted) == parameter_shapes(init.config):
        return
    changed = [
        f.name
        for f in dataclasses.fields(GPTConfig)
        if getattr(wanted, f.name) != getattr(init.config, f.name)
    ]
    field = next((name for name in changed if _changes_shapes(init.config, name, wanted)), None)
    field = field or (changed[0] if changed else "model")
    raise ConfigError(
        f"model.{field}",
        f"--init-from {init.path} keeps the weights' shapes, but {field}="
        f"{getattr(wanted, field, None)!r} changes them (the weights have "
        f"{getattr(init.config, field, None)!r}); only shape-free fields such as dropout may "
        "change",
    )


def _changes_shapes(base: GPTConfig, name: str, wanted: GPTConfig) -> bool:
    try:
        one = dataclasses.replace(base, **{name: getattr(wanted, name)})
    except ConfigError:
        return True
    return parameter_shapes(one) != parameter_shapes(base)
