"""Batches of (x, y) windows from a split's token stream s₀ … s_{N−1}.

Training (:class:`BatchSampler`): each step draws the *global* batch's window starts

    o₁, …, o_{B·W} ~ Uniform{0, …, N − T − 1}   (one PCG64 generator seeded by ``seed``)

and row i is xᵢ = s[oᵢ : oᵢ + T], yᵢ = s[oᵢ + 1 : oᵢ + T + 1] (y is x shifted by one).
With W = ``world_size`` processes each holding B = ``batch_size`` rows, rank r takes the
r-th contiguous slice, rows r·B … (r+1)·B − 1. Every rank runs the same generator, so the
ranks' rows are distinct draws of one stream, and W processes with B rows each see exactly
the batch that one process with B·W rows sees: a DDP run reproduces the single-process run
(gradients averaged over ranks equal the gradient of the global batch's mean loss).
The state (generator state and step count) is a plain dict: ``state_dict()`` /
``load_state_dict()`` continue the identical stream, also with another W as long as B·W is
unchanged. Windows may cross shard boundaries (a split is one stream cut into files).

Evaluation (:func:`iter_eval_batches`): the windows k = 0, 1, …, ⌊(N − 1)/T⌋ − 1 with
xₖ = s[kT : kT + T], in order, so every token after the first is a target exactly once,
save a tail of fewer than T tokens; batched like the sampler (rank r takes its slice of
each global batch of B·W windows).

Repeated spans (``repeat_spans`` = p > 0, training only): with probability p a row
r = s[o : o + T + 1] (before it is cut into x and y) has one of its own spans copied later
into itself,

    r[b : b + L] ← r[a : a + L],   L ~ U{2 … ⌊(T + 1)/2⌋},  a ~ U{0 … T + 1 − 2L},
                                    b ~ U{a + L … T + 1 − L},

so the window holds the pattern ``… A B … A B`` more often than the text does; every token is
still the corpus's own. The draws come from a second generator (seeded from ``seed``, drawn for
the global batch like the starts), so the window starts are the same for every p and p = 0
leaves the batches unchanged bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glassgpt.data.shards import DataDir, TokenStream
from glassgpt.errors import ConfigError, GlassError

Batch = tuple[torch.Tensor, torch.Tensor]  # x, y: int64 [B, T]


def _stream(data: str | Path | DataDir | TokenStream, split: str) -> TokenStream:
    if isinstance(data, TokenStream):
        return data
    if not isinstance(data, DataDir):
        data = DataDir.open(data)
    return data.stream(split)


def _check_layout(batch_size: int, seq_len: int, rank: int, world_size: int) -> None:
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be positive, got {batch_size}")
    if seq_len < 1:
        raise ConfigError("seq_len", f"must be positive, got {seq_len}")
    if world_size < 1:
        raise ConfigError("world_size", f"must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError("rank", f"must be in [0, {world_size}), got {rank}")


def _gather(stream: TokenStream, starts: np.ndarray, length: int) -> np.ndarray:
    """Rows ``s[o : o + length]`` for each start o, int64 [len(starts), length]."""
    if len(stream.maps) == 1:  # one shard: a single vectorised gather
        index = starts[:, None] + np.arange(length)  # [R, length]
        return np.asarray(stream.maps[0][index], dtype=np.int64)
    if not len(starts):
        return np.empty((0, length), dtype=np.int64)
    return np.stack([stream.read(int(o), length) for o in starts])


def span_bounds(row_len: int) -> tuple[int, int]:
    """(L_min, L_max) of a repeated span in a row of ``row_len`` tokens (L_min > L_max: none fits).

    >>> span_bounds(129), span_bounds(3)
    ((2, 64), (2, 1))
    """
    return 2, row_len // 2


def draw_spans(
    rng: np.random.Generator, n_rows: int, row_len: int, p: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(repeat, L, a, b), each [n_rows]: which rows get ``r[b : b + L] ← r[a : a + L]``.

    Always draws the same numbers for a given (n_rows, row_len), whatever p, so the
    generator advances by the same amount each step."""
    lo, hi = span_bounds(row_len)
    u, fa, fb = rng.random((3, n_rows))
    length = rng.integers(lo, max(lo, hi) + 1, size=n_rows)  # [n_rows]
    a = np.floor(fa * (row_len - 2 * length + 1)).astype(np.int64)  # 0 … R − 2L
    b = a + length + np.floor(fb * (row_len - a - 2 * length + 1)).astype(np.int64)
    repeat = (u < p) & (hi >= lo)
    return repeat, length, a, b


def repeat_in_rows(
    rows: np.ndarray, repeat: np.ndarray, length: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """``rows`` with ``rows[i, b_i : b_i + L_i] ← rows[i, a_i : a_i + L_i]`` where ``repeat[i]``.

    >>> rows = np.arange(10)[None, :]
    >>> one = np.array([1])
    >>> repeat_in_rows(rows, np.array([True]), 2 * one, one, 6 * one).tolist()
    [[0, 1, 2, 3, 4, 5, 1, 2, 8, 9]]
    """
    out = rows.copy()
    for i in np.flatnonzero(repeat):
        n, src, dst = int(length[i]), int(a[i]), int(b[i])
        out[i, dst : dst + n] = rows[i, src : src + n]
    return out


def _to_batch(rows: np.ndarray, device: torch.device | str | None) -> Batch:
    x = torch.from_numpy(np.ascontiguousarray(rows[:, :-1]))  # [B, T]
    y = torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))  # [B, T]
    if device is not None and torch.device(device).type != "cpu":
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    return x, y


class BatchSampler:
    """Seeded random windows over a split; iterate it or call :meth:`next_batch`.

    >>> import numpy as np, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp(), "train_000.bin")
    >>> np.arange(100, dtype="<u2").tofile(path)
    >>> s = BatchSampler(TokenStream([path], np.dtype("<u2")), batch_size=2, seq_len=4, seed=0)
    >>> x, y = s.next_batch()
    >>> x.shape, x.dtype, bool((y == x + 1).all())
    (torch.Size([2, 4]), torch.int64, True)
    """

    def __init__(
        self,
        data: str | Path | DataDir | TokenStream,
        split: str = "train",
        *,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
        repeat_spans: float = 0.0,
    ) -> None:
        _check_layout(batch_size, seq_len, rank, world_size)
        if not 0 <= repeat_spans <= 1:
            raise ConfigError("data.repeat_spans", f"must be in [0, 1], got {repeat_spans}")
        self.repeat_spans = float(repeat_spans)
        self.stream = _stream(data, split)
        self.split, self.batch_size, self.seq_len = split, batch_size, seq_len
        self.seed, self.rank, self.world_size, self.device = seed, rank, world_size, device
        self.n_starts = len(self.stream) - seq_len  # o ∈ [0, N − T − 1]
        if self.n_starts < 1:
            raise GlassError(
                f"the {split} split has {len(self.stream)} tokens; a window of "
                f"seq_len={seq_len} needs at least {seq_len + 1}"
            )
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
        spans = np.random.SeedSequence(seed, spawn_key=(1,))  # independent of the starts
        self.span_rng = np.random.Generator(np.random.PCG64(spans))
        self.step = 0

    def next_starts(self) -> np.ndarray:
        """This rank's window starts for the next step (advances the generator)."""
        starts = self.rng.integers(0, self.n_starts, size=self.batch_size * self.world_size)
        self.step += 1
        return starts[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def next_batch(self) -> Batch:
        """(x, y), int64 [batch_size, seq_len] each."""
        rows = _gather(self.stream, self.next_starts(), self.seq_len + 1)  # [B, T + 1]
        if self.repeat_spans > 0:
            mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
            draws = draw_spans(
                self.span_rng,
                self.batch_size * self.world_size,
                self.seq_len + 1,
                self.repeat_spans,
            )
            rows = repeat_in_rows(rows, *(d[mine] for d in draws))
        return _to_batch(rows, self.device)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the stream: JSON- and torch.save-friendly."""
        return {
            "seed": self.seed,
            "step": self.step,
            "global_batch": self.batch_size * self.world_size,
            "seq_len": self.seq_len,
            "n_tokens": len(self.stream),
            "bit_generator": self.rng.bit_generator.state,
            **({"span_generator": self.span_rng.bit_generator.state} if self.repeat_spans else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream saved by :meth:`state_dict` (same data, global batch, seq_len)."""
        mine = self.state_dict()
        for key in ("global_batch", "seq_len", "n_tokens"):
            if key not in state:
                raise GlassError(f"sampler state lacks {key!r}")
            if state[key] != mine[key]:
                raise GlassError(
                    f"sampler state has {key}={state[key]}, this sampler has {mine[key]}"
                )
        try:
            self.rng.bit_generator.state = state["bit_generator"]
            if self.repeat_spans and "span_generator" in state:
                self.span_rng.bit_generator.state = state["span_generator"]
        except (KeyError, TypeError, ValueError) as e:
            raise GlassError(f"sampler state: bad generator state ({e})") from None
        self.seed, self.step = state.get("seed", self.seed), int(state.get("step", 0))


def eval_windows(n_tokens: int, seq_len: int) -> int:
    """How many disjoint evaluation windows a stream of ``n_tokens`` holds.

    >>> eval_windows(10, 3), eval_windows(4, 3), eval_windows(3, 3)
    (3, 1, 0)
    """
    return max(0, (n_tokens - 1) // seq_len)


def iter_eval_batches(
    data: str | Path | DataDir | TokenStream,
    split: str = "val",
    *,
    batch_size: int,
    seq_len: int,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str | None = None,
) -> Iterator[Batch]:
    """Disjoint consecutive windows in order (see the module docstring); the last may be short.

    ``max_batches`` limits the global batches. A rank whose slice of the last global batch
    is empty yields nothing for it.
    """
    _check_layout(batch_size, seq_len, rank, world_size)
    stream = _stream(data, split)
    n = eval_windows(len(stream), seq_len)
    if n == 0:
        raise GlassError(
            f"the {split} split has {len(stream)} tokens; a window of "
            f"seq_len={seq_len} needs at least {seq_len + 1}"
        )
    step = batch_size * world_size
    for b, first in enumerate(range(0, n, step)):
        if max_batches is not None and b >= max_batches:
            return
        k = np.arange(first, min(first + step, n))[rank * batch_size : (rank + 1) * batch_size]
        if len(k):
            yield _to_batch(_gather(stream, k * seq_len, seq_len + 1), device)
