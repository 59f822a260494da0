"""The steps of one training run, each a function: data → config → files → model → trainer → report.

:func:`glassgpt.train.run.train_main` resolves the run and owns its folder; :func:`train`
here composes the rest, on every rank.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glassgpt import checkpoint as ckpt
from glassgpt import console
from glassgpt.data import BatchSampler, iter_eval_batches
from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.family import SIDECARS
from glassgpt.train import distributed as D
from glassgpt.train import rng
from glassgpt.train.config import RunConfig, applicable, dump_toml
from glassgpt.train.device import resolve_precision
from glassgpt.train.init_from import InitFrom
from glassgpt.train.inputs import RunData, check_memory, resolve_data
from glassgpt.train.inspection import inspect_every, inspector, plot_inspection
from glassgpt.train.plots import plot_metrics
from glassgpt.train.resolve import ResolvedRun
from glassgpt.train.trackers import RunInfo, Trackers, require
from glassgpt.train.trainer import Trainer
from glassgpt.version import __version__

OnEval = Callable[[torch.nn.Module, int], "str | None"]  # a sample after an evaluation
# builds ``on_eval`` once the tokenizer is known (glassgpt.sample.training's, with generate)
Sampler = Callable[[RunConfig, RunData], OnEval]


@dataclass
class Plan:
    """A resolved run and where it goes: what ``glassgpt train`` was asked to do."""

    run: ResolvedRun
    out_dir: Path
    checkpoint: ckpt.Checkpoint | None = None
    init: InitFrom | None = None


def say_on(ctx: D.DistContext) -> Any:
    return print if ctx.is_main else (lambda *a, **k: None)


def prepare_data(plan: Plan, ctx: D.DistContext) -> RunData:
    """The data folder and tokenizer (rank 0 prepares; the others open what it wrote)."""
    pre = plan.run.config
    sidecars: dict[str, bytes] = {}  # its config and chat template: each checkpoint keeps them
    if plan.checkpoint is not None:
        tok_json = plan.checkpoint.files.get("tokenizer.json")
        sidecars = {n: plan.checkpoint.files[n] for n in SIDECARS if n in plan.checkpoint.files}
    else:
        tok_json = plan.init.tokenizer_json if plan.init is not None else None
        sidecars = dict(plan.init.tokenizer_files) if plan.init is not None else {}
    run_data = None
    if ctx.is_main:
        plan.out_dir.mkdir(parents=True, exist_ok=True)
        print(f"glassgpt {__version__}: preparing data in {plan.out_dir}", flush=True)
        run_data = resolve_data(pre.data, plan.out_dir, tokenizer_json=tok_json,
                                tokenizer_files=sidecars, progress=pre.train.progress)  # fmt: skip
    D.barrier(ctx)
    if run_data is None:
        run_data = resolve_data(pre.data, plan.out_dir, tokenizer_json=tok_json,
                                tokenizer_files=sidecars, prepare=False)  # fmt: skip
    return run_data


def micro_batch(cfg: RunConfig, ctx: D.DistContext) -> int:
    """Sequences per micro-step on each rank (the global batch split over ranks and steps)."""
    world = ctx.world_size * cfg.train.grad_accum
    if cfg.train.batch_size % world:
        raise ConfigError(
            "train.batch_size",
            f"{cfg.train.batch_size} is not divisible by {ctx.world_size} processes × "
            f"grad_accum={cfg.train.grad_accum}",
        )
    micro = cfg.train.batch_size // world
    autocast_dtype, _ = resolve_precision(cfg.train.precision, ctx.device)
    check_memory(cfg, micro, autocast_dtype or torch.float32, ctx.device, ctx.local_world_size,
                 world_size=ctx.world_size)  # fmt: skip
    return micro


def write_run_files(
    cfg: RunConfig, plan: Plan, run_data: RunData, ctx: D.DistContext, argv: Sequence[str] | None
) -> str:
    """Save the resolved config (only the fields that apply) and ``run.json``; print where."""
    shown = applicable(cfg.to_dict())
    config_toml = dump_toml(shown)
    if not ctx.is_main:
        return config_toml
    if plan.init is not None:
        print(f"fine-tuning {plan.init.path}: its weights, architecture and tokenizer")
    atomic_write(plan.out_dir / ckpt.CONFIG, config_toml.encode())
    print(f"run: {plan.out_dir} (the full config: {plan.out_dir / ckpt.CONFIG})", flush=True)
    info = {
        "command": list(argv) if argv is not None else sys.argv,
        "glassgpt_version": __version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "world_size": ctx.world_size,
        "device": str(ctx.device),
        "device_name": D.device_name(ctx.device),
        "backend": D.backend(ctx),
        "resumed_from": str(plan.checkpoint.path) if plan.checkpoint else None,
        "init_from": str(plan.init.path) if plan.init else None,
        "data": str(run_data.data.path),
        "config": shown,
    }
    atomic_write(plan.out_dir / "run.json", json.dumps(info, indent=1).encode())
    return config_toml


def build_model(cfg: RunConfig, plan: Plan, ctx: D.DistContext) -> torch.nn.Module:
    """GPT(cfg.model), seeded; with ``--init-from``, carrying the source's weights."""
    rng.seed_everything(cfg.seed)
    model = GPT(cfg.model)
    if plan.init is not None:
        try:
            model.load_state_dict(plan.init.state)
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise GlassError(f"--init-from {plan.init.path}: weights do not fit: {first}") from None
    if ctx.rank:
        torch.manual_seed(cfg.seed + ctx.rank)  # distinct dropout masks per rank
    return model


def describe_run(
    cfg: RunConfig, model: torch.nn.Module, run_data: RunData, ctx: D.DistContext
) -> None:
    """Two lines: the model's shape and parameters, data, devices, batch; then the steps."""
    n_params = sum(p.numel() for p in model.parameters())
    m, t = cfg.model, cfg.train
    layers = f"{m.n_layers} layer{'s' if m.n_layers != 1 else ''}"
    shape = f"{layers}, d_model {m.d_model}, {m.n_heads} heads, n_ctx {m.n_ctx}"
    train_tokens = run_data.data.split("train").tokens
    where = f"{ctx.world_size} × {ctx.device}"
    if ctx.device.type == "cuda":
        where += f" ({D.device_name(ctx.device)})"
    else:
        threads = torch.get_num_threads()
        where += f", {threads} thread{'s' if threads != 1 else ''}"
        if cfg.train.threads is None and os.environ.get("OMP_NUM_THREADS"):
            where += " (OMP_NUM_THREADS)"
    vocab = f"n_vocab {run_data.tokenizer.n_vocab}"
    if cfg.model.n_vocab != run_data.tokenizer.n_vocab:
        vocab += f" (model {cfg.model.n_vocab})"
    accum = f" in {cfg.train.grad_accum} micro-batches" if cfg.train.grad_accum > 1 else ""
    say_on(ctx)(
        f"model: {shape}: {n_params:,} parameters | data: {train_tokens:,} train tokens, "
        f"{vocab} | {where} | batch {t.batch_size} × {cfg.seq_len}{accum}",
        flush=True,
    )
    saves = f"every {t.checkpoint_every} steps" if t.checkpoint_every else "at the end"
    say_on(ctx)(
        f"train: {t.max_steps:,} steps, {t.optimizer} lr {t.lr:g} → {t.min_lr:g} "
        f"({t.schedule}, {t.warmup_steps} warmup), eval every {t.eval_every}, checkpoints "
        f"{saves}",
        flush=True,
    )


def sample_prompt(cfg: RunConfig, run_data: RunData) -> list[int]:
    """The ids of ``train.sample_prompt`` (where it does not encode: the data's document
    separator, else id 0): where the periodic samples start."""
    try:
        ids = list(run_data.tokenizer.encode(cfg.train.sample_prompt))
    except (GlassError, KeyError, ValueError):
        ids = []
    return ids or list(run_data.data.meta.separator_ids) or [0]


def make_trainer(
    cfg: RunConfig,
    model: torch.nn.Module,
    run_data: RunData,
    micro: int,
    ctx: D.DistContext,
    out_dir: Path,
    config_toml: str,
    sampler: Sampler | None = None,
) -> Trainer:
    """The Trainer over this run's batches and validation windows; ``sampler`` makes its
    periodic samples."""
    batches = BatchSampler(
        run_data.data,
        "train",
        batch_size=micro,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        device=ctx.device if ctx.device.type == "cuda" else None,  # pinned, asynchronous copies
        repeat_spans=cfg.data.repeat_spans,
    )

    def eval_data() -> Any:
        return iter_eval_batches(
            run_data.data,
            "val",
            batch_size=micro,
            seq_len=cfg.seq_len,
            max_batches=cfg.train.eval_batches,
            rank=ctx.rank,
            world_size=ctx.world_size,
        )

    every = inspect_every(cfg)
    return Trainer(
        model,
        cfg.train,
        batches,
        eval_data=eval_data,
        ctx=ctx,
        out_dir=out_dir,
        checkpoint_files={
            ckpt.CONFIG: config_toml.encode(),
            "tokenizer.json": run_data.tokenizer_json,
            **run_data.tokenizer_files,
        },
        bytes_per_token=run_data.bytes_per_token,
        on_eval=sampler(cfg, run_data) if sampler is not None else None,
        inspect=inspector(cfg, run_data, ctx.device) if every and ctx.is_main else None,
        inspect_every=every,
    )


def open_trackers(cfg: RunConfig, out_dir: Path, config_toml: str, ctx: D.DistContext) -> Any:
    """The experiment trackers of ``log.to`` (rank 0; None when there are none)."""
    if not cfg.log.to or not ctx.is_main:
        return None
    info = RunInfo(
        out_dir=out_dir,
        name=cfg.log.name or out_dir.resolve().name,
        project=cfg.log.project,
        group=cfg.log.group,
        config=applicable(cfg.to_dict()),
        config_toml=config_toml,
    )
    return Trackers(cfg.log.to, info)


def report(result: dict[str, Any], trainer: Any, out_dir: Path, ctx: D.DistContext) -> int:
    """The loss plot and the closing line; the exit status (128 + signal when stopped)."""
    if ctx.is_main:
        metrics = out_dir / "metrics.jsonl"
        if metrics.exists():
            plot_metrics(metrics, out_dir / "loss.png")
            plot_inspection(metrics, out_dir / "circuits.png")
        if trainer.tracker is not None:
            for name in ("loss", "circuits"):
                trainer.tracker.image(f"plots/{name}", out_dir / f"{name}.png", result["step"])
            trainer.tracker.close()
        stopped = result["ended"] == "signal"
        print(
            f"{'interrupted' if stopped else 'done'}: step {result['step']}"
            f"{f' of {trainer.cfg.max_steps}' if stopped else ''}, loss {trainer.last_loss:.4f}, "
            f"best val loss {result['best_val_loss']:.4f}, {result['wall_s']:.1f} s; weights in "
            f"{out_dir / 'ckpt' / 'best'}, curves in {out_dir / 'loss.png'}"
        )
        if stopped:
            print(f"continue it with: glassgpt train --resume {shlex.quote(str(out_dir))}")
    if result["ended"] == "signal":
        return 128 + int(result["signal"])
    return 0


def train(
    plan: Plan, ctx: D.DistContext, argv: Sequence[str] | None, sampler: Sampler | None = None
) -> int:
    """Data → config → files → model → trainer → fit → report; ``sampler`` makes the
    periodic samples (None: no samples)."""
    say = say_on(ctx)
    require(plan.run.config.log.to)  # a missing package says so before any work
    run_data = prepare_data(plan, ctx)
    cfg = plan.run.with_vocab(run_data.tokenizer.n_vocab)
    micro = micro_batch(cfg, ctx)
    config_toml = write_run_files(cfg, plan, run_data, ctx, argv)
    model = build_model(cfg, plan, ctx)
    describe_run(cfg, model, run_data, ctx)
    trainer = make_trainer(cfg, model, run_data, micro, ctx, plan.out_dir, config_toml, sampler)
    if trainer.checkpoints is not None and trainer.checkpoints.removed:
        console.say(f"removed {trainer.checkpoints.removed} leftover(s) of interrupted checkpoint "
             f"writes in {trainer.checkpoints.root}")  # fmt: skip
    if trainer.compiled:
        say("torch.compile: on (the first step compiles the model, about a minute)", flush=True)
    if plan.checkpoint is not None:
        trainer.load_checkpoint(plan.checkpoint)
        say(f"resumed from {plan.checkpoint.path} at step {trainer.step}", flush=True)
    trainer.tracker = open_trackers(cfg, plan.out_dir, config_toml, ctx)
    return report(trainer.fit(), trainer, plan.out_dir, ctx)
