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


def _starts_oracle(seed: int, n_starts: int, batch: int, steps: int) -> list[np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed)))
    return [rng.integers(0, n_starts, size=batch) for _ in range(steps)]


def test_repeat_spans_zero_leaves_the_batches_unchanged(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 3000, 999)
    plain = BatchSampler(stream, batch_size=5, seq_len=12, seed=2)
    zero = BatchSampler(stream, batch_size=5, seq_len=12, seed=2, repeat_spans=0.0)
    for starts in _starts_oracle(2, 3000 - 12, 5, 6):
        rows = torch.as_tensor(starts[:, None] + np.arange(13))
        (x0, y0), (x, y) = plain.next_batch(), zero.next_batch()
        assert torch.equal(x, rows[:, :-1]) and torch.equal(y, rows[:, 1:])
        assert torch.equal(x, x0) and torch.equal(y, y0)
    assert "span_generator" not in zero.state_dict()


def test_repeat_spans_copy_one_earlier_span_later_with_probability_p(tmp_path: Path) -> None:
    """On the stream 0, 1, 2, … a row is its start plus 0 … T; any change must be one copy."""
    T, p, batch, steps = 63, 0.3, 32, 60
    stream = _stream(tmp_path, 20_000, 20_000)
    aug = BatchSampler(stream, batch_size=batch, seq_len=T, seed=5, repeat_spans=p)
    plain = BatchSampler(stream, batch_size=batch, seq_len=T, seed=5)
    n_repeated, lengths, gaps = 0, [], []
    for _ in range(steps):
        (x, y), (x0, _) = aug.next_batch(), plain.next_batch()
        assert torch.equal(x[:, 1:], y[:, :-1])  # one row, cut into x and y
        assert torch.equal(x[:, 0], x0[:, 0])  # same windows: the first token is never a copy
        rows = torch.cat([x, y[:, -1:]], 1).numpy()
        for row in rows:
            window = row[0] + np.arange(T + 1)
            changed = np.flatnonzero(row != window)
            if not len(changed):
                continue
            n_repeated += 1
            b, length = int(changed[0]), len(changed)
            assert np.array_equal(changed, b + np.arange(length))  # one contiguous span
            a = int(row[b] - row[0])
            assert np.array_equal(row[b : b + length], window[a : a + length])
            assert 2 <= length <= (T + 1) // 2 and a + length <= b  # earlier, not overlapping
            lengths.append(length)
            gaps.append(b - a - length)
    n = batch * steps
    assert abs(n_repeated - p * n) < 4 * np.sqrt(n * p * (1 - p))
    # L ~ U{2 … 32}: every length occurs and the mean is 17
    assert set(lengths) == set(range(2, 33))
    assert abs(np.mean(lengths) - 17) < 4 * np.std(range(2, 33)) / np.sqrt(len(lengths))
    assert min(gaps) == 0 and max(gaps) > T // 2


def test_repeat_spans_resume_and_ranks(tmp_path: Path) -> None:
    stream = _stream(tmp_path, 5000, 999)
    single = BatchSampler(stream, batch_size=6, seq_len=16, seed=4, repeat_spans=0.7)
    ranks = [
        BatchSampler(
            stream, batch_size=3, seq_len=16, seed=4, rank=r, world_size=2, repeat_spans=0.7
        )
        for r in range(2)
    ]
    for _ in range(3):
        x, _ = single.next_batch()
        assert torch.equal(torch.cat([r.next_batch()[0] for r in ranks]), x)
    state = json.loads(json.dumps(single.state_dict()))
    expected = [single.next_batch()[0] for _ in range(3)]
    fresh = BatchSampler(stream, batch_size=6, seq_len=16, seed=0, repeat_spans=0.7)
    fresh.load_state_dict(state)
    for e in expected:
        assert torch.equal(fresh.next_batch()[0], e)
    with pytest.raises(GlassError, match=r"repeat_spans.*1\.5"):
        BatchSampler(stream, batch_size=1, seq_len=4, repeat_spans=1.5)


def test_repeat_spans_in_the_run_config() -> None:
    from glassgpt.train.config import load_run_config

    cfg = load_run_config(preset="cpu-tiny", overrides=["data.repeat_spans=0.25"])
    assert cfg.data.repeat_spans == 0.25
    with pytest.raises(GlassError, match=r"data\.repeat_spans.*-0\.1"):
        load_run_config(preset="cpu-tiny", overrides=["data.repeat_spans=-0.1"])
