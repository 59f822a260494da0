"""Which model shape reaches the lowest validation loss in a fixed training time?

For each candidate shape (layers × d_model, context and batch as given; the speedrun
preset's other settings) this measures the wall time of one optimizer step
(``Trainer.train_step`` on a random batch; the shapes alternate repeat by repeat and the
median is kept), turns it into the tokens D that ``--seconds`` of training see, and asks a
fitted law L(N, D) = E + A/N^α + B/D^β (``glassgpt scaling fit``) for the loss:

    D(shape) = (seconds − compile) · batch · n_ctx / step time,   L̂(shape) = L(N(shape), D(shape))

Steps run as the preset says (``train.compile``, ``train.optimizer``; ``--set`` changes any
key): when they are compiled, the first step's compilation is timed on its own and counted
against the budget, as it is in a training run.

so the fastest recipe is picked by prediction, before it is trained. The load average is
printed before and after: the step times are this machine's, at that load.

    PYTHONPATH=src python bench/speedrun.py --law SWEEP_DIR --seconds 120
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from glassgpt.model import GPT
from glassgpt.model.accounting import count_parameters
from glassgpt.scaling.law import predict_loss
from glassgpt.scaling.study import load_law
from glassgpt.train.config import load_run_config
from glassgpt.train.distributed import keep_freed_memory
from glassgpt.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parent))
from train import Repeat  # bench/train.py: a fixed batch, endlessly

PRESET = "shakespeare-char-speedrun"
N_VOCAB = 65  # the characters of Tiny Shakespeare


def shape_overrides(shape: str, n_ctx: int, batch: int) -> list[str]:
    """``LxD`` (layers × d_model; heads of 32 dimensions) as ``--set`` overrides."""
    layers, d_model = (int(v) for v in shape.lower().split("x"))
    return [f"model.n_layers={layers}", f"model.d_model={d_model}",
            f"model.n_heads={d_model // 32}", f"model.n_ctx={n_ctx}",
            f"train.batch_size={batch}", f"model.n_vocab={N_VOCAB}"]  # fmt: skip


def step_fn(overrides: list[str]):
    """(config, one training step, seconds of the first step: compilation where compiled)."""
    cfg = load_run_config(preset=PRESET, overrides=[*overrides, "train.progress=false"])
    torch.manual_seed(0)
    x = torch.randint(0, N_VOCAB, (cfg.train.batch_size, cfg.seq_len))
    y = torch.randint(0, N_VOCAB, (cfg.train.batch_size, cfg.seq_len))
    trainer = Trainer(GPT(cfg.model), cfg.train, Repeat(x, y), log=lambda m: None)
    t0 = time.perf_counter()
    trainer.train_step()
    return cfg, trainer.train_step, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--law", required=True, help="law.json or the sweep folder holding it")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--shapes", nargs="+", default=["4x64", "4x96", "4x128", "4x160", "4x192",
                                                     "6x128", "6x192", "4x256"])  # fmt: skip
    ap.add_argument("--n-ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="more overrides of the preset, e.g. train.compile=false")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    law, n_kind = load_law(args.law)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads; law: E={law.E:.3f} A={law.A:.4g} B={law.B:.4g} "
          f"α={law.alpha:.3f} β={law.beta:.3f} (N = {n_kind})")  # fmt: skip
    runs = {s: step_fn([*shape_overrides(s, args.n_ctx, args.batch), *args.set])
            for s in args.shapes}  # fmt: skip
    for _, step, _ in runs.values():  # warm up (allocator, first touch)
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {s: [] for s in runs}
    for r in range(args.repeats):
        for s in runs if r % 2 == 0 else reversed(list(runs)):
            step = runs[s][1]
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[s].append((time.perf_counter() - t0) / args.steps)
    print(f"\n| shape | N ({n_kind}) | ms/step | first step (s) | tok/s | steps in "
          f"{args.seconds:g} s | D in {args.seconds:g} s | predicted val loss (90% interval) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    best = None
    for s, (cfg, _, first) in runs.items():
        t = statistics.median(times[s])
        tokens_per_step = cfg.train.batch_size * cfg.seq_len
        compile_s = first - t if cfg.train.compile else 0.0  # counted against the budget
        steps = max(args.seconds - compile_s, 0.0) / t
        n = count_parameters(cfg.model, non_embedding=n_kind == "non_embedding")
        mid, lo, hi = predict_loss(law, n, steps * tokens_per_step)
        ci = f" ({float(lo):.3f}–{float(hi):.3f})" if lo is not None else ""
        print(f"| {s} | {n:,} | {t * 1e3:.1f} | {first:.1f} | {tokens_per_step / t:,.0f} | {steps:,.0f} | "
              f"{steps * tokens_per_step / 1e6:.2f} M | {float(mid):.3f}{ci} |", flush=True)  # fmt: skip
        if best is None or mid < best[1]:
            best = (s, float(mid))
    print(f"\nlowest predicted loss in {args.seconds:g} s: {best[0]} ({best[1]:.3f}); "
          f"load average after {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
