"""One HTML page that shows what a model does with a prompt, and what its heads are.

Sections: the model and prompt; next-token predictions with per-token loss; the logit lens;
direct logit attribution of the last position's top prediction; attention patterns of every
layer; head scores (previous token, duplicate token, induction) on repeated random tokens and
OV copying scores; composition scores; one head's QK and OV circuits over the prompt's tokens
with their top token pairs; summaries of any activations asked for by name.
Every number comes from ``glassgpt.inspect`` on the model's own forward pass.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError, InputFileError
from glassgpt.inspect import figures as fig
from glassgpt.inspect import page as P
from glassgpt.inspect.cache import evaluating, resolve_names, run_with_cache
from glassgpt.inspect.circuits import (
    check_layer_head,
    composition_scores,
    copying_scores,
    ov_circuit,
    qk_circuit,
    shown_distance,
)
from glassgpt.inspect.heads import HeadScores, head_scores
from glassgpt.inspect.lens import direct_logit_attribution, logit_lens
from glassgpt.model import GPT
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.display import token_texts, visible


def encode_prompt(model: GPT, tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's ids; an empty prompt or one longer than the context raises GlassError."""
    ids = list(tokenizer.encode_prompt(prompt))  # a family's BOS first, as it was trained
    if not ids:
        raise GlassError("the prompt is empty: give some text to inspect")
    n_ctx = model.config.n_ctx
    if len(ids) > n_ctx:
        raise GlassError(
            f"the prompt is {len(ids)} tokens, longer than the model's context n_ctx={n_ctx}"
        )
    bad = [i for i in ids if not 0 <= i < model.config.n_vocab]
    if bad:
        raise GlassError(
            f"the tokenizer gave id {bad[0]}, outside the model's vocabulary "
            f"(n_vocab={model.config.n_vocab}): tokenizer and model do not match"
        )
    return ids


def pick_head(
    model: GPT, scores: HeadScores, layer: int | None, head: int | None
) -> tuple[int, int]:
    """The head to detail: the one asked for, else the best induction head (best in ``layer``)."""
    if head is not None and layer is None:
        raise GlassError("--head needs --layer (which layer the head is in)")
    if layer is not None:
        check_layer_head(model, layer, head)
        if head is None:
            head = int(torch.argmax(scores.induction[layer]))
        return layer, head
    best_layer, best_head, _ = scores.best("induction")
    return best_layer, best_head


def build_report(
    model: GPT,
    tokenizer: Any,
    prompt: str,
    *,
    layer: int | None = None,
    head: int | None = None,
    names: Sequence[str] = (),
    seq_len: int | None = None,
    title: str = "glassgpt inspect",
) -> str:
    """The report's HTML for ``prompt``; bad input (head, layer, name, length) raises first."""
    if head is not None or layer is not None:
        pick_head(model, _no_scores(model), layer, head)  # validate before any work
    wanted = resolve_names(model, list(names)) if names else []
    ids = encode_prompt(model, tokenizer, prompt)
    texts = token_texts(tokenizer, ids)  # bytes outside whole characters as <0xNN>
    with evaluating(model), torch.no_grad():
        scores = head_scores(model, seq_len=seq_len)
        layer, head = pick_head(model, scores, layer, head)
        body = [
            _overview(model, prompt, ids, texts),
            _predictions(model, tokenizer, ids, texts),
            _lens(model, tokenizer, ids, texts),
            _attribution(model, tokenizer, ids),
            _patterns(model, ids, texts),
            _head_scores(model, scores),
            _composition(model),
            _circuits(model, tokenizer, ids, layer, head),
        ]
        if wanted:
            body.append(_activations(model, ids, wanted))
    return P.page(title, body)


def _no_scores(model: GPT) -> HeadScores:
    z = torch.zeros(model.config.n_layers, model.config.n_heads)
    return HeadScores(z, z, z, torch.zeros(0, 0, dtype=torch.long))


def _overview(model: GPT, prompt: str, ids: list[int], texts: list[str]) -> str:
    cfg = model.config
    n_params = sum(p.numel() for p in model.parameters())
    rows = [(k, str(v)) for k, v in cfg.to_dict().items()] + [("parameters", f"{n_params:,}")]
    tokens = " ".join(P.tok(visible(t)) for t in texts)
    return P.section(
        "Model and prompt",
        P.table(["field", "value"], rows),
        f"<p>Prompt ({len(ids)} tokens): {tokens}</p>",
        anchor="overview",
    )


def _predictions(model: GPT, tokenizer: Any, ids: list[int], texts: list[str]) -> str:
    labels = [visible(t) for t in texts]
    logits = model(torch.tensor([ids], device=_device(model)))
    assert isinstance(logits, Tensor)
    logp = torch.log_softmax(logits[0].float(), -1)  # [T, n_vocab]
    top_p, top_i = torch.topk(logp.exp(), min(3, logp.shape[-1]), dim=-1)
    rows: list[list[object]] = []
    losses = []
    for t in range(len(ids)):
        guesses = ", ".join(
            f"{visible(s)} {p:.2f}"
            for s, p in zip(token_texts(tokenizer, top_i[t].tolist()), top_p[t].tolist())
        )
        if t + 1 < len(ids):
            loss = float(-logp[t, ids[t + 1]])
            losses.append(loss)
            rows.append([t, labels[t], labels[t + 1], loss, guesses])
        else:
            rows.append([t, labels[t], "", "", guesses])
    parts = [P.table(["pos", "token", "next", "loss (nats)", "top predictions"], rows)]
    if losses:
        mean = sum(losses) / len(losses)
        parts.insert(0, P.note(f"mean loss over {len(losses)} predictions: {mean:.4f} nats"))
        ticks = [fig.token_label(t) for t in texts[1:]]
        parts.append(P.figure(fig.loss_figure(torch.tensor(losses), ticks), "per-token loss"))
    return P.section("Predictions and per-token loss", *parts, anchor="predictions")


def _lens(model: GPT, tokenizer: Any, ids: list[int], texts: list[str]) -> str:
    lens = logit_lens(model, ids)
    probs = lens.probs()[:, 0]  # [L + 1, T, n_vocab]
    top_i = probs.argmax(-1)  # [L + 1, T]
    nxt = torch.tensor([*ids[1:], ids[-1]], device=probs.device)
    p_next = probs.gather(-1, nxt.expand(probs.shape[0], -1)[..., None])[..., 0]
    if len(ids) > 1:
        p_next[:, -1] = float("nan")  # no actual next token at the last position
    uniq = sorted(set(top_i.flatten().tolist()))
    by_id = dict(zip(uniq, token_texts(tokenizer, uniq)))
    top_labels = [[fig.token_label(by_id[int(i)], 6) for i in row] for row in top_i]
    rows = ["embed"] + [f"after L{layer}" for layer in range(model.config.n_layers)]
    png = fig.logit_lens_figure(p_next, top_labels, rows, [fig.token_label(t) for t in texts])
    p_top = probs.max(-1).values.tolist()  # [L + 1][T]
    # whitespace made visible, one line per cell, as the chips show it (not a blank tall cell)
    cells = [
        [(visible(by_id[int(i)]), p) for i, p in zip(r, ps)] for r, ps in zip(top_i.tolist(), p_top)
    ]
    return P.section(
        "Logit lens",
        P.note(
            "The residual stream after each layer, unembedded as if it were the last "
            "(through the final norm for pre-norm models). The last row is the model's output."
        ),
        P.figure(png, "logit lens grid"),
        P.note(
            "The most likely next token at each layer (row) and position (column), "
            "shaded by its probability:"
        ),
        P.heat_table(rows, [visible(t) for t in texts], cells),  # as the chips show them
        anchor="lens",
    )


def _attribution(model: GPT, tokenizer: Any, ids: list[int]) -> str:
    if model.ln_final is None:
        return P.section(
            "Direct logit attribution",
            P.note("Not available for post-norm models: the last norm's scale mixes all parts."),
            anchor="attribution",
        )
    dla = direct_logit_attribution(model, ids)
    logits = dla.total(None)[0, -1]  # [n_vocab]
    target = int(logits.argmax())
    parts = dla.logits(torch.tensor([[target]] * len(ids), device=logits.device).T)[:, 0, -1]
    text = fig.token_label(token_texts(tokenizer, [target])[0])
    caption = f"parts of the logit of '{text}' (top prediction) at the last position"
    order = torch.argsort(parts.abs(), descending=True)[:12].tolist()
    rows = [[dla.names[i], float(parts[i])] for i in order]
    rows.append(["sum of all parts", float(parts.sum())])
    return P.section(
        "Direct logit attribution",
        P.note(
            "The final logit split into the embedding, each head, each MLP and the biases, "
            "with the final norm's scale frozen at its actual value; the parts sum to the logit."
        ),
        P.figure(fig.attribution_figure(dla.names, parts, caption), caption),
        P.table(["part", "contribution"], rows),
        anchor="attribution",
    )


def _patterns(model: GPT, ids: list[int], texts: list[str]) -> str:
    _, cache = run_with_cache(model, ids, "pattern")
    labels = [fig.token_label(t) for t in texts]
    figs = [
        P.figure(
            fig.attention_figure(cache["pattern", layer][0], labels, f"layer {layer}"),
            f"attention patterns of layer {layer} (rows: queries, columns: keys)",
        )
        for layer in range(model.config.n_layers)
    ]
    return P.section("Attention patterns", *figs, anchor="patterns")


def _head_scores(model: GPT, scores: HeadScores) -> str:
    cfg = model.config
    heads = [f"H{h}" for h in range(cfg.n_heads)]
    layers = [f"L{layer}" for layer in range(cfg.n_layers)]
    n = scores.tokens.shape[1] // 2
    parts = [
        P.note(
            f"Average attention where each mechanism would put it, on {scores.tokens.shape[0]} "
            f"random sequences of {n} tokens repeated once (1 = the mechanism exactly)."
        )
    ]
    for name, s in scores.as_dict().items():
        title = f"{name.replace('_', ' ')} score"
        png = fig.heatmap_figure(s, title, layers, heads, diverging=False, annotate=True)
        parts.append(P.figure(png, title))
    copy = copying_scores(model)
    png = fig.heatmap_figure(copy, "OV copying score", layers, heads, annotate=True)
    parts.append(P.figure(png, "OV copying score: Re Σλ / Σ|λ| of each head's token OV circuit"))
    return P.section("Head scores", *parts, anchor="heads")


def _composition(model: GPT) -> str:
    cfg = model.config
    if cfg.n_layers < 2:
        return P.section("Composition scores", P.note("A one-layer model has no composition."))
    labels = [f"L{layer}H{h}" for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
    parts = []
    for kind in ("q", "k", "v"):
        s = composition_scores(model, kind).flatten(0, 1).flatten(1, 2)  # [L·H, L·H]
        title = f"{kind.upper()}-composition"
        png = fig.heatmap_figure(
            s, title, labels, labels, xlabel="reading head", ylabel="writing head", diverging=False
        )
        parts.append(P.figure(png, f"{title} (row: writing head, column: reading head)"))
    return P.section("Composition scores", *parts, anchor="composition")


def _circuits(model: GPT, tokenizer: Any, ids: list[int], layer: int, head: int) -> str:
    uniq = list(dict.fromkeys(ids))[:40]
    texts = [fig.token_label(t) for t in token_texts(tokenizer, uniq)]
    distance = shown_distance(model)
    qk = qk_circuit(model, layer, head, distance=distance)
    ov = ov_circuit(model, layer, head)
    name = f"L{layer}H{head}"
    at = "" if distance is None else (
        f" (RoPE: the score depends on the query–key distance; shown at distance {distance})"
    )  # fmt: skip
    parts = [
        P.note(
            f"Head {name}, from its weights alone, restricted to the prompt's distinct tokens. "
            f"QK[a, b]: score of query token a on key token b{at}; OV[b, c]: logit of c "
            "written per unit of attention on token b."
        )
    ]
    for title, m in ((f"{name} QK circuit", qk), (f"{name} OV circuit", ov)):
        png = fig.heatmap_figure(
            m.block(uniq, uniq), title, texts, texts, xlabel="key" if "QK" in title else "output"
        )
        parts.append(P.figure(png, title))
    for title, m in (("QK", qk), ("OV", ov)):
        pairs = m.top_pairs(10, rows=uniq)
        cols = token_texts(tokenizer, [c for _, c, _ in pairs])
        rows = token_texts(tokenizer, [r for r, _, _ in pairs])
        table_rows = [
            [P.Raw(P.tok(visible(a))), P.Raw(P.tok(visible(b))), v]
            for a, b, (_, _, v) in zip(rows, cols, pairs)
        ]
        head_row = ["query", "key", "score"] if title == "QK" else ["source", "output", "logit"]
        parts.append(f"<h3>Top {title} pairs (rows: prompt tokens)</h3>")
        parts.append(P.table(head_row, table_rows))
    return P.section(f"Circuits of head {name}", *parts, anchor="circuits")


def _activations(model: GPT, ids: list[int], names: list[str]) -> str:
    _, cache = run_with_cache(model, ids, names)
    rows = []
    for n, t in cache.items():
        f = t.float()
        rows.append(
            [
                n,
                str(tuple(t.shape)),
                float(f.mean()),
                float(f.std()),
                float(f.min()),
                float(f.max()),
            ]
        )
    return P.section(
        "Activations", P.table(["name", "shape", "mean", "std", "min", "max"], rows), anchor="acts"
    )


def _device(model: GPT) -> torch.device:
    return next(model.parameters()).device


def write_report(path: str | os.PathLike[str], html_text: str) -> Path:
    """Write the page atomically (temp file, rename), with the permissions any file the user
    writes gets (the umask's); errors name the file."""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputFileError(f"{out}: cannot write the report ({e.strerror or e})") from None
    atomic_write(out, html_text.encode("utf-8"))
    return out


def default_output(checkpoint: str | os.PathLike[str]) -> Path:
    """``report.html`` in the run folder of a checkpoint (or in the folder given).

    >>> default_output("runs/x/ckpt/step_000100").as_posix(), default_output("hf").as_posix()
    ('runs/x/report.html', 'hf/report.html')
    """
    p = Path(checkpoint)
    if p.parent.name == "ckpt":
        p = p.parent.parent
    elif p.name == "ckpt":
        p = p.parent
    return p / "report.html"
