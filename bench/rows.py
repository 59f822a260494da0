"""Products of many rows on packed float32 weights: a server's decoding steps (9-32 rows) and
its prompts (33-256 rows), one thread, CPU time, on a model's weight shapes (random weights).

    python bench/rows.py                          # shakespeare and GPT-2-small shapes
    python bench/rows.py --shapes shakespeare --repeats 5

1. Steps: every product of one decoding step (each layer's W_QKV, W_O, W_in, W_out and the
   unembedding) for 9, 16, 24 and 32 rows, by ``gemv_rows`` (the rows kernel, which streams
   W once for all rows) and by ``gemv_panels`` in blocks of ``panels_rows()`` rows (one
   pass over the panel copy a block; what ``glassgpt.kernels.dense`` takes now), the two
   interleaved, medians of CPU time; the ratio rows / panels (above 1: the panels win).
2. Prompts: the same products through oneDNN at row counts 33-256, exact against rounded up
   (``onednn.bucket_rows``, what ``onednn.linear`` computes now): the time ratio over a few
   counts, and the growth of the process's RSS over every count 33-256 (each in a fresh
   process: the memory oneDNN keeps per shape).
Nothing is asserted; ``uptime`` is printed before and after.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

from glassgpt.kernels import dense, onednn
from glassgpt.kernels.extensions import extension

SHAPES = {"shakespeare": (384, 6, 65), "gpt2": (768, 12, 50257)}  # d_model, layers, vocab


def _weights(d: int, layers: int, vocab: int) -> list[torch.Tensor]:
    one = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
    gen = torch.Generator().manual_seed(0)
    Ws = [torch.randn(*s, generator=gen) * 0.02 for _ in range(layers) for s in one]
    return [*Ws, torch.randn(d, vocab, generator=gen) * 0.02]


def _cpu(fn, *args) -> float:
    t = time.process_time()
    fn(*args)
    return time.process_time() - t


def _by_rows(g, x: torch.Tensor, y: torch.Tensor, Ws: list[torch.Tensor], M: int) -> None:
    """Every W's product of M rows of x by ``gemv_rows`` (W streamed once for all rows)."""
    for W in Ws:
        K, N = W.shape
        g.gemv_rows(x.data_ptr(), W.data_ptr(), 0, y.data_ptr(), M, K, N, 1)


def _by_panels(g, x: torch.Tensor, y: torch.Tensor, Ps: list[torch.Tensor], Ws, M: int) -> None:
    """Every W's product of M rows of x by ``gemv_panels``, ``panels_rows()`` rows a call."""
    block = g.panels_rows()
    for W, P in zip(Ws, Ps):
        K, N = W.shape
        for m0 in range(0, M, block):
            r = min(block, M - m0)
            g.gemv_panels(x[m0].data_ptr(), P.data_ptr(), 0, y[m0].data_ptr(), r, K, N, 1)


def _by_onednn(mm, x: torch.Tensor, Ws: list[torch.Tensor]) -> None:
    for W in Ws:
        mm(x[:, : W.shape[0]], W.T, None)


def steps(name: str, repeats: int) -> None:
    g = extension("_gemv")
    Ws = _weights(*SHAPES[name])
    Ps = [dense.panels(W) for W in Ws]
    block = g.panels_rows()
    print(f"\n{name}: a decoding step's products, {block} rows a panel block ({g.kernel()})")
    print(f"{'rows':>5} {'rows kernel ms':>15} {'panel blocks ms':>16} {'ratio':>6}")
    for M in (9, 16, 24, 32):
        x = torch.randn(M, 4 * SHAPES[name][0])
        y = torch.empty(M, max(W.shape[1] for W in Ws))
        by_rows, by_panels = (g, x, y, Ws, M), (g, x, y, Ps, Ws, M)
        _by_rows(*by_rows), _by_panels(*by_panels)  # cold first pass, not counted
        a, b = [], []
        for _ in range(repeats):
            a.append(_cpu(_by_rows, *by_rows))
            b.append(_cpu(_by_panels, *by_panels))
        ra, rb = statistics.median(a), statistics.median(b)
        print(f"{M:>5} {ra * 1e3:>15.2f} {rb * 1e3:>16.2f} {ra / rb:>6.2f}")


def prompts(name: str, repeats: int) -> None:
    g = extension("_gemv")
    Ws = _weights(*SHAPES[name])
    Ps = [dense.panels(W) for W in Ws]
    print(f"\n{name}: a prompt's products through oneDNN, exact rows against rounded up, and")
    print("by the panels in row blocks; ratios exact / each (above 1: faster than exact)")
    print(f"{'rows':>5} {'rounded':>8} {'exact ms':>9} {'rounded ms':>11} {'ratio':>6}"
          f" {'panels ms':>10} {'ratio':>6}")  # fmt: skip
    for M in (33, 40, 48, 64, 100, 129, 200, 255):
        x = torch.randn(M, 4 * SHAPES[name][0])
        y = torch.empty(M, max(W.shape[1] for W in Ws))
        panelled = (g, x, y, Ps, Ws, M)
        _by_onednn(onednn._mm, x, Ws), _by_onednn(onednn._bucketed_mm, x, Ws)
        _by_panels(*panelled)
        a, b, c = [], [], []
        for _ in range(repeats):
            a.append(_cpu(_by_onednn, onednn._mm, x, Ws))
            b.append(_cpu(_by_onednn, onednn._bucketed_mm, x, Ws))
            c.append(_cpu(_by_panels, *panelled))
        ra, rb, rc = statistics.median(a), statistics.median(b), statistics.median(c)
        print(f"{M:>5} {onednn.bucket_rows(M):>8} {ra * 1e3:>9.2f} {rb * 1e3:>11.2f}"
              f" {ra / rb:>6.2f} {rc * 1e3:>10.2f} {ra / rc:>6.2f}")  # fmt: skip
    for how in ("exact", "rounded"):
        out = subprocess.run([sys.executable, __file__, "--rss", name, how], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        print(f"RSS over every row count 33-256, {how}: {out}")


def rss(name: str, how: str) -> None:
    """Print how much RSS grows over products of every row count 33-256 (after a warm-up)."""

    def now() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20

    Ws = _weights(*SHAPES[name])[:-1]
    mm = onednn._mm if how == "exact" else onednn._bucketed_mm
    for W in Ws[:4]:
        mm(torch.randn(33, W.shape[0]), W.T, None)
    before = now()
    for M in range(33, 257):
        for W in Ws[:4]:  # one layer's shapes (the others repeat them)
            mm(torch.randn(M, W.shape[0]), W.T, None)
    counts = len({M if how == "exact" else onednn.bucket_rows(M) for M in range(33, 257)})
    print(f"+{now() - before:.0f} MiB ({counts} row counts)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="shakespeare,gpt2")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rss", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.rss:
        return rss(*a.rss)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    with torch.no_grad():
        for name in a.shapes.split(","):
            steps(name, a.repeats)
            prompts(name, a.repeats)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
