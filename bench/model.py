"""Throughput of glassgpt's GPT beside transformers' GPT2LMHeadModel, same weights, same run.

For each preset (cpu-tiny, shakespeare-char, gpt2) and each precision (float32, bf16
autocast) it times the forward pass (no grad, eval) and forward + backward (cross-entropy on
the next tokens, grads zeroed each step), alternating glassgpt and transformers step by step so
both see the same machine noise, and prints medians over repeats as tokens/s, the ratio
glassgpt / transformers (>1: glassgpt faster) and the achieved GFLOP/s from
glassgpt.model.accounting (matmul FLOPs; training = 3 × forward). Dropout is set to 0 for both
models (the bench measures the function). Run from the repository root:

    PYTHONPATH=src python bench/model.py                      # all presets, a few minutes
    PYTHONPATH=src python bench/model.py --presets cpu-tiny --repeats 9 --batch 8 --seq 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from glassgpt.interop.hf_gpt2 import config_to_hf, state_dict_to_hf
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.accounting import flops_per_token

# (batch, seq) per preset: big enough to be matmul-bound, small enough for minutes in total
DEFAULT_SHAPES = {"cpu-tiny": (32, 64), "shakespeare-char": (8, 256), "gpt2": (1, 256)}


def build_pair(preset: str, device: str) -> tuple[GPT, torch.nn.Module]:
    """GPT and GPT2LMHeadModel computing the same function (weights copied from GPT)."""
    import transformers

    torch.manual_seed(0)
    config = GPTConfig.preset(preset, dropout=0.0)
    ours = GPT(config)
    hf_config = transformers.GPT2Config(**config_to_hf(config))
    theirs = transformers.GPT2LMHeadModel(hf_config)
    result = theirs.load_state_dict(state_dict_to_hf(ours), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # tied head
        raise RuntimeError(f"weights do not match: {result}")
    return ours.to(device), theirs.to(device)


def forward_step(model: torch.nn.Module, hf: bool, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        with torch.no_grad():
            _ = model(x).logits if hf else model(x)

    return run


def train_step(
    model: torch.nn.Module, hf: bool, x: torch.Tensor, y: torch.Tensor
) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        if hf:
            logits = model(x).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        else:
            _, loss = model(x, targets=y)
        loss.backward()

    return run


def time_pair(
    steps: tuple[Callable[[], None], Callable[[], None]],
    autocast: bool,
    device: str,
    repeats: int,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Median seconds per step of each of two steps, interleaved (order alternating)."""
    times: tuple[list[float], list[float]] = ([], [])
    ctx = (
        (lambda: torch.autocast(device, dtype=torch.bfloat16))
        if autocast
        else (lambda: nullcontext())
    )
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for i in range(warmup + repeats):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for j in order:
            with ctx():
                sync()
                t0 = clock()
                steps[j]()
                sync()
                elapsed = clock() - t0
            if i >= warmup:
                times[j].append(elapsed)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", nargs="+", default=list(DEFAULT_SHAPES))
    p.add_argument("--batch", type=int, default=None, help="batch size (default: per preset)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: per preset)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per cell (median)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bf16"], choices=["float32", "bf16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: elapsed seconds; cpu: this process's CPU seconds (all threads), steadier "
        "on a machine shared with other jobs; figures are then per CPU-second",
    )
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    import transformers

    load = os.getloadavg()
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.threads} threads, device {args.device}; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"
    )
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    print(
        f"cpu capability: {torch.backends.cpu.get_cpu_capability()}; medians of {args.repeats}; "
        f"{args.clock} clock"
    )
    header = (
        f"{'preset':<17}{'B×T':>9} {'dtype':<8}{'pass':<9}{'glassgpt tok/s':>15}"
        f"{'HF tok/s':>11}{'ratio':>7}{'glassgpt GFLOP/s':>18}{'HF GFLOP/s':>12}"
    )
    print(header)
    print("-" * len(header))
    for preset in args.presets:
        ours, theirs = build_pair(preset, args.device)
        default_b, default_t = DEFAULT_SHAPES.get(preset, (8, 256))
        B, T = args.batch or default_b, min(args.seq or default_t, ours.config.n_ctx)
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(0, ours.config.n_vocab, (B, T), generator=gen).to(args.device)
        y = torch.randint(0, ours.config.n_vocab, (B, T), generator=gen).to(args.device)
        ours.eval(), theirs.eval()
        with torch.no_grad():
            diff = float((ours(x) - theirs(x).logits).abs().max())
        impl = theirs.config._attn_implementation
        print(f"{preset}: max |logits(glassgpt) - logits(HF)| = {diff:.2e} (float32); HF {impl}")
        flops = flops_per_token(ours.config, T)
        for dtype in args.dtypes:
            autocast = dtype == "bf16"
            for name in ("forward", "fwd+bwd"):
                if name == "forward":
                    ours.eval(), theirs.eval()
                    pair = (forward_step(ours, False, x), forward_step(theirs, True, x))
                    per_token = flops.forward
                else:
                    ours.train(), theirs.train()
                    pair = (train_step(ours, False, x, y), train_step(theirs, True, x, y))
                    per_token = flops.training
                t_ours, t_hf = time_pair(
                    pair, autocast, args.device, args.repeats, args.warmup, clock
                )
                tokens = B * T
                print(
                    f"{preset:<17}{f'{B}×{T}':>9} {dtype:<8}{name:<9}"
                    f"{tokens / t_ours:>15,.0f}{tokens / t_hf:>11,.0f}{t_hf / t_ours:>7.2f}"
                    f"{per_token * tokens / t_ours / 1e9:>18.1f}"
                    f"{per_token * tokens / t_hf / 1e9:>12.1f}"
                )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
