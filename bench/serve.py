"""Load test of ``glassgpt serve``: N concurrent streaming clients for a bounded time, with
uniform and with mixed sampling settings, and the time to first token with and without a
cached system prompt.

    python bench/serve.py                     # shakespeare and GPT-2-small shapes, 1/8/32 clients
    python bench/serve.py --seconds 3 --clients 1,8 --models shakespeare   # a quick check
    python bench/serve.py --rounds 3 --seconds 10 --clients 1,8            # levels interleaved
    python bench/serve.py --dtype bf16 --models default --clients 1,8      # a bf16 server

For each model shape (random weights, saved as a checkpoint; ``--checkpoint DIR`` serves a
trained one instead; ``shakespeare`` is the 10.7M ``shakespeare-char`` preset's shape with
Tiny Shakespeare's characters, ``default`` the default preset's) a ``glassgpt serve``
process is started on a free localhost port. Each client sends streaming
``/v1/completions`` requests back to back (a random prompt of ``--prompt-tokens``
characters, ``--max-tokens`` new tokens) until the time is up: with ``uniform`` settings
every request samples at temperature 1; with ``mixed`` each request draws its own
temperature (greedy included), top-p, top-k, min-p, penalties, logit bias and seed, as
real clients do. Printed per level and settings: requests, aggregate tokens/s, its ratio
to one client with the same settings and mixed's ratio to uniform at the same level, p50/p99
time to first token and per token, the server process's CPU time (all its threads) per
token and one client's over it (the throughput ratio the server would reach if its CPU
time were the only limit: steadier than tokens/s on a shared machine, where a level's
wall time depends on the other processes' load), errors; where that CPU goes, a token: the
scheduler's thread (steps, sampling), its prompt thread, the event loop (HTTP, the streams),
the server's other threads, and the clients' own (this process's: ``http.client`` reading
the stream line by line and ``json.loads`` on each chunk, what a lean OpenAI-API streaming
client does; the ``openai`` client itself costs more a chunk, so it would load the shared
cores more, not measure the server better); the server's RSS after a warm-up
and after the load; and the time to first token of ``--system-tokens`` characters of
system prompt plus a short question, cold (a system prompt the server has not seen) and warm (one it has:
its blocks come from the prefix cache). With ``--rounds R`` the levels run R times in turn
and each level's figures pool its runs, so that a change in the machine's load falls on
every level alike; the load average is printed before and after. Targets (issue 45): on the
10.7M model, mixed ≥ 0.9× uniform and ≥ 5× one client at 8 clients; (issue 12) no errors,
RSS back within 10%. Nothing is asserted: the figures go to docs/serving.md.
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
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
MIXED = {  # each request draws one value of each
    "temperature": [0.0, 0.5, 0.7, 0.9, 1.0, 1.2],
    "top_p": [1.0, 0.95, 0.9, 0.8],
    "top_k": [None, None, 20, 40],
    "min_p": [0.0, 0.0, 0.05],
    "presence_penalty": [0.0, 0.0, 0.5],
    "frequency_penalty": [0.0, 0.0, 0.3],
    "repetition_penalty": [1.0, 1.0, 1.1],
}


def preset_shape(name: str) -> dict:
    from glassgpt.config import load_toml

    model = load_toml(REPO / "src" / "glassgpt" / "presets" / f"{name}.toml")["model"]
    return {**model, "dropout": 0.0}


def write_model(folder: Path, kind: str) -> Path:
    """A random-weight checkpoint of the ``shakespeare-char`` preset's shape (Tiny
    Shakespeare's characters where ../shared/data has it), the ``default`` preset's (char
    vocabulary) or GPT-2 small's (GPT-2's BPE from ../shared/data when present, else bytes)."""
    import torch

    from glassgpt.checkpoint import CheckpointManager
    from glassgpt.model import GPT, GPTConfig
    from glassgpt.tokenizer import CharTokenizer, Tokenizer
    from glassgpt.train.config import dump_toml

    if kind == "shakespeare":
        text = SHAKESPEARE.read_text() if SHAKESPEARE.is_file() else string.printable
        tok = CharTokenizer(sorted(set(text) | set(VOCAB)), special_tokens=["<|endoftext|>"])
        shape = preset_shape("shakespeare-char")
    elif kind == "default":
        tok = CharTokenizer(sorted(set(string.printable)), special_tokens=["<|endoftext|>"])
        shape = preset_shape("default")
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


def stat_seconds(stat: Path) -> float:
    """User + system CPU seconds from a /proc ``stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used so far (user + system, all its threads)."""
    return stat_seconds(Path(f"/proc/{pid}/stat"))


def thread_seconds(pid: int) -> dict[str, float]:
    """The CPU time of each of the server's threads so far, summed by part: ``scheduler``
    and ``prompts`` (the threads ``glassgpt.serve.scheduler`` names, each with the OpenMP
    workers it started, which take its name), ``loop`` (the main thread: uvicorn's event
    loop, HTTP and the streams) and ``other``; empty where /proc has no threads to read."""
    parts = {"glassgpt-sched": "scheduler", "glassgpt-prompt": "prompts"}
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = (task / "comm").read_text().strip()
            seconds = stat_seconds(task / "stat")
        except OSError:  # (a thread that has just ended)
            continue
        part = "loop" if task.name == str(pid) else parts.get(name, "other")
        out[part] = out.get(part, 0.0) + seconds
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


VOCAB = string.ascii_letters + " .,\n"


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


def settings_of(rng: random.Random, mixed: bool) -> dict:
    """A request's sampling settings: temperature 1, or (mixed) one draw of each of MIXED
    and a logit bias on a few ids."""
    if not mixed:
        return {"temperature": 1.0}
    out = {k: rng.choice(v) for k, v in MIXED.items()}
    if rng.random() < 0.25:
        out["logit_bias"] = {str(rng.randrange(60)): rng.choice([-100.0, 2.0])}
    return {k: v for k, v in out.items() if v is not None}


def load_level(
    port: int,
    clients: int,
    seconds: float,
    args: argparse.Namespace,
    mixed: bool = False,
    pid: int | None = None,
) -> dict:
    """One run of ``clients`` clients for ``seconds``: totals, the latency samples and the
    CPU seconds the server (process ``pid``) used meanwhile."""
    deadline = time.perf_counter() + seconds
    ttft, per_token, tokens, errors, requests = [], [], [0], [0], [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        rng = random.Random(c)
        while time.perf_counter() < deadline:
            prompt = "".join(rng.choice(VOCAB) for _ in range(args.prompt_tokens))
            body = {"model": "bench", "prompt": prompt, "max_tokens": args.max_tokens,
                    "seed": rng.randrange(10**6), "stream": True,
                    "stream_options": {"include_usage": True},
                    **settings_of(rng, mixed)}  # fmt: skip
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

    start, cpu = time.perf_counter(), cpu_seconds(pid) if pid else float("nan")
    parts, mine = thread_seconds(pid) if pid else {}, time.process_time()  # mine: the clients'
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    cpu = (cpu_seconds(pid) if pid else float("nan")) - cpu
    after = thread_seconds(pid) if pid else {}
    parts = {k: after[k] - parts.get(k, 0.0) for k in after}
    return {"clients": clients, "mixed": mixed, "requests": requests[0], "errors": errors[0],
            "tokens": tokens[0], "wall": wall, "ttft": ttft, "per_token": per_token,
            "cpu": cpu, "parts": parts, "client_cpu": time.process_time() - mine}  # fmt: skip


def prefix_ttft(port: int, args: argparse.Namespace, n: int = 8) -> tuple[int, float, float]:
    """(characters, p50 time to first token cold, warm (s)) of a system prompt of
    ``--system-tokens`` characters (fewer where the server's context is shorter) plus a
    short question: cold (a new system prompt each time) and warm (one sent before)."""
    rng = random.Random(7)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/v1/models/bench")
    context = json.loads(conn.getresponse().read())["context_length"]
    conn.close()
    length = min(args.system_tokens, context - 16)  # characters: at least as many as tokens

    def ask(system: str) -> float:
        question = "".join(rng.choice(VOCAB) for _ in range(8))
        body = {"model": "bench", "prompt": system + question, "max_tokens": 1,
                "temperature": 0.0, "stream": True}  # fmt: skip
        first = stream_once(port, body)[0]
        return first if first is not None else float("nan")

    def system() -> str:
        return "".join(rng.choice(VOCAB) for _ in range(length))

    shared = system()
    ask(shared)  # the server keeps its blocks
    cold = [ask(system()) for _ in range(n)]
    warm = [ask(shared) for _ in range(n)]
    return (length, statistics.median([x for x in cold if x == x]),
            statistics.median([x for x in warm if x == x]))  # fmt: skip


def pooled(runs: list[dict]) -> dict:  # of one level and settings
    """The figures of one level over its runs: totals summed, percentiles of every sample."""

    def pct(xs: list[float], q: float) -> float:
        return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else (xs or [0])[0]

    ttft = [x for r in runs for x in r["ttft"]]
    per_token = [x for r in runs for x in r["per_token"]]
    made = max(1, sum(r["tokens"] for r in runs))
    names = {k for r in runs for k in r["parts"]}
    parts = {k: sum(r["parts"].get(k, 0.0) for r in runs) / made for k in names}
    return {"parts": parts, "client_cpu": sum(r["client_cpu"] for r in runs) / made,
            "clients": runs[0]["clients"], "mixed": runs[0]["mixed"],
            "requests": sum(r["requests"] for r in runs),
            "errors": sum(r["errors"] for r in runs),
            "tok_s": sum(r["tokens"] for r in runs) / sum(r["wall"] for r in runs),
            "cpu_token": sum(r["cpu"] for r in runs) / max(1, sum(r["tokens"] for r in runs)),
            "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99),
            "tok50": pct(per_token, 50), "tok99": pct(per_token, 99)}  # fmt: skip


def bench_model(name: str, folder: Path, args: argparse.Namespace) -> tuple[list[dict], tuple]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, "-m", "glassgpt", "serve", "--checkpoint", str(folder), "--port",
           str(port), "--name", "bench", "--dtype", args.dtype]  # fmt: skip
    server = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        load_level(port, 1, 0.5, args)  # warm-up
        load_level(port, 1, 0.5, args, mixed=True)
        before = rss_mib(server.pid)
        load = os.getloadavg()[0]
        levels = [(c, m) for c in args.clients for m in args.settings]
        runs = [load_level(port, c, args.seconds, args, m == "mixed", server.pid)
                for _ in range(args.rounds) for c, m in levels]  # fmt: skip
        load_after = os.getloadavg()[0]
        rows = [pooled([r for r in runs if (r["clients"], r["mixed"]) == (c, m == "mixed")])
                for c, m in levels]  # fmt: skip
        time.sleep(2)
        after = rss_mib(server.pid)  # before the long prompts of the time to first token
        ttft = prefix_ttft(port, args) if args.system_tokens else None
    finally:
        server.terminate()
        server.wait(timeout=30)
    for r in rows:
        same = [o for o in rows if o["mixed"] == r["mixed"]]
        one = next((o["tok_s"] for o in same if o["clients"] == 1), same[0]["tok_s"])
        uniform = [o for o in rows if o["clients"] == r["clients"] and not o["mixed"]]
        one_cpu = next((o["cpu_token"] for o in same if o["clients"] == 1), same[0]["cpu_token"])
        r["model"], r["ratio"], r["cpu_ratio"] = name, r["tok_s"] / one, one_cpu / r["cpu_token"]
        r["vs_uniform"] = r["tok_s"] / uniform[0]["tok_s"] if uniform else float("nan")
    return rows, (before, after, load, load_after, ttft)


def report(results: list[tuple[list[dict], tuple]], args: argparse.Namespace) -> None:
    rounds = f" × {args.rounds} rounds, interleaved" if args.rounds > 1 else ""
    print(f"\n{args.seconds:g} s per level{rounds}; prompts of {args.prompt_tokens} characters, "
          f"{args.max_tokens} new tokens, streaming; uniform: temperature 1; mixed: each "
          f"request its own settings\n")  # fmt: skip
    print("| model | clients | settings | requests | tokens/s | × 1 client | × uniform | "
          "TTFT p50 | TTFT p99 | per token p50 | per token p99 | server CPU a token | "
          "1 client's ÷ this | errors |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows, _ in results:
        for r in rows:
            print(f"| {r['model']} | {r['clients']} | {'mixed' if r['mixed'] else 'uniform'} | "
                  f"{r['requests']} | {r['tok_s']:.0f} | {r['ratio']:.2f} | "
                  f"{r['vs_uniform']:.2f} | {1e3 * r['ttft50']:.0f} ms | "
                  f"{1e3 * r['ttft99']:.0f} ms | {1e3 * r['tok50']:.1f} ms | "
                  f"{1e3 * r['tok99']:.1f} ms | {1e3 * r['cpu_token']:.2f} ms | "
                  f"{r['cpu_ratio']:.2f} | {r['errors']} |")  # fmt: skip
    print("\nWhere the CPU goes, ms a token (the server's threads; the clients: this process)\n")
    print("| model | clients | settings | scheduler | prompt thread | event loop | other "
          "threads | clients | all |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for rows, _ in results:
        for r in rows:
            p = {k: 1e3 * r["parts"].get(k, 0.0) for k in ("scheduler", "prompts", "loop", "other")}
            every = sum(p.values()) + 1e3 * r["client_cpu"]
            print(f"| {r['model']} | {r['clients']} | {'mixed' if r['mixed'] else 'uniform'} | "
                  f"{p['scheduler']:.3f} | {p['prompts']:.3f} | {p['loop']:.3f} | "
                  f"{p['other']:.3f} | {1e3 * r['client_cpu']:.3f} | {every:.3f} |")  # fmt: skip
    print()
    for rows, (*_, ttft) in results:
        if ttft is not None:
            length, cold, warm = ttft
            print(f"{rows[0]['model']}: time to first token after a {length}-"
                  f"character system prompt: {1e3 * cold:.1f} ms cold, {1e3 * warm:.1f} ms with "
                  f"it cached ({cold / warm:.1f}×)")  # fmt: skip
    for rows, (before, after, load, load_after, _) in results:
        change = 100 * (after - before) / before
        print(f"{rows[0]['model']}: server RSS {before:.0f} MiB after warm-up, {after:.0f} MiB "
              f"after the load ({change:+.1f}%; target within ±10%); 1-minute load average "
              f"{load:.2f} before the load, {load_after:.2f} after")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", default="1,8,32", help="comma-separated levels")
    p.add_argument("--settings", default="uniform,mixed", help="uniform and/or mixed")
    p.add_argument("--system-tokens", type=int, default=200,
                   help="system prompt length for the time to first token (0: skip)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each level")
    p.add_argument("--rounds", type=int, default=1, help="run the levels this many times in turn")
    p.add_argument("--models", default="shakespeare,gpt2-small",
                   help="shakespeare, default and/or gpt2-small")  # fmt: skip
    p.add_argument("--checkpoint", type=Path, default=None, help="serve this one instead")
    p.add_argument("--dtype", default="float32", help="serve --dtype: float32, bf16, int8, int4")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    args = p.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.settings = args.settings.split(",")
    if not set(args.settings) <= {"uniform", "mixed"}:
        p.error(f"--settings: uniform and/or mixed, got {args.settings}")
    if args.rounds < 1:
        p.error(f"--rounds: must be ≥ 1, got {args.rounds}")
    sys.path.insert(0, str(REPO / "src"))
    print(f"bench/serve.py on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"--dtype {args.dtype}, 1-minute load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    if args.checkpoint is not None:
        report([bench_model(args.checkpoint.name, args.checkpoint, args)], args)
        return
    with tempfile.TemporaryDirectory(prefix="glassgpt-serve-bench-") as tmp:
        results = [bench_model(f"{kind} (random weights)", write_model(Path(tmp) / kind, kind), args)
                   for kind in args.models.split(",")]  # fmt: skip
    report(results, args)


if __name__ == "__main__":
    main()
