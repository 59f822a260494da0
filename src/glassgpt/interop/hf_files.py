"""An HF model folder, read and written: ``config.json`` and the weights, one tensor at a time.

A ``save_pretrained`` folder holds ``config.json`` and ``model.safetensors`` (or shards named
by ``model.safetensors.index.json``), or ``pytorch_model.bin`` (or shards
``pytorch_model-0000k-of-0000n.bin`` named by ``pytorch_model.bin.index.json``, as
transformers 4 wrote them). :class:`Tensors` opens each tensor when it is asked for:
``safe_open`` (or ``torch.load(mmap=True)``) memory-maps its file, the tensor is a view of
that map, and the importer copies it once, into glassgpt's layout and dtype, before the map
is dropped and the next one opened. So the peak memory of a load is the model plus one
tensor, never the file and the model side by side (``tests/interop/test_hf_memory.py``,
``test_hf_files_bin.py``). A ``.bin`` is read with ``torch.load(weights_only=True)``: no
pickled code runs.

:func:`build` makes the GPT from such copies without a second allocation: the model is made
on the meta device and its parameters are the copies themselves (``assign=True``).
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

from glassgpt.errors import GlassError, InputFileError
from glassgpt.kernels import contiguous_copy
from glassgpt.model import GPT, GPTConfig
from glassgpt.storage import atomic_write, inside

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SINGLE, INDEX, BIN, BIN_INDEX)
_READ_ERRORS = (
    OSError,
    SafetensorError,
    KeyError,
    ValueError,
    RuntimeError,
    pickle.UnpicklingError,
)


def read_config(folder: Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict (one-line errors for a missing or broken one)."""
    if not folder.is_dir():
        raise InputFileError(f"not a folder: {folder}")
    path = folder / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputFileError(f"{path}: unreadable config: {e}") from None
    if not isinstance(config, dict):
        raise InputFileError(f"{path}: unreadable config: not a JSON object")
    return config


class Tensors(Mapping[str, Tensor]):
    """The weights of an HF folder (or a state dict), by name, each read when asked for.

    ``files`` maps each name to the file holding it (``.safetensors`` or ``.bin``); ``state``
    is an in-memory state dict instead (a model object's). Reading a name marks it used;
    :meth:`unused` lists the names nobody asked for.
    """

    def __init__(
        self, files: Mapping[str, Path] | None = None, state: Mapping[str, Tensor] | None = None,
        *, where: str = "weights",
    ) -> None:  # fmt: skip
        self._files = dict(files or {})
        self._state = dict(state or {})
        self._unmapped: dict[Path, dict[str, Tensor]] = {}  # old .bin files, read whole once
        self.where = where
        self.used: set[str] = set()

    @classmethod
    def of_folder(cls, folder: Path) -> Tensors:
        """The weights of a ``save_pretrained`` folder (their names; nothing is read yet)."""
        single, bin_path = folder / SINGLE, folder / BIN
        try:
            if single.is_file():
                with safe_open(single, "pt") as f:
                    return cls(dict.fromkeys(f.keys(), single), where=str(folder))
            for index in (folder / INDEX, folder / BIN_INDEX):
                if index.is_file():
                    return cls(_index(folder, index), where=str(folder))
            if bin_path.is_file():
                state, mapped = _load_bin(bin_path)
                tensors = cls(dict.fromkeys(state, bin_path), where=str(folder))
                if not mapped:
                    tensors._unmapped[bin_path] = state
                return tensors
        except InputFileError:
            raise
        except _READ_ERRORS as e:
            raise InputFileError(f"{folder}: unreadable weights: {e}") from None
        raise InputFileError(f"{folder}: no {SINGLE}, {INDEX}, {BIN} or {BIN_INDEX}")

    def __getitem__(self, name: str) -> Tensor:
        if name in self._state:
            self.used.add(name)
            return self._state[name]
        path = self._files[name]  # KeyError for an unknown name, as a Mapping should
        try:
            if path.suffix == ".bin":
                tensor = self._from_bin(path, name)
            else:
                with safe_open(path, "pt") as f:  # a map of this tensor alone, gone once copied
                    tensor = f.get_tensor(name)
        except InputFileError:
            raise
        except _READ_ERRORS as e:
            raise InputFileError(f"{path}: unreadable weights: {e}") from None
        self.used.add(name)
        return tensor

    def _from_bin(self, path: Path, name: str) -> Tensor:
        """One tensor of a ``.bin``: the file mapped anew and only this tensor kept, so the map
        (and the pages the copy touched) goes with it, as a safetensors tensor's does."""
        state = self._unmapped.get(path)
        if state is None:
            state, mapped = _load_bin(path)
            if not mapped:
                self._unmapped[path] = state
        if name not in state:
            raise InputFileError(f"{path}: missing tensor {name} (its index names this file)")
        return state[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state or self._files)

    def __len__(self) -> int:
        return len(self._state or self._files)

    def unused(self, ignored: tuple[str, ...] = ()) -> list[str]:
        """The names never read, less those ending in ``ignored`` (buffers of old files)."""
        return sorted(n for n in self if n not in self.used and not n.endswith(ignored))


def _index(folder: Path, index: Path) -> dict[str, Path]:
    """name → shard file of a ``*.index.json`` (each shard a plain name inside the folder)."""
    weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    if not isinstance(weight_map, dict):
        raise InputFileError(f"{index}: corrupt: no weight_map")
    return {name: inside(folder, shard, index) for name, shard in weight_map.items()}


def _load_bin(path: Path) -> tuple[dict[str, Tensor], bool]:
    """A ``.bin``'s state dict, and whether its tensors are views of a memory map (a zip
    file, as torch ≥ 1.6 writes) rather than read whole (an older file)."""
    try:
        state, mapped = torch.load(path, map_location="cpu", weights_only=True, mmap=True), True
    except pickle.UnpicklingError:  # torch's explanation runs to many lines
        raise InputFileError(
            f"{path}: unreadable weights: it holds Python objects beyond plain tensors, which glassgpt never "
            "unpickles; convert it to model.safetensors"
        ) from None
    except RuntimeError:  # an old (not zip) file cannot be memory-mapped
        state, mapped = torch.load(path, map_location="cpu", weights_only=True), False
    if not isinstance(state, dict):
        raise InputFileError(f"{path}: unreadable weights: not a state dict")
    return state, mapped


def owned(t: Tensor, dtype: torch.dtype) -> Tensor:
    """One contiguous copy of ``t`` in ``dtype``: the parameter itself, owning its memory
    (never a view of a file another program may rewrite). Most are transposed views of the
    file's matrices: ``contiguous_copy`` moves those in blocks."""
    return contiguous_copy(t, dtype)


def build(config: GPTConfig, state: dict[str, Tensor]) -> GPT:
    """The GPT of ``config`` whose parameters are the tensors of ``state`` themselves
    (our names; W_Q, W_K, W_V are fused into W_QKV), in eval mode."""
    with torch.device("meta"):
        model = GPT(config)  # no memory, no random init: every parameter comes from state
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as e:  # a layout bug, not the user's file: the layouts check shapes
        first = str(e).strip().splitlines()[0]
        raise GlassError(f"the imported weights do not fit the model: {first}") from None
    return model.eval()


def write_folder(out: Path, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """``model.safetensors`` then ``config.json`` (its presence marks the folder complete)."""
    dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / SINGLE, save(tensors, metadata={"format": "pt"}))
        text = json.dumps({**config, "dtype": dtype}, indent=2) + "\n"
        atomic_write(out / CONFIG, text.encode())
    except OSError as e:
        raise InputFileError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def as_path(source: Any) -> Path | None:
    """``source`` as a folder path, or None when it is a model or a state dict."""
    return Path(source) if isinstance(source, (str, os.PathLike)) else None
