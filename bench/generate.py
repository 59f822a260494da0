"""Decoding speed: glassgpt's generate beside transformers' generate (use_cache=True), same run.

    PYTHONPATH=src python bench/generate.py [--repeats 3] [--new-tokens 128] [--threads N]
    PYTHONPATH=src python bench/generate.py --device cuda --skip-quality    # on a GPU

GPT-2 small shape (124M parameters) with random weights, a 16-token prompt, greedy decoding
(both stop only at max_new_tokens). For each precision and batch size it prints tokens/s
(new tokens over the whole call, prefill included), the decode time per step (from a second
call with one new token: (t_N − t_1)/(N − 1)), the weight bytes read per step over that
time (GB/s) beside the machine's memory bandwidth measured here (sum of a 512 MiB tensor),
and "same ids": the share of greedy tokens equal to transformers' before the first
difference (100% in float32; bf16 kernels round differently, so greedy paths may part).
Medians over repeats, glassgpt and transformers interleaved to share the machine's noise.

Then a quality check: perplexity on held-out tinyshakespeare of a small character model
(trained here for --train-steps, or --checkpoint DIR) in float32 and in bf16.
Nothing is asserted; targets (float32 ≥ 1.2×, bf16 ≥ 2× transformers' float32) are printed.
On a GPU (``--device cuda``) the same table compares both libraries on the GPU (transformers
with SDPA attention), and GB/s is beside the GPU's device-to-device copy rate; timings
include every host-device synchronisation each library makes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from glassgpt.interop import from_hf  # noqa: E402
from glassgpt.sample import generate  # noqa: E402
from glassgpt.sample.precision import cast, perplexity  # noqa: E402


def bandwidth(threads: int, device: str = "cpu") -> float:
    """GB/s reading a 512 MiB float32 tensor (median of 5 sums)."""
    x = torch.rand(128 * 1024 * 1024, device=device)
    if device != "cpu":
        torch.cuda.synchronize()
    times = []
    for _ in range(6):
        t = time.perf_counter()
        x.sum().item()
        times.append(time.perf_counter() - t)
    return x.numel() * 4 / statistics.median(times[1:]) / 1e9


def ours_call(model: torch.nn.Module, prompts: torch.Tensor, n: int) -> list[list[int]]:
    return generate(model, prompts, max_new_tokens=n, temperature=0)  # a CUDA graph on GPUs


def eager_call(model: torch.nn.Module, prompts: torch.Tensor, n: int) -> list[list[int]]:
    return generate(model, prompts, max_new_tokens=n, temperature=0, cuda_graph=False)


def hf_call(model: torch.nn.Module, prompts: torch.Tensor, n: int) -> list[list[int]]:
    with torch.inference_mode():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=n,
                             min_new_tokens=n, do_sample=False, use_cache=True)  # fmt: skip
    return out[:, prompts.shape[1] :].tolist()


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of generated tokens before the first difference, over the rows (greedy decoding
    diverges for good once one argmax flips: expected in bf16, where kernels round differently)."""
    same = 0
    for x, y in zip(a, b):
        k = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
        same += k
    return same / sum(len(x) for x in a)


def timed(fn, *args) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def speed_table(args: argparse.Namespace) -> None:
    import transformers

    dev = args.device
    torch.manual_seed(0)
    hf_kw = {"attn_implementation": "sdpa"} if dev != "cpu" else {}
    hf32 = transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(), **hf_kw).eval()
    hf32.generation_config.eos_token_id = None
    hf32.generation_config.pad_token_id = 0
    hfbf = transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(), **hf_kw).eval()
    hfbf.load_state_dict(hf32.state_dict())
    hfbf = hfbf.to(torch.bfloat16)
    hfbf.generation_config.eos_token_id = None
    hfbf.generation_config.pad_token_id = 0
    base = from_hf(hf32).to(dev)
    ours = {"float32": cast(base, torch.float32), "bf16": cast(base, torch.bfloat16)}
    hf = {"float32": hf32.to(dev), "bf16": hfbf.to(dev)}
    n_params = sum(p.numel() for p in base.parameters())
    bw = bandwidth(args.threads, dev)
    where = torch.cuda.get_device_name() if dev != "cpu" else f"{args.threads} threads"
    print(f"{where}: memory bandwidth (sum of 512 MiB): {bw:.1f} GB/s; parameters "
          f"{n_params / 1e6:.1f} M; transformers attention {hf32.config._attn_implementation}")  # fmt: skip
    N = args.new_tokens
    g = torch.Generator().manual_seed(1)
    hf32_rate: dict[int, float] = {}
    gpu = dev != "cpu"
    header = ("| batch | dtype    | glassgpt tok/s | ms/step | GB/s | transformers tok/s | "
              "ms/step | ratio | vs HF fp32 | same ids |")  # fmt: skip
    if gpu:  # the same generate without its CUDA graph, in the same interleaved run
        header += " eager tok/s | eager ms/step | graph / eager |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for batch in (1, args.batch):
        prompts = torch.randint(0, 50257, (batch, args.prompt), generator=g).to(dev)
        for dtype in ("float32", "bf16"):
            o, h = ours[dtype], hf[dtype]
            ours_call(o, prompts, 4), hf_call(h, prompts, 4)  # warm up
            if gpu:
                eager_call(o, prompts, 4)
            rec: dict[str, list[float]] = {k: [] for k in ("o1", "oN", "h1", "hN", "e1", "eN")}
            agree = []
            for _ in range(args.repeats):
                rec["o1"].append(timed(ours_call, o, prompts, 1)[0])
                rec["h1"].append(timed(hf_call, h, prompts, 1)[0])
                t, out_o = timed(ours_call, o, prompts, N)
                rec["oN"].append(t)
                t, out_h = timed(hf_call, h, prompts, N)
                rec["hN"].append(t)
                agree.append(prefix_agreement(out_o, out_h))
                if gpu:
                    rec["e1"].append(timed(eager_call, o, prompts, 1)[0])
                    t, out_e = timed(eager_call, o, prompts, N)
                    rec["eN"].append(t)
                    assert out_e == out_o, "decoding from the CUDA graph changed the ids"
            m = {k: statistics.median(v) for k, v in rec.items() if v}
            rate_o, rate_h = batch * N / m["oN"], batch * N / m["hN"]
            step_o = (m["oN"] - m["o1"]) / (N - 1)
            step_h = (m["hN"] - m["h1"]) / (N - 1)
            nbytes = n_params * (4 if dtype == "float32" else 2)
            if dtype == "float32":
                hf32_rate[batch] = rate_h
            row = (f"| {batch:5d} | {dtype:8s} | {rate_o:14.1f} | {step_o * 1e3:7.1f} | "
                   f"{nbytes / step_o / 1e9:4.1f} | {rate_h:18.1f} | {step_h * 1e3:7.1f} | "
                   f"{rate_o / rate_h:4.2f}× | {rate_o / hf32_rate[batch]:9.2f}× | "
                   f"{min(agree):7.0%} |")  # fmt: skip
            if gpu:
                rate_e = batch * N / m["eN"]
                step_e = (m["eN"] - m["e1"]) / (N - 1)
                row += f" {rate_e:11.1f} | {step_e * 1e3:13.2f} | {rate_o / rate_e:13.2f}× |"
            print(row)
            sys.stdout.flush()
    print("targets: float32 ≥ 1.2× transformers; bf16 ≥ 2× transformers' float32 (batch 1)")


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
    p32 = perplexity(model, val)
    p16 = perplexity(cast(model, "bf16"), val)
    print(f"quality ({source}, {val.numel()} held-out tokens of tinyshakespeare):")
    print(f"  perplexity float32 {p32:.4f}, bf16 {p16:.4f}: change {100 * (p16 - p32) / p32:+.3f}%")


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="the second batch size")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--checkpoint", default=None, help="a trained model for the quality check")
    p.add_argument("--train-steps", type=int, default=600)
    p.add_argument("--val-tokens", type=int, default=50_000)
    p.add_argument("--shakespeare", default=str(REPO.parent / "shared/data/tinyshakespeare.txt"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} threads, load average {load}")
    if not args.skip_speed:
        speed_table(args)
    if not args.skip_quality:
        quality(args)


if __name__ == "__main__":
    main()
