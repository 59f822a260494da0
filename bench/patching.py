"""Activation and attribution patching sweeps beside TransformerLens 4.3, same weights, same run.

GPT-2 small's shape with random weights (float32), at each depth of ``--layers`` (default 12;
``--layers 2,4,12``: GPT-2 small's width with 2, 4 and 12 blocks, one table each), built once
as glassgpt's GPT and as a TransformerLens ``TransformerBridge`` around transformers'
GPT2LMHeadModel holding the same weights (``enable_compatibility_mode(no_processing=True)``:
no weight folding, so both compute the same logits). One prompt pair of ``--seq`` tokens (default 20) that differ at the
``--differ`` positions (default 6 and 13, as a name swap does in IOI prompts); the metric is
the logit difference of two tokens at the last position. Rows:

- ``resid_pre``: ``get_act_patch_resid_pre`` (n_layers × positions patched runs);
- ``head_out_all_pos``: ``get_act_patch_attn_head_out_all_pos`` (n_layers × n_heads runs);
- ``head_v_all_pos``, ``head_pattern_all_pos`` (not run unless named in ``--rows``): the
  values' and the pattern's sweeps by layer × head;
- ``attribution z``: attribution patching of every head and position (``attn.z``):
  ``glassgpt.inspect.attribution.attribution_patch`` beside TransformerLens's usual recipe
  (a clean cache; one corrupted forward and backward with hooks caching activations and
  gradients; Σ over d_head of gradient × (clean − corrupted)).

Columns: the first (cold) call's seconds, the median of ``--repeats`` warm calls, the ratio
TransformerLens / glassgpt (>1: glassgpt faster), forward-pass equivalents (seconds / one
plain forward of the same prompt by the same library; ``fwd-eq/cells`` for glassgpt, a
loop of single runs is 1.0), the extra peak memory of the call (Linux: the peak resident
set after resetting it, minus the resident set before; CUDA: torch's peak allocation) and
the largest difference between the two results. The CPU, the threads and the load average
(before and after) are printed. Run from the repository root:

    PYTHONPATH=src python bench/patching.py                  # a few minutes on 2 cores
    PYTHONPATH=src python bench/patching.py --layers 2,4,12  # the table of docs/performance.md
    PYTHONPATH=src python bench/patching.py --repeats 1 --rows resid_pre --clock cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's sweeps print progress bars

import torch
from torch import Tensor

from glassgpt.inspect import patching as gp
from glassgpt.inspect.attribution import attribution_patch
from glassgpt.inspect.cache import run_with_cache
from glassgpt.inspect.metrics import logit_diff
from glassgpt.interop.hf_gpt2 import config_to_hf, state_dict_to_hf
from glassgpt.model import GPT, GPTConfig

ROWS = ("resid_pre", "head_out_all_pos", "head_v_all_pos", "head_pattern_all_pos", "attribution z")
DEFAULT_ROWS = ("resid_pre", "head_out_all_pos", "attribution z")


def build_pair(n_ctx: int, device: str, n_layers: int = 12) -> tuple[GPT, Any]:
    """glassgpt's GPT (GPT-2 small's shape, ``n_layers`` blocks, random weights) and a
    TransformerBridge around GPT2LMHeadModel holding the same weights."""
    import transformers
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    torch.manual_seed(0)
    ours = GPT(GPTConfig.preset("gpt2", n_ctx=n_ctx, n_layers=n_layers)).eval()
    hf_config = transformers.GPT2Config(**config_to_hf(ours.config))
    hf = transformers.GPT2LMHeadModel(hf_config)
    result = hf.load_state_dict(state_dict_to_hf(ours), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # tied head
        raise RuntimeError(f"weights do not match: {result}")
    bridge = build_bridge_from_module(hf.eval(), "GPT2LMHeadModel", hf_config=hf_config)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return ours.to(device), bridge.to(device)


def peak_extra(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """fn()'s result and the extra peak memory of the call in MiB (see the docstring)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        return out, (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM) to the current one
    except OSError:
        return fn(), float("nan")
    before = _status_kib("VmRSS")
    out = fn()
    return out, (_status_kib("VmHWM") - before) / 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def tl_attribution_z(bridge: Any, clean: Tensor, corrupted: Tensor, metric: Callable) -> Tensor:
    """TransformerLens's recipe: ∂m/∂z at the corrupted run · (z_clean − z_corrupted),
    summed over d_head → [n_layers, T, n_heads]."""
    is_z = lambda name: name.endswith("attn.hook_z")  # noqa: E731
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(clean, names_filter=is_z)
    acts: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}

    def keep_act(t: Tensor, hook: Any) -> None:
        acts[hook.name] = t.detach()

    def keep_grad(t: Tensor, hook: Any) -> None:
        grads[hook.name] = t.detach()

    bridge.reset_hooks()
    bridge.add_hook(is_z, keep_act, "fwd")
    bridge.add_hook(is_z, keep_grad, "bwd")
    try:
        metric(bridge(corrupted)).backward()
    finally:
        bridge.reset_hooks()
    L = bridge.cfg.n_layers
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
    return torch.stack([(grads[n] * (clean_cache[n] - acts[n])).sum(-1)[0] for n in names])


def cpu_name() -> str:
    """The CPU's model name (Linux), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=20, help="tokens per prompt")
    p.add_argument("--differ", type=int, nargs="+", default=[6, 13],
                   help="positions where the corrupted prompt differs from the clean one")  # fmt: skip
    p.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), choices=ROWS)
    p.add_argument("--layers", default="12",
                   help="depths, comma-separated (GPT-2 small's width with that many blocks)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="warm calls per cell (median)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed seconds; cpu: this process's CPU seconds (all threads)")  # fmt: skip
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    import transformer_lens.patching as tlp  # the optional oracle

    clock = time.perf_counter if args.clock == "wall" else time.process_time
    load = os.getloadavg()
    print(
        f"{cpu_name()}; torch {torch.__version__}, {args.threads} threads, device "
        f"{args.device}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
        f"{os.cpu_count()} cores; {args.clock} clock, medians of {args.repeats}"
    )
    summary: list[str] = []
    for depth in [int(n) for n in args.layers.split(",")]:
        summary += run_depth(args, tlp, clock, depth)
    print("\nsummary (ratio = TL / glassgpt, warm medians; fwd-eq: the call's seconds / one plain "
          "forward of the same library; fwd-eq/cell: glassgpt's)")  # fmt: skip
    for line in summary:
        print(line)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def run_depth(
    args: argparse.Namespace, tlp: Any, clock: Callable[[], float], depth: int
) -> list[str]:
    """One depth's table; returns its summary lines."""
    print(f"\n== {depth} layers (load average {os.getloadavg()[0]:.2f}) ==")
    ours, bridge = build_pair(max(64, args.seq), args.device, depth)
    L, H = ours.config.n_layers, ours.config.n_heads
    gen = torch.Generator().manual_seed(1)
    clean = torch.randint(0, ours.config.n_vocab, (1, args.seq), generator=gen)
    corrupted = clean.clone()
    for pos in args.differ:
        corrupted[0, pos] = (clean[0, pos] + 1 + pos) % ours.config.n_vocab
    clean, corrupted = clean.to(args.device), corrupted.to(args.device)
    answer, wrong = 1000, 2000
    metric = logit_diff(answer, wrong)

    def tl_metric(logits: Tensor) -> Tensor:
        return logits[:, -1, answer].mean() - logits[:, -1, wrong].mean()

    with torch.no_grad():
        diff = float((ours(clean) - bridge(clean)).abs().max())
    print(f"GPT-2 small's width, {L} layers, random weights, float32; prompts of {args.seq} "
          f"tokens differing at {args.differ}; max |logits(glassgpt) - logits(TL)| = {diff:.2e}")  # fmt: skip

    def forward_seconds(run: Callable[[], Any]) -> float:
        with torch.no_grad():
            run()
            times = []
            for _ in range(max(5, args.repeats)):
                t0 = clock()
                run()
                times.append(clock() - t0)
        return statistics.median(times)

    fwd_ours = forward_seconds(lambda: ours(corrupted))
    fwd_tl = forward_seconds(lambda: bridge(corrupted))
    print(f"one plain forward: glassgpt {fwd_ours * 1e3:.1f} ms, TL {fwd_tl * 1e3:.1f} ms")

    _, clean_cache = run_with_cache(ours, clean, ["resid_pre", "attn.z", "attn.v", "pattern"])
    with torch.no_grad():
        _, tl_cache = bridge.run_with_cache(clean)
    rows: dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor], int]] = {
        "resid_pre": (
            lambda: gp.get_act_patch_resid_pre(ours, corrupted, clean_cache, metric),
            lambda: tlp.get_act_patch_resid_pre(bridge, corrupted, tl_cache, tl_metric),
            L * args.seq,
        ),
        "head_out_all_pos": (
            lambda: gp.get_act_patch_attn_head_out_all_pos(ours, corrupted, clean_cache, metric),
            lambda: tlp.get_act_patch_attn_head_out_all_pos(bridge, corrupted, tl_cache, tl_metric),
            L * H,
        ),
        "head_v_all_pos": (
            lambda: gp.get_act_patch_attn_head_v_all_pos(ours, corrupted, clean_cache, metric),
            lambda: tlp.get_act_patch_attn_head_v_all_pos(bridge, corrupted, tl_cache, tl_metric),
            L * H,
        ),
        "head_pattern_all_pos": (
            lambda: gp.get_act_patch_attn_head_pattern_all_pos(
                ours, corrupted, clean_cache, metric
            ),
            lambda: tlp.get_act_patch_attn_head_pattern_all_pos(
                bridge, corrupted, tl_cache, tl_metric
            ),
            L * H,
        ),
    }
    rows["attribution z"] = (
        lambda: attribution_patch(ours, clean, corrupted, metric, ("attn.z",))["attn.z"],
        lambda: tl_attribution_z(bridge, clean, corrupted, tl_metric),
        L * args.seq * H,
    )
    header = (
        f"{'row':<18}{'cells':>6}{'lib':>10}{'cold s':>9}{'warm s':>9}{'ratio':>7}"
        f"{'fwd-eq':>8}{'fwd-eq/cells':>13}{'peak MiB':>10}{'max |diff|':>12}"
    )
    print(header)
    print("-" * len(header))
    summary = []
    for name in args.rows:
        if name not in rows:
            print(f"{name:<18} (glassgpt.inspect.attribution is not installed)")
            continue
        ours_fn, tl_fn, cells = rows[name]
        results: dict[str, Tensor] = {}
        cold: dict[str, float] = {}
        peak: dict[str, float] = {}
        warm: dict[str, list[float]] = {"glassgpt": [], "TL": []}
        fns = {"glassgpt": ours_fn, "TL": tl_fn}
        for lib, fn in fns.items():  # the cold call, with its memory
            t0 = clock()
            results[lib], peak[lib] = peak_extra(fn, args.device)
            cold[lib] = clock() - t0
        for i in range(args.repeats):  # warm calls, the order alternating
            for lib in ("glassgpt", "TL") if i % 2 == 0 else ("TL", "glassgpt"):
                t0 = clock()
                fns[lib]()
                warm[lib].append(clock() - t0)
        med = {lib: statistics.median(ts) for lib, ts in warm.items()}
        gap = float((results["glassgpt"].float().cpu() - results["TL"].float().cpu()).abs().max())
        for lib in ("glassgpt", "TL"):
            fwd = fwd_ours if lib == "glassgpt" else fwd_tl
            ratio = f"{med['TL'] / med['glassgpt']:>7.2f}" if lib == "glassgpt" else " " * 7
            print(
                f"{name if lib == 'glassgpt' else '':<18}{cells if lib == 'glassgpt' else '':>6}"
                f"{lib:>10}{cold[lib]:>9.2f}{med[lib]:>9.2f}{ratio}{med[lib] / fwd:>8.1f}"
                f"{med[lib] / fwd / cells:>13.3f}{peak[lib]:>10.0f}"
                f"{f'{gap:.1e}' if lib == 'glassgpt' else '':>12}"
            )
        summary.append(
            f"{L:>3} layers  {name:<22}{cells:>5} cells  glassgpt {med['glassgpt']:7.3f} s  "
            f"TL {med['TL']:7.3f} s  ratio {med['TL'] / med['glassgpt']:6.2f}  "
            f"fwd-eq {med['glassgpt'] / fwd_ours:5.2f} (TL {med['TL'] / fwd_tl:5.2f})  "
            f"fwd-eq/cell {med['glassgpt'] / fwd_ours / cells:.3f}"
        )
    return summary


if __name__ == "__main__":
    main()
