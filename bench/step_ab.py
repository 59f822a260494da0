"""Replayed decoding steps of two checkouts, alternated process by process (an A/B).

    PYTHONPATH=src python bench/step_ab.py --other /work/main [--dtype bf16] [--rounds 6]
        [--bursts 5] [--tokens 128] [--threads 2]

Each round runs this checkout and --other once each (the order alternating), each in its own
process: random weights at SmolLM2-135M's shape (``bench/families.py``), cast to --dtype, a
16-token prompt, then --bursts bursts of --tokens replayed steps, each after half a second of
rest (as ``bench/generate.measure`` rests before a timed call, so the worker threads have
gone to sleep). Printed per process: the median ms a step over its bursts, the slowest
burst's, the thread's CPU time a step, and where the checkout's ``_gemv`` counts them, the
products that ran on both threads and on one (``_parallel.h``'s pacing). Then per round the
ratio other / this, and their median: ratios from the same minutes, as the host's load and
memory bandwidth move between rounds (the load average is printed with each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import json, os, statistics, sys, time
import torch
sys.path.insert(0, {bench!r})
from families import SHAPES, random_model
import glassgpt
assert glassgpt.__file__.startswith({src!r}), glassgpt.__file__
from glassgpt.kernels.extensions import extension
from glassgpt.model.precision import cast
from glassgpt.sample.engine import Decoder
torch.set_num_threads({threads})
gemv = extension("_gemv")
counts = getattr(gemv, "pacing_counts", lambda: (0, 0, 0))
decoder = Decoder.start(cast(random_model(SHAPES["smollm2-135m"][0]), {dtype!r}), 1, 16 + {bursts} * {tokens} + 8)
with torch.inference_mode():
    decoder.model(torch.arange(16)[None], cache=decoder.cache)
decoder.step([5])
c0, bursts, cpu = counts(), [], 0
for b in range({bursts}):
    time.sleep(0.5)
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    for i in range({tokens}):
        decoder.step([(7 * i + b) % 1000])
    bursts.append((time.perf_counter_ns() - t) / {tokens} / 1e6)
    cpu += (time.thread_time_ns() - c) / {tokens} / 1e6
par, solo, windows = (b - a for a, b in zip(c0, counts()))
print(json.dumps(dict(ms=statistics.median(bursts), worst=max(bursts), cpu=cpu / {bursts},
                      parallel=par, solo=solo, windows=windows, why=decoder.why)))
"""


def run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    code = CHILD.format(bench=str(tree / "bench"),  # its own shapes, its own src/
                         threads=args.threads, dtype=args.dtype,
                        bursts=args.bursts, tokens=args.tokens, src=str(tree / "src"))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout (its src/)")
    p.add_argument(
        "--this",
        type=Path,
        default=HERE.parent,
        help="this checkout (a check: --this and --other the same)",
    )
    p.add_argument("--dtype", default="bf16", choices=["float32", "bf16", "int8"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    this = args.this
    print(f"{args.dtype}, {args.threads} threads, this {this} against {args.other}")
    print(
        "| round | load | tree | ms a step | slowest burst | CPU ms a step | products 2 threads / 1 |"
    )
    print("|---:|---:|---|---:|---:|---:|---|")
    ratios = []
    for r in range(args.rounds):
        order = [("this", this), ("other", args.other)]
        got = {}
        for name, tree in order if r % 2 == 0 else order[::-1]:
            got[name] = res = run(tree, args)
            load = os.getloadavg()[0]
            par = f"{res['parallel']} / {res['solo']}" if res["parallel"] + res["solo"] else "–"
            print(f"| {r} | {load:.2f} | {name} | {res['ms']:.2f} | {res['worst']:.2f} | "
                  f"{res['cpu']:.2f} | {par} |", flush=True)  # fmt: skip
            time.sleep(1)
        ratios.append(got["other"]["ms"] / got["this"]["ms"])
    print("\nother / this, per round: " + ", ".join(f"{x:.2f}" for x in ratios))
    print(f"median {statistics.median(ratios):.2f}×")


if __name__ == "__main__":
    main()
