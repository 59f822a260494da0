"""Tokenizer speed: glassgpt beside tiktoken and HF tokenizers, in the same run.

    encode MB/s  = UTF-8 bytes of the corpus / median seconds to encode it
    decode MB/s  = the same bytes / median seconds to turn the ids back into bytes
    train s      = seconds to learn a vocabulary of N ids (glassgpt and HF BpeTrainer)

Encoding uses GPT-2's original files, read three ways: ``Tokenizer.from_gpt2``, a tiktoken
``Encoding`` built offline (mergeable_ranks from encoder.json), and an HF ``tokenizers`` BPE
with a ByteLevel pre-tokenizer. Their ids are checked equal in the same run.

The cold rows are repeated with byte-level BPE tokenizers glassgpt trains (patterns
``gpt2`` and ``gpt4``), beside tiktoken built from the same tokens.

Encoding is timed *cold*, as a user meets it: every repeat builds a fresh tokenizer object
of each kind (outside the timer) and times its first pass over the text, so no cache of
any library has seen the text (HF's BPE keeps a word cache; glassgpt's Python loop keeps
chunk caches); the three take turns within each repeat. The ``load`` row times building each from GPT-2's files until it can encode
(for glassgpt: reading, checks, and building its engine). The one figure timed with a cache
already filled is labelled ``warm``. Batches are the corpus cut into paragraphs.

The ``cold process`` rows time what a script meets: a fresh Python process per repeat that
imports the library, loads GPT-2 from its files, reads 1 MB of the corpus and encodes it
(seconds from the script's first line to its last; the interpreter's own start, the same
for both, is left out). tiktoken loads with its own ``data_gym_to_mergeable_bpe_ranks``.
glassgpt's Unicode class table is computed once per ``regex`` version and user, then read
from the user cache; the ``first ever`` row gives each process an empty cache folder.

    PYTHONPATH=src python bench/tokenizer.py                         # everything
    PYTHONPATH=src python bench/tokenizer.py --corpus shakespeare --train-sizes 4096
    PYTHONPATH=src python bench/tokenizer.py --no-train --repeats 3  # a quick run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GLASSGPT_SHARED_DATA", REPO.parent / "shared" / "data"))


def stdlib_sources(limit: int) -> str:
    """The first ``limit`` characters of the standard library's .py files (sorted paths)."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        size += len(parts[-1])
        if size >= limit:
            break
    return "".join(parts)[:limit]


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def cold(
    peers: list[tuple[Callable[[], Any], Callable[[Any], Any]]], repeats: int
) -> list[tuple[float, Any]]:
    """Per peer ``(make, run)``: median seconds of ``run(make())``, the object built untimed.

    Each repeat builds a fresh object of every peer and times one call on it; the peers
    take turns, in an order that flips each repeat, so that they meet the same load.
    """
    times: list[list[float]] = [[] for _ in peers]
    outs: list[Any] = [None] * len(peers)
    for r in range(repeats):
        order = list(range(len(peers)))
        for k in order if r % 2 == 0 else order[::-1]:
            make, run = peers[k]
            obj = make()
            start = time.perf_counter()
            outs[k] = run(obj)
            times[k].append(time.perf_counter() - start)
            del obj
    return [(statistics.median(t), out) for t, out in zip(times, outs)]


def glassgpt_gpt2(encoder_json: Path, vocab_bpe: Path, *, fast: bool = True) -> Any:
    """GPT-2 as a glassgpt Tokenizer, ready to encode (engine built when ``fast``)."""
    from glassgpt.tokenizer import Tokenizer

    tok = Tokenizer.from_gpt2(encoder_json, vocab_bpe)
    tok.fast = fast
    tok.engine()
    return tok


def build_tiktoken(encoder_json: Path) -> Any:
    """GPT-2 as a tiktoken Encoding, its mergeable ranks read from encoder.json."""
    import tiktoken
    from tiktoken_ext.openai_public import r50k_pat_str

    from glassgpt.tokenizer.files import read_json, str_to_token

    encoder = read_json(encoder_json)
    ranks = {str_to_token(t): i for t, i in encoder.items() if t != "<|endoftext|>"}
    return tiktoken.Encoding(
        "gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


def build_hf(encoder_json: Path, vocab_bpe: Path) -> Any:
    """GPT-2 as an HF tokenizers BPE with a ByteLevel pre-tokenizer and decoder."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    hf = HFTokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def bench_codec(
    name: str, text: str, tok: Any, tk: Any, hf: Any, repeats: int, threads: int
) -> list[tuple]:
    mb = len(text.encode("utf-8")) / 1e6
    docs = [d + "\n\n" for d in text.split("\n\n")]
    rows = []

    files = (SHARED / "gpt2" / "encoder.json", SHARED / "gpt2" / "vocab.bpe")

    def fresh_tok() -> Any:
        return glassgpt_gpt2(*files)

    def fresh_tk() -> Any:
        return build_tiktoken(files[0])

    def fresh_hf() -> Any:
        return build_hf(*files)

    (t_ours, ids), (t_tk, ids_tk), (t_hf, enc_hf) = cold(
        [
            (fresh_tok, lambda t: t.encode_ordinary(text)),
            (fresh_tk, lambda t: t.encode_ordinary(text)),
            (fresh_hf, lambda t: t.encode(text, add_special_tokens=False)),
        ],
        repeats,
    )
    same = ids == ids_tk == enc_hf.ids
    rows.append((name, "encode cold, 1 thread (MB/s)", mb / t_ours, mb / t_tk, mb / t_hf, same))
    ref = glassgpt_gpt2(*files, fast=False)
    t_ref, ids_ref = timed(lambda: ref.encode_ordinary(text), 1)
    t_warm, _ = timed(lambda: ref.encode_ordinary(text), 1)
    same = ids_ref == ids_tk
    rows.append((name, "  glassgpt Python loop, cold (1 run)", mb / t_ref, None, None, same))
    rows.append((name, "  glassgpt Python loop, warm (2nd run)", mb / t_warm, None, None, None))
    t_load, _ = timed(fresh_tok, repeats)
    t_load_tk, _ = timed(fresh_tk, repeats)
    t_load_hf, _ = timed(fresh_hf, repeats)
    rows.append((name, "load: files -> ready to encode (s)", t_load, t_load_tk, t_load_hf, None))

    t_ours, b_ours = timed(lambda: tok.encode_batch(docs, num_workers=threads), repeats)
    t_tk, b_tk = timed(lambda: tk.encode_ordinary_batch(docs, num_threads=threads), repeats)
    t_hf, b_hf = timed(lambda: hf.encode_batch(docs, add_special_tokens=False), repeats)
    same = b_ours == b_tk == [e.ids for e in b_hf]
    rows.append(
        (name, f"encode_batch, {threads} cores (MB/s)", mb / t_ours, mb / t_tk, mb / t_hf, same)
    )

    t_ours, text_ours = timed(lambda: tok.decode_bytes(ids), repeats)
    t_tk, text_tk = timed(lambda: tk.decode_bytes(ids), repeats)
    t_hf, text_hf = timed(lambda: hf.decode(ids), repeats)
    same = text_ours == text_tk == text_hf.encode("utf-8") == text.encode("utf-8")
    rows.append((name, "decode (MB/s)", mb / t_ours, mb / t_tk, mb / t_hf, same))
    return rows


COLD_OURS = """
import time
start = time.perf_counter()
from glassgpt.tokenizer import Tokenizer
tok = Tokenizer.from_gpt2({enc!r}, {bpe!r})
ids = tok.encode_ordinary(open({text!r}, encoding="utf-8").read())
print(time.perf_counter() - start, hash(tuple(ids)))
"""
COLD_TIKTOKEN = """
import time
start = time.perf_counter()
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str
ranks = data_gym_to_mergeable_bpe_ranks({bpe!r}, {enc!r})
enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                        special_tokens={{"<|endoftext|>": 50256}})
ids = enc.encode_ordinary(open({text!r}, encoding="utf-8").read())
print(time.perf_counter() - start, hash(tuple(ids)))
"""


def bench_cold_process(name: str, text: str, repeats: int, tmp: Path) -> list[tuple]:
    """Import + load GPT-2 + encode 1 MB, in a fresh process per repeat (seconds, medians)."""
    import subprocess

    sample = text.encode("utf-8")[:1_000_000].decode("utf-8", errors="ignore")
    path = tmp / f"{name}-1mb.txt"
    path.write_text(sample, encoding="utf-8")
    files = {
        "enc": str(SHARED / "gpt2" / "encoder.json"),
        "bpe": str(SHARED / "gpt2" / "vocab.bpe"),
    }
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TIKTOKEN_CACHE_DIR": ""}

    def run(code: str, **extra: str) -> tuple[float, int]:
        out = subprocess.run(
            [sys.executable, "-c", code.format(text=str(path), **files)],
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return float(out[0]), int(out[1])

    warm_cache: dict[str, str] = {"GLASSGPT_CACHE_DIR": str(tmp / "classes")}
    run(COLD_OURS, **warm_cache)  # the once-per-user table
    ours, theirs, first = [], [], []
    for r in range(repeats):
        a = run(COLD_OURS, **warm_cache)
        b = run(COLD_TIKTOKEN)
        c = run(COLD_OURS, GLASSGPT_CACHE_DIR=str(tmp / f"empty-{r}"))
        ours.append(a[0]), theirs.append(b[0]), first.append(c[0])
        same = a[1] == b[1] == c[1]  # hashes of the ids
    t_ours, t_tk = statistics.median(ours), statistics.median(theirs)
    return [
        (name, "cold process: load + encode 1 MB (s)", t_ours, t_tk, None, same),
        (
            name,
            "  the same, first ever (empty cache) (s)",
            statistics.median(first),
            t_tk,
            None,
            same,
        ),
    ]


def bench_trained(name: str, text: str, vocab_size: int, repeats: int) -> list[tuple]:
    """Cold encoding with tokenizers glassgpt trains (each pattern), beside tiktoken built from them.

    Trained on the first 1 MB of Tiny Shakespeare (not on ``text``); HF has no row here.
    """
    from glassgpt.tokenizer import Tokenizer
    from glassgpt.tokenizer.engine import to_tiktoken_encoding

    sample = (SHARED / "tinyshakespeare.txt").read_text(encoding="utf-8")[:1_000_000]
    mb = len(text.encode("utf-8")) / 1e6
    rows = []
    for pattern in ("gpt2", "gpt4"):
        trained = Tokenizer.train([sample], vocab_size, pattern=pattern)
        saved = trained.to_dict()

        def fresh_tok(saved: dict = saved) -> Any:
            tok = Tokenizer.from_dict(saved)
            tok.engine()
            return tok

        (t_ours, ids), (t_tk, ids_tk) = cold(
            [
                (fresh_tok, lambda t: t.encode_ordinary(text)),
                (lambda t=trained: to_tiktoken_encoding(t), lambda t: t.encode_ordinary(text)),
            ],
            repeats,
        )
        what = f"trained {pattern}, {vocab_size} ids: cold (MB/s)"
        rows.append((name, what, mb / t_ours, mb / t_tk, None, ids == ids_tk))
    return rows


def bench_train(name: str, text: str, sizes: list[int], tmp: Path) -> list[tuple]:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    from glassgpt.tokenizer import Tokenizer

    rows = []
    for size in sizes:
        start = time.perf_counter()
        ours = Tokenizer.train([text], size, pattern="gpt2")
        t_ours = time.perf_counter() - start

        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        start = time.perf_counter()
        hf.train_from_iterator([text], trainer=trainer)
        t_hf = time.perf_counter() - start
        hf_merges = [
            tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in _hf_merges(hf, tmp)
        ]
        from glassgpt.tokenizer.files import token_to_str

        our_merges = [
            (token_to_str(ours.vocab[a]), token_to_str(ours.vocab[b])) for a, b in ours.merges
        ]
        rows.append(
            (name, f"train to {size:,} ids (s)", t_ours, None, t_hf, our_merges == hf_merges)
        )
    return rows


def _hf_merges(hf: Any, tmp: Path) -> list[Any]:
    import json

    path = tmp / "hf.json"
    hf.save(str(path))
    return json.loads(path.read_text(encoding="utf-8"))["model"]["merges"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--corpus", nargs="+", choices=["shakespeare", "stdlib"], default=["shakespeare", "stdlib"]
    )
    p.add_argument("--stdlib-mb", type=float, default=20.0, help="MB of standard-library sources")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="cores for the batch rows"
    )
    p.add_argument(
        "--train-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 32768]
    )
    p.add_argument("--no-train", action="store_true")
    p.add_argument(
        "--trained-size", type=int, default=8192, help="ids of the tokenizers trained for cold rows"
    )
    args = p.parse_args(argv)

    encoder_json, vocab_bpe = SHARED / "gpt2" / "encoder.json", SHARED / "gpt2" / "vocab.bpe"
    tok = glassgpt_gpt2(encoder_json, vocab_bpe)
    tk, hf = build_tiktoken(encoder_json), build_hf(encoder_json, vocab_bpe)
    corpora = {
        "shakespeare": lambda: (SHARED / "tinyshakespeare.txt").read_text(encoding="utf-8"),
        "stdlib": lambda: stdlib_sources(int(args.stdlib_mb * 1e6)),
    }
    print(
        f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}, "
        f"repeats {args.repeats} (medians)"
    )
    rows = []
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.corpus:
            text = corpora[name]()
            rows += bench_codec(name, text, tok, tk, hf, args.repeats, args.threads)
            rows += bench_cold_process(name, text, args.repeats, Path(tmp))
            rows += bench_trained(name, text, args.trained_size, args.repeats)
            if not args.no_train:
                rows += bench_train(name, text, args.train_sizes, Path(tmp))
    header = f"{'corpus':<12} {'measure':<36} {'glassgpt':>9} {'tiktoken':>9} {'HF':>9} {'vs tiktoken':>11} {'vs HF':>7}  same ids"
    print(header)
    print("-" * len(header))
    for name, what, ours, t_tk, t_hf, same in rows:
        seconds = what.endswith("(s)")

        def ratio(peer: float | None, ours: float = ours, seconds: bool = seconds) -> str:
            return "" if peer is None else f"{(peer / ours if seconds else ours / peer):.2f}x"

        def fmt(v: float | None) -> str:
            return "" if v is None else f"{v:9.2f}"

        flag = "" if same is None else ("yes" if same else "NO")
        print(
            f"{name:<12} {what:<36} {fmt(ours):>9} {fmt(t_tk):>9} {fmt(t_hf):>9} "
            f"{ratio(t_tk):>11} {ratio(t_hf):>7}  {flag}"
        )
    print(
        "ratios: glassgpt speed / peer speed (>1 = glassgpt faster); 'same ids' for train rows: "
        "merges equal to HF BpeTrainer's"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
