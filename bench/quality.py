"""Quality beside speed: held-out perplexity at every precision, glassgpt's and llama.cpp's.

    PYTHONPATH=src python bench/quality.py [--train-steps 300] [--val-tokens 20000]
    PYTHONPATH=src python bench/quality.py --checkpoint runs/default   # a trained BPE run

One table per model: perplexity on held-out tinyshakespeare (the last 10% of the file, never
trained on) of

- glassgpt at float32, bf16, int8 and int4 (``cast(model, dtype)``; int4 with the int8
  unembedding, its default, and with an int4 one: which the docs recommend is measured here);
  int4 also as decoding computes it, one id a step on the int4 kernels (x rounded to int8
  per group of 32, as llama.cpp's Q4 products round theirs to Q8; and the float kernels);
- llama.cpp (``llama_cpp``, llama-cpp-python) on the same model exported by glassgpt's
  ``export_gguf`` as F32, then quantized by llama.cpp's own ``llama_model_quantize`` to Q8_0,
  Q4_0 and Q4_K_M; perplexity from its logits (``logits_all``) over the same windows.

llama.cpp's F32 row checks the comparison itself: it must equal glassgpt's float32 (to a few
1e-4), or the two are not scoring the same model on the same tokens. Q4_K's blocks are 256
wide: the default model has d_model 256 and d_mlp 1,024 so that no tensor falls back to
another type (a width that is no multiple of 256 does, and llama.cpp says so).

The default model is a BPE model (a 1,024-id byte-level BPE learned here from the training
text; GGUF cannot carry a character tokenizer) trained here for --train-steps; --checkpoint
takes a glassgpt run with a byte-level BPE tokenizer instead (its held-out text is still the
end of tinyshakespeare unless --text names another file). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


from glassgpt.interop.gguf_export import export_gguf  # noqa: E402
from glassgpt.model import GPT, GPTConfig  # noqa: E402
from glassgpt.model.precision import cast, perplexity, quantize_int4  # noqa: E402
from glassgpt.sample.quality import decoded_perplexity  # noqa: E402
from glassgpt.tokenizer import Tokenizer  # noqa: E402

LLAMA_TYPES = (("Q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"), ("Q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"),
               ("Q4_K_M", "LLAMA_FTYPE_MOSTLY_Q4_K_M"))  # fmt: skip


def train_model(text: str, steps: int, seq: int) -> tuple[GPT, Tokenizer]:
    """A BPE tokenizer (1,024 ids) and a 4-layer d_model-256 model trained on ``text``."""
    tok = Tokenizer.train(text, 1024, special_tokens=["<|endoftext|>"])
    ids = torch.tensor(tok.encode(text), dtype=torch.long)
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=seq, d_model=256, n_layers=4, n_heads=4,
                    d_mlp=1024)  # fmt: skip
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps)
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(ids) - seq - 1, (16,), generator=g)
        x = torch.stack([ids[s : s + seq] for s in starts])
        y = torch.stack([ids[s + 1 : s + seq + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step}: loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)")
    return model.eval(), tok


def llama_perplexity(path: Path, tokens: torch.Tensor, L: int, threads: int) -> float:
    """exp(mean cross-entropy) from llama.cpp's logits over the windows ``perplexity`` uses:
    non-overlapping windows of L tokens, each scored from its own start."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=L, n_batch=L, n_ubatch=L,
                          logits_all=True, n_threads=threads, n_threads_batch=threads,
                          verbose=False)  # fmt: skip
    n = (tokens.numel() - 1) // L
    total = 0.0
    try:
        for i in range(n):
            x = tokens[i * L : (i + 1) * L].tolist()
            y = tokens[i * L + 1 : (i + 1) * L + 1].numpy()
            llm.reset()
            llm.eval(x)
            z = np.asarray(llm.scores[:L], dtype=np.float64)
            z = z - z.max(axis=1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            total += -logp[np.arange(L), y].sum()
    finally:
        llm.close()
    return math.exp(total / (n * L))


def quantize_gguf(src: Path, dst: Path, ftype: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(llama_cpp, ftype)
    code = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if code != 0 or not dst.exists():
        raise RuntimeError(f"llama_model_quantize {ftype} failed ({code})")


def int4_decoded(q4: GPT, val: torch.Tensor, L: int) -> list[tuple[str, float, str]]:
    """int4 perplexity as decoding computes it: every window one id a step (8 rows a
    product), so the decoding kernels compute every logit, by default with x rounded to int8
    per group of 32 (as llama.cpp's Q8 activations), and by the float kernels (x unrounded).
    (``perplexity``'s whole windows take the float32 product from W̃.)"""
    from glassgpt.kernels import int4

    ext = int4.compiled()
    if ext is None:
        return []
    rows = [("glassgpt int4, decoded", decoded_perplexity(q4, val, L), f"kernel {ext.kernel()}")]
    try:
        ext.use(next(k for k in ext.kernels() if k.startswith("float")))
        rows.append(("glassgpt int4, decoded, float x", decoded_perplexity(q4, val, L),
                     f"kernel {ext.kernel()}"))  # fmt: skip
    finally:
        ext.use(None)
    return rows


def table(name: str, model: GPT, tok: Any, val: torch.Tensor, L: int, threads: int) -> None:
    rows: list[tuple[str, float, str]] = []
    n_params = sum(p.numel() for p in model.parameters())
    print(f"\n## {name}: {n_params / 1e6:.2f} M parameters, {val.numel():,} held-out tokens, "
          f"windows of {L}")  # fmt: skip
    p32 = perplexity(model, val, L)
    rows.append(("glassgpt float32", p32, "4 bytes a weight"))
    for dtype, note in (("bf16", "2 bytes"), ("int8", "1 byte + a scale per channel"),
                        ("int4", "4.5 bits (groups of 32, float16 scales); unembedding int8")):  # fmt: skip
        t = time.perf_counter()
        low = cast(model, dtype)
        cast_s = time.perf_counter() - t
        rows.append((f"glassgpt {dtype}", perplexity(low, val, L), f"{note}; cast {cast_s:.1f} s"))
        if dtype == "int4":
            rows += int4_decoded(low, val, L)
    every = cast(model, torch.float32, pack=False)
    quantize_int4(every, unembed="int4")
    rows.append(
        ("glassgpt int4, int4 unembedding", perplexity(every, val, L), "4.5 bits everywhere")
    )
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        print(f"llama.cpp skipped: llama_cpp does not import ({e})")
    else:
        with tempfile.TemporaryDirectory(prefix="glassgpt-quality-") as work:
            f32 = export_gguf(model, tok, Path(work) / "f32.gguf", dtype="f32")
            rows.append(("llama.cpp F32", llama_perplexity(f32, val, L, threads), "the check"))
            for label, ftype in LLAMA_TYPES:
                out = Path(work) / f"{label}.gguf"
                quantize_gguf(f32, out, ftype, threads)
                size = out.stat().st_size / 1e6
                rows.append((f"llama.cpp {label}", llama_perplexity(out, val, L, threads),
                             f"file {size:.1f} MB"))  # fmt: skip
    print("\n| engine, precision | perplexity | vs float32 | notes |")
    print("|---|---|---|---|")
    for label, ppl, note in rows:
        print(f"| {label} | {ppl:.4f} | {(ppl / p32 - 1) * 100:+.2f}% | {note} |")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", default=str(REPO.parent / "shared/data/tinyshakespeare.txt"))
    p.add_argument("--checkpoint", action="append", default=[],
                   help="a glassgpt run with a byte-level BPE tokenizer (repeatable)")  # fmt: skip
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--val-tokens", type=int, default=20_000)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    text = Path(args.text).read_text(encoding="utf-8")
    cut = int(0.9 * len(text))
    train_text, held_out = text[:cut], text[cut:]
    print(f"held-out text: the last 10% of {args.text} ({len(held_out):,} characters)")
    models: list[tuple[str, GPT, Any]] = []
    for ckpt in args.checkpoint:
        from glassgpt.checkpoint import open_run

        run = open_run(ckpt)
        models.append((ckpt, run.model.eval(), run.needs_tokenizer()))
    if not args.checkpoint:
        print(f"training a BPE model for {args.train_steps} steps")
        model, tok = train_model(train_text, args.train_steps, args.seq_len)
        models.append((f"BPE model trained here ({args.train_steps} steps)", model, tok))
    for name, model, tok in models:
        val = torch.tensor(tok.encode(held_out)[: args.val_tokens + 1], dtype=torch.long)
        L = min(args.seq_len, model.config.n_ctx)
        table(name, model, tok, val, L, args.threads)


if __name__ == "__main__":
    main()
