"""``glassgpt sample`` on a tiny HF folder of each family (Llama, Qwen3, Gemma 3, GPT-NeoX):
greedy text equal to transformers' greedy continuation of the same folder, temperature
sampling reproducible by seed, bf16 and int8 running, and any engine slower than the one a
GPT-2 of the same dtype gets named on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.families import FAMILIES, family_folder, tokenizer  # noqa: E402

import glassgpt  # noqa: E402
from glassgpt.cli import main  # noqa: E402
from glassgpt.model import GPT, GPTConfig  # noqa: E402
from glassgpt.model.precision import cast  # noqa: E402
from glassgpt.sample import engine  # noqa: E402

PROMPT, NEW = "the cat in the hat", 10


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: family_folder(root / f, f) for f in FAMILIES}


def sample(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["sample", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_text_is_transformers_greedy_continuation(family, folders, capsys) -> None:
    tok = tokenizer()
    hf = transformers.AutoModelForCausalLM.from_pretrained(folders[family]).eval()
    ids = torch.tensor([tok.encode(PROMPT)])
    theirs = hf.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]  # fmt: skip
    assert len(set(theirs.tolist())) > 1  # not one token repeated: a continuation that tells
    code, out, err = sample(capsys, "-c", str(folders[family]), "-p", PROMPT, "-m", str(NEW),
                            "-t", "0", "--no-stop-eos")  # fmt: skip
    assert code == 0, err
    assert out == PROMPT + tok.decode_bytes(theirs.tolist()).decode("utf-8", "replace") + "\n"


@pytest.mark.parametrize("family", FAMILIES)
def test_temperature_sampling_is_seeded(family, folders, capsys) -> None:
    argv = ["-c", str(folders[family]), "-p", PROMPT, "-m", "12", "-t", "1.5", "--top-k", "50",
            "--no-stop-eos"]  # fmt: skip
    first = [sample(capsys, *argv, "--seed", str(s))[1] for s in (1, 1, 2)]
    assert first[0] == first[1] != first[2]
    assert all(o.startswith(PROMPT) for o in first)


def _gpt2_like(dtype: str) -> GPT:
    """A GPT-2-shaped model in ``dtype``: the engine every model without family fields gets."""
    model = GPT(GPTConfig(n_vocab=300, n_ctx=64, d_model=32, n_layers=2, n_heads=4))
    return cast(model.eval(), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bf16", "int8"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_dtype_runs_and_a_slower_engine_says_so(family, dtype, folders, capsys, monkeypatch):
    monkeypatch.setattr(engine, "_SAID", set())  # the note is said once per process
    code, out, err = sample(capsys, "-c", str(folders[family]), "-p", PROMPT, "-m", "8", "-t", "0",
                            "--no-stop-eos", "--dtype", dtype)  # fmt: skip
    assert code == 0, err
    assert out.startswith(PROMPT) and len(out) > len(PROMPT) + 1
    model, _ = glassgpt.load(folders[family], dtype=dtype)
    mine, base = engine.choose(model), engine.choose(_gpt2_like(dtype))
    if mine.kind != base.kind:  # slower than a GPT-2 of this dtype decodes: said, with why
        assert mine.kind == "eager" and f"decoding eagerly: {mine.why}" in err
    assert "Traceback" not in err


@torch.no_grad()
def test_int8_greedy_is_the_int8_copys(folders, capsys) -> None:
    """--dtype int8 on a GQA model decodes as the int8 copy of its weights does."""
    from glassgpt.sample import generate

    model, tok = glassgpt.load(folders["llama"])
    ids = generate(cast(model, "int8"), tok.encode(PROMPT), max_new_tokens=NEW, temperature=0)
    code, out, err = sample(capsys, "-c", str(folders["llama"]), "-p", PROMPT, "-m", str(NEW),
                            "-t", "0", "--no-stop-eos", "--dtype", "int8")  # fmt: skip
    assert code == 0, err
    assert out == PROMPT + tok.decode_bytes(ids).decode("utf-8", "replace") + "\n"
