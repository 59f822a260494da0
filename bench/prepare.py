"""``glassgpt data prepare`` end to end, beside tiktoken's batch encoder, in the same run.

    prepare MB/s   = corpus bytes / seconds of ``glassgpt data prepare`` (a fresh process:
                     start, load the tokenizer, read, encode on all cores, write shards)
    tiktoken MB/s  = corpus bytes / seconds of ``encode_ordinary_batch`` over all documents
                     on all cores (encode only: the texts already in memory)

The corpus is generated: the standard library's .py files in sorted order, repeated until
the size is reached, each copy a document (file) of its own and varied so that no two are
equal: a header line naming the copy, then the file's lines rotated by the copy number.
The tokenizer is GPT-2's (from ../shared/data/gpt2). The ids of the shards are checked
against tiktoken's (same order, ``<|endoftext|>`` after each document). Peak memory is the
prepare process's maximum RSS (``getrusage(RUSAGE_CHILDREN)``).

    PYTHONPATH=src python bench/prepare.py                 # 100 MB
    PYTHONPATH=src python bench/prepare.py --mb 1000 --no-check   # memory on 1 GB
"""

from __future__ import annotations

import argparse
import os
import resource
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (100)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-check", action="store_true", help="skip the id comparison")
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

        cmd = [sys.executable, "-m", "glassgpt", "data", "prepare", "--input", str(tmp / "corpus")]
        cmd += ["--tokenizer", str(tmp / "gpt2.json"), "--output", str(tmp / "out")]
        cmd += ["--workers", str(args.workers), "--val-fraction", "0", "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        start = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        t_prepare = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

        same = "not checked"
        if not args.no_check:
            texts = [p.read_text(encoding="utf-8") for p in paths]
            tk = build_tiktoken(encoder_json)
            start = time.perf_counter()
            ids = tk.encode_ordinary_batch(texts, num_threads=args.workers)
            t_tk = time.perf_counter() - start
            expected = np.fromiter((i for doc in ids for i in [*doc, 50256]), dtype=np.int64)
            shards = sorted((tmp / "out").glob("train_*.bin"))
            got = np.concatenate([np.fromfile(s, dtype=np.uint16) for s in shards])
            same = "yes" if np.array_equal(got.astype(np.int64), expected) else "NO"
        print(f"{'measure':<52} {'seconds':>8} {'MB/s':>7}")
        print(f"{'glassgpt data prepare, end to end':<52} {t_prepare:8.2f} {mb / t_prepare:7.2f}")
        if not args.no_check:
            what = f"tiktoken encode_ordinary_batch, {args.workers} threads"
            print(f"{what:<52} {t_tk:8.2f} {mb / t_tk:7.2f}")
            print(f"ratio (tiktoken s / prepare s): {t_tk / t_prepare:.2f}x; same ids: {same}")
        print(f"prepare peak RSS: {rss:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
