"""``export --format gguf`` with a model family's own ``tokenizer.json``: Llama 3's, Qwen's and
SmolLM's byte-level BPE as llama.cpp's ``gpt2`` model (``llama-bpe``, ``qwen2``, ``smollm``),
Llama 2's and Gemma's byte-fallback BPE as its SentencePiece ``llama`` model. Oracles: llama.cpp itself
(``llama_cpp``, where it imports) tokenizing a text set as ``FamilyTokenizer`` (ids equal to
``AutoTokenizer``'s, tests/tokenizer/test_family.py) and greedy ids of the exported tiny HF
folder equal to glassgpt's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tests.interop.hf_cases import CASES, make
from tests.interop.test_gguf_export import SAMPLES, _llama_cpp, agree, llama_shaped, read
from tests.tokenizer.family_files import CORPUS, write_family

from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.interop import export_gguf, from_hf
from glassgpt.tokenizer.family import FamilyTokenizer, read_family

gguf = pytest.importorskip("gguf")

TEXTS = [*SAMPLES, *CORPUS[:4], "  two leading spaces", "x", "tabs\tand\nnewlines\n", "🙂🙂 ok"]
# kind: (llama.cpp model, pre, add_bos, add_space_prefix, an HF case of the family)
KINDS = {
    "llama3": ("gpt2", "llama-bpe", True, None, "llama-gqa2-llama3-untied"),
    "qwen": ("gpt2", "qwen2", False, None, "qwen3-gqa2-untied"),
    "smollm": ("gpt2", "smollm", False, None, "llama-gqa3-yarn-tied"),
    "fallback": ("llama", "default", True, True, "llama-gqa2-llama3-untied"),
    "gemma": ("llama", "default", True, False, "gemma3-local-base-linear-full"),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {kind: write_family(kind, root / kind) for kind in KINDS}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_keys_are_llama_cpps_for_the_family(kind: str, tokenizers: Any, tmp_path: Path) -> None:
    tok = read_family(tokenizers[kind])
    meta, _ = read(export_gguf(llama_shaped(tok.n_vocab + 3), tok, tmp_path / "m.gguf"))
    model, pre, add_bos, space, _ = KINDS[kind]
    assert meta["tokenizer.ggml.model"] == model and meta["tokenizer.ggml.pre"] == pre
    assert meta["tokenizer.ggml.add_bos_token"] is add_bos
    assert meta.get("tokenizer.ggml.add_space_prefix") is space
    tokens, types = meta["tokenizer.ggml.tokens"], list(meta["tokenizer.ggml.token_type"])
    vocab = tok.backend.get_vocab()
    assert [tokens[i] for i in range(tok.n_vocab)] == sorted(vocab, key=vocab.__getitem__)
    assert tokens[tok.n_vocab :] == [f"[PAD{i}]" for i in range(tok.n_vocab, tok.n_vocab + 3)]
    for name, i in tok.special_tokens.items():
        assert types[i] == (2 if name == "<unk>" else 3)  # UNKNOWN, CONTROL
    if model == "llama":
        assert types[vocab["<0x41>"]] == 6  # BYTE
        assert {types[i] for i in tok.encode("the quick brown fox")} == {1}  # NORMAL
        assert meta["tokenizer.ggml.bos_token_id"] == tok.encode_prompt("")[0]
    eos = meta["tokenizer.ggml.eos_token_id"]
    assert eos == vocab[tok.eos_token]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_llama_cpp_tokenizes_as_the_family_tokenizer(
    kind: str, tokenizers: Any, tmp_path: Path
) -> None:
    llama_cpp = _llama_cpp()
    tok = read_family(tokenizers[kind])
    path = export_gguf(llama_shaped(tok.n_vocab), tok, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in TEXTS:
        got = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert got == tok.encode(text), text
        assert llm.tokenize(text.encode(), add_bos=KINDS[kind][2]) == tok.encode_prompt(text)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_llama_cpp_runs_the_exported_family_folder_as_glassgpt(
    kind: str, tokenizers: Any, tmp_path: Path
) -> None:
    llama_cpp = _llama_cpp()
    folder = tmp_path / "hf"
    tok = read_family(write_family(kind, folder))
    case = CASES[KINDS[kind][4]]
    extra = {"query_pre_attn_scalar": 8} if kind == "gemma" else {}  # as llama.cpp computes
    kwargs = {**case.kwargs, "vocab_size": tok.n_vocab, "max_position_embeddings": 32, **extra}
    hf = make(dataclasses.replace(case, kwargs=kwargs))
    hf.save_pretrained(folder)
    out = tmp_path / "m.gguf"
    assert main(["export", "-c", str(folder), "--format", "gguf", "-o", str(out)]) == 0
    meta, _ = read(out)
    assert meta.get("tokenizer.chat_template") == json.loads(
        (folder / "tokenizer_config.json").read_text()
    ).get("chat_template")  # Llama 3's and Qwen's; none for the others
    text = "Hello world, the quick fox"
    llm = llama_cpp.Llama(model_path=str(out), vocab_only=True, verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=KINDS[kind][2])
    assert ids == tok.encode_prompt(text)
    agree(from_hf(hf), out, ids, 4)


def test_a_tokenizer_llama_cpp_has_no_reader_for_is_refused(
    tokenizers: Any, tmp_path: Path
) -> None:
    spec = read_family(tokenizers["fallback"]).backend
    wordlevel = FamilyTokenizer(type(spec).from_str(_wordlevel()))
    with pytest.raises(GlassError, match="WordLevel tokenizer model is not mapped"):
        export_gguf(llama_shaped(8), wordlevel, tmp_path / "m.gguf")


def _wordlevel() -> str:
    return json.dumps({"version": "1.0", "added_tokens": [], "normalizer": None,
                       "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
                       "decoder": None, "truncation": None, "padding": None,
                       "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1},
                                 "unk_token": "a"}})  # fmt: skip
