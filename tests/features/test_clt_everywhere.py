"""A CLT folder wherever an SAE folder goes: ``sae eval`` (per-layer FVU and L0 against the
same sums by hand, CE of the clean model against its own loss), ``sae label`` (keys "l/i",
against glassgpt's own serve), the Graph tab's node page (decoder norms against W_dec, the
pages' contexts), and the explorer's Features tab (pages by "l/i", search, activations,
steering by clamping against glassgpt.features.clt_steering and by adding against a hook by
hand); both tabs in Chromium: tests/serve/test_clt_browser.py. One tiny topk CLT, trained here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from tests.features import test_label
from tests.features.test_clt_train import clt_train

from glassgpt.checkpoint import load, open_run
from glassgpt.cli import main
from glassgpt.data import DataDir, iter_eval_batches
from glassgpt.features.clt import CLT
from glassgpt.features.clt_steering import Edit, intervene
from glassgpt.features.clt_train import read_layers
from glassgpt.features.identity import check_identity
from glassgpt.features.label_contexts import quiet_contexts
from glassgpt.features.labels import read_labels, write_labels
from glassgpt.features.metrics import EVAL_BATCH
from glassgpt.features.pages import load_pages
from glassgpt.features.replacement import open_transcoders
from glassgpt.serve.app import create_app
from glassgpt.serve.features import folder_extra, load_sae
from glassgpt.tokenizer.display import token_texts
from glassgpt.train.evaluate import ArrayStream

S = 32  # features per layer (clt_train's --width)
llm = test_label.llm  # the fixture: glassgpt serve as the LLM


@pytest.fixture(scope="module")
def clt_dir(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A topk CLT (k=4, 2 layers × 32) of the tiny run, trained for 10 steps, with its pages."""
    out = tmp_path_factory.mktemp("cltall") / "c"
    assert clt_train(tiny_run, out, tokens=2560) == 0
    assert main(["sae", "features", "-c", str(out), "--tokens", "2000", "--seq-len", "32",
                 "--top", "8", "--context", "4", "2"]) == 0  # fmt: skip
    return out


def copy(clt_dir: Path, tmp_path: Path) -> Path:
    """The CLT's folder (clt/) copied, so that labels written by one test stay there."""
    return Path(shutil.copytree(clt_dir / "clt", tmp_path / "clt"))


def test_sae_eval_measures_a_clt_per_layer(tiny_run: Path, clt_dir: Path, capsys: Any) -> None:
    assert main(["sae", "eval", "-c", str(clt_dir), "--tokens", "512", "--seq-len", "32", "--json"]) == 0  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert r["arch"] == "clt-topk" and "val split" in r["source"] and r["tokens"] == 2 * EVAL_BATCH * 32  # fmt: skip
    # the oracle: the same windows, every layer's MLP output against the CLT's, summed by hand
    model, _ = load(tiny_run)
    clt = CLT.load(clt_dir).eval()
    stream = DataDir.open(tiny_run / "data").stream("val")
    err, var, fires, loss, n = torch.zeros(2), torch.zeros(2), torch.zeros(2), 0.0, 0
    ys = []
    with torch.no_grad():
        for x, y in iter_eval_batches(stream, batch_size=EVAL_BATCH, seq_len=32, max_batches=2):
            u, target = read_layers(model, x)
            y_hat, acts = clt(u.flatten(0, 1))
            target = target.flatten(0, 1)
            err += (target - y_hat).pow(2).sum((0, 2))
            ys.append(target)
            fires += (acts != 0).sum((0, 2))
            loss += float(model(x, targets=y)[1]) * x.numel()
            n += x.numel()
    allY = torch.cat(ys)
    var = (allY - allY.mean(0)).pow(2).sum((0, 2))
    assert r["fvu_layers"] == pytest.approx((err / var).tolist(), rel=1e-4)
    assert r["l0_layers"] == pytest.approx((fires / n).tolist()) and r["l0"] == pytest.approx(float(fires.sum()) / n)  # fmt: skip
    assert r["ce_clean"] == pytest.approx(loss / n, rel=1e-5)
    assert r["ce_zero"] > r["ce_clean"] and r["ce_recovered"] <= 1.0
    # the text: the SAE's summary line, then each layer's
    assert main(["sae", "eval", "-c", str(clt_dir / "clt"), "--tokens", "512", "--seq-len", "32"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("L0 ") and "CE loss recovered" in lines[0]
    assert lines[1].startswith("per layer: 0: FVU ") and "| 1: FVU " in lines[1]


def test_sae_label_labels_a_clt_by_layer(
    clt_dir: Path,
    llm: str,
    tmp_path: Path,
    capsys: Any,
) -> None:
    folder = copy(clt_dir, tmp_path)
    pages = load_pages(folder)
    args = ["sae", "label", str(tmp_path), "--endpoint", llm, "--contexts", "3", "--holdout", "2"]
    assert main([*args, "--features", "1/0-5"]) == 0
    got = read_labels(folder)
    live = [i for i in range(6) if int(pages.count[S + i]) > 0]
    assert sorted(got) == sorted(f"1/{i}" for i in live) and live
    for e in got.values():
        assert isinstance(e["label"], str) and 0.0 <= e["detection"] <= 1.0
        assert e["activating"] == 2 and e["silent"] <= 2
    out = capsys.readouterr().out
    assert out.startswith(f"{len(live)} features labelled")
    # a bare id after LAYER/ is of that layer; labelled ones skipped
    assert main([*args, "--features", "0/3,4,1/0-5"]) == 0
    out = capsys.readouterr().out
    new = [i for i in (3, 4) if int(pages.count[i]) > 0]
    assert out.startswith(f"{len(new)} features labelled") and f"skipped: {len(live)} labelled before" in out  # fmt: skip
    assert sorted(read_labels(folder)) == sorted([f"0/{i}" for i in new] + [f"1/{i}" for i in live])  # fmt: skip
    # the page shows its label by "l/i"
    page = load_pages(folder).page(S + live[0], [""] * 100)
    assert page["label"]["label"] == got[f"1/{live[0]}"]["label"]


def test_a_clt_features_silent_contexts_are_silent(tiny_run: Path, clt_dir: Path) -> None:
    """One window of 32 tokens is the whole corpus, so every draw is it: each silent context
    must be a span of it where the CLT's code (by hand, at the feature's layer) is 0."""
    model, _ = load(tiny_run)
    clt = CLT.load(clt_dir).eval()
    window = DataDir.open(tiny_run / "data").stream("train").read(0, 32).astype("int64")
    with torch.no_grad():
        f = clt.encode(read_layers(model, torch.from_numpy(window)[None])[0])[0]  # [T, L, S]
    feats = [3, 17, S + 3, S + 20]
    quiet = quiet_contexts(model, clt, ArrayStream(window), feats, n=3, width=(4, 2), seq_len=32, tokens=32)  # fmt: skip
    found, tested = 0, 0
    for j in feats:
        layer, i = divmod(j, S)
        silent = [a for a in range(32 - 6) if torch.all(f[a : a + 7, layer, i] == 0)]
        spans = {tuple(window[a : a + 7].tolist()) for a in silent}
        assert all(tuple(c) in spans for c in quiet[j]), j
        assert len(quiet[j]) == min(3, len(silent))
        found += len(quiet[j])
        tested += bool(quiet[j]) and len(silent) < 32 - 6  # active somewhere in the window
    assert found > 0 and tested > 0


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("0-5", "--features 0-5: 0-5 names no layer of this CLT (LAYER/ids, layers 0-1)"),
        ("1/x", "--features 1/x: not LAYER/ids or ranges"),
        ("2/0", "--features 2/0: 2/0 names no layer of this CLT (LAYER/ids, layers 0-1)"),
        ("1/30-32", "1/30-32 is out of range (this dictionary has features 0-31 per layer)"),
    ],
)
def test_a_bad_clt_feature_spec_is_one_line(clt_dir: Path, spec: str, says: str, capsys: Any) -> None:  # fmt: skip
    assert main(["sae", "label", str(clt_dir), "--endpoint", "http://127.0.0.1:9/v1", "--features", spec]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_the_graph_tabs_page_of_a_clt_feature(tiny_run: Path, clt_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    folder = copy(clt_dir, tmp_path)
    write_labels(folder, {"1/3": {"label": "layer one, three", "detection": 0.8}}, model="m")
    model, tok = load(tiny_run)
    clt = CLT.load(folder)
    pages, texts = load_pages(folder), token_texts(tok, range(model.config.n_vocab))
    with TestClient(create_app(model, tok, transcoders=open_transcoders(folder))) as client:
        assert client.get("/api/graph/info").json()["pages"] == [0, 1]
        for layer, i in ((0, 5), (1, 3)):
            f = client.get(f"/api/graph/feature/{layer}/{i}").json()
            norms = [float(clt.W_dec[layer][t - layer][i].detach().norm()) for t in range(layer, 2)]
            assert [r["layer"] for r in f["page"]["decoder_norms"]] == list(range(layer, 2))
            assert [r["norm"] for r in f["page"]["decoder_norms"]] == pytest.approx(norms, rel=1e-5)  # fmt: skip
            assert f["page"]["contexts"] == pages.page(layer * S + i, texts)["contexts"]
            assert (f["page"]["layer"], f["page"]["index"]) == (layer, i)
        assert f["label"] == "layer one, three" and f["detection"] == 0.8
        assert client.get("/api/graph/feature/0/5").json()["label"] is None
        bad = client.get(f"/api/graph/feature/1/{S}")
        assert bad.status_code == 404 and "out of range (layer 1 has 32)" in bad.json()["error"]["message"]  # fmt: skip


def test_the_explorer_serves_a_clt(tiny_run: Path, clt_dir: Path, tmp_path: Path) -> None:
    folder = copy(clt_dir, tmp_path)
    write_labels(folder, {"1/3": {"label": "Layer One Three", "detection": 0.7}}, model="m")
    check_identity(str(folder), folder_extra(str(folder)), open_run(tiny_run), what="--sae")
    model, tok = load(tiny_run)
    clt, pages = load_sae(str(folder), model)
    assert isinstance(clt, CLT)
    with TestClient(create_app(model, tok, sae=clt, pages=pages)) as client:
        info = client.get("/api/features/info").json()
        assert info["clt"] == {"n_layers": 2, "d_sae": S} and info["d_sae"] == 2 * S and info["pages"]  # fmt: skip
        page = client.get(f"/api/features/page/{S + 3}").json()
        assert (page["layer"], page["index"], page["label"]["label"]) == (1, 3, "Layer One Three")
        assert len(page["decoder_norms"]) == 1
        find = lambda q: client.post("/api/features/search", json={"query": q}).json()["results"]  # noqa: E731
        assert [(r["id"], r["name"], r["why"]) for r in find("#1/3")] == [(S + 3, "1/3", "id")]
        assert find("0/31")[0]["id"] == 31 and find("2/0") == find("0/32") == []
        assert find("one three")[0] == {**find("one three")[0], "id": S + 3, "why": "label"}
        # a prompt's codes: every layer's, numbered as the pages number them
        prompt = "To be, or not"
        got = client.post("/api/features/tokens", json={"prompt": prompt, "feature": S + 3}).json()
        ids = [t["id"] for t in got["tokens"]]
        with torch.no_grad():
            want = clt.encode(read_layers(model, torch.tensor([ids]))[0])[0]  # [T, L, S]
        assert got["feature"]["acts"] == pytest.approx(want[:, 1, 3].tolist(), abs=1e-4)
        top = got["top"][-1]
        assert all(want.flatten(-2)[-1, j] == pytest.approx(v, abs=1e-4) for j, v in top)
        # steering: a clamp of feature 1/3 at every position, against clt_steering by hand
        ask = {"prompt": prompt, "feature": S + 3, "mode": "clamp", "value": 3.0, "max_tokens": 0}
        d = client.post("/api/features/steer", json=ask).json()
        clean, edited = intervene(model, clt, torch.tensor(ids), [Edit(1, 3, value=3.0)])
        p = torch.softmax(edited[-1].double(), -1)
        assert d["name"] == "1/3" and d["rows"][0]["id"] == int(p.argmax())
        assert d["rows"][0]["p"] == pytest.approx(float(p.max()), abs=1e-5)
        p0 = torch.softmax(clean[-1].double(), -1)
        assert d["rows"][0]["clean"] == pytest.approx(float(p0[int(p.argmax())]), abs=1e-5)
        # adding α to feature 0/5 at every position writes α · W_dec[0 → t] into both MLP
        # outputs: a plain hook by hand, the same forward pass
        alpha = 2.5
        d = client.post("/api/features/steer", json={**ask, "feature": 5, "mode": "add", "value": alpha}).json()  # fmt: skip
        push = {f"blocks.{t}.mlp_out": (lambda x, _n, t=t: x + alpha * clt.decoder(0, t)[5].to(x.dtype)) for t in (0, 1)}  # fmt: skip
        with torch.no_grad(), model.hooks(push):
            p = torch.softmax(model(torch.tensor([ids]))[0, -1].double(), -1)
        assert d["name"] == "0/5" and d["mode"] == "add" and d["rows"][0]["id"] == int(p.argmax())
        assert [r["p"] for r in d["rows"]] == pytest.approx([float(p[r["id"]]) for r in d["rows"]], abs=1e-5)  # fmt: skip
        assert d["kl"] > 0
