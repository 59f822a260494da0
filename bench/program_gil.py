"""A replayed step run as one compiled call (``kernels/_program.c``) against the Python loop
over the same calls, alone and with a Python thread beside it, in one process.

    PYTHONPATH=src python bench/program_gil.py [--shape shakespeare] [--rows 8]
        [--rounds 6] [--tokens 64] [--busy-us 150] [--rest-us 400] [--threads 1]

Random weights at --shape (the 10.7M ``shakespeare-char`` preset's, 65 characters, or GPT-2
small's), a 16-token prompt in each of --rows rows, then rounds of --tokens replayed steps
each way in turn (program, loop, loop, program, ...): the same ReplayedStep with its program
and with it set aside. "beside": meanwhile a second thread runs pure Python for --busy-us µs
and sleeps --rest-us µs, over and over (what a server's event loop and prompt thread do to
the step: each kernel call lets go of the GIL, and taking it back waits for that thread to
let go in turn, at its next blocking call or after the interpreter's switch interval).
Printed: the median wall and thread CPU ms a step each way, and loop ÷ program; the load
average before and after. Nothing is asserted (a bench, not a test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.engine import Decoder

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from step_ab import shape_config  # noqa: E402  (bench/ is not a package)


def beside(stop: threading.Event, busy_s: float, rest_s: float) -> None:
    """Pure Python for busy_s, then a sleep of rest_s, until stop."""
    while not stop.is_set():
        end = time.perf_counter() + busy_s
        x = 0
        while time.perf_counter() < end:
            x += 1
        time.sleep(rest_s)


def burst(decoder: Decoder, tokens: int, rows: int, start: int) -> tuple[float, float]:
    """Median wall ms and mean thread CPU ms a step over ``tokens`` steps."""
    decoder.cache.length = 17
    walls, c0 = [], time.thread_time_ns()
    for i in range(tokens):
        t = time.perf_counter_ns()
        decoder.step([(7 * i + start + r) % 60 for r in range(rows)])
        walls.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(walls), (time.thread_time_ns() - c0) / tokens / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="shakespeare", choices=["shakespeare", "gpt2-small"])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--busy-us", type=float, default=150.0)
    p.add_argument("--rest-us", type=float, default=400.0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = cast(GPT(GPTConfig(**shape_config(args.shape, HERE.parent))).eval(), "float32")
    decoder = Decoder.start(model, args.rows, 17 + args.tokens)
    with torch.inference_mode():
        decoder.model(torch.arange(16).repeat(args.rows, 1), cache=decoder.cache)
    decoder.step([5] * args.rows)
    step = decoder._step
    program = getattr(step, "program", None)
    if program is None:
        sys.exit(f"no program to compare: {decoder.why} (is kernels/_program.c built?)")
    print(f"{args.shape}, {args.rows} rows, {args.threads} thread(s); load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        "| thread beside | program: wall ms | CPU ms | loop: wall ms | CPU ms | loop ÷ program (wall) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for with_thread in (False, True):
        stop = threading.Event()
        other = threading.Thread(
            target=beside, args=(stop, args.busy_us / 1e6, args.rest_us / 1e6), daemon=True
        )
        if with_thread:
            other.start()
        got: dict[str, list[tuple[float, float]]] = {"program": [], "loop": []}
        for r in range(args.rounds):
            order = ("program", "loop") if r % 2 == 0 else ("loop", "program")
            for way in order:
                step.program = program if way == "program" else None
                got[way].append(burst(decoder, args.tokens, args.rows, r))
        stop.set()
        if with_thread:
            other.join()
        step.program = program
        (pw, pc), (lw, lc) = (
            tuple(statistics.median(x[i] for x in got[w]) for i in (0, 1))
            for w in ("program", "loop")
        )
        label = (
            f"{args.busy_us:.0f} µs busy / {args.rest_us:.0f} µs asleep" if with_thread else "none"
        )
        print(f"| {label} | {pw:.3f} | {pc:.3f} | {lw:.3f} | {lc:.3f} | {lw / pw:.2f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
