"""``glassgpt graph`` on a tiny run with transcoders trained by ``sae train``, circuit-tracer's
JSON read back, and (in circuit-tracer's own venv) validated by its pydantic models, with
its pruning and scores on the same adjacency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from glassgpt.cli import main
from glassgpt.errors import InputFileError
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.graph_json import load_json, save_json, to_json
from glassgpt.features.graph_prune import prune, scores
from glassgpt.features.graphs import attribute
from glassgpt.features.replacement import Transcoders
from glassgpt.model import GPT, GPTConfig

FAST = ["train.batch_size=256", "train.buffer_tokens=2048", "train.model_batch=16",
        "train.log_every=5", "train.checkpoint_every=10", "train.warmup_steps=5",
        "train.eval_batches=1", "train.median_samples=512", "train.lr=2e-3"]  # fmt: skip
SIDE = Path(__file__).with_name("circuit_tracer_side.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def transcoders(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-layer transcoders of both layers of the tiny run, trained briefly."""
    out = tmp_path_factory.mktemp("transcoders")
    for layer in (0, 1):
        args = ["sae", "train", "-c", str(tiny_run), "--hook", f"blocks.{layer}.mlp_out",
                "--width", "32", "--arch", "transcoder", "-k", "4", "-o", str(out / f"L{layer}"),
                "--tokens", "2560", "--no-progress", "--set", *FAST]  # fmt: skip
        assert main(args) == 0
    return out


def test_graph_command_writes_the_graph_and_its_scores(tiny_run: Path, transcoders: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    args = ["graph", "-c", str(tiny_run), "--transcoders", str(transcoders), "--prompt",
            "the cat sat on", "-o", str(tmp_path / "g"), "--json"]  # fmt: skip
    capsys.readouterr()  # (sae train's lines)
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert 0 < summary["replacement_score"] <= 1 and 0 < summary["completeness_score"] <= 1
    assert summary["active_features"] == summary["feature_nodes"] > 0
    graph = load_json(tmp_path / "g" / "graph.json")
    assert graph.metadata["prompt"] == "the cat sat on"
    assert graph.metadata["prompt_tokens"][:3] == ["t", "h", "e"]
    kinds = {n["feature_type"] for n in graph.nodes}
    assert {"embedding", "logit", "cross layer transcoder"} <= kinds
    assert len(graph.links) == summary["edges_kept"] > 0
    # one target token: one logit node, the target
    assert main([*args[:-1], "--target", "m", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["targets"] == ["m"]
    again = load_json(tmp_path / "g" / "graph.json")
    logits = [n for n in again.nodes if n["feature_type"] == "logit"]
    assert len(logits) == 1 and logits[0]["is_target_logit"] and '"m"' in logits[0]["clerp"]
    # thresholds 1.0 keep every node with an edge
    assert main([*args[:-1], "--node-threshold", "1", "--edge-threshold", "1", "--json"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert everything["nodes_kept"] > summary["nodes_kept"] and everything["edges_kept"] > summary["edges_kept"]  # fmt: skip


def test_graph_command_bad_input_is_one_line(tiny_run: Path, transcoders: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    base = ["graph", "-c", str(tiny_run), "--transcoders", str(transcoders), "-o", str(tmp_path / "g")]  # fmt: skip
    other = tmp_path / "other"
    CLT(CLTConfig(d_model=24, d_sae=8, n_layers=2)).save(other)
    theirs = ["graph", "-c", str(tiny_run), "--transcoders", str(other), "-o", str(tmp_path / "g")]
    no_tc = [*base[:4], str(tmp_path), *base[5:]]
    cases = {
        "node": ([*base, "-p", "the", "--node-threshold", "0"], "--node-threshold: must be in (0, 1], got 0.0"),
        "edge": ([*base, "-p", "the", "--edge-threshold", "1.5"], "--edge-threshold: must be in (0, 1], got 1.5"),
        "long": ([*base, "-p", "x" * 40], "the prompt is 40 tokens, longer than the model's context n_ctx=32"),
        "target": ([*base, "-p", "the", "--target", "cat"], "--target 'cat': is 3 tokens; give one token"),
        "model": ([*theirs, "-p", "the"], "the CLT reads 2 layers of d_model=24, but this model has 2 layers of d_model=16"),
        "empty": ([*no_tc, "-p", "the"], "holds no CLT"),
    }  # fmt: skip
    for name, (args, line) in cases.items():
        assert main(args) == 2, name
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, (name, err)


def small_graph() -> tuple[GPT, object]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=13, n_ctx=8, d_model=8, n_layers=3, n_heads=2, d_mlp=16)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    tc = Transcoders(clt=CLT(CLTConfig(d_model=8, d_sae=12, n_layers=3), seed=0))
    return model, attribute(model, tc, [1, 2, 3, 4, 5, 6], prompt="abcdef")


def graph_doc(graph, pruned) -> dict:  # type: ignore[no-untyped-def]
    texts = [chr(ord("a") + i) for i in range(13)]
    return to_json(graph, pruned, slug="t", scan="glassgpt-test", node_threshold=0.8,
                   prompt_tokens=[texts[int(t)] for t in graph.tokens],
                   logit_text=[texts[i] for i in graph.logit_tokens])  # fmt: skip


def test_json_round_trip(tmp_path: Path) -> None:
    _, graph = small_graph()
    pruned = prune(graph)
    path = save_json(tmp_path / "graph.json", graph_doc(graph, pruned))
    back = load_json(path)
    ids = {n["node_id"] for n in back.nodes}
    assert len(back.links) == pruned.n_edges
    for link in back.links[:50]:  # each weight is the adjacency's entry between the two nodes
        assert link["source"] in ids and link["target"] in ids
    features = [n for n in back.nodes if n["feature_type"] == "cross layer transcoder"]
    for n in features:
        layer, idx, pos = (int(x) for x in n["node_id"].split("_"))
        row = int(((graph.features == torch.tensor([layer, pos, idx])).all(1)).nonzero())
        assert n["activation"] == pytest.approx(float(graph.activations[row]))
    doc = json.loads(path.read_text())
    doc["links"][0]["target"] = "nope"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputFileError, match=r"links\[0\]\.target 'nope' is no node"):
        load_json(path)


def circuit_tracer_python() -> str | None:
    env = os.environ.get("GLASSGPT_CIRCUIT_TRACER_PYTHON")
    if env:
        return env
    own = ROOT / ".venv-circuit-tracer" / "bin" / "python"
    return str(own) if own.is_file() else None


def test_circuit_tracer_validates_the_json_and_agrees_on_pruning(tmp_path: Path) -> None:
    python = circuit_tracer_python()
    if python is None:
        pytest.skip("circuit-tracer is not installed (.venv-circuit-tracer, made by .ci/run, or GLASSGPT_CIRCUIT_TRACER_PYTHON)")  # fmt: skip
    _, graph = small_graph()
    graph.adjacency = graph.adjacency.float()
    pruned = prune(graph)
    save_json(tmp_path / "graph.json", graph_doc(graph, pruned))
    save_file({"adjacency": graph.adjacency.contiguous()}, tmp_path / "adjacency.safetensors")
    job = {"n_layers": 3, "d_model": 8, "n_vocab": 13, "prompt": graph.prompt,
           "tokens": graph.tokens.tolist(), "features": graph.features.tolist(),
           "activations": graph.activations.tolist(), "logit_ids": graph.logit_tokens,
           "logit_probs": graph.logit_probs.tolist(), "node_threshold": 0.8,
           "edge_threshold": 0.98}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    done = subprocess.run([python, str(SIDE), str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["mismatches"] == [] and out["nodes_checked"] == len(json.loads((tmp_path / "graph.json").read_text())["nodes"])  # fmt: skip
    theirs = load_file(tmp_path / "out.safetensors")
    assert torch.equal(theirs["node_mask"], pruned.nodes)
    assert torch.equal(theirs["edge_mask"], pruned.edges)
    replacement, completeness = scores(graph)
    assert replacement == pytest.approx(out["replacement"], abs=1e-5)
    assert completeness == pytest.approx(out["completeness"], abs=1e-5)
    assert sys.executable != python
