"""``sae train`` and ``sae features`` on a tiny HF folder of each family, on a residual site
and on the MLP (a transcoder), with transformers as the oracle of what the sites hold: a
residual site reads the decoder layer's output (``output_hidden_states``), a transcoder reads
the MLP's input and predicts its output, and spliced into the model it is the transformers
model with that MLP replaced. A parallel-residual block (GPT-NeoX) has no resid_mid: asked
for, one line naming the sites it has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.families import FAMILIES, family_folder, tokenizer
from tests.features.test_training import FAST

import glassgpt
from glassgpt.cli import main
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.sites import read, resolve_site, spliced

transformers = pytest.importorskip("transformers")

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "then",
    "the",
    "dog",
    "ran",
    "in",
    "an",
    "old",
    "tin",
    "and",
    "the",
    "hat",
]
LAYER = 1


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    gen = torch.Generator().manual_seed(0)
    words = [WORDS[i] for i in torch.randint(0, len(WORDS), (1500,), generator=gen).tolist()]
    (root / "text.txt").write_text(" ".join(words) + "\n")
    return {f: family_folder(root / f, f) for f in FAMILIES}


def mlp_modules(hf: Any, family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the MLP, the module whose output is glassgpt's mlp_out: Gemma's post-norm after it)."""
    layer = (hf.gpt_neox.layers if family == "neox" else hf.model.layers)[LAYER]
    return layer.mlp, (layer.post_feedforward_layernorm if family == "gemma3" else layer.mlp)


def ids() -> torch.Tensor:
    return torch.tensor([tokenizer().encode("the cat sat on the mat then the dog ran")])


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_the_sites_hold_what_transformers_computes(family, folders) -> None:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folders[family]).eval()
    model, _ = glassgpt.load(folders[family])
    x = ids()
    resid, _ = read(model, x, resolve_site(model, f"blocks.{LAYER - 1}.resid_post"))
    theirs = hf(x, output_hidden_states=True).hidden_states[LAYER]
    assert (resid - theirs).abs().max() <= 1e-4 * theirs.abs().max()
    seen: dict[str, torch.Tensor] = {}
    mlp, out = mlp_modules(hf, family)
    handles = [mlp.register_forward_pre_hook(lambda m, a: seen.update(u=a[0])),
               out.register_forward_hook(lambda m, a, o: seen.update(y=o))]  # fmt: skip
    hf(x)
    u, y = read(model, x, resolve_site(model, f"blocks.{LAYER}.mlp_out", transcoder=True))
    assert (u - seen["u"]).abs().max() <= 1e-4 * seen["u"].abs().max()
    assert (y - seen["y"]).abs().max() <= 1e-4 * seen["y"].abs().max()

    # a transcoder spliced in: the transformers model with the MLP's output replaced by its own
    d = model.config.d_model
    cfg = SAEConfig(d_in=d, d_sae=16, arch="transcoder", k=4, hook=f"blocks.{LAYER}.mlp.in",
                    out_hook=f"blocks.{LAYER}.mlp_out")  # fmt: skip
    tc = SAE(cfg, seed=0).eval()
    for h in handles:
        h.remove()
    handles = [mlp.register_forward_pre_hook(lambda m, a: seen.update(u=a[0])),
               out.register_forward_hook(lambda m, a, o: tc(seen["u"])[0])]  # fmt: skip
    expected = hf(x).logits
    for h in handles:
        h.remove()
    with spliced(model, tc):
        got = model(x)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert (got - hf(x).logits).abs().max() > 1e-3  # the splice changed the logits


def sae_train(folder: Path, out: Path, hook: str, arch: str, text: Path) -> int:
    return main(["sae", "train", "-c", str(folder), "--hook", hook, "--width", "32",
                 "--arch", arch, "-k", "4", "-o", str(out), "--tokens", "2560", "--data",
                 str(text), "--no-progress", "--set", *FAST])  # fmt: skip


@pytest.mark.parametrize(("family", "hook", "arch"), [
    ("llama", f"blocks.{LAYER}.resid_post", "topk"),
    ("qwen3", f"blocks.{LAYER}.mlp_out", "transcoder"),
    ("gemma3", f"blocks.{LAYER}.resid_mid", "topk"),
    ("neox", f"blocks.{LAYER}.mlp_out", "transcoder"),  # its MLP reads N₂(resid_pre)
])  # fmt: skip
def test_sae_train_and_feature_pages(family, hook, arch, folders, tmp_path, capsys) -> None:
    text = folders[family].parent / "text.txt"
    assert sae_train(folders[family], tmp_path / "sae", hook, arch, text) == 0
    measured = json.loads((tmp_path / "sae" / "eval.json").read_text())
    assert 0 < measured["l0"] <= 4.0 and 0 < measured["fvu"] < 2
    capsys.readouterr()
    args = ["sae", "features", "-c", str(tmp_path / "sae"), "--tokens", "300", "--seq-len", "16"]
    assert main(args) == 0
    assert "32 latents over" in capsys.readouterr().out
    assert (tmp_path / "sae" / "sae" / "features.safetensors").is_file()


def test_a_parallel_block_has_no_resid_mid(folders, tmp_path, capsys) -> None:
    capsys.readouterr()
    text = folders["neox"].parent / "text.txt"
    assert sae_train(folders["neox"], tmp_path / "s", "blocks.1.resid_mid", "topk", text) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "blocks.1.resid_mid: no such activation" in err
    assert "a block has resid_pre, " in err and "a parallel-residual block has no resid_mid" in err
    assert "resid_mid," not in err
    assert not (tmp_path / "s").exists()


@torch.no_grad()
def test_feature_pages_logit_effect_reads_gemmas_norm_gain(folders) -> None:
    """A feature's logit effect is its direction through the final norm's gain and W_U:
    d ⊙ (1 + w) · W_Uᵀ with Gemma's norm weight w and lm_head (not d ⊙ w)."""
    from glassgpt.features.pages import logit_effect

    model, _ = glassgpt.load(folders["gemma3"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(folders["gemma3"]).double().eval()
    d = model.config.d_model
    sae = SAE(SAEConfig(d_in=d, d_sae=4, arch="topk", k=2, hook=f"blocks.{LAYER}.resid_post"),
              seed=0)  # fmt: skip
    V = model.config.n_vocab
    top_ids, top_v, _, _ = logit_effect(model.double(), sae.double(), n=V)
    gain = 1.0 + hf.model.norm.weight  # Gemma's RMSNorm: x / rms(x) · (1 + w)
    for i in range(4):
        expected = (sae.W_dec[i].detach().double() * gain) @ hf.lm_head.weight.T  # [V]
        ours = torch.empty(V, dtype=torch.float64)
        ours[top_ids[i]] = top_v[i].double()
        assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-6)
