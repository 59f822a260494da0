"""Where a replayed decoding step's time goes: each compiled call timed, by kernel.

    PYTHONPATH=src python bench/step_profile.py [--shape smollm2-135m] [--dtype float32]
        [--threads 2] [--steps 20] [--cpu]

Random weights at one of ``bench/families.py``'s shapes, cast to --dtype, a 16-token prompt,
then --steps replayed one-token steps (``glassgpt.sample.replay``) with a timer around every
recorded call. Printed per kernel, the products by shape (K × N, and two matrices for
SwiGLU's fused pair): calls a step, ms a step, µs a call, and for the panel products the GB/s
their weights were read at (a thin product far below the unembedding's says the cost is the
call's, not the bytes'); the step's median time with and without the timers; and how many
calls of the untimed steps (products and attention: one pacing for the process) ran on both
threads or on one (``_parallel.h``'s pacing puts them on one for a while after parallel runs
that a busy core made slow). --cpu
times the calling thread's CPU time instead of the wall clock: on a loaded host that leaves
out the time slices other processes took (with 1 thread, every call's whole cost; with more,
the other threads' parts are not counted).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/families.py's shapes
from families import SHAPES, random_model
from glassgpt.kernels.extensions import extension
from glassgpt.model.precision import cast
from glassgpt.sample.engine import Decoder
from glassgpt.sample.replay import ReplayedStep

_gemv = extension("_gemv")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="smollm2-135m", choices=list(SHAPES))
    p.add_argument("--dtype", default="float32", choices=["float32", "bf16", "int8"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cpu", action="store_true", help="the thread's CPU time, not wall time")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time_ns if args.cpu else time.perf_counter_ns
    decoder = Decoder.start(cast(random_model(SHAPES[args.shape][0]), args.dtype), 1, 256)
    with torch.inference_mode():
        decoder.model(torch.arange(16)[None], cache=decoder.cache)
    decoder.step([5])
    step = decoder._step
    if not isinstance(step, ReplayedStep):
        sys.exit(f"not replayed: {decoder.why}")
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{args.shape} {args.dtype}, {args.threads} threads, {len(step.calls)} calls a step, "
          f"{'CPU' if args.cpu else 'wall'} time; load average {load}")  # fmt: skip
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    read: dict[str, int] = {}  # a panel product's weight bytes a call

    def timed(fn: Any, call_args: tuple[Any, ...]) -> Any:
        name = getattr(fn, "__name__", "pytorch")
        nbytes = panel_bytes(name, call_args)
        if nbytes:
            name = f"{name} {shape_of(name, call_args)}"
            read[name] = nbytes

        def call(*call_args: Any) -> None:
            t = clock()
            fn(*call_args)
            total[name] += clock() - t
            count[name] += 1

        return call

    plain, timed_steps = [], []
    calls = step.calls
    counts = _gemv.pacing_counts()
    for i in range(args.steps):
        t = clock()
        decoder.step([7 + i])
        plain.append(clock() - t)
    parallel, solo, windows = (b - a for a, b in zip(counts, _gemv.pacing_counts(), strict=True))
    step.calls = [(timed(fn, a), a, positional) for fn, a, positional in calls]
    program, step.program = step.program, None  # (the program, one compiled call, has no seams)
    for i in range(args.steps):  # the replay's own loop, each call through its timer
        t = clock()
        decoder.step([7 + i])
        timed_steps.append(clock() - t)
    step.calls, step.program = calls, program
    print(f"step: {statistics.median(plain) / 1e6:.2f} ms "
          f"({statistics.median(timed_steps) / 1e6:.2f} with a timer around each call)")  # fmt: skip
    # _parallel.h's pacing: products that ran on one thread because recent parallel runs
    # were slow (another process held a core) make a slower step
    print(f"parallel calls over the untimed steps (products, attention): {parallel} parallel, "
          f"{solo} on one thread ({windows} solo windows begun)\n")  # fmt: skip
    print("| kernel | calls a step | ms a step | µs a call | weights GB/s |")
    print("|---|---:|---:|---:|---:|")
    for name, ns in total.most_common():
        rate = f"{read[name] * count[name] / ns:.1f}" if name in read else ""
        print(f"| {name} | {count[name] // args.steps} | {ns / args.steps / 1e6:.3f} | "
              f"{ns / count[name] / 1e3:.2f} | {rate} |")  # fmt: skip


# The panel products' arguments: (M, K, N) at 4..6 with the bf16 flag (half) after threads at
# 8, or (M, K, N) at 7..9 with half at 11 for SwiGLU's pair (two matrices); the plain and
# _bf16 names say the weights' width themselves.
def _sizes(name: str, a: tuple[Any, ...]) -> tuple[int, int, int, int] | None:
    """(K, N, bytes a weight, matrices) of a panel product call, None for other calls."""
    if name == "gemv_panels_glu":
        return a[8], a[9], 2 if a[11] else 4, 2
    if name == "gemv_panels_add":
        return a[5], a[6], 2 if a[8] else 4, 1
    if name in ("gemv_panels", "gemv_panels_bf16", "gemv_panels_bf16_io"):
        return a[5], a[6], 4 if name == "gemv_panels" else 2, 1
    return None


def panel_bytes(name: str, a: tuple[Any, ...]) -> int:
    """The weight bytes a panel product call reads (whole panels of 64), 0 for other calls."""
    sizes = _sizes(name, a)
    if sizes is None:
        return 0
    K, N, width, matrices = sizes
    return matrices * K * -(-N // 64) * 64 * width


def shape_of(name: str, a: tuple[Any, ...]) -> str:
    """A panel product call's K × N (× 2 for a pair)."""
    K, N, _, matrices = _sizes(name, a)  # type: ignore[misc]
    return f"{K}×{N}" + (" ×2" if matrices == 2 else "")


if __name__ == "__main__":
    main()
