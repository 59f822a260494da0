"""``glassgpt data prepare`` end to end, beside tiktoken's batch encoder, in the same run.

    prepare MB/s   = corpus bytes / seconds of ``glassgpt data prepare`` (a fresh process:
                     start, load the tokenizer, read, encode on all cores, write shards)
    tiktoken MB/s  = corpus bytes / seconds of ``encode_ordinary_batch`` over all documents
                     on all cores (encode only: the texts already in memory)
    format rows    = the same documents as one JSON Lines file and one Parquet file (row
                     groups of 512 documents), prepared the same way; MB/s counts the text
                     bytes, and the ratio is to the rate of the text files

The text, JSON Lines and Parquet runs take turns, ``--repeats`` times each; the median is
reported. Their shards must be identical (checked).

The corpus is generated: the standard library's .py files in sorted order, repeated until
the size is reached, each copy a document (file) of its own and varied so that no two are
equal: a header line naming the copy, then the file's lines rotated by the copy number.
The tokenizer is GPT-2's (from ../shared/data/gpt2). The ids of the shards are checked
against tiktoken's (same order, ``<|endoftext|>`` after each document). Peak memory is the
prepare process's maximum RSS (``getrusage(RUSAGE_CHILDREN)``).

    PYTHONPATH=src python bench/prepare.py                 # 100 MB
    PYTHONPATH=src python bench/prepare.py --mb 1000 --no-check   # memory on 1 GB
    PYTHONPATH=src python bench/prepare.py --mb 20 --formats txt,jsonl,parquet --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from tokenizer import SHARED, build_tiktoken  # noqa: E402


def write_corpus(folder: Path, size: int) -> list[Path]:
    """Documents of varied stdlib sources in ``folder``, ``size`` UTF-8 bytes in all."""
    sources = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            sources.append((path, path.read_text(encoding="utf-8").splitlines(keepends=True)))
        except (UnicodeDecodeError, OSError):
            continue
    paths, total, copy = [], 0, 0
    while total < size:
        for path, lines in sources:
            if not lines:
                continue
            k = copy % len(lines)
            text = f"# copy {copy} of {path.name}\n" + "".join(lines[k:] + lines[:k])
            data = text.encode("utf-8")[: size - total]
            data = data.decode("utf-8", errors="ignore").encode("utf-8")
            paths.append(folder / f"doc{len(paths):07d}.py")
            paths[-1].write_bytes(data)
            total += len(data)
            if total >= size:
                break
        copy += 1
    return paths


def write_formats(paths: list[Path], folder: Path, formats: list[str]) -> dict[str, Path]:
    """The documents as inputs of each format: the folder of text files, one .jsonl, one
    .parquet (row groups of 512 documents)."""
    inputs = {"txt": paths[0].parent}
    if "jsonl" in formats:
        inputs["jsonl"] = folder / "corpus.jsonl"
        with inputs["jsonl"].open("w", encoding="utf-8") as f:
            for p in paths:
                f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
    if "parquet" in formats:
        import pyarrow as pa
        import pyarrow.parquet as pq

        inputs["parquet"] = folder / "corpus.parquet"
        with pq.ParquetWriter(inputs["parquet"], pa.schema([("text", pa.string())])) as w:
            for i in range(0, len(paths), 512):
                texts = [p.read_text(encoding="utf-8") for p in paths[i : i + 512]]
                w.write_table(pa.table({"text": texts}))
    return inputs


def run_prepare(inp: Path, tok: Path, out: Path, args: argparse.Namespace) -> float:
    """Seconds of one ``glassgpt data prepare`` in a fresh process."""
    cmd = [sys.executable, "-m", "glassgpt", "data", "prepare", "--input", str(inp)]
    cmd += ["--tokenizer", str(tok), "--output", str(out), "--overwrite"]
    cmd += ["--workers", str(args.workers), "--val-fraction", str(args.val_fraction)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    start = time.perf_counter()
    subprocess.run([*cmd, "--no-progress"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (100)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-check", action="store_true", help="skip the id comparison")
    p.add_argument(
        "--formats", default="txt", help="inputs to time: txt,jsonl,parquet (default: txt)"
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per format; the median (1)")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        help="0: one pass; > 0: records are counted first (a second pass)",
    )
    args = p.parse_args(argv)

    from glassgpt.tokenizer import Tokenizer

    encoder_json, vocab_bpe = SHARED / "gpt2" / "encoder.json", SHARED / "gpt2" / "vocab.bpe"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "corpus").mkdir()
        paths = write_corpus(tmp / "corpus", int(args.mb * 1e6))
        mb = sum(p.stat().st_size for p in paths) / 1e6
        Tokenizer.from_gpt2(encoder_json, vocab_bpe).save(tmp / "gpt2.json")
        print(
            f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, "
            f"{mb:.1f} MB in {len(paths)} documents, {args.workers} workers"
        )

        formats = args.formats.split(",")
        inputs = write_formats(paths, tmp, formats)
        times: dict[str, list[float]] = {f: [] for f in formats}
        for _ in range(args.repeats):
            for f in formats:
                times[f].append(run_prepare(inputs[f], tmp / "gpt2.json", tmp / f"out_{f}", args))
        t = {f: statistics.median(v) for f, v in times.items()}
        t_prepare = t[formats[0]]
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        shards = {f: sorted((tmp / f"out_{f}").glob("*_*.bin")) for f in formats}
        ref = [s.read_bytes() for s in shards[formats[0]]]
        same_format = {f: [s.read_bytes() for s in shards[f]] == ref for f in formats}

        same = "not checked"
        if not args.no_check:
            texts = [p.read_text(encoding="utf-8") for p in paths]
            tk = build_tiktoken(encoder_json)
            start = time.perf_counter()
            ids = tk.encode_ordinary_batch(texts, num_threads=args.workers)
            t_tk = time.perf_counter() - start
            expected = np.fromiter((i for doc in ids for i in [*doc, 50256]), dtype=np.int64)
            train = sorted((tmp / f"out_{formats[0]}").glob("train_*.bin"))
            val = sorted((tmp / f"out_{formats[0]}").glob("val_*.bin"))
            got = np.concatenate([np.fromfile(s, dtype=np.uint16) for s in train + val])
            same = "yes" if np.array_equal(got.astype(np.int64), expected) else "NO"
        print(f"{'measure':<52} {'seconds':>8} {'MB/s':>7} {'rate/text':>9}")
        for f in formats:
            what = f"glassgpt data prepare, end to end, {f}"
            print(f"{what:<52} {t[f]:8.2f} {mb / t[f]:7.2f} {t_prepare / t[f]:9.3f}")
        if len(formats) > 1:
            runs = (f"{f} " + " ".join(f"{x:.2f}" for x in times[f]) for f in formats)
            print(f"runs (s): {' | '.join(runs)}")
            same_as = (f"{f} {'yes' if same_format[f] else 'NO'}" for f in formats[1:])
            print(f"same shards as {formats[0]}: {', '.join(same_as)}")
        if not args.no_check:
            what = f"tiktoken encode_ordinary_batch, {args.workers} threads"
            print(f"{what:<52} {t_tk:8.2f} {mb / t_tk:7.2f}")
            print(f"ratio (tiktoken s / prepare s): {t_tk / t_prepare:.2f}x; same ids: {same}")
        print(f"prepare peak RSS: {rss:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
