"""Training speed of glassgpt beside transformers + torch.optim.AdamW, and time to a loss.

1. Throughput: one full optimizer step (forward, cross-entropy, backward, clip at 1.0,
   AdamW, zero grads) at the same shapes and weights, float32 and bf16 autocast:
   glassgpt's ``Trainer.train_step`` on ``GPT`` (fused AdamW, decay on matrices), eager (what
   ``glassgpt train`` runs on a CPU by default) and compiled (``train.compile=true``; the
   seconds of its first step, compilation included, are printed), beside
   ``transformers.GPT2LMHeadModel`` with ``torch.optim.AdamW`` (its default kernel). They
   take turns repeat by repeat, the order flipping each time; medians of tokens/s and the
   ratios glassgpt / transformers (> 1: glassgpt faster) are printed, as the ratio of the
   medians and as the median of each repeat's own ratio ('paired': the two runs of a pair
   are next to each other in time, so a host whose speed drifts moves it less)
   (``--no-compile``: eager only). The process first asks
   glibc's malloc to keep freed buffers, as ``glassgpt train`` does on CPUs
   (``keep_freed_memory``); the setting is process-wide, so transformers gets it too
   (``--default-malloc`` leaves glibc's defaults for both).
2. Time to loss (``--time-to-loss``): ``glassgpt train`` on character-level Tiny Shakespeare
   with nanoGPT's published CPU recipe (preset ``shakespeare-char-cpu``: 4 layers, 4 heads,
   128 dims, context 64, batch 12, lr 1e-3, 2,000 iterations, no dropout; nanoGPT reaches
   val loss ≈ 1.88 there), with ``shakespeare-char-fast`` and with the 2-minute
   ``shakespeare-char-speedrun``, each in its own process, in the same run: seconds of
   training until the first evaluation with val loss ≤ 1.88, 1.80, 1.70 and 1.60. Each run
   evaluates about 40 times (``train.eval_every`` = max_steps / 40, on the preset's
   ``eval_batches``) and the time spent evaluating is left out (``elapsed_s − eval_s`` in
   ``metrics.jsonl``); the run's wall time with its evaluations is printed beside it, with
   the load average before and after each run.

3. On a GPU (``--device cuda``): GPT-2 small (124M, context 1024) in bf16, each model
   compiled (``--no-compile`` for eager) with TF32 on: glassgpt's trainer (fused AdamW, SDPA
   flash attention, no host sync in the step: each step's loss is read one step later)
   beside ``GPT2LMHeadModel`` with SDPA attention and fused AdamW on the same batch, its loss
   never read back (its best case). Tokens/s, ms/step, peak memory, and model FLOPs
   utilisation: ``glassgpt.model.accounting.flops_per_token(config).training`` × tokens/s over
   the GPU's dense bf16 peak from its datasheet (``--peak-tflops``), and over the bf16 matrix
   product rate measured here (8192³, the ceiling a kernel meets on this card). One step of
   each model runs under ``torch.cuda.set_sync_debug_mode("warn")`` and the synchronising
   calls are counted.

    PYTHONPATH=src python bench/train.py                       # throughput, a few minutes
    PYTHONPATH=src python bench/train.py --time-to-loss --skip-throughput
    PYTHONPATH=src python bench/train.py --device cuda         # GPT-2 small on a GPU
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from glassgpt.interop.hf_gpt2 import config_to_hf, state_dict_to_hf
from glassgpt.model import GPT, GPTConfig
from glassgpt.train.config import TrainConfig
from glassgpt.train.optim import fused_available
from glassgpt.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
MARKS = (1.88, 1.80, 1.70, 1.60)  # val loss, nats per character
EVALS_PER_RUN = 40

# name: (n_layers, n_heads, d_model, n_ctx = seq, batch, n_vocab)
SHAPES = {
    "nanogpt-cpu": (4, 4, 128, 64, 12, 65),  # nanoGPT's CPU Shakespeare recipe
    "default": (4, 4, 128, 128, 16, 256),  # glassgpt train with no arguments (char stdlib)
    "shakespeare-char": (6, 6, 384, 256, 8, 65),  # nanoGPT's GPU Shakespeare model
}


class Repeat:
    """An endless source of one fixed batch (the bench times compute, not data loading)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.batch = (x, y)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build(
    shape: str, precision: str, compiled: bool = False
) -> tuple[list[Callable[[], None]], int, float | None]:
    """([glassgpt step, (glassgpt compiled step,) transformers step], tokens per step, seconds
    of the compiled model's first step, compilation included) with equal initial weights."""
    import transformers

    L, H, D, T, B, V = SHAPES[shape]
    torch.manual_seed(0)
    config = GPTConfig(n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, dropout=0.0)
    ours = GPT(config)
    twin = copy.deepcopy(ours) if compiled else None  # the same weights, its own optimizer
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config_to_hf(config)))
    theirs.load_state_dict(state_dict_to_hf(ours), strict=False)  # lm_head tied to wte
    theirs.train()
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    cfg = TrainConfig(
        max_steps=10**9, batch_size=B, lr=1e-4, warmup_steps=0, precision=precision, progress=False
    )
    steps = [Trainer(ours, cfg, Repeat(x, y), log=lambda m: None).train_step]
    first_step_s = None
    if twin is not None:  # as `glassgpt train --set train.compile=true` runs it
        compiled_cfg = dataclasses.replace(cfg, compile=True)
        step = Trainer(twin, compiled_cfg, Repeat(x, y), log=lambda m: None).train_step
        t0 = time.perf_counter()
        step()
        first_step_s = time.perf_counter() - t0
        steps.append(step)
    opt = torch.optim.AdamW(theirs.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()

    def hf_step() -> None:
        with autocast:
            logits = theirs(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()

    return [*steps, hf_step], B * T, first_step_s


def step_times(
    steps: Sequence[Callable[[], None]],
    n: int,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[list[float]]:
    """Seconds per step of each of ``steps`` in each repeat: they run in turn ``repeats``
    times (the order reversed every other repeat), ``n`` steps each time."""
    for step in steps:  # warm up each (allocator, kernels, first-touch)
        for _ in range(3):
            step()
    times: list[list[float]] = [[] for _ in steps]
    for r in range(repeats):
        order = range(len(steps)) if r % 2 == 0 else reversed(range(len(steps)))
        for i in order:
            t0 = clock()
            for _ in range(n):
                steps[i]()
            times[i].append((clock() - t0) / n)
    return times


def paired_ratio(theirs: list[float], ours: list[float]) -> float:
    """The median over repeats of theirs / ours, each pair timed next to each other: on a
    shared host whose speed drifts from minute to minute this moves less than the ratio of
    the two medians."""
    return statistics.median(t / o for t, o in zip(theirs, ours, strict=True))


def throughput(
    shapes: list[str], precisions: list[str], n: int, repeats: int, clock: str = "wall",
    compiled: bool = True,
) -> None:  # fmt: skip
    timer = time.process_time if clock == "cpu" else time.perf_counter
    compiled = compiled and shutil.which("c++") is not None
    print(f"\n## Training throughput (tokens/s by {clock} time, median of {repeats} × {n} steps)\n")
    if compiled:
        print("'compiled': `train.compile=true` (torch.compile of the model); 'first step s': "
              "its first step, compilation included (inductor's on-disk cache makes a later "
              "run's shorter).\n")  # fmt: skip
        print("| shape | L×H×D, B×T | precision | glassgpt | glassgpt compiled | transformers | "
              "ratio | paired | compiled ratio | paired | first step s | load |")  # fmt: skip
        print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print("| shape | L×H×D, B×T | precision | glassgpt | transformers | ratio | paired | "
              "load |")  # fmt: skip
        print("|---|---|---|---:|---:|---:|---:|---:|")
    for shape in shapes:
        L, H, D, T, B, _ = SHAPES[shape]
        for precision in precisions:
            load = os.getloadavg()[0]
            steps, tokens, first_s = build(shape, precision, compiled)
            each = step_times(steps, n, repeats, timer)
            times = [statistics.median(t) for t in each]
            rates = " | ".join(f"{tokens / t:,.0f}" for t in times)
            ratios = " | ".join(f"{times[-1] / t:.2f}× | {paired_ratio(each[-1], e):.2f}×"
                                for t, e in zip(times[:-1], each[:-1], strict=True))  # fmt: skip
            first = f" {first_s:.1f} |" if first_s is not None else ""
            print(f"| {shape} | {L}×{H}×{D}, {B}×{T} | {precision} | {rates} | {ratios} |{first} "
                  f"{load:.2f} → {os.getloadavg()[0]:.2f} |", flush=True)  # fmt: skip


def time_to_loss(presets: list[str], data: Path, extra: list[str], threads: int) -> None:
    from glassgpt.train.config import load_run_config

    print(f"\n## Seconds of training to each val loss, char-level Tiny Shakespeare ({data.name})\n")
    print(
        f"Training seconds: `elapsed_s − eval_s` of the first evaluation at or below the mark "
        f"(evaluation time left out; about {EVALS_PER_RUN} evaluations a run, so a mark is met "
        "at most one evaluation interval late); 'with evals': the same run's wall seconds "
        "with its evaluations. Load average before and after each run.\n"
    )
    marks = " | ".join(f"s to ≤ {m:.2f}" for m in MARKS)
    print(f"| preset | load | steps | eval every | {marks} | final val | train s | with evals "
          "| process s | load after |")  # fmt: skip
    print("|---|---:|---:|---:|" + "---:|" * len(MARKS) + "---:|---:|---:|---:|---:|")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for preset in presets:
        steps = load_run_config(preset=preset, overrides=extra).train.max_steps
        every = max(1, steps // EVALS_PER_RUN)
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "glassgpt", "train", "--preset", preset]
            cmd += ["--data", str(data), "--out", str(out), "--set", "train.progress=false"]
            cmd += ["train.checkpoint_every=0", "train.sample_tokens=0", f"train.threads={threads}"]
            cmd += [f"train.eval_every={every}", *extra]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode:
                print(f"| {preset} | failed: {proc.stderr.strip().splitlines()[-1]} |")
                continue
            records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
        evals = [r for r in records if r.get("val_loss") is not None]
        cells = []
        for mark in MARKS:
            hit = next((r for r in evals if r["val_loss"] <= mark), None)
            cells.append(
                f"{hit['elapsed_s'] - hit['eval_s']:.1f} (step {hit['step']})" if hit else "–"
            )
        last = records[-1]
        print(
            f"| {preset} | {load:.2f} | {last['step']} | {every} | {' | '.join(cells)} | "
            f"{evals[-1]['val_loss']:.3f} | {last['elapsed_s'] - last['eval_s']:.1f} | "
            f"{last['elapsed_s']:.1f} | {wall:.1f} | {os.getloadavg()[0]:.2f} |",
            flush=True,
        )


# -- the GPU ---------------------------------------------------------------------------------

# Dense bf16 tensor-core peaks from the vendors' datasheets (TFLOP/s, no sparsity).
DATASHEET_BF16_TFLOPS = {"H100 80GB HBM3": 989.4, "H100 PCIe": 756.0, "H200": 989.4,
                         "H100 NVL": 835.0, "A100": 312.0, "L4": 121.0, "A10G": 70.0}  # fmt: skip
GPU_SHAPES = {"gpt2": 50257, "gpt2-padded": 50304}  # GPT-2 small; the padded vocabulary


def datasheet_peak(name: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)


def measured_matmul_tflops() -> float:
    """bf16 8192×8192×8192 products on random data: median TFLOP/s of 20 after a warm-up."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / statistics.median(times) / 1e12


def count_syncs(step: Callable[[], object]) -> int:
    """Synchronising CUDA calls that one ``step()`` makes (PyTorch's sync debug mode)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchronizing" in str(w.message) for w in caught)


def gpu_pair(
    vocab: int, batch: int, compile_: bool, device: str = "cuda"
) -> tuple[Callable[[int], None], ...]:
    """(glassgpt run of n steps, transformers run of n steps, one-step sync counters)."""
    import transformers

    from glassgpt.train.distributed import DistContext

    device = torch.device(device)  # type: ignore[assignment]
    torch.manual_seed(0)
    config = GPTConfig.preset("gpt2", n_vocab=vocab, dropout=0.0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (batch, 1024), generator=g).to(device)
    y = torch.randint(0, vocab, (batch, 1024), generator=g).to(device)
    cfg = TrainConfig(max_steps=10**9, batch_size=batch, lr=1e-4, warmup_steps=0,
                      precision="bf16", compile=compile_, progress=False)  # fmt: skip
    trainer = Trainer(GPT(config), cfg, Repeat(x, y), ctx=DistContext(device=device))

    def ours(n: int) -> None:
        pending = None
        for _ in range(n):  # as Trainer.fit: a step's loss is read while the next one runs
            launched = trainer.launch_step()
            if pending is not None:
                pending.result()
            pending = launched
        assert pending is not None
        pending.result()

    hf_config = transformers.GPT2Config(**config_to_hf(config))
    hf = transformers.GPT2LMHeadModel._from_config(hf_config, attn_implementation="sdpa")
    hf = hf.to(device).train()
    hf.load_state_dict(state_dict_to_hf(trainer.model), strict=False)
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=fused_available(device))  # fmt: skip
    hf_model = torch.compile(hf) if compile_ else hf

    def hf_step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = hf_model(x).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def theirs(n: int) -> None:
        for _ in range(n):
            hf_step()

    return ours, theirs, lambda: count_syncs(lambda: ours(1)), lambda: count_syncs(hf_step)


def gpu_throughput(args: argparse.Namespace) -> None:
    from glassgpt.train.distributed import setup_cuda

    setup_cuda(torch.device("cuda"), tf32=True)
    name = torch.cuda.get_device_name()
    measured = measured_matmul_tflops()
    peak = args.peak_tflops or datasheet_peak(name)
    print(f"GPU {name}; bf16 matmul 8192³ measured {measured:.0f} TFLOP/s; datasheet dense bf16 "
          f"peak {peak or '?'} TFLOP/s; compile {not args.no_compile}; batch {args.gpu_batch} "
          f"× 1024; medians of {args.repeats} × {args.steps} steps")  # fmt: skip
    print("\n| model | vocab | glassgpt tok/s | ms/step | MFU (datasheet) | MFU (measured) | "
          "peak GiB | syncs/step | transformers tok/s | ms/step | MFU (datasheet) | peak GiB "
          "| syncs/step | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in args.gpu_shapes:
        gpu_row(GPU_SHAPES[shape], args, peak, measured)
        torch.cuda.empty_cache()


def gpu_row(vocab: int, args: argparse.Namespace, peak: float | None, measured: float) -> None:
    from glassgpt.model.accounting import flops_per_token

    ours, theirs, ours_syncs, hf_syncs = gpu_pair(vocab, args.gpu_batch, not args.no_compile)
    flops = flops_per_token(GPTConfig.preset("gpt2", n_vocab=vocab), 1024).training
    peaks = []
    for label, run in (("glassgpt", ours), ("transformers", theirs)):
        torch.cuda.reset_peak_memory_stats()  # warm up (compiles); the peak memory of each
        t0 = time.perf_counter()
        run(3)
        torch.cuda.synchronize()
        print(f"  (warm-up {label}: {time.perf_counter() - t0:.1f} s)", flush=True)
        peaks.append(torch.cuda.max_memory_allocated() / 2**30)
    syncs = (ours_syncs(), hf_syncs())
    steps = (lambda: ours(args.steps), lambda: theirs(args.steps))
    times = [statistics.median(t) for t in step_times(steps, 1, args.repeats, cuda_clock)]
    t_ours, t_hf = (t / args.steps for t in times)
    tok = args.gpu_batch * 1024
    r_ours, r_hf = tok / t_ours, tok / t_hf

    def mfu(rate: float, peak: float | None) -> str:
        return f"{rate * flops / (peak * 1e12):.1%}" if peak else "?"

    print(f"| GPT-2 small | {vocab} | {r_ours:,.0f} | {t_ours * 1e3:.1f} | {mfu(r_ours, peak)} "
          f"| {mfu(r_ours, measured)} | {peaks[0]:.1f} | {syncs[0]} | {r_hf:,.0f} | "
          f"{t_hf * 1e3:.1f} | {mfu(r_hf, peak)} | {peaks[1]:.1f} | {syncs[1]} | "
          f"{t_hf / t_ours:.2f}× |", flush=True)  # fmt: skip


def cuda_clock() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["nanogpt-cpu", "default"], choices=SHAPES)
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=10, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time (with --threads 1, robust to other load)",
    )
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--gpu-shapes", nargs="+", default=list(GPU_SHAPES), choices=GPU_SHAPES)
    ap.add_argument("--gpu-batch", type=int, default=32, help="sequences of 1024 per step")
    ap.add_argument("--no-compile", action="store_true",
                    help="eager only (CPU: no compiled glassgpt column; GPU: both models eager)")  # fmt: skip
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="GPU: the dense bf16 peak for MFU (default: by the GPU's name)")  # fmt: skip
    ap.add_argument("--time-to-loss", action="store_true")
    ap.add_argument(
        "--presets",
        nargs="+",
        default=["shakespeare-char-cpu", "shakespeare-char-fast", "shakespeare-char-speedrun"],
    )
    ap.add_argument("--data", type=Path, default=SHAKESPEARE)
    ap.add_argument("--set", nargs="*", default=[], help="extra --set overrides for every run")
    ap.add_argument(
        "--default-malloc",
        action="store_true",
        help="do not keep freed memory (glassgpt train does, for both models otherwise)",
    )
    args = ap.parse_args()
    if args.device == "cuda":
        import transformers

        print(f"torch {torch.__version__}, transformers {transformers.__version__}")
        gpu_throughput(args)
        return
    torch.set_num_threads(args.threads)
    import transformers

    from glassgpt.train.distributed import keep_freed_memory

    kept = False if args.default_malloc else keep_freed_memory()

    from glassgpt.kernels.policy import native_bf16

    bf16 = "native" if native_bf16() else "none (glassgpt's bf16 products: float32 on bf16 values)"
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} threads; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; malloc keeps freed memory: {kept}; "
        f"CPU bf16 arithmetic: {bf16}"
    )
    if not args.skip_throughput:
        throughput(args.shapes, args.precisions, args.steps, args.repeats, args.clock,
                   compiled=not args.no_compile)  # fmt: skip
    if args.time_to_loss:
        time_to_loss(args.presets, args.data, args.set, args.threads)


if __name__ == "__main__":
    main()
