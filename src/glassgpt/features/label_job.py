"""``glassgpt sae label``: a short explanation of each feature from its top contexts, asked of
an OpenAI-compatible endpoint, scored by detection (:mod:`glassgpt.features.label_prompts`),
written to the folder's ``labels.json`` (:mod:`glassgpt.features.labels`).

The top contexts come from the feature pages (``glassgpt sae features``), which the labeller
reads and does not make: they are one pass whose corpus, size and context width the user
chose, and which the explorer shows beside the label, so both must be the same pages. The
random silent contexts need the model: one forward over random windows of the corpus.

Features are asked ``concurrency`` at a time (threads: the work is waiting on the endpoint).
The file is rewritten atomically as features finish, at most every few seconds, and at the
end or on an error, so a stopped run loses nothing: run again and the labelled features are
skipped (``overwrite`` asks them again).
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from glassgpt.console import say
from glassgpt.errors import GlassError
from glassgpt.features.clt import CONFIG_FILE as CLT_FILE
from glassgpt.features.clt import clt_folder
from glassgpt.features.clt_pages import open_clt
from glassgpt.features.folders import _corpus, open_sae
from glassgpt.features.label_client import Endpoint, base_url
from glassgpt.features.label_contexts import quiet_contexts, split_ranks
from glassgpt.features.label_prompts import (
    detect_messages,
    detection,
    explain_messages,
    parse_answers,
    parse_label,
    render,
)
from glassgpt.features.labels import FILE as LABELS_FILE
from glassgpt.features.labels import key, read_labels, write_labels
from glassgpt.features.metrics import eval_window
from glassgpt.features.pages import FILE as PAGES_FILE
from glassgpt.features.pages import FeaturePages, load_pages
from glassgpt.features.sae import CONFIG_FILE as SAE_FILE
from glassgpt.features.sae import sae_folder
from glassgpt.tokenizer.display import token_texts

BATCH = 10  # contexts per detection question (delphi asks in small batches too)
QUIET_TOKENS = 16_384  # tokens of random windows searched for silent contexts
SAVE_EVERY = 2.0  # seconds between rewrites of labels.json


def parse_features(spec: str, pages: FeaturePages) -> list[int]:
    """The features ``spec`` names: ``all-live`` (those active on the pages' corpus), or ids
    and ranges, e.g. ``0-99`` or ``3,7,10-12``; a CLT's as LAYER/ids, e.g. ``1/0-99`` or
    ``0/3,1/5-9`` (numbered as its pages number them, l · d_sae + i); one line for a bad or
    out-of-range one."""
    clt = pages.meta.get("clt")
    L, S = (int(clt["n_layers"]), int(clt["d_sae"])) if clt else (1, pages.d_sae)
    if spec == "all-live":
        return [i for i in range(pages.d_sae) if int(pages.count[i]) > 0]
    out: list[int] = []
    shape = "LAYER/ids or ranges (e.g. 1/0-99, 0/3,1/5-9, all-live)" if clt else "ids or ranges (e.g. 0-99, 3,7,10-12, all-live)"  # fmt: skip
    layer = None
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(?:(\d+)\s*/)?\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(1) is not None and not clt):
            raise GlassError(f"--features {spec}: not {shape}")
        layer = (
            int(m.group(1)) if m.group(1) is not None else layer
        )  # a bare id: the last layer named
        if clt and (layer is None or layer >= L):
            raise GlassError(f"--features {spec}: {part.strip()} names no layer of this CLT (LAYER/ids, layers 0-{L - 1})")  # fmt: skip
        lo, hi = int(m.group(2)), int(m.group(3) or m.group(2))
        if lo > hi or hi >= S:
            raise GlassError(f"--features {spec}: {part.strip()} is out of range (this dictionary has features 0-{S - 1}{' per layer' if clt else ''})")  # fmt: skip
        out.extend(range((layer or 0) * S + lo, (layer or 0) * S + hi + 1))
    return list(dict.fromkeys(out))


def label_feature(
    ep: Endpoint,
    tops: Sequence[tuple[list[str], list[float]]],
    quiet: Sequence[list[str]],
    *,
    explain: int,
    holdout: int,
    seed: int,
) -> dict[str, Any]:
    """One feature's entry: its label from the explaining contexts, and its detection score on
    the held-out ones and ``quiet`` (token texts of silent contexts), shuffled with ``seed``."""
    ex, held = split_ranks(len(tops), explain, holdout)
    label = parse_label(ep.chat(explain_messages([render(*tops[r]) for r in ex]), max_tokens=60))
    cases = [(render(tops[r][0]), True) for r in held] + [(render(q), False) for q in quiet[: len(held)]]  # fmt: skip
    random.Random(seed).shuffle(cases)
    said: list[bool | None] = []
    for a in range(0, len(cases), BATCH):
        part = [c for c, _ in cases[a : a + BATCH]]
        answer = ep.chat(detect_messages(label, part), max_tokens=4 * len(part) + 40)
        said += parse_answers(answer, len(part))
    truth = [t for _, t in cases]
    score = detection(truth, said)
    return {"label": label, "detection": None if score is None else round(score, 4),
            "activating": sum(truth), "silent": len(truth) - sum(truth),
            "unread": sum(s is None for s in said), "explained_by": len(ex)}  # fmt: skip


def check_folder(path: str) -> tuple[Path, bool]:
    """(the folder holding sae.json or clt.json, whether it is a CLT); one line for a folder
    that is no dictionary at all."""
    folder = Path(path)
    if not folder.is_dir():
        raise GlassError(f"{path}: no such folder")
    if (clt_folder(folder) / CLT_FILE).is_file():
        return clt_folder(folder), True
    if not (sae_folder(folder) / SAE_FILE).is_file():
        raise GlassError(f"{path}: not an SAE, transcoder or CLT folder (no {SAE_FILE} or {CLT_FILE})")  # fmt: skip
    return sae_folder(folder), False


def label_folder(
    sae_dir: str,
    *,
    endpoint: str,
    model: str | None = None,
    api_key: str | None = None,
    features: str = "all-live",
    contexts: int = 10,
    holdout: int = 5,
    concurrency: int = 4,
    overwrite: bool = False,
    data: Sequence[str] | None = None,
    split: str = "train",
    seed: int = 0,
    timeout: float = 120.0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Label the features of the SAE, transcoder or CLT in ``sae_dir`` (module docstring; a
    CLT's as its pages number them, written under "l/i"); returns a summary:
    the file, the features labelled, skipped (labelled before) and dead, and the mean score."""
    for flag, v, lo in (("--contexts", contexts, 1), ("--holdout", holdout, 0), ("--concurrency", concurrency, 1)):  # fmt: skip
        if v < lo:
            raise GlassError(f"{flag}: must be ≥ {lo}, got {v}")
    folder, clt = check_folder(sae_dir)
    pages = load_pages(folder)
    chosen = parse_features(features, pages)
    S = pages.d_sae // int(pages.meta["clt"]["n_layers"]) if clt else pages.d_sae

    def name(i: int) -> str:  # labels.json's key: "i", a CLT's "l/i"
        return key(i % S, i // S if clt else None)

    done = read_labels(folder)
    todo = [i for i in chosen if overwrite or name(i) not in done]
    dead = {i for i in todo if int(pages.top_where[i, 0]) < 0}
    todo = [i for i in todo if i not in dead]
    summary: dict[str, Any] = {"file": folder / LABELS_FILE, "labelled": 0, "skipped": len(chosen) - len(todo) - len(dead), "dead": len(dead), "scores": []}  # fmt: skip
    if not todo:
        return summary
    ep = Endpoint(base_url(endpoint), model, api_key, timeout)
    # the first word with the endpoint: a dead one fails before the model loads
    if model is None:
        ep = Endpoint(ep.url, ep.first_model(), api_key, timeout)
    sae, net, tok, extra = (open_clt if clt else open_sae)(str(folder), model=None, device=device)
    if tok is None:
        raise GlassError(f"{sae_dir}: its model has no tokenizer, and labels need the contexts' text")  # fmt: skip
    texts = token_texts(tok, range(net.config.n_vocab))
    stream, _ = _corpus(str(folder), data, split, extra.get("data"), tok)
    width = (int(pages.meta["before"]), int(pages.meta["after"]))
    T = eval_window(net.config.n_ctx, int(pages.meta.get("seq_len") or 0) or None)
    quiet = quiet_contexts(net, sae, stream, todo, n=holdout, width=width, seq_len=T, tokens=QUIET_TOKENS, seed=seed) if holdout else {}  # fmt: skip
    meta = {"endpoint": ep.url, "model": ep.model, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "contexts": contexts, "holdout": holdout, "pages": str((folder / PAGES_FILE).resolve())}  # fmt: skip
    say(f"labelling {len(todo):,} features with {ep.model} at {ep.url} ({concurrency} at a time)")
    new: dict[str, dict[str, Any]] = {}
    last = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=concurrency)
    running: dict[Future[dict[str, Any]], int] = {}
    queue = list(reversed(todo))
    try:
        while queue or running:
            while queue and len(running) < 2 * concurrency:  # a short queue: an error stops soon
                i = queue.pop()
                q = [[texts[t] for t in ids] for ids in quiet.get(i, [])]
                tops = [(c["tokens"], c["acts"]) for c in pages.page(i, texts)["contexts"]]
                running[pool.submit(label_feature, ep, tops, q,
                                    explain=contexts, holdout=holdout, seed=seed * 1_000_003 + i)] = i  # fmt: skip
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                i = running.pop(fut)
                entry = fut.result()  # an endpoint's error ends the run here (after the save)
                new[name(i)] = entry
                score = "—" if entry["detection"] is None else f"{entry['detection']:.2f}"
                say(f"#{name(i)} detection {score}: {entry['label']}", kind=None)
            if new and time.monotonic() - last > SAVE_EVERY:
                write_labels(folder, new, **meta)
                last = time.monotonic()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        if new:
            write_labels(folder, new, **meta)
    summary["labelled"] = len(new)
    summary["scores"] = [e["detection"] for e in new.values() if e["detection"] is not None]
    summary["unread"] = sum(e["unread"] for e in new.values())
    return summary
