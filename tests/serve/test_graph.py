"""The Graph tab's endpoints on a live server (float64 tiny model): a graph traced, a graph made
by ``glassgpt graph`` opened, and interventions against the model's forward pass with the same
feature edits written by hand (dense: every feature encoded, (a' − a) @ W_dec into each target
layer), for per-layer transcoders and a CLT; bad input one line, HTTP 400 each."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tests.features.test_graph_cli import circuit_tracer_python
from tests.serve.conftest import Server, request, start_server, tiny_run

from glassgpt.cli import main
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.graphs import attribute
from glassgpt.features.labels import write_labels
from glassgpt.features.replacement import Transcoders, open_transcoders
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.tokenizer.display import token_texts

PROMPT = "the cat sat on"
SIDE = Path(__file__).with_name("circuit_tracer_files_side.py")
D_SAE = 24


def transcoder_folders(root: Path, d_model: int) -> Path:
    """Random per-layer transcoders of both layers in ``root/L0``, ``root/L1`` (layer 1 labelled)."""
    for layer in (0, 1):
        cfg = SAEConfig(d_in=d_model, d_sae=D_SAE, arch="transcoder", transcoder_activation="relu",
                        hook=f"blocks.{layer}.mlp_out", dtype="float64")  # fmt: skip
        sae = SAE(cfg, seed=10 + layer)
        with torch.no_grad():
            sae.W_enc.mul_(10.0)  # activations that move the logits
            sae.b_enc.fill_(-0.15)  # about a fifth active: a small graph
        sae.save(root / f"L{layer}")
    write_labels(root / "L1", {str(i): {"label": f"feature one-{i}", "detection": 0.5} for i in range(D_SAE)})  # fmt: skip
    return root


def serve(model: Any, tok: Any, tc: Transcoders | None, files: dict[str, Path] | None = None) -> tuple[Any, Server, Any]:  # fmt: skip
    from glassgpt.serve.app import create_app

    app = create_app(model, tok, name="tiny", slots=2, transcoders=tc, graph_files=files)
    server, thread, url = start_server(app)
    return server, Server(url, app, Path()), thread


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from glassgpt.checkpoint import load

    root = tmp_path_factory.mktemp("graphserve")
    run = tiny_run(root / "tiny")
    folder = transcoder_folders(root / "tc", 32)
    assert main(["graph", "-c", str(run), "--transcoders", str(folder), "--prompt", PROMPT,
                 "-o", str(root / "made"), "--node-threshold", "1", "--edge-threshold", "1", "--json"]) == 0  # fmt: skip
    model, tok = load(run)
    model = model.double().eval()
    torch.set_num_threads(1)
    tc = open_transcoders(folder)
    server, live, thread = serve(model, tok, tc, {"made": root / "made" / "graph.json"})
    yield {"live": live, "model": model, "tok": tok, "tc": tc, "root": root, "run": run}
    server.should_exit = True
    thread.join(timeout=10)


def by_hand(model: Any, tc: Transcoders, ids: list[int], edits: list[tuple[int, int, int, str, float]]) -> torch.Tensor:  # fmt: skip
    """The last position's logits with ``edits`` (layer, pos, feature, mode, value) made densely."""
    L = model.config.n_layers
    delta: dict[int, torch.Tensor] = {}

    def read(t: torch.Tensor, name: str) -> None:
        layer = int(name.split(".")[1])
        a = tc.encode(layer, model.blocks[layer].ln2(t))  # [1, T, d_sae]
        new = a.clone()
        for l, p, i, mode, v in edits:
            if l == layer:
                new[0, p, i] = {"zero": 0.0, "scale": v * a[0, p, i], "clamp": v}[mode]
        delta[layer] = new - a

    def write(t: torch.Tensor, name: str) -> torch.Tensor:
        target = int(name.split(".")[1])
        out = t
        for source in range(target + 1):
            for tgt, W in tc.decoders(source):
                if tgt == target:
                    out = out + delta[source] @ W
        return out

    hooks = {f"blocks.{l}.resid_mid": read for l in range(L)}
    hooks.update({f"blocks.{l}.mlp_out": write for l in range(L)})
    with torch.no_grad(), model.hooks(hooks):
        return model(torch.tensor([ids]))[0, -1].double()


def check_against_hand(url: str, model: Any, tc: Transcoders, tok: Any, graph: dict[str, Any]) -> None:  # fmt: skip
    feats = [n for n in graph["doc"]["nodes"] if "transcoder" in n["feature_type"]]
    layers = {n["layer"] for n in feats}
    assert layers == {"0", "1"}, layers  # edits in both layers: the upstream one moves the other
    first = next(n for n in feats if n["layer"] == "0")
    second = max((n for n in feats if n["layer"] == "1"), key=lambda n: n["ctx_idx"])
    ids = tok.encode(PROMPT)
    clean = by_hand(model, tc.to(torch.float64), ids, [])
    for mode, value in (("zero", 0.0), ("scale", 3.0), ("clamp", 2.5)):
        edits = [{"node": first["node_id"], "mode": mode, "value": value},
                 {"node": second["node_id"], "mode": "scale", "value": -2}]  # fmt: skip
        status, d = request(url, "/api/graph/intervene", {"graph": graph["name"], "edits": edits, "max_tokens": 6, "seed": 1})  # fmt: skip
        assert status == 200, d
        hand = [tuple(int(x) for x in n["node_id"].split("_")) for n in (first, second)]
        want = by_hand(model, tc.to(torch.float64), ids,
                       [(l, p, i, e["mode"], float(e["value"])) for (l, i, p), e in zip(hand, edits)])  # fmt: skip
        assert (want - clean).abs().max() > 1e-3  # the edit matters
        for r in d["rows"]:
            assert r["logit"] == pytest.approx(float(want[r["id"]]), abs=1e-10)
            assert r["clean_logit"] == pytest.approx(float(clean[r["id"]]), abs=1e-10)
        p1, p0 = torch.softmax(want, -1), torch.softmax(clean, -1)
        assert d["kl"] == pytest.approx(float((p1 * (p1.log() - p0.log())).sum()), abs=1e-10)
        assert len(d["sample"]) > 0 and len(d["clean_sample"]) > 0


def test_intervene_equals_the_edits_by_hand_per_layer(served: dict[str, Any]) -> None:
    live = served["live"]
    status, g = request(live.url, "/api/graph/trace", {"prompt": PROMPT, "node_threshold": 1.0, "edge_threshold": 1.0})  # fmt: skip
    assert status == 200, g
    assert 0 < g["scores"]["replacement"] <= 1 and g["editable"]
    labelled = [n for n in g["doc"]["nodes"] if n["layer"] == "1" and "transcoder" in n["feature_type"]]  # fmt: skip
    assert labelled and all(n["clerp"].startswith("feature one-") for n in labelled)
    check_against_hand(live.url, served["model"], served["tc"], served["tok"], g)
    # same seed, no edits that matter (× 1): the same continuation and a KL of 0
    node = labelled[0]["node_id"]
    _, d = request(live.url, "/api/graph/intervene", {"graph": g["name"], "edits": [{"node": node, "mode": "scale", "value": 1}], "seed": 4, "max_tokens": 8})  # fmt: skip
    assert d["sample"] == d["clean_sample"] and d["kl"] == pytest.approx(0, abs=1e-12)


def test_intervene_equals_the_edits_by_hand_clt(served: dict[str, Any], tmp_path: Path) -> None:
    model, tok = served["model"], served["tok"]
    clt = CLT(CLTConfig(d_model=32, d_sae=D_SAE, n_layers=2, arch="jumprelu", dtype="float64"), seed=2)  # fmt: skip
    with torch.no_grad():
        clt.b_enc.fill_(0.1)
    clt.save(tmp_path / "clt")
    write_labels(tmp_path / "clt", {f"1/{i}": {"label": f"clt one-{i}", "detection": None} for i in range(D_SAE)})  # fmt: skip
    tc = open_transcoders(tmp_path / "clt")
    server, live, thread = serve(model, tok, tc)
    try:
        status, g = request(live.url, "/api/graph/trace", {"prompt": PROMPT, "node_threshold": 1.0, "edge_threshold": 1.0})  # fmt: skip
        assert status == 200, g
        for n in g["doc"]["nodes"]:  # a CLT's labels are keyed "layer/index"
            if "transcoder" in n["feature_type"]:
                layer, index, _ = n["node_id"].split("_")
                assert n["clerp"] == (f"clt one-{index}" if layer == "1" else ""), n
        check_against_hand(live.url, model, tc, tok, g)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_graph_made_by_the_command_opens(served: dict[str, Any]) -> None:
    live = served["live"]
    _, info = request(live.url, "/api/graph/info", method="GET")
    assert info["graphs"] and info["files"] == ["made"] and info["layers"] == [0, 1]
    status, g = request(live.url, "/api/graph/open?name=made", method="GET")
    assert status == 200, g
    on_disk = json.loads((served["root"] / "made" / "graph.json").read_text())
    assert [n["node_id"] for n in g["doc"]["nodes"]] == [n["node_id"] for n in on_disk["nodes"]]
    assert g["doc"]["links"] == on_disk["links"] and g["doc"]["metadata"]["prompt"] == PROMPT
    # uploaded as the browser does (the same file): opens under its own name, intervenable
    status, up = request(live.url, "/api/graph/upload", {"doc": on_disk})
    assert status == 200 and up["name"] == "upload:made", up
    node = next(n for n in up["doc"]["nodes"] if "transcoder" in n["feature_type"])
    status, d = request(live.url, "/api/graph/intervene", {"graph": up["name"], "edits": [{"node": node["node_id"], "mode": "zero"}]})  # fmt: skip
    assert status == 200 and len(d["rows"]) == 10
    status, f = request(live.url, "/api/graph/feature/1/3", method="GET")
    assert status == 200 and f["label"] == "feature one-3" and f["page"] is None


def test_circuit_tracers_own_file_opens(served: dict[str, Any], tmp_path: Path) -> None:
    """A graph file written by circuit-tracer's own create_graph_files (in its venv) opens and
    its features can be edited; skipped without circuit-tracer."""
    python = circuit_tracer_python()
    if python is None:
        pytest.skip("circuit-tracer is not installed (.venv-circuit-tracer, made by .ci/run, or GLASSGPT_CIRCUIT_TRACER_PYTHON)")  # fmt: skip
    model, tok, tc = served["model"], served["tok"], served["tc"]
    graph = attribute(model, tc, tok.encode(PROMPT), prompt=PROMPT)
    save_file(
        {"adjacency": graph.adjacency.float().contiguous()}, tmp_path / "adjacency.safetensors"
    )
    cfg = model.config
    job = {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_vocab": cfg.n_vocab,
           "prompt": PROMPT, "tokens": graph.tokens.tolist(), "features": graph.features.tolist(),
           "activations": graph.activations.tolist(), "logit_ids": graph.logit_tokens,
           "logit_probs": graph.logit_probs.tolist(),
           "vocab": token_texts(tok, range(cfg.n_vocab))}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    done = subprocess.run([python, str(SIDE), str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads((tmp_path / "out" / "theirs.json").read_text())

    live = served["live"]
    status, g = request(live.url, "/api/graph/upload", {"doc": theirs})
    assert status == 200, g
    assert g["name"] == "upload:theirs" and g["doc"]["metadata"]["scan"] == "glassgpt-test"
    features = [n for n in g["doc"]["nodes"] if "transcoder" in n["feature_type"]]
    ours = {f"{l}_{i}_{p}" for l, p, i in graph.features.tolist()}
    assert features and {n["node_id"] for n in features} <= ours  # (it drops unlinked nodes)
    node = features[-1]["node_id"]
    status, d = request(live.url, "/api/graph/intervene", {"graph": g["name"], "edits": [{"node": node, "mode": "scale", "value": 4}]})  # fmt: skip
    assert status == 200 and d["edits"][0]["layer"] == int(node.split("_")[0]), d


def test_bad_input_is_one_line_each(served: dict[str, Any], tmp_path: Path) -> None:
    live = served["live"]
    _, g = request(live.url, "/api/graph/trace", {"prompt": PROMPT, "node_threshold": 1.0})
    feature = next(n["node_id"] for n in g["doc"]["nodes"] if "transcoder" in n["feature_type"])
    token = next(n["node_id"] for n in g["doc"]["nodes"] if n["feature_type"] == "embedding")
    doc = json.loads((served["root"] / "made" / "graph.json").read_text())
    deeper = json.loads(json.dumps(doc))
    for n in deeper["nodes"]:
        if n["feature_type"] == "logit":
            n["layer"] = "7"
    retokened = json.loads(json.dumps(doc))
    retokened["metadata"]["prompt_tokens"][0] = "T"

    def intervene(edit: dict[str, Any]) -> tuple[int, Any]:
        return request(live.url, "/api/graph/intervene", {"graph": g["name"], "edits": [edit]})

    cases = {
        "unknown node": (intervene({"node": "9_9_9", "mode": "zero"}), "edits[0].node '9_9_9': no such node in graph"),
        "not a feature": (intervene({"node": token, "mode": "zero"}), "an embedding node; only features can be edited"),
        "scale not a number": (intervene({"node": feature, "mode": "scale", "value": "2x"}), "edits.0.value"),
        "mode": (intervene({"node": feature, "mode": "double"}), "edits.0.mode"),
        "unknown graph": (request(live.url, "/api/graph/intervene", {"graph": "nope", "edits": [{"node": feature, "mode": "zero"}]}), "graph 'nope': not open"),
        "other model's layers": (request(live.url, "/api/graph/upload", {"doc": deeper}), "a graph of another model: its logits sit at layer 7, this model's at 3"),
        "other model's tokens": (request(live.url, "/api/graph/upload", {"doc": retokened}), "a graph of another model: its token 0 is 'T', this tokenizer reads its id as 't'"),
        "not a graph": (request(live.url, "/api/graph/upload", {"doc": {"nodes": []}}), "not a circuit-tracer graph (no 'metadata')"),
        "threshold": (request(live.url, "/api/graph/trace", {"prompt": PROMPT, "node_threshold": 0}), "node_threshold: must be in (0, 1]"),
        "long prompt": (request(live.url, "/api/graph/trace", {"prompt": "x" * 80}), "longer than the model's context"),
        "target": (request(live.url, "/api/graph/trace", {"prompt": PROMPT, "target": "cat"}), "target 'cat': is 3 tokens"),
    }  # fmt: skip
    for name, ((status, body), line) in cases.items():
        msg = body["error"]["message"]
        assert status == 400 and line in msg and "\n" not in msg, (name, status, msg)
    assert request(live.url, "/api/graph/open?name=nope", method="GET")[0] == 404
    assert request(live.url, "/api/graph/feature/1/24", method="GET")[0] == 404


def test_serve_command_refuses_bad_graph_flags(served: dict[str, Any], tmp_path: Path, capsys) -> None:  # fmt: skip
    run = str(served["run"])
    other = tmp_path / "other"
    CLT(CLTConfig(d_model=24, d_sae=8, n_layers=2)).save(other)
    cases = {
        "transcoders": (["--transcoders", str(other)], "the CLT reads 2 layers of d_model=24, but this model has 2 layers of d_model=32"),
        "graph": (["--graph", str(tmp_path / "none.json")], "--graph " + str(tmp_path / "none.json") + ": no such file or folder"),
    }  # fmt: skip
    for name, (flags, line) in cases.items():
        assert main(["serve", "-c", run, "--port", "0", *flags]) == 2, name
        err = capsys.readouterr().err.strip()
        assert line in err and len(err.splitlines()) == 1, (name, err)
