"""What a run reads: its data folder and tokenizer, and whether its batch fits in memory.

``data.paths`` resolves to a prepared data folder (``meta.json`` + shards + tokenizer):

- empty: the embedded corpus (this interpreter's standard library sources), prepared into
  ``OUT/data`` with a tokenizer trained on it (``data.tokenizer = "char"`` or ``"bpe"``);
- one prepared folder: used in place, with the tokenizer saved in it;
- inputs of any format ``glassgpt data prepare`` reads (text, ``.jsonl``, ``.json``,
  ``.parquet``, saved datasets, ``hf:NAME[:split]``; ``data.text_field``, ``data.skip_bad``):
  prepared into ``OUT/data``.

``data.tokenizer`` may also name a saved tokenizer JSON, which a prepared folder must match
(its fingerprint). The memory check compares glassgpt's estimate of training memory, weights
+ gradients + AdamW moments + saved activations, with the memory the device has free.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from glassgpt.console import say
from glassgpt.data import DataDir, default_corpus_files
from glassgpt.data import prepare as prepare_data
from glassgpt.data.documents import Corpus
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.model.memory import estimate_training_memory, format_bytes, per_rank_memory
from glassgpt.tokenizer import CharTokenizer, Tokenizer, load_tokenizer
from glassgpt.tokenizer.family import FamilyTokenizer, read_sidecars, write_sidecars
from glassgpt.train.config import DataConfig, RunConfig

DATA_SUBDIR = "data"
EOT = "<|endoftext|>"


@dataclass
class RunData:
    """A prepared data folder (``glassgpt.data.DataDir``) and its tokenizer."""

    data: Any  # DataDir
    tokenizer: Any
    tokenizer_json: bytes
    # the tokenizer's sidecars (glassgpt.tokenizer.family.SIDECARS), which checkpoints keep
    tokenizer_files: dict[str, bytes] = field(default_factory=dict)

    @property
    def bytes_per_token(self) -> float | None:
        """UTF-8 bytes per token of the validation split (for bits per byte)."""
        val = self.data.split("val")
        return val.bytes / val.tokens if val.tokens else None


def is_prepared(path: str | Path) -> bool:
    return (Path(path) / "meta.json").is_file()


def train_tokenizer(cfg: DataConfig, files: Any) -> Any:
    """A tokenizer trained on ``files`` (paths or a ``Corpus``; char or BPE) or loaded from
    ``cfg.tokenizer``."""
    texts = files.texts() if hasattr(files, "texts") else files
    if cfg.tokenizer == "char":
        return CharTokenizer.train(texts)
    if cfg.tokenizer == "bpe":
        return Tokenizer.train(texts, cfg.vocab_size, special_tokens=[EOT])
    path = Path(cfg.tokenizer)
    if not path.is_file():
        raise ConfigError(
            "data.tokenizer", f"must be char, bpe or a tokenizer file; {path} is none"
        )
    return load_tokenizer(path)


def source_files(cfg: DataConfig) -> Any:
    """What a run trains on: ``data.paths`` as a ``Corpus``, or the default corpus's files."""
    if not cfg.paths:
        files = default_corpus_files(cfg.max_bytes)
        if not files:
            raise GlassError("the default corpus (the standard library sources) is empty here")
        return files
    return Corpus(list(cfg.paths), text_field=cfg.text_field, skip_bad=cfg.skip_bad)


def resolve_data(
    cfg: DataConfig,
    out_dir: Path,
    *,
    tokenizer_json: bytes | None = None,
    tokenizer_files: Mapping[str, bytes] | None = None,
    prepare: bool = True,
    progress: bool = False,
) -> RunData:
    """The data folder and tokenizer of a run (preparing ``OUT/data`` where needed).

    ``tokenizer_json`` (a checkpoint's tokenizer) pins the tokenizer: a folder made with
    another one is refused; ``tokenizer_files`` are its sidecars (its ``tokenizer_config.json``
    …), read with it and kept in ``RunData``. With ``prepare=False`` (ranks other than 0) nothing is written:
    the folder rank 0 prepared is opened.
    """
    pinned = None
    if tokenizer_json is not None:
        pinned = _tokenizer_from_bytes(tokenizer_json, tokenizer_files or {})
    elif cfg.tokenizer not in ("char", "bpe"):
        pinned = train_tokenizer(cfg, [])
        if isinstance(pinned, FamilyTokenizer):  # its tokenizer_config.json … beside it
            tokenizer_files = read_sidecars(Path(cfg.tokenizer).parent)
    if len(cfg.paths) == 1 and is_prepared(cfg.paths[0]):
        data = DataDir.open(cfg.paths[0], tokenizer=pinned)
    else:
        for p in cfg.paths:
            if is_prepared(p):
                raise InputFileError(f"{p}: a prepared data folder must be the only --data path")
        target = out_dir / DATA_SUBDIR
        if not prepare:
            data = DataDir.open(target, tokenizer=pinned)
        elif pinned is not None and is_prepared(target) and _matches(target, pinned):
            data = DataDir.open(target, tokenizer=pinned)  # a resumed run's own data
        else:
            files = source_files(cfg)
            tok = pinned if pinned is not None else train_tokenizer(cfg, files)
            data = prepare_data(
                files, target, tok, val_fraction=cfg.val_fraction, progress=progress, overwrite=True
            )
            skipped = getattr(files, "describe_skipped", lambda: None)()
            if skipped:
                say(skipped, kind=None)
    tokenizer = pinned if pinned is not None else data.load_tokenizer()
    saved = tokenizer_json or (data.path / "tokenizer.json").read_bytes()
    return RunData(data, tokenizer, saved, dict(tokenizer_files or {}))


def _matches(folder: Path, tokenizer: Any) -> bool:
    try:
        DataDir.open(folder, tokenizer=tokenizer)
    except GlassError:
        return False
    return True


def _tokenizer_from_bytes(data: bytes, sidecars: Mapping[str, bytes]) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_bytes(data)
        write_sidecars(tmp, sidecars)
        return load_tokenizer(path)


# -- memory -----------------------------------------------------------------------------------


def available_memory(device: Any) -> int | None:
    """Bytes the device can still give: free GPU memory, or the CPU's MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(
    cfg: RunConfig, micro_batch: int, dtype: Any, device: Any, ranks: int, world_size: int = 1
) -> None:
    """Refuse, before the run starts, a batch or context that does not fit in memory.

    ``ranks`` processes on one CPU machine share its memory; on GPUs each has its own. Under
    ``train.parallel=fsdp`` each of the ``world_size`` ranks holds 1/W of the weights,
    gradients and optimizer state (:func:`glassgpt.model.memory.per_rank_memory`).
    """
    estimate: Any
    if cfg.train.parallel == "fsdp" and world_size > 1:
        estimate = per_rank_memory(
            cfg.model, micro_batch, cfg.seq_len, dtype, world_size=world_size,
            parallel="fsdp", device=device.type,
        )  # fmt: skip
    else:
        estimate = estimate_training_memory(
            cfg.model, micro_batch, cfg.seq_len, dtype, device=device.type
        )
    need = estimate.total * (ranks if device.type == "cpu" else 1)
    available = available_memory(device)
    if available is None or need <= available:
        return
    parts = ", ".join(
        f"{k} {format_bytes(v)}" for k, v in estimate.as_dict().items() if k != "total"
    )
    raise GlassError(
        f"train.batch_size={cfg.train.batch_size} × seq_len={cfg.seq_len} needs about "
        f"{format_bytes(need)} to train ({parts} per process, {micro_batch} sequences per "
        f"micro-step) but {device} has {format_bytes(available)} free; lower "
        "train.batch_size, raise train.grad_accum, or shorten train.seq_len"
    )
