"""``open_run(path)``: the one way in to a trained model, whatever folder names it.

``path`` may be:

- a run folder (``OUT``, holding ``OUT/ckpt``) or its ``ckpt`` folder;
- one checkpoint folder (``ckpt/step_000500``, ``ckpt/best``): exactly that one;
- a Hugging Face model folder (``config.json`` + weights, as ``to_hf`` or ``save_pretrained``
  writes it) of any family ``glassgpt.interop.from_hf`` reads (GPT-2, Llama, Mistral, Qwen 2,
  Qwen 3, Gemma 2, Gemma 3, GPT-NeoX); another family is one line naming its ``model_type``
  and the families known;
- a hub id, ``hf:ORG/NAME`` or ``hf:ORG/NAME@REVISION`` (a branch, tag or commit): the
  snapshot folder of huggingface_hub's cache, downloaded first only where the machine can
  (:mod:`.hub`), opened as the HF folder it is.

**Which checkpoint of a run.** ``which="best"`` (the default: what sampling, evaluation,
inspection and serving want) opens ``ckpt/best``, the lowest validation loss, when it verifies,
else the newest valid ``step_*``; a checkpoint folder opens exactly itself. ``which="latest"``
opens the newest valid ``step_*`` that ``ckpt/latest`` or the named step folder leads to, else
an older one (what ``train --resume`` continues). ``step=N`` opens ``ckpt/step_N``. A
checkpoint that fails its checksums is skipped with a warning naming it (through ``warn``),
and the one before it is used.

Every checkpoint is verified against the sha256 sums of its ``state.json``; the config is its
``config.toml``; the tokenizer its ``tokenizer.json`` (glassgpt's format or HF's). An HF
folder's tokenizer is its ``tokenizer.json`` (glassgpt's own ``Tokenizer`` where that
expresses the file exactly, else the family's own, a ``FamilyTokenizer``: see
:mod:`glassgpt.interop.hf_tokenizers`), ``vocab.json`` + ``merges.txt``, or ``encoder.json`` +
``vocab.bpe``. Its chat template (``Run.chat_template``) is ``tokenizer_config.json``'s or
``chat_template.jinja`` (:mod:`glassgpt.tokenizer.chat`), a checkpoint's likewise where it
holds one; the ids that end a generation are ``generation_config.json``'s ``eos_token_id``
and ``tokenizer_config.json``'s ``eos_token``. Those files (``Run.tokenizer_files``) travel
with the tokenizer: a run fine-tuned from the folder stores them in each checkpoint beside its
``tokenizer.json``, and ``export --format hf`` writes them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from glassgpt.checkpoint import files as ckpt
from glassgpt.checkpoint.hub import is_hub_id, resolve_hub_id
from glassgpt.config import parse_toml
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError, InputFileError
from glassgpt.interop import hf_files
from glassgpt.interop.hf import config_from_hf, from_hf
from glassgpt.interop.hf_tokenizers import load_tokenizer_json
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast, parse_dtype
from glassgpt.tokenizer import Tokenizer, load_tokenizer
from glassgpt.tokenizer.chat import ChatTemplate, read_chat_template
from glassgpt.tokenizer.family import SIDECARS, generation_eos_ids, read_config, read_sidecars

CONFIG = "config.toml"  # the resolved run config, in the run folder and in each checkpoint


@dataclass
class Run:
    """A trained model as :func:`open_run` found it.

    ``config`` is the run config's tables as written (``config["model"]`` is the GPT's; an HF
    folder has only that one); ``meta`` the checkpoint's ``state.json`` (step, trainer state)
    or the HF folder's ``config.json``.
    """

    source: Path
    kind: Literal["checkpoint", "hf"]
    config: dict[str, Any]
    model: GPT | None
    tokenizer: Any
    checkpoint: ckpt.Checkpoint | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    chat_template: ChatTemplate | None = None
    # the tokenizer's sidecars (tokenizer_config.json, generation_config.json,
    # chat_template.jinja: glassgpt.tokenizer.family.SIDECARS) as found, for the runs and
    # exports made from this one to keep
    tokenizer_files: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def model_config(self) -> GPTConfig:
        return GPTConfig.from_dict(self.config["model"], prefix="model.")

    @property
    def step(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.step

    @property
    def run_dir(self) -> Path | None:
        """The run folder (the one holding ``ckpt/``), when the model came from a run."""
        return None if self.checkpoint is None else self.checkpoint.path.parent.parent

    def needs_tokenizer(self, flag: str = "--tokenizer FILE") -> Any:
        """The tokenizer; a one-line error when the folder has none (:func:`needs_tokenizer`)."""
        return needs_tokenizer(self.tokenizer, self.source, flag=flag)


def needs_tokenizer(
    tokenizer: Any, source: Any, *, flag: str | None = "--tokenizer FILE", text: str = "text"
) -> Any:
    """``tokenizer``; where a model came without one, the one error that says so: how to give
    it (``flag``), or, where the command takes none, what could not be encoded.

    >>> needs_tokenizer(None, "runs/x")
    Traceback (most recent call last):
    glassgpt.errors.GlassError: runs/x: has no tokenizer; pass --tokenizer FILE
    >>> needs_tokenizer(None, "runs/x", flag=None, text="--data text")
    Traceback (most recent call last):
    glassgpt.errors.GlassError: runs/x: has no tokenizer, so --data text cannot be encoded
    """
    if tokenizer is None:
        how = f"; pass {flag}" if flag else f", so {text} cannot be encoded"
        raise GlassError(f"{source}: has no tokenizer{how}")
    return tokenizer


def open_run(
    path: str | os.PathLike[str],
    *,
    which: Literal["best", "latest"] = "best",
    step: int | None = None,
    weights: bool = True,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    warn: Callable[[str], None] | None = None,
) -> Run:
    """The run, checkpoint or HF folder at ``path``, or the hub id ``path`` names (see the
    module docstring for which checkpoint of a run is opened).

    ``weights=False`` reads only the config, tokenizer and metadata (``Run.model`` is None).
    ``warn`` tells of each checkpoint skipped (default: a Python warning).
    ``tokenizer`` (a file, or a tokenizer) replaces the folder's. The model comes back in eval
    mode on ``device`` (default: the CPU); with a ``dtype`` (what ``--dtype`` means: float32,
    bf16, int8, float16) cast by :func:`glassgpt.model.precision.cast` and ready for fast
    inference, else as stored.
    """
    folder = Path(path)
    if is_hub_id(path) and not folder.exists():  # a local folder of that name stays a folder
        folder = resolve_hub_id(os.fspath(path))
    if not folder.exists():
        raise InputFileError(f"{folder}: no such checkpoint or model folder")
    if not folder.is_dir():
        raise InputFileError(f"{folder}: not a folder (expected a checkpoint or HF model folder)")
    if (folder / hf_files.CONFIG).is_file() and any(
        (folder / w).is_file() for w in hf_files.WEIGHT_FILES
    ):
        run = _open_hf(folder, weights, dtype)
    else:
        run = _open_checkpoint(folder, _choose(folder, which, step, warn), weights)
    if tokenizer is not None:
        run.tokenizer_files = {}  # the folder's sidecars describe its own tokenizer
        run.tokenizer = (
            tokenizer_file(Path(tokenizer))
            if isinstance(tokenizer, (str, os.PathLike))
            else tokenizer
        )
    n_vocab = int(run.config["model"].get("n_vocab", 0) or 0)
    if run.tokenizer is not None and n_vocab and run.tokenizer.n_vocab > n_vocab:
        raise GlassError(
            f"tokenizer has {run.tokenizer.n_vocab} ids but the model's n_vocab is {n_vocab}"
        )
    if run.model is not None:
        if device is not None:
            run.model = run.model.to(parse_device(device))
        run.model = run.model.eval() if dtype is None else cast(run.model, dtype, inplace=True)
    return run


def load(
    path: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> tuple[GPT, Any]:
    """``(model, tokenizer)`` of :func:`open_run` (the tokenizer None, with a warning, when the
    folder has none): what ``glassgpt.load`` returns."""
    run = open_run(path, tokenizer=tokenizer, device=device, dtype=dtype)
    if run.tokenizer is None:
        warnings.warn(f"{path}: no tokenizer found; working with token ids only", stacklevel=2)
    assert run.model is not None
    return run.model, run.tokenizer


def _choose(
    folder: Path, which: str, step: int | None, warn: Callable[[str], None] | None
) -> ckpt.Checkpoint:
    """The verified checkpoint that ``folder`` names (the rule of the module docstring)."""
    warn = warn or (lambda m: warnings.warn(m, stacklevel=5))
    if which == "latest" and step is None:
        return ckpt.find_resumable(folder, warn=warn)
    if (folder / ckpt.STATE).is_file():
        return ckpt.load_checkpoint(folder)
    root = ckpt.ckpt_root_of(folder)
    best = root / "best"
    if not root.is_dir() or not (best.is_dir() or ckpt.step_folders(root)):
        raise GlassError(
            f"{folder}: not a glassgpt checkpoint or HF model folder "
            "(no state.json, no ckpt/ with checkpoints, no config.json with weights)"
        )
    if step is not None:
        named = root / f"step_{step:06d}"
        if not named.is_dir():
            kept = ", ".join(str(ckpt.step_of(p)) for p in reversed(ckpt.step_folders(root)))
            raise GlassError(f"no checkpoint of step {step}; kept: {kept or 'none'}")
        return ckpt.load_checkpoint(named)
    if which == "best" and (best / ckpt.STATE).is_file():
        try:
            return ckpt.load_checkpoint(best)
        except ckpt.CheckpointError as e:
            warn(f"skipping {e}; using the newest step checkpoint")
    return ckpt.find_resumable(folder, warn=warn)


def _open_checkpoint(folder: Path, chosen: ckpt.Checkpoint, weights: bool) -> Run:
    config = parse_toml(chosen.text(CONFIG), chosen.path / CONFIG)
    if "model" not in config:
        raise GlassError(f"{chosen.path / CONFIG}: has no [model] table")
    model_config = GPTConfig.from_dict(config["model"], prefix="model.")
    model = None
    if weights:
        model = GPT(model_config)
        try:
            model.load_state_dict(chosen.tensors("model.safetensors"))
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise GlassError(f"{chosen.path}: weights do not fit its config: {first}") from None
    tok = None
    if "tokenizer.json" in chosen.files:
        tok = tokenizer_file(chosen.path / "tokenizer.json")
    meta = {k: v for k, v in chosen.state.items() if k != "files"}
    template = read_chat_template(chosen.path)
    sidecars = {n: chosen.files[n] for n in SIDECARS if n in chosen.files}
    return Run(folder, "checkpoint", config, model, tok, chosen, meta, template, sidecars)


def _open_hf(folder: Path, weights: bool, dtype: str | torch.dtype | None) -> Run:
    meta = hf_files.read_config(folder)
    # read straight into a float dtype asked for (no float32 copy to cast); int8 from float32
    wanted = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    load_dtype = wanted if wanted is not None and wanted.is_floating_point else torch.float32
    model = from_hf(folder, dtype=load_dtype) if weights else None
    config = (model.config if model is not None else config_from_hf(meta)).to_dict()
    tok, template = hf_tokenizer(folder), read_chat_template(folder)
    sidecars = read_sidecars(folder) if tok is not None else {}
    return Run(folder, "hf", {"model": config}, model, tok, None, meta, template, sidecars)


def tokenizer_file(path: Path) -> Any:
    """A glassgpt tokenizer file, or an HF ``tokenizer.json`` (with the
    ``tokenizer_config.json`` and ``generation_config.json`` beside it)."""
    if not path.is_file():
        raise InputFileError(f"{path}: no such tokenizer file")
    if not _claims_glassgpt(path):
        try:
            folder = path.parent
            return load_tokenizer_json(path, read_config(folder), generation_eos_ids(folder))
        except GlassError:
            if _is_hf(path):  # HF's error is the one to show; else glassgpt's, below
                raise
    return load_tokenizer(path)


def _claims_glassgpt(path: Path) -> bool:
    """Whether the file opens as glassgpt's tokenizer format does (``"format"`` first)."""
    try:
        with path.open("rb") as f:
            return b'"glassgpt-tokenizer"' in f.read(256)
    except OSError:
        return False


def _is_hf(path: Path) -> bool:
    """Whether ``path`` is JSON with HF's ``model`` table."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and "model" in data


def hf_tokenizer(folder: Path) -> Any:
    """The tokenizer files of an HF folder, or None."""
    if (folder / "tokenizer.json").is_file():
        return tokenizer_file(folder / "tokenizer.json")
    for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        if (folder / vocab).is_file() and (folder / merges).is_file():
            return Tokenizer.from_gpt2(folder / vocab, folder / merges)
    return None
