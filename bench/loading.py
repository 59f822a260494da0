"""Loading an HF folder: glassgpt's ``open_run(folder, dtype=bf16)`` beside transformers'
``from_pretrained(dtype=bfloat16)``, in fresh processes.

    PYTHONPATH=src python bench/loading.py                       # Llama-3.2-1B's shape, 3 repeats
    PYTHONPATH=src python bench/loading.py --preset smollm2-135m --repeats 5   # a quicker check
    PYTHONPATH=src python bench/loading.py --folder /tmp/llama-1b   # keep the folder between runs

The folder (``config.json`` of the preset's shape, written by glassgpt's HF export, and one
``model.safetensors`` of random bf16 weights, the tied W_U once, as the hub's file is) is
written once. Each repeat then starts one Python process per loader, in an order that flips
each repeat, so all meet the same page cache and the same load on the machine. The loaders:
``glassgpt`` is ``open_run(folder, dtype="bf16")``, what ``-c`` and ``glassgpt.load`` do: the
weights read into bf16, then cast for inference (``glassgpt.model.precision.cast``: on a CPU
it registers the decoding kernels' packed copies of the projections); ``from_hf`` is the
read alone, ``from_hf(folder, dtype=None)``; ``transformers`` is
``AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)``. Printed:

- ``load s``: the load alone, timed inside the child, after its imports;
- ``process s``: the child's whole wall time (interpreter, imports, load), timed outside;
- ``peak RSS``: the child's peak resident memory (its own ``VmHWM``), over the
  file's size, and ``load RSS``: that peak less the child's resident memory after its imports
  (the load's own cost);
- ``forward s`` and ``RSS after``: a first forward of 8 tokens, and the resident memory
  then (transformers leaves its weights in the file's memory map until they are read, so its
  RSS grows by the file at its first forward, not at its load);
- medians over the repeats, and transformers' time / glassgpt's (above 1: glassgpt is faster).

Issue 42's target: glassgpt's peak RSS ≤ 1.2 × the file's size, its time ≤ transformers'.
Nothing is asserted; the figures go to ``docs/performance.md``.
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

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
kind, folder = sys.argv[1], sys.argv[2]
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
import torch
if kind == "glassgpt":
    from glassgpt.checkpoint import open_run
elif kind == "from_hf":
    from glassgpt.interop import from_hf
else:
    import transformers
base = status("VmRSS:")
start = time.perf_counter()
if kind == "glassgpt":
    model = open_run(folder, dtype="bf16").model
elif kind == "from_hf":
    model = from_hf(folder, dtype=None)  # as stored (bf16), without the inference packing
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
seconds = time.perf_counter() - start
n = sum(p.numel() for p in model.parameters())
dtype = str(next(model.parameters()).dtype)
hwm = status("VmHWM:")  # this process's own peak (its memory map is new since exec)
ids = torch.arange(1, 9)[None]  # a first forward: weights still in the file's map are read now
start = time.perf_counter()
with torch.no_grad():
    model(ids)
forward = time.perf_counter() - start
print(json.dumps({"load_s": seconds, "base": base, "hwm": hwm, "params": n, "dtype": dtype,
                  "forward_s": forward, "after": status("VmRSS:")}))
"""


def write_folder(folder: Path, preset: str) -> Path:
    """``config.json`` and ``model.safetensors`` (random bf16 weights) of a preset's shape."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from glassgpt.interop.hf_export import config_to_hf
    from glassgpt.model import GPTConfig
    from glassgpt.train.resolve import preset_model

    config = GPTConfig.from_dict(preset_model(preset))
    hf = config_to_hf(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**hf, "dtype": "bfloat16"}, indent=2))
    hf_config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        shapes = transformers.AutoModelForCausalLM.from_config(hf_config).state_dict()
    if hf_config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)  # the hub's file holds the tied matrix once
    gen = torch.Generator().manual_seed(0)
    state = {
        name: (torch.randn(t.shape, generator=gen) * 0.02).to(torch.bfloat16)
        for name, t in shapes.items()
    }
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def load_once(kind: str, folder: Path) -> dict:
    """One fresh process loading ``folder``: its figures (see the module docstring)."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, kind, str(folder)], env=env,
                                stdout=out, stderr=err, text=True)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"{kind} failed:\n{err.read()[-2000:]}")
        got = json.loads(out.read().strip().splitlines()[-1])
    # ru_maxrss (KiB) counts the parent's peak at the fork too (Linux keeps the larger of the
    # two across exec), so the child's own VmHWM is the figure; both are kept to compare
    return {**got, "wall_s": wall, "peak": got["hwm"], "ru_maxrss": usage.ru_maxrss * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="llama-3.2-1b", help="the model's shape (a preset)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None, help="write (or reuse) it here")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / args.preset
        if not (folder / "model.safetensors").is_file():  # in a child: this process stays small
            start = time.perf_counter()
            env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
            code = f"import sys; sys.path.insert(0, {str(REPO / 'bench')!r}); import loading; "
            code += f"loading.write_folder(__import__('pathlib').Path({str(folder)!r}), {args.preset!r})"
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            print(f"wrote {folder} in {time.perf_counter() - start:.0f} s", flush=True)
        size = (folder / "model.safetensors").stat().st_size
        print(f"{args.preset}: model.safetensors {size / 2**30:.2f} GiB (bf16)", flush=True)
        runs: dict[str, list[dict]] = {"glassgpt": [], "from_hf": [], "transformers": []}
        for r in range(args.repeats):
            order = list(runs)[:: 1 if r % 2 == 0 else -1]
            for kind in order:
                runs[kind].append(load_once(kind, folder))
                got = runs[kind][-1]
                print(f"  {r + 1}/{args.repeats} {kind:12} load {got['load_s']:.2f} s, "
                      f"process {got['wall_s']:.2f} s, peak RSS {got['peak'] / 2**30:.2f} GiB",
                      flush=True)  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}")
    med = {k: {f: statistics.median(x[f] for x in v) for f in ("load_s", "wall_s")}
           for k, v in runs.items()}  # fmt: skip
    print("\n| loader | load s | process s | peak RSS GiB | peak RSS / file | load RSS / file "
          "| forward s | RSS after GiB |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, rows in runs.items():
        m = {f: statistics.median(x[f] for x in rows) for f in ("peak", "forward_s", "after")}
        own = statistics.median(x["peak"] - x["base"] for x in rows)
        print(f"| {kind} | {med[kind]['load_s']:.2f} | {med[kind]['wall_s']:.2f} | "
              f"{m['peak'] / 2**30:.2f} | {m['peak'] / size:.2f} | {own / size:.2f} | "
              f"{m['forward_s']:.2f} | {m['after'] / 2**30:.2f} |")  # fmt: skip
    for kind in ("glassgpt", "from_hf"):
        ratio = med["transformers"]["load_s"] / med[kind]["load_s"]
        whole = med["transformers"]["wall_s"] / med[kind]["wall_s"]
        print(f"transformers / {kind}: load {ratio:.2f}×, process {whole:.2f}×")


if __name__ == "__main__":
    main()
