"""Decoding speed: glassgpt's generate beside transformers' generate (use_cache=True), same run.

    PYTHONPATH=src python bench/generate.py [--repeats 3] [--new-tokens 128] [--threads N]
    PYTHONPATH=src python bench/generate.py --device cuda --skip-quality    # on a GPU
    PYTHONPATH=src python bench/generate.py --skip-bf16 --repeats 1 --new-tokens 16  # quick

GPT-2 small shape (124M parameters) with random weights, a 16-token prompt, greedy decoding
(both stop only at max_new_tokens). For each precision and batch size it prints tokens/s
(new tokens over the whole call, prefill included), the decode time per step (from a second
call with one new token: (t_N − t_1)/(N − 1)), the weight bytes read per step over that
time (GB/s) beside the machine's memory bandwidth measured here (sum of a 512 MiB tensor,
probed before every repeat: the limit is the median of those probes, taken in the same minutes
as the steps it bounds),
and "same ids": the share of greedy tokens equal to transformers' before the first
difference (100% in float32; bf16 kernels round differently, so greedy paths may part).
Medians over repeats, glassgpt and transformers interleaved to share the machine's noise.

"glassgpt float32" is ``cast(model, "float32")``, the model ``glassgpt sample`` decodes;
"glassgpt float32, Python API" is ``glassgpt.load`` of the same weights (an HF folder written
here) and ``generate``, as a user of the Python API runs them (target: the CLI's tokens/s).
On a CPU, "glassgpt int8" is ``cast(model, "int8")``: weight-only int8 with one scale per
output channel (``glassgpt.kernels.int8``), beside CTranslate2's int8 with the ratio between
them. ``--skip-bf16`` leaves the bf16 rows (and bf16 quality) out: without AVX-512 BF16 or
AMX, bf16 decoding on a CPU takes minutes.

``--dtype int4``: glassgpt int4 (``cast(model, "int4")``: 4-bit weights in groups of 32 with
float16 scales, int8 unembedding; ``glassgpt.kernels.int4``) beside llama.cpp's Q4_K_M and Q4_0
of the same weights (glassgpt's ``export_gguf`` F32 with GPT-2's tokenizer, quantized by
llama.cpp's ``llama_model_quantize``, run through ``llama_cpp`` with its prompt evaluated every
call), glassgpt float32 and int8 for reference, batch 1 only, and int4's tok/s ratio to each
llama.cpp row (target ≥ 1.2× Q4_K_M); perplexity at every precision beside llama.cpp's is
``bench/quality.py``.

Greedy steps pick their ids reading the unembedding's int8 copy (``glassgpt.kernels.greedy``:
the same ids as the full product's argmax); a line per engine and batch says how many
candidates a step that left and how many steps took the full product instead, and
``--argmax-ab`` adds glassgpt float32 and bf16 rows with that pick off, in the same run.

Then a quality check: perplexity on held-out tinyshakespeare of a small character model
(trained here for --train-steps, or --checkpoint DIR) in float32, bf16 and int8; and, for
the GPT-2-shape model with random weights (whose perplexity means nothing), the logits'
relative error ‖z − z₃₂‖/‖z₃₂‖ and the greedy agreement with float32.
Nothing is asserted; targets (float32 ≥ 1.2×, bf16 ≥ 2× transformers' float32) are printed.

CTranslate2 (on by default when ``ctranslate2`` is installed) runs in the same
interleaved loop: glassgpt's weights are exported with ``glassgpt.interop.to_hf`` beside a
GPT-2 tokenizer built from ../shared/data/gpt2 (the converter needs a vocabulary and
bos/eos/unk tokens), then converted by its ``TransformersConverter`` to float32 and int8.
Its rows give the share of the measured bandwidth limit (weight bytes per step over the
step time, against the memory bandwidth) and glassgpt's ratio to it at the same precision;
a last table gives ms/step at contexts 64, 256 and 1,024 for every engine, each step timed
between the arrivals of the first and the last new token (glassgpt's ``stream``, a
transformers streamer, CTranslate2's step callback), so that a long prompt's forward stays out.
On a GPU (``--device cuda``) the same table compares both libraries on the GPU (transformers
with SDPA attention), and GB/s is beside the GPU's device-to-device copy rate; timings
include every host-device synchronisation each library makes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from glassgpt.interop import from_hf, to_hf  # noqa: E402
from glassgpt.model.precision import cast, perplexity  # noqa: E402
from glassgpt.sample import generate, stream  # noqa: E402


class Bandwidth:
    """GB/s reading a 512 MiB float32 tensor: ``probe()`` takes the median of 3 sums now and
    keeps it, so that the limit can be measured in the same minutes as the decoding it bounds
    (a shared host's memory speed drifts from minute to minute)."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.x = torch.rand(128 * 1024 * 1024, device=device)
        self.x.sum().item()  # first touch
        self.seen: list[float] = []

    def probe(self) -> float:
        times = []
        for _ in range(3):
            if self.device != "cpu":
                torch.cuda.synchronize()
            t = time.perf_counter()
            self.x.sum().item()
            times.append(time.perf_counter() - t)
        self.seen.append(self.x.numel() * 4 / statistics.median(times) / 1e9)
        return self.seen[-1]

    def median(self) -> float:
        return statistics.median(self.seen)


# Each new token's arrival time (perf_counter), one prompt [1, T] greedy: the context table
# takes a step as (last − first)/(n − 1), free of the prompt's forward and its noise.
TokenTimes = Callable[[torch.Tensor, int], list[float]]


def ours_times(model: torch.nn.Module, prompt: torch.Tensor, n: int, **kw: Any) -> list[float]:
    return [time.perf_counter() for _ in stream(model, prompt[0].tolist(), max_new_tokens=n,
                                                temperature=0, **kw)]  # fmt: skip


def hf_times(model: torch.nn.Module, prompt: torch.Tensor, n: int) -> list[float]:
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):  # put() gets the prompt first, then each new token
        def __init__(self) -> None:
            self.calls: list[float] = []

        def put(self, value: Any) -> None:
            self.calls.append(time.perf_counter())

        def end(self) -> None:
            pass

    stamps = Stamps()
    hf_call(model, prompt, n, streamer=stamps)
    return stamps.calls[1:]


EAGER = {"cuda_graph": False, "replay": False}  # glassgpt's generate without its step capture


def ours_call(model: torch.nn.Module, prompts: torch.Tensor, n: int, **kw: Any) -> list[list[int]]:
    # one-token steps from a CUDA graph on GPUs, replayed kernel calls on CPUs
    return generate(model, prompts, max_new_tokens=n, temperature=0, **kw)


OFF = {"int8_argmax": False}  # greedy steps' pick from the full float32 (bf16) unembedding


def candidates_line(name: str, model: torch.nn.Module, prompts: torch.Tensor, n: int) -> str:
    """How the greedy steps of ``model`` picked (``glassgpt.kernels.greedy``: the int8 copy's
    candidates, recomputed exactly): candidates a step over the rows, and the steps that
    took the full product (too many candidates), from one more untimed call."""
    s = stream(model, prompts, max_new_tokens=n, temperature=0)
    for _ in s:
        pass
    g = s.decoder.greedy_steps if s.decoder is not None else None  # type: ignore[attr-defined]
    if g is None or not g.steps:
        return f"{name}: no int8 pick ({s.decoder.why if s.decoder else 'no decoder'})"  # type: ignore[attr-defined]
    return (f"{name}: {g.candidates / g.steps:.1f} candidates a step (over {prompts.shape[0]} "
            f"row(s)), {g.full} of {g.steps} steps on the full product, {g.plain} plain steps "
            "resting from the int8 pass after misses")  # fmt: skip


def eager_call(model: torch.nn.Module, prompts: torch.Tensor, n: int) -> list[list[int]]:
    return generate(model, prompts, max_new_tokens=n, temperature=0, **EAGER)


def hf_call(model: torch.nn.Module, prompts: torch.Tensor, n: int, **kw: Any) -> list[list[int]]:
    with torch.inference_mode():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, use_cache=True, **kw)  # fmt: skip
    return out[:, prompts.shape[1] :].tolist()


class CT2:
    """A CTranslate2 ``Generator`` over glassgpt's weights, exported to an HF folder first."""

    def __init__(self, model: torch.nn.Module, quantization: str, threads: int, work: Path) -> None:
        import ctranslate2

        hf_dir = work / "hf"
        if not (hf_dir / "tokenizer.json").is_file():
            to_hf(model, hf_dir)
            self.vocab = save_gpt2_tokenizer(hf_dir)
        else:
            self.vocab = load_vocab(hf_dir)
        out = work / f"ct2-{quantization}"
        ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(
            str(out), quantization=quantization, force=True
        )
        self.generator = ctranslate2.Generator(
            str(out), device="cpu", inter_threads=1, intra_threads=threads
        )
        self.bytes_per_param = 4 if quantization == "float32" else 1

    def __call__(self, prompts: torch.Tensor, n: int, **kw: Any) -> list[list[int]]:
        tokens = [[self.vocab[i] for i in row] for row in prompts.tolist()]
        options = {"max_length": n, "min_length": n, "sampling_topk": 1}
        results = self.generator.generate_batch(tokens, include_prompt_in_result=False,
                                                **options, **kw)  # fmt: skip
        return [r.sequences_ids[0] for r in results]

    def times(self, prompt: torch.Tensor, n: int) -> list[float]:
        """The same call for one prompt, stamping each new token in its step callback."""
        stamps: list[float] = []
        self(prompt, n, callback=lambda _step: stamps.append(time.perf_counter()) and False)
        return stamps


def save_gpt2_tokenizer(folder: Path) -> list[str]:
    """Write GPT-2's tokenizer (from ../shared/data/gpt2) into ``folder``; return id → token.

    Built from a ``tokenizers.Tokenizer``: with transformers 5, ``GPT2TokenizerFast(vocab_file=,
    merges_file=)`` comes out with a vocabulary of one token, which CTranslate2 cannot use."""
    import json

    import tokenizers
    import transformers

    files = REPO.parent / "shared/data/gpt2"
    if not (files / "encoder.json").is_file():
        sys.exit(f"CTranslate2 needs GPT-2's tokenizer files: {files} not found (or --no-ct2)")
    vocab = json.loads((files / "encoder.json").read_text(encoding="utf-8"))
    lines = (files / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    merges = [tuple(line.split()) for line in lines if line]
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    eos = "<|endoftext|>"
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=eos, eos_token=eos, unk_token=eos
    )
    fast.save_pretrained(folder)
    return load_vocab(folder)


def load_vocab(folder: Path) -> list[str]:
    import json

    model = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    by_id = {i: t for t, i in model["vocab"].items()}
    return [by_id[i] for i in range(len(by_id))]


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of generated tokens before the first difference, over the rows (greedy decoding
    diverges for good once one argmax flips: expected in bf16, where kernels round differently)."""
    same = 0
    for x, y in zip(a, b):
        k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
        same += k
    return same / sum(len(x) for x in a)


# Seconds of rest before each timed call: the previous call's worker threads (llama.cpp's
# thread pool, OpenMP's) spin-wait a while after it returns, on the cores the next engine
# needs (one A/B on SmolLM2-135M's shape, 2 threads, quiet host: glassgpt bf16 8.9 ms a step
# right after llama.cpp's calls, 6.6 ms after a rest; llama.cpp F32 20.3 → 16.9 ms).
SETTLE = 0.5


def timed(fn, *args) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


API = "glassgpt float32, Python API"


def python_api(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``glassgpt.load`` of ``model``'s weights (written as an HF folder), as a user of the
    Python API loads them: the row beside the CLI's path (``cast(model, "float32")``, what
    ``glassgpt sample`` decodes)."""
    import tempfile
    import warnings

    import glassgpt

    folder = to_hf(model, Path(tempfile.mkdtemp(prefix="glassgpt-api-")) / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the folder has no tokenizer: ids only
        loaded, _ = glassgpt.load(folder, device=device)
    return loaded


def make_engines(args: argparse.Namespace) -> tuple[dict[str, tuple], int, dict[str, TokenTimes]]:
    """name → (call(prompts, n), dtype label, bytes per parameter); the parameter count; and
    name → the engine's :data:`TokenTimes` (the context table's)."""
    import transformers

    dev = args.device
    torch.manual_seed(0)
    hf_kw = {"attn_implementation": "sdpa"} if dev != "cpu" else {}
    hf32 = transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(), **hf_kw).eval()
    hfbf = transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(), **hf_kw).eval()
    hfbf.load_state_dict(hf32.state_dict())
    hfbf = hfbf.to(torch.bfloat16)
    for m in (hf32, hfbf):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    base = from_hf(hf32)
    api = python_api(base, dev)
    base = base.to(dev)
    o32, obf = cast(base, torch.float32), cast(base, torch.bfloat16)
    h32, hbf = hf32.to(dev), hfbf.to(dev)
    engines: dict[str, tuple] = {
        "glassgpt float32": (lambda x, n: ours_call(o32, x, n), "float32", 4),
        API: (lambda x, n: ours_call(api, x, n), "float32", 4),
        "transformers float32": (lambda x, n: hf_call(h32, x, n), "float32", 4),
        "glassgpt bf16": (lambda x, n: ours_call(obf, x, n), "bf16", 2),
        "transformers bf16": (lambda x, n: hf_call(hbf, x, n), "bf16", 2),
    }
    if args.argmax_ab:  # the same steps without the int8 pick, in the same interleaved run
        engines[f"glassgpt float32{NO_PICK}"] = (lambda x, n: ours_call(o32, x, n, **OFF),
                                                 "float32", 4)  # fmt: skip
        engines[f"glassgpt bf16{NO_PICK}"] = (lambda x, n: ours_call(obf, x, n, **OFF), "bf16", 2)
    PICKS.update({"glassgpt float32": o32, "glassgpt bf16": obf})
    if args.skip_bf16 or args.dtype == "int4":
        del engines["glassgpt bf16"], engines["transformers bf16"]
        engines.pop(f"glassgpt bf16{NO_PICK}", None)
    # the same generate without its CUDA graph or its replayed steps, in the same interleaved run
    engines["glassgpt float32 eager"] = (lambda x, n: eager_call(o32, x, n), "float32", 4)
    if dev != "cpu":
        if not args.skip_bf16:
            engines["glassgpt bf16 eager"] = (lambda x, n: eager_call(obf, x, n), "bf16", 2)
    else:
        o8 = cast(base, "int8")
        engines["glassgpt int8"] = (lambda x, n: ours_call(o8, x, n), "int8", 1)
    times: dict[str, TokenTimes] = {
        "glassgpt float32": lambda x, n: ours_times(o32, x, n),
        API: lambda x, n: ours_times(api, x, n),
        "transformers float32": lambda x, n: hf_times(h32, x, n),
        "glassgpt bf16": lambda x, n: ours_times(obf, x, n),
        "transformers bf16": lambda x, n: hf_times(hbf, x, n),
        "glassgpt float32 eager": lambda x, n: ours_times(o32, x, n, **EAGER),
    }
    if "glassgpt int8" in engines:
        times["glassgpt int8"] = lambda x, n: ours_times(o8, x, n)
    times[f"glassgpt float32{NO_PICK}"] = lambda x, n: ours_times(o32, x, n, **OFF)
    times[f"glassgpt bf16{NO_PICK}"] = lambda x, n: ours_times(obf, x, n, **OFF)
    if args.dtype == "int4":  # the Q4 comparison only: transformers' minutes a run left out
        for name in (API, "transformers float32", "glassgpt float32 eager"):
            del engines[name]
        o4 = cast(base, "int4")
        engines["glassgpt int4"] = (lambda x, n: ours_call(o4, x, n), "int4", 4.5 / 8)
        engines.update(llama_q4(base, args.threads))
        return engines, sum(p.numel() for p in base.parameters()), {}
    if dev == "cpu" and args.ct2:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="glassgpt-ct2-"))
        for q, nbytes in (("float32", 4), ("int8", 1)):
            ct = CT2(base, q, args.threads, work)
            engines[f"ctranslate2 {q}"] = (ct, q, nbytes)
            times[f"ctranslate2 {q}"] = ct.times
    return engines, sum(p.numel() for p in base.parameters()), {k: times[k] for k in engines}


def llama_q4(base: torch.nn.Module, threads: int) -> dict[str, tuple]:
    """llama.cpp Q4_K_M and Q4_0 engines of ``base`` (batch 1: the first row of the prompts);
    none, with a line saying why, without ``llama_cpp`` or GPT-2's tokenizer files."""
    import tempfile

    from glassgpt.interop.gguf_export import export_gguf
    from glassgpt.tokenizer import Tokenizer

    files = Path(os.environ.get("GLASSGPT_SHARED_DATA", REPO.parent / "shared/data")) / "gpt2"
    try:
        import llama_cpp
    except ImportError as e:
        print(f"llama.cpp skipped: llama_cpp does not import ({e})")
        return {}
    if not (files / "encoder.json").is_file():
        print(f"llama.cpp skipped: GPT-2's tokenizer files are not in {files}")
        return {}
    work = Path(tempfile.mkdtemp(prefix="glassgpt-q4-"))
    tok = Tokenizer.from_gpt2(files / "encoder.json", files / "vocab.bpe")
    f32 = export_gguf(base, tok, work / "f32.gguf", dtype="f32")
    engines: dict[str, tuple] = {}
    for label, bits in (("Q4_K_M", 4.85), ("Q4_0", 4.5)):
        params = llama_cpp.llama_model_quantize_default_params()
        params.nthread, params.ftype = threads, getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{label}")
        out = work / f"{label}.gguf"
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params) != 0:
            print(f"llama.cpp {label} skipped: llama_model_quantize failed")
            continue
        llm = llama_cpp.Llama(model_path=str(out), n_ctx=512, n_threads=threads,
                              n_threads_batch=threads, n_batch=64, verbose=False)  # fmt: skip
        LLAMAS.append(llm)

        def call(prompts: torch.Tensor, n: int, llm: Any = llm) -> list[list[int]]:
            ids: list[int] = []
            llm.reset()  # else generate keeps the cached prompt: no prompt evaluated
            for t in llm.generate(prompts[0].tolist(), temp=0.0, top_k=1, reset=True):
                ids.append(t)
                if len(ids) == n:
                    break
            return [ids]

        engines[f"llama.cpp {label}"] = (call, label, bits / 8)
    return engines


LLAMAS: list[Any] = []  # closed before exit (their finalizers fail at interpreter shutdown)


def measure(  # type: ignore[no-untyped-def]
    engines: dict[str, tuple], prompts: torch.Tensor, n: int, repeats: int,
    bandwidth: Bandwidth | None = None,
):  # fmt: skip
    """Per engine: median seconds for 1 and for n new tokens, and the ids of the n-token call,
    the engines interleaved in every repeat so that they share the machine's noise; the
    memory bandwidth probed before each repeat where ``bandwidth`` is given."""
    for call, _, _ in engines.values():
        call(prompts, 4)  # warm up
    rec: dict[str, dict[str, list[float]]] = {k: {"1": [], "n": []} for k in engines}
    ids: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        if bandwidth is not None:
            bandwidth.probe()
        for name, (call, _, _) in engines.items():
            time.sleep(SETTLE)
            rec[name]["1"].append(timed(call, prompts, 1)[0])
            time.sleep(SETTLE)
            t, ids[name] = timed(call, prompts, n)
            rec[name]["n"].append(t)
    med = {k: (statistics.median(v["1"]), statistics.median(v["n"])) for k, v in rec.items()}
    return med, ids, rec


def step_ms(rec: dict[str, list[float]], n: int) -> float:
    """ms per decoding step: the median over repeats of (t_n − t_1)/(n − 1), each repeat's two
    calls paired (they ran back to back), so that a slow minute falls on both."""
    return statistics.median((tn - t1) / (n - 1) for t1, tn in zip(rec["1"], rec["n"])) * 1e3


NO_PICK = ", int8 pick off"  # the A/B rows' suffix (--argmax-ab)
PICKS: dict[str, torch.nn.Module] = {}  # the greedy engines whose candidates are reported


def speed_table(args: argparse.Namespace) -> None:
    dev = args.device
    engines, n_params, times = make_engines(args)
    probe = Bandwidth(dev)
    bw = probe.probe()
    where = torch.cuda.get_device_name() if dev != "cpu" else f"{args.threads} threads"
    print(f"{where}: memory bandwidth (sum of 512 MiB) at the start: {bw:.1f} GB/s; parameters "
          f"{n_params / 1e6:.1f} M")  # fmt: skip
    N = args.new_tokens
    g = torch.Generator().manual_seed(1)
    header = ("| batch | engine | tok/s | ms/step | GB/s | share of limit | "
              "vs ctranslate2 same dtype | vs transformers float32 | same ids |")  # fmt: skip
    tables = []
    for batch in (1,) if args.dtype == "int4" else (1, args.batch):
        prompts = torch.randint(0, 50257, (batch, args.prompt), generator=g).to(dev)
        med, ids, rec = measure(engines, prompts, N, args.repeats, probe)
        tables.append((batch, med, ids, rec))
    bw = probe.median()  # the limit in the same minutes as the steps it bounds
    print(f"memory bandwidth probed before each repeat: median {bw:.1f} GB/s (range "
          f"{min(probe.seen):.1f}-{max(probe.seen):.1f}); float32 limit "
          f"{bw * 1e9 / (4 * n_params):.0f} steps/s; ms/step: the median of each repeat's paired "
          f"(t_{N} - t_1)/{N - 1}\n")  # fmt: skip
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for batch, med, ids, rec in tables:
        rate = {k: batch * N / t_n for k, (_, t_n) in med.items()}
        for name, (_, dtype, nbytes) in engines.items():
            step = step_ms(rec[name], N) / 1e3
            gbs = n_params * nbytes / step / 1e9
            ct = f"ctranslate2 {dtype}"
            vs_ct = f"{rate[name] / rate[ct]:.2f}×" if ct in rate else "–"
            ref = "transformers float32" if "transformers float32" in rate else "glassgpt float32"
            agree = prefix_agreement(ids[name], ids[ref])
            vs_hf = f"{rate[name] / rate[ref]:.2f}×" if ref == "transformers float32" else "–"
            print(f"| {batch} | {name} | {rate[name]:.1f} | {step * 1e3:.1f} | {gbs:.1f} | "
                  f"{gbs / bw:.0%} | {vs_ct} | {vs_hf} | {agree:.0%} |")  # fmt: skip
            sys.stdout.flush()
    if args.dtype == "int4":
        _, med, _, _ = tables[0]
        rate = {k: N / t_n for k, (_, t_n) in med.items()}
        for other in ("llama.cpp Q4_K_M", "llama.cpp Q4_0", "glassgpt int8", "glassgpt float32"):
            if other in rate:
                print(f"glassgpt int4 vs {other}: {rate['glassgpt int4'] / rate[other]:.2f}× tok/s")
        print("target: int4 ≥ 1.2× llama.cpp Q4_K_M (perplexities: bench/quality.py)")
        from glassgpt.kernels import int4

        ext = int4.compiled()
        print(f"int4 kernel: {ext.kernel() if ext else 'none (float32 fallback)'}; same ids: "
              "against glassgpt float32")  # fmt: skip
    if dev == "cpu":
        from glassgpt.sample.replay import ReplayedStep

        for batch, _, _, _ in tables:
            prompts = torch.randint(0, 50257, (batch, args.prompt), generator=g)
            for name, model in PICKS.items():
                if name in engines:
                    print(candidates_line(f"{name}, batch {batch}", model, prompts, N))

        why = ReplayedStep.why_not  # the last recording's reason, if it failed
        print("glassgpt's one-token steps: " + ("replayed from their recorded kernel calls"
              if why is None else f"eager ({why})"))  # fmt: skip
    print(
        "targets: float32 ≥ 1.0× ctranslate2 float32 and ≥ 80% of the float32 limit; "
        "int8 ≥ 1.0× ctranslate2 int8; same ids 100% in float32 (batch 1)"
    )
    if args.contexts and args.dtype != "int4":
        context_table(times, args)
    for llm in LLAMAS:
        llm.close()


def context_table(times: dict[str, TokenTimes], args: argparse.Namespace) -> None:
    """ms per decoding step (batch 1) over the last n = min(64, context/2) positions of each
    context (64, 256 and 1,024): prompts of context − n tokens, then n new tokens, a step
    timed between the first and the last new token's arrival, (t_n − t_1)/(n − 1), so that
    the prompt's forward (and its noise, about a second at 960 tokens) stays out; the
    engines interleaved in every repeat, the median over repeats."""
    contexts = [int(c) for c in args.contexts.split(",")]
    print("\nms/step at context (batch 1, n = min(64, context/2) new tokens after a prompt of "
          "context − n; the median over repeats of (t_n − t_1)/(n − 1), t_i the arrival of "
          "the i-th new token):")  # fmt: skip
    print("| engine | " + " | ".join(str(c) for c in contexts) + " |")
    print("|---|" + "---|" * len(contexts))
    g = torch.Generator().manual_seed(2)
    rows: dict[str, list[str]] = {k: [] for k in times}
    for c in contexts:
        n = min(64, c // 2)
        prompt = torch.randint(0, 50257, (1, c - n), generator=g).to(args.device)
        for fn in times.values():
            fn(prompt, 4)  # warm up
        steps: dict[str, list[float]] = {k: [] for k in times}
        for _ in range(args.repeats):
            for name, fn in times.items():
                t = fn(prompt, n)
                assert len(t) == n, f"{name}: {len(t)} tokens, not {n}"
                steps[name].append((t[-1] - t[0]) / (n - 1))
        for name, v in steps.items():
            rows[name].append(f"{statistics.median(v) * 1e3:.1f}")
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


def quality(args: argparse.Namespace) -> None:
    path = Path(args.shakespeare)
    if not path.is_file():
        print(f"quality check skipped: {path} not found")
        return
    text = path.read_text(encoding="utf-8")
    if args.checkpoint:
        import glassgpt

        model, tok = glassgpt.load(args.checkpoint)
        source = f"checkpoint {args.checkpoint}"
    else:
        model, tok = train_char_model(text, args.train_steps)
        source = f"char model trained here for {args.train_steps} steps"
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    val = ids[int(0.9 * len(ids)) :][: args.val_tokens]
    dtypes = low_precisions(args)
    p32 = perplexity(model, val)
    print(f"quality ({source}, {val.numel()} held-out tokens of tinyshakespeare):")
    print(f"  perplexity float32 {p32:.4f}")
    for dtype in dtypes:
        p = perplexity(cast(model, dtype), val)
        print(f"  perplexity {dtype} {p:.4f}: change {100 * (p - p32) / p32:+.3f}%")
    gpt2_shape_quality(args, dtypes)


def low_precisions(args: argparse.Namespace) -> list[str]:
    """The precisions compared with float32: bf16 (unless --skip-bf16), int8 on a CPU."""
    dtypes = [] if args.skip_bf16 else ["bf16"]
    return dtypes + (
        ["int8"] + (["int4"] if args.dtype == "int4" else []) if args.device == "cpu" else []
    )


def gpt2_shape_quality(args: argparse.Namespace, dtypes: list[str]) -> None:
    """GPT-2-shape model, random weights: perplexity is meaningless there, so the logits'
    relative error against float32 (64 random tokens) and greedy agreement (32 new tokens)."""
    from glassgpt.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("gpt2")).eval().to(args.device)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 50257, (1, 64), generator=g).to(args.device)
    prompt = tokens[:, :16]
    with torch.inference_mode():
        z32 = model(tokens).double()
    ids32 = generate(model, prompt, max_new_tokens=32, temperature=0)
    print("quality (GPT-2 shape, random weights: logits and greedy ids, not perplexity):")
    for dtype in dtypes:
        low = cast(model, dtype)
        with torch.inference_mode():
            z = low(tokens).double()
        rel = float((z - z32).norm() / z32.norm())
        same = prefix_agreement(generate(low, prompt, max_new_tokens=32, temperature=0), ids32)
        print(f"  {dtype}: logits relative error {rel:.2e}, greedy ids same as float32 {same:.0%}")


def train_char_model(text: str, steps: int) -> tuple[torch.nn.Module, object]:
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.tokenizer import CharTokenizer

    tok = CharTokenizer.train([text])
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    train = ids[: int(0.9 * len(ids))]
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=128, d_model=128, n_layers=4, n_heads=4))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        s = torch.randint(0, len(train) - 129, (16,), generator=g)
        x = torch.stack([train[i : i + 128] for i in s])
        y = torch.stack([train[i + 1 : i + 129] for i in s])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval(), tok


# the flags that decide glassgpt's CPU kernels (``glassgpt.kernels.policy.cpu_paths``)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                "amx_tile", "amx_bf16", "amx_int8", "avx_vnni")  # fmt: skip


def cpu_line() -> str:
    """The CPU's model name and the flags among :data:`KERNEL_FLAGS` it has (Linux's
    /proc/cpuinfo), and the paths glassgpt's kernels take there."""
    from glassgpt.kernels import cpu_paths

    name, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    have = [f for f in KERNEL_FLAGS if f in flags]
    paths = ", ".join(f"{k} {v}" for k, v in cpu_paths().items())
    return f"CPU: {name}; flags: {' '.join(have) or 'none of ' + ' '.join(KERNEL_FLAGS)}; " \
        f"glassgpt's paths: {paths}"  # fmt: skip


def dtype_table(args: argparse.Namespace) -> None:
    """glassgpt alone at float32, bf16 and int8 on each preset of ``--dtypes`` (batch 1,
    random weights): median ms per decoding step over the repeats, each repeat's step
    (t_N − t_1)/(N − 1) from the new tokens' arrivals, the dtypes interleaved in each
    repeat; and each precision's speed over float32 (target: bf16 ≥ 1.6× where the CPU
    has bf16 arithmetic, none below 1.0×)."""
    from glassgpt.model import GPT, GPTConfig

    print("| model | parameters | dtype | ms/step | × float32 |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(4)
    for preset in args.dtypes.split(","):
        torch.manual_seed(0)
        base = GPT(GPTConfig.preset(preset)).eval()
        models = {d: cast(base, d) for d in ("float32", "bf16", "int8")}
        prompt = torch.randint(0, base.config.n_vocab, (1, args.prompt), generator=g)
        n = min(args.new_tokens, base.config.n_ctx - args.prompt)
        steps: dict[str, list[float]] = {d: [] for d in models}
        for m in models.values():
            ours_times(m, prompt, 4)  # warm up (and the decoding copies made)
        for _ in range(args.repeats):
            for d, m in models.items():
                t = ours_times(m, prompt, n)
                steps[d].append((t[-1] - t[0]) / (n - 1) * 1e3)
        n_params = sum(p.numel() for p in base.parameters())
        ms32 = statistics.median(steps["float32"])
        for d, v in steps.items():
            ms = statistics.median(v)
            print(f"| {preset} | {n_params / 1e6:.1f}M | {d} | {ms:.2f} | {ms32 / ms:.2f}× |")
            sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="the second batch size")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--no-ct2", dest="ct2", action="store_false", help="leave CTranslate2 out")
    p.add_argument("--contexts", default="64,256,1024", help="'' to skip the context table")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-bf16", action="store_true", help="leave bf16 rows and quality out")
    p.add_argument("--argmax-ab", action="store_true",
                   help="glassgpt float32 and bf16 again with the greedy int8 pick off")  # fmt: skip
    p.add_argument("--dtype", choices=["int4"], default=None,
                   help="int4: glassgpt int4 beside llama.cpp Q4_K_M and Q4_0 (batch 1)")  # fmt: skip
    p.add_argument("--checkpoint", default=None, help="a trained model for the quality check")
    p.add_argument("--train-steps", type=int, default=600)
    p.add_argument("--val-tokens", type=int, default=50_000)
    p.add_argument("--shakespeare", default=str(REPO.parent / "shared/data/tinyshakespeare.txt"))
    p.add_argument("--dtypes", default=None, metavar="PRESETS",
                   help="only glassgpt at float32, bf16 and int8 on these presets (comma-"
                        "separated, e.g. gpt2,shakespeare-char: GPT-2 small and the default "
                        "model), then exit")  # fmt: skip
    p.set_defaults(ct2=importlib.util.find_spec("ctranslate2") is not None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} threads, load average {load}")
    if args.device == "cpu":
        print(cpu_line())
    if args.dtypes:
        dtype_table(args)
        return
    if not args.skip_speed:
        speed_table(args)
    if not args.skip_quality:
        quality(args)


if __name__ == "__main__":
    main()
