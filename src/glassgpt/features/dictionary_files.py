"""A feature dictionary's folder on disk (an SAE's ``sae.json`` + ``sae.safetensors``, a CLT's
``clt.json`` + ``clt.safetensors``): written atomically, read with one-line errors naming the
file. Shared by ``glassgpt.features.sae`` and ``glassgpt.features.clt``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as st_save
from torch import Tensor, nn

from glassgpt.errors import ConfigError, InputFileError
from glassgpt.storage import atomic_write

T = TypeVar("T")


def write_folder(
    folder: str | Path, config: tuple[str, dict[str, Any]], weights: tuple[str, dict[str, Tensor]]
) -> Path:
    """Write a feature dictionary's folder atomically: ``config`` = (file name, its JSON
    document), ``weights`` = (file name, its tensors, saved as safetensors)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name, tensors = weights
    atomic_write(
        folder / name, st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    )
    name, doc = config
    atomic_write(folder / name, (json.dumps(doc, indent=1) + "\n").encode())
    return folder


def config_of(cls: type[T], doc: dict[str, Any], path: Path) -> T:
    """The config table ``doc["config"]`` of the file at ``path`` as ``cls``; one line naming
    the file where it is missing or invalid."""
    try:
        return cls.from_dict(doc["config"], prefix="config.")  # type: ignore[attr-defined]
    except KeyError:
        raise InputFileError(f"{path}: has no config") from None
    except ConfigError as e:
        raise InputFileError(f"{path}: {e}") from None


def load_weights(module: nn.Module, weights: Path, config: Path) -> None:
    """Fill ``module`` from the safetensors file ``weights``; one line naming the file where
    it is unreadable or does not fit the ``config`` file's shapes."""
    try:
        module.load_state_dict(load_file(weights))  # (no bytes copy: a CLT is GBs)
    except (OSError, SafetensorError) as e:
        raise InputFileError(f"{weights}: unreadable ({e})") from None
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0]
        raise InputFileError(f"{weights}: does not fit {config}: {first}") from None
