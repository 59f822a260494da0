"""DDP against FSDP on one multi-GPU machine: memory per rank and tokens per second.

GPT-2 medium (355M, context 1024) in bf16 autocast, trained by glassgpt's own ``Trainer``
with ``train.parallel=ddp`` and then ``train.parallel=fsdp`` (fully_shard per block, bf16
gathered parameters, float32 gradient reduction), each in its own ``torchrun`` launch over
the same GPUs, on the same random tokens and global batch: the median tokens/s over the
timed steps, the peak memory one rank allocated (``torch.cuda.max_memory_allocated``, the
largest over ranks), and beside it the memory model's estimate per rank
(``glassgpt.model.memory.per_rank_memory``, as ``glassgpt describe --world-size W`` shows
it). The first ``--warmup`` steps (compilation, allocator growth) are not timed.

    PYTHONPATH=src python bench/fsdp.py                    # every visible GPU
    PYTHONPATH=src python bench/fsdp.py --gpus 2 --batch-size 16 --steps 20

It needs CUDA GPUs (two or more to mean anything) and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SRC = Path(__file__).resolve().parents[1] / "src"


class RandomTokens:
    """A batch source of uniform random tokens (the same stream on every rank, sliced)."""

    def __init__(self, n_vocab: int, batch: int, seq_len: int, rank: int, device: Any) -> None:
        self.gen = torch.Generator().manual_seed(1234 + rank)
        self.shape, self.n_vocab, self.device = (batch, seq_len + 1), n_vocab, device

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, self.n_vocab, self.shape, generator=self.gen)
        return ids[:, :-1], ids[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


def worker(args: argparse.Namespace) -> None:
    """One rank of one launch: train ``--steps`` steps; rank 0 writes the result JSON."""
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.model.memory import per_rank_memory
    from glassgpt.train import distributed as D
    from glassgpt.train.config import TrainConfig
    from glassgpt.train.trainer import Trainer

    ctx = D.init_distributed("cuda")
    config = GPTConfig.preset(args.preset)
    micro = args.batch_size // ctx.world_size
    cfg = TrainConfig(
        max_steps=args.warmup + args.steps,
        batch_size=args.batch_size,
        warmup_steps=10,
        precision="bf16",
        compile=not args.no_compile,
        parallel=args.parallel,
        progress=False,
    )
    torch.manual_seed(0)
    model = GPT(config)
    batches = RandomTokens(config.n_vocab, micro, config.n_ctx, ctx.rank, ctx.device)
    trainer = Trainer(model, cfg, batches, ctx=ctx, log=lambda msg: None)
    times: list[float] = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.reset_peak_memory_stats(ctx.device)
        torch.cuda.synchronize(ctx.device)
        started = time.perf_counter()
        trainer.train_step()
        torch.cuda.synchronize(ctx.device)
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    peak = torch.tensor(float(torch.cuda.max_memory_allocated(ctx.device)), device=ctx.device)
    torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
    if ctx.is_main:
        estimate = per_rank_memory(
            config, micro, config.n_ctx, "bfloat16", world_size=ctx.world_size,
            parallel=args.parallel,
        )  # fmt: skip
        result = {
            "parallel": args.parallel,
            "world_size": ctx.world_size,
            "gpu": D.device_name(ctx.device),
            "tok_s": args.batch_size * config.n_ctx / statistics.median(times),
            "peak_bytes": int(peak.item()),
            "estimate_bytes": estimate.total,
            "loss": trainer.last_loss,
        }
        Path(args.result).write_text(json.dumps(result))
    D.shutdown(ctx)


def launch(args: argparse.Namespace, parallel: str, gpus: int, result: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={gpus}", __file__, "--worker", "--parallel", parallel,
           "--result", str(result), "--preset", args.preset,
           "--batch-size", str(args.batch_size), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + (["--no-compile"] if args.no_compile else [])  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(cmd, env=env, check=True)
    return json.loads(result.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=None, help="processes (default: every GPU)")
    p.add_argument("--preset", default="gpt2-medium")
    p.add_argument("--batch-size", type=int, default=None, help="global (default 4 per GPU)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if not torch.cuda.is_available():
        sys.exit("bench/fsdp.py needs CUDA GPUs (run it on a machine with two or more)")
    gpus = args.gpus or torch.cuda.device_count()
    args.batch_size = args.batch_size or 4 * gpus
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for parallel in ("ddp", "fsdp"):
            rows.append(launch(args, parallel, gpus, Path(tmp) / f"{parallel}.json"))
    gib = 2**30
    print(f"\n{args.preset}, {gpus} × {rows[0]['gpu']}, global batch {args.batch_size} × "
          f"context, bf16 autocast, {args.steps} timed steps")  # fmt: skip
    print(f"{'parallel':<9} {'tokens/s':>10} {'peak GiB/rank':>14} {'model GiB/rank':>15} "
          f"{'last loss':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['parallel']:<9} {r['tok_s']:>10,.0f} {r['peak_bytes'] / gib:>14.2f} "
              f"{r['estimate_bytes'] / gib:>15.2f} {r['loss']:>10.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
