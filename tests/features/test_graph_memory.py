"""Memory bounds of attribution graphs (issue 43 item 3): a cap that keeps fewer feature nodes
with a note instead of failing, a bfloat16 adjacency, and the same through ``glassgpt graph``.
The oracle is the uncapped float64 graph of the same model: a capped graph's entries are the
full graph's (the graph is exact, whatever the rows chosen)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.features.test_graph import PROMPT, clt, model_of

from glassgpt.cli import main
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.graphs import attribute

F64 = torch.float64


def test_a_tight_memory_cap_keeps_fewer_features_with_a_note() -> None:
    model = model_of("gpt2")
    full = attribute(model, clt(), PROMPT, dtype=F64)
    assert full.notes == [] and full.n_features == full.n_active > 20
    need = full.adjacency.numel() * 8
    capped = attribute(model, clt(), PROMPT, dtype=F64, max_memory=need / 2, batch_size=4)
    assert len(capped.notes) == 1 and "memory cap" in capped.notes[0]
    assert f"{full.n_active} feature nodes" in capped.notes[0]
    assert 0 < capped.n_features < full.n_features and capped.n_active == full.n_active
    # what it holds fits the cap: the adjacency and the rows searched
    searched = capped.n_features * (full.n_nodes - len(full.logit_tokens))
    assert (capped.adjacency.numel() + searched) * 8 <= need / 2
    where = [int(((full.features == f).all(1)).nonzero()) for f in capped.features]
    keep = torch.tensor(where + list(range(full.error_start, full.n_nodes)))
    assert (capped.adjacency - full.adjacency[keep][:, keep]).abs().max() < 1e-12
    # a cap below even the errors', tokens' and logits' rows: no features at all, still a graph
    bare = attribute(model, clt(), PROMPT, dtype=F64, max_memory=1.0)
    assert bare.n_features == 0 and bare.notes and bare.n_nodes == full.n_nodes - full.n_features
    assert (bare.adjacency - full.adjacency[full.error_start :, full.error_start :]).abs().max() < 1e-12  # fmt: skip


def test_a_bfloat16_adjacency_is_the_float32_one_rounded() -> None:
    model = model_of("gpt2").float()
    tc = clt().to(torch.float32)
    full = attribute(model, tc, PROMPT)
    half = attribute(model, tc, PROMPT, dtype=torch.bfloat16)
    assert half.adjacency.dtype == torch.bfloat16 and full.adjacency.dtype == torch.float32
    assert torch.equal(half.adjacency, full.adjacency.to(torch.bfloat16))


def test_graph_command_under_a_tight_memory_cap_notes_instead_of_failing(tiny_run: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    cfg = CLTConfig(d_model=16, d_sae=64, n_layers=2, arch="topk", k=8)
    CLT(cfg, seed=0).save(tmp_path / "clt")
    args = ["graph", "-c", str(tiny_run), "--transcoders", str(tmp_path / "clt"), "--prompt",
            "the cat sat on the mat", "-o", str(tmp_path / "g"), "--json"]  # fmt: skip
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["feature_nodes"] == full["active_features"] > 100
    assert main([*args, "--max-memory", "0.001", "--adjacency-dtype", "bfloat16"]) == 0
    out, err = capsys.readouterr()
    capped = json.loads(out)
    assert 0 < capped["feature_nodes"] < capped["active_features"] == full["active_features"]
    assert "over the memory cap of 0.00 GiB" in err and "most influential kept" in err
    assert (tmp_path / "g" / "graph.json").is_file()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_graph_command_refuses_a_memory_cap_of_nothing(tiny_run: Path, tmp_path: Path, capsys, value: str) -> None:  # fmt: skip
    args = ["graph", "-c", str(tiny_run), "--transcoders", str(tmp_path), "--prompt", "the",
            "-o", str(tmp_path / "g"), "--max-memory", value]  # fmt: skip
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-memory" in err and value in err
