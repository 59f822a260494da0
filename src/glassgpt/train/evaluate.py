"""``glassgpt eval``: a model's loss on text, as the trainer measures its validation loss.

    loss = (1/N) Σ_i −log p(t_{i+1} | t_{≤i})   over disjoint windows of seq_len + 1 tokens
    perplexity = exp(loss)
    bits per byte = loss / ln 2 · tokens / bytes

The windows are the trainer's evaluation windows (``glassgpt.data.iter_eval_batches``).
Without ``data``, a run is evaluated as its trainer evaluated it (:func:`run_defaults`): its
own data folder's val split, its ``train.seq_len``, the first ``train.eval_batches`` global
batches of its micro-batch × processes windows, under its ``train.precision``'s autocast
(bf16 on CPUs that have it), so the loss is the trainer's ``val_loss`` for those weights.
(All windows, or float32 where the trainer ran bf16, give another number.) Text files are encoded with the model's
tokenizer and joined by its document separator, as ``glassgpt data prepare`` joins them;
bits per byte divides by the UTF-8 bytes of that text, so it compares models whatever their
tokenizers.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from glassgpt.checkpoint import Run, needs_tokenizer, open_run
from glassgpt.console import say
from glassgpt.data import DataDir, iter_eval_batches, resolve_inputs
from glassgpt.data.prepare import separator
from glassgpt.data.sampler import eval_windows
from glassgpt.data.shards import TokenStream
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.model.precision import cast, parse_dtype
from glassgpt.tokenizer.files import read_text
from glassgpt.train.config import build_run_config
from glassgpt.train.device import resolve_precision
from glassgpt.train.inputs import is_prepared

LONGEST_DEFAULT_WINDOW = 4096  # without --seq-len: n_ctx up to this (Llama 3.2's is 131072)


class ArrayStream(TokenStream):
    """A token stream held in memory (one array), read like a split's shards."""

    def __init__(self, ids: np.ndarray) -> None:
        self.maps = [ids] if len(ids) else []
        self.starts = np.array([0, len(ids)]) if len(ids) else np.array([0])


def encode_files(tokenizer: Any, paths: Sequence[str]) -> tuple[ArrayStream, int]:
    """(stream, UTF-8 bytes) of text files or folders, joined by the document separator."""
    kind, text, sep_ids = separator(tokenizer)
    sep_bytes = len(text.encode("utf-8")) if kind == "text" else 0
    ids: list[int] = []
    n_bytes = 0
    for i, path in enumerate(resolve_inputs(list(paths))):
        body = read_text(path)
        if i:
            ids += sep_ids
            n_bytes += sep_bytes
        ids += tokenizer.encode_ordinary(body)
        n_bytes += len(body.encode("utf-8"))
    return ArrayStream(np.asarray(ids, dtype=np.int64)), n_bytes


@dataclass(frozen=True)
class RunEval:
    """How a run's trainer measured its validation loss (see :func:`run_defaults`)."""

    data: Path
    seq_len: int
    batch_size: int  # a global evaluation batch: micro-batch × processes
    max_batches: int | None
    autocast: torch.dtype | None


def run_defaults(run: Run, device: torch.device) -> RunEval:
    """The trainer's validation windows and precision for the run that ``run`` (opened from
    a run folder, its ``ckpt/`` or one checkpoint folder) belongs to, from its config and
    ``run.json``; a one-line error where it is no such run."""
    run_dir = run.run_dir
    if run_dir is None:
        raise GlassError(
            f"{run.source}: not a glassgpt run folder (no config.toml beside ckpt/), so it has "
            "no validation split of its own; pass --data FILE..."
        )
    cfg = build_run_config(run.config)
    info: dict[str, Any] = {}
    if (run_dir / "run.json").is_file():
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    data = run_dir / "data"
    if not is_prepared(str(data)) and info.get("data"):
        data = Path(info["data"])
    if not is_prepared(str(data)):
        raise GlassError(f"{run_dir}: its data folder ({data}) is gone; pass --data FILE...")
    world = int(info.get("world_size") or 1)
    micro = cfg.train.batch_size // (world * cfg.train.grad_accum)
    autocast, _ = resolve_precision(cfg.train.precision, device)
    return RunEval(data, cfg.seq_len, micro * world, cfg.train.eval_batches, autocast)


@torch.no_grad()
def mean_loss(
    model: Any,
    stream: TokenStream,
    *,
    seq_len: int,
    batch_size: int,
    progress: bool,
    max_batches: int | None = None,
    autocast: torch.dtype | None = None,
) -> float:
    """Token-weighted mean next-token loss over the disjoint evaluation windows (the first
    ``max_batches`` batches), under ``autocast`` as the trainer evaluates when it is given."""
    device = next(model.parameters()).device
    n_batches = -(-eval_windows(len(stream), seq_len) // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    total, count = 0.0, 0
    batches = iter_eval_batches(
        stream, batch_size=batch_size, seq_len=seq_len, max_batches=max_batches
    )
    for x, y in tqdm(batches, total=n_batches, unit="batch", disable=not progress):
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext():
            _, loss = model(x, y)
        n = int((y != -1).sum())
        total += float(loss.double()) * n
        count += n
    if not count:
        raise GlassError("no evaluation window: the text is shorter than seq_len + 1 tokens")
    return total / count


def evaluate_command(
    checkpoint: str | Path,
    data: Sequence[str] | None = None,
    *,
    split: str = "val",
    seq_len: int | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Loss, perplexity and bits per byte of a checkpoint on files or a prepared split, with
    its weights in ``dtype`` (``glassgpt.model.precision.cast``). Without ``data``: the run's
    own validation split, exactly as its trainer measured it (:func:`run_defaults`; ``dtype``
    None there means the trainer's autocast, elsewhere float32)."""
    where = parse_device(device)
    dtype_ = parse_dtype(dtype or "float32")
    opened = open_run(checkpoint, device=where)
    run = run_defaults(opened, where) if not data else None
    model, tok = opened.model, opened.tokenizer
    assert model is not None
    if dtype_ != torch.float32:
        model = cast(model, dtype_)
    needs_tokenizer(tok, checkpoint, flag=None)
    max_batches, autocast = None, None
    if run is not None:
        data = [str(run.data)]
        seq_len, batch_size = seq_len or run.seq_len, batch_size or run.batch_size
        max_batches = run.max_batches
        autocast = run.autocast if dtype is None else None
    batch_size = batch_size or 8
    assert data is not None
    if len(data) == 1 and is_prepared(data[0]):
        folder = DataDir.open(data[0], tokenizer=tok)
        if split not in folder.meta.splits:
            raise GlassError(f"--split {split}: {data[0]} has {', '.join(folder.meta.splits)}")
        stream, n_bytes = folder.stream(split), folder.split(split).bytes
        source = f"{data[0]}, {split} split"
    else:
        stream, n_bytes = encode_files(tok, data)
        source = ", ".join(data)
    n_ctx = model.config.n_ctx
    if seq_len is None and n_ctx > LONGEST_DEFAULT_WINDOW:  # a window's attention is T × T
        seq_len = min(LONGEST_DEFAULT_WINDOW, max(1, len(stream) - 1))
        say(f"windows of {seq_len} tokens of the model's n_ctx={n_ctx} (--seq-len N to change)")
    seq_len = seq_len or n_ctx
    if not 1 <= seq_len <= n_ctx:
        raise GlassError(f"--seq-len: must be in [1, n_ctx={n_ctx}], got {seq_len}")
    if batch_size < 1:
        raise GlassError(f"--batch-size: must be ≥ 1, got {batch_size}")
    loss = mean_loss(model, stream, seq_len=seq_len, batch_size=batch_size, progress=progress,
                     max_batches=max_batches, autocast=autocast)  # fmt: skip
    tokens = len(stream)
    if max_batches is not None:  # the windows measured, not the whole split
        windows = min(eval_windows(tokens, seq_len), max_batches * batch_size)
        source += f", its first {windows} windows (train.eval_batches={max_batches})"
        n_bytes = round(n_bytes * windows * seq_len / tokens)
        tokens = windows * seq_len
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_byte": loss / math.log(2) * tokens / max(n_bytes, 1),
        "tokens": tokens,
        "bytes": n_bytes,
        "seq_len": seq_len,
        "source": source,
        "checkpoint": str(checkpoint),
        "dtype": dtype or (str(autocast).removeprefix("torch.") if autocast else "float32"),
    }
