"""``glassgpt train``: config → data + tokenizer → GPT → Trainer → checkpoints, plots, samples.

    resolve config (preset | file, --data, --set; or the checkpoint's, for --resume)
    → data folder + tokenizer (glassgpt.data; OUT/data when prepared here)
    → model.n_vocab from the tokenizer → memory check → GPT(config) on each rank's device
    → Trainer(GPT, BatchSampler, eval windows) .fit() → OUT/loss.png, a sample

Rank 0 writes ``OUT/config.toml`` (the resolved config), ``OUT/run.json`` (command line,
versions, devices), ``OUT/metrics.jsonl``, ``OUT/ckpt/`` and ``OUT/loss.png``.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from glassgpt import checkpoint as ckpt
from glassgpt.config import apply_overrides, load_toml, merge
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.storage import atomic_write
from glassgpt.train import distributed as D
from glassgpt.train import rng
from glassgpt.train.config import (
    RESUMABLE_KEYS,
    RunConfig,
    build_run_config,
    config_diff,
    dump_toml,
    raw_run_config,
)
from glassgpt.train.inputs import check_memory, resolve_data
from glassgpt.train.lock import LOCK_NAME, RunLock
from glassgpt.version import __version__


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt: Sequence[int],
    n_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    n_valid: int | None = None,
) -> list[int]:
    """Continue ``prompt`` by ``n_tokens`` draws from softmax(logits_T / temperature), top-k.

    A plain loop without a KV cache (glassgpt.sample brings the fast one); it draws from its
    own ``generator`` so it never moves the training RNG. Only ids below ``n_valid`` (the
    tokenizer's vocabulary, when the model's is padded) are drawn.
    """
    device = next(model.parameters()).device
    n_ctx = model.config.n_ctx
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)  # [1, T]
    for _ in range(n_tokens):
        logits = model(ids[:, -n_ctx:])[0, -1].float() / temperature  # [n_vocab]
        if n_valid is not None:
            logits = logits[:n_valid]
        if top_k is not None and top_k < logits.numel():
            kth = torch.topk(logits, top_k).values[-1]
            logits = logits.masked_fill(logits < kth, -float("inf"))
        probs = torch.softmax(logits, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)  # [1]
        ids = torch.cat([ids, nxt[None]], dim=1)
    return ids[0, len(prompt) :].tolist()


def _prompt_ids(tokenizer: Any, text: str, fallback: Sequence[int]) -> list[int]:
    try:
        ids = list(tokenizer.encode(text))
    except (GlassError, KeyError, ValueError):
        ids = []
    return ids or list(fallback) or [0]


def _default_out(preset: str | None, config_file: str | None) -> Path:
    name = Path(config_file).stem if config_file else (preset or "default")
    return Path("runs") / name


def _resolve(
    *,
    preset: str | None,
    config_file: str | None,
    data_paths: Sequence[str] | None,
    overrides: Sequence[str],
    resume: str | None,
    out: str | None,
) -> tuple[dict[str, Any], Path, ckpt.Checkpoint | None]:
    """(raw config, output folder, checkpoint to resume from or None)."""
    if resume is None:
        raw = raw_run_config(
            preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
        )
        out_dir = Path(out) if out else _default_out(preset, config_file)
        return raw, out_dir, None
    checkpoint = ckpt.find_resumable(resume)
    try:
        saved = _saved_config(checkpoint)
    except GlassError as e:
        raise ckpt.CheckpointError(f"{checkpoint.path}: {e}") from None
    if preset is not None or config_file is not None:
        raw = raw_run_config(
            preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
        )
    else:
        raw = saved
        if data_paths:
            raw = merge(raw, {"data": {"paths": [str(p) for p in data_paths]}})
        raw = apply_overrides(raw, overrides)
    run_dir = checkpoint.path.parent.parent
    return raw, Path(out) if out else run_dir, checkpoint


def _saved_config(checkpoint: ckpt.Checkpoint) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(checkpoint.text("config.toml"), "utf-8")
        return load_toml(path)


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
) -> int:
    """The whole job behind ``glassgpt train``; returns the exit status."""
    raw, out_dir, checkpoint = _resolve(
        preset=preset,
        config_file=config_file,
        data_paths=data_paths,
        overrides=overrides,
        resume=resume,
        out=out,
    )
    first = build_run_config(raw)  # validates before anything is started or written
    if config_file is not None and resume is None and not raw.get("model"):
        _note(f"{config_file} sets no [model] table: the model is GPT-2 small's defaults "
              f"({first.model.n_layers} layers, d_model {first.model.d_model})")  # fmt: skip
    if checkpoint is not None:
        saved = build_run_config(_saved_config(checkpoint))
        wanted = build_run_config(raw, n_vocab=saved.model.n_vocab)
        _check_resume(saved, wanted, checkpoint.path)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputFileError(f"--out {out_dir}: a file is there, not a run folder")
    ctx = D.init_distributed(first.train.device, first.train.threads, tf32=first.train.tf32)
    if ctx.device.type == "cpu":
        D.keep_freed_memory()  # the CPU trainer's allocator setting: see its docstring
    lock = RunLock(out_dir, note=_note) if ctx.is_main else None
    try:
        if lock is not None:
            lock.acquire()  # before anything in the folder is read, removed or written
            _claim_folder(out_dir, fresh=checkpoint is None, overwrite=overwrite)
        return _train(raw, out_dir, checkpoint, ctx, argv)
    finally:
        if lock is not None:
            lock.release()
        D.shutdown(ctx)


def _note(message: str) -> None:
    print(f"glassgpt: note: {message}", file=sys.stderr, flush=True)


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
        _note(f"--overwrite: removed the earlier contents of {out_dir}")


def _train(
    raw: dict[str, Any],
    out_dir: Path,
    checkpoint: ckpt.Checkpoint | None,
    ctx: D.DistContext,
    argv: Sequence[str] | None,
) -> int:
    from glassgpt.data import BatchSampler, iter_eval_batches
    from glassgpt.model import GPT
    from glassgpt.train.plots import plot_metrics
    from glassgpt.train.trainer import Trainer, resolve_precision

    say = print if ctx.is_main else (lambda *a, **k: None)
    pre = build_run_config(raw)
    tok_json = checkpoint.files.get("tokenizer.json") if checkpoint else None
    if ctx.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        say(f"glassgpt {__version__}: preparing data in {out_dir}", flush=True)
        run_data = resolve_data(
            pre.data, out_dir, tokenizer_json=tok_json, progress=pre.train.progress
        )
    D.barrier(ctx)
    if not ctx.is_main:
        run_data = resolve_data(pre.data, out_dir, tokenizer_json=tok_json, prepare=False)
    tokenizer = run_data.tokenizer
    cfg = build_run_config(raw, n_vocab=tokenizer.n_vocab)
    world = ctx.world_size * cfg.train.grad_accum
    if cfg.train.batch_size % world:
        raise ConfigError(
            "train.batch_size",
            f"{cfg.train.batch_size} is not divisible by {ctx.world_size} processes × "
            f"grad_accum={cfg.train.grad_accum}",
        )
    micro = cfg.train.batch_size // world
    autocast_dtype, _ = resolve_precision(cfg.train.precision, ctx.device)
    check_memory(cfg, micro, autocast_dtype or torch.float32, ctx.device, ctx.local_world_size)

    config_toml = dump_toml(cfg.to_dict())
    if ctx.is_main:
        say(config_toml, end="", flush=True)
        atomic_write(out_dir / "config.toml", config_toml.encode())
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
            "resumed_from": str(checkpoint.path) if checkpoint else None,
            "data": str(run_data.data.path),
            "config": cfg.to_dict(),
        }
        atomic_write(out_dir / "run.json", json.dumps(info, indent=1).encode())

    rng.seed_everything(cfg.seed)
    model = GPT(cfg.model)
    if ctx.rank:
        torch.manual_seed(cfg.seed + ctx.rank)  # distinct dropout masks per rank
    n_params = sum(p.numel() for p in model.parameters())
    train_tokens = run_data.data.split("train").tokens
    where = f"{ctx.world_size} × {ctx.device}"
    if ctx.device.type == "cuda":
        where += f" ({D.device_name(ctx.device)})"
    else:
        where += f", {torch.get_num_threads()} threads"
    vocab = f"n_vocab {tokenizer.n_vocab}"
    if cfg.model.n_vocab != tokenizer.n_vocab:
        vocab += f" (model {cfg.model.n_vocab})"
    say(
        f"model: {n_params:,} parameters | data: {train_tokens:,} train tokens, {vocab} | "
        f"{where} | batch {cfg.train.batch_size} × {cfg.seq_len}"
        + (f" in {cfg.train.grad_accum} micro-batches" if cfg.train.grad_accum > 1 else ""),
        flush=True,
    )
    batches = BatchSampler(
        run_data.data,
        "train",
        batch_size=micro,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        device=ctx.device if ctx.device.type == "cuda" else None,  # pinned, asynchronous copies
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

    separator = list(run_data.data.meta.separator_ids)
    prompt = _prompt_ids(tokenizer, cfg.train.sample_prompt, separator)

    def on_eval(m: torch.nn.Module, step: int) -> str | None:
        if not cfg.train.sample_tokens:
            return None
        gen = torch.Generator(device=ctx.device).manual_seed(cfg.seed + step)
        ids = sample(
            m,
            prompt,
            cfg.train.sample_tokens,
            temperature=cfg.train.sample_temperature,
            top_k=cfg.train.sample_top_k,
            generator=gen,
            n_valid=tokenizer.n_vocab,
        )
        return "sample: " + tokenizer.decode(prompt + ids)

    trainer = Trainer(
        model,
        cfg.train,
        batches,
        eval_data=eval_data,
        ctx=ctx,
        out_dir=out_dir,
        checkpoint_files={
            "config.toml": config_toml.encode(),
            "tokenizer.json": run_data.tokenizer_json,
        },
        bytes_per_token=run_data.bytes_per_token,
        on_eval=on_eval,
    )
    if trainer.checkpoints is not None and trainer.checkpoints.removed:
        _note(f"removed {trainer.checkpoints.removed} leftover(s) of interrupted checkpoint "
              f"writes in {trainer.checkpoints.root}")  # fmt: skip
    if trainer.compiled:
        say("torch.compile: on (the first step compiles the model, about a minute)", flush=True)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
        say(f"resumed from {checkpoint.path} at step {trainer.step}", flush=True)
    result = trainer.fit()
    if ctx.is_main:
        metrics = out_dir / "metrics.jsonl"
        if metrics.exists():
            plot_metrics(metrics, out_dir / "loss.png")
        best = result["best_val_loss"]
        say(
            f"done: step {result['step']}, loss {trainer.last_loss:.4f}, best val loss "
            f"{best:.4f}, {result['wall_s']:.1f} s; weights in {out_dir / 'ckpt' / 'best'}, "
            f"curves in {out_dir / 'loss.png'}"
        )
    if result["ended"] == "signal":
        return 128 + int(result["signal"])
    return 0
