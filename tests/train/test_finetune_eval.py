"""``eval``, ``export``, ``train --init-from`` and ``train --resume`` of a finished run, end to
end through the CLI on a tiny byte-level BPE run; transformers and torch's own cross-entropy
are the oracles."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn.functional as F

from glassgpt.cli import main
from glassgpt.errors import ConfigError
from glassgpt.model import GPTConfig
from glassgpt.train.metrics import read_metrics

SETS = [
    "train.progress=false",
    "train.threads=1",
    "train.batch_size=4",
    "train.eval_batches=none",  # the whole validation split, as eval measures it
    "train.sample_tokens=0",
    "train.warmup_steps=1",
    "train.max_steps=4",
    "train.eval_every=4",
    "train.precision=fp32",
    "data.tokenizer=bpe",
    "data.vocab_size=300",
    "model.n_ctx=32",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.unembed_bias=false",  # as GPT-2, so that it exports
]


def _text(path: Path, size: int = 24_000) -> Path:
    lines = [f"def f{i}(x):\n    return x * {i} + {i % 7}  # café\n\n" for i in range(size // 30)]
    path.write_text("".join(lines)[:size], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bpe")
    data, run = _text(tmp / "input.txt"), tmp / "run"
    argv = ["train", "--preset", "cpu-tiny", "--data", str(data), "-o", str(run), "--set"]
    assert main([*argv, *SETS]) == 0
    return run


def _eval(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["eval", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_eval_matches_the_trainers_val_loss(bpe_run: Path, capsys) -> None:
    last = [r for r in read_metrics(bpe_run / "metrics.jsonl") if "val_loss" in r][-1]
    step = bpe_run / "ckpt" / f"step_{last['step']:06d}"
    got = _eval(capsys, "-c", str(step), "--data", str(bpe_run / "data"), "--batch-size", "4")
    assert math.isclose(got["loss"], last["val_loss"], rel_tol=1e-6)
    assert math.isclose(got["bits_per_byte"], last["val_bpb"], rel_tol=1e-6)
    assert math.isclose(got["perplexity"], math.exp(last["val_loss"]), rel_tol=1e-6)


def test_eval_with_int8_weights(bpe_run: Path, capsys) -> None:
    """--dtype int8: the loss of the int8 copy, changed by the quantization but by little."""
    data = ["--data", str(bpe_run / "data"), "--batch-size", "4"]
    base = _eval(capsys, "-c", str(bpe_run), *data)
    got = _eval(capsys, "-c", str(bpe_run), *data, "--dtype", "int8")
    assert got["dtype"] == "int8" and got["loss"] != base["loss"]
    assert math.isclose(got["loss"], base["loss"], rel_tol=0.01)
    capsys.readouterr()
    assert main(["eval", "-c", str(bpe_run), *data, "--dtype", "int3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dtype: unknown dtype 'int3'" in err


def test_eval_on_a_text_file_is_the_mean_cross_entropy(bpe_run: Path, tmp_path, capsys) -> None:
    import glassgpt

    text = "def g(y):\n    return y * 3  # café\n" * 40
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    got = _eval(capsys, "--checkpoint", str(bpe_run), "--data", str(tmp_path / "t.txt"))
    model, tok = glassgpt.load(bpe_run)
    ids = torch.tensor(tok.encode(text))
    T = model.config.n_ctx
    n = (len(ids) - 1) // T  # the disjoint full windows
    x = torch.stack([ids[i * T : i * T + T] for i in range(n)])
    y = torch.stack([ids[i * T + 1 : i * T + T + 1] for i in range(n)])
    with torch.no_grad():
        logits = model(x)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    mean = float(nll) / (n * T)  # a tail shorter than a window is left out, as the trainer does
    assert math.isclose(got["loss"], mean, rel_tol=1e-5)
    n_bytes = len(text.encode("utf-8"))
    assert got["bytes"] == n_bytes and got["tokens"] == len(ids)
    assert math.isclose(got["bits_per_byte"], mean / math.log(2) * len(ids) / n_bytes, rel_tol=1e-5)


def test_export_hf_loads_in_transformers_without_glassgpt(bpe_run: Path, tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    import glassgpt

    out = tmp_path / "hf"
    assert main(["export", "-c", str(bpe_run), "--format", "hf", "-o", str(out)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    model, tok = glassgpt.load(bpe_run)
    text = "def f12(x):\n    return x * 12 + 5  # café"
    ids = tok.encode(text)
    assert hf_tok(text)["input_ids"] == ids
    assert hf_tok.decode(ids) == text
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits
        ours = model(torch.tensor([ids]))
    assert (theirs - ours).abs().max() <= 1e-4
    # every --checkpoint takes the HF folder too
    assert main(["sample", "-c", str(out), "-p", "def", "-m", "4", "--seed", "1"]) == 0


def test_export_tiktoken_ranks_are_the_vocabulary(bpe_run: Path, tmp_path) -> None:
    import glassgpt

    out = tmp_path / "tok.tiktoken"
    assert main(["export", "-c", str(bpe_run), "--format", "tiktoken", "-o", str(out)]) == 0
    _, tok = glassgpt.load(bpe_run)
    lines = out.read_text("ascii").splitlines()
    assert [int(line.split()[1]) for line in lines] == list(range(len(tok.vocab)))


def test_resume_of_a_finished_run_says_so_and_its_loss(bpe_run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["train", "--resume", str(bpe_run)]) == 0
    out = capsys.readouterr().out
    records = read_metrics(bpe_run / "metrics.jsonl")
    assert "already finished: step 4 of train.max_steps=4" in out
    assert f"train loss {records[-1]['loss']:.4f}" in out
    assert f"val loss {records[-1]['val_loss']:.4f}" in out and "nan" not in out


def test_saved_config_shows_only_the_fields_that_apply(bpe_run: Path) -> None:
    saved = tomllib.loads((bpe_run / "config.toml").read_text())
    assert saved["data"]["vocab_size"] == 300  # bpe: it applies
    assert "rope_base" not in saved["model"] and "mlp_gate" not in saved["model"]


def test_init_from_refuses_a_change_of_shape_naming_the_field(bpe_run: Path, tmp_path, capsys):
    capsys.readouterr()
    data = _text(tmp_path / "more.txt", 8000)
    argv = ["train", "--init-from", str(bpe_run), "--data", str(data), "-o", str(tmp_path / "ft")]
    assert main([*argv, "--set", "model.d_model=48"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassgpt: error: model.d_model: ") and err.count("\n") == 1
    assert not (tmp_path / "ft").exists()
    sets = ["model.dropout=0.1", "train.max_steps=2", "train.progress=false", "train.threads=1"]
    assert main([*argv, "--set", *sets, "train.sample_tokens=0", "train.eval_every=2"]) == 0
    saved = tomllib.loads((tmp_path / "ft" / "config.toml").read_text())
    assert saved["model"]["dropout"] == 0.1 and saved["model"]["d_model"] == 32


def test_check_shapes_names_the_field_that_changes_them() -> None:
    from glassgpt.train.init_from import InitFrom, check_shapes

    base = GPTConfig(n_vocab=50, n_ctx=16, d_model=16, n_layers=2, n_heads=2)
    init = InitFrom(Path("src"), base, {}, b"", 50)
    check_shapes(init, base.replace(dropout=0.2, norm_eps=1e-6))  # shape-free: accepted
    for change, field in [({"n_layers": 3}, "n_layers"), ({"mlp": "swiglu"}, "mlp"),
                          ({"positional": "rope"}, "positional"), ({"n_ctx": 8}, "n_ctx")]:  # fmt: skip
        with pytest.raises(ConfigError) as info:
            check_shapes(init, base.replace(**change))
        assert info.value.field == f"model.{field}"


@pytest.mark.slow
def test_fine_tuning_an_hf_gpt2_on_tinyshakespeare_lowers_val_loss(
    tmp_path, capsys, shakespeare_path, gpt2_files
) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=64)
    hf_dir = tmp_path / "hf-gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(hf_dir)
    for f in gpt2_files:  # encoder.json + vocab.bpe: GPT-2's own tokenizer files
        shutil.copy(f, hf_dir / f.name)
    text = shakespeare_path.read_text("utf-8")
    (tmp_path / "val.txt").write_text(text[-20_000:], encoding="utf-8")
    run = tmp_path / "ft"
    sets = ["train.max_steps=30", "train.batch_size=8", "train.lr=3e-3", "train.warmup_steps=3",
            "train.eval_every=30", "train.eval_batches=4", "train.sample_tokens=0",
            "train.progress=false", "train.precision=fp32", "model.dropout=0.0"]  # fmt: skip
    argv = ["train", "--init-from", str(hf_dir), "--data", str(shakespeare_path), "-o", str(run)]
    assert main([*argv, "--set", *sets]) == 0
    saved = tomllib.loads((run / "config.toml").read_text())
    assert saved["model"]["n_vocab"] == 50257 and saved["model"]["d_model"] == 64
    before = _eval(capsys, "-c", str(hf_dir), "--data", str(tmp_path / "val.txt"))
    after = _eval(capsys, "-c", str(run), "--data", str(tmp_path / "val.txt"))
    assert before["tokens"] == after["tokens"]  # the same tokenizer
    assert after["loss"] < before["loss"] - 1.0, (before, after)
