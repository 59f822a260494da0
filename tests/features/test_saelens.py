"""SAELens's format, checked by sae_lens itself: it loads glassgpt's exports and computes the same
codes and reconstructions; glassgpt loads what sae_lens saved (each inference architecture) and
what it trained on TransformerLens's processed GPT-2, read from glassgpt's model of that GPT-2.

sae_lens 6 needs transformer-lens < 4, and the dev install holds 4.3, so sae_lens lives in its
own venv (``.venv-saelens``, made by .ci/run; ``GLASSGPT_SAELENS_PYTHON`` names another
interpreter): all its work runs in one subprocess (tests/features/saelens_side.py) and the
tests skip, saying so, without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.saelens import from_saelens, glassgpt_hook, save_saelens, tl_hook
from glassgpt.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("saelens_side.py")
N = 64  # tokens encoded per case

# glassgpt config → what sae_lens must load it as
EXPORTS = {
    "relu": dict(arch="relu"),
    "topk": dict(arch="topk", k=5),
    "batchtopk": dict(arch="batchtopk", k=5),
    "jumprelu": dict(arch="jumprelu"),
    "tc_relu": dict(arch="transcoder", transcoder_activation="relu"),
    "tc_topk": dict(arch="transcoder", transcoder_activation="topk", k=5),
    "tc_jumprelu": dict(arch="transcoder", transcoder_activation="jumprelu"),
}
MADE = ["standard", "standard_no_b_dec", "topk", "topk_rescaled", "jumprelu", "transcoder",
        "jumprelu_transcoder"]  # fmt: skip
ACTIVATION = {"standard": "relu", "standard_no_b_dec": "relu", "topk": "topk", "topk_rescaled": "topk",
              "jumprelu": "jumprelu", "transcoder": "relu", "jumprelu_transcoder": "jumprelu"}  # fmt: skip


def _python() -> Path | None:
    env = os.environ.get("GLASSGPT_SAELENS_PYTHON")
    path = Path(env) if env else ROOT / ".venv-saelens" / "bin" / "python"
    return path if path.is_file() else None


def _model() -> GPT:
    torch.manual_seed(3)
    model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=12, n_layers=2, n_heads=2)).double().eval()  # fmt: skip
    with torch.no_grad():
        for block in model.blocks:
            block.ln2.w.uniform_(0.5, 1.5)
            block.ln2.b.normal_(0, 0.3)
    return model


def _glassgpt_sae(name: str, spec: dict, gen: torch.Generator) -> SAE:
    hook = "blocks.1.mlp.in" if spec["arch"] == "transcoder" else "blocks.1.resid_post"
    out = "blocks.1.mlp_out" if spec["arch"] == "transcoder" else None
    cfg = SAEConfig(d_in=12, d_sae=40, hook=hook, out_hook=out, dtype="float64", **spec)
    sae = SAE(cfg, seed=1)
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
        if cfg.activation == "jumprelu":
            sae.log_threshold.copy_(torch.randn(40, generator=gen, dtype=torch.float64) - 1)
        if cfg.activation == "batchtopk":
            sae.threshold.fill_(0.4)
    return sae.eval()


@pytest.fixture(scope="module")
def side(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Everything sae_lens does, in one subprocess; the glassgpt SAEs and inputs it was given."""
    python = _python()
    if python is None:
        pytest.skip("sae_lens's venv .venv-saelens is absent (made by .ci/run; sae-lens needs transformer-lens < 4)")  # fmt: skip
    work = tmp_path_factory.mktemp("saelens")
    gen = torch.Generator().manual_seed(0)
    model = _model()
    ours = {}
    for name, spec in EXPORTS.items():
        sae = _glassgpt_sae(name, spec, gen)
        r = torch.randn(N, 12, generator=gen, dtype=torch.float64) * 2  # resid_mid / resid_post
        x = model.blocks[1].ln2(r) if sae.cfg.arch == "transcoder" else r
        # TransformerLens's ln2.hook_normalized is the norm before its weight and bias
        x_tl = F.layer_norm(r, (12,), eps=model.config.norm_eps) if sae.cfg.arch == "transcoder" else r  # fmt: skip
        save_saelens(sae, work / name, model=model, model_name="tiny")
        save_file({"x": x_tl.contiguous()}, str(work / name / "x.safetensors"))
        ours[name] = (sae, x)
    made_x = {}
    for name in MADE:
        (work / f"made_{name}").mkdir()
        made_x[name] = torch.randn(N, 12, generator=gen, dtype=torch.float64)
        save_file({"x": made_x[name]}, str(work / f"made_{name}" / "x.safetensors"))
    tokens = torch.randint(0, 50, (3, 16), generator=gen)
    save_file({"tokens": tokens}, str(work / "tl_tokens.safetensors"))
    job = {"load": list(EXPORTS), "make": [[f"made_{n}", n] for n in MADE], "tl": True}
    (work / "job.json").write_text(json.dumps(job))
    run = subprocess.run([str(python), str(SIDE), str(work)], capture_output=True, text=True, timeout=600)  # fmt: skip
    if run.returncode != 0:
        if "No module named 'sae_lens'" in run.stderr:
            pytest.skip(f"{python} has no sae_lens")
        raise AssertionError(f"the sae_lens side failed:\n{run.stderr[-3000:]}")
    return {"work": work, "ours": ours, "made_x": made_x, "model": model, "tokens": tokens}


@pytest.mark.parametrize("name", list(EXPORTS))
def test_sae_lens_loads_glassgpt_exports(side: dict, name: str) -> None:
    sae, x = side["ours"][name]
    got = load_file(str(side["work"] / name / "out.safetensors"))
    with torch.no_grad():
        f = sae.encode(x)
        x_hat = sae.decode(f)
    assert int((f != 0).sum()) > 0 and int((f == 0).sum()) > 0  # sparse, not empty
    torch.testing.assert_close(got["f"], f, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got["x_hat"], x_hat, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(EXPORTS))
def test_round_trip_restores_the_config(side: dict, name: str) -> None:
    sae, _ = side["ours"][name]
    back = from_saelens(side["work"] / name, model=side["model"])
    assert back.cfg == sae.cfg
    for key, value in sae.state().items():
        torch.testing.assert_close(back.state()[key], value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", MADE)
def test_glassgpt_loads_sae_lens_saves(side: dict, name: str) -> None:
    folder = side["work"] / f"made_{name}"
    sae = from_saelens(folder)  # made without a model or hook: nothing to fold
    got = load_file(str(folder / "out.safetensors"))
    x = side["made_x"][name]
    with torch.no_grad():
        f = sae.encode(x)
        x_hat = sae.decode(f)
    assert sae.cfg.activation == ACTIVATION[name]
    assert (sae.cfg.arch == "transcoder") == ("transcoder" in name)
    assert int((got["f"] != 0).sum()) > 0
    torch.testing.assert_close(f, got["f"], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(x_hat, got["x_hat"], rtol=1e-9, atol=1e-9)


def test_processed_gpt2_activations(side: dict) -> None:
    """SAEs trained on TransformerLens's processed GPT-2 (centred writing weights, folded value
    biases, ln2.hook_normalized), loaded for glassgpt's model of the same HF GPT-2, give the same
    codes from glassgpt's own activations."""
    from glassgpt.features.sites import read, resolve_site
    from glassgpt.interop import from_hf

    work, tokens = side["work"], side["tokens"]
    acts = load_file(str(work / "tl_acts.safetensors"))
    assert float(acts["logit_gap"]) < 1e-3  # the processed model is the same function
    model = from_hf(work / "hf").double()
    resid = read(model, tokens, resolve_site(model, "blocks.1.resid_pre"))[0]
    # the processed residual stream is ours with its mean over d_model removed
    tl_resid = acts["blocks.1.hook_resid_pre"]
    torch.testing.assert_close(tl_resid, resid - resid.mean(-1, keepdim=True), rtol=1e-4, atol=1e-4)  # fmt: skip
    assert float((resid.mean(-1)).abs().max()) > 1e-2  # so the fold is doing something
    z = read(model, tokens, resolve_site(model, "blocks.0.attn.z"))[0]
    u, y = read(model, tokens, resolve_site(model, "blocks.1.mlp_out", transcoder=True))
    for name, x in (("tl_resid", resid), ("tl_z", z), ("tl_transcoder", u)):
        sae = from_saelens(work / name, model=model)
        got = load_file(str(work / name / "out.safetensors"))
        with torch.no_grad():
            f = sae.encode(x)
        torch.testing.assert_close(f, got["f"].reshape(f.shape), rtol=1e-4, atol=1e-4)
        if name != "tl_resid":  # the centred reconstruction differs from ours by c·1 per token
            continue
        x_hat = sae.decode(f)
        diff = x_hat - got["x_hat"].reshape(x_hat.shape)
        torch.testing.assert_close(diff, torch.zeros_like(diff), rtol=0, atol=1e-4)
    # and the transcoder's output lives in mlp_out's processed (centred) space
    assert sae.cfg.hook == "blocks.1.mlp.in" and sae.cfg.out_hook == "blocks.1.mlp_out"
    torch.testing.assert_close(acts["blocks.1.hook_mlp_out"], y - y.mean(-1, keepdim=True), rtol=1e-4, atol=1e-4)  # fmt: skip


def test_processed_needs_the_model_for_hook_z(side: dict) -> None:
    with pytest.raises(GlassError, match="b_V"):
        from_saelens(side["work"] / "tl_z")
    with pytest.raises(GlassError, match="--model"):
        from_saelens(side["work"] / "tl_transcoder")
    raw = from_saelens(side["work"] / "tl_resid", processed=False)  # as written: no fold
    folded = from_saelens(side["work"] / "tl_resid")
    assert not torch.allclose(raw.W_enc, folded.W_enc)


# -- without sae_lens -------------------------------------------------------------------------


def test_hook_names_round_trip() -> None:
    model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=2, n_heads=2))
    skip = ("scale", "pattern", "attn_scores", "pre_gate", "ln_final.out")
    for name in model.hook_names():
        if any(s in name for s in skip):
            continue
        assert glassgpt_hook(tl_hook(name)) == name, name
    assert tl_hook("blocks.1.resid_post") == "blocks.1.hook_resid_post"


def test_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="not an SAELens SAE folder"):
        from_saelens(tmp_path)
    sae = SAE(SAEConfig(d_in=4, d_sae=8, arch="relu", hook="blocks.0.resid_post"))
    save_saelens(sae, tmp_path / "a")
    doc = json.loads((tmp_path / "a" / "cfg.json").read_text())
    (tmp_path / "a" / "cfg.json").write_text(json.dumps({**doc, "architecture": "gated"}))
    with pytest.raises(InputFileError, match="'gated' has no glassgpt counterpart"):
        from_saelens(tmp_path / "a")
    (tmp_path / "a" / "cfg.json").write_text(json.dumps({**doc, "d_sae": 9}))
    with pytest.raises(InputFileError, match=r"W_enc is \(4, 8\), cfg.json says \(4, 9\)"):
        from_saelens(tmp_path / "a")
    (tmp_path / "a" / "cfg.json").write_text(json.dumps({**doc, "normalize_activations": "layer_norm"}))  # fmt: skip
    with pytest.raises(InputFileError, match="normalize_activations='layer_norm'"):
        from_saelens(tmp_path / "a")
    tc = SAE(SAEConfig(d_in=4, d_sae=8, arch="transcoder", hook="blocks.0.mlp.in", out_hook="blocks.0.mlp_out", k=2))  # fmt: skip
    with pytest.raises(GlassError, match="needs its model"):
        save_saelens(tc, tmp_path / "b")


def test_model_shape_is_checked(tmp_path: Path) -> None:
    sae = SAE(SAEConfig(d_in=12, d_sae=8, arch="relu", hook="blocks.1.resid_post"))
    save_saelens(sae, tmp_path / "a")
    small = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=2, n_heads=2))
    with pytest.raises(GlassError, match=r"d_in=12.*\[8\]"):
        from_saelens(tmp_path / "a", model=small)


def test_cli_export_then_import(tiny_run: Path, tmp_path: Path, capsys) -> None:
    """``sae export --format saelens`` then ``sae import`` gives the SAE back (a transcoder:
    through TransformerLens's ln2.hook_normalized and the run's own norm weights)."""
    from glassgpt.cli import main

    gen = torch.Generator().manual_seed(5)
    for cfg in (
        SAEConfig(d_in=16, d_sae=24, arch="batchtopk", k=3, hook="blocks.1.resid_post"),
        SAEConfig(d_in=16, d_sae=24, arch="transcoder", transcoder_activation="jumprelu",
                  hook="blocks.0.mlp.in", out_hook="blocks.0.mlp_out"),
    ):  # fmt: skip
        sae = SAE(cfg, seed=0)
        with torch.no_grad():
            for p in sae.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
        name = cfg.arch
        sae.save(tmp_path / name, extra={"model": str(tiny_run)})
        out, back = tmp_path / f"{name}_saelens", tmp_path / f"{name}_back"
        assert main(["sae", "export", "-c", str(tmp_path / name), "--format", "saelens", "-o", str(out)]) == 0  # fmt: skip
        doc = json.loads((out / "cfg.json").read_text())
        assert doc["metadata"]["model_from_pretrained_kwargs"]["center_writing_weights"] is False
        assert main(["sae", "import", str(out), "-o", str(back), "--model", str(tiny_run)]) == 0
        again = SAE.load(back)
        assert again.cfg == sae.cfg
        for key, value in sae.state().items():
            torch.testing.assert_close(again.state()[key], value, rtol=1e-5, atol=1e-6)
    capsys.readouterr()
    assert main(["sae", "import", str(out), "-o", str(back)]) == 2  # not empty
    err = capsys.readouterr().err
    assert "not empty; pass --overwrite" in err and err.count("\n") == 1
    assert main(["sae", "import", str(tmp_path), "-o", str(tmp_path / "z")]) == 2
    assert "not an SAELens SAE folder" in capsys.readouterr().err
