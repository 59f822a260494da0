"""``glassgpt sae train --arch clt`` on a tiny run: it learns (per layer), its batches are the
per-layer transcoder's reads stacked, its splice is the zero ablation when it writes nothing,
it resumes bit-exactly, its folder drives ``glassgpt graph``, and its bad input is one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.features.test_graph_cli import circuit_tracer_python
from tests.features.test_training import FAST, cut_and_resume, same_logs

from glassgpt.checkpoint import load
from glassgpt.cli import main
from glassgpt.data import BatchSampler, DataDir
from glassgpt.features.buffer import ActivationBuffer
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.clt_train import evaluate_clt, read_layers
from glassgpt.features.pages import load_pages
from glassgpt.features.replacement import open_transcoders
from glassgpt.features.sites import read, resolve_site

SIDE = Path(__file__).with_name("circuit_tracer_clt_side.py")


def clt_train(run: Path, out: Path, *extra: str, tokens: int = 7680, k: int | None = 4) -> int:
    args = ["sae", "train", "-c", str(run), "--arch", "clt", "--width", "32", "-o", str(out),
            "--tokens", str(tokens), "--no-progress", "--set", *FAST, *extra]  # fmt: skip
    if k is not None:
        args[6:6] = ["-k", str(k)]
    return main(args)


def records(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A topk CLT of the tiny run, trained for 30 steps."""
    out = tmp_path_factory.mktemp("clt") / "c"
    assert clt_train(tiny_run, out) == 0
    return out


def test_a_short_training_lowers_the_loss_on_every_layer(trained: Path, capsys) -> None:
    logs = records(trained)
    first, last = logs[0], [r for r in logs if "loss" in r][-1]
    assert last["loss"] < 0.8 * first["loss"], (first, last)
    assert all(b < a for a, b in zip(first["fvu_layers"], last["fvu_layers"]))
    assert first["l0_layers"] == [4.0, 4.0] and first["l0"] == 8.0  # k per (token, layer)
    final = logs[-1]  # the closing measurement, on validation windows
    assert len(final["fvu_layers"]) == 2 and max(final["fvu_layers"]) < 0.9
    assert final["l0_layers"] == [4.0, 4.0] and 0 <= final["dead_fraction"] < 1
    clt = CLT.load(trained)  # the training folder's clt/
    assert (clt.cfg.arch, clt.cfg.k, clt.cfg.d_sae, clt.cfg.n_layers) == ("topk", 4, 32, 2)
    assert json.loads((trained / "clt" / "clt.json").read_text())["tokens"] == 7680


@pytest.fixture(scope="module")
def jumprelu(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JumpReLU CLT of the tiny run (the tanh penalty), trained for 20 steps."""
    out = tmp_path_factory.mktemp("clt") / "j"
    assert clt_train(tiny_run, out, "sae.sparsity_coeff=0.01", tokens=5120, k=None) == 0
    return out


def test_jumprelu_learns_with_the_tanh_penalty(jumprelu: Path) -> None:
    trained = [r for r in records(jumprelu) if "loss" in r]
    assert trained[-1]["loss"] < 0.8 * trained[0]["loss"]
    assert trained[-1]["sparsity"] > 0 and trained[-1]["l0"] < 64
    assert CLT.load(jumprelu).cfg.arch == "jumprelu"


def test_the_batches_are_the_transcoder_reads_of_every_layer(tiny_run: Path) -> None:
    model, _ = load(tiny_run)
    tokens = BatchSampler(DataDir.open(tiny_run / "data").stream("train"), batch_size=4,
                          seq_len=16, seed=0).next_batch()[0]  # fmt: skip
    u, y = read_layers(model, tokens)
    assert u.shape == y.shape == (4, 16, 2, 16)
    for layer in (0, 1):  # the per-layer transcoder's reading is the oracle
        x1, y1 = read(model, tokens, resolve_site(model, f"blocks.{layer}.mlp_out", transcoder=True))  # fmt: skip
        assert y1 is not None
        assert torch.equal(u[:, :, layer], x1) and torch.equal(y[:, :, layer], y1)
    data = DataDir.open(tiny_run / "data")
    buf = ActivationBuffer(model, read_layers, data.stream("train"), batch_tokens=64,
                           buffer_tokens=256, seq_len=16, model_batch=8, seed=0)  # fmt: skip
    x, t = buf.next_batch()
    assert x.shape == (64, 2, 16) and t is not None and t.shape == (64, 2, 16)


def test_a_clt_that_writes_nothing_splices_in_the_zero_ablation(tiny_run: Path) -> None:
    model, _ = load(tiny_run)
    clt = CLT(CLTConfig(d_model=16, d_sae=8, n_layers=2, arch="topk", k=2), seed=0)
    with torch.no_grad():
        for W in clt.W_dec:
            W.zero_()
    stream = DataDir.open(tiny_run / "data").stream("val")
    batches = [(x, y) for x, y in [BatchSampler(stream, batch_size=4, seq_len=16, seed=1).next_batch()]]  # fmt: skip
    out = evaluate_clt(model, clt, batches)
    assert out["ce_sae"] == pytest.approx(out["ce_zero"], abs=1e-6)
    assert out["ce_clean"] != pytest.approx(out["ce_zero"], abs=1e-6)
    assert min(out["fvu_layers"]) >= 1 and out["tokens"] == 64  # ŷ = b_dec = 0


def test_the_folder_drives_glassgpt_graph(tiny_run: Path, trained: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    transcoders = open_transcoders(trained)
    assert transcoders.clt is not None and transcoders.name == "clt"
    capsys.readouterr()
    args = ["graph", "-c", str(tiny_run), "--transcoders", str(trained), "--prompt",
            "the cat sat on", "-o", str(tmp_path / "g"), "--json"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["feature_nodes"] > 0 and 0 < summary["replacement_score"] <= 1


def test_resume_after_an_interrupt_is_bit_exact(
    tiny_run: Path, trained: Path, tmp_path: Path, monkeypatch
) -> None:
    # stopped mid-round by a signal (a kill, resumed from the last periodic checkpoint, runs
    # the same trainer code: test_training checks it)
    cut_and_resume(lambda out: clt_train(tiny_run, out), tmp_path / "cut", monkeypatch, "signal")
    a = (trained / "clt" / "clt.safetensors").read_bytes()
    assert a == (tmp_path / "cut" / "clt" / "clt.safetensors").read_bytes()
    assert same_logs(trained, tmp_path / "cut")


def test_bad_input_is_one_line(tiny_run: Path, tmp_path: Path, capsys) -> None:
    cases = [
        (["--arch", "clt", "--hook", "blocks.0.mlp_out", "--width", "8"], "--hook: --arch clt reads every layer's"),
        (["--arch", "clt", "--width", "0"], "--width: must be in [1, "),
        (["--arch", "clt", "--width", "8", "-k", "9"], "-k: must be in [1, --width=8], got 9"),
        (["--arch", "clt", "--width", "8", "--clt-arch", "topk"], "-k: --arch clt --clt-arch topk needs -k"),
        (["--arch", "clt", "--width", "8", "--clt-arch", "jumprelu", "-k", "2"], "-k: keeps the k largest"),
        (["--arch", "topk", "--hook", "blocks.0.resid_post", "--width", "8", "-k", "2", "--clt-arch", "topk"], "--clt-arch: chooses a CLT's activation; it needs --arch clt"),
        (["--arch", "clt", "--width", "8", "--set", "sae.tanh_c=-1"], "sae.tanh_c: must be ≥ 0"),
    ]  # fmt: skip
    for args, message in cases:
        code = main(["sae", "train", "-c", str(tiny_run), "-o", str(tmp_path / "x"), *args])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_pages_of_every_layer_with_their_decoder_norms(tiny_run: Path, trained: Path, capsys) -> None:  # fmt: skip
    assert main(["sae", "features", "-c", str(trained), "--tokens", "2048", "--seq-len", "32"]) == 0  # fmt: skip
    assert "2 layers × 32 features over 2,048 tokens" in capsys.readouterr().out
    pages = load_pages(trained)  # the training folder's clt/features.safetensors
    clt = CLT.load(trained)
    assert pages.d_sae == 64 and pages.decoder_norms is not None
    model, _ = load(tiny_run)
    stream = DataDir.open(tiny_run / "data").stream("train")
    windows = torch.stack([torch.from_numpy(stream.read(32 * i, 32).astype("int64")) for i in range(64)])  # fmt: skip
    for layer in (0, 1):  # oracle: the per-layer transcoder's read and CLT.encode of one layer
        x, _ = read(model, windows, resolve_site(model, f"blocks.{layer}.mlp_out", transcoder=True))
        a = clt.encode(x, layer).reshape(-1, 32)
        top = pages.top_values[layer * 32 : (layer + 1) * 32, 0]
        assert torch.allclose(top, a.max(0).values.clamp_min(0), atol=1e-5)
        assert torch.equal(pages.count[layer * 32 : (layer + 1) * 32], (a > 0).sum(0))
    i = 32 + 5  # layer 1's feature 5 writes to layer 1 only; layer 0's to both
    page = pages.page(i, [str(t) for t in range(100)])
    assert (page["layer"], page["index"]) == (1, 5)
    assert [d["layer"] for d in page["decoder_norms"]] == [1]
    assert page["decoder_norms"][0]["norm"] == pytest.approx(float(clt.W_dec[1][0][5].detach().norm()), rel=1e-5)  # fmt: skip
    first = pages.page(3, [str(t) for t in range(100)])
    assert [d["layer"] for d in first["decoder_norms"]] == [0, 1]
    assert first["decoder_norms"][1]["norm"] == pytest.approx(float(clt.W_dec[0][1][3].detach().norm()), rel=1e-5)  # fmt: skip


def test_circuit_tracer_loads_the_export_and_encodes_alike(tiny_run: Path, jumprelu: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    assert main(["sae", "export", "-c", str(jumprelu), "--format", "circuit-tracer",
                 "-o", str(tmp_path / "clt")]) == 0  # fmt: skip
    python = circuit_tracer_python()
    if python is None:
        pytest.skip("circuit-tracer is not installed (.venv-circuit-tracer, made by .ci/run, or GLASSGPT_CIRCUIT_TRACER_PYTHON)")  # fmt: skip
    model, _ = load(tiny_run)
    stream = DataDir.open(tiny_run / "data").stream("val")
    u, _ = read_layers(model, torch.from_numpy(stream.read(0, 64).astype("int64")).reshape(2, 32))
    u = u.flatten(0, 1)  # [N, L, d]
    save_file({"u": u.transpose(0, 1).contiguous()}, tmp_path / "u.safetensors")
    done = subprocess.run([python, str(SIDE), str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = load_file(tmp_path / "out.safetensors")
    clt = CLT.load(jumprelu)
    y_hat, acts = clt(u)
    assert (acts != 0).any() and (acts == 0).any()
    assert torch.allclose(theirs["acts"], acts.transpose(0, 1), atol=1e-5)
    assert torch.allclose(theirs["recon"], y_hat.transpose(0, 1), atol=1e-4)


def test_export_refuses_what_circuit_tracer_cannot_read(trained: Path, tiny_run: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    cases = [
        (["-c", str(trained), "--format", "circuit-tracer"], "a topk CLT; circuit-tracer's CLTs are JumpReLU"),
        (["-c", str(trained), "--format", "saelens"], "a CLT; export it with --format circuit-tracer"),
    ]  # fmt: skip
    for args, message in cases:
        assert main(["sae", "export", *args, "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
