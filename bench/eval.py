"""lm-evaluation-harness speed: glassgpt's adapter beside the harness's ``hf`` backend, same run.

    PYTHONPATH=src python bench/eval.py                         # 1,000 items, small shape, CPU
    PYTHONPATH=src python bench/eval.py --shape gpt2 --device cuda
    PYTHONPATH=src python bench/eval.py --items 100 --rolling-docs 20    # quick

A HellaSwag-shaped local task (a JSONL file and a task YAML written to a temporary folder):
``--items`` items, each a context of 30–60 words and four endings of 8–20 words, cut from
../shared/data/tinyshakespeare.txt (random words when it is absent), scored by acc and
acc_norm; with ``--rolling-docs N``, also a perplexity task of N documents of 100–600 words
(``loglikelihood_rolling``, several context windows each). The model has random weights
(speed does not depend on them) and GPT-2's tokenizer (../shared/data/gpt2; a BPE of 2,000
ids trained here otherwise); ``--shape small`` is 4 layers of d_model 256 and n_ctx 256,
``--shape gpt2`` GPT-2 small (124M, n_ctx 1,024).

glassgpt runs :class:`glassgpt.sample.lm_eval_adapter.GlassLM` on the model loaded from its
checkpoint folder; the peer is lm-eval's ``HFLM`` on the ``glassgpt export --format hf`` folder
of the same weights, float32 both, the same ``--batch-size``. Each row: the seconds of the
whole ``simple_evaluate`` (data loading and metrics included), the seconds inside the model's
requests alone, the process's CPU seconds (steadier than wall time on a shared machine),
items per second, and the metrics (which must agree: the same requests,
the same log-likelihoods to 1e-4). Then the speed-up (target: ≥ 2× the hf backend).
Nothing is asserted; one run per backend unless ``--repeats``, medians.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GLASSGPT_SHARED_DATA", REPO.parent / "shared" / "data"))
SHAPES = {
    "small": {"n_ctx": 256, "d_model": 256, "n_layers": 4, "n_heads": 4},
    "gpt2": {"n_ctx": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12},
}


def words_source(rng: random.Random) -> list[str]:
    path = SHARED / "tinyshakespeare.txt"
    if path.is_file():
        return path.read_text(encoding="utf-8").split()
    vocab = [
        "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(500)
    ]
    return [rng.choice(vocab) for _ in range(200_000)]


def tokenizer(words: list[str]) -> Any:
    from glassgpt.tokenizer import Tokenizer

    gpt2 = SHARED / "gpt2"
    if (gpt2 / "encoder.json").is_file():
        return Tokenizer.from_gpt2(gpt2 / "encoder.json", gpt2 / "vocab.bpe")
    return Tokenizer.train(" ".join(words[:200_000]), 2000, special_tokens=["<|endoftext|>"])


def write_run(root: Path, shape: str, tok: Any) -> tuple[Path, Path]:
    """A glassgpt checkpoint folder of random weights and its HF export."""
    from glassgpt.checkpoint import CheckpointManager
    from glassgpt.interop.export import export_hf
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.train.config import dump_toml

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, **SHAPES[shape])).eval()
    run = root / "run"
    run.mkdir()
    tok.save(run / "tok.json")
    files = {
        "config.toml": dump_toml({"seed": 0, "model": model.config.to_dict()}).encode(),
        "tokenizer.json": (run / "tok.json").read_bytes(),
    }
    tensors = {"model.safetensors": model.state_dict()}
    CheckpointManager(run / "ckpt").save(1, tensors=tensors, files=files, state={})
    export_hf(model, tok, root / "hf")
    return run, root / "hf"


def write_tasks(root: Path, items: int, docs: int, words: list[str]) -> list[str]:
    """The task YAMLs and their JSONL files; the task names."""
    rng = random.Random(0)

    def span(lo: int, hi: int) -> str:
        n = rng.randint(lo, hi)
        start = rng.randrange(len(words) - n)
        return " ".join(words[start : start + n])

    rows = {
        "bench_mc": [
            {
                "ctx": span(30, 60),
                "endings": [span(8, 20) for _ in range(4)],
                "label": rng.randrange(4),
            }
            for _ in range(items)
        ],
        "bench_ppl": [{"text": span(100, 600)} for _ in range(docs)],
    }
    bodies = {
        "bench_mc": "output_type: multiple_choice\ndoc_to_text: ctx\ndoc_to_choice: endings\n"
        "doc_to_target: label\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n",
        "bench_ppl": "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: text\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n",
    }
    names = ["bench_mc"] + (["bench_ppl"] if docs else [])
    for name in names:
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows[name]), encoding="utf-8")
        kwargs = {"data_files": {"test": str(data)}, "cache_dir": str(root / "datasets")}
        (root / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs: {json.dumps(kwargs)}\n"
            f"test_split: test\n{bodies[name]}",
            encoding="utf-8",
        )
    return names


def timed(lm: Any) -> list[float]:
    """Wrap the LM's request methods; the list collects the seconds spent inside them."""
    spent: list[float] = []
    for name in ("loglikelihood", "loglikelihood_rolling"):
        method = getattr(lm, name)

        def wrapper(requests: Any, *a: Any, _m: Any = method, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return _m(requests, *a, **kw)
            finally:
                spent.append(time.perf_counter() - t)

        setattr(lm, name, wrapper)
    return spent


def evaluate(lm: Any, tasks: list[str], root: Path) -> tuple[float, float, float, dict[str, Any]]:
    """(seconds of simple_evaluate, seconds inside the model's requests, this process's CPU
    seconds over the whole run, results)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(root), include_defaults=False)
    spent = timed(lm)
    t, cpu = time.perf_counter(), time.process_time()
    out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, bootstrap_iters=0,
                          log_samples=False, num_fewshot=0)  # fmt: skip
    total, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert out is not None
    return total, sum(spent), cpu, out["results"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1000, help="multiple-choice items")
    ap.add_argument("--rolling-docs", type=int, default=0, help="documents of a perplexity task")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="small")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import logging

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    from lm_eval.models.huggingface import HFLM

    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.sample.lm_eval_adapter import GlassLM

    rng = random.Random(0)
    words = words_source(rng)
    tok = tokenizer(words)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run, hf = write_run(root, args.shape, tok)
        tasks = write_tasks(root, args.items, args.rolling_docs, words)
        model, gtok = load(run, device=parse_device(args.device))
        ours_lm = GlassLM(model, gtok, batch_size=args.batch_size, progress=False)
        hf_lm = HFLM(pretrained=str(hf), batch_size=args.batch_size, device=args.device,
                     dtype="float32")  # fmt: skip
        rows: dict[str, list[tuple[float, ...]]] = {"glassgpt": [], "lm-eval hf": []}
        results: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeats):  # interleaved: both share the machine's noise
            for name, lm in (("lm-eval hf", hf_lm), ("glassgpt", ours_lm)):
                *times, results[name] = evaluate(lm, tasks, root)
                rows[name].append(tuple(times))
    n = args.items + args.rolling_docs
    print(f"\nlm-eval {args.items} multiple-choice items (4 endings)"
          + (f" + {args.rolling_docs} rolling documents" if args.rolling_docs else "")
          + f", shape {args.shape}, batch {args.batch_size}, {args.device}, "
          f"torch threads {torch.get_num_threads()}, medians of {args.repeats}")  # fmt: skip
    head = f"{'backend':12} {'seconds':>9} {'in model':>9} {'CPU s':>9} {'items/s':>9}  metrics"
    print(head)
    print("-" * len(head))
    med = {k: [statistics.median(column) for column in zip(*v, strict=True)]
           for k, v in rows.items()}  # fmt: skip
    for name, (total, inside, cpu) in med.items():
        metrics = " ".join(f"{task}:{m.split(',')[0]}={v:.4f}"
                           for task, r in results[name].items() for m, v in r.items()
                           if isinstance(v, float) and "stderr" not in m)  # fmt: skip
        print(f"{name:12} {total:9.2f} {inside:9.2f} {cpu:9.2f} {n / total:9.1f}  {metrics}")
    speed, inside, cpu = (h / g for h, g in zip(med["lm-eval hf"], med["glassgpt"], strict=True))
    print(f"\nglassgpt / hf speed: {speed:.2f}× whole run, {inside:.2f}× inside the model, "
          f"{cpu:.2f}× in CPU seconds (target ≥ 2×)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
