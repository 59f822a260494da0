"""Top-p's drop mask on a server step's logits: the compiled kernel (``kernels.top_p_drop``: a
histogram of the values' bits, a sort of the few near the cut) against PyTorch's sort
(``filters.sorted_drop``, the fallback and what ``top_p_filter`` did); and a server step's
whole top-p (``rows._top_p``: softmax, mask, −∞ fill) with the kernel and without it (its
partial top-k where the cut is among the 256 largest, else the sort: what it did before).
Then top-k's fill (``rows._top_k``) by its kernel (``kernels.top_k_fill``: a histogram of the
values' order keys) and by ``torch.topk`` (the fallback), with k = 0, 0, 20, 40 by row (the
mix ``bench/serve.py`` sends: half the rows use top-k).

    python bench/topp.py                     # [8, 50257], flat and peaked rows, 1 and 2 threads
    python bench/topp.py --rows 32 --vocab 65 --repeats 200

Rows: softmax of N(0, σ²) logits, σ = 0.5 (flat: random weights' logits, the nucleus spans
most of the vocabulary), 3 and 12 (peaked); each row its own p from 0.8, 0.9, 0.95. Each
way's masks are checked equal first. Printed: medians of CPU time (process_time: all
threads) and of wall time per call, the first (cold) call's wall time, and the ratio
sort / kernel. ``uptime`` before and after: on a shared machine, prefer the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from glassgpt import kernels
from glassgpt.sample import rows as sample_rows
from glassgpt.sample.filters import sorted_drop


def timed(fn, args: tuple, repeats: int) -> tuple[float, float, float]:
    """(cold wall, median CPU, median wall) seconds of fn(*args)."""
    t = time.perf_counter()
    fn(*args)
    cold = time.perf_counter() - t
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        fn(*args)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return cold, statistics.median(cpu), statistics.median(wall)


def fallback(z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    with kernels.hidden("_rowwise"):
        return sample_rows._top_p(z, p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.8, 0.9, 0.95])[torch.arange(args.rows) % 3]
    print(f"top-p drop mask, [{args.rows}, {args.vocab}] float32, p in 0.8/0.9/0.95; ms a call "
          "(median CPU / median wall / cold wall)")  # fmt: skip
    print("| rows | threads | mask: kernel | mask: sort | sort / kernel (CPU) "
          "| rows._top_p: kernel | rows._top_p: without | without / kernel (CPU) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, sigma in (("flat σ 0.5", 0.5), ("peaked σ 3", 3.0), ("peaked σ 12", 12.0)):
        z = torch.randn(args.rows, args.vocab, generator=gen) * sigma
        probs = torch.softmax(z, dim=-1)
        got = kernels.top_p_drop(probs, p)
        assert got is not None and torch.equal(got, sorted_drop(probs, p)), "masks differ"
        assert torch.equal(fallback(z, p), z.masked_fill(got, -torch.inf)), "fallback differs"
        kept = int((~got).sum()) / args.rows
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            k = timed(kernels.top_p_drop, (probs, p), args.repeats)
            s = timed(sorted_drop, (probs, p), args.repeats)
            w = timed(sample_rows._top_p, (z, p), args.repeats)
            f = timed(fallback, (z, p), args.repeats)

            print(f"| {name} ({kept:.0f} kept a row) | {threads} | {ms(k)} | {ms(s)} "
                  f"| {s[1] / k[1]:.1f}× | {ms(w)} | {ms(f)} | {f[1] / w[1]:.1f}× |")  # fmt: skip
    k = torch.tensor([0, 0, 20, 40])[torch.arange(args.rows) % 4]
    print(f"\ntop-k fill, [{args.rows}, {args.vocab}] float32, k 0/0/20/40 by row; ms a call "
          "(median CPU / median wall / cold wall)")  # fmt: skip
    print("| rows | threads | kernel | torch.topk | topk / kernel (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for name, sigma in (("flat σ 0.5", 0.5), ("peaked σ 3", 3.0), ("peaked σ 12", 12.0)):
        z = torch.randn(args.rows, args.vocab, generator=gen) * sigma
        assert torch.equal(sample_rows._top_k(z, k), topk_fallback(z, k)), "fills differ"
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            a = timed(sample_rows._top_k, (z, k), args.repeats)
            b = timed(topk_fallback, (z, k), args.repeats)
            print(f"| {name} | {threads} | {ms(a)} | {ms(b)} | {b[1] / a[1]:.1f}× |")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def ms(t: tuple[float, float, float]) -> str:
    return f"{t[1] * 1e3:.2f} / {t[2] * 1e3:.2f} / {t[0] * 1e3:.2f}"


def topk_fallback(z: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    with kernels.hidden("_rowwise"):
        return sample_rows._top_k(z, k)


if __name__ == "__main__":
    main()
