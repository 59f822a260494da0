"""``glassgpt patch`` and ``glassgpt ablate``: interventions on a checkpoint from the shell.

    patch    m̂[l, x] = (m(corrupted | site_{l,x} ← clean) − m_corrupted) / (m_clean − m_corrupted)
             m = z[answer] − z[wrong] at the last position (or log p(answer) without --wrong)
    ablate   loss and next-token distribution of a prompt, before and after replacing heads,
             MLPs or neurons (zero, mean or resample; ``--keep``: everything else)

The numbers are those of ``glassgpt.inspect.patching`` and ``glassgpt.inspect.ablation``
called on the model; this module parses, checks the input (one line each) and writes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output
from glassgpt.errors import GlassError, InputFileError

# --what item → (TransformerLens-named function in glassgpt.inspect.patching, cached site,
#                the result's column axis)
WHAT: dict[str, tuple[str, str, str]] = {
    "resid": ("get_act_patch_resid_pre", "resid_pre", "position"),
    "attn": ("get_act_patch_attn_out", "attn_out", "position"),
    "mlp": ("get_act_patch_mlp_out", "mlp_out", "position"),
    "heads": ("get_act_patch_attn_head_out_all_pos", "attn.z", "head"),
}
TITLES = {
    "resid": "residual stream entering each block (resid_pre)",
    "attn": "attention layer output (attn_out)",
    "mlp": "MLP output (mlp_out)",
    "heads": "head output z, all positions",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "patch",
        help="activation patching heat maps (clean into corrupted)",
        description=(
            "Run the corrupted prompt with one activation at a time taken from the clean run, "
            "and write a heat map (PNG) per site and the values (patch.json) to the output "
            "folder. The metric is the logit difference answer − wrong at the last position "
            "(the answer's log-probability without --wrong), normalised: 0 = the corrupted "
            "run, 1 = the clean run."
        ),
    )
    add_checkpoint(p)
    p.add_argument("--clean", required=True, metavar="TEXT", help="the clean prompt")
    p.add_argument(
        "--corrupt",
        required=True,
        metavar="TEXT",
        help="the corrupted prompt (the same number of tokens as --clean)",
    )
    p.add_argument("--answer", required=True, metavar="TOK", help="the clean answer (one token)")
    p.add_argument("--wrong", metavar="TOK", help="the corrupted answer (one token)")
    p.add_argument(
        "--what",
        default=None,
        metavar="SITES",
        help="comma-separated sites: resid, attn, mlp, heads (default: all the model has)",
    )
    add_output(p, required=True, metavar="DIR", help="folder for patch.json and the PNGs")
    p.add_argument("--batch-size", type=int, help="patched runs per batch (default: fit memory)")
    _add_device(p)
    p.set_defaults(func=run_patch)

    a = sub.add_parser(
        "ablate",
        help="the effect of ablating heads, MLPs or neurons on a prompt",
        description=(
            "Replace the listed components (zero, their mean or another prompt's value; with "
            "--keep every component not listed) and report the prompt's loss and the "
            "next-token distribution at its last position, before and after."
        ),
    )
    add_checkpoint(a)
    src = a.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the text to run")
    src.add_argument("--prompt-file", metavar="FILE", help="read the text from FILE (UTF-8)")
    a.add_argument("--heads", default="", metavar="L.H,...", help="heads, e.g. 0.1,1.3")
    a.add_argument("--mlps", default="", metavar="L,...", help="whole MLP layers, e.g. 0,2")
    a.add_argument("--neurons", default="", metavar="L:I,...", help="MLP neurons, e.g. 1:17")
    a.add_argument("--how", choices=("zero", "mean", "resample"), default="zero")
    ref = a.add_mutually_exclusive_group()
    ref.add_argument(
        "--reference",
        metavar="TEXT",
        help="the prompt whose activations mean/resample use (mean default: the prompt)",
    )
    ref.add_argument(
        "--reference-file",
        metavar="FILE",
        help="reference prompts, one per line (mean: averaged; resample: rows drawn at random)",
    )
    a.add_argument("--keep", action="store_true", help="ablate everything NOT listed")
    a.add_argument("--top", type=int, default=5, metavar="K", help="next tokens shown (default 5)")
    a.add_argument("--seed", type=int, default=0, help="seed of the resampled rows")
    add_output(a, metavar="FILE", help="also write the effect as JSON to FILE")
    _add_device(a)
    a.set_defaults(func=run_ablate)


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default="cpu", metavar="DEV", help="where to run the model: cpu, cuda, cuda:N"
    )


# -- parsing (pure) -----------------------------------------------------------------------------
def parse_what(text: str | None, attn_only: bool) -> list[str]:
    """The --what items in order; None: every site the model has.

    >>> parse_what("heads, resid", False), parse_what(None, True)
    (['heads', 'resid'], ['resid', 'attn', 'heads'])
    """
    if text is None:
        return [w for w in WHAT if not (attn_only and w == "mlp")]
    items = [w.strip() for w in text.split(",") if w.strip()]
    if not items:
        raise GlassError(f"--what {text!r} names no site; choose from {', '.join(WHAT)}")
    for w in items:
        if w not in WHAT:
            raise GlassError(f"--what: unknown site {w!r}; choose from {', '.join(WHAT)}")
    if attn_only and "mlp" in items:
        raise GlassError("--what mlp: this model is attention-only (it has no MLPs)")
    return list(dict.fromkeys(items))


def parse_list(text: str, flag: str, sep: str | None = None) -> list[Any]:
    """``"0.1,1.2"`` → [(0, 1), (1, 2)] with sep ``"."``; ``"0,2"`` → [0, 2] without sep.

    >>> parse_list("0.1, 1.2", "--heads", "."), parse_list("3:7", "--neurons", ":"), parse_list("", "--mlps")
    ([(0, 1), (1, 2)], [(3, 7)], [])
    """
    out: list[Any] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        parts = item.split(sep) if sep else [item]
        try:
            numbers = [int(x) for x in parts]
        except ValueError:
            numbers = []
        if len(numbers) != (2 if sep else 1):
            form = f"L{sep}{'H' if sep == '.' else 'I'}" if sep else "L"
            raise GlassError(f"{flag}: {item!r} is not of the form {form} (integers)")
        out.append(tuple(numbers) if sep else numbers[0])
    return out


# -- tokens -------------------------------------------------------------------------------------
def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        return list(tokenizer.encode(text, allowed_special="all"))
    except TypeError:
        return list(tokenizer.encode(text))


def single_token(model: Any, tokenizer: Any, text: str, flag: str) -> int:
    """The id of ``text`` if it is exactly one token; otherwise one line saying how it splits."""
    from glassgpt.inspect.report import token_texts

    ids = _encode(tokenizer, text)
    if len(ids) != 1:
        pieces = " ".join(repr(t) for t in token_texts(tokenizer, ids)) or "nothing"
        raise GlassError(
            f"{flag} {text!r} is {len(ids)} tokens ({pieces}), not one: give a single token"
        )
    if not 0 <= ids[0] < model.config.n_vocab:
        raise GlassError(f"{flag} {text!r} is id {ids[0]}, outside n_vocab={model.config.n_vocab}")
    return ids[0]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    from glassgpt.storage import atomic_write

    atomic_write(path, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def _folder(path: str | Path) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputFileError(f"{out}: exists and is not a folder (-o names the output folder)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputFileError(
            f"{out}: cannot create the output folder ({e.strerror or e})"
        ) from None
    return out


# -- glassgpt patch -----------------------------------------------------------------------------
def run_patch(args: argparse.Namespace) -> int:
    from glassgpt.inspect import metrics, patching
    from glassgpt.inspect.cache import evaluating, run_with_cache, run_with_hooks
    from glassgpt.inspect.commands import load_model
    from glassgpt.inspect.patch_figures import patching_figure, position_labels
    from glassgpt.inspect.report import encode_prompt, token_texts
    from glassgpt.storage import atomic_write

    model, tokenizer = load_model(args.checkpoint, args.device)
    whats = parse_what(args.what, model.config.attn_only)
    clean = encode_prompt(model, tokenizer, args.clean)
    corrupt = encode_prompt(model, tokenizer, args.corrupt)
    if len(clean) != len(corrupt):
        raise GlassError(
            f"the clean prompt is {len(clean)} tokens and the corrupted one {len(corrupt)}: "
            "patching needs prompts of the same length"
        )
    answer = single_token(model, tokenizer, args.answer, "--answer")
    wrong = None if args.wrong is None else single_token(model, tokenizer, args.wrong, "--wrong")
    raw = metrics.logprob(answer) if wrong is None else metrics.logit_diff(answer, wrong)
    sites = [WHAT[w][1] for w in whats]
    with evaluating(model):
        clean_logits, clean_cache = run_with_cache(model, clean, sites)
        corrupt_logits = run_with_hooks(model, corrupt, {})
    metric = metrics.normalised(raw, clean_logits, corrupt_logits)
    out = _folder(args.output)

    short = (
        f"normalised logit difference {args.answer!r} − {args.wrong!r}"
        if wrong is not None
        else f"normalised log p({args.answer!r})"
    )
    labels = position_labels(token_texts(tokenizer, clean), token_texts(tokenizer, corrupt))
    heads = [str(h) for h in range(model.config.n_heads)]
    corrupt_ids = model_tokens(model, corrupt)
    results: dict[str, Any] = {}
    for w in whats:
        name, _, axis = WHAT[w]
        fn = getattr(patching, name)
        values = fn(model, corrupt_ids, clean_cache, metric, batch_size=args.batch_size)
        png = f"patch_{w}.png"
        atomic_write(
            out / png,
            patching_figure(
                values,
                f"patching {TITLES[w]}\n{short}",
                col_labels=labels if axis == "position" else heads,
                xlabel="position (clean/corrupted token)" if axis == "position" else "head",
            ),
        )
        results[w] = {
            "function": f"glassgpt.inspect.patching.{name}",
            "axes": ["layer", axis],
            "values": values.tolist(),
            "figure": png,
        }
        best = divmod(int(values.abs().argmax()), values.shape[1])
        where = (
            f"position {best[1]} {labels[best[1]]!r}" if axis == "position" else f"head {best[1]}"
        )
        print(
            f"{w:>5}: largest |m̂| {float(values[best]):+.3f} at layer {best[0]}, {where}"
            f" → {out / png}"
        )
    doc = {
        "checkpoint": str(args.checkpoint),
        "clean": args.clean,
        "corrupted": args.corrupt,
        "clean_tokens": token_texts(tokenizer, clean),
        "corrupted_tokens": token_texts(tokenizer, corrupt),
        "answer": {"text": args.answer, "id": answer},
        "wrong": None if wrong is None else {"text": args.wrong, "id": wrong},
        "metric": (
            "normalised logit difference (answer − wrong) at the last position"
            if wrong is not None
            else "normalised log-probability of the answer at the last position"
        ),
        "metric_clean": float(raw(clean_logits)),
        "metric_corrupted": float(raw(corrupt_logits)),
        "normalisation": "0 = corrupted run, 1 = clean run",
        "results": results,
    }
    _write_json(out / "patch.json", doc)
    print(f"wrote {out / 'patch.json'}")
    return 0


def model_tokens(model: Any, ids: Sequence[int]) -> Any:
    """ids as a [1, T] tensor on the model's device."""
    from glassgpt.inspect.cache import as_batch

    return as_batch(model, list(ids))


# -- glassgpt ablate ----------------------------------------------------------------------------
def _reference(args: argparse.Namespace, model: Any, tokenizer: Any) -> list[list[int]] | None:
    from glassgpt.inspect.report import encode_prompt

    if args.reference is not None:
        return [encode_prompt(model, tokenizer, args.reference)]
    if args.reference_file is None:
        return None
    path = Path(args.reference_file)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputFileError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read the references ({e.strerror or e})") from None
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise InputFileError(f"{path}: holds no reference prompt (one per line)")
    return [encode_prompt(model, tokenizer, t) for t in texts]


def run_ablate(args: argparse.Namespace) -> int:
    from glassgpt.inspect import ablation, metrics
    from glassgpt.inspect.cache import evaluating, run_with_hooks
    from glassgpt.inspect.commands import load_model, read_prompt
    from glassgpt.inspect.report import encode_prompt, token_texts

    heads = parse_list(args.heads, "--heads", ".")
    mlps = parse_list(args.mlps, "--mlps")
    neurons = parse_list(args.neurons, "--neurons", ":")
    if args.top < 1:
        raise GlassError(f"--top must be at least 1, got {args.top}")
    if not (heads or mlps or neurons or args.keep):
        raise GlassError("nothing to ablate: give --heads, --mlps or --neurons (or --keep)")
    prompt = read_prompt(args)
    model, tokenizer = load_model(args.checkpoint, args.device)
    ids = encode_prompt(model, tokenizer, prompt)
    if len(ids) < 2:
        raise GlassError("the prompt is 1 token: the loss needs at least 2 (one to predict)")
    refs = _reference(args, model, tokenizer)
    if args.how == "zero" and refs is not None:
        raise GlassError("--reference is for --how mean or resample, not zero")
    reference: Any = None
    if refs is not None and args.how == "mean":
        reference = [model_tokens(model, r) for r in refs]  # batches of one prompt each
    elif refs is not None:
        short = min(len(r) for r in refs)
        if short < len(ids):
            raise GlassError(
                f"resampling needs references at least as long as the prompt ({len(ids)} "
                f"tokens); the shortest is {short}"
            )
        reference = model_tokens(model, [t for r in refs for t in r[: len(ids)]]).reshape(
            len(refs), len(ids)
        )
    tokens = model_tokens(model, ids)
    plan = ablation.ablated_components(model, heads, mlps, neurons, args.keep)
    with evaluating(model):
        before = run_with_hooks(model, tokens, {})
        after = ablation.run_ablated(
            model,
            tokens,
            heads=heads,
            mlps=mlps,
            neurons=neurons,
            how=args.how,
            reference=reference,
            keep=args.keep,
            seed=args.seed,
            shuffle=reference is not None and args.how == "resample" and len(refs or []) > 1,
        )
    loss = metrics.loss(ids)
    loss_before, loss_after = float(loss(before)), float(loss(after))
    logp_b = before[0, -1].double().log_softmax(-1)
    logp_a = after[0, -1].double().log_softmax(-1)
    kl = float((logp_b.exp() * (logp_b - logp_a)).sum())
    k = min(args.top, logp_b.shape[0])
    union = {*logp_b.topk(k).indices.tolist(), *logp_a.topk(k).indices.tolist()}
    shown = sorted(union, key=lambda i: -float(logp_b[i]))  # most likely before first
    texts = token_texts(tokenizer, shown)
    rows = [
        {"token": t, "id": i, "before": float(logp_b[i].exp()), "after": float(logp_a[i].exp())}
        for t, i in zip(texts, shown, strict=True)
    ]
    ablated = {
        "heads": [f"{l}.{h}" for l, hs in plan.heads.items() for h in hs],
        "mlps": plan.mlps,
        "neurons": [f"{l}:{i}" for l, idx in plan.neurons.items() for i in idx],
    }
    n = len(ablated["heads"]) + len(ablated["mlps"]) + len(ablated["neurons"])
    print(
        f"ablated ({args.how}{', keep' if args.keep else ''}): {n} components"
        + "".join(
            f"; {kind} {', '.join(map(str, v))}" for kind, v in ablated.items() if v and n <= 24
        )
    )
    print(
        f"loss (mean next-token, nats): {loss_before:.4f} → {loss_after:.4f} "
        f"({loss_after - loss_before:+.4f})"
    )
    print(f"KL(before ‖ after) of the next-token distribution at the last position: {kl:.4f} nats")
    width = max(12, *(len(repr(r["token"])) + 1 for r in rows))
    print(f"{'next token':<{width}} {'before':>8} {'after':>8}")
    for r in rows:
        print(f"{r['token']!r:<{width}} {r['before']:8.4f} {r['after']:8.4f}")
    if args.output:
        out = Path(args.output)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputFileError(f"{out}: cannot write ({e.strerror or e})") from None
        _write_json(
            out,
            {
                "checkpoint": str(args.checkpoint),
                "prompt": prompt,
                "tokens": token_texts(tokenizer, ids),
                "how": args.how,
                "keep": args.keep,
                "ablated": ablated,
                "loss": {"before": loss_before, "after": loss_after},
                "kl_next_token": kl,
                "next_token": rows,
            },
        )
        print(f"wrote {out}")
    return 0
