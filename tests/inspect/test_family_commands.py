"""``glassgpt inspect``, ``patch`` and ``ablate`` on a tiny HF folder of each family (Llama
with GQA, Qwen3, Gemma 3, GPT-NeoX), saved by transformers with a byte-level tokenizer: each
command runs, writes its files, and its numbers are those of the API (which
tests/inspect/test_families.py holds to transformers) on the model the folder opens to; the
ablation's "after" loss is transformers' own with the head zeroed at o_proj's input.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop.hf_cases import CASES, make
from tests.test_hub import tokenizer

import glassgpt
from glassgpt.cli import main
from glassgpt.inspect import metrics, patching
from glassgpt.inspect.cache import run_with_cache, run_with_hooks
from glassgpt.interop.hf_tokenizers import save_tokenizer_json

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FAMILIES = [
    "llama-gqa2-llama3-untied",
    "qwen3-gqa2-untied",
    "gemma3-softcaps-untied-all-sliding",
    "neox-parallel-quarter-rotary",
]
V = 262  # the byte-level tokenizer's vocabulary
CLEAN, CORRUPT = "xyz xyzx", "xyz xzzx"  # (no merge applies: one byte, one token)


@pytest.fixture(params=FAMILIES, scope="module")
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    case = CASES[request.param]
    case = dataclasses.replace(case, kwargs={**case.kwargs, "vocab_size": V})
    hf = make(case)
    out = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(out)
    save_tokenizer_json(tokenizer(), out / "tokenizer.json")
    return out, hf


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_writes_a_report_of_the_family_model(folder: Any, tmp_path: Path, capsys) -> None:
    path, _ = folder
    out = tmp_path / "report.html"
    code, stdout, err = run(["inspect", "-c", str(path), "--prompt", CLEAN, "-o", str(out)], capsys)
    assert code == 0, err
    html = out.read_text(encoding="utf-8")
    assert html.count("<img ") >= 8 and "Circuits of head" in html
    assert "shown at distance 1" in html  # RoPE: the QK circuit says at which distance
    assert "wrote" in stdout


def test_patch_writes_the_apis_sweeps_of_the_family_model(
    folder: Any, tmp_path: Path, capsys
) -> None:
    path, _ = folder
    out = tmp_path / "patched"
    args = ["patch", "-c", str(path), "--clean", CLEAN, "--corrupt", CORRUPT, "--answer", "c"]
    code, _, err = run([*args, "--wrong", "a", "-o", str(out)], capsys)
    assert code == 0, err
    doc = json.loads((out / "patch.json").read_text(encoding="utf-8"))
    model, tok = glassgpt.load(path)
    clean, corrupt = torch.tensor([tok.encode(CLEAN)]), torch.tensor([tok.encode(CORRUPT)])
    raw = metrics.logit_diff(tok.encode("c")[0], tok.encode("a")[0])
    logits, cache = run_with_cache(model, clean, ["resid_pre", "attn.z"])
    metric = metrics.normalised(raw, logits, run_with_hooks(model, corrupt, {}))
    want = patching.get_act_patch_resid_pre(model, corrupt, cache, metric)
    got = torch.tensor(doc["results"]["resid"]["values"], dtype=want.dtype)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # float32, normalised by a gap
    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupt, cache, metric)
    got = torch.tensor(doc["results"]["heads"]["values"], dtype=heads.dtype)
    torch.testing.assert_close(got, heads, rtol=1e-4, atol=1e-5)  # float32, normalised by a gap
    for result in doc["results"].values():
        assert (out / result["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ablate_reports_transformers_loss_with_the_head_zeroed(
    folder: Any, tmp_path: Path, capsys
) -> None:
    path, hf = folder
    out = tmp_path / "ablate.json"
    code, _, err = run(
        ["ablate", "-c", str(path), "--prompt", CLEAN, "--heads", "1.3", "-o", str(out)], capsys
    )
    assert (code, err) == (0, "")
    doc = json.loads(out.read_text(encoding="utf-8"))
    x = torch.tensor([tokenizer().encode(CLEAN)])
    base = hf.base_model
    attn = base.layers[1].attention if hasattr(base, "embed_in") else base.layers[1].self_attn
    o_proj = attn.dense if hasattr(attn, "dense") else attn.o_proj
    d_head = hf.config.hidden_size // hf.config.num_attention_heads
    d_head = getattr(hf.config, "head_dim", None) or d_head

    def zero(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        z = args[0].clone()
        z[..., 3 * d_head : 4 * d_head] = 0
        return (z, *args[1:])

    handle = o_proj.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            after = float(hf(x, labels=x).loss)
    finally:
        handle.remove()
    with torch.no_grad():
        before = float(hf(x, labels=x).loss)
    assert abs(doc["loss"]["after"] - after) < 1e-5
    assert abs(doc["loss"]["before"] - before) < 1e-5
    assert abs(after - before) > 1e-4
