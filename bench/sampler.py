"""A server step's sampling (``glassgpt.sample.rows.Rows.sample``) on [B, V] logits, this tree
against another (``--against DIR``, say a worktree at main), each in its own process, in turn.

    python bench/sampler.py --against ../main                      # [8, 65] and [8, 50257]
    python bench/sampler.py --against ../main --rows 8 --vocab 50257 --rounds 5

Settings as ``bench/serve.py`` sends them: ``uniform`` (every row at temperature 1) and
``mixed`` (each row its own temperature, greedy included, top-p, top-k, min-p, penalties and
a logit bias). One thread (``torch.set_num_threads(1)``: the server samples on the
scheduler's thread alone, ``serve.cores``). Each round runs both trees once, a process each,
and each process reports the median CPU time of ``--repeats`` calls after a warm-up. With
``--cold``, a 64 MB buffer is read between calls, as a server's step streams its weights
through the caches before each sampling (PyTorch's code and the sampler's tensors are then
cold, and each PyTorch operation costs more). Printed: per round each tree's ms a call, and
the median ratio other / this (above 1: this tree samples faster). Nothing is asserted;
``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.rows import Rows

REPO = Path(__file__).resolve().parents[1]
MIXED = {  # as bench/serve.py's
    "temperature": [0.0, 0.5, 0.7, 0.9, 1.0, 1.2],
    "top_p": [None, 0.95, 0.9, 0.8],
    "top_k": [None, None, 20, 40],
    "min_p": [None, None, 0.05],
    "presence_penalty": [0.0, 0.0, 0.5],
    "frequency_penalty": [0.0, 0.0, 0.3],
    "repetition_penalty": [1.0, 1.0, 1.1],
}


def measure(rows: int, vocab: int, mixed: bool, repeats: int, cold: bool) -> float:
    """Median CPU seconds of one ``Rows.sample`` call in this process's glassgpt."""
    torch.set_num_threads(1)
    rng = random.Random(0)
    sampler = Rows(rows, vocab)
    for b in range(rows):
        if mixed:
            cfg = {k: rng.choice(v) for k, v in MIXED.items()}
            bias = {rng.randrange(vocab): 2.0} if rng.random() < 0.25 else {}
            sampling = SamplingConfig(**cfg, logit_bias=bias)
        else:
            sampling = SamplingConfig(temperature=1.0)
        sampler.set(b, sampling, seed=b, history=[rng.randrange(vocab) for _ in range(32)])
    gen = torch.Generator().manual_seed(0)
    logits = [torch.randn(rows, vocab, generator=gen) * 2 for _ in range(4)]
    flush = torch.ones(16 * 2**20) if cold else None
    for i in range(5):
        sampler.sample(logits[i % 4])
    times = []
    for i in range(repeats):
        if flush is not None:
            float(flush.sum())
        t = time.process_time()
        sampler.sample(logits[i % 4])
        times.append(time.process_time() - t)
    return statistics.median(times)


def run(tree: Path, args: argparse.Namespace, vocab: int, mixed: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(args.rows), str(vocab),
           str(int(mixed)), str(args.repeats), str(int(args.cold))]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", type=Path, help="the other tree (its src/): required")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--vocab", default="65,50257", help="comma-separated vocabulary sizes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--cold", action="store_true", help="read 64 MB between calls")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        rows, vocab, mixed, repeats, cold = (int(x) for x in args.child)
        print(json.dumps(measure(rows, vocab, bool(mixed), repeats, bool(cold))))
        return
    if args.against is None or not (args.against / "src" / "glassgpt").is_dir():
        p.error("--against: a tree with src/glassgpt (say a worktree at main)")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    mine, other = REPO, args.against.resolve()
    print(
        f"Rows.sample, {args.rows} rows, one thread, median CPU ms a call"
        f"{' (caches flushed between calls)' if args.cold else ''}: {mine} against {other}\n"
    )
    print("| vocabulary | settings | round | this tree | other | other / this |")
    print("|---:|---|---:|---:|---:|---:|")
    for vocab in (int(v) for v in args.vocab.split(",")):
        for mixed in (False, True):
            ratios = []
            for r in range(args.rounds):
                a, b = run(mine, args, vocab, mixed), run(other, args, vocab, mixed)
                ratios.append(b / a)
                print(f"| {vocab} | {'mixed' if mixed else 'uniform'} | {r} | {1e3 * a:.3f} | "
                      f"{1e3 * b:.3f} | {b / a:.2f} |")  # fmt: skip
            print(f"| {vocab} | {'mixed' if mixed else 'uniform'} | median | | | "
                  f"**{statistics.median(ratios):.2f}** |")  # fmt: skip
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
