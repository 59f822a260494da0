"""Greedy steps' int8 pick (``glassgpt.kernels.greedy``): candidates a step, and ms a step on
and off, on random weights at real shapes and on a model trained here.

    PYTHONPATH=src python bench/greedy.py [--threads 2] [--new-tokens 64] [--train-steps 300]

A replayed greedy step reads the unembedding's int8 copy, keeps the vocabulary rows whose
upper bound reaches the best lower bound (the candidates) and recomputes their panels of 64
rows exactly; past a quarter of the panels it computes the full product instead (and after
four such steps in a row takes 64 plain steps, the "plain steps" column). How many
candidates a step leaves decides what it saves, and depends on the logits: printed per model
are the candidates a step (mean, max), the steps that took the full product, and ms a step
((t_N − t_1)/(N − 1), medians of --repeats, int8 pick on and off interleaved).

Models: SmolLM2-135M's and GPT-2 small's shapes with random weights (``bench/families.py``'s
and ``bench/generate.py``'s), and a model trained here for --train-steps on tinyshakespeare
with GPT-2's tokenizer (vocabulary 50,257, d 128, 4 layers, tied: logits shaped by
training, as a released model's are), or --checkpoint DIR.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import SHAPES, random_model
from generate import REPO
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample.generation import stream
from glassgpt.tokenizer import Tokenizer

GPT2_SMALL = {"n_vocab": 50257, "n_ctx": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12}


def counts(model: GPT, prompt: list[int], n: int) -> tuple[float, int, int, int, int]:
    """(candidates a step, the most in one step, steps on the full product, steps on the
    int8 pass, plain steps resting from it) of one greedy stream."""
    steps: list[int] = []
    s = stream(model, [prompt], max_new_tokens=n, temperature=0)
    before = 0
    for _ in s:
        g = s.decoder.greedy_steps  # type: ignore[attr-defined]
        if g is not None and g.steps > len(steps):
            steps.append(g.candidates - before)
            before = g.candidates
    g = s.decoder.greedy_steps  # type: ignore[attr-defined]
    if g is None or not steps:
        return 0.0, 0, 0, 0, 0
    return statistics.mean(steps), max(steps), g.full, g.steps, g.plain


def step_ms(model: GPT, prompt: list[int], n: int, on: bool) -> float:
    """(t_N − t_1)/(N − 1) of a greedy stream, the first token's arrival to the last's."""
    arrivals = []
    for _ in stream(model, [prompt], max_new_tokens=n, temperature=0, int8_argmax=on):
        arrivals.append(time.perf_counter())
    return (arrivals[-1] - arrivals[1]) / (n - 2) * 1e3


def report(name: str, model: GPT, prompt: list[int], args: argparse.Namespace) -> None:
    mean, most, full, steps, plain = counts(model, prompt, args.new_tokens)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for on in (True, False):
            times[on].append(step_ms(model, prompt, args.new_tokens, on))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"| {name} | {mean:.1f} | {most} | {full}/{steps} | {plain} | {on:.2f} | {off:.2f} | "
          f"{off / on:.2f}× |")  # fmt: skip
    sys.stdout.flush()


def trained(args: argparse.Namespace) -> tuple[GPT, Tokenizer]:
    """A small model over GPT-2's vocabulary, trained --train-steps on tinyshakespeare."""
    tok = Tokenizer.from_gpt2(args.gpt2 / "encoder.json", args.gpt2 / "vocab.bpe")
    text = Path(args.shakespeare).read_text()
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=50257, n_ctx=128, d_model=128, n_layers=4, n_heads=4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    t = time.perf_counter()
    for _ in range(args.train_steps):
        s = torch.randint(0, len(ids) - 65, (16,), generator=g)
        x = torch.stack([ids[i : i + 64] for i in s])
        y = torch.stack([ids[i + 1 : i + 65] for i in s])
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"trained {args.train_steps} steps in {time.perf_counter() - t:.0f} s: last loss "
          f"{loss.item():.2f}")  # fmt: skip
    return model.eval(), tok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--shapes", default="smollm2-135m,gpt2", help="random-weight shapes")
    p.add_argument("--gpt2", type=Path, default=REPO.parent / "shared/data/gpt2")
    p.add_argument("--shakespeare", default=str(REPO.parent / "shared/data/tinyshakespeare.txt"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {args.threads} threads, load average {load}; "
          f"{args.new_tokens} new tokens, medians of {args.repeats}\n")  # fmt: skip
    print("| model | candidates a step | most | steps on the full product | plain steps "
          "| ms/step int8 pick | ms/step off | speed-up |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    prompt = list(range(1, 17))
    for name in filter(None, args.shapes.split(",")):
        config: dict[str, Any] = GPT2_SMALL if name == "gpt2" else SHAPES[name][0]
        base = random_model(config)
        for dtype in ("float32", "bf16"):
            report(f"{name} random, {dtype}", cast(base, dtype), prompt, args)
        del base
    if args.train_steps > 0 and (args.gpt2 / "encoder.json").is_file():
        model, tok = trained(args)
        text = tok.encode("ROMEO:\nWhat light through yonder window breaks? It is the east,")
        for dtype in ("float32", "bf16"):
            report(f"trained (V 50,257, d 128), {dtype}", cast(model, dtype), text, args)


if __name__ == "__main__":
    main()
