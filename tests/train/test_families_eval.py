"""``glassgpt eval`` on a tiny HF folder of each family: the loss on a text file is
transformers' mean cross-entropy over the same disjoint windows, and ``eval --tasks`` (the
lm-eval adapter) gives the log-likelihoods and accuracy of lm-eval's own ``hf`` backend on
the same folder (one family, when lm-eval is installed)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tests.families import FAMILIES, family_folder, tokenizer

from glassgpt.cli import main

transformers = pytest.importorskip("transformers")

WORDS = ["the", "cat", "then", "an", "old", "tin", "hat", "in", "than", "thin", "sat", "on"]


def text(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_eval_loss_is_transformers_cross_entropy(family, tmp_path: Path, capsys) -> None:
    folder = family_folder(tmp_path / family, family, n_ctx=32)
    body = text(300) + "\n"
    (tmp_path / "t.txt").write_text(body)
    capsys.readouterr()
    assert main(["eval", "-c", str(folder), "--data", str(tmp_path / "t.txt"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor(tokenizer().encode(body))
    T = 32
    n = (len(ids) - 1) // T  # the disjoint full windows (a shorter tail is left out)
    x = torch.stack([ids[i * T : i * T + T] for i in range(n)])
    y = torch.stack([ids[i * T + 1 : i * T + T + 1] for i in range(n)])
    logits = hf(x).logits
    mean = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
    assert got["tokens"] == len(ids) and n >= 4
    assert math.isclose(got["loss"], mean, rel_tol=1e-5)
    assert math.isclose(got["perplexity"], math.exp(mean), rel_tol=1e-5)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)


def test_eval_tasks_equals_lm_evals_hf_backend(tmp_path: Path, offline, capsys) -> None:
    pytest.importorskip("lm_eval")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    folder = family_folder(tmp_path / "qwen3", "qwen3", n_ctx=32)
    rng = random.Random(1)
    docs = [{"context": text(rng.randint(1, 12), seed=i),
             "choices": [text(rng.randint(1, 4), seed=100 * i + j) for j in range(3)],
             "label": rng.randrange(3)} for i in range(30)]  # fmt: skip
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    kwargs = json.dumps({"data_files": {"test": str(tmp_path / "mc.jsonl")},
                         "cache_dir": str(tmp_path / "hf-cache")})  # fmt: skip
    (tasks / "fam_mc.yaml").write_text(
        f"task: fam_mc\ndataset_path: json\ntest_split: test\ndataset_kwargs: {kwargs}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{context}}:'\ntarget_delimiter: ''\n"
        "doc_to_choice: choices\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n"
        "  - metric: acc_norm\n"
    )
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    hf_tok.eos_token = hf_tok.pad_token = hf_tok.convert_ids_to_tokens(0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    lm = HFLM(pretrained=hf, tokenizer=hf_tok, batch_size=8, device="cpu")
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    theirs = simple_evaluate(model=lm, tasks=["fam_mc"], task_manager=manager,
                             bootstrap_iters=0, log_samples=True, num_fewshot=0)  # fmt: skip
    capsys.readouterr()
    code = main(["eval", "-c", str(folder), "--tasks", "fam_mc", "--include-path", str(tasks),
                 "--json", "--bootstrap-iters", "0", "-o", str(tmp_path / "r.json")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = json.loads(out)["results"]["fam_mc"]
    assert json.loads((tmp_path / "r.json").read_text())["results"]["fam_mc"] == printed
    for metric in ("acc,none", "acc_norm,none"):
        assert printed[metric] == pytest.approx(theirs["results"]["fam_mc"][metric], abs=1e-12)
    assert 0 < printed["acc,none"] < 1 and printed["acc,none"] != printed["acc_norm,none"]


@torch.no_grad()
def test_a_long_context_model_is_measured_on_windows_that_fit(tmp_path: Path, capsys) -> None:
    """n_ctx 131072 (Llama 3.2's): without --seq-len the windows are at most 4096 tokens (here
    the whole text, one window), said on stderr, not one window of 131072 that no text fills."""
    folder = family_folder(tmp_path / "long", "llama", n_ctx=131072)
    body = text(200) + "\n"
    (tmp_path / "t.txt").write_text(body)
    capsys.readouterr()
    assert main(["eval", "-c", str(folder), "--data", str(tmp_path / "t.txt"), "--json"]) == 0
    out, err = capsys.readouterr()
    ids = torch.tensor(tokenizer().encode(body))
    assert f"windows of {len(ids) - 1} tokens of the model's n_ctx=131072" in err
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    logits = hf(ids[None, :-1]).logits[0]
    assert math.isclose(json.loads(out)["loss"], float(F.cross_entropy(logits, ids[1:])), rel_tol=1e-5)  # fmt: skip
