"""``model, tokenizer = glassgpt.load(path)``: a trained checkpoint or an exported HF folder.

``path`` may be:

- a training run folder (``OUT``, with ``OUT/ckpt``) or its ``ckpt`` folder: the ``best``
  checkpoint (lowest validation loss) if there is one, else the newest valid ``step_*``;
- one checkpoint folder (``ckpt/step_000500``, ``ckpt/best``): exactly that one;
- a Hugging Face GPT-2 folder (``config.json`` + ``model.safetensors``, as ``to_hf`` or
  ``save_pretrained`` writes it).

Checkpoints are verified against the sha256 sums of their ``state.json``; the model's
config is the ``[model]`` table of the checkpoint's ``config.toml``; the tokenizer is its
``tokenizer.json``. An HF folder's tokenizer is its ``tokenizer.json`` (glassgpt's or HF's
format), ``vocab.json`` + ``merges.txt``, or ``encoder.json`` + ``vocab.bpe``; without one the
tokenizer is None (a warning says so) unless ``tokenizer=`` names a file. The model comes back
in eval mode, on ``device`` (default: the CPU); with a ``dtype``, cast and ready for fast
inference as ``glassgpt sample --dtype`` loads it (``glassgpt.load`` always gives one, float32
by default), else as stored.

This module sits in ``interop`` (below ``train``, ``sample``, ``inspect`` and ``serve``, which
all load models through it) because it reads HF folders as well as checkpoints.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import tomllib
import torch

from glassgpt.errors import GlassError, InputFileError
from glassgpt.model.precision import cast

HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def available_devices() -> list[str]:
    """The devices this machine's torch can compute on: ``cpu``, then ``cuda`` and ``cuda:N``
    where a CUDA GPU is usable, and ``mps`` where Apple's Metal backend is."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def parse_device(name: str) -> torch.device:
    """A usable torch.device from ``--device``; else a one-line error that lists the devices
    this machine has."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    usable = available_devices()
    if device is None or (str(device) not in usable and device.type != "cpu"):
        raise GlassError(f"--device {name}: not usable here; this machine has {', '.join(usable)}")
    return device


def load(
    path: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> tuple[Any, Any]:
    """(GPT in eval mode, ready for fast inference; tokenizer or None) from a checkpoint or
    an HF folder.

    ``dtype`` means what ``--dtype`` means on the command line: ``"float32"``, ``"bf16"``, ``"int8"`` (weights W̃ = q·s, a CPU only) or ``"float16"`` (a GPU only), or a
    torch dtype. The model is cast by :func:`glassgpt.model.precision.cast`, as ``glassgpt
    sample`` casts it: on a CPU its projections' products read packed copies of the weights,
    so ``glassgpt.sample.generate`` decodes it by the same engine as the CLI
    (``glassgpt.sample.engine``), at the same speed. Without a ``dtype`` (the commands that
    cast or train it themselves) the model is as stored, not packed.

    Training or fine-tuning a loaded model: load it in ``"float32"`` (or as stored) and call
    ``model.train()``; the packing leaves the weights themselves untouched (a packed copy goes
    unused once its weight changes), so autograd and any optimizer see the plain float32
    parameters. ``"bf16"`` and ``"int8"`` are inference precisions (int8 weights are rounded
    and their products read int8 copies): load float32 to train. From the command line,
    ``glassgpt train --init-from PATH --data FILE`` fine-tunes the same folder.
    """
    folder = Path(path)
    if not folder.exists():
        raise InputFileError(f"{folder}: no such checkpoint or model folder")
    if not folder.is_dir():
        raise InputFileError(f"{folder}: not a folder (expected a checkpoint or HF model folder)")
    if (folder / "config.json").is_file() and any((folder / w).is_file() for w in HF_WEIGHTS):
        from glassgpt.interop import from_hf

        model, tok = from_hf(folder), _hf_tokenizer(folder)
    else:
        model, tok = _from_checkpoint(folder)
    if tokenizer is not None:
        tok = (
            _tokenizer_file(Path(tokenizer))
            if isinstance(tokenizer, (str, os.PathLike))
            else tokenizer
        )
    if tok is None:
        warnings.warn(f"{folder}: no tokenizer found; working with token ids only", stacklevel=2)
    elif tok.n_vocab > model.config.n_vocab:
        raise GlassError(
            f"tokenizer has {tok.n_vocab} ids but the model's n_vocab is {model.config.n_vocab}"
        )
    if device is not None:
        model = model.to(parse_device(device) if isinstance(device, str) else device)
    return (model.eval() if dtype is None else cast(model, dtype, inplace=True)), tok


def _from_checkpoint(folder: Path) -> tuple[Any, Any]:
    from glassgpt.model import GPT, GPTConfig

    chosen = _choose_checkpoint(folder)
    try:
        run = tomllib.loads(chosen.text("config.toml"))
    except tomllib.TOMLDecodeError as e:
        raise GlassError(f"{chosen.path / 'config.toml'}: invalid TOML: {e}") from None
    if "model" not in run:
        raise GlassError(f"{chosen.path / 'config.toml'}: has no [model] table")
    config = GPTConfig.from_dict(run["model"], prefix="model.")
    model = GPT(config)
    try:
        model.load_state_dict(chosen.tensors("model.safetensors"))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise GlassError(f"{chosen.path}: weights do not fit its config: {first}") from None
    tok = None
    if "tokenizer.json" in chosen.files:
        tok = _tokenizer_file(chosen.path / "tokenizer.json")
    return model, tok


def _choose_checkpoint(folder: Path) -> Any:
    """The verified checkpoint that ``folder`` names (see the module docstring)."""
    from glassgpt import checkpoint as ckpt

    if (folder / ckpt.STATE).is_file():
        return ckpt.load_checkpoint(folder)
    root = ckpt.ckpt_root_of(folder)
    best = root / "best"
    if not root.is_dir() or not (best.is_dir() or ckpt.step_folders(root)):
        raise GlassError(
            f"{folder}: not a glassgpt checkpoint or HF model folder "
            "(no state.json, no ckpt/ with checkpoints, no config.json with weights)"
        )
    if (best / ckpt.STATE).is_file():
        try:
            return ckpt.load_checkpoint(best)
        except ckpt.CheckpointError as e:
            warnings.warn(f"skipping {e}; using the newest step checkpoint", stacklevel=4)
    return ckpt.find_resumable(folder, warn=lambda m: warnings.warn(m, stacklevel=5))


def _tokenizer_file(path: Path) -> Any:
    """A glassgpt tokenizer file, or an HF ``tokenizer.json``."""
    from glassgpt.tokenizer import load_tokenizer

    if not path.is_file():
        raise InputFileError(f"{path}: no such tokenizer file")
    try:
        return load_tokenizer(path)
    except GlassError as first:
        try:
            from glassgpt.interop.hf_tokenizers import load_tokenizer_json  # type: ignore[attr-defined]
        except ImportError:
            raise first from None
        try:
            return load_tokenizer_json(path)
        except GlassError:
            raise first from None


def _hf_tokenizer(folder: Path) -> Any:
    from glassgpt.tokenizer import Tokenizer

    if (folder / "tokenizer.json").is_file():
        return _tokenizer_file(folder / "tokenizer.json")
    for vocab, merges in (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")):
        if (folder / vocab).is_file() and (folder / merges).is_file():
            return Tokenizer.from_gpt2(folder / vocab, folder / merges)
    return None
