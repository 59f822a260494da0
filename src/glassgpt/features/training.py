"""``glassgpt sae train``: an SAE fitted to one site of a trained model, from the run's own shards.

    b_dec ← geometric median of a sample of y         (Weiszfeld: m ← Σ wᵢyᵢ / Σ wᵢ, wᵢ = 1/‖yᵢ − m‖)
    W_enc ← s W_enc, s the least-squares scale of the first reconstructions of that sample
    x ← a x (and y ← a_y y), a = √(d / E‖x‖²) on that sample: the coefficients (l1, l0, the
        JumpReLU bandwidth) mean the same for every model, as in Gemma Scope and Anthropic's
        updates; the SAE saved has a folded into its weights (SAE.rescaled), so it reads the
        model's own activations
    for step s = 0 … S − 1  (S = tokens / batch_size):
        x, y ← the shuffling buffer (glassgpt.features.buffer)
        L = mse + c_s · sparsity + aux                 (SAE.loss; c_s warms up for relu and jumprelu)
        g_W_dec,ᵢ ← gᵢ − (gᵢ · wᵢ) wᵢ                  (unit-norm architectures)
        Adam(lr_s) (AdamW, λ = 0);  W_dec,ᵢ ← W_dec,ᵢ / ‖W_dec,ᵢ‖
        lr_s: linear warm-up over ``warmup_steps``, constant, linear decay to 0 over the last
              ``decay_fraction`` of the steps
        dead: latents that fired in none of the last ``dead_tokens`` tokens (AuxK reads them)

What is fitted is a *fit*: sae_fit's ``SAEFit`` (an SAE or a per-layer transcoder: one site, its
x and y), or glassgpt.features.clt_train's ``CLTFit`` (a cross-layer transcoder: every layer's
MLP input and output at once). The fit owns the module, its batch's scales, its loss and its
measurements; :class:`Trainer` owns the loop, the buffer, Adam, the counters, the log and the
checkpoints, the same for both.

The folder ``-o DIR`` holds ``sae_run.json`` (what was asked: the model, site, SAE and
trainer configs, data), ``metrics.jsonl``, ``ckpt/step_*`` (SAE, Adam state, counters,
the buffer's position; written atomically by glassgpt.checkpoint) and, at the end,
``sae/`` (``SAE.load`` reads it; a CLT: ``clt/``, ``CLT.load``; its sae.json records the model's identity,
glassgpt.features.identity) and ``eval.json`` (``sae eval``'s measurement, on the same
tokens: glassgpt.features.metrics.measure). It is locked while a trainer runs
(glassgpt.train.lock). ``--resume DIR`` continues from the newest checkpoint with the very
same batches (the buffer recomputes its round), so the weights are those of a run never
stopped.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glassgpt import checkpoint as ckpt
from glassgpt.config import check, from_dict, to_dict
from glassgpt.data import iter_eval_batches
from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.buffer import ActivationBuffer
from glassgpt.features.clt import CLTConfig
from glassgpt.features.identity import KEY as IDENTITY
from glassgpt.features.metrics import eval_split, eval_window
from glassgpt.features.sae import BatchTopK, SAEConfig
from glassgpt.formats import check_format
from glassgpt.storage import atomic_write
from glassgpt.train.adamw import AdamW
from glassgpt.train.metrics import MetricsLog, truncate_after
from glassgpt.train.optim import fused_available, load_optimizer_tensors, optimizer_tensors
from glassgpt.train.progress import Progress, stop_on_signals

RUN_FILE = "sae_run.json"
FORMAT, VERSION = "glassgpt-sae-run", 1
BATCHTOPK_MOMENTUM = 0.99  # θ ← m θ + (1 − m) · (least kept value of the batch)


@dataclass(frozen=True)
class SAETrainConfig:
    """The trainer's settings (``--set train.KEY=VALUE``); errors name the field."""

    tokens: int = 2_000_000
    batch_size: int = 4096  # tokens per step
    lr: float = 4e-4
    warmup_steps: int = 50
    decay_fraction: float = 0.2
    beta1: float = 0.9
    beta2: float = 0.999
    seq_len: int | None = None  # windows of the model (default: the run's seq_len, else n_ctx)
    model_batch: int = 32  # windows per forward pass of the model
    buffer_tokens: int = 131_072
    dead_tokens: int | None = None  # default: tokens / 10, at most 10M, at least a batch
    dense: float = 0.1
    sparsity_warmup: float = 0.05  # fraction of the steps over which c_s rises to 1
    median_samples: int = 4096
    median_iters: int = 100
    log_every: int = 50
    eval_every: int = 100  # steps between CE-recovered evaluations (0: at the end only)
    eval_batches: int = 2  # model batches of validation windows per evaluation
    checkpoint_every: int = 200
    keep_last: int = 2
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "batch_size", "model_batch", "buffer_tokens", "median_samples",
                     "median_iters", "log_every", "eval_batches", "keep_last"):  # fmt: skip
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"train.{name}", f"must be ≥ 1, got {value!r}")  # fmt: skip
        check(self.tokens >= self.batch_size, "train.tokens", f"must be ≥ train.batch_size={self.batch_size}, got {self.tokens}")  # fmt: skip
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "seed"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 0, f"train.{name}", f"must be ≥ 0, got {value!r}")  # fmt: skip
        check(self.lr > 0 and math.isfinite(self.lr), "train.lr", f"must be > 0, got {self.lr}")
        for name in ("decay_fraction", "sparsity_warmup", "dense", "beta1", "beta2"):
            value = getattr(self, name)
            check(0 <= value <= 1, f"train.{name}", f"must be in [0, 1], got {value}")
        if self.seq_len is not None:
            check(self.seq_len >= 1, "train.seq_len", f"must be ≥ 1, got {self.seq_len}")
        if self.dead_tokens is not None:
            check(self.dead_tokens >= 1, "train.dead_tokens", f"must be ≥ 1, got {self.dead_tokens}")  # fmt: skip
        if self.threads is not None:
            check(self.threads >= 1, "train.threads", f"must be ≥ 1, got {self.threads}")

    @property
    def steps(self) -> int:
        return self.tokens // self.batch_size

    @property
    def dead_after(self) -> int:
        if self.dead_tokens is not None:
            return self.dead_tokens
        return max(self.batch_size, min(10_000_000, self.tokens // 10))


def lr_at(step: int, cfg: SAETrainConfig) -> float:
    """The learning rate of step ``step`` (0-based): warm-up, constant, linear decay to 0.

    >>> cfg = SAETrainConfig(tokens=100, batch_size=10, lr=1.0, warmup_steps=2, decay_fraction=0.5)
    >>> [round(lr_at(s, cfg), 2) for s in range(10)]
    [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2]
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    start = cfg.steps - round(cfg.decay_fraction * cfg.steps)
    if step >= start and cfg.steps > start:
        return cfg.lr * (cfg.steps - step) / (cfg.steps - start)
    return cfg.lr


def unit_scale(x: torch.Tensor) -> float:
    """s with E‖s x‖² = d over the rows of x [N, d] (1 for all-zero rows).

    >>> unit_scale(torch.full((5, 4), 3.0))
    0.3333333333333333
    """
    mean_sq = float(x.double().pow(2).sum(-1).mean())
    return math.sqrt(x.shape[-1] / mean_sq) if mean_sq > 0 else 1.0


def geometric_median(points: torch.Tensor, iters: int = 100, tol: float = 1e-9) -> torch.Tensor:
    """argmin_m Σᵢ ‖yᵢ − m‖ by Weiszfeld's iteration from the mean (float64), [N, d] → [d].

    >>> geometric_median(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [100.0, 100.0]])).round(decimals=3).tolist()
    [0.5, 0.5]
    """
    y = points.double()
    m = y.mean(0)
    for _ in range(iters):
        w = 1.0 / (y - m).norm(dim=-1).clamp_min(1e-12)
        new = (w[:, None] * y).sum(0) / w.sum()
        done = float((new - m).norm()) <= tol * max(1.0, float(m.norm()))
        m = new
        if done:
            break
    return m


def run_seq_len(n_ctx: int, run_config: Mapping[str, Any]) -> int:
    """The windows an SAE reads: the run's ``train.seq_len`` (at most n_ctx), else n_ctx.

    >>> run_seq_len(256, {"train": {"seq_len": 128}}), run_seq_len(256, {"model": {}})
    (128, 256)
    """
    train = run_config.get("train")
    seq_len = train.get("seq_len") if isinstance(train, Mapping) else None
    return min(n_ctx, seq_len) if isinstance(seq_len, int) and seq_len > 0 else n_ctx


@torch.no_grad()
def update_threshold(sae: BatchTopK, least: torch.Tensor) -> None:
    """BatchTopK's evaluation threshold after a training batch whose least kept value was
    ``least``: θ ← m θ + (1 − m) max(least, 0), the first batch (θ = 0) setting θ itself."""
    m = BATCHTOPK_MOMENTUM
    first = bool(sae.threshold == 0)
    new = least.detach().to(sae.threshold.dtype).clamp_min(0)
    sae.threshold.copy_(new if first else m * sae.threshold + (1 - m) * new)


# -- what was asked -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SAERun:
    """A training job as ``sae_run.json`` records it."""

    model: str
    data: str
    sae: SAEConfig | CLTConfig  # a CLT is recorded under "clt"
    train: SAETrainConfig
    argv: list[str]

    def to_json(self) -> bytes:
        key = "clt" if isinstance(self.sae, CLTConfig) else "sae"
        doc = {"format": FORMAT, "version": VERSION, "model": self.model, "data": self.data,
               key: self.sae.to_dict(), "train": to_dict(self.train), "argv": self.argv}  # fmt: skip
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, source: Path) -> SAERun:
        try:
            doc = check_format(json.loads(raw), source, FORMAT, VERSION, what="SAE run format",
                               not_ours="not a glassgpt SAE training folder")  # fmt: skip
            cfg: SAEConfig | CLTConfig = (
                CLTConfig.from_dict(doc["clt"], prefix="sae.") if "clt" in doc
                else SAEConfig.from_dict(doc["sae"], prefix="sae.")
            )  # fmt: skip
            return cls(doc["model"], doc["data"], cfg,
                       from_dict(SAETrainConfig, doc["train"], prefix="train."), list(doc["argv"]))  # fmt: skip
        except (ValueError, KeyError, TypeError) as e:
            raise InputFileError(f"{source}: malformed ({e})") from None


# -- what is fitted --------------------------------------------------------------------------


def fit_scale(target: torch.Tensor, y_hat: torch.Tensor) -> float:
    """s = ⟨t, ŷ⟩ / ‖ŷ‖², the scale of ŷ that fits t best (both centred on b_dec); where ŷ is
    uncorrelated with t (a transcoder's random map), ‖s ŷ‖ = ‖t‖ / 10: start near ŷ = b_dec.

    >>> fit_scale(torch.tensor([[2.0, 4.0]]), torch.tensor([[1.0, 2.0]]))
    2.0
    """
    norm = float(y_hat.double().pow(2).sum())
    if norm == 0:
        return 1.0
    scale = float((target.double() * y_hat.double()).sum()) / norm
    return scale if scale > 0 else 0.1 * math.sqrt(float(target.double().pow(2).sum()) / norm)


# -- the trainer ---------------------------------------------------------------------------------


class Trainer:
    """The loop of the module docstring, with its checkpoints, around ``fit`` (an SAEFit of
    glassgpt.features.sae_fit, a CLTFit of glassgpt.features.clt_train)."""

    def __init__(self, job: SAERun, out: Path, model: Any, data: Any, *, progress: bool,
                 note: Callable[[str], None], run_config: Mapping[str, Any] | None = None,
                 identity: Mapping[str, Any] | None = None, fit: Any) -> None:  # fmt: skip
        cfg = job.train
        self.job, self.out, self.cfg, self.note = job, out, cfg, note
        self.identity = dict(identity) if identity is not None else None  # the model, for sae.json
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.fitted = fit
        self.data = data
        seq_len = cfg.seq_len or run_seq_len(self.model.config.n_ctx, run_config or {})
        self.seq_len = seq_len
        self.buffer = ActivationBuffer(
            self.model, fit.site, data.stream("train"), batch_tokens=cfg.batch_size,
            buffer_tokens=cfg.buffer_tokens, seq_len=seq_len, model_batch=cfg.model_batch,
            seed=cfg.seed,
        )  # fmt: skip
        params = list(fit.module.named_parameters())
        kind = {"fused": True} if fused_available(self.device) else {"foreach": True}
        self.opt = AdamW(  # Adam: the train stage's AdamW with no weight decay
            [{"params": [p for _, p in params], "names": [n for n, _ in params]}],
            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=0.0, **kind,
        )  # fmt: skip
        n = fit.n_latents
        self.since_fired = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.window = torch.zeros(n, dtype=torch.int64, device=self.device)  # fires since log
        self.sums: dict[str, Any] = fresh_sums()
        self.step = 0
        self.manager = ckpt.CheckpointManager(out / "ckpt", keep_last=cfg.keep_last)
        self.stop: int | None = None
        self.progress = progress

    # -- state ------------------------------------------------------------------------------
    def init_b_dec(self) -> None:
        """The fit's start (scales, b_dec, W_enc's scale) from the first round's first rows."""
        self.fitted.init(*self.buffer.sample(self.cfg.median_samples), self.cfg.median_iters)

    def raw_sae(self) -> Any:
        """The trained module on the model's own activations (the scales folded in)."""
        return self.fitted.raw()

    def save(self) -> Path:
        opt_tensors, groups = optimizer_tensors(self.opt)
        counters = {"since_fired": self.since_fired, "window": self.window}
        return self.manager.save(
            self.step,
            tensors={
                "sae.safetensors": {
                    k: t.detach() for k, t in self.fitted.module.state_dict().items()
                },
                "optimizer.safetensors": opt_tensors,
                "counters.safetensors": counters,
            },
            files={RUN_FILE: self.job.to_json()},
            state={
                "trainer": {
                    "buffer": self.buffer.state_dict(),
                    "groups": groups,
                    "sums": self.sums,
                    **self.fitted.scales(),
                }
            },
        )

    def load(self, found: ckpt.Checkpoint) -> None:
        try:
            self.fitted.module.load_state_dict(found.tensors("sae.safetensors"))
            trainer = found.state["trainer"]
            load_optimizer_tensors(self.opt, found.tensors("optimizer.safetensors"), trainer["groups"])  # fmt: skip
            counters = found.tensors("counters.safetensors")
            self.since_fired.copy_(counters["since_fired"])
            self.window.copy_(counters["window"])
            self.sums = dict(trainer["sums"])
            self.fitted.load_scales(trainer)
            self.buffer.load_state_dict(trainer["buffer"])
        except (KeyError, RuntimeError, TypeError, ValueError) as e:
            raise ckpt.CheckpointError(f"{found.path}: not an SAE checkpoint of this run ({e})") from None  # fmt: skip
        self.step = found.step

    # -- the loop ------------------------------------------------------------------------------
    def one_step(self) -> None:
        cfg, fit = self.cfg, self.fitted
        x, y = fit.scaled(*self.buffer.next_batch())
        lr = lr_at(self.step, cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        dead = self.since_fired >= cfg.dead_after
        terms = fit.terms(x, y, dead)
        ramp = cfg.sparsity_warmup * cfg.steps
        c = min(1.0, (self.step + 1) / ramp) if ramp > 0 else 1.0
        loss = terms["mse"] + c * terms["sparsity"] + terms["aux"]
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        fit.after_backward()
        self.opt.step()
        fit.after_step()
        with torch.no_grad():
            fired = terms["acts"] != 0  # [b, latents]
            any_fired = fired.any(0)
            self.since_fired += x.shape[0]
            self.since_fired[any_fired] = 0
            self.window += fired.sum(0)
            s = self.sums
            s["n"] += 1
            s["tokens"] += x.shape[0]
            s["nonzero"] += float(fired.sum())
            for key in ("mse", "sparsity", "aux"):
                s[key] += float(terms[key])
            s["loss"] += float(loss)
            for key, value in fit.stats(terms).items():
                if isinstance(value, list):
                    s[key] = [a + b for a, b in zip(s.get(key) or [0.0] * len(value), value)]
                else:
                    s[key] = s.get(key, 0.0) + value
        if not math.isfinite(float(loss.detach())):
            raise GlassError(
                f"the loss is {float(loss.detach())} at step {self.step + 1}; lower train.lr "
                f"(now {cfg.lr}) and resume from the last checkpoint, or start again"
            )
        self.step += 1

    def log_record(self, tok_s: float) -> dict[str, Any]:
        s = self.sums
        n, tokens = max(1, s["n"]), max(1, s["tokens"])
        record = {
            "step": self.step,
            "tokens": self.step * self.cfg.batch_size,
            "lr": lr_at(self.step - 1, self.cfg),
            "loss": s["loss"] / n,
            "mse": s["mse"] / n,
            "sparsity": s["sparsity"] / n,
            "aux": s["aux"] / n,
            "l0": s["nonzero"] / tokens,
            "fvu": s["fvu"] / n,
            **self.fitted.record(s, n, tokens),
            "dead_fraction": float((self.since_fired >= self.cfg.dead_after).double().mean()),
            "dense_fraction": float(
                (self.window.double() / tokens > self.cfg.dense).double().mean()
            ),
            "tok_s": tok_s,
        }
        self.sums = fresh_sums()
        self.window.zero_()
        return record

    def evaluate(self) -> dict[str, Any]:
        """The periodic evaluation: ``eval_batches`` model batches of the trainer's windows."""
        split = eval_split(self.data, self.seq_len)
        batches = (
            (x.to(self.device), y.to(self.device))
            for x, y in iter_eval_batches(
                self.data,
                split,
                batch_size=self.cfg.model_batch,
                seq_len=self.seq_len,
                max_batches=self.cfg.eval_batches,
            )
        )
        return self.fitted.evaluate(self.model, batches, dense=self.cfg.dense)

    def closing(self) -> dict[str, Any]:
        """The closing measurement: ``sae eval``'s (glassgpt.features.metrics.measure), on the
        same windows and tokens, so the two print the same figures for the same SAE."""
        T = eval_window(self.model.config.n_ctx)
        stream = self.data.stream(eval_split(self.data, T))
        return self.fitted.measure(self.model, stream, seq_len=T, device=self.device,
                                dense=self.cfg.dense)  # fmt: skip

    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        log = MetricsLog(self.out / "metrics.jsonl")
        truncate_after(log.path, self.step)
        bar = Progress(
            cfg.steps, self.step, enabled=self.progress, log=print, tokens_per_step=cfg.batch_size
        )
        last = {"time": time.perf_counter(), "step": self.step}
        ended = "done"

        def stop(signum: int) -> None:
            self.stop = signum

        try:
            with stop_on_signals(stop):
                while self.step < cfg.steps:
                    self.one_step()
                    bar.step(self.step)
                    final = self.step == cfg.steps
                    if self.step % cfg.log_every == 0 or final:
                        now = time.perf_counter()
                        done = (self.step - last["step"]) * cfg.batch_size
                        record = self.log_record(done / max(now - last["time"], 1e-9))
                        last.update(time=now, step=self.step)
                        if cfg.eval_every and self.step % cfg.eval_every == 0 and not final:
                            record.update(self.evaluate())
                        log.write(record)
                        bar.metrics(record["loss"])
                        bar.text += f", L0 {record['l0']:.1f}, FVU {record['fvu']:.3f}"
                    if self.stop is not None:
                        ended = "signal"
                        break
                    if final or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0):
                        self.save()
        finally:
            bar.close()
        if ended == "signal":
            self.save()
            self.note(f"stopped at step {self.step}; continue with: {resume_command(self.out)}")
            return {"ended": "signal", "step": self.step}
        result = self.closing()
        log.write({"step": self.step, **result})
        extra = {"model": self.job.model, "data": self.job.data, "tokens": self.step * cfg.batch_size}  # fmt: skip
        if self.identity is not None:
            extra[IDENTITY] = self.identity
        self.fitted.save(self.out / self.fitted.folder, extra)
        atomic_write(self.out / "eval.json", (json.dumps(result, indent=1) + "\n").encode())
        return {"ended": "done", "step": self.step, **result}


def fresh_sums() -> dict[str, Any]:
    """The log's running sums, empty (a fit's per-layer lists are added as they come)."""
    return {"n": 0, "tokens": 0, "nonzero": 0.0, "fvu": 0.0, "loss": 0.0, "mse": 0.0,
            "sparsity": 0.0, "aux": 0.0}  # fmt: skip


def resume_command(out: Path) -> str:
    """The command that continues the SAE training in ``out``.

    >>> resume_command(Path("saes/my sae"))
    "glassgpt sae train --resume 'saes/my sae'"
    """
    return f"glassgpt sae train --resume {shlex.quote(str(out))}"
