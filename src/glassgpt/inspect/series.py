"""Head scores over a series of checkpoints: how circuits form, read from saved weights.

For each checkpoint s of a series (a hub model's training revisions, as Pythia publishes
154 of them, or a run folder's ``step_*`` checkpoints) and every head (l, h):

    previous_token[s, l, h], duplicate_token[s, l, h], induction[s, l, h]

are :func:`glassgpt.inspect.head_scores` of that checkpoint, on the same repeated random
tokens for every s (its defaults: 8 sequences, seed 0), so the curves compare like with like
and equal what ``train.inspect_every`` logs during training. The figure draws each score
against the step as ``circuits.png`` does (:mod:`glassgpt.train.inspection`): the four heads
highest at the last checkpoint in colour, the others grey, and a dashed line where the best
head's induction score rose most.

Series are written (:func:`expand_series`):

    hf:EleutherAI/pythia-70m@step{1000..143000..1000}   a range with a step (default 1)
    hf:EleutherAI/pythia-70m@step{0,512,1000,143000}    a list
    hf:EleutherAI/pythia-70m@step1000,step143000        revisions separated by commas
    runs/shakespeare                                    every step_* checkpoint of a run

Every revision is found in the hub cache before any is scored (one missing: one line naming
it); a step is the number in the revision's name (``step3000`` → 3000), or its place in
the list for a name without one.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from glassgpt.checkpoint import open_run, step_folders, step_of
from glassgpt.checkpoint.hub import is_hub_id, resolve_hub_id
from glassgpt.console import say
from glassgpt.errors import GlassError
from glassgpt.inspect.heads import head_scores
from glassgpt.model.probes import SCORES
from glassgpt.storage import atomic_write
from glassgpt.train.inspection import TAB, phase_change

_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?$")
_NUMBER = re.compile(r"(\d+)(?!.*\d)")
MAX_POINTS = 1000  # a range that expands further is surely a typo


@dataclass(frozen=True)
class Point:
    """One checkpoint of a series: what ``open_run`` opens (``source``, ``step`` for a run
    folder's step) and the training step it is drawn at."""

    label: str
    step: int
    source: str
    run_step: int | None = None


def expand_braces(text: str) -> list[str]:
    """Every string a brace expression names: ``{a..b}``, ``{a..b..k}`` or ``{x,y}``.

    >>> expand_braces("step{1000..3000..1000}")
    ['step1000', 'step2000', 'step3000']
    >>> expand_braces("r{1,5}b{0..1}")
    ['r1b0', 'r1b1', 'r5b0', 'r5b1']
    """
    m = _BRACES.search(text)
    if m is None:
        return [text]
    body, head, tail = m[1], text[: m.start()], text[m.end() :]
    r = _RANGE.match(body)
    if r:
        lo, hi, by = int(r[1]), int(r[2]), int(r[3] or 1)
        if by < 1:
            raise GlassError(f"{{{body}}}: the step of a range must be ≥ 1")
        if (abs(hi - lo) // by) + 1 > MAX_POINTS:
            raise GlassError(f"{{{body}}}: more than {MAX_POINTS} checkpoints; give a larger step")
        items = [str(i) for i in range(lo, hi + (1 if hi >= lo else -1), by if hi >= lo else -by)]
    elif "," in body:
        items = [i.strip() for i in body.split(",")]
    else:
        raise GlassError(
            f"{{{body}}}: not a range or a list; write {{1000..143000..1000}} or {{1000,2000}}"
        )
    if any(not i for i in items):
        raise GlassError(f"{{{body}}}: an empty item")
    return [out for i in items for out in expand_braces(head + i + tail)]


def expand_series(spec: str) -> list[Point]:
    """The checkpoints ``spec`` names, in training order (see the module docstring).

    >>> [(p.source, p.step) for p in expand_series("hf:org/m@step{0..2000..1000}")]
    [('hf:org/m@step0', 0), ('hf:org/m@step1000', 1000), ('hf:org/m@step2000', 2000)]
    >>> [p.step for p in expand_series("hf:org/m@main,dev,step5")]
    [0, 1, 5]
    """
    if not is_hub_id(spec):
        return _run_series(spec)
    repo, at, revisions = spec.partition("@")
    if not at:
        raise GlassError(
            f"{spec}: a series of revisions needs @REVISIONS, e.g. {spec}@step{{1000..3000..1000}}"
        )
    names = [r for part in _split_top(revisions) for r in expand_braces(part)]
    if not names:
        raise GlassError(f"{spec}: no revision named")
    points = []
    for i, name in enumerate(dict.fromkeys(names)):
        number = _NUMBER.search(name)
        points.append(Point(name, int(number[1]) if number else i, f"{repo}@{name}"))
    return sorted(points, key=lambda p: p.step)


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside braces."""
    parts, depth, cur = [], 0, ""
    for c in text:
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    return [p for p in [*parts, cur] if p]


def _run_series(spec: str) -> list[Point]:
    """Every ``step_*`` checkpoint of a run folder (or of its ``ckpt`` folder), oldest first."""
    root = Path(spec)
    for folder in (root / "ckpt", root):
        steps = sorted(step_of(f) for f in step_folders(folder)) if folder.is_dir() else []
        if steps:
            return [Point(f"step {s}", s, spec, run_step=s) for s in steps]
    raise GlassError(
        f"{spec}: no step_* checkpoints in it (a series is a run folder, or "
        f"hf:ORG/NAME@step{{1000..143000..1000}})"
    )


def check_available(points: Sequence[Point]) -> None:
    """Raise (one line naming it) unless every hub revision is in the cache or downloadable."""
    for p in points:
        if is_hub_id(p.source):
            resolve_hub_id(p.source)


def scores_over_checkpoints(
    points: Sequence[Point],
    *,
    seq_len: int | None = None,
    opener: Callable[..., Any] = open_run,
    device: Any = None,
) -> list[dict[str, Any]]:
    """One record per checkpoint: ``{"step", "checkpoint", "induction/LlHh": …, …}`` (every
    score of every head, as ``train.inspect_every`` logs them)."""
    check_available(points)
    records = []
    for i, p in enumerate(points):
        say(f"[{i + 1}/{len(points)}] {p.source}" + (f" step {p.run_step}" if p.run_step else ""))
        extra = {} if p.run_step is None else {"step": p.run_step}
        run = opener(p.source, device=device, **extra)
        scores = head_scores(run.model, seq_len=seq_len)
        record: dict[str, Any] = {"step": p.step, "checkpoint": p.label}
        for name, values in scores.as_dict().items():
            for (layer, head), v in _cells(values):
                record[f"{name}/L{layer}H{head}"] = v
        records.append(record)
    return records


def _cells(values: Any) -> list[tuple[tuple[int, int], float]]:
    L, H = values.shape
    return [((layer, h), float(values[layer, h])) for layer in range(L) for h in range(H)]


def series_of(records: Sequence[dict[str, Any]], score: str) -> dict[tuple[int, int], list]:
    """``{(layer, head): [(step, value), …]}`` of one score.

    >>> series_of([{"step": 5, "induction/L1H0": 0.5}], "induction")
    {(1, 0): [(5, 0.5)]}
    """
    out: dict[tuple[int, int], list] = {}
    key = re.compile(rf"^{score}/L(\d+)H(\d+)$")
    for r in records:
        for k, v in r.items():
            m = key.match(k)
            if m:
                out.setdefault((int(m[1]), int(m[2])), []).append((r["step"], float(v)))
    return out


TITLES = {
    "induction": "induction score per head",
    "previous_token": "previous-token score per head",
    "duplicate_token": "duplicate-token score per head",
}


def series_figure(records: Sequence[dict[str, Any]], title: str) -> bytes:
    """PNG: each head score against the step, one panel per score."""
    fig = Figure(figsize=(15, 4.6))  # no pyplot: no global figure, no backend chosen
    axes = fig.subplots(1, len(SCORES), sharex=True)
    steps = sorted({r["step"] for r in records})
    bump = phase_change(series_of(records, "induction"))
    panels = ("induction", "previous_token", "duplicate_token")
    tops = {name: _top(series_of(records, name)) for name in panels}
    named = list(dict.fromkeys(k for name in panels for k in tops[name]))
    colors = {k: TAB[i % len(TAB)] for i, k in enumerate(named)}  # a head's colour everywhere
    for ax, name in zip(axes, panels, strict=True):
        lines = series_of(records, name)
        for k in sorted(lines, key=lambda k: k in tops[name]):  # the named heads last, on top
            top = k in tops[name]
            color = colors[k] if top else "0.6"
            ax.plot(*zip(*lines[k]), "o-" if top else "-", ms=3, lw=1.6 if top else 0.6,
                    alpha=1.0 if top else 0.35, color=color,
                    label=f"L{k[0]}H{k[1]}" if top else None)  # fmt: skip
        ax.set_title(TITLES[name])
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
        if lines:
            ax.legend(fontsize=8, loc="best")
        if bump is not None:
            ax.axvline(bump, color="tab:red", ls="--", lw=0.8, alpha=0.7)
        if steps and steps[0] > 0 and steps[-1] / steps[0] >= 100:
            ax.set_xscale("log")  # Pythia's series spans 1 … 143000
    axes[0].set_ylabel("mean attention weight")
    if bump is not None:
        axes[0].annotate(f"step {bump}", (bump, 0.95), xytext=(4, 0),
                         textcoords="offset points", color="tab:red", fontsize=9)  # fmt: skip
    fig.suptitle(f"{title}: head scores over {len(steps)} checkpoints")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _top(lines: dict[tuple[int, int], list], n: int = 4) -> list[tuple[int, int]]:
    """The n heads with the highest score at the last checkpoint."""
    return sorted(lines, key=lambda k: lines[k][-1][1], reverse=True)[:n]


def write_series(
    records: Sequence[dict[str, Any]], output: str | os.PathLike[str], title: str
) -> tuple[Path, Path]:
    """``output`` (PNG) and the records beside it as JSON (same name, ``.json``)."""
    png = Path(output)
    if png.suffix.lower() != ".png":
        png = png.with_suffix(".png")
    data = json.dumps({"series": title, "checkpoints": list(records)}, indent=1).encode()
    atomic_write(png.with_suffix(".json"), data)
    atomic_write(png, series_figure(records, title))
    return png, png.with_suffix(".json")
