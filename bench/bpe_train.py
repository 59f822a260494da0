"""BPE training speed: glassgpt (Python) beside Hugging Face tokenizers' BpeTrainer (Rust).

Trains a byte-level BPE vocabulary with GPT-2's split on the Python standard library's
sources (the first ``--mb`` MB of ``*.py`` files in path order) and/or tinyshakespeare,
and prints, per vocabulary size, the median of ``--repeats`` runs:

- end to end (text → vocabulary): ``Tokenizer.train`` vs ``BpeTrainer`` (fed one text per
  file, so it may use every core);
- the merge loop alone: ``train_merges`` on the chunk counts, beside an estimate of
  BpeTrainer's (its time minus its time with vocab_size=256, which only splits and counts);

and checks in the same run that both learn the same merges.

    PYTHONPATH=src python bench/bpe_train.py --vocab 4096 32768 --mb 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from glassgpt.interop.hf_tokenizers import unicode_to_bytes
from glassgpt.tokenizer import Tokenizer
from glassgpt.tokenizer.bpe_train import train_merges

SHAKESPEARE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"


def stdlib_texts(mb: float) -> list[str]:
    """The first ``mb`` MB (UTF-8) of the standard library's ``*.py`` files, one str per file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text.encode())
        if total >= mb * 1e6:
            break
    return texts


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def hf_train(texts: list[str], vocab_size: int) -> list[tuple[bytes, bytes]]:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    return [(unicode_to_bytes(x), unicode_to_bytes(y)) for x, y in pairs]


def hf_chunk_counts(texts: list[str]) -> Counter[bytes]:
    from tokenizers import pre_tokenizers

    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    counts: Counter[bytes] = Counter()
    for text in texts:
        counts.update(unicode_to_bytes(piece) for piece, _ in split.pre_tokenize_str(text))
    return counts


def bench(name: str, texts: list[str], vocab_sizes: list[int], repeats: int) -> None:
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"\n{name}: {mb:.2f} MB, {len(texts)} texts")
    hf_feed, _ = median_time(lambda: hf_train(texts, 256), repeats)
    counts = hf_chunk_counts(texts)
    print(f"  {len(counts)} distinct chunks; BpeTrainer pre-tokenize+count alone: {hf_feed:.2f} s")
    header = (
        f"  {'vocab':>6} {'merges':>7} | {'glassgpt':>9} {'HF':>7} {'ratio':>6} | "
        f"{'merge loop':>10} {'HF loop≈':>8} | same merges"
    )
    print(header)
    for vocab in vocab_sizes:
        ours_total, tok = median_time(lambda v=vocab: Tokenizer.train(texts, v), repeats)
        hf_total, theirs = median_time(lambda v=vocab: hf_train(texts, v), repeats)
        ours_loop, merges = median_time(lambda v=vocab: train_merges(counts, v - 256), repeats)
        hf_loop = hf_total - hf_feed  # an estimate: two noisy medians
        trained = [(tok.vocab[a], tok.vocab[b]) for a, b in tok.merges]  # type: ignore[union-attr]
        same = merges == theirs and trained == theirs
        print(
            f"  {vocab:>6} {len(merges):>7} | {ours_total:>8.2f}s {hf_total:>6.2f}s "  # type: ignore[arg-type]
            f"{ours_total / hf_total:>5.2f}x | {ours_loop:>9.2f}s {max(hf_loop, 0):>7.2f}s | {same}"
        )
    print("  ratio = glassgpt time / HF time (below 1: glassgpt is faster);")
    print("  HF loop≈ = HF total − HF alone at vocab 256 (its split and count)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--mb", type=float, default=5.0, help="MB of stdlib sources")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corpus", choices=["stdlib", "shakespeare", "both"], default="both")
    args = parser.parse_args()
    if args.corpus in ("stdlib", "both"):
        bench("Python stdlib", stdlib_texts(args.mb), args.vocab, args.repeats)
    if args.corpus in ("shakespeare", "both") and SHAKESPEARE.is_file():
        bench(
            "tinyshakespeare", [SHAKESPEARE.read_text(encoding="utf-8")], args.vocab, args.repeats
        )


if __name__ == "__main__":
    main()
