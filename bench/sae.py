"""SAE training beside SAELens, on the same activations in one run; and feature pages.

    tokens/s = training tokens / seconds of training (init and every step; data in memory)
    FVU      = Σ‖x − x̂‖² / Σ‖x − x̄‖²  on held-out activations after the same tokens
    peak     = the extra peak memory of the training (Linux: the peak resident set after
               resetting it, minus the resident set before; CUDA: torch's peak allocation)

glassgpt computes the activations of ``--hook`` once (a random GPT of ``--d-model`` and
``--layers`` on random tokens, or ``--model DIR``), shuffles them, and both trainers read the
same batches in the same order from memory:

- glassgpt: ``glassgpt.features.training.Trainer`` (what ``glassgpt sae train`` runs: the
  geometric-median b_dec, the normalised activations, the sparse TopK backward, AuxK, Adam,
  the unit-norm decoder, its bookkeeping), with its activation buffer replaced by the array;
- SAELens 6 (its ``SAETrainer`` and ``TopKTrainingSAE``, defaults but the shared settings:
  width, k, batch, lr, warm-up and decay, ``expected_average_only_in`` normalisation, the
  dead-latent window), in its own interpreter (``.venv-saelens``: sae-lens needs
  transformer-lens < 4), reading the same array from a file; once with its defaults (dense
  TopK) and once with ``use_sparse_activations`` (its sparse decoder).

``--clt`` measures a cross-layer transcoder instead: ``glassgpt sae train --arch clt``'s
trainer (TopK, ``--width`` features per layer, ``-k`` per token and layer, every layer's MLP
input → every MLP output) against the SAE trainer on ``--hook`` (TopK, ``--width``, ``-k``),
both from memory on the same tokens, and prints the ratio of their tokens/s (SAELens and the
pages are left out). The shakespeare-char shape (6 × 384, the default model):

    PYTHONPATH=src python bench/sae.py --clt --d-model 384 --layers 6 --vocab 65 --seq-len 256 \
        --hook blocks.0.mlp_out --width 1536 -k 16 --tokens 65536 --batch 2048

The pages row times ``glassgpt.features.pages.compute_pages`` for the trained SAE (``--width``
latents) over ``--pages-tokens`` tokens (model forward, encode, top contexts, histograms,
logit effects). Run from the repository root:

    PYTHONPATH=src python bench/sae.py                      # a few minutes on 2 cores
    PYTHONPATH=src python bench/sae.py --device cuda --d-model 768 --tokens 4194304
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # SAELens's progress bar

import torch

ROOT = Path(__file__).resolve().parents[1]


def peak_start(device: str) -> float:
    """Reset the peak; the current use in MiB."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set (VmHWM) ← the current one
    except OSError:
        pass
    return _status("VmRSS")


def peak_extra(device: str, before: float) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20 - before
    return _status("VmHWM") - before


def _status(key: str) -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fvu_l0(x: torch.Tensor, x_hat: torch.Tensor, f: torch.Tensor) -> tuple[float, float]:
    x, x_hat = x.double(), x_hat.double()
    fvu = float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    return fvu, float((f != 0).sum(-1).double().mean())


# -- the SAELens side (its own interpreter; no glassgpt import) --------------------------------


def saelens_side(folder: Path) -> None:
    from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from safetensors.torch import load_file

    job = json.loads((folder / "job.json").read_text())
    torch.set_num_threads(job["threads"])
    device, B, steps = job["device"], job["batch"], job["steps"]
    acts = load_file(str(folder / "acts.safetensors"))
    train, held = acts["train"].to(device), acts["eval"].to(device)

    def batches() -> Any:
        i = 0
        while True:
            yield train[i * B : (i + 1) * B]
            i = (i + 1) % (len(train) // B)

    results = {}
    for name, sparse in (("dense", False), ("sparse", True)):
        torch.manual_seed(job["seed"])
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(
            d_in=train.shape[1], d_sae=job["width"], k=job["k"], device=device,
            normalize_activations="expected_average_only_in", use_sparse_activations=sparse,
        ))  # fmt: skip
        cfg = SAETrainerConfig(
            total_training_samples=steps * B, train_batch_size_samples=B, lr=job["lr"],
            lr_end=0.0, lr_warm_up_steps=job["warmup"], lr_decay_steps=job["decay"],
            device=device, dead_feature_window=job["dead_steps"], feature_sampling_window=10**9,
            n_batches_for_norm_estimate=1,
        )  # fmt: skip
        trainer = SAETrainer(cfg, sae, batches())
        before = peak_start(device)
        start = time.perf_counter()
        try:
            trainer.fit()
        except Exception as e:
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}
            continue
        sync(device)
        seconds = time.perf_counter() - start
        peak = peak_extra(device, before)
        sae.eval()
        with torch.no_grad():
            f = sae.encode(held)
            f = f.to_dense() if f.is_sparse else f
            fvu, l0 = fvu_l0(held, sae.decode(f), f)
        results[name] = {"seconds": seconds, "peak": peak, "fvu": fvu, "l0": l0}
    (folder / "result.json").write_text(json.dumps(results))


# -- the glassgpt side ---------------------------------------------------------------------------


def activations(args: argparse.Namespace, rows_only: bool = False) -> tuple[Any, torch.Tensor]:
    """The model and the shuffled activations of its ``--hook`` [N, d] (float32); with
    ``rows_only``, the model alone."""
    from glassgpt.features.sites import read, resolve_site
    from glassgpt.model import GPT, GPTConfig

    if args.model:
        from glassgpt.checkpoint import load

        model = load(args.model, device=args.device)[0]
    else:
        torch.manual_seed(0)
        cfg = GPTConfig(n_vocab=args.vocab, n_ctx=args.seq_len, d_model=args.d_model,
                        n_layers=args.layers, n_heads=max(1, args.d_model // 64))  # fmt: skip
        model = GPT(cfg).to(args.device).eval()
    if rows_only:
        return model, torch.empty(0)
    site = resolve_site(model, args.hook)
    need = args.tokens + args.eval_tokens
    T = min(args.seq_len, model.config.n_ctx)
    gen = torch.Generator().manual_seed(1)
    rows = []
    with torch.no_grad():
        for _ in range(-(-need // (32 * T))):
            tokens = torch.randint(0, model.config.n_vocab, (32, T), generator=gen)
            rows.append(read(model, tokens.to(args.device), site)[0].reshape(-1, site.d_in).float())  # fmt: skip
    acts = torch.cat(rows)[:need]
    return model, acts[torch.randperm(len(acts), generator=gen)]


class Replay:
    """The trainer's activation buffer, reading a fixed array (and its targets) in order."""

    data: torch.Tensor
    targets: torch.Tensor | None = None

    def __init__(self, *_: Any, batch_tokens: int, **__: Any) -> None:
        self.batch, self.i = batch_tokens, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = len(self.data) // self.batch
        rows = slice((self.i % n) * self.batch, (self.i % n + 1) * self.batch)
        self.i += 1
        return self.data[rows], (self.targets[rows] if self.targets is not None else None)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.data[:n], (self.targets[:n] if self.targets is not None else None)


def glassgpt_train(args: argparse.Namespace, model: Any, train: torch.Tensor, held: torch.Tensor,
                   steps: int, targets: torch.Tensor | None = None) -> dict[str, Any]:  # fmt: skip
    """The SAE trainer on ``train``; with ``targets`` [N, L, d] (``train`` [N, L, d] too), the
    CLT's."""
    import glassgpt.features.training as training
    from glassgpt.features.clt import CLTConfig
    from glassgpt.features.clt_train import CLTFit
    from glassgpt.features.sae import SAEConfig
    from glassgpt.features.sae_fit import SAEFit

    if targets is None:
        sae_cfg: Any = SAEConfig(d_in=train.shape[1], d_sae=args.width, arch="topk", k=args.k, hook=args.hook)  # fmt: skip
    else:
        sae_cfg = CLTConfig(d_model=train.shape[-1], d_sae=args.width, n_layers=train.shape[1], arch="topk", k=args.k)  # fmt: skip
    train_cfg = training.SAETrainConfig(
        tokens=steps * args.batch, batch_size=args.batch, lr=args.lr, warmup_steps=warmup(steps),
        decay_fraction=0.2, seq_len=min(args.seq_len, model.config.n_ctx), device=args.device,
        buffer_tokens=args.batch, model_batch=1, median_samples=min(4096, len(train)),
    )  # fmt: skip
    Replay.data, Replay.targets = train, (targets[: len(train)] if targets is not None else None)
    real, training.ActivationBuffer = training.ActivationBuffer, Replay
    try:
        with tempfile.TemporaryDirectory() as tmp:
            job = training.SAERun("(bench)", "(bench)", sae_cfg, train_cfg, [])
            kind = SAEFit if targets is None else CLTFit
            fit = kind(sae_cfg, seed=0, device=torch.device(args.device))
            trainer = training.Trainer(job, Path(tmp), model, _NoData(), progress=False, note=print, fit=fit)  # fmt: skip
            before = peak_start(args.device)
            start = time.perf_counter()
            trainer.init_b_dec()
            while trainer.step < steps:
                trainer.one_step()
            sync(args.device)
            seconds = time.perf_counter() - start
            peak = peak_extra(args.device, before)
            sae = trainer.raw_sae().eval()
    finally:
        training.ActivationBuffer = real
    with torch.no_grad():
        if targets is None:
            f = sae.encode(held)
            fvu, l0 = fvu_l0(held, sae.decode(f), f)
        else:  # FVU pooled over the layers, L0 summed over them
            y = targets[len(train) :]
            y_hat, f = sae(held)
            fvu, l0 = fvu_l0(y.flatten(1), y_hat.flatten(1), f.flatten(1))
    return {"seconds": seconds, "peak": peak, "fvu": fvu, "l0": l0, "sae": sae}


def clt_rows(args: argparse.Namespace, steps: int) -> None:
    """The CLT trainer against the SAE trainer on ``--hook``, from the same tokens."""
    from glassgpt.features.clt_train import read_layers
    from glassgpt.features.sites import resolve_site

    model, _ = activations(args, rows_only=True)
    hook = resolve_site(model, args.hook, transcoder=args.hook.endswith("mlp_out"))
    layer = hook.layer
    need = args.tokens + args.eval_tokens
    T = min(args.seq_len, model.config.n_ctx)
    gen = torch.Generator().manual_seed(1)
    us, ys = [], []
    with torch.no_grad():
        for _ in range(-(-need // (32 * T))):
            tokens = torch.randint(0, model.config.n_vocab, (32, T), generator=gen)
            u, y = read_layers(model, tokens.to(args.device))
            us.append(u.flatten(0, 1).float())
            ys.append(y.flatten(0, 1).float())
    order = torch.randperm(sum(len(x) for x in us), generator=gen)[:need]
    u, y = torch.cat(us)[order], torch.cat(ys)[order]
    del us, ys
    n = steps * args.batch
    print(f"activations: u, y {tuple(u.shape)}; SAE on layer {layer}'s mlp_out, width "
          f"{args.width}, k {args.k}; CLT width {args.width} per layer, k {args.k} per layer; "
          f"batch {args.batch}, {steps} steps, {args.threads} threads; uptime: "
          f"{os.getloadavg()[0]:.1f} load", flush=True)  # fmt: skip
    sae_x = y[:, layer].contiguous()  # the SAE reconstructs the layer's MLP output
    rows = {}
    rows["SAE"] = glassgpt_train(args, model, sae_x[:n], sae_x[n:], steps)
    rows["CLT"] = glassgpt_train(args, model, u[:n], u[n:], steps, targets=y)
    print("\n| trainer | tokens/s | FVU | L0 | peak MiB | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {n / r['seconds']:,.0f} | {r['fvu']:.4f} | {r['l0']:.1f} | "
              f"{r['peak']:.0f} | {r['seconds']:.1f} |")  # fmt: skip
    ratio = rows["SAE"]["seconds"] / rows["CLT"]["seconds"]
    print(
        f"CLT tokens/s ÷ SAE tokens/s: {ratio:.3f} (the CLT fits {model.config.n_layers} "
        f"layers: {ratio * model.config.n_layers:.2f} per layer fitted)"
    )


class _NoData:
    def stream(self, split: str) -> None:
        return None


def warmup(steps: int) -> int:
    return min(50, max(1, steps // 10))


def pages_row(args: argparse.Namespace, model: Any, sae: Any) -> dict[str, Any]:
    from glassgpt.features.pages import compute_pages

    T = min(args.seq_len, model.config.n_ctx)
    n = -(-args.pages_tokens // T)
    gen = torch.Generator().manual_seed(2)
    stream = torch.randint(0, model.config.n_vocab, (n, T), generator=gen)

    def batches() -> Any:
        for first in range(0, n, 64):
            yield stream[first : first + 64], torch.arange(first, min(first + 64, n)) * T

    before = peak_start(args.device)
    start = time.perf_counter()
    with torch.no_grad():
        compute_pages(model, sae, batches())
    sync(args.device)
    return {"seconds": time.perf_counter() - start, "peak": peak_extra(args.device, before),
            "tokens": n * T}  # fmt: skip


def saelens_python(args: argparse.Namespace) -> Path | None:
    path = Path(args.saelens_python) if args.saelens_python else ROOT / ".venv-saelens" / "bin" / "python"  # fmt: skip
    return path if path.is_file() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", help="a run, checkpoint or HF GPT-2 folder (default: a random GPT)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--hook", default="blocks.1.resid_post")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("-k", type=int, default=32)
    p.add_argument("--batch", type=int, default=4096, help="tokens per step")
    p.add_argument("--tokens", type=int, default=262_144, help="training tokens")
    p.add_argument("--eval-tokens", type=int, default=16_384)
    p.add_argument("--lr", type=float, default=4e-4)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--pages-tokens", type=int, default=1_000_000, help="0: no pages row")
    p.add_argument("--saelens-python", help="the interpreter with sae_lens (default .venv-saelens)")
    p.add_argument("--saelens-side", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--clt", action="store_true", help="the CLT trainer against the SAE trainer (module docstring)")  # fmt: skip
    args = p.parse_args()
    if args.saelens_side:
        saelens_side(Path(args.saelens_side))
        return
    torch.set_num_threads(args.threads)
    steps = args.tokens // args.batch
    if args.clt:
        clt_rows(args, steps)
        return
    t0 = time.perf_counter()
    model, acts = activations(args)
    train, held = acts[: steps * args.batch], acts[steps * args.batch :]
    print(f"activations: {tuple(acts.shape)} of {args.hook} in {time.perf_counter() - t0:.1f} s; "
          f"width {args.width}, k {args.k}, batch {args.batch}, {steps} steps, {args.device}, "
          f"{args.threads} threads", flush=True)  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    rows["glassgpt"] = glassgpt_train(args, model, train, held, steps)
    python = saelens_python(args)
    if python is None:
        print("SAELens: no .venv-saelens (made by .ci/run); its rows are left out")
    else:
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory() as tmp:
            save_file({"train": train.cpu().contiguous(), "eval": held.cpu().contiguous()},
                      str(Path(tmp) / "acts.safetensors"))  # fmt: skip
            job = {"device": args.device, "batch": args.batch, "steps": steps, "width": args.width,
                   "k": args.k, "lr": args.lr, "warmup": warmup(steps),
                   "decay": round(0.2 * steps), "dead_steps": max(1, steps // 10),
                   "threads": args.threads, "seed": 0}  # fmt: skip
            (Path(tmp) / "job.json").write_text(json.dumps(job))
            run = subprocess.run([str(python), __file__, "--saelens-side", tmp], capture_output=True, text=True)  # fmt: skip
            if run.returncode != 0:
                lines = [x for x in run.stderr.splitlines() if "registered at" not in x]
                print("SAELens failed:\n" + "\n".join(lines[-25:]))
            else:
                for name, r in json.loads((Path(tmp) / "result.json").read_text()).items():
                    rows[f"SAELens ({name})"] = r
    tokens = steps * args.batch
    ours = tokens / rows["glassgpt"]["seconds"]
    print("\n| trainer | tokens/s | × SAELens | FVU | L0 | peak MiB | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | | |")
            continue
        rate = tokens / r["seconds"]
        ratio = "" if name == "glassgpt" else f"{ours / rate:.2f}"
        print(f"| {name} | {rate:,.0f} | {ratio} | {r['fvu']:.4f} | {r['l0']:.1f} | "
              f"{r['peak']:.0f} | {r['seconds']:.1f} |")  # fmt: skip
    print("(× SAELens: glassgpt's tokens/s over that row's; >1: glassgpt faster)")
    if args.pages_tokens > 0:
        r = pages_row(args, model, rows["glassgpt"]["sae"])
        print(f"\nfeature pages: {args.width} latents over {r['tokens']:,} tokens: "
              f"{r['seconds']:.1f} s ({r['tokens'] / r['seconds']:,.0f} tokens/s), "
              f"peak {r['peak']:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
