"""Activations streamed from a run's token shards through a shuffling buffer, never to disk.

    round r:  windows w₁ … w_M ~ the run's BatchSampler (seeded, uniform over the split)
              A_r = [a_site(w₁); …; a_site(w_M)]     [M·T, d_in]  (the model's forward, no grad;
                                                    a CLT's site: [M·T, L, d_model], every layer)
              π_r = a permutation of the M·T rows     (PCG64 seeded by (seed, r))
              batches  A_r[π_r[0:b]], A_r[π_r[b:2b]], …   (b = ``batch_tokens``; a tail < b dropped)

Memory is the buffer's M·T·(d_in + d_out) floats and the shards' memory maps, whatever the
dataset's size. A round's rows come from M windows drawn anywhere in the split, and the
permutation mixes the positions of a context across batches, as SAELens's mixing buffer
does; unlike a buffer refilled by halves, a round depends only on (the sampler's state when
it began, r): :meth:`state_dict` is those two and the position in the round, so a resumed
trainer recomputes the round and continues with the very same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor

from glassgpt.data.sampler import BatchSampler
from glassgpt.data.shards import TokenStream
from glassgpt.errors import GlassError
from glassgpt.features.sites import Site, read
from glassgpt.model import GPT

Reader = Callable[[GPT, Tensor], tuple[Tensor, Tensor | None]]  # (model, tokens [B, T]) → (x, y)


class ActivationBuffer:
    """``next_batch() -> (x [b, d_in], y [b, d_out] or None)``: shuffled activations of a site.

    ``site``: a :class:`Site`, or a reader of (x [B, T, ...], y or None) from the model and
    tokens. ``buffer_tokens`` is rounded down to whole windows of ``seq_len`` (at least one model
    batch of ``model_batch`` windows); ``autocast``: the dtype the model runs under (None:
    as its weights), activations kept in float32.
    """

    def __init__(
        self,
        model: GPT,
        site: Site | Reader,
        stream: TokenStream,
        *,
        batch_tokens: int,
        buffer_tokens: int,
        seq_len: int,
        model_batch: int,
        seed: int = 0,
        autocast: torch.dtype | None = None,
    ) -> None:
        if seq_len < 1 or seq_len > model.config.n_ctx:
            raise GlassError(f"seq_len: must be in [1, n_ctx={model.config.n_ctx}], got {seq_len}")
        windows = max(model_batch, buffer_tokens // seq_len)
        windows -= windows % model_batch  # whole model batches
        if windows * seq_len < batch_tokens:
            raise GlassError(
                f"buffer_tokens={buffer_tokens} holds fewer tokens than one batch of "
                f"{batch_tokens}; raise train.buffer_tokens"
            )
        self.model, self.seed = model, seed
        self.read: Reader = site if callable(site) else partial(read, site=site)
        self.batch_tokens, self.seq_len, self.model_batch = batch_tokens, seq_len, model_batch
        self.windows, self.autocast = windows, autocast
        self.sampler = BatchSampler(stream, "train", batch_size=model_batch, seq_len=seq_len, seed=seed)  # fmt: skip
        self.device = next(model.parameters()).device
        self.round, self.pos = -1, 0
        self.round_start: dict[str, Any] = self.sampler.state_dict()
        self.x: Tensor | None = None
        self.y: Tensor | None = None
        self.order: Tensor | None = None

    @property
    def per_round(self) -> int:
        """Batches a round yields."""
        return self.windows * self.seq_len // self.batch_tokens

    def _fill(self) -> None:
        """Compute round ``self.round`` from the sampler's current state."""
        self.round_start = self.sampler.state_dict()
        xs, ys = [], []
        cast = (
            torch.autocast(self.device.type, dtype=self.autocast)
            if self.autocast is not None
            else nullcontext()
        )
        with torch.no_grad(), cast:
            for _ in range(self.windows // self.model_batch):
                tokens, _ = self.sampler.next_batch()
                x, y = self.read(self.model, tokens.to(self.device))
                xs.append(x.flatten(0, 1).float())  # a row per token
                if y is not None:
                    ys.append(y.flatten(0, 1).float())
        self.x = torch.cat(xs)
        self.y = torch.cat(ys) if ys else None
        rng = np.random.Generator(np.random.PCG64([self.seed, self.round]))
        self.order = torch.from_numpy(rng.permutation(len(self.x))).to(self.device)

    def next_batch(self) -> tuple[Tensor, Tensor | None]:
        if self.order is None or self.pos >= self.per_round:
            self.round, self.pos = self.round + 1, 0
            self._fill()
        assert self.order is not None and self.x is not None
        rows = self.order[self.pos * self.batch_tokens : (self.pos + 1) * self.batch_tokens]
        self.pos += 1
        return self.x[rows], (self.y[rows] if self.y is not None else None)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor | None]]:
        while True:
            yield self.next_batch()

    def sample(self, n: int) -> tuple[Tensor, Tensor | None]:
        """The first ``n`` rows of the current round in its shuffled order (filling it if
        needed), without advancing: what the geometric median is taken of."""
        if self.order is None:
            self.round, self.pos = 0, 0
            self._fill()
        assert self.order is not None and self.x is not None
        rows = self.order[:n]
        return self.x[rows], (self.y[rows] if self.y is not None else None)

    def state_dict(self) -> dict[str, Any]:
        """(round, position in it, the sampler's state when it began): JSON-able."""
        return {"round": self.round, "pos": self.pos, "sampler": self.round_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Recompute the saved round and continue at its position."""
        self.sampler.load_state_dict(state["sampler"])
        self.round, self.pos = int(state["round"]), int(state["pos"])
        if self.round >= 0:
            self._fill()
        else:
            self.order = None
