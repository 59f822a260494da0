"""The training loop for any ``model(x, y) -> (logits, loss)``: minimise E[loss] by AdamW.

One optimizer step s, on each of W ranks with A micro-batches (x_a, y_a) of the rank's share:

    g = ∇_θ (1/A) Σ_a loss(θ; x_a, y_a)          (averaged over ranks by DDP's all-reduce)
    g ← g · min(1, c / ‖g‖₂)                       (clipping at c = grad_clip)
    θ ← AdamW(θ, g, η = lr_at(s))

under autocast (bf16 on CPU and GPU; fp16 with a GradScaler on GPUs without bf16). Around
it: evaluation every k steps (val loss, perplexity, bits per byte), JSONL metrics, a
progress bar, an inspection of the model every k steps (head scores and the like, given by the
caller, into the metrics), a tracker told every metrics line, checkpoints (every k steps, at
the end, on SIGINT/SIGTERM; ``best`` on a new lowest val loss), a stop with a clear message on a NaN or infinite loss, and exact resume.
The trainer knows nothing about GPT.

On a GPU the step never waits for the device: its loss and gradient norm are copied to
pinned host memory behind a CUDA event, and :meth:`Trainer.fit` reads them one step later,
while the device already runs the next step (``torch.cuda.set_sync_debug_mode`` sees no
synchronising call in the loop). A NaN is then caught one step late, before any checkpoint,
evaluation or log line is written.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from glassgpt import checkpoint as ckpt
from glassgpt import kernels
from glassgpt.errors import GlassError
from glassgpt.train import distributed_checkpoint as dckpt
from glassgpt.train import parallel, rng
from glassgpt.train.collector import collect_between_steps
from glassgpt.train.config import TrainConfig
from glassgpt.train.device import (  # noqa: F401  (re-exported: the trainer's public helpers)
    PendingStep,
    Stamp,
    cpu_has_bf16,
    resolve_compile,
    resolve_precision,
    seconds_between,
    stamp,
)
from glassgpt.train.distributed import DistContext, all_reduce_mean, any_rank, gather_objects
from glassgpt.train.metrics import MetricsLog, truncate_after
from glassgpt.train.optim import (
    build_optimizer,
    clip_gradients,
    load_optimizer_tensors,
    lr_at,
    optimizer_tensors,
    set_lr,
)
from glassgpt.train.progress import Progress, StepClock, StepTimes, stop_on_signals

Batch = tuple[torch.Tensor, torch.Tensor]


class BatchSource(Protocol):
    """Training batches with a restorable position (e.g. glassgpt.data's BatchSampler)."""

    def __next__(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class TrainingDiverged(GlassError):
    """The loss became NaN or infinite."""


class Trainer:
    """Trains ``model`` on ``batches`` as ``cfg`` says; writes into ``out_dir`` (rank 0)."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        batches: BatchSource,
        *,
        eval_data: Callable[[], Iterable[Batch]] | None = None,
        ctx: DistContext | None = None,
        out_dir: str | Path | None = None,
        checkpoint_files: Mapping[str, bytes] | None = None,
        bytes_per_token: float | None = None,
        on_eval: Callable[[nn.Module, int], str | None] | None = None,
        inspect: Callable[[nn.Module, int], Mapping[str, float]] | None = None,
        inspect_every: int = 0,
        log: Callable[[str], None] = print,
    ) -> None:
        self.ctx = ctx or DistContext()
        self.cfg = cfg
        # sharded, each rank moves only its shards to the device (fully_shard does)
        fsdp = cfg.parallel == "fsdp" and self.ctx.enabled
        self.model = model if fsdp else model.to(self.ctx.device)
        self.batches = batches
        self.eval_data = eval_data
        self.bytes_per_token = bytes_per_token
        self.on_eval = on_eval
        self.inspect = (
            inspect if inspect_every > 0 else None
        )  # named floats every inspect_every steps
        self.inspect_every = inspect_every
        self.tracker: Any = None  # .log(record) after each metrics.jsonl line (rank 0)
        self.log = log if self.ctx.is_main else (lambda msg: None)
        self.checkpoint_files = dict(checkpoint_files or {})
        self.autocast_dtype, use_scaler = resolve_precision(cfg.precision, self.ctx.device)
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        self.sharded = fsdp  # (without a process group the CLI refused train.parallel=fsdp)
        if self.sharded:  # before the optimizer: it holds each rank's shards
            parallel.check_parallel(cfg, self.ctx, self.autocast_dtype)
            self.model = parallel.shard(self.model, self.ctx, self.autocast_dtype)
            self.inspect = None  # inspections read whole weights on rank 0: not of a sharded model
        self.optimizer = build_optimizer(self.model, cfg)
        self._parameters = list(self.model.parameters())  # the clipping's, listed once
        self.step = 0
        self.tokens = 0
        self.best_val_loss = math.inf
        self.last_loss = math.nan
        self.eval_seconds = 0.0  # wall seconds in evaluations (and their samples) so far
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.metrics = None
        self.checkpoints = None
        if self.out_dir is not None and self.ctx.is_main:
            self.metrics = MetricsLog(self.out_dir / "metrics.jsonl")
            self.checkpoints = ckpt.CheckpointManager(self.out_dir / "ckpt", cfg.keep_last)
        self.train_model: nn.Module = self.model
        self.compiled = resolve_compile(cfg.compile, self.ctx.device)
        if self.compiled:
            if self.ctx.device.type == "cpu":  # glassgpt's kernels as opaque calls in the graph
                kernels.register_custom_ops()
            self.train_model = torch.compile(self.model)  # type: ignore[assignment]
        if self.ctx.enabled and not self.sharded:
            ids = [self.ctx.device] if self.ctx.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)
        self._stop: int | None = None

    # -- the step ---------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype)

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over ``grad_accum`` micro-batches; returns its metrics."""
        return self._checked(self.launch_step())

    def launch_step(self) -> PendingStep:
        """Queue one optimizer step on the device without waiting for it (see the module
        docstring); ``.result()`` of what it returns gives the metrics."""
        cfg, model, opt = self.cfg, self.train_model, self.optimizer
        lr = lr_at(self.step, cfg)
        set_lr(opt, lr)
        if not model.training:  # (evaluation switches it back; a walk of every module costs time)
            model.train()
        loss_sum = torch.zeros((), device=self.ctx.device)
        n_tokens = 0
        for micro in range(cfg.grad_accum):
            x, y = next(self.batches)
            x = x.to(self.ctx.device, non_blocking=True)
            y = y.to(self.ctx.device, non_blocking=True)
            n_tokens += x.numel()
            last = micro == cfg.grad_accum - 1
            sync = contextlib.nullcontext()
            if self.ctx.enabled:
                sync = parallel.gradient_sync(self.model if self.sharded else model, last)
            with sync:
                with self._autocast():
                    _, loss = model(x, y)
                scaled = loss / cfg.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach().float()
        loss_mean = all_reduce_mean(loss_sum / cfg.grad_accum, self.ctx)
        norm = torch.full((), math.nan, device=self.ctx.device)
        if cfg.grad_clip > 0:
            if self.scaler:
                self.scaler.unscale_(opt)
            clip = parallel.clip_sharded if self.sharded else clip_gradients
            norm = clip(self._parameters, cfg.grad_clip)
        # A non-finite loss must not move the weights. Where reading it would stall a GPU,
        # the fused AdamW kernel skips the update on the device (its found_inf input, which
        # a GradScaler also uses) and the host raises when it reads the loss a step later.
        if self.scaler:
            self.scaler.step(opt)
            self.scaler.update()
        elif self.ctx.device.type == "cuda" and opt.defaults.get("fused") and not self.sharded:
            opt.found_inf = (~torch.isfinite(loss_mean)).float()  # type: ignore[attr-defined]
            try:
                opt.step()
            finally:
                del opt.found_inf  # type: ignore[attr-defined]
        else:
            loss_value = float(loss_mean)  # free on a CPU
            if not math.isfinite(loss_value):
                opt.zero_grad(set_to_none=True)
                raise TrainingDiverged(self._diverged_message(loss_value, self.step + 1))
            opt.step()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += n_tokens * self.ctx.world_size
        record = {"step": self.step, "lr": lr, "tokens": self.tokens}
        return PendingStep(record, torch.stack([loss_mean.float(), norm.float()]))

    def _checked(self, pending: PendingStep) -> dict[str, Any]:
        record = pending.result()
        loss = record["loss"]
        if not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(self._diverged_message(loss, record["step"]))
        self.last_loss = loss
        return record

    def _diverged_message(self, loss: float, step: int) -> str:
        where = ""
        if self.checkpoints is not None:
            good = ckpt.step_folders(self.checkpoints.root)
            if good:
                where = f"; the last good checkpoint {good[0]} is kept"
        return (
            f"loss became {loss} at step {step}{where}; "
            "lower train.lr, use train.grad_clip, or try train.precision=fp32"
        )

    # -- evaluation ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean val loss over ``eval_data``, perplexity, bits per byte.

        Under DDP, ``eval_data`` yields this rank's share; the token-weighted mean is taken
        over all ranks' shares.
        """
        if self.eval_data is None:
            return {}
        model = self.model
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)
        for x, y in self.eval_data():
            x, y = x.to(self.ctx.device), y.to(self.ctx.device)
            with self._autocast():
                _, loss = model(x, y)
            count = (y != -1).sum()
            total[0] += loss.double() * count
            total[1] += count
        model.train()
        total = all_reduce_mean(total, self.ctx)
        if total[1].item() == 0:
            raise GlassError("the validation split gives no evaluation batch")
        val = (total[0] / total[1]).item()
        out = {"val_loss": val, "val_ppl": math.exp(min(val, 700.0))}
        if self.bytes_per_token:
            out["val_bpb"] = val / (math.log(2) * self.bytes_per_token)
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
        """(tensor files, JSON state) of everything a bit-identical resume needs."""
        if self.sharded:  # the optimizer's shards go through save_checkpoint's DCP
            opt_tensors: dict[str, torch.Tensor] = {}
            groups = [
                {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
            ]
        else:
            opt_tensors, groups = optimizer_tensors(self.optimizer)
        rng_states = gather_objects(rng.capture(), self.ctx)
        sampler_states = gather_objects(rng.to_json(self.batches.state_dict()), self.ctx)
        state = {
            "trainer": {
                "tokens": self.tokens,
                "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
                "world_size": self.ctx.world_size,
                "optimizer_groups": groups,
                "scaler": self.scaler.state_dict() if self.scaler else None,
            },
            "rng": rng_states,
            "sampler": sampler_states,
        }
        tensors = {"model.safetensors": dckpt.full_model_state(self.model)}
        if not self.sharded:
            tensors["optimizer.safetensors"] = opt_tensors
        return tensors, state

    def save_checkpoint(self) -> Path | None:
        """Write ``ckpt/step_*`` (every rank must call this; rank 0 writes)."""
        tensors, state = self.state_dict()
        folders = {}
        if self.sharded and self.out_dir is not None:  # every rank writes its shards
            shards = dckpt.staging(self.out_dir / "ckpt", self.step)
            dckpt.save_optimizer_shards(self.model, self.optimizer, shards)
            folders[dckpt.SHARDS] = shards
        if self.checkpoints is None:
            return None
        return self.checkpoints.save(
            self.step, tensors=tensors, files=self.checkpoint_files, state=state, folders=folders
        )

    def load_checkpoint(self, checkpoint: ckpt.Checkpoint) -> None:
        """Restore model, optimizer, scaler, step, RNG and sampler state (exact resume)."""
        state = checkpoint.state
        try:
            dckpt.load_full_model(self.model, checkpoint.tensors("model.safetensors"))
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0]
            raise ckpt.CheckpointError(f"{checkpoint.path}: weights do not fit: {first}") from None
        trainer = state["trainer"]
        if dckpt.has_shards(checkpoint):  # saved by N ranks of FSDP: re-sliced for these
            dckpt.load_optimizer_shards(self.model, self.optimizer, checkpoint.path / dckpt.SHARDS)
        elif self.sharded:
            dckpt.load_named_optimizer(
                self.model,
                self.optimizer,
                checkpoint.tensors("optimizer.safetensors"),
                trainer["optimizer_groups"],
            )
        else:
            load_optimizer_tensors(
                self.optimizer,
                checkpoint.tensors("optimizer.safetensors"),
                trainer["optimizer_groups"],
            )
        if self.scaler and trainer.get("scaler"):
            self.scaler.load_state_dict(trainer["scaler"])
        self.step = checkpoint.step
        self.tokens = int(trainer["tokens"])
        best = trainer.get("best_val_loss")
        self.best_val_loss = math.inf if best is None else float(best)
        ranks = len(state["rng"])
        rng.restore(state["rng"][self.ctx.rank % ranks])
        self.batches.load_state_dict(state["sampler"][self.ctx.rank % len(state["sampler"])])
        if self.metrics is not None:
            truncate_after(self.metrics.path, self.step)

    # -- the loop ---------------------------------------------------------------------------
    def _stop_at(self, signum: int) -> None:
        self._stop = signum

    def fit(self) -> dict[str, Any]:
        """Train to ``max_steps`` (or a signal); returns the last metrics and how it ended."""
        cfg = self.cfg
        bar = Progress(
            cfg.max_steps, self.step, enabled=cfg.progress and self.ctx.is_main, log=self.log
        )
        clock = StepClock(stamp(self.ctx.device), self.tokens)
        record: dict[str, Any] = {"step": self.step}
        ended = "max_steps"
        pending: PendingStep | None = None
        lag = self.ctx.device.type == "cuda"  # read a step's loss one step late (no stall)
        # a CPU step runs inside launch_step: its time, to notice a core turning busy
        cpu = self.ctx.device.type == "cpu" and self.ctx.is_main
        times = StepTimes(torch.get_num_threads()) if cpu else None
        with stop_on_signals(self._stop_at), collect_between_steps() as collector:
            try:
                while self.step < cfg.max_steps:
                    started = time.perf_counter()
                    launched = self.launch_step()
                    if times is not None:
                        note = times.add(self.step, time.perf_counter() - started)
                        if note:
                            bar.write(f"glassgpt: note: {note}")
                    collector.step()
                    bar.step(self.step)
                    if pending is not None:  # the previous step, while the device runs this one
                        record = self._finish(pending, bar, clock)
                    pending = launched
                    final = self.step == cfg.max_steps
                    do_eval = self.eval_data is not None and (
                        self.step % cfg.eval_every == 0 or final
                    )
                    stop = any_rank(self._stop is not None, self.ctx)
                    every = cfg.checkpoint_every
                    save = final or stop or bool(every and self.step % every == 0)
                    # an inspection reads the weights: its step is read now, before the next moves them
                    inspected = self.inspect is not None and (
                        self.step % self.inspect_every == 0 or final
                    )
                    if do_eval or save or inspected or not lag:
                        record, pending = self._finish(pending, bar, clock, do_eval), None
                    if save:
                        path = self.save_checkpoint()
                        if stop:
                            ended = "signal"
                            bar.write(f"stopped by a signal at step {self.step}; checkpoint {path}")
                            break
                if pending is not None:
                    record = self._finish(pending, bar, clock)
            finally:
                bar.close()
        return {
            **record,
            "ended": ended,
            "signal": self._stop,
            "best_val_loss": self.best_val_loss,
            "wall_s": time.perf_counter() - clock.start,
        }

    def _finish(
        self, pending: PendingStep, bar: Progress, clock: StepClock, do_eval: bool = False
    ) -> dict[str, Any]:
        """Read a launched step's metrics; log, evaluate and write them as due."""
        cfg = self.cfg
        record = self._checked(pending)
        step = record["step"]
        do_inspect = (
            self.inspect is not None
            and self.ctx.is_main
            and (step % self.inspect_every == 0 or step == cfg.max_steps)
        )
        logged = step % cfg.log_every == 0 or do_eval or do_inspect or step == cfg.max_steps
        if logged:
            seconds = seconds_between(clock.since, pending.done)  # type: ignore[arg-type]
            tok_s = (record["tokens"] - clock.tokens) / max(seconds, 1e-9)
            record.update(tok_per_s=tok_s, elapsed_s=time.perf_counter() - clock.start)
            record["eval_s"] = self.eval_seconds  # of elapsed_s: this step's eval comes after
            record["cpu_s"] = time.process_time() - clock.cpu_start  # all threads
            # s/step, tok/s and the ETA from the bar's one window of steps
            bar.tokens_per_step = record["tokens"] // max(step, 1)
            bar.metrics(record["loss"])
        if do_eval:
            started = time.perf_counter()
            record.update(self._eval_and_report(bar.write))
            self.eval_seconds += time.perf_counter() - started
        if do_inspect:
            started = time.perf_counter()
            record.update(self._inspected())
            self.eval_seconds += time.perf_counter() - started
        if logged and self.metrics is not None:
            self.metrics.write(record)
        if logged and self.tracker is not None:
            self.tracker.log(record)
        if logged:  # after an evaluation, the window opens when it is done
            clock.since = pending.done if not do_eval else stamp(self.ctx.device)  # type: ignore[assignment]
            clock.tokens = record["tokens"]
        return record

    def _inspected(self) -> dict[str, float]:
        """The inspection's named floats (no dropout, no draw from the training RNG streams)."""
        assert self.inspect is not None
        self.model.eval()
        try:
            with torch.no_grad():
                return dict(self.inspect(self.model, self.step))
        finally:
            self.model.train()

    def _eval_and_report(self, write: Callable[[str], None]) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.evaluate())
        val = out["val_loss"]
        line = f"step {self.step}: loss {self.last_loss:.4f}, val loss {val:.4f}"
        if "val_bpb" in out:
            line += f", {out['val_bpb']:.3f} bits/byte"
        write(line)
        if val < self.best_val_loss:
            self.best_val_loss = val
            weights = dckpt.full_model_state(self.model)  # (gathered by every rank under FSDP)
            if self.checkpoints is not None:
                self.checkpoints.save(
                    self.step,
                    tensors={"model.safetensors": weights},
                    files=self.checkpoint_files,
                    state={"val_loss": val},
                    best=True,
                )
        # a sharded model's forward is a collective: every rank draws the same sample
        if self.on_eval is not None and (self.ctx.is_main or self.sharded):
            self.model.eval()  # no dropout, so no draw from the training RNG streams
            try:
                sample = self.on_eval(self.model, self.step)
            finally:
                self.model.train()
            if sample and self.ctx.is_main:
                write(sample)
                out["sample"] = sample
        return out
