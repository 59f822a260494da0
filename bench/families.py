"""Decoding speed at real family shapes: glassgpt beside transformers and llama.cpp, one run.

    PYTHONPATH=src python bench/families.py [--threads 2] [--repeats 3] [--new-tokens 128]
    PYTHONPATH=src python bench/families.py --new-tokens 8 --repeats 1   # quick: does it run

Random weights at the shapes of SmolLM2-135M (Llama: d 576, 30 layers, 9 heads over 3
key/value heads, d_mlp 1536, vocab 49,152, tied, RoPE θ 100,000) and Qwen3-0.6B (d 1,024, 28
layers, 16 heads over 8, d_head 128, d_mlp 3,072, vocab 151,936, tied, QK-norm, θ 10⁶);
batch 1, a 16-token prompt, greedy decoding to exactly --new-tokens tokens. Engines:

- glassgpt ``cast(model, dtype)`` in float32, bf16 and int8, and int4 with
  ``--precisions float32,int8,int4`` beside llama.cpp's Q4_K_M and Q4_0 (``generate``: the replayed step
  on a CPU; the line under each table says which engine decoded);
- transformers (``AutoModelForCausalLM`` of the folder ``glassgpt.interop.to_hf`` wrote from
  the same weights) in float32 and bf16 (it has no int8 CPU path: int8 is compared with its
  float32);
- llama.cpp through ``llama_cpp`` (llama-cpp-python) on GGUF files written by llama.cpp's own
  ``convert_hf_to_gguf.py`` from that folder (F32, F16, Q8_0 beside float32, bf16, int8); the
  converter is looked for under --llama-src (the llama-cpp-python sdist's vendor/llama.cpp).
  The folder gets a byte-level BPE tokenizer of 264 tokens (the converter needs one; ids
  past it are padding tokens in the GGUF vocabulary), and the converter is told its
  pre-tokenizer by name (``smollm`` / ``qwen2``): it recognises only the published ones by
  hash. A peer that does not import or convert is skipped with the reason printed.

Greedy steps pick their ids reading the unembedding's int8 copy (``glassgpt.kernels.greedy``;
the same ids as the full product's argmax): a line per glassgpt float32 and bf16 engine
gives the candidates a step left and the steps that took the full product, from one more
untimed call; random weights' logits are not a trained model's (``bench/greedy.py`` counts
both), so these lines say what the timed steps did. ``--argmax-ab`` adds those engines again
with the pick off, interleaved in the same repeats.

Printed: the CPU (model name, the SIMD flags the kernels care about), torch's threads, the
load average, each engine's load seconds, the memory on 2 MiB pages after each shape (the
engines' weights: glassgpt's anonymous copies, llama.cpp's mapped files), and per engine the
medians over --repeats of tokens/s (new tokens over the whole call, prompt included) and ms
per step ((t_N − t_1)/(N − 1), paired per repeat), with the ratios to transformers and llama.cpp at the same precision.
The engines are interleaved in every repeat, so that they share the machine's noise
(``bench/generate.py``'s ``measure``). Targets: ≥ 2× transformers and ≥ 1.2× llama.cpp.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/generate.py's helpers
from generate import (
    NO_PICK,
    OFF,
    REPO,
    candidates_line,
    hf_call,
    measure,
    ours_call,
    prefix_agreement,
    step_ms,
)
from glassgpt.interop import to_hf
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.replay import ReplayedStep

LLAMA = {"positional": "rope", "norm": "rmsnorm", "bias": False, "mlp": "swiglu",
         "tie_embeddings": True, "n_ctx": 2048}  # fmt: skip
SHAPES: dict[str, tuple[dict[str, Any], str]] = {  # config, the converter's pre-tokenizer name
    "smollm2-135m": ({**LLAMA, "n_vocab": 49152, "d_model": 576, "n_layers": 30, "n_heads": 9,
                      "n_kv_heads": 3, "d_head": 64, "d_mlp": 1536, "rope_base": 100000.0},
                     "smollm"),
    "qwen3-0.6b": ({**LLAMA, "n_vocab": 151936, "d_model": 1024, "n_layers": 28, "n_heads": 16,
                    "n_kv_heads": 8, "d_head": 128, "d_mlp": 3072, "qk_norm": True,
                    "rope_base": 1e6, "norm_eps": 1e-6}, "qwen2"),
}  # fmt: skip
PRECISIONS = (("float32", "F32", "f32"), ("bf16", "F16", "f16"), ("int8", "Q8_0", "q8_0"))
# int4 (--precisions …,int4): llama.cpp's Q4_K_M (its "vs llama.cpp") and Q4_0, quantized by
# llama.cpp's llama_model_quantize from the converter's F32 file
Q4 = (("Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M"), ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"))
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
LLAMA_SRC = (REPO.parent / "llamabuild", REPO.parent.parent / "llamabuild")  # main, a worktree


def cpu_line() -> str:
    """The CPU's model name and the SIMD flags among FLAGS it has (from /proc/cpuinfo)."""
    name, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    have = [f for f in FLAGS if f in flags]
    return f"{name}; flags: {' '.join(have) or 'none of ' + ' '.join(FLAGS)}"


def random_model(config: dict[str, Any]) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**config)).eval()


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer of the 256 byte tokens and a few merges (llama.cpp refuses
    a BPE vocabulary without merges), for the converter."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {ch: i for i, ch in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", ch) for ch in "taoswcbp"]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048}'
    )


def find_converter(roots: list[Path]) -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py in a llama-cpp-python sdist under one of ``roots``."""
    for root in roots:
        hits = (
            sorted(root.glob("*/vendor/llama.cpp/convert_hf_to_gguf.py")) if root.is_dir() else []
        )
        if hits:
            return hits[0]
    return None


# Runs llama.cpp's converter with the pre-tokenizer named (it knows published ones by hash).
CONVERT = """
import sys
sys.path.insert(0, {src!r})
sys.argv = ["convert_hf_to_gguf.py", *{argv!r}]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(converter: Path, folder: Path, pre: str, outtype: str, out: Path) -> str | None:
    """Write ``out`` by llama.cpp's converter; None, or why it failed (its last line)."""
    argv = [str(folder), "--outtype", outtype, "--outfile", str(out)]
    code = CONVERT.format(src=str(converter.parent), argv=argv, pre=pre)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if run.returncode != 0 or not out.exists():
        lines = (run.stderr or run.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit {run.returncode}"
    return None


OPEN: list[Any] = []  # llama.cpp models, closed before exit (their finalizers fail at shutdown)


def llama_engine(path: Path, threads: int) -> Any:
    """fn(prompts [1, T], n) → the n greedy ids from llama.cpp (prompt evaluated every call)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=threads,
                          n_threads_batch=threads, n_batch=64, verbose=False)  # fmt: skip
    OPEN.append(llm)

    def call(prompts: torch.Tensor, n: int) -> list[list[int]]:
        ids: list[int] = []
        llm.reset()  # else generate keeps the cached prompt prefix: no prompt evaluated
        for tok in llm.generate(prompts[0].tolist(), temp=0.0, top_k=1, reset=True):
            ids.append(tok)
            if len(ids) == n:
                break
        return [ids]

    return call


GREEDY: dict[str, GPT] = {}  # the glassgpt engines whose greedy candidates are reported


def engines_for(name: str, args: argparse.Namespace, work: Path) -> tuple[dict[str, tuple], dict[str, float]]:  # fmt: skip
    """name → (call, precision, _) for every engine of one shape, and each one's load seconds."""
    config, pre = SHAPES[name]
    base = random_model(config)
    folder = to_hf(base, work / name / "hf")
    engines: dict[str, tuple] = {}
    loads: dict[str, float] = {}
    for dtype in args.precisions:
        t = time.perf_counter()
        ours = cast(base, dtype)
        loads[f"glassgpt {dtype}"] = time.perf_counter() - t
        engines[f"glassgpt {dtype}"] = (lambda x, n, m=ours: ours_call(m, x, n), dtype, 0)
        if dtype in ("float32", "bf16"):
            GREEDY[f"glassgpt {dtype}"] = ours
            if args.argmax_ab:  # the same steps without the greedy int8 pick, interleaved
                engines[f"glassgpt {dtype}{NO_PICK}"] = (
                    lambda x, n, m=ours: ours_call(m, x, n, **OFF), dtype, 0)  # fmt: skip
    if args.transformers:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()

        for dtype, torch_dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            if dtype not in args.precisions:
                continue
            t = time.perf_counter()
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).eval()
            loads[f"transformers {dtype}"] = time.perf_counter() - t
            engines[f"transformers {dtype}"] = (lambda x, n, m=hf: hf_call(m, x, n), dtype, 0)
    del base
    why = llama_unavailable(args)
    if why is not None:
        print(f"  llama.cpp skipped: {why}")
        return engines, loads
    write_tokenizer(folder)
    want = [(d, lb, o) for d, lb, o in PRECISIONS if d in args.precisions or
            (d == "float32" and "int4" in args.precisions)]  # fmt: skip
    for dtype, label, outtype in want:
        gguf = work / name / f"{label}.gguf"
        failed = convert(args.converter, folder, pre, outtype, gguf)
        if failed is not None:
            print(f"  llama.cpp {label} skipped: the converter failed: {failed}")
            continue
        if dtype in args.precisions:
            t = time.perf_counter()
            engines[f"llama.cpp {label}"] = (llama_engine(gguf, args.threads), dtype, 0)
            loads[f"llama.cpp {label}"] = time.perf_counter() - t
        if dtype == "float32" and "int4" in args.precisions:
            from quality import quantize_gguf

            for q4, ftype in Q4:
                out = work / name / f"{q4}.gguf"
                quantize_gguf(gguf, out, ftype, args.threads)
                t = time.perf_counter()
                engines[f"llama.cpp {q4}"] = (llama_engine(out, args.threads), "int4", 0)
                loads[f"llama.cpp {q4}"] = time.perf_counter() - t
    return engines, loads


def llama_unavailable(args: argparse.Namespace) -> str | None:
    if not args.llama:
        return "--no-llama"
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama_cpp does not import ({e})"
    if args.converter is None:
        return f"no convert_hf_to_gguf.py under {', '.join(map(str, args.llama_src))}"
    return None


def table(name: str, args: argparse.Namespace, work: Path) -> None:
    print(f"\n## {name}: {SHAPES[name][0]['n_layers']} layers, d {SHAPES[name][0]['d_model']}")
    engines, loads = engines_for(name, args, work)
    N = args.new_tokens
    prompts = torch.randint(0, 256, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    med, ids, rec = measure(engines, prompts, N, args.repeats)
    rate = {k: N / t_n for k, (_, t_n) in med.items()}
    print(f"medians of {args.repeats}; tok/s: {N} new tokens over the whole call (prompt "
          f"{args.prompt} tokens included); ms/step: (t_{N} − t_1)/{N - 1}\n")  # fmt: skip
    header = ("| engine | load s | tok/s | ms/step | vs transformers | vs llama.cpp "
              "| same ids as transformers float32 |")  # fmt: skip
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    labels = {dtype: label for dtype, label, _ in PRECISIONS} | {"int4": Q4[0][0]}
    for engine, (_, dtype, _) in engines.items():
        hf = rate.get(f"transformers {dtype}", rate.get("transformers float32"))
        lc = rate.get(f"llama.cpp {labels[dtype]}")
        mine = engine.startswith("glassgpt")
        vs_hf = f"{rate[engine] / hf:.2f}×" if mine and hf else "–"
        vs_lc = f"{rate[engine] / lc:.2f}×" if mine and lc else "–"
        base = ids.get("transformers float32")
        same = f"{prefix_agreement(ids[engine], base):.0%}" if base else "–"
        print(f"| {engine} | {loads.get(engine, 0.0):.2f} | {rate[engine]:.1f} | "
              f"{step_ms(rec[engine], N):.1f} | {vs_hf} | {vs_lc} | {same} |")  # fmt: skip
        sys.stdout.flush()
    for engine, model in GREEDY.items():
        print(candidates_line(engine, model, prompts, N))
    GREEDY.clear()
    why = ReplayedStep.why_not
    print("glassgpt's float32 and int8 one-token steps: " + (
        "replayed from their recorded kernel calls" if why is None else f"eager ({why})"))  # fmt: skip
    print(huge_pages_line())


def huge_pages_line() -> str:
    """The process's memory on 2 MiB pages (Linux ``/proc/self/smaps_rollup``): anonymous
    (glassgpt's packed weights, ``glassgpt.kernels.pages``) and file-mapped (llama.cpp's
    memory-mapped GGUF, where the file system caches it in 2 MiB folios): a stream on 4 KiB
    pages pays a TLB miss every 4 KiB, so the engines compare fairly only on equal pages."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f) if v}
    except (OSError, ValueError):
        return "memory on 2 MiB pages: unknown (no /proc/self/smaps_rollup)"
    anon, file = kb.get("AnonHugePages", 0) / 1024, kb.get("FilePmdMapped", 0) / 1024
    return (f"memory on 2 MiB pages now: anonymous {anon:.0f} MiB (glassgpt's packed weights), "
            f"file-mapped {file:.0f} MiB (llama.cpp's GGUF)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES)
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--precisions", default="float32,bf16,int8",
                   help="comma-separated among float32, bf16, int8, int4")  # fmt: skip
    p.add_argument("--no-transformers", dest="transformers", action="store_false")
    p.add_argument("--argmax-ab", action="store_true",
                   help="glassgpt float32 and bf16 again with the greedy int8 pick off")  # fmt: skip
    p.add_argument("--no-llama", dest="llama", action="store_false")
    p.add_argument("--llama-src", type=Path, action="append",
                   help="where the llama-cpp-python sdist (its vendor/llama.cpp/"
                        "convert_hf_to_gguf.py) is looked for; default: ../llamabuild")  # fmt: skip
    args = p.parse_args()
    args.llama_src = args.llama_src or list(LLAMA_SRC)
    args.precisions = args.precisions.split(",")
    if not set(args.precisions) <= {"float32", "bf16", "int8", "int4"}:
        p.error(f"--precisions: one of float32, bf16, int8, int4 each, got {args.precisions}")
    args.converter = find_converter(args.llama_src)
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{cpu_line()}\ntorch {torch.__version__}, {args.threads} threads, load average {load}; "
          f"targets: ≥ 2× transformers, ≥ 1.2× llama.cpp at each precision")  # fmt: skip
    for name in args.shapes.split(","):
        if name not in SHAPES:
            p.error(f"--shapes: unknown shape {name!r}; known: {', '.join(SHAPES)}")
    with tempfile.TemporaryDirectory(prefix="glassgpt-families-") as tmp:
        try:
            for name in args.shapes.split(","):
                table(name, args, Path(tmp))
        finally:
            for llm in OPEN:
                llm.close()


if __name__ == "__main__":
    main()
