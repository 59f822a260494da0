"""Memory read bandwidth on the CPU, and the decoding roofline it sets for the family shapes.

    PYTHONPATH=src python bench/bandwidth.py [--threads 2] [--gib 1] [--repeats 5]
    PYTHONPATH=src python bench/bandwidth.py --residency [--threads 1]

A batch-1 decoding step reads every weight once (two flops per weight read), so it cannot
take less than weight bytes / read bandwidth. This probe reads one buffer of --gib GiB (far
past every cache) with --threads threads, three ways, and prints the median GB/s of each
(GB = 10⁹ bytes):

- ``torch.sum`` of a float32 tensor (PyTorch's own OpenMP threads);
- NumPy ``sum`` over one band of the buffer per Python thread (NumPy releases the GIL);
- glassgpt's float32 panel product (``_gemv.gemv_panels``) of one row against the buffer
  as a [K, N] matrix in panels: what a decoding step's products reach;
- the same product over a copy of the buffer on 2 MiB pages (``glassgpt.kernels.pages``,
  where the system advises them), as glassgpt's packed weights lie: with 4 KiB pages every
  4 KiB read is a TLB miss, which the three reads above all pay (PyTorch's and NumPy's
  buffers are on 4 KiB pages unless the system gives every mapping huge pages).

Then, from the best of the three, each shape's roofline in ms per token: the bytes a step
reads (the weights that take part in a product, the unembedding once, float32, bf16 or
int8 with its float32 scale per output; the KV cache at 144 positions) over that bandwidth,
and the ratio to llama.cpp that it allows, given llama.cpp's ms per token (--llama, as
``bench/families.py`` prints them).

--residency asks whether a few MB of weights could stay in the L3 cache from one decoding
step to the next (a step streams 276-545 MB through it, so only a subset read apart from
the stream could). A matrix of 8, 16 and 24 MB on 2 MiB pages is read by the panel product
(medians of --repeats × 5 reads, GB/s): back to back (the L3's rate); after the process
idles 1 ms and 10 ms (reading nothing: what other processes and the host's other tenants
evict meanwhile); and after a 256 MB product between reads (a step's stream, read normally).
If the idle reads already run at the memory's rate, no read hint can keep the subset.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

import numpy as np
import torch

from glassgpt.kernels.extensions import extension
from glassgpt.kernels.pages import huge_page_copy

SHAPES: dict[str, dict[str, int]] = {  # bench/families.py's shapes
    "smollm2-135m": {"n_vocab": 49152, "d_model": 576, "n_layers": 30, "n_heads": 9,
                     "n_kv_heads": 3, "d_head": 64, "d_mlp": 1536},
    "qwen3-0.6b": {"n_vocab": 151936, "d_model": 1024, "n_layers": 28, "n_heads": 16,
                   "n_kv_heads": 8, "d_head": 128, "d_mlp": 3072},
}  # fmt: skip
BYTES = {"float32": 4.0, "bf16": 2.0, "int8": 1.0}
# llama.cpp's ms/token measured by bench/families.py (2026-11-29, quiet host, 2 threads),
# replaced by --llama
LLAMA_MS = {("smollm2-135m", "float32"): 18.9, ("smollm2-135m", "bf16"): 10.1,
            ("smollm2-135m", "int8"): 7.4, ("qwen3-0.6b", "float32"): 70.8,
            ("qwen3-0.6b", "bf16"): 35.2, ("qwen3-0.6b", "int8"): 27.4}  # fmt: skip


def median_rate(read: Any, nbytes: int, repeats: int) -> float:
    """GB/s of ``read()`` over ``nbytes``: the median of ``repeats`` timed calls, after one."""
    read()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        read()
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times) / 1e9


def probes(gib: float, threads: int, repeats: int) -> dict[str, float]:
    """GB/s of each way of reading one buffer of ``gib`` GiB with ``threads`` threads."""
    torch.set_num_threads(threads)
    n = int(gib * 2**30) // 4 // 4096 * 4096
    x = torch.rand(n)
    rates = {"torch.sum": median_rate(lambda: x.sum().item(), n * 4, repeats)}
    a = x.numpy()
    bands = np.array_split(a, threads)

    def numpy_read() -> None:
        pool = [threading.Thread(target=np.sum, args=(b,)) for b in bands]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    rates["numpy sum, threads"] = median_rate(numpy_read, n * 4, repeats)
    gemv = extension("_gemv")
    if gemv is not None:
        N = 4096  # x [1, K] against P [N/64, K, 64]: the buffer read once, in panels
        K = n // N
        row, y = torch.rand(K), torch.empty(N)
        rates["glassgpt gemv_panels"] = median_rate(
            lambda: gemv.gemv_panels(row.data_ptr(), x.data_ptr(), 0, y.data_ptr(), 1, K, N,
                                     threads),
            n * 4, repeats,
        )  # fmt: skip
        del a, bands
        x = huge_page_copy(x)  # (the 4 KiB one freed as it is replaced)
        rates["glassgpt gemv_panels, 2 MiB pages"] = median_rate(
            lambda: gemv.gemv_panels(row.data_ptr(), x.data_ptr(), 0, y.data_ptr(), 1, K, N,
                                     threads),
            n * 4, repeats,
        )  # fmt: skip
    return rates


def residency(threads: int, repeats: int) -> None:
    """Print the read rate of an 8, 16 and 24 MB panel matrix read back to back, after an
    idle pause and after a 256 MB stream (see the module docstring)."""
    gemv = extension("_gemv")
    if gemv is None:
        raise SystemExit("glassgpt's _gemv is not built")
    torch.set_num_threads(threads)
    N = 4096

    def product(mb: float) -> Any:
        K = int(mb * 2**20) // 4 // N
        P, row, y = huge_page_copy(torch.rand(K * N)), torch.rand(K), torch.empty(N)
        return lambda: gemv.gemv_panels(row.data_ptr(), P.data_ptr(), 0, y.data_ptr(), 1, K,
                                        N, threads), K * N * 4  # fmt: skip

    stream, _ = product(256)
    print("| MB | back to back | after 1 ms idle | after 10 ms idle | after a 256 MB stream |")
    print("|---:|---:|---:|---:|---:|")
    for mb in (8, 16, 24):
        read, nbytes = product(mb)
        rates = []
        for before in (lambda: None, lambda: time.sleep(0.001), lambda: time.sleep(0.01), stream):
            times = []
            for _ in range(5 * repeats):
                before()
                t = time.perf_counter()
                read()
                times.append(time.perf_counter() - t)
            rates.append(nbytes / statistics.median(times) / 1e9)
        print(f"| {mb} | " + " | ".join(f"{r:.1f}" for r in rates) + " |")


def step_bytes(shape: dict[str, int], precision: str, positions: int = 144) -> float:
    """Bytes one batch-1 decoding step reads: the block and unembedding weights (int8: one
    float32 scale per output column beside them), the norms' gains, the KV cache (float32)."""
    d, L, V = shape["d_model"], shape["n_layers"], shape["n_vocab"]
    H, G, dh, F = shape["n_heads"], shape["n_kv_heads"], shape["d_head"], shape["d_mlp"]
    products = [(d, (H + 2 * G) * dh), (H * dh, d), (d, 2 * F), (F, d)]  # (K, N) per block
    weights = L * sum(k * n for k, n in products) + d * V
    scales = L * sum(n for _, n in products) + V if precision == "int8" else 0
    cache = L * 2 * G * dh * positions * 4
    return weights * BYTES[precision] + 4 * (scales + (2 * L + 1) * d) + cache


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--residency", action="store_true",
                   help="whether a few MB stay in the L3 cache between reads (see above)")  # fmt: skip
    p.add_argument("--llama", action="append", default=[], metavar="SHAPE:PRECISION=MS",
                   help="llama.cpp's ms per token, e.g. smollm2-135m:bf16=10.1")  # fmt: skip
    args = p.parse_args()
    llama = dict(LLAMA_MS)
    for item in args.llama:
        key, _, ms = item.partition("=")
        shape, _, precision = key.partition(":")
        llama[(shape, precision)] = float(ms)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    if args.residency:
        print(f"{args.threads} threads, panel products on 2 MiB pages; load average {load}")
        residency(args.threads, args.repeats)
        return
    print(f"{args.threads} threads, {args.gib:g} GiB buffer, medians of {args.repeats}; "
          f"load average {load}")  # fmt: skip
    rates = probes(args.gib, args.threads, args.repeats)
    for name, rate in rates.items():
        print(f"  {name}: {rate:.1f} GB/s")
    best = max(rates.values())
    print(
        f"\nroofline at {best:.1f} GB/s (the best above): ms per token = bytes read / bandwidth\n"
    )
    print("| shape | precision | MB read a step | roofline ms | llama.cpp ms | llama.cpp at "
          "| most vs llama.cpp | 1.2× needs |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for shape, dims in SHAPES.items():
        for precision in BYTES:
            nbytes = step_bytes(dims, precision)
            roof = nbytes / best / 1e6
            lc = llama.get((shape, precision))
            if lc is None:
                print(
                    f"| {shape} | {precision} | {nbytes / 1e6:.0f} | {roof:.1f} | – | – | – | – |"
                )
                continue
            print(f"| {shape} | {precision} | {nbytes / 1e6:.0f} | {roof:.1f} | {lc:.1f} | "
                  f"{nbytes / lc / 1e6:.1f} GB/s | {lc / roof:.2f}× | "
                  f"{nbytes / (lc / 1.2) / 1e6:.1f} GB/s |")  # fmt: skip


if __name__ == "__main__":
    main()
