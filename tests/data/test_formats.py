"""Data formats: one corpus as text files, JSON Lines, a JSON array, Parquet and a saved Hugging
Face dataset gives the same ids; bad records and broken files are one line; reading streams.

The oracle for the ids is explicit: for each non-empty document, the tokenizer's ids of its
text followed by the ``<|endoftext|>`` id; the txt path (one file per document, the existing
reader) must give it too, train and val cut at the same place.
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.cli import main
from glassgpt.data import records
from glassgpt.data.documents import Corpus
from glassgpt.data.prepare import prepare
from glassgpt.data.reading import iter_pieces, text_pieces
from glassgpt.data.records import BadRecords, ParquetSource, _ArrayScanner, require
from glassgpt.data.shards import DataDir
from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer import CharTokenizer

EOT = "<|endoftext|>"
DOCS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    '    indented = True\n\tтабуляция ✓ "quoted" back\\slash\n',
    "",  # empty: contributes nothing, in every format
    "spells <|endoftext|> as text 🙂",
    "def f(x):\n    return x  # a longer one\n" * 30,  # many pieces at piece_bytes=64
    "x",
    "\n\n  trailing space  \n",
]


def _tok() -> CharTokenizer:
    return CharTokenizer(sorted(set("".join(DOCS) + "\n")), special_tokens=[EOT])


def _tokens(data: DataDir, split: str) -> np.ndarray:
    dtype = np.dtype(data.meta.dtype)
    parts = [np.fromfile(data.path / f, dtype=dtype) for f, _ in data.split(split).shards]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def write_txt(folder: Path, docs: list[str]) -> Path:
    folder.mkdir(parents=True)
    for i, doc in enumerate(docs):
        (folder / f"doc{i:04d}.txt").write_bytes(doc.encode("utf-8"))
    return folder


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    lines = [json.dumps({"id": i, field: d}, ensure_ascii=i % 2 == 0) for i, d in enumerate(docs)]
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")  # a blank line at the end
    return path


def write_json(path: Path, docs: list[str]) -> Path:
    path.write_text(json.dumps([{"text": d, "n": [1, 2]} for d in docs], indent=2), "utf-8")
    return path


def write_parquet(path: Path, docs: list[str], row_group: int = 2) -> Path:
    table = pa.table({"n": list(range(len(docs))), "text": docs})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_dataset(path: Path, docs: list[str]) -> Path:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))}).save_to_disk(path)
    return path


WRITERS = {
    "jsonl": lambda d, docs: write_jsonl(d / "c.jsonl", docs),
    "json": lambda d, docs: write_json(d / "c.json", docs),
    "parquet": lambda d, docs: write_parquet(d / "c.parquet", docs),
    "dataset": lambda d, docs: write_dataset(d / "saved", docs),
}


@pytest.mark.parametrize("val_fraction", [0.0, 0.3])
def test_every_format_gives_the_ids_of_the_text_files(tmp_path: Path, val_fraction) -> None:
    tok = _tok()
    expected = [i for d in DOCS if d for i in [*tok.encode_ordinary(d), tok.special_tokens[EOT]]]
    kw = dict(val_fraction=val_fraction, shard_tokens=50, piece_bytes=64, batch_bytes=100)
    txt = prepare([write_txt(tmp_path / "txt", DOCS)], tmp_path / "out_txt", tok, **kw)
    want = {s: _tokens(txt, s) for s in ("train", "val")}
    assert np.concatenate([want["train"], want["val"]]).tolist() == expected
    assert (len(want["val"]) > 0) == (val_fraction > 0)
    for name, write in WRITERS.items():
        data = prepare([write(tmp_path, DOCS)], tmp_path / f"out_{name}", tok, **kw)
        for split in ("train", "val"):
            assert _tokens(data, split).tolist() == want[split].tolist(), (name, split)
            assert data.meta.splits[split] == txt.meta.splits[split], name
        assert [n for _, n in data.meta.sources] == [sum(len(d.encode()) for d in DOCS)]


def test_formats_mix_in_one_corpus_in_order(tmp_path: Path) -> None:
    """A folder of a .jsonl, a .parquet and a .txt: their documents in sorted path order."""
    tok = _tok()
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", DOCS[:2])
    write_parquet(tmp_path / "in" / "b.parquet", DOCS[2:5])
    (tmp_path / "in" / "c.txt").write_text(DOCS[5], encoding="utf-8")
    data = prepare([tmp_path / "in"], tmp_path / "out", tok, val_fraction=0.0)
    eot = tok.special_tokens[EOT]
    expected = [i for d in DOCS[:6] if d for i in [*tok.encode_ordinary(d), eot]]
    assert _tokens(data, "train").tolist() == expected


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(st.sampled_from("ab \n\té€🙂"), min_size=1, max_size=300),
    piece_bytes=st.integers(4, 40),
)
def test_text_pieces_cut_where_the_file_reader_cuts(tmp_path_factory, text, piece_bytes) -> None:
    path = tmp_path_factory.mktemp("p") / "doc.txt"
    path.write_bytes(text.encode("utf-8"))
    got = list(text_pieces(text, len(text.encode("utf-8")), piece_bytes))
    assert got == list(iter_pieces(path, piece_bytes))


@settings(max_examples=40, deadline=None)
@given(
    items=st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
            max_leaves=8,
        ),
        max_size=8,
    ),
    indent=st.sampled_from([None, 0, 2]),
    block=st.integers(1, 9),
)
def test_array_scanner_equals_json_load(tmp_path_factory, items, indent, block) -> None:
    """Elements read a few characters at a time (every split point) equal ``json.loads``."""
    path = tmp_path_factory.mktemp("a") / "a.json"
    path.write_text(json.dumps(items, indent=indent), encoding="utf-8")
    with path.open("rb") as f:
        got = [value for value, _ in _ArrayScanner(f, path, block).elements()]
    assert got == json.loads(path.read_text(encoding="utf-8"))


# -- bad records: one line naming the file and line, or skipped and counted -------------------

BAD_LINES = [
    ("{oops", "not JSON"),
    ('{"txt": "a", "id": 1}', "no field 'text' (the record's fields: 'txt', 'id'"),
    ('{"text": 5}', "field 'text' is a number, not a string"),
    ('{"text": null}', "field 'text' is null, not a string"),
    ('["text"]', "the record is an array, not an object"),
    ('{"text": "\\ud800 lone"}', "lone surrogate"),
]


@pytest.mark.parametrize(("line", "why"), BAD_LINES)
def test_a_bad_jsonl_line_names_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "fine"}\n\n' + line + '\n{"text": "more"}\n', encoding="utf-8")
    with pytest.raises(InputFileError) as e:
        prepare([path], tmp_path / "out", _tok())
    message = str(e.value)
    assert message.startswith(f"{path}:3: ") and why in message and "\n" not in message
    assert not (tmp_path / "out" / "meta.json").exists()


def test_skip_bad_skips_and_counts(tmp_path: Path, capsys) -> None:
    good = ["fine\n", "more text"]
    lines = [
        json.dumps({"text": good[0]}),
        *(b for b, _ in BAD_LINES),
        json.dumps({"text": good[1]}),
    ]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tok = _tok()
    corpus = Corpus([path], skip_bad=True)
    data = prepare(corpus, tmp_path / "out", tok, val_fraction=0.2)
    assert corpus.skipped == {str(path): len(BAD_LINES)}
    ref = prepare([write_txt(tmp_path / "txt", good)], tmp_path / "ref", tok, val_fraction=0.2)
    for split in ("train", "val"):
        assert _tokens(data, split).tolist() == _tokens(ref, split).tolist()
    # the CLI prints the count
    out = tmp_path / "cli"
    argv = ["data", "prepare", "--input", str(path), "--char", "-o", str(out), "--no-progress"]
    assert main([*argv, "--skip-bad"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {len(BAD_LINES)} bad records" in err and f"{path}:2: not JSON" in err
    assert main([*argv, "--overwrite"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_json_array_bad_element_and_broken_array(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('[\n  {"text": "a"},\n  {"body": "b"},\n  {"text": "c"}\n]\n', "utf-8")
    with pytest.raises(InputFileError, match=rf"^{path}:3: no field 'text'"):
        prepare([path], tmp_path / "out", _tok())
    corpus = Corpus([path], skip_bad=True)
    assert [p.text for p in corpus.pieces()] == ["a", "c"] and corpus.skipped == {str(path): 1}
    for text, line in [('[{"text": "a"},\n {"text": "b"', 2), ('[{"text": "a"}\n {"text": 1}]', 2)]:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(InputFileError, match=rf"^{path}:{line}: not a JSON array"):
            prepare([path], tmp_path / "out", _tok(), overwrite=True)


def test_text_field_names_another_field(tmp_path: Path) -> None:
    tok = _tok()
    path = write_jsonl(tmp_path / "c.jsonl", DOCS, field="content")
    data = prepare(Corpus([path], text_field="content"), tmp_path / "out", tok, val_fraction=0)
    expected = [i for d in DOCS if d for i in [*tok.encode_ordinary(d), tok.special_tokens[EOT]]]
    assert _tokens(data, "train").tolist() == expected


def test_parquet_without_the_column_names_the_columns(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "c.parquet", DOCS)
    with pytest.raises(InputFileError, match=r"no column 'body'; its columns: n, text \("):
        prepare(Corpus([path], text_field="body"), tmp_path / "out", _tok())
    with pytest.raises(InputFileError, match=r"column 'n' holds int64, not strings"):
        prepare(Corpus([path], text_field="n"), tmp_path / "out", _tok())


def test_truncated_parquet_is_one_line(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "c.parquet", DOCS)
    data = path.read_bytes()
    for keep in (len(data) // 2, len(data) - 3, 5):
        path.write_bytes(data[:keep])
        with pytest.raises(InputFileError) as e:
            prepare([path], tmp_path / "out", _tok())
        assert str(e.value).startswith(f"{path}: not a readable Parquet file (")
        assert "\n" not in str(e.value)


def test_parquet_nulls_are_bad_records(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a", None, "b", None]}), path, row_group_size=3)
    with pytest.raises(InputFileError, match=rf"^{path}: row 1: the text is null"):
        prepare([path], tmp_path / "out", _tok())
    corpus = Corpus([path], skip_bad=True)
    assert [p.text for p in corpus.pieces()] == ["a", "b"]
    assert corpus.skipped == {str(path): 2}
    assert corpus.sizes() == [2] and corpus.skipped == {str(path): 2}  # counting pass


def test_datasets_missing_column_split_and_unreachable_name(tmp_path: Path, monkeypatch) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    saved = write_dataset(tmp_path / "saved", DOCS)
    with pytest.raises(InputFileError, match=r"no column 'body'; its columns: text, n"):
        Corpus([saved], text_field="body").sizes()
    both = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["a"]}),
         "test": datasets.Dataset.from_dict({"text": ["b", "c"]})}
    )  # fmt: skip
    both.save_to_disk(tmp_path / "dict")
    assert [p.text for p in Corpus([tmp_path / "dict"]).pieces()] == ["a"]  # train by default
    assert [p.text for p in Corpus([f"hf:{tmp_path / 'dict'}:test"]).pieces()] == ["b", "c"]
    with pytest.raises(GlassError, match=r"no split 'dev'; its splits: train, test$"):
        Corpus([f"hf:{tmp_path / 'dict'}:dev"]).sizes()
    # a hub name that cannot be reached: one line (offline here, as with no network)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    with pytest.raises(GlassError) as e:
        Corpus(["hf:no-such-owner/no-such-dataset:train"]).sizes()
    assert str(e.value).startswith("hf dataset 'no-such-owner/no-such-dataset': cannot load it (")
    assert "\n" not in str(e.value)


def test_a_missing_package_names_the_extra(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(
        GlassError, match=r"needs the pyarrow package: pip install 'glassgpt\[data\]'"
    ):
        require("pyarrow", "Parquet files")
    path = tmp_path / "c.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(GlassError, match=r"glassgpt\[data\]"):
        ParquetSource(path, "text")


# -- bounded memory ------------------------------------------------------------------------------


def _records(n: int, size: int) -> list[str]:
    return [f"record {i} " + "lorem ipsum é " * (size // 14) for i in range(n)]


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_json_readers_hold_one_record_at_a_time(tmp_path: Path, kind: str, monkeypatch) -> None:
    """Python's peak allocation while reading 3 MB of records stays below 100 kB (a few records)."""
    monkeypatch.setattr(records, "JSON_BLOCK", 16 << 10)
    docs = _records(1500, 2000)
    path = WRITERS[kind](tmp_path, docs)
    assert path.stat().st_size > 3_000_000
    corpus = Corpus([path])
    tracemalloc.start()
    try:
        n = sum(1 for p in corpus.pieces() if p.last)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == len(docs)
    assert peak < 100_000, peak


def _arrow_peak(path: Path) -> int:
    """Arrow's most allocated bytes, seen at every document read from a Parquet file."""
    source, peak = ParquetSource(path, "text"), 0
    base = pa.total_allocated_bytes()
    for _ in source.documents(BadRecords()):
        peak = max(peak, pa.total_allocated_bytes() - base)
    return peak


def test_parquet_reader_holds_a_row_group_and_a_batch(tmp_path: Path, monkeypatch) -> None:
    """Arrow holds one row group's column (read, decoded) and a batch of BATCH_ROWS rows: under
    three row groups' text, and no more for a file three times as long."""
    monkeypatch.setattr(records, "BATCH_ROWS", 100)
    docs = _records(12_000, 1000)
    group_bytes = sum(len(d.encode()) for d in docs[:500])
    short = write_parquet(tmp_path / "short.parquet", docs[:4000], row_group=500)
    long = write_parquet(tmp_path / "long.parquet", docs, row_group=500)
    assert pq.ParquetFile(long).metadata.num_row_groups == 24
    peak_short, peak_long = _arrow_peak(short), _arrow_peak(long)
    assert peak_long < 3 * group_bytes, (peak_long, group_bytes)
    assert peak_long < 1.2 * peak_short, (peak_long, peak_short)


def test_train_on_a_jsonl_file(tmp_path: Path) -> None:
    """``glassgpt train --data c.jsonl`` prepares the records' documents and trains."""
    docs = [f"def f{i}(x):\n    return x * {i}  # café\n" for i in range(300)]
    path = write_jsonl(tmp_path / "c.jsonl", docs, field="content")
    run = tmp_path / "run"
    sets = ["train.progress=false", "train.threads=1", "train.max_steps=3", "train.eval_every=3",
            "train.batch_size=2", "train.sample_tokens=0", "train.warmup_steps=1",
            "train.checkpoint_every=3", "model.n_ctx=16", "model.d_model=16", "model.n_layers=1",
            "data.text_field=content"]  # fmt: skip
    argv = ["train", "--preset", "cpu-tiny", "--data", str(path), "-o", str(run), "--set", *sets]
    assert main(argv) == 0
    data = DataDir.open(run / "data")
    tok = data.load_tokenizer()
    ref = prepare([write_txt(tmp_path / "txt", docs)], tmp_path / "ref", tok)
    for split in ("train", "val"):
        assert _tokens(data, split).tolist() == _tokens(ref, split).tolist()
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()][-1] == 3
