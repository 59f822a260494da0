"""The data stage on a model family's own tokenizer (``glassgpt data prepare --tokenizer
FOLDER/tokenizer.json``): each document is ``tokenizer(doc)`` as ``AutoTokenizer`` encodes it
(the post-processor's BOS first: Llama 3's ``<|begin_of_text|>``, ``<s>``; none for Qwen)
followed by the family's end-of-text id (``<|end_of_text|>``, ``<|endoftext|>``, ``</s>``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.tokenizer.family_files import CORPUS, write_family
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from glassgpt.cli import main
from glassgpt.data import prepare
from glassgpt.tokenizer.family import read_family

transformers = pytest.importorskip("transformers")

DOCS = ["Hello world! The quick brown fox.", "naïve café 1234\n  spaces", "def main():\n    pass"]
END = {"llama3": "<|end_of_text|>", "qwen": "<|endoftext|>", "fallback": "</s>", "gemma": "<eos>"}
BOS = {"llama3": ["<|begin_of_text|>"], "qwen": [], "fallback": ["<s>"], "gemma": ["<bos>"]}


@pytest.mark.parametrize("kind", sorted(END))
def test_documents_are_delimited_as_the_family_has_them(kind: str, tmp_path: Path) -> None:
    folder = write_family(kind, tmp_path / kind)
    inputs = []
    for i, doc in enumerate(DOCS):
        inputs.append(tmp_path / f"doc{i}.txt")
        inputs[-1].write_text(doc, encoding="utf-8")
    out = tmp_path / "data"
    assert main(["data", "prepare", "--input", *map(str, inputs), "--tokenizer",
                 str(folder / "tokenizer.json"), "--output", str(out), "--val-fraction", "0",
                 "--no-progress"]) == 0  # fmt: skip
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    end = hf.convert_tokens_to_ids(END[kind])
    want: list[int] = []
    for doc in DOCS:
        ids = hf(doc)["input_ids"]
        assert hf.convert_ids_to_tokens(ids[: len(BOS[kind])]) == BOS[kind]
        want += [*ids, end]
    meta = json.loads((out / "meta.json").read_text())
    got = np.fromfile(out / "train_000.bin", dtype=meta["dtype"]).tolist()
    assert got == want
    assert meta["splits"]["train"]["documents"] == len(DOCS)
    assert meta["separator"]["ids"] == [end]


def sentencepiece_like(folder: Path, *, prepend: bool) -> Path:
    """A byte-fallback BPE whose pieces never span a space or a newline, as SentencePiece's
    (Llama 2's ``prepend``; Gemma's not): trained on words, the split then removed, as in
    their files (family_files' tokenizers merge across them, which no real one does)."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    spaces = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), *spaces] if prepend else spaces
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])  # fmt: skip
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([t.replace("\n", " ") for t in CORPUS], trainer)
    tok.pre_tokenizer = None
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in specials[:3]]
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind", ["llama2", "gemma", "llama3", "qwen"])
def test_a_document_cut_in_pieces_has_the_ids_of_the_whole(kind: str, tmp_path: Path) -> None:
    """A large file read in pieces, and the val cut inside it: the parts' ids joined are the
    document's (Llama 2's ``▁`` before each text is not put before a part that continues it)."""
    if kind in ("llama2", "gemma"):
        folder = sentencepiece_like(tmp_path / kind, prepend=kind == "llama2")
    else:
        folder = write_family(kind, tmp_path / kind)
    doc = " ".join(DOCS * 6) + "\nthe end of it"
    path = tmp_path / "doc.txt"
    path.write_text(doc, encoding="utf-8")
    data = prepare([path], tmp_path / "data", read_family(folder), val_fraction=0.3,
                   piece_bytes=48)  # fmt: skip
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    end = {"llama3": END["llama3"], "qwen": END["qwen"]}.get(kind, "</s>")
    want = [*hf(doc)["input_ids"], hf.convert_tokens_to_ids(end)]
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    got = [np.fromfile(tmp_path / "data" / f"{split}_000.bin", dtype=meta["dtype"]).tolist()
           for split in ("train", "val")]  # fmt: skip
    assert got[0] and got[1] and got[0] + got[1] == want
    assert data.meta.splits["train"].documents + data.meta.splits["val"].documents == 1
