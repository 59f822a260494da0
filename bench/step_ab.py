"""Replayed decoding steps (and prompts) of two checkouts, alternated process by process (an A/B).

    PYTHONPATH=src python bench/step_ab.py --other /work/main [--dtype bf16] [--rounds 6]
        [--bursts 5] [--tokens 128] [--threads 2] [--shape smollm2-135m] [--rows 1]
        [--prompt 0]
    python bench/step_ab.py --other /work/main --dtype float32 --shape shakespeare --rows 8 \\
        --prompt 32 --threads 1       # a server's 8-row step and 32-token prompt, CPU time
    python bench/step_ab.py --other /work/main --dtype float32 --shape gpt2-small --rows 8 \\
        --threads 1 --products        # the block products alone, both kernels in one process

With --greedy each step is a greedy one as ``generate`` takes it at temperature 0: the
replayed step's int8 pick (``Decoder.step_greedy``, ``glassgpt.kernels.greedy``) in a
checkout that has it, else the step and the argmax of its logits (``Decoder.greedy``).

Each round runs this checkout and --other once each (the order alternating), each in its own
process: random weights at --shape (SmolLM2-135M's and Qwen3-0.6B's from
``bench/families.py``, the 10.7M ``shakespeare-char`` preset's with 65 characters, or GPT-2
small's), cast to --dtype, a 16-token prompt in each of --rows rows, then --bursts bursts
of --tokens replayed steps of --rows rows (a server's batched step at --rows > 1; where the
model's context cannot hold every burst, each starts again at position 17), each after
half a second of rest (as ``bench/generate.measure`` rests before a timed call, so the
worker threads have gone to sleep). Printed per process: the median ms a step over its
bursts, the slowest burst's, the calling thread's CPU time a step, the whole process's
(every thread: the OpenMP workers' parts and their spinning, what a server's cores pay),
and where the checkout's ``_gemv`` counts them, the products that ran on both threads and
on one (``_parallel.h``'s pacing). With --prompt N, also the forward of an N-token prompt
(one row, a fresh cache each, as a server's prompt thread runs it): its median process CPU
ms over 16 forwards after a cold one. Then per round the ratios other / this, and their
medians: ratios from the same minutes, as the host's load and memory bandwidth move between
rounds (the load average is printed with each).

With --products, no decoding: this checkout's ``_gemv`` and --other's are loaded side by
side in this process, and 20 × --rounds passes over the shape's block matrices (each
layer's W_QKV, W_O and MLP weights, on their panels; bf16 panels with --dtype bf16) take
--rows rows of x each, the two kernels in turn, each in blocks of the rows its panels take:
the median process CPU ms of a pass for each, and other / this. Without processes or a
model between them, this is the steadiest A/B of the products themselves.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent

# the shapes the bench builds itself, beside bench/families.py's (GPTConfig fields)
OWN_SHAPES = {
    "shakespeare": None,  # the shakespeare-char preset's model table, 65 characters
    "gpt2-small": {"n_vocab": 50257, "n_ctx": 1024, "d_model": 768, "n_layers": 12,
                   "n_heads": 12},
}  # fmt: skip

CHILD = """
import json, os, statistics, sys, time
import torch
import glassgpt
assert glassgpt.__file__.startswith({src!r}), glassgpt.__file__
from glassgpt.kernels.extensions import extension
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.cache import KVCache
from glassgpt.sample.engine import Decoder
torch.set_num_threads({threads})
config, rows, bursts, tokens, prompt = {config!r}, {rows}, {bursts}, {tokens}, {prompt}
greedy = {greedy}
torch.manual_seed(0)
model = cast(GPT(GPTConfig(**config)).eval(), {dtype!r})
gemv = extension("_gemv")
counts = getattr(gemv, "pacing_counts", lambda: (0, 0, 0))
n_ctx, n_vocab = model.config.n_ctx, model.config.n_vocab
if 17 + tokens > n_ctx:
    sys.exit(f"--tokens {{tokens}}: a burst must fit in n_ctx {{n_ctx}} after 17 positions")
decoder = Decoder.start(model, rows, min(n_ctx, 17 + bursts * tokens))
with torch.inference_mode():
    decoder.model(torch.arange(16).repeat(rows, 1), cache=decoder.cache)
decoder.step([5] * rows)
c0, times, cpu, proc = counts(), [], 0, 0
for b in range(bursts):
    if decoder.cache.length + tokens > decoder.cache.capacity:
        decoder.cache.length = 17  # a short context: each burst from position 17 again
    time.sleep(0.5)
    t, c, p = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
    for i in range(tokens):
        ids = [(7 * i + b + r) % 60 for r in range(rows)]
        if not greedy:
            decoder.step(ids)
        elif hasattr(decoder, "step_greedy"):  # the int8 pick (glassgpt.kernels.greedy)
            decoder.step_greedy(ids, n_vocab)
        else:  # a checkout without it: the step and its argmax, as generate takes them
            decoder.greedy(decoder.step(ids), n_vocab)
    times.append((time.perf_counter_ns() - t) / tokens / 1e6)
    cpu += (time.thread_time_ns() - c) / tokens / 1e6
    proc += (time.process_time_ns() - p) / tokens / 1e6
par, solo, windows = (b - a for a, b in zip(c0, counts()))
out = dict(ms=statistics.median(times), worst=max(times), cpu=cpu / bursts, proc=proc / bursts,
           parallel=par, solo=solo, windows=windows, why=decoder.why)
if prompt:
    ids = torch.arange(prompt)[None] % 60
    walls, procs = [], []
    with torch.inference_mode():
        for i in range(17):
            cache = KVCache.for_model(model, 1, prompt + 8)
            time.sleep(0.05)
            t, p = time.perf_counter_ns(), time.process_time_ns()
            model(ids, cache=cache)
            walls.append((time.perf_counter_ns() - t) / 1e6)
            procs.append((time.process_time_ns() - p) / 1e6)
    out.update(prompt_ms=statistics.median(walls[1:]), prompt_proc=statistics.median(procs[1:]))
print(json.dumps(out))
"""


def run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    code = CHILD.format(src=str(tree / "src"), threads=args.threads, dtype=args.dtype,
                        config=shape_config(args.shape, tree), rows=args.rows,
                        bursts=args.bursts, tokens=args.tokens, prompt=args.prompt,
                        greedy=args.greedy)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=False)  # fmt: skip
    if out.returncode:
        sys.exit(f"{tree}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _extension(tree: Path, tag: str) -> ModuleType:
    """``tree``'s built ``glassgpt.kernels._gemv``, loaded under its own name ``tag._gemv``."""
    found = sorted((tree / "src" / "glassgpt" / "kernels").glob("_gemv.*.so"))
    if not found:
        sys.exit(f"{tree}: _gemv is not built (python setup.py build_ext --inplace)")
    loader = importlib.machinery.ExtensionFileLoader(f"{tag}._gemv", str(found[0]))
    spec = importlib.util.spec_from_file_location(f"{tag}._gemv", found[0], loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def products(args: argparse.Namespace) -> None:
    """The --products A/B (see the module docstring)."""
    import torch  # (first: its OpenMP runtime, which _gemv's parallel parts look for)

    sys.path.insert(0, str(HERE))
    from glassgpt.kernels import dense
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.model.precision import _projections

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**shape_config(args.shape, HERE.parent)))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    Ws = [dense.out_in_view(W).T.to(dtype) for W in _projections(model)]  # [d_in, d_out]
    del model
    Ps = [dense.panels(W) for W in Ws]
    gen = torch.Generator().manual_seed(1)
    xs = {K: torch.randn(args.rows, K, generator=gen) for K in {W.shape[0] for W in Ws}}
    ys = [torch.empty(args.rows, W.shape[1]) for W in Ws]
    kernels = {"this": _extension(args.this, "this"), "other": _extension(args.other, "other")}
    name = "gemv_panels_bf16" if args.dtype == "bf16" else "gemv_panels"

    def run(g: ModuleType) -> float:
        kernel, block, M = getattr(g, name), g.panels_rows(), args.rows
        t = time.process_time_ns()
        for W, P, y in zip(Ws, Ps, ys, strict=True):
            (K, N), x = W.shape, xs[W.shape[0]]
            for m0 in range(0, M, block):
                kernel(x[m0].data_ptr(), P.data_ptr(), 0, y[m0].data_ptr(), min(block, M - m0),
                       K, N, args.threads)  # fmt: skip
        return (time.process_time_ns() - t) / 1e6

    for g in kernels.values():
        run(g)  # cold first pass, not counted
    took: dict[str, list[float]] = {"this": [], "other": []}
    for i in range(20 * args.rounds):
        for tree in ("this", "other") if i % 2 == 0 else ("other", "this"):
            took[tree].append(run(kernels[tree]))
    this, other = (statistics.median(took[t]) for t in ("this", "other"))
    rows = {t: kernels[t].panels_rows() for t in kernels}
    print(f"{args.shape} {args.dtype} block products, {len(Ws)} matrices, {args.rows} rows, "
          f"{args.threads} threads; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"this ({rows['this']} rows a call): {this:.3f} ms a pass; other ({rows['other']} rows "
          f"a call): {other:.3f} ms; other / this {other / this:.3f}×")  # fmt: skip


def shape_config(shape: str, tree: Path) -> dict:
    """The GPTConfig fields of --shape (the preset's file read from ``tree``)."""
    if shape == "shakespeare":
        import tomllib

        preset = tree / "src" / "glassgpt" / "presets" / "shakespeare-char.toml"
        with open(preset, "rb") as f:
            return {**tomllib.load(f)["model"], "dropout": 0.0, "n_vocab": 65}
    if OWN_SHAPES.get(shape) is not None:
        return dict(OWN_SHAPES[shape])
    sys.path.insert(0, str(HERE))
    from families import SHAPES

    return dict(SHAPES[shape][0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout (its src/)")
    p.add_argument(
        "--this",
        type=Path,
        default=HERE.parent,
        help="this checkout (a check: --this and --other the same)",
    )
    p.add_argument("--dtype", default="bf16", choices=["float32", "bf16", "int8"])
    p.add_argument("--shape", default="smollm2-135m",
                   choices=["smollm2-135m", "qwen3-0.6b", *OWN_SHAPES])  # fmt: skip
    p.add_argument("--rows", type=int, default=1, help="rows of a step (a server's batch)")
    p.add_argument("--prompt", type=int, default=0, help="also time an N-token prompt (0: not)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--products", action="store_true", help="the block products alone, in-process")
    p.add_argument("--greedy", action="store_true",
                   help="greedy steps as generate takes them: the int8 pick where a checkout "
                        "has it (Decoder.step_greedy), else the step and its argmax")  # fmt: skip
    args = p.parse_args()
    if args.rows < 1 or args.prompt < 0:
        p.error("--rows must be at least 1 and --prompt at least 0")
    if args.products:
        if args.dtype == "int8":
            p.error("--products: float32 or bf16 panels")
        products(args)
        return
    this = args.this
    print(f"{args.shape} {args.dtype}, {args.rows} rows a step, {args.threads} threads, "
          f"this {this} against {args.other}")  # fmt: skip
    head = "| round | load | tree | ms a step | slowest burst | thread CPU ms | process CPU ms |"
    rule = "|---:|---:|---|---:|---:|---:|---:|"
    if args.prompt:
        head, rule = head + f" {args.prompt}-token prompt ms | its CPU ms |", rule + "---:|---:|"
    print(head + " products 2 threads / 1 |\n" + rule + "---|")
    ratios: dict[str, list[float]] = {"ms": [], "proc": [], "prompt_proc": []}
    for r in range(args.rounds):
        order = [("this", this), ("other", args.other)]
        got = {}
        for name, tree in order if r % 2 == 0 else order[::-1]:
            got[name] = res = run(tree, args)
            load = os.getloadavg()[0]
            par = f"{res['parallel']} / {res['solo']}" if res["parallel"] + res["solo"] else "–"
            line = (f"| {r} | {load:.2f} | {name} | {res['ms']:.3f} | {res['worst']:.3f} | "
                    f"{res['cpu']:.3f} | {res['proc']:.3f} |")  # fmt: skip
            if args.prompt:
                line += f" {res['prompt_ms']:.2f} | {res['prompt_proc']:.2f} |"
            print(f"{line} {par} |", flush=True)
            time.sleep(1)
        for key in ratios if args.prompt else ("ms", "proc"):
            ratios[key].append(got["other"][key] / got["this"][key])
    print()
    for key, label in (("ms", "step ms"), ("proc", "step process CPU"),
                       ("prompt_proc", "prompt process CPU")):  # fmt: skip
        if ratios[key]:
            each = ", ".join(f"{x:.3f}" for x in ratios[key])
            print(f"other / this, {label}, per round: {each}; "
                  f"median {statistics.median(ratios[key]):.3f}×")  # fmt: skip


if __name__ == "__main__":
    main()
