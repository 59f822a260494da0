"""``glassgpt train``: config → data + tokenizer → GPT → Trainer → checkpoints, plots, samples.

    resolve_run (preset | file, --data, --set; the checkpoint's for --resume; the source
      model's for --init-from)
    → data folder + tokenizer (glassgpt.data; OUT/data when prepared here)
    → model.n_vocab from the tokenizer → memory check → GPT(config) on each rank's device
    → Trainer(GPT, BatchSampler, eval windows) .fit() → OUT/loss.png, a sample

Rank 0 writes ``OUT/config.toml`` (the resolved config), ``OUT/run.json`` (command line,
versions, devices), ``OUT/metrics.jsonl``, ``OUT/ckpt/`` and ``OUT/loss.png``.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glassgpt import checkpoint as ckpt
from glassgpt.checkpoint import open_run
from glassgpt.console import say
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.train import distributed as D
from glassgpt.train.config import (
    RESUMABLE_KEYS,
    RunConfig,
    build_run_config,
    config_diff,
    raw_run_config,
)
from glassgpt.train.init_from import check_shapes, init_raw, load_init
from glassgpt.train.lock import LOCK_NAME, RunLock
from glassgpt.train.metrics import read_metrics
from glassgpt.train.parallel import check_parallel
from glassgpt.train.resolve import resolve_run
from glassgpt.train.session import Plan, Sampler, train

__all__ = ["train_main"]


def _default_out(preset: str | None, config_file: str | None) -> Path:
    name = Path(config_file).stem if config_file else (preset or "default")
    return fresh_folder(Path("runs") / name)


def fresh_folder(path: Path) -> Path:
    """``path``, else ``path-2``, ``path-3``, …: the first that is absent or empty (a fresh run
    without ``-o`` never lands on an old one; with ``-o`` the folder is the user's choice).

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "default").mkdir(); (root / "default" / "config.toml").touch()
    >>> fresh_folder(root / "default").name, fresh_folder(root / "other").name
    ('default-2', 'other')
    """
    candidate, k = path, 1
    while candidate.exists() and (
        not candidate.is_dir() or any(p.name != LOCK_NAME for p in candidate.iterdir())
    ):
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    if candidate != path:
        say(f"{path} already holds a run; this one goes to {candidate} (-o DIR chooses)")
    return candidate


def plan_run(
    *,
    preset: str | None = None,
    config_file: str | None = None,
    data_paths: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    resume: str | None = None,
    out: str | None = None,
    init_from: str | None = None,
) -> Plan:
    """Resolve the run (validated once, before anything starts) and where it goes."""
    if resume is not None and init_from is not None:
        raise ConfigError("--init-from", "a resumed run continues its own weights; drop --resume")
    if init_from is not None:
        init = load_init(init_from)
        base = init_raw(init, raw_run_config(preset=preset, config_file=config_file))
        run = resolve_run(base=base, data_paths=data_paths, overrides=overrides)
        check_shapes(init, run.config.model)
        default = Path("runs") / f"{Path(init_from).resolve().name}-finetune"
        return Plan(run, Path(out) if out else fresh_folder(default), init=init)
    if resume is None:
        run = resolve_run(
            preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
        )
        if config_file is not None and not run.raw.get("model"):
            say(f"{config_file} sets no [model] table: the model is GPT-2 small's defaults "
                f"({run.config.model.n_layers} layers, d_model {run.config.model.d_model})")  # fmt: skip
        return Plan(run, Path(out) if out else _default_out(preset, config_file))
    checkpoint, saved_raw = _latest(resume)
    try:
        saved = build_run_config(saved_raw)
    except GlassError as e:
        raise ckpt.CheckpointError(f"{checkpoint.path}: {e}") from None
    if preset is not None or config_file is not None:
        run = resolve_run(
            preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
        )
    else:
        run = resolve_run(base=saved_raw, data_paths=data_paths, overrides=overrides)
    _check_resume(saved, run.with_vocab(saved.model.n_vocab), checkpoint.path)
    run_dir = checkpoint.path.parent.parent
    return Plan(run, Path(out) if out else run_dir, checkpoint=checkpoint)


def _latest(resume: str) -> tuple[ckpt.Checkpoint, dict[str, Any]]:
    """The newest valid checkpoint under ``resume`` (from a step folder: it, else an older
    one), each one skipped a warning line, and the config it saved."""
    run = open_run(resume, which="latest", weights=False, warn=lambda m: say(m, kind="warning"))
    assert run.checkpoint is not None
    return run.checkpoint, run.config


def _check_resume(saved: RunConfig, wanted: RunConfig, where: Path) -> None:
    diff = {k: v for k, v in config_diff(saved, wanted).items() if k not in RESUMABLE_KEYS}
    if diff:
        shown = "; ".join(f"{k}: {a!r} → {b!r}" for k, (a, b) in list(diff.items())[:4])
        more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
        raise ConfigError(
            next(iter(diff)),
            f"cannot resume {where} with a different config: {shown}{more}; only "
            "train.max_steps and logging/eval/checkpoint cadence may change on resume",
        )


def finished_message(plan: Plan) -> str | None:
    """For ``--resume`` of a run already at ``train.max_steps``: what it reached."""
    checkpoint, max_steps = plan.checkpoint, plan.run.config.train.max_steps
    if checkpoint is None or checkpoint.step < max_steps:
        return None
    try:
        records = read_metrics(plan.out_dir / "metrics.jsonl")
    except GlassError:
        records = []
    done = [r for r in records if r.get("step", 0) <= checkpoint.step]
    losses = [r["loss"] for r in done if isinstance(r.get("loss"), float)]
    vals = [r["val_loss"] for r in done if isinstance(r.get("val_loss"), float)]
    reached = f"train loss {losses[-1]:.4f}" if losses else "no logged loss"
    if vals:
        reached += f", val loss {vals[-1]:.4f} (best {min(vals):.4f})"
    return (
        f"{plan.out_dir} is already finished: step {checkpoint.step} of train.max_steps="
        f"{max_steps}, {reached}; to train on, raise it: --set train.max_steps=N"
    )


def train_main(
    *,
    preset: str | None = None,
    config_file: str | None = None,
    data_paths: Sequence[str] | None = None,
    out: str | None = None,
    overrides: Sequence[str] = (),
    resume: str | None = None,
    argv: Sequence[str] | None = None,
    overwrite: bool = False,
    init_from: str | None = None,
    sampler: Sampler | None = None,
) -> int:
    """The whole job behind ``glassgpt train``; returns the exit status. ``sampler`` makes
    the periodic samples (``glassgpt.sample.training.periodic_sampler``; None: no samples)."""
    plan = plan_run(
        preset=preset,
        config_file=config_file,
        data_paths=data_paths,
        overrides=overrides,
        resume=resume,
        out=out,
        init_from=init_from,
    )
    message = finished_message(plan)
    if message is not None:
        print(message)
        return 0
    out_dir, cfg = plan.out_dir, plan.run.config
    if out_dir.exists() and not out_dir.is_dir():
        raise InputFileError(f"--out {out_dir}: a file is there, not a run folder")
    ctx = D.init_distributed(cfg.train.device, cfg.train.threads, tf32=cfg.train.tf32)
    check_parallel(cfg.train, ctx, argv=argv)  # fsdp without a process group: one line
    if ctx.device.type == "cpu":
        D.keep_freed_memory()  # the CPU trainer's allocator setting: see its docstring
    lock = RunLock(out_dir, note=say) if ctx.is_main else None
    try:
        if lock is not None:
            lock.acquire()  # before anything in the folder is read, removed or written
            _claim_folder(out_dir, fresh=plan.checkpoint is None, overwrite=overwrite)
        return train(plan, ctx, argv, sampler)
    except KeyboardInterrupt:  # a second Ctrl-C: at once, from the last checkpoint written
        if ctx.is_main and ckpt.step_folders(out_dir / "ckpt"):
            say(f"interrupted; continue from the last checkpoint with: {resume_command(out_dir)}")
        raise
    finally:
        if lock is not None:
            lock.release()
        D.shutdown(ctx)


def resume_command(out_dir: Path) -> str:
    """The command that continues the run in ``out_dir``.

    >>> resume_command(Path("runs/my run"))
    "glassgpt train --resume 'runs/my run'"
    """
    return f"glassgpt train --resume {shlex.quote(str(out_dir))}"


def _claim_folder(out_dir: Path, *, fresh: bool, overwrite: bool) -> None:
    """A fresh run starts in an empty folder (``overwrite``: emptied)."""
    entries = sorted(p for p in out_dir.iterdir() if p.name != LOCK_NAME)
    if fresh and entries:
        if not overwrite:
            steps = ckpt.step_folders(out_dir / "ckpt")
            what = f"a run (checkpoint {steps[0].name})" if steps else (
                "files (" + ", ".join(p.name for p in entries[:3])
                + (", …" if len(entries) > 3 else "") + ")"
            )  # fmt: skip
            raise GlassError(
                f"{out_dir} already holds {what}; continue it with --resume {out_dir}, "
                "replace it with --overwrite, or pass another --out"
            )
        for p in entries:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        say(f"--overwrite: removed the earlier contents of {out_dir}")
