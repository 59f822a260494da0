from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from glassgpt.data.sampler import BatchSampler, eval_windows, iter_eval_batches
from glassgpt.data.shards import TokenStream
from glassgpt.errors import GlassError


def _stream(tmp_path: Path, n: int, shard: int) -> TokenStream:
    """Tokens 0, 1, …, n − 1 (each window is known by its first token) in shards of ``shard``."""
    paths = []
    for i, start in enumerate(range(0, n, shard)):
        p = tmp_path / f"train_{i:03d}.bin"
        np.arange(start, min(start + shard, n), dtype="<u2").tofile(p)
        paths.append(p)
    return TokenStream(paths, np.dtype("<u2"))


@pytest.mark.parametrize("shard", [10_000, 37])
def test_windows_are_contiguous_slices_of_the_stream(tmp_path: Path, shard: int) -> None:
    stream = _stream(tmp_path, 1000, shard)
    sampler = BatchSampler(stream, batch_size=8, seq_len=16, seed=1)
    for _ in range(20):
        x, y = next(sampler)
        assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
        starts = x[:, :1]
        assert torch.equal(x, starts + torch.arange(16))  # crosses shard files seamlessly
        assert torch.equal(y, x + 1)
        assert int(starts.min()) >= 0 and int(starts.max()) <= 1000 - 17


def test_every_start_is_reachable(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 12, 5)  # starts 0 … 12 − 4 − 1 = 7
    sampler = BatchSampler(stream, batch_size=64, seq_len=4, seed=0)
    seen = {int(o) for _ in range(10) for o in sampler.next_starts()}
    assert seen == set(range(8))


def test_seed_determines_the_stream(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 5000, 999)
    a = [BatchSampler(stream, batch_size=4, seq_len=8, seed=3).next_batch()[0] for _ in range(2)]
    assert torch.equal(a[0], a[1])
    b = BatchSampler(stream, batch_size=4, seq_len=8, seed=4).next_batch()[0]
    assert not torch.equal(a[0], b)


def test_state_restores_the_exact_stream(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 5000, 999)
    s = BatchSampler(stream, batch_size=4, seq_len=8, seed=7)
    for _ in range(5):
        s.next_batch()
    state = json.loads(json.dumps(s.state_dict()))  # survives a JSON round trip
    expected = [s.next_batch() for _ in range(5)]
    fresh = BatchSampler(stream, batch_size=4, seq_len=8, seed=0)
    fresh.load_state_dict(state)
    assert fresh.step == 5
    for (x, y), (ex, ey) in zip((fresh.next_batch() for _ in range(5)), expected):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    with pytest.raises(GlassError, match="seq_len"):
        BatchSampler(stream, batch_size=4, seq_len=9).load_state_dict(state)
    with pytest.raises(GlassError, match="global_batch"):
        BatchSampler(stream, batch_size=2, seq_len=8).load_state_dict(state)


def test_ranks_split_the_global_batch(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 5000, 999)
    single = BatchSampler(stream, batch_size=6, seq_len=8, seed=11)
    ranks = [
        BatchSampler(stream, batch_size=2, seq_len=8, seed=11, rank=r, world_size=3)
        for r in range(3)
    ]
    for _ in range(4):
        x, y = single.next_batch()
        parts = [r.next_batch() for r in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
        assert not torch.equal(parts[0][0], parts[1][0])
    # a saved single-process state continues on 3 ranks with the same global batch
    state = single.state_dict()
    expected = single.next_batch()[0]
    ranks[2].load_state_dict(state)
    assert torch.equal(ranks[2].next_batch()[0], expected[4:6])


def test_eval_batches_cover_the_split_in_order(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 103, 40)
    T = 10
    n = eval_windows(103, T)
    assert n == 10
    batches = list(iter_eval_batches(stream, batch_size=3, seq_len=T))
    assert [b[0].shape[0] for b in batches] == [3, 3, 3, 1]
    x = torch.cat([b[0] for b in batches]).flatten()
    y = torch.cat([b[1] for b in batches]).flatten()
    assert torch.equal(x, torch.arange(n * T)) and torch.equal(y, torch.arange(1, n * T + 1))
    ranks = [
        list(iter_eval_batches(stream, batch_size=2, seq_len=T, rank=r, world_size=2))
        for r in range(2)
    ]
    merged = torch.cat(
        [torch.cat([a[0], b[0]]) for a, b in zip(*ranks)]
        + [b[0] for b in ranks[0][len(ranks[1]) :]]
    )
    assert torch.equal(merged.flatten(), x)
    assert len(list(iter_eval_batches(stream, batch_size=3, seq_len=T, max_batches=2))) == 2


def test_too_short_and_bad_layout(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 8, 8)
    with pytest.raises(GlassError, match="needs at least 9"):
        BatchSampler(stream, batch_size=1, seq_len=8)
    with pytest.raises(GlassError, match="needs at least 9"):
        list(iter_eval_batches(stream, batch_size=1, seq_len=8))
    with pytest.raises(GlassError, match="rank"):
        BatchSampler(stream, batch_size=1, seq_len=2, rank=2, world_size=2)
    with pytest.raises(GlassError, match="batch_size"):
        BatchSampler(stream, batch_size=0, seq_len=2)
