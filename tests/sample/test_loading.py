"""glassgpt.load: checkpoints (run folder, ckpt folder, one checkpoint) and HF folders."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch

import glassgpt
from glassgpt.errors import GlassError
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer


def same_function(a: GPT, b: GPT, n_vocab: int) -> bool:
    """The same weights, bit for bit, and so the same logits (up to the summation order of the
    packed products that ``glassgpt.load`` registers for fast inference)."""
    tokens = torch.randint(0, n_vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
        return False
    with torch.no_grad():
        return torch.allclose(a(tokens), b(tokens), rtol=1e-5, atol=1e-5)


def test_load_run_ckpt_and_step_folders(char_run: tuple[Path, GPT, CharTokenizer]) -> None:
    run, model, tok = char_run
    for path in (run, run / "ckpt", run / "ckpt" / "step_000010", run / "ckpt" / "best"):
        loaded, loaded_tok = glassgpt.load(path)
        assert loaded.config == model.config
        assert not loaded.training
        assert same_function(loaded, model, tok.n_vocab)
        assert loaded_tok.encode("hello, world") == tok.encode("hello, world")
        assert loaded_tok.special_tokens == tok.special_tokens


def test_a_corrupt_best_falls_back_to_the_newest_step(
    char_run: tuple[Path, GPT, CharTokenizer],
) -> None:
    run, model, tok = char_run
    weights = run / "ckpt" / "best" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning, match="checksum mismatch"):
        loaded, _ = glassgpt.load(run)
    assert same_function(loaded, model, tok.n_vocab)
    with pytest.raises(GlassError, match="checksum mismatch"):
        glassgpt.load(run / "ckpt" / "best")  # named explicitly: no fallback


def test_hf_folder_with_its_tokenizer(tmp_path: Path) -> None:
    from glassgpt.interop import to_hf

    tok = CharTokenizer(list("abcdefgh"))
    torch.manual_seed(1)
    model = GPT(GPTConfig(n_vocab=8, n_ctx=16, d_model=16, n_layers=1, n_heads=2)).eval()
    folder = to_hf(model, tmp_path / "hf")
    with pytest.warns(UserWarning, match="no tokenizer found"):
        loaded, none = glassgpt.load(folder)
    assert none is None and same_function(loaded, model, 8)
    tok.save(folder / "tokenizer.json")
    loaded, loaded_tok = glassgpt.load(folder)
    assert loaded_tok.chars == tok.chars
    assert glassgpt.load(folder, dtype=torch.bfloat16)[0].embed.W_E.dtype == torch.bfloat16


def test_gpt2_vocab_files_beside_an_hf_model(tmp_path: Path, gpt2_files: tuple[Path, Path]) -> None:
    from glassgpt.interop import to_hf

    torch.manual_seed(2)
    model = GPT(GPTConfig(n_vocab=50257, n_ctx=16, d_model=16, n_layers=1, n_heads=2)).eval()
    folder = to_hf(model, tmp_path / "hf")
    shutil.copy(gpt2_files[0], folder / "vocab.json")
    shutil.copy(gpt2_files[1], folder / "merges.txt")
    _, tok = glassgpt.load(folder)
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's ids


def test_missing_and_foreign_folders_raise_one_line(tmp_path: Path) -> None:
    with pytest.raises(GlassError, match="no such checkpoint or model folder"):
        glassgpt.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GlassError, match="not a glassgpt checkpoint or HF model folder"):
        glassgpt.load(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(GlassError, match="not a folder"):
        glassgpt.load(tmp_path / "file")


def test_a_tokenizer_larger_than_the_model_is_refused(
    char_run: tuple[Path, GPT, CharTokenizer], tmp_path: Path
) -> None:
    run, _, _ = char_run
    big = CharTokenizer([chr(0x100 + i) for i in range(200)])
    big.save(tmp_path / "big.json")
    with warnings.catch_warnings(), pytest.raises(GlassError, match="200 ids but the model"):
        glassgpt.load(run, tokenizer=tmp_path / "big.json")
