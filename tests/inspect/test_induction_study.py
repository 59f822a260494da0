"""The induction study's claims hold on a two-layer attention-only model trained in the test.

The model learns induction on synthetic data in a few seconds (train_synthetic: random
tokens, then a segment of 2–8 distinct tokens twice, loss only inside the second copy; N(0, 1)
embeddings and an untied unembedding make it quick). The study then has to find the circuit
without being told where it is, and each intervention has to agree with it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from glassgpt.cli import main
from glassgpt.inspect.induction import (
    induction_prompts,
    query_positions,
    run_induction_study,
    summary,
    target_logprob,
)
from glassgpt.model import GPT
from glassgpt.train.synthetic import segment_batch, train_synthetic

V, T = 32, 16


@pytest.fixture(scope="module")
def trained() -> GPT:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster than several
    try:
        return train_synthetic(300, seed=0, n_vocab=V, n_ctx=T)
    finally:
        torch.set_num_threads(threads)


def test_prompts_corrupt_only_the_previous_token_of_each_key() -> None:
    clean, corrupted = induction_prompts(V, 8, batch=4, seed=3)
    n = 8
    assert torch.equal(clean[:, :n], clean[:, n:])
    assert all(len(set(row[:n].tolist())) == n for row in clean)
    changed = (clean != corrupted).any(0).nonzero().flatten().tolist()
    assert changed == [1, 3, 5, 7]
    for row_c, row_x in zip(clean, corrupted, strict=True):  # replacements come from outside r
        assert not set(row_x[1:n:2].tolist()) & set(row_c[:n].tolist())
    for t in query_positions(n):  # the key after the earlier copy keeps its token ...
        i = t - n
        assert torch.equal(corrupted[:, i + 1], clean[:, t + 1])
        assert not torch.equal(corrupted[:, i], clean[:, t])  # ... not its previous one


def test_segment_batch_repeats_a_segment_and_scores_only_its_second_copy() -> None:
    x, y = segment_batch(torch.Generator().manual_seed(0), 50, V, T)
    for row, target in zip(x, y, strict=True):
        scored = (target >= 0).nonzero().flatten()
        m = len(scored) + 1  # the last position has no next token
        assert torch.equal(row[T - 2 * m : T - m], row[T - m :])
        assert len(set(row[T - m :].tolist())) == m
        assert scored.tolist() == list(range(T - m, T - 1))
        assert torch.equal(target[scored], row[scored + 1])


def test_target_logprob_matches_a_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 7, (3, 6), generator=gen)
    logits = torch.randn(2, 3, 6, 7, generator=gen, dtype=torch.float64)
    metric = target_logprob(tokens, [1, 4])
    expect = []
    for run in logits:
        vals = [
            math.log(math.exp(run[b, t, tokens[b, t + 1]]) / float(run[b, t].exp().sum()))
            for b in range(3)
            for t in (1, 4)
        ]
        expect.append(sum(vals) / len(vals))
    assert metric.batched(logits).tolist() == pytest.approx(expect, abs=1e-12)


@pytest.mark.slow
def test_the_study_finds_and_confirms_the_circuit(trained: GPT, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = run_induction_study(trained, tmp_path, seq_len=8, batch=32, n_random=4)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["heads"] == r["heads"]
    for name in r["figures"]:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (l1, h1), (l2, h2) = r["heads"]["previous_token"], r["heads"]["induction"]
    assert (l1, l2) == (0, 1)
    assert r["head_scores"]["induction"][l2][h2] > 0.6
    assert r["head_scores"]["previous_token"][l1][h1] > 0.4

    # the repeated half is predicted in context, and the corruption undoes it
    assert r["loss"]["first_half"] - r["loss"]["second_half"] > 1.5
    assert r["patching_metric"]["gap"] > 3.0

    # K-composition of the pair stands out from random matrices; Q-composition does not
    k, q = r["composition"]["k"], r["composition"]["q"]
    assert k["pair"] > k["random_mean"] + 4 * k["random_std"]
    assert k["pair"] > k["other_pairs_mean"]
    assert k["pair"] > q["pair"]

    # activation patching: the pair's outputs recover the most; the induction head's keys
    # carry it; position by position, the previous-token head acts at the keys (even
    # positions of the first copy) and the induction head at the queries
    a = r["activation_patching"]
    heads = torch.tensor(a["head_out_all_pos"])
    assert a["pair"]["induction"] > 0.8 and a["pair"]["previous_token"] > 0.8
    assert sorted(map(tuple, a["top_two_heads"])) == sorted([(l1, h1), (l2, h2)])
    assert float(heads.min()) > -0.1
    assert a["head_k_all_pos"][l2][h2] > 0.5
    by_pos = torch.tensor(a["head_out_by_pos"])  # [L, T, H]
    prev, ind = by_pos[l1, :, h1], by_pos[l2, :, h2]
    n = 8
    keys, queries = list(range(2, n, 2)), query_positions(n)
    assert prev[keys].sum() > 0.8 * prev.sum() and prev[keys].min() > 0.1
    assert ind[queries].sum() > 0.8 * ind.sum() and ind[queries].min() > 0.1

    # ablation: with only the pair kept most of the in-context drop stays; with no head, none
    for how in ("mean", "zero"):
        b = r["ablation"][how]
        assert b["full model"]["drop_kept"] == 1.0
        assert b["only the pair kept"]["drop_kept"] > 0.7
        assert b["pair ablated"]["drop_kept"] < 0.75
        assert abs(b["every head ablated"]["drop_kept"]) < 0.15

    # path patching: the previous-token head's clean output helps only through the induction
    # head's keys (K-composition), not its queries or values, nor the logits directly
    p = r["path_patching"]
    assert p["k"] > 0.5 and p["k"] > 3 * max(abs(p["q"]), abs(p["v"]), abs(p["final"]))
    assert p["each_sender_to_induction_keys"][l1][h1] == pytest.approx(p["k"], abs=1e-5)
    assert max(map(abs, p["each_sender_to_induction_keys"][l2])) < 0.05  # same layer: no path

    text = summary(r)
    assert f"induction head L{l2}H{h2}" in text and "path patching" in text


def test_study_command_names_a_missing_run(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nope"
    assert main(["study", "induction", "-c", str(missing), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0]
