"""Attribution graphs beside circuit-tracer 0.5: the same model, the same CLT, the same prompt.

GPT-2 small's shape (12 layers, d_model 768, random weights, float32), a prompt of ``--seq``
tokens (default 64; the first is <|endoftext|>, the rest random ids), and a cross-layer
transcoder of 8 × d_model = 6144 JumpReLU features per layer (random weights; each layer's
threshold set to the (1 − L0/6144) quantile of its pre-activations on the prompt, so about
``--l0`` = 50 are active per layer and token; the measured L0 is printed). Each side runs the
full graph (every active feature's row, the top logits' rows) in a fresh subprocess:

- glassgpt: :func:`glassgpt.features.graphs.attribute`;
- circuit-tracer 0.5: ``circuit_tracer.attribute`` on its ``TransformerLensReplacementModel``
  and ``CrossLayerTranscoder`` holding the same weights, in circuit-tracer's own interpreter
  (``.venv-circuit-tracer``; ``bench/graphs_ct.py`` says why it carries a shim: circuit-tracer's
  TransformerLens backend needs ``HookedTransformer``, which TransformerLens 4 removed).

Printed per side: seconds (each run a cold first call in a fresh process; the median over
``--repeat`` runs, the sides alternating) and the CPU time
of that call (steadier than the wall clock on a shared machine), peak memory (the
peak resident set, VmHWM, of the fresh subprocess: imports, the model and the CLT
included; and the call's own, the peak during ``attribute`` above the resident set before it,
``bench/graph_memory.py``), backward passes, nodes and nonzero edges; then the ratios and the largest
difference between the two adjacency matrices after matching the node order. circuit-tracer
zeroes every feature and the error at position 0 (its BOS); those rows and columns are left
out of the comparison (glassgpt keeps them), everything else must agree to 1e-4.

    PYTHONPATH=src python bench/graphs.py                 # the issue's shape (long on 2 cores)
    PYTHONPATH=src python bench/graphs.py --quick         # 4 layers, d_model 256, 32 tokens
    PYTHONPATH=src python bench/graphs.py --shape mid     # GPT-2 small's width and depth, 16 tokens
    PYTHONPATH=src python bench/graphs.py --threads 1     # both sides on one thread each

``--threads`` sets both children's threads (OMP_NUM_THREADS, torch.set_num_threads); on a
machine whose cores other jobs share, one thread each gives the steadier CPU times (two
threads spin-wait on each other there, and small elementwise products then take 10–100×
longer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.graphs import attribute
from glassgpt.features.replacement import Transcoders, freeze
from glassgpt.model import GPT, GPTConfig
from graph_memory import reset_peak, status_mib

ROOT = Path(__file__).resolve().parent.parent
CT_PYTHON = os.environ.get("GLASSGPT_CIRCUIT_TRACER_PYTHON", str(ROOT / ".venv-circuit-tracer/bin/python"))  # fmt: skip
FULL = {"n_layers": 12, "d_model": 768, "n_heads": 12, "seq": 64, "l0": 50}
QUICK = {"n_layers": 4, "d_model": 256, "n_heads": 4, "seq": 32, "l0": 20}
MID = {**FULL, "seq": 16}  # GPT-2 small's width and depth, a shorter prompt
SHAPES = {"full": FULL, "mid": MID, "quick": QUICK}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build(folder: Path, shape: dict, seed: int = 0) -> dict:
    """Write the model and the CLT in both libraries' layouts; return the meta (shape, ids, L0)."""
    torch.manual_seed(seed)
    L, d, T = shape["n_layers"], shape["d_model"], shape["seq"]
    cfg = GPTConfig.preset("gpt2", n_ctx=T, n_layers=L, d_model=d, n_heads=shape["n_heads"],
                           d_head=d // shape["n_heads"], d_mlp=4 * d)  # fmt: skip
    model = GPT(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    ids = [cfg.n_vocab - 1, *torch.randint(0, cfg.n_vocab - 1, (T - 1,), generator=gen).tolist()]
    n = 8 * d
    clt = CLT(CLTConfig(d_model=d, d_sae=n, n_layers=L, arch="jumprelu"), seed=seed).eval()
    fz = freeze(model, Transcoders(clt=clt), ids)
    with torch.no_grad():  # θ_l: the (1 − L0/n) quantile of layer l's pre-activations
        for layer in range(L):
            z = clt.pre_acts(fz.u[layer], layer).flatten()
            theta = torch.quantile(z.double(), 1 - shape["l0"] / n).float()
            clt.log_threshold[layer] = theta.log()
    fz = freeze(model, Transcoders(clt=clt), ids)
    l0 = sum(int((a != 0).sum()) for a in fz.acts) / (L * T)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "glass_model.safetensors")  # fmt: skip
    clt.save(folder / "glass_clt")
    tl = {("pos_embed.W_pos" if k == "pos_embed.W_P" else k): v for k, v in model.state_dict().items()}  # fmt: skip
    tl["unembed.W_U"] = model.W_U.detach()
    tl["unembed.b_U"] = torch.zeros(cfg.n_vocab)
    save_file({k: v.contiguous() for k, v in tl.items()}, folder / "model.safetensors")
    ct = {"W_enc": clt.W_enc.detach().transpose(1, 2), "b_enc": clt.b_enc.detach(),
          "b_dec": clt.b_dec.detach(), "activation_function.threshold": clt.theta.detach()[:, None]}  # fmt: skip
    for layer in range(L):  # ours [L − l, n, d] per source layer, theirs [n, L − l, d]
        ct[f"W_dec.{layer}"] = clt.W_dec[layer].detach().permute(1, 0, 2)
    save_file({k: v.contiguous() for k, v in ct.items()}, folder / "clt.safetensors")
    meta = {"n_layers": L, "d_model": d, "n_heads": shape["n_heads"], "n_vocab": cfg.n_vocab,
            "n_ctx": T, "d_sae": n, "tokens": ids, "l0": l0}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


def glassgpt_side(folder: Path, out: str, batch: int, dtype: str) -> None:
    """The child: glassgpt's attribute, timed cold; one JSON line of numbers."""
    meta = json.loads((folder / "meta.json").read_text())
    L, d, h = meta["n_layers"], meta["d_model"], meta["n_heads"]
    cfg = GPTConfig.preset("gpt2", n_ctx=meta["n_ctx"], n_layers=L, d_model=d, n_heads=h,
                           d_head=d // h, d_mlp=4 * d)  # fmt: skip
    model = GPT(cfg).eval()
    model.load_state_dict(load_file(folder / "glass_model.safetensors"))
    tc = Transcoders(clt=CLT.load(folder / "glass_clt"))
    load_peak = status_mib("VmHWM")  # imports, the model and the CLT loaded
    before = reset_peak()  # the call's own peak is then what it adds
    start, cpu = time.perf_counter(), time.process_time()
    graph = attribute(model, tc, meta["tokens"], batch_size=batch, dtype=DTYPES[dtype])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    call_peak = status_mib("VmHWM") - before
    peak = max(load_peak, status_mib("VmHWM"))
    A = graph.adjacency
    edges = int((A != 0).sum())
    save_file({"adjacency": A.float().contiguous(), "features": graph.features.contiguous(),
               "logits": torch.tensor(graph.logit_tokens)}, out)  # fmt: skip
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mib": peak, "call_mib": call_peak, "nodes": graph.n_nodes, "edges": edges,
                      "backward": graph.n_backward, "n_active": graph.n_active}))  # fmt: skip


def child(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(ours: Path, theirs: Path, meta: dict, chunk: int = 2048) -> tuple[float, float, int]:
    """(max |A_ours − A_ct|, max |A_ct|, compared entries) over the nodes both graphs hold."""
    L, T = meta["n_layers"], meta["n_ctx"]
    with safe_open(str(ours), "pt") as fo, safe_open(str(theirs), "pt") as ft:
        feats, active = fo.get_tensor("features"), ft.get_tensor("active")
        if not torch.equal(fo.get_tensor("logits"), ft.get_tensor("logits")):
            raise SystemExit(f"logit targets differ: {fo.get_tensor('logits').tolist()} vs {ft.get_tensor('logits').tolist()}")  # fmt: skip
        where = {tuple(f): i for i, f in enumerate(feats.tolist())}
        missing = [f for f in active.tolist() if tuple(f) not in where]
        if missing:
            raise SystemExit(f"{len(missing)} of circuit-tracer's active features are not glassgpt's, e.g. {missing[:3]}")  # fmt: skip
        n_g, n_c = len(feats), len(active)
        rest = L * T + T + len(fo.get_tensor("logits"))
        index = torch.cat([torch.tensor([where[tuple(f)] for f in active.tolist()], dtype=torch.long),
                           torch.arange(n_g, n_g + rest)])  # fmt: skip
        cols = torch.ones(n_c + rest, dtype=torch.bool)
        cols[n_c : n_c + L * T : T] = False  # the errors at position 0: circuit-tracer zeroes them
        A_o, A_t = fo.get_slice("adjacency"), ft.get_slice("adjacency")
        worst = scale = 0.0
        for i in range(0, n_c + rest, chunk):
            rows = index[i : i + chunk]
            lo, hi = int(rows.min()), int(rows.max()) + 1
            mine = A_o[lo:hi][rows - lo][:, index][:, cols]
            theirs_rows = A_t[i : i + chunk][:, cols]
            worst = max(worst, float((mine - theirs_rows).abs().max()))
            scale = max(scale, float(theirs_rows.abs().max()))
    return worst, scale, int(cols.sum()) * (n_c + rest)


def median_of(runs: list[dict]) -> dict:
    """The first run's counts, with each time the median over the runs (each a cold start)."""
    out = dict(runs[0])
    for key in ("seconds", "cpu_s", "peak_mib", "call_mib"):
        out[key] = statistics.median(r[key] for r in runs)
    out["n_runs"] = len(runs)
    return out


def uptime() -> str:
    done = subprocess.run(["uptime"], capture_output=True, text=True)
    return done.stdout.strip() or str(Path("/proc/loadavg").read_text().split(" ", 3)[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="4 layers, d_model 256, 32 tokens, L0 20"
    )
    parser.add_argument(
        "--shape",
        choices=tuple(SHAPES),
        default="full",
        help="mid: full width and depth, 16 tokens",
    )
    parser.add_argument("--seq", type=int, help="the prompt's tokens (the shape's by default)")
    parser.add_argument("--repeat", type=int, default=1, help="fresh runs a side (medians printed)")
    parser.add_argument("--threads", type=int, help="torch threads of each side (default: torch's)")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="targets per backward pass, both sides"
    )
    parser.add_argument("--adjacency-dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--no-ct", action="store_true", help="glassgpt alone")
    parser.add_argument("--side", nargs=2, metavar=("DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return glassgpt_side(
            Path(args.side[0]), args.side[1], args.batch_size, args.adjacency_dtype
        )
    shape = dict(QUICK if args.quick else SHAPES[args.shape])
    if args.seq:
        shape["seq"] = args.seq
    if args.threads:  # the children read it as they start
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    print(f"uptime before: {uptime()}; {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads a side")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="glassgpt-graphbench-") as tmp:
        folder = Path(tmp)
        meta = build(folder, shape)
        L, d, T = meta["n_layers"], meta["d_model"], meta["n_ctx"]
        print(f"model: {L} layers, d_model {d}, {T} tokens; CLT {meta['d_sae']} features per layer, "
              f"measured L0 {meta['l0']:.1f} per layer and token; batch {args.batch_size}")  # fmt: skip
        ours_cmd = [sys.executable, __file__, "--side", tmp, str(folder / "ours.safetensors"),
                    "--batch-size", str(args.batch_size), "--adjacency-dtype", args.adjacency_dtype]  # fmt: skip
        ct_cmd = [CT_PYTHON, str(ROOT / "bench/graphs_ct.py"), tmp, str(folder / "ct.safetensors"), str(args.batch_size)]  # fmt: skip
        run_ct = not args.no_ct and Path(CT_PYTHON).exists()
        if not args.no_ct and not run_ct:
            print(f"circuit-tracer: not run ({CT_PYTHON} does not exist)")
        runs: dict[str, list[dict]] = {"ours": [], "theirs": []}
        for _ in range(args.repeat):  # the sides alternate, so a change of load meets both
            runs["ours"].append(child(ours_cmd))
            if run_ct:
                runs["theirs"].append(child(ct_cmd))
        ours = median_of(runs["ours"])
        rows = [("glassgpt", ours)]
        theirs = None
        if run_ct:
            theirs = median_of(runs["theirs"])
            n_logits = ours["nodes"] - ours["n_active"] - (L + 1) * T
            theirs["backward"] = math.ceil(n_logits / args.batch_size) + math.ceil(theirs["n_active"] / args.batch_size)  # fmt: skip
            with safe_open(str(folder / "ct.safetensors"), "pt") as f:
                A = f.get_slice("adjacency")
                n = A.get_shape()[0]
                theirs["nodes"] = n
                theirs["edges"] = sum(int((A[i : i + 2048] != 0).sum()) for i in range(0, n, 2048))
            rows.append(("circuit-tracer 0.5", theirs))
        print(f"medians of {args.repeat} fresh run(s) a side, each timed cold")
        print(f"{'':20} {'seconds':>9} {'CPU s':>9} {'peak MiB':>9} {'call MiB':>9} {'backward':>9} {'nodes':>7} {'edges':>11}")  # fmt: skip
        for name, r in rows:
            print(f"{name:20} {r['seconds']:9.2f} {r['cpu_s']:9.2f} {r['peak_mib']:9.0f} {r['call_mib']:9.0f} {r['backward']:9d} {r['nodes']:7d} {r['edges']:11d}")  # fmt: skip
        if theirs is not None:
            worst, scale, n = compare(folder / "ours.safetensors", folder / "ct.safetensors", meta)
            print(f"speed ratio (circuit-tracer / glassgpt): {theirs['seconds'] / ours['seconds']:.2f}x wall, "
                  f"{theirs['cpu_s'] / ours['cpu_s']:.2f}x CPU time; "
                  f"peak memory ratio (glassgpt / circuit-tracer): {ours['peak_mib'] / theirs['peak_mib']:.2f} "
                  f"(process), {ours['call_mib'] / theirs['call_mib']:.2f} (the call's own)")  # fmt: skip
            verdict = "agree" if worst <= 1e-4 else "DIFFER"
            print(f"adjacency: max |difference| {worst:.2e} over {n} shared entries (max |A| {scale:.2e}): {verdict} to 1e-4 "
                  f"(circuit-tracer zeroes position 0's features and error: left out)")  # fmt: skip
    print(f"uptime after: {uptime()}")


if __name__ == "__main__":
    main()
