"""Load test of ``glassgpt serve``: N concurrent streaming clients for a bounded time.

    python bench/serve.py                              # default and GPT-2-small shapes, 1/4/8/16
    python bench/serve.py --seconds 3 --clients 1,2 --models default   # a quick check
    python bench/serve.py --rounds 3 --seconds 10 --clients 1,8        # levels interleaved

For each model shape (random weights, saved as a checkpoint; ``--checkpoint DIR`` serves a
trained one instead) a ``glassgpt serve`` process is started on a free localhost port. Each
client sends streaming ``/v1/completions`` requests back to back (a random prompt of
``--prompt-tokens`` tokens, ``--max-tokens`` new tokens, temperature 1) until the time is up.
Printed per level: requests, aggregate tokens/s and its ratio to one client (measured in the
same run), p50/p99 time to first token, p50/p99 time per token after the first, errors; and
the server's RSS after a warm-up request and after the load. With ``--rounds R`` the levels
run R times in turn (1, 8, 1, 8, …) and each level's figures pool its R runs, so that a
change in the machine's load during the run falls on every level alike; the load average
is printed before and after. Targets (issue 12): at 8
clients at least 3× the single-client tokens/s, no errors, RSS back within 10%. Nothing is
asserted: the figures go to docs/serving.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPT2_SMALL = {"n_ctx": 1024, "d_model": 768, "n_layers": 12, "n_heads": 12}


def default_shape() -> dict:
    from glassgpt.config import load_toml

    return load_toml(REPO / "src" / "glassgpt" / "presets" / "default.toml")["model"]


def write_model(folder: Path, kind: str) -> Path:
    """A random-weight checkpoint of the ``default`` preset's shape (char vocabulary) or of
    GPT-2 small (GPT-2's BPE from ../shared/data when present, else bytes)."""
    import torch

    from glassgpt.checkpoint import CheckpointManager
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.tokenizer import CharTokenizer, Tokenizer
    from glassgpt.train.config import dump_toml

    if kind == "default":
        tok = CharTokenizer(sorted(set(string.printable)), special_tokens=["<|endoftext|>"])
        shape = default_shape()
    else:
        shared = REPO.parent / "shared" / "data" / "gpt2"
        if (shared / "encoder.json").is_file():
            tok = Tokenizer.from_gpt2(shared / "encoder.json", shared / "vocab.bpe")
        else:
            tok = CharTokenizer([chr(i) for i in range(256)], special_tokens=["<|endoftext|>"])
        shape = GPT2_SMALL
    torch.manual_seed(0)
    config = GPTConfig.from_dict({**shape, "n_vocab": tok.n_vocab})
    model = GPT(config)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder / "tok.json")
    files = {"config.toml": dump_toml({"model": config.to_dict()}).encode(),
             "tokenizer.json": (folder / "tok.json").read_bytes()}  # fmt: skip
    CheckpointManager(folder / "ckpt", keep_last=1).save(
        1, tensors={"model.safetensors": model.state_dict()}, files=files, state={}
    )
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stream_once(port: int, body: dict) -> tuple[float | None, list[float], int]:
    """(time to first token, token arrival times, completion tokens) of one request; no
    first token when the model's first draw was its end-of-text token (finish_reason stop:
    with random weights that is about one request in n_vocab, and not an error)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    arrivals, tokens, finish = [], 0, None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"]:
            finish = chunk["choices"][0].get("finish_reason") or finish
            if chunk["choices"][0]["text"]:
                arrivals.append(time.perf_counter() - start)
    conn.close()
    if not arrivals:
        if finish == "stop":
            return None, [], tokens
        raise RuntimeError(f"no tokens (finish_reason {finish})")
    return arrivals[0], arrivals, tokens


def load_level(
    port: int, clients: int, seconds: float, args: argparse.Namespace, vocab: str
) -> dict:
    """One run of ``clients`` clients for ``seconds``: totals and the latency samples."""
    deadline = time.perf_counter() + seconds
    ttft, per_token, tokens, errors, requests = [], [], [0], [0], [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        rng = random.Random(c)
        while time.perf_counter() < deadline:
            prompt = "".join(rng.choice(vocab) for _ in range(args.prompt_tokens))
            body = {"model": "bench", "prompt": prompt, "max_tokens": args.max_tokens,
                    "temperature": 1.0, "seed": rng.randrange(10**6), "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            try:
                first, arrivals, n = stream_once(port, body)
            except Exception as e:
                with lock:
                    errors[0] += 1
                    if errors[0] <= 3:
                        print(f"  error ({clients} clients): {e}", file=sys.stderr)
                continue
            with lock:
                requests[0] += 1
                tokens[0] += n
                if first is not None:
                    ttft.append(first)
                if len(arrivals) > 1:
                    per_token.append((arrivals[-1] - arrivals[0]) / (len(arrivals) - 1))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": requests[0], "errors": errors[0],
            "tokens": tokens[0], "wall": wall, "ttft": ttft, "per_token": per_token}  # fmt: skip


def pooled(runs: list[dict]) -> dict:
    """The figures of one level over its runs: totals summed, percentiles of every sample."""

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else (xs or [0])[0]

    ttft = [x for r in runs for x in r["ttft"]]
    per_token = [x for r in runs for x in r["per_token"]]
    return {"clients": runs[0]["clients"], "requests": sum(r["requests"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
            "tok_s": sum(r["tokens"] for r in runs) / sum(r["wall"] for r in runs),
            "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99),
            "tok50": pct(per_token, 50), "tok99": pct(per_token, 99)}  # fmt: skip


def bench_model(name: str, folder: Path, args: argparse.Namespace) -> tuple[list[dict], tuple]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "glassgpt", "serve", "--checkpoint", str(folder), "--port",
           str(port), "--name", "bench"]  # fmt: skip
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        vocab = string.ascii_letters + " .,\n"
        load_level(port, 1, 0.5, args, vocab)  # warm-up
        before = rss_mib(server.pid)
        load = os.getloadavg()[0]
        runs = [load_level(port, c, args.seconds, args, vocab)
                for _ in range(args.rounds) for c in args.clients]  # fmt: skip
        load_after = os.getloadavg()[0]
        rows = [pooled([r for r in runs if r["clients"] == c]) for c in args.clients]
        time.sleep(2)
        after = rss_mib(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    one = next((r["tok_s"] for r in rows if r["clients"] == 1), rows[0]["tok_s"])
    for r in rows:
        r["model"], r["ratio"] = name, r["tok_s"] / one
    return rows, (before, after, load, load_after)


def report(results: list[tuple[list[dict], tuple]], args: argparse.Namespace) -> None:
    rounds = f" × {args.rounds} rounds, interleaved" if args.rounds > 1 else ""
    print(f"\n{args.seconds:g} s per level{rounds}; prompts of {args.prompt_tokens} tokens, "
          f"{args.max_tokens} new tokens, temperature 1, streaming\n")  # fmt: skip
    print("| model | clients | requests | tokens/s | × 1 client | TTFT p50 | TTFT p99 | "
          "per token p50 | per token p99 | errors |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows, _ in results:
        for r in rows:
            print(f"| {r['model']} | {r['clients']} | {r['requests']} | {r['tok_s']:.0f} | "
                  f"{r['ratio']:.2f} | {1e3 * r['ttft50']:.0f} ms | {1e3 * r['ttft99']:.0f} ms | "
                  f"{1e3 * r['tok50']:.1f} ms | {1e3 * r['tok99']:.1f} ms | {r['errors']} |")  # fmt: skip
    print()
    for rows, (before, after, load, load_after) in results:
        change = 100 * (after - before) / before
        print(f"{rows[0]['model']}: server RSS {before:.0f} MiB after warm-up, {after:.0f} MiB "
              f"after the load ({change:+.1f}%; target within ±10%); 1-minute load average "
              f"{load:.2f} before the load, {load_after:.2f} after")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", default="1,4,8,16", help="comma-separated levels")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each level")
    p.add_argument("--rounds", type=int, default=1, help="run the levels this many times in turn")
    p.add_argument("--models", default="default,gpt2-small", help="default and/or gpt2-small")
    p.add_argument("--checkpoint", type=Path, default=None, help="serve this one instead")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.rounds < 1:
        p.error(f"--rounds: must be ≥ 1, got {args.rounds}")
    sys.path.insert(0, str(REPO / "src"))
    print(f"bench/serve.py on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    if args.checkpoint is not None:
        report([bench_model(args.checkpoint.name, args.checkpoint, args)], args)
        return
    with tempfile.TemporaryDirectory(prefix="glassgpt-serve-bench-") as tmp:
        results = [bench_model(f"{kind} (random weights)", write_model(Path(tmp) / kind, kind), args)
                   for kind in args.models.split(",")]  # fmt: skip
    report(results, args)


if __name__ == "__main__":
    main()
