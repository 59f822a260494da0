"""``glassgpt patch``: activation patching heat maps, clean into corrupted, from the shell.

    m̂[l, x] = (m(corrupted | site_{l,x} ← clean) − m_corrupted) / (m_clean − m_corrupted)
    m = z[answer] − z[wrong] at the last position (or log p(answer) without --wrong)

The numbers are those of ``glassgpt.inspect.patching`` called on the model; this module
parses, checks the input (one line each) and writes a heat map per site and ``patch.json``.

    glassgpt patch -c RUN --clean "…Mary gave it to" --corrupt "…John gave it to" \\
        --answer " John" --wrong " Mary" -o patches/
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from glassgpt.checkpoint import open_run
from glassgpt.cli.arguments import add_checkpoint, add_device, add_output, add_tokenizer
from glassgpt.console import say
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError, InputFileError
from glassgpt.inspect import metrics, patching
from glassgpt.inspect.cache import as_batch, evaluating, run_with_cache, run_with_hooks
from glassgpt.inspect.patch_figures import patching_heatmap, position_labels
from glassgpt.inspect.report import encode_prompt
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.display import token_texts, visible

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


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the corrupted prompt with one activation at a time taken from the clean run, "
        "and write a heat map (PNG) per site and the values (patch.json) to the output "
        "folder. The metric is the logit difference answer − wrong at the last position "
        "(the answer's log-probability without --wrong), normalised: 0 = the corrupted "
        "run, 1 = the clean run."
    )
    add_checkpoint(parser)
    parser.add_argument("--clean", required=True, metavar="TEXT", help="the clean prompt")
    parser.add_argument(
        "--corrupt",
        required=True,
        metavar="TEXT",
        help="the corrupted prompt (the same number of tokens as --clean)",
    )
    parser.add_argument(
        "--answer", required=True, metavar="TOK", help="the clean answer (one token)"
    )
    parser.add_argument("--wrong", metavar="TOK", help="the corrupted answer (one token)")
    parser.add_argument(
        "--what",
        default=None,
        metavar="SITES",
        help="comma-separated sites: resid, attn, mlp, heads (default: all the model has)",
    )
    add_output(parser, required=True, metavar="DIR", help="folder for patch.json and the PNGs")
    parser.add_argument(
        "--batch-size", type=int, help="patched runs per batch (default: fit memory)"
    )
    add_device(parser)
    add_tokenizer(parser)
    parser.set_defaults(func=run)


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


def single_token(model: Any, tokenizer: Any, text: str, flag: str) -> int:
    """The id of ``text`` if it is exactly one token; otherwise one line saying how it splits."""
    try:
        ids = list(tokenizer.encode(text, allowed_special="all"))
    except TypeError:  # a tokenizer without special tokens
        ids = list(tokenizer.encode(text))
    if len(ids) != 1:
        pieces = " ".join(f"'{visible(t)}'" for t in token_texts(tokenizer, ids)) or "nothing"
        raise GlassError(
            f"{flag} {text!r} is {len(ids)} tokens ({pieces}), not one: give a single token"
        )
    if not 0 <= ids[0] < model.config.n_vocab:
        raise GlassError(f"{flag} {text!r} is id {ids[0]}, outside n_vocab={model.config.n_vocab}")
    return ids[0]


def output_folder(path: str | Path) -> Path:
    """``-o``, created; one line when it is a file or cannot be made."""
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


def run(args: argparse.Namespace) -> int:
    device = parse_device(args.device)
    loaded = open_run(args.checkpoint, tokenizer=args.tokenizer, device=device)
    model, tokenizer = loaded.model, loaded.needs_tokenizer()
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
    a_text = visible(token_texts(tokenizer, [answer])[0])
    w_text = "" if wrong is None else visible(token_texts(tokenizer, [wrong])[0])
    raw = (  # named by the tokens' text, as every message shows them
        metrics.logprob(answer, name=f"log p('{a_text}')")
        if wrong is None
        else metrics.logit_diff(answer, wrong, name=f"logit_diff('{a_text}', '{w_text}')")
    )
    sites = [WHAT[w][1] for w in whats]
    with evaluating(model):
        clean_logits, clean_cache = run_with_cache(model, clean, sites)
        corrupt_logits = run_with_hooks(model, corrupt, {})
    metric = metrics.normalised(raw, clean_logits, corrupt_logits)
    m_clean, m_corrupted = float(raw(clean_logits)), float(raw(corrupt_logits))
    if metrics.small_gap(m_clean, m_corrupted):
        say(
            f"{raw.name} is {m_clean:.4g} on the clean run and {m_corrupted:.4g} on the "
            f"corrupted one: m̂ divides by their small difference ({m_clean - m_corrupted:+.3g}), "
            "so its values are mostly noise and may pass 1 or 0 (prompts that differ more "
            "in the answer help)"
        )
    out = output_folder(args.output)

    short = (
        f"normalised logit difference '{a_text}' − '{w_text}'"
        if wrong is not None
        else f"normalised log p('{a_text}')"
    )
    labels = position_labels(token_texts(tokenizer, clean), token_texts(tokenizer, corrupt))
    heads = [str(h) for h in range(model.config.n_heads)]
    corrupt_ids = as_batch(model, corrupt)  # [1, T] on the model's device
    results: dict[str, Any] = {}
    for w in whats:
        name, _, axis = WHAT[w]
        sweep = getattr(patching, name)
        values = sweep(model, corrupt_ids, clean_cache, metric, batch_size=args.batch_size)
        png = f"patch_{w}.png"
        atomic_write(
            out / png,
            patching_heatmap(
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
            f"position {best[1]} '{labels[best[1]]}'" if axis == "position" else f"head {best[1]}"
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
        "metric_clean": m_clean,
        "metric_corrupted": m_corrupted,
        "normalisation": "0 = corrupted run, 1 = clean run",
        "results": results,
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    atomic_write(out / "patch.json", text.encode("utf-8"))
    print(f"wrote {out / 'patch.json'}")
    return 0
