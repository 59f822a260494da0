"""``glassgpt sae train``'s job: the arguments checked against the model, the folder claimed
and locked, the data found (the run's own shards, or ``--data``), then the trainer of
:mod:`glassgpt.features.training` started or resumed.

A run's shards are ``RUN/data`` (where ``glassgpt train`` prepares them) or the data folder its
``run.json`` names; ``--data`` takes a prepared folder or text files, which are prepared once
into ``DIR/data`` with the model's tokenizer.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from glassgpt import checkpoint as ckpt
from glassgpt.checkpoint import needs_tokenizer
from glassgpt.config import apply_overrides, from_dict
from glassgpt.console import say
from glassgpt.data import DataDir, prepare
from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.features.clt import CLT_ARCHS, CLTConfig
from glassgpt.features.clt_train import CLTFit
from glassgpt.features.identity import model_identity
from glassgpt.features.sae import SAEConfig
from glassgpt.features.sae_fit import SAEFit
from glassgpt.features.sites import resolve_site
from glassgpt.features.training import RUN_FILE, SAERun, SAETrainConfig, Trainer
from glassgpt.storage import atomic_write
from glassgpt.train.inputs import is_prepared
from glassgpt.train.lock import LOCK_NAME, RunLock


def plan(
    *,
    checkpoint: str,
    hook: str | None,
    width: int,
    arch: str,
    k: int | None,
    clt_arch: str | None = None,
    tokens: int | None,
    overrides: Sequence[str],
    data: Sequence[str] | None,
    model: Any,
    argv: Sequence[str],
) -> SAERun:
    """Check every argument against the model before anything starts."""
    if arch not in ("topk", "batchtopk", "jumprelu", "relu", "transcoder", "clt"):
        raise ConfigError("--arch", f"must be topk, batchtopk, jumprelu, relu, transcoder or clt, got {arch!r}")  # fmt: skip
    if clt_arch is not None and arch != "clt":
        raise ConfigError("--clt-arch", f"chooses a CLT's activation; it needs --arch clt, not --arch {arch}")  # fmt: skip
    raw: dict[str, Any] = apply_overrides({}, overrides)
    unknown = sorted(set(raw) - {"sae", "train"})
    if unknown:
        raise ConfigError(unknown[0], "unknown section; --set takes sae.KEY=VALUE or train.KEY=VALUE")  # fmt: skip
    if arch == "clt":
        dict_cfg: SAEConfig | CLTConfig = _clt_config(model, hook, width, k, clt_arch, raw)
    else:
        if hook is None:
            raise GlassError("sae train needs --hook (or --resume DIR)")
        dict_cfg = _sae_config(model, hook, width, arch, k, raw)
    train_raw = dict(raw.get("train", {}))
    if tokens is not None:
        train_raw["tokens"] = tokens
    train_cfg = from_dict(SAETrainConfig, train_raw, prefix="train.")
    if train_cfg.seq_len is not None and train_cfg.seq_len > model.config.n_ctx:
        raise ConfigError("train.seq_len", f"must be ≤ n_ctx={model.config.n_ctx}, got {train_cfg.seq_len}")  # fmt: skip
    return SAERun(str(Path(checkpoint).resolve()), _data_folder(checkpoint, data), dict_cfg,
                  train_cfg, list(argv))  # fmt: skip


def _clt_config(model: Any, hook: str | None, width: int, k: int | None, clt_arch: str | None,
                raw: dict[str, Any]) -> CLTConfig:  # fmt: skip
    """A CLT over every layer: its activation ``--clt-arch`` (default: topk with -k, else
    jumprelu)."""
    m = model.config
    if hook is not None:
        raise ConfigError("--hook", f"--arch clt reads every layer's blocks.L.mlp.in and predicts every blocks.L.mlp_out; drop --hook {hook}")  # fmt: skip
    if m.attn_only:
        raise GlassError("--arch clt: this model is attention-only: it has no MLP to replace")
    limit = 2**31 // (m.n_layers * m.d_model)
    if not 1 <= width <= limit:
        raise ConfigError("--width", f"must be in [1, {limit:,}] (features per layer of a CLT over {m.n_layers} layers of d_model={m.d_model}), got {width}")  # fmt: skip
    act = clt_arch or raw.get("sae", {}).get("arch") or ("topk" if k is not None else "jumprelu")
    if act not in CLT_ARCHS:
        raise ConfigError("--clt-arch", f"must be one of {', '.join(CLT_ARCHS)}, got {act!r}")
    if act == "topk" and k is None and raw.get("sae", {}).get("k") is None:
        raise ConfigError("-k", "--arch clt --clt-arch topk needs -k (features kept per token and layer), e.g. -k 16")  # fmt: skip
    if k is not None and not 1 <= k <= width:
        raise ConfigError("-k", f"must be in [1, --width={width}], got {k}")
    if k is not None and act != "topk":
        raise ConfigError("-k", f"keeps the k largest features of a topk CLT; --clt-arch {act} has none")  # fmt: skip
    clt_raw = {"d_model": m.d_model, "d_sae": width, "n_layers": m.n_layers, **raw.get("sae", {}),
               "arch": act, **({"k": k} if k is not None else {})}  # fmt: skip
    return CLTConfig.from_dict(clt_raw, prefix="sae.")


def _sae_config(model: Any, hook: str, width: int, arch: str, k: int | None,
                raw: dict[str, Any]) -> SAEConfig:  # fmt: skip
    site = resolve_site(model, hook, transcoder=arch == "transcoder")
    if width < 1 or width * max(site.d_in, site.d_out or 0) > 2**31:
        raise ConfigError("--width", f"must be in [1, {2**31 // site.d_in:,}] for {site.hook} of width {site.d_in}, got {width}")  # fmt: skip
    sae_raw = {"d_in": site.d_in, "d_sae": width, "arch": arch, "hook": site.hook,
               "out_hook": site.out_hook, "d_out": site.d_out, **raw.get("sae", {})}  # fmt: skip
    if k is not None:
        sae_raw["k"] = k
    elif sae_raw.get("k") is None and arch in ("topk", "batchtopk", "transcoder"):
        activation = sae_raw.get("transcoder_activation", "topk") if arch == "transcoder" else arch
        if activation in ("topk", "batchtopk"):
            raise ConfigError("-k", f"--arch {arch} needs -k (latents kept per token), e.g. -k 32")
    if k is not None and not 1 <= k <= width:
        raise ConfigError("-k", f"must be in [1, --width={width}], got {k}")
    return SAEConfig.from_dict(sae_raw, prefix="sae.")


def _data_folder(checkpoint: str, data: Sequence[str] | None) -> str:
    """The prepared data folder the SAE reads: ``--data``'s, else the run's own."""
    if data:
        if len(data) == 1 and is_prepared(data[0]):
            return str(Path(data[0]).resolve())
        return ""  # text files: prepared into DIR/data when the folder is claimed
    run_dir = ckpt.ckpt_root_of(checkpoint).parent
    candidates = [run_dir / "data"]
    info = run_dir / "run.json"
    if info.is_file():
        try:
            recorded = json.loads(info.read_text(encoding="utf-8")).get("data")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if isinstance(recorded, str):
            candidates.append(Path(recorded))
    for folder in candidates:
        if is_prepared(str(folder)):
            return str(folder.resolve())
    raise GlassError(
        f"{checkpoint}: has no data shards of its own (no {run_dir / 'data'}, no data folder in "
        "run.json); pass --data with a prepared data folder (glassgpt data prepare) or text files"
    )


def _claim(out: Path, overwrite: bool) -> None:
    entries = sorted(p for p in out.iterdir() if p.name != LOCK_NAME)
    if entries and not overwrite:
        raise GlassError(
            f"{out} already holds files ({', '.join(p.name for p in entries[:3])}); continue "
            f"with --resume {out}, replace with --overwrite, or pass another -o"
        )
    for p in entries:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def train_command(
    *,
    checkpoint: str | None,
    hook: str | None,
    width: int | None,
    arch: str | None,
    k: int | None = None,
    clt_arch: str | None = None,
    out: str | None,
    tokens: int | None = None,
    overrides: Sequence[str] = (),
    data: Sequence[str] | None = None,
    resume: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    argv: Sequence[str] = (),
) -> dict[str, Any]:
    """The whole job behind ``glassgpt sae train``; returns the final metrics."""
    if resume is not None:
        folder = Path(resume)
        path = folder / RUN_FILE
        if not path.is_file():
            raise InputFileError(f"--resume {folder}: not an SAE training folder (no {RUN_FILE})")
        if any(v is not None for v in (checkpoint, hook, width, arch, k, clt_arch, tokens)) or overrides or data:  # fmt: skip
            raise GlassError("--resume continues the saved job as it was asked; drop the other arguments")  # fmt: skip
        job = SAERun.from_json(path.read_bytes(), path)
        out_dir = Path(out) if out else folder
    else:
        missing = [f for f, v in (("-c", checkpoint), ("--width", width), ("--arch", arch),
                                  ("-o", out)) if v is None]  # fmt: skip
        if missing:
            raise GlassError(f"sae train needs {', '.join(missing)} (or --resume DIR)")
        out_dir = Path(out)  # type: ignore[arg-type]
        if out_dir.exists() and not out_dir.is_dir():
            raise InputFileError(f"-o {out_dir}: a file is there, not a folder")
    model_path = job.model if resume is not None else checkpoint
    assert model_path is not None
    run = ckpt.open_run(model_path)
    model, tok = run.model, run.tokenizer
    if tok is None:  # as glassgpt.load says it
        warnings.warn(
            f"{model_path}: no tokenizer found; working with token ids only", stacklevel=2
        )
    if resume is None:
        assert width is not None and arch is not None
        job = plan(checkpoint=model_path, hook=hook, width=width, arch=arch, k=k,
                   clt_arch=clt_arch, tokens=tokens, overrides=overrides, data=data, model=model,
                   argv=argv)  # fmt: skip
    if job.train.threads is not None:
        torch.set_num_threads(job.train.threads)
    with RunLock(out_dir, note=say):
        if resume is None:
            _claim(out_dir, overwrite)
            if not job.data:  # text files: encoded once into DIR/data
                needs_tokenizer(tok, model_path, flag=None, text="--data text")
                prepare(list(data or []), out_dir / "data", tok, progress=progress)
                job = SAERun(job.model, str((out_dir / "data").resolve()), job.sae, job.train, job.argv)  # fmt: skip
            atomic_write(out_dir / RUN_FILE, job.to_json())
        datadir = DataDir.open(job.data)
        if tok is not None:
            datadir.check_tokenizer(tok)
        device = torch.device(job.train.device)
        fit = (CLTFit(job.sae, seed=job.train.seed, device=device) if isinstance(job.sae, CLTConfig)
               else SAEFit(job.sae, seed=job.train.seed, device=device))  # fmt: skip
        trainer = Trainer(job, out_dir, model, datadir, progress=progress, note=say,
                          run_config=run.config, identity=model_identity(run), fit=fit)  # fmt: skip
        if resume is None:
            trainer.init_b_dec()
        else:
            found = (
                ckpt.find_resumable(out_dir, warn=say)
                if ckpt.step_folders(out_dir / "ckpt")
                else None
            )
            if found is None:
                say(f"{out_dir} has no checkpoint yet: starting from step 0")
                trainer.init_b_dec()
            else:
                trainer.load(found)
                if trainer.step >= job.train.steps and (out_dir / fit.folder / fit.config_file).is_file():  # fmt: skip
                    say(f"{out_dir} is already finished (step {trainer.step})")
                    return {**json.loads((out_dir / "eval.json").read_text()), "folder": str(out_dir)}  # fmt: skip
        print(header(job, out_dir, trainer.step), flush=True)
        return {**trainer.fit(), "folder": str(out_dir)}


def header(job: SAERun, out: Path, step: int = 0) -> str:
    """``sae train``'s first line: what is trained, on how many tokens, where it goes.

    >>> job = SAERun("runs/a", "runs/a/data", SAEConfig(d_in=8, d_sae=64, arch="topk", k=4,
    ...              hook="blocks.1.resid_post"), SAETrainConfig(tokens=10_000, batch_size=1024), [])
    >>> header(job, Path("saes/a"))
    'sae train: topk × 64 on blocks.1.resid_post of runs/a; 9,216 tokens in 9 steps of 1,024 → saes/a'
    >>> header(job, Path("saes/a"), 4)
    'sae train: topk × 64 on blocks.1.resid_post of runs/a; 9,216 tokens in 9 steps of 1,024 → saes/a (resuming at step 4)'
    >>> clt = SAERun("runs/a", "runs/a/data", CLTConfig(d_model=8, d_sae=64, n_layers=2),
    ...              SAETrainConfig(tokens=10_000, batch_size=1024), [])
    >>> header(clt, Path("saes/c"))[:82]
    'sae train: clt (jumprelu) × 64 per layer on blocks.0-1.mlp.in → blocks.0-1.mlp_out'
    """
    cfg, sae = job.train, job.sae
    if isinstance(sae, CLTConfig):
        top = sae.n_layers - 1
        what = (f"clt ({sae.arch}{f', k={sae.k}' if sae.k else ''}) × {sae.d_sae:,} per layer on "
                f"blocks.0-{top}.mlp.in → blocks.0-{top}.mlp_out")  # fmt: skip
    else:
        what = f"{sae.arch} × {sae.d_sae:,} on {sae.hook}"
    line = (f"sae train: {what} of {job.model}; "
            f"{cfg.steps * cfg.batch_size:,} tokens in {cfg.steps:,} steps of {cfg.batch_size:,} → {out}")  # fmt: skip
    return line + (f" (resuming at step {step})" if step else "")
