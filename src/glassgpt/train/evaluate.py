"""``glassgpt eval``: a model's loss on text, as the trainer measures its validation loss.

    loss = (1/N) Σ_i −log p(t_{i+1} | t_{≤i})   over disjoint windows of seq_len + 1 tokens
    perplexity = exp(loss)
    bits per byte = loss / ln 2 · tokens / bytes

The windows are the trainer's evaluation windows (``glassgpt.data.iter_eval_batches``), so
on a run's own data folder and split, in the run's precision, the loss is the trainer's
``val_loss`` with ``train.eval_batches`` unset. Text files are encoded with the model's
tokenizer and joined by its document separator, as ``glassgpt data prepare`` joins them;
bits per byte divides by the UTF-8 bytes of that text, so it compares models whatever their
tokenizers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glassgpt.data.shards import TokenStream
from glassgpt.errors import GlassError


class ArrayStream(TokenStream):
    """A token stream held in memory (one array), read like a split's shards."""

    def __init__(self, ids: np.ndarray) -> None:
        self.maps = [ids] if len(ids) else []
        self.starts = np.array([0, len(ids)]) if len(ids) else np.array([0])


def encode_files(tokenizer: Any, paths: Sequence[str]) -> tuple[ArrayStream, int]:
    """(stream, UTF-8 bytes) of text files or folders, joined by the document separator."""
    from glassgpt.data import resolve_inputs
    from glassgpt.data.prepare import separator
    from glassgpt.tokenizer.files import read_text

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


@torch.no_grad()
def mean_loss(
    model: Any, stream: TokenStream, *, seq_len: int, batch_size: int, progress: bool
) -> float:
    """Token-weighted mean next-token loss over the disjoint evaluation windows."""
    from tqdm.auto import tqdm

    from glassgpt.data import iter_eval_batches
    from glassgpt.data.sampler import eval_windows

    device = next(model.parameters()).device
    n_batches = -(-eval_windows(len(stream), seq_len) // batch_size)
    total, count = 0.0, 0
    batches = iter_eval_batches(stream, batch_size=batch_size, seq_len=seq_len)
    for x, y in tqdm(batches, total=n_batches, unit="batch", disable=not progress):
        x, y = x.to(device), y.to(device)
        _, loss = model(x, y)
        n = int((y != -1).sum())
        total += float(loss.double()) * n
        count += n
    if not count:
        raise GlassError("no evaluation window: the text is shorter than seq_len + 1 tokens")
    return total / count


def evaluate_command(
    checkpoint: str | Path,
    data: Sequence[str],
    *,
    split: str = "val",
    seq_len: int | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
    progress: bool = True,
) -> dict[str, Any]:
    """Loss, perplexity and bits per byte of a checkpoint on files or a prepared split, with
    its weights in ``dtype`` (``glassgpt.sample.precision.cast``)."""
    from glassgpt.data import DataDir
    from glassgpt.interop.loading import load, parse_device
    from glassgpt.model.precision import cast, parse_dtype
    from glassgpt.train.inputs import is_prepared

    dtype_ = parse_dtype(dtype)
    model, tok = load(checkpoint, device=parse_device(device))
    if dtype_ != torch.float32:
        model = cast(model, dtype_)
    if tok is None:
        raise GlassError(f"{checkpoint}: has no tokenizer, so text cannot be encoded")
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
    seq_len = seq_len or n_ctx
    if not 1 <= seq_len <= n_ctx:
        raise GlassError(f"--seq-len: must be in [1, n_ctx={n_ctx}], got {seq_len}")
    if batch_size < 1:
        raise GlassError(f"--batch-size: must be ≥ 1, got {batch_size}")
    loss = mean_loss(model, stream, seq_len=seq_len, batch_size=batch_size, progress=progress)
    tokens = len(stream)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "bits_per_byte": loss / math.log(2) * tokens / max(n_bytes, 1),
        "tokens": tokens,
        "bytes": n_bytes,
        "seq_len": seq_len,
        "source": source,
        "checkpoint": str(checkpoint),
        "dtype": dtype,
    }
