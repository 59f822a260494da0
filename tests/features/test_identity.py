"""An SAE knows the model it was trained on: ``serve --sae`` and ``sae features`` refuse another
model of the same width in one line naming both, ``sae eval --model`` measures it with a note,
and an SAE saved without that record still loads (shapes checked, with a note). Also
``sae train``'s header, its closing "wrote" line, and its closing figures, which are
``sae eval``'s on the same SAE and data."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import uvicorn
from safetensors.torch import load_file
from tests.features.conftest import write_run
from tests.features.test_training import sae_train

from glassgpt.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    """(its run, an SAE trained on it, another run of the same width and config but other
    weights, the stdout of sae train)."""
    root = tmp_path_factory.mktemp("identity")
    run = write_run(root / "run")
    other = write_run(root / "other", seed=1)
    out = io.StringIO()  # capsys is per test; this fixture is per module
    with contextlib.redirect_stdout(out):
        assert sae_train(run, root / "sae", tokens=2560) == 0
    return run, root / "sae", other, out.getvalue()


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """serve runs up to uvicorn.run, which records its call instead of serving."""
    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    monkeypatch.setattr(sys, "setswitchinterval", lambda s: None)
    return calls


def test_the_sae_records_its_models_weights(trained) -> None:
    run, sae, _, _ = trained
    doc = json.loads((sae / "sae" / "sae.json").read_text())
    digest = hashlib.sha256()  # name, dtype, shape and bytes of each stored tensor, by name
    for name, t in sorted(load_file(run / "ckpt" / "step_000001" / "model.safetensors").items()):
        digest.update(f"{name} {str(t.dtype)[6:]} {list(t.shape)}\n".encode() + t.numpy().tobytes())
    assert doc["model_identity"]["weights_sha256"] == digest.hexdigest()
    assert doc["model_identity"]["config"]["d_model"] == 16 and doc["model_identity"]["step"] == 1


def test_serve_refuses_an_sae_of_another_model_of_the_same_width(trained, no_server, capsys) -> None:  # fmt: skip
    run, sae, other, _ = trained
    assert main(["serve", "-c", str(other), "--sae", str(sae), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--sae {sae}: the SAE was trained on {run.resolve()}" in err
    assert f"not on {other.resolve()}" in err and "other weights" in err
    assert no_server == []
    assert main(["serve", "-c", str(run), "--sae", str(sae), "--port", "0"]) == 0  # its own
    assert len(no_server) == 1 and "trained on" not in capsys.readouterr().err


def test_serve_knows_the_model_in_another_format_and_dtype(trained, no_server, tmp_path: Path, capsys) -> None:  # fmt: skip
    run, sae, _, _ = trained
    assert main(["export", "-c", str(run), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    for args in (["-c", str(tmp_path / "hf")], ["-c", str(run), "--dtype", "bf16"]):
        assert main(["serve", *args, "--sae", str(sae), "--port", "0"]) == 0, args
        assert "trained on" not in capsys.readouterr().err
    assert len(no_server) == 2


def test_serve_names_the_config_that_differs(trained, no_server, tmp_path: Path, capsys) -> None:
    _, sae, _, _ = trained
    deeper = write_run(tmp_path / "deeper", n_layers=3, text_chars=400)  # the same width
    assert main(["serve", "-c", str(deeper), "--sae", str(sae), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "n_layers 2 ≠ 3" in err, err


def test_sae_features_refuses_another_model(trained, tmp_path: Path, capsys) -> None:
    run, sae, other, _ = trained
    out = tmp_path / "pages.safetensors"
    code = main(["sae", "features", "-c", str(sae), "--model", str(other), "--tokens", "256", "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(run.resolve()) in err and str(other.resolve()) in err, err  # fmt: skip
    assert not out.exists()
    moved = tmp_path / "moved"  # the same model in another folder is that model
    shutil.copytree(run, moved)
    assert main(["sae", "features", "-c", str(sae), "--model", str(moved), "--tokens", "256", "-o", str(out)]) == 0  # fmt: skip
    assert "trained on" not in capsys.readouterr().err and out.is_file()


def test_sae_eval_measures_another_model_on_purpose_with_a_note(trained, capsys) -> None:
    _, sae, other, _ = trained
    assert main(["sae", "eval", "-c", str(sae), "--model", str(other), "--json", "--tokens", "512"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "the SAE was trained on" in captured.err
    assert "measuring it on this model, as asked" in captured.err
    assert json.loads(captured.out)["tokens"] > 0
    assert main(["sae", "eval", "-c", str(sae), "--json", "--tokens", "512"]) == 0
    assert capsys.readouterr().err == ""  # its own model: no note


def test_a_run_whose_model_changed_since_is_told(trained, tmp_path: Path, capsys) -> None:
    _, _, other, _ = trained
    run = write_run(tmp_path / "run", text_chars=2000)
    assert sae_train(run, tmp_path / "sae", tokens=512) == 0
    shutil.rmtree(run / "ckpt")
    shutil.copytree(other / "ckpt", run / "ckpt")  # trained on since: other weights
    capsys.readouterr()
    assert main(["sae", "eval", "-c", str(tmp_path / "sae")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run.resolve()} holds another model now" in err, err
    assert f"sae eval --model {run.resolve()}" in err


def test_an_sae_without_an_identity_still_loads(trained, no_server, tmp_path: Path, capsys) -> None:  # fmt: skip
    run, sae, _, _ = trained
    old = tmp_path / "old"
    shutil.copytree(sae / "sae", old)
    doc = json.loads((old / "sae.json").read_text())
    del doc["model_identity"]
    (old / "sae.json").write_text(json.dumps(doc))
    assert main(["sae", "eval", "-c", str(old), "--json", "--tokens", "512"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records no model identity" in err
    assert main(["serve", "-c", str(run), "--sae", str(old), "--port", "0"]) == 0
    assert "records no model identity" in capsys.readouterr().err and len(no_server) == 1
    wide = tmp_path / "wide"  # the shapes are still checked
    write_run(wide, d_model=24, text_chars=400)
    assert main(["serve", "-c", str(wide), "--sae", str(old), "--port", "0"]) == 2
    assert "[d_in=16]" in capsys.readouterr().err


def test_sae_train_says_what_it_trains_and_what_it_wrote(trained) -> None:
    _, sae, _, stdout = trained
    lines = stdout.splitlines()
    assert lines[0].startswith("sae train: topk × 48 on blocks.1.resid_post of ")
    assert "2,560 tokens in 10 steps of 256" in lines[0] and lines[0].endswith(f"→ {sae}")
    assert lines[-1] == f"wrote {sae / 'sae'} (the SAE), {sae / 'eval.json'} and {sae / 'metrics.jsonl'}"  # fmt: skip


def test_sae_trains_closing_figures_are_sae_evals(trained, capsys) -> None:
    _, sae, _, stdout = trained
    closing = json.loads((sae / "eval.json").read_text())
    assert main(["sae", "eval", "-c", str(sae), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["tokens"] == closing["tokens"] > 1000  # the whole val split, not 512 tokens
    for key in ("dead_fraction", "dense_fraction", "l0", "fvu", "ce_sae", "ce_recovered"):
        assert shown[key] == pytest.approx(closing[key], rel=1e-6, abs=1e-12), key
    assert f"| {closing['tokens']:,} tokens" in stdout.splitlines()[-2]  # the line states it
