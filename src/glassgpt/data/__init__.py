"""glassgpt.data: text → token shards on disk → (x, y) batches.

- :func:`prepare` encodes text files into ``train_*.bin`` / ``val_*.bin`` shards with a
  ``meta.json`` and a copy of the tokenizer (:mod:`glassgpt.data.prepare`, layout in
  :mod:`glassgpt.data.shards`).
- :class:`Corpus`: the documents of text, JSON Lines, JSON, Parquet and Hugging Face dataset
  inputs, streamed (:mod:`glassgpt.data.documents`, readers in :mod:`glassgpt.data.records`).
- :func:`default_corpus_files` / :func:`iter_default_corpus`: the embedded corpus, this
  interpreter's standard library sources (:mod:`glassgpt.data.corpus`).
- :class:`BatchSampler` and :func:`iter_eval_batches` read the shards memory-mapped
  (:mod:`glassgpt.data.sampler`).
"""

from __future__ import annotations

from glassgpt.data.corpus import (
    default_corpus_files,
    iter_default_corpus,
    scan_default_corpus,
    stdlib_dir,
)
from glassgpt.data.documents import Corpus
from glassgpt.data.prepare import prepare
from glassgpt.data.reading import resolve_inputs
from glassgpt.data.sampler import BatchSampler, eval_windows, iter_eval_batches
from glassgpt.data.shards import DataDir, DataMeta, TokenStream, dtype_for, tokenizer_fingerprint

__all__ = [
    "BatchSampler",
    "Corpus",
    "DataDir",
    "DataMeta",
    "TokenStream",
    "default_corpus_files",
    "dtype_for",
    "eval_windows",
    "iter_default_corpus",
    "iter_eval_batches",
    "prepare",
    "resolve_inputs",
    "scan_default_corpus",
    "stdlib_dir",
    "tokenizer_fingerprint",
]
