"""The data stage on a model family's own tokenizer (``glassgpt data prepare --tokenizer
FOLDER/tokenizer.json``): each document is ``tokenizer(doc)`` as ``AutoTokenizer`` encodes it
(the post-processor's BOS first: Llama 3's ``<|begin_of_text|>``, ``<s>``; none for Qwen)
followed by the family's end-of-text id (``<|end_of_text|>``, ``<|endoftext|>``, ``</s>``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.tokenizer.family_files import write_family

from glassgpt.cli import main

transformers = pytest.importorskip("transformers")

DOCS = ["Hello world! The quick brown fox.", "naïve café 1234\n  spaces", "def main():\n    pass"]
END = {"llama3": "<|end_of_text|>", "qwen": "<|endoftext|>", "fallback": "</s>"}
BOS = {"llama3": ["<|begin_of_text|>"], "qwen": [], "fallback": ["<s>"]}


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
