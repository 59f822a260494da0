"""FamilyTokenizer against transformers' AutoTokenizer, on tokenizers built in the test: a
byte-level BPE with Llama 3's Split regex and BOS, Qwen's (NFC, no BOS), and a
SentencePiece-style byte-fallback BPE (Llama 2, Gemma)."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.interop.hf_cases import CASES, Case, make
from tests.tokenizer.family_files import write_family
from tests.tokenizer.strategies import ASCII_WORD, FRAGMENTS

from glassgpt.checkpoint import open_run
from glassgpt.checkpoint.runs import tokenizer_file
from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.interop.hf_tokenizers import load_tokenizer_json, save_tokenizer_json
from glassgpt.tokenizer import FamilyTokenizer, SpecialTokenError, Tokenizer, load_tokenizer
from glassgpt.tokenizer.display import show_bytes, token_texts
from glassgpt.tokenizer.special import stop_ids

transformers = pytest.importorskip("transformers")
KINDS = ("llama3", "qwen", "fallback")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {k: write_family(k, root / k) for k in KINDS}


@pytest.fixture(scope="module")
def pairs(folders: dict[str, Path]) -> dict[str, tuple[Any, Any]]:
    """(ours, AutoTokenizer) for each kind."""
    return {
        k: (tokenizer_file(f / "tokenizer.json"), transformers.AutoTokenizer.from_pretrained(f))
        for k, f in folders.items()
    }


def _texts(specials: list[str]) -> st.SearchStrategy[str]:
    chars = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=4)
    pieces = st.one_of(st.sampled_from(FRAGMENTS + specials), ASCII_WORD, chars)
    return st.lists(pieces, max_size=20).map("".join)


@pytest.mark.parametrize("kind", KINDS)
def test_a_family_file_becomes_a_family_tokenizer(pairs: dict, kind: str) -> None:
    ours, hf = pairs[kind]
    assert isinstance(ours, FamilyTokenizer)
    assert ours.n_vocab == len(hf)
    assert ours.special_tokens == {
        t.content: i for i, t in hf.added_tokens_decoder.items() if t.special
    }


@pytest.mark.parametrize("kind", KINDS)
def test_ids_equal_autotokenizer(pairs: dict, kind: str) -> None:
    ours, hf = pairs[kind]
    specials = sorted(ours.special_tokens)

    @settings(max_examples=150, deadline=None)
    @given(_texts(specials))
    def check(text: str) -> None:
        plain = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text, allowed_special="all") == plain
        assert ours.encode_prompt(text) == hf.encode(text)
        assert ours.decode(plain) == hf.decode(plain)
        if not any(s in text for s in specials):
            assert ours.encode(text) == plain
            expected = unicodedata.normalize("NFC", text) if kind == "qwen" else text
            assert ours.decode(plain) == expected  # the round trip
            assert ours.decode_bytes(plain).decode("utf-8") == (
                " " * bool(text) + text if kind == "fallback" else expected  # ▁ first
            )

    check()


def test_the_special_policy_and_the_prompt_specials(pairs: dict) -> None:
    ours = pairs["llama3"][0]
    text = "hi<|eot_id|>there"
    with pytest.raises(SpecialTokenError, match="eot_id"):
        ours.encode(text)
    eot = ours.special_tokens["<|eot_id|>"]
    assert eot in ours.encode(text, allowed_special="all")
    assert eot not in ours.encode(text, disallowed_special=())  # read as text
    assert ours.encode(text, disallowed_special=()) == ours.encode_ordinary(text)
    bos = ours.special_tokens["<|begin_of_text|>"]
    assert ours.encode_prompt("hi")[0] == bos and ours.encode("hi")[0] != bos
    assert pairs["qwen"][0].encode_prompt("hi") == pairs["qwen"][0].encode("hi")  # no BOS
    # a lone surrogate (a JSON prompt may hold one; the library refuses it) is U+FFFD
    assert ours.encode("a\ud800b") == pairs["llama3"][1].encode(
        "a\ufffdb", add_special_tokens=False
    )
    assert ours.encode_prompt("\udfff") == pairs["llama3"][1].encode("\ufffd")
    # the ids that end a generation: tokenizer_config.json's eos_token
    assert stop_ids(ours) == (eot,)
    assert stop_ids(pairs["qwen"][0]) == (
        pairs["qwen"][0].special_tokens["<|endoftext|>"],
        pairs["qwen"][0].special_tokens["<|im_end|>"],
    )


def test_byte_fallback_tokens_display_as_their_bytes(pairs: dict) -> None:
    ours, _ = pairs["fallback"]
    text = "a 🙂 b"  # the emoji is in no merge: four <0xNN> tokens
    ids = ours.encode(text)
    shown = token_texts(ours, ids)
    at = shown.index("<0xF0>")
    assert shown[at : at + 4] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]  # each byte alone
    assert "".join(shown) == " a <0xF0><0x9F><0x99><0x82> b"  # ▁ shown as a space
    assert show_bytes(ours.decode_bytes(ids)) == " a 🙂 b"  # joined, whole again
    nl = ours.special_tokens.get("<0x0A>")
    assert nl is None  # byte tokens are vocabulary, not specials …
    assert token_texts(ours, [ours.backend.token_to_id("<0x0A>")]) == ["\n"]  # … a whole "\n"


def test_gpt2_style_files_stay_glassgpt_tokenizers(tmp_path: Path) -> None:
    tok = Tokenizer.train("hello hello world", 270, special_tokens=["<|endoftext|>"])
    save_tokenizer_json(tok, tmp_path / "tokenizer.json")
    assert isinstance(load_tokenizer_json(tmp_path / "tokenizer.json"), Tokenizer)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["post_processor"] = {"type": "TemplateProcessing", "single": [], "pair": [],
                              "special_tokens": {}}  # fmt: skip
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert isinstance(load_tokenizer_json(tmp_path / "tokenizer.json"), FamilyTokenizer)


def test_a_file_the_library_cannot_read_is_one_line(tmp_path: Path) -> None:
    data = json.loads(json.dumps({"model": {"type": "Unigram", "vocab": "x"}}))
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(GlassError) as err:
        load_tokenizer_json(tmp_path / "tokenizer.json")
    assert "tokenizers library" in str(err.value) and "\n" not in str(err.value)


def test_pipeline_names_each_stage(pairs: dict) -> None:
    rows = dict(pairs["llama3"][0].pipeline())
    assert "Split(/(?i:'s" in rows["pre-tokenizer"] and "ByteLevel" in rows["pre-tokenizer"]
    assert rows["model"].startswith("BPE:") and "ignore_merges" in rows["model"]
    assert rows["added to prompts"] == "<|begin_of_text|>"
    rows = dict(pairs["fallback"][0].pipeline())
    assert rows["normalizer"] == "Prepend('▁') → Replace(' ' → '▁')"
    assert "byte_fallback" in rows["model"] and rows["added to prompts"] == "<s>"
    assert dict(pairs["qwen"][0].pipeline())["normalizer"] == "NFC"


def test_an_hf_folder_opens_with_its_family_tokenizer(folders: dict, tmp_path: Path) -> None:
    tok = tokenizer_file(folders["llama3"] / "tokenizer.json")
    base = CASES["llama-gqa2-llama3-untied"]
    hf = make(Case(base.config, base.model, {**base.kwargs, "vocab_size": tok.n_vocab}))
    hf.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folders["llama3"] / name).read_bytes())
    eot = tok.special_tokens["<|eot_id|>"]
    end = tok.special_tokens["<|end_of_text|>"]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [end, eot]}))
    run = open_run(tmp_path)
    assert isinstance(run.tokenizer, FamilyTokenizer)
    assert run.tokenizer.encode_prompt("Hello") == tok.encode_prompt("Hello")
    assert stop_ids(run.tokenizer) == (end, eot)
    assert run.chat_template is not None and "start_header_id" in run.chat_template.source


def test_stats_and_describe_print_the_map(folders: dict, tmp_path: Path, capsys: Any) -> None:
    text = tmp_path / "t.txt"
    text.write_text("Hello world — naïve 🙂\n", encoding="utf-8")
    assert main(["tokenizer", "stats", "--tokenizer", str(folders["fallback"]), str(text)]) == 0
    out = capsys.readouterr().out
    assert "Prepend('▁') → Replace(' ' → '▁')" in out and "byte_fallback" in out
    tok = tokenizer_file(folders["fallback"] / "tokenizer.json")
    n = len(tok.encode(text.read_text(encoding="utf-8")))
    assert f"{len(text.read_bytes()) / n:.3f}" in out  # the family's own ids are counted
    hf = tmp_path / "hf"
    base = CASES["qwen3-gqa2-untied"]
    qwen = tokenizer_file(folders["qwen"] / "tokenizer.json")
    make(
        Case(base.config, base.model, {**base.kwargs, "vocab_size": qwen.n_vocab})
    ).save_pretrained(hf)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf / name).write_bytes((folders["qwen"] / name).read_bytes())
    assert main(["describe", "-c", str(hf)]) == 0
    out = capsys.readouterr().out
    assert "## Tokenizer: Text → V*" in out and "| normalizer | NFC |" in out
    assert "\\|\\s+(?!\\S)\\|" in out  # the Split pattern, its | escaped in the table
    assert "| added to prompts | nothing |" in out
    assert "| end of generation | <\\|im_end\\|> |" in out and "| decoder | ByteLevel |" in out


def test_saved_and_exported_it_reads_back_the_same(pairs: dict, tmp_path: Path) -> None:
    ours = pairs["fallback"][0]
    ours.save(tmp_path / "tokenizer.json")
    back = tokenizer_file(tmp_path / "tokenizer.json")
    save_tokenizer_json(ours, tmp_path / "exported.json")
    again = load_tokenizer_json(tmp_path / "exported.json")
    text = "naïve 🙂 <s> x"
    assert back.encode_prompt(text) == again.encode_prompt(text) == ours.encode_prompt(text)
    # what the data and training stages read back (a fine-tune from an HF family folder)
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, FamilyTokenizer) and loaded.encode(text, allowed_special="all") == (
        ours.encode(text, allowed_special="all")
    )
