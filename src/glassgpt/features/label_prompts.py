"""The words of ``glassgpt sae label``: its two prompts, the reading of the answers, and the
detection score.

    explain:   top contexts, the active tokens marked <<so>>  →  a short label
    detect:    the label and held-out contexts, half activating (held-out top contexts), half
               not (random contexts where the feature is 0 throughout), shuffled  →  one 1/0
               per context
    detection  = (TPR + TNR) / 2, the balanced accuracy of those answers; an answer that cannot
               be read counts as wrong (a "no" for an activating context, a "yes" for the
               others), so a model that answers nothing useful scores 0, one that says "no"
               to everything 0.5 and a perfect one 1

Detection follows EleutherAI's delphi (Paulo et al. 2024, *Automatically Interpreting Millions
of Features in Large Language Models*): the scorer sees the contexts as plain text, without the
marks, so it must find the feature from the label alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

LABEL_CHARS = 200  # a label is one short phrase; a rambling answer is cut here
SYSTEM = (
    "You explain features of a language model: units that are active on some tokens and not "
    "on others. Be short and concrete."
)


def render(texts: Sequence[str], acts: Sequence[float] | None = None) -> str:
    """One context on one line: its tokens' texts joined, each run of tokens where the feature
    is active (``acts`` > 0) marked ``<<…>>``; newlines shown as ``\\n``.

    >>> render(["The", " cat", " sat", "\\n"], [0.0, 1.5, 0.2, 0.0])
    'The<< cat sat>>\\\\n'
    >>> render(["a", "b"])
    'ab'
    """
    out, inside = [], False
    for j, t in enumerate(texts):
        on = acts is not None and acts[j] > 0
        if on != inside:
            out.append("<<" if on else ">>")
            inside = on
        out.append(t.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r"))
    return "".join(out) + (">>" if inside else "")


def explain_messages(contexts: Sequence[str]) -> list[dict[str, str]]:
    """The chat asking for a label, from rendered (marked) contexts."""
    shown = "\n".join(f"Excerpt {n}: {c}" for n, c in enumerate(contexts, 1))
    ask = (
        "Below are excerpts of text on which one feature of a language model is strongly "
        "active. The tokens where it is active are marked <<like this>>.\n\n"
        f"{shown}\n\n"
        "What does the feature respond to? Answer with one short phrase (at most 12 words), "
        "and nothing else."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]


def detect_messages(label: str, contexts: Sequence[str]) -> list[dict[str, str]]:
    """The chat asking, for each plain context, whether the feature labelled ``label`` is
    active in it."""
    shown = "\n".join(f"{n}. {c}" for n, c in enumerate(contexts, 1))
    ask = (
        f'A feature of a language model is described as: "{label}".\n\n'
        f"Here are {len(contexts)} numbered excerpts of text. Some of them contain tokens on "
        "which this feature is active; the others do not.\n\n"
        f"{shown}\n\n"
        f"For each excerpt in order, answer 1 if the feature is active in it and 0 if not. "
        f"Reply with a list of {len(contexts)} numbers only, such as "
        f"[{', '.join('1' if n % 3 == 0 else '0' for n in range(len(contexts)))}]."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]


def _said(answer: str) -> str:
    """The answer without a reasoning model's ``<think>…</think>`` (an unclosed one: all of it).

    >>> _said("<think>[1, 1]</think>[0, 1]"), _said("<think>still thinking")
    ('[0, 1]', '')
    """
    return re.sub(r"<think>.*?(?:</think>|\Z)", "", answer, flags=re.S)


def parse_label(answer: str) -> str:
    """The label in an explanation answer: its first non-empty line, without a leading
    "Explanation:" or "Label:", quotes and markup; cut to :data:`LABEL_CHARS`; "" when there is
    none.

    >>> parse_label('Explanation: "the word cat"\\nbecause …')
    'the word cat'
    >>> parse_label("  **Closing brackets.**  "), parse_label("\\n \\n")
    ('Closing brackets.', '')
    """
    for line in _said(answer).splitlines():
        line = re.sub(r"^\s*(?:[-*#>]+\s*)?(?:explanation|label|feature|answer)\s*:\s*", "", line, flags=re.I)  # fmt: skip
        line = line.strip().strip("*_`").strip().strip("\"'“”‘’").strip()
        if line:
            return line[:LABEL_CHARS]
    return ""


_WORDS = {"1": True, "yes": True, "true": True, "y": True, "0": False, "no": False, "false": False, "n": False}  # fmt: skip


def parse_answers(answer: str, n: int) -> list[bool | None]:
    """The ``n`` yes/no answers in ``answer``: the last bracketed list of exactly ``n`` items
    each 1/0 (or yes/no, true/false); else ``n`` lines each ending in one of them (numbered
    or not); else ``n`` Nones (not read).

    >>> parse_answers("Sure! [1, 0, 1]", 3)
    [True, False, True]
    >>> parse_answers("1: yes\\n2: no\\n3. Yes", 3)
    [True, False, True]
    >>> parse_answers("[1, 0]", 3), parse_answers("the cat sat", 2)
    ([None, None, None], [None, None])
    """
    answer = _said(answer)
    for items in reversed(re.findall(r"\[([^\[\]]*)\]", answer)):
        words = [w.strip().strip("\"'").lower() for w in items.split(",")] if items.strip() else []
        if len(words) == n and all(w in _WORDS for w in words):
            return [_WORDS[w] for w in words]
    lines = [m.group(1).lower() for line in answer.splitlines()
             if (m := re.fullmatch(r"\s*(?:\w+\s*)?(?:\d+\s*[.):\-]\s*)?(yes|no|true|false|1|0)\W*", line, re.I))]  # fmt: skip
    if len(lines) == n:
        return [_WORDS[w] for w in lines]
    return [None] * n


def detection(truth: Sequence[bool], said: Sequence[bool | None]) -> float | None:
    """The balanced accuracy (TPR + TNR) / 2 of the answers ``said`` against ``truth``
    (activating or not); an answer not read (None) is wrong. One class alone: its rate; no
    contexts: None.

    >>> t = [True, True, False, False]
    >>> detection(t, t), detection(t, [False] * 4), detection(t, [not x for x in t])
    (1.0, 0.5, 0.0)
    >>> detection(t, [True, None, None, False]), detection([], [])
    (0.5, None)
    """
    rates = []
    for cls in (True, False):
        seen = [s for x, s in zip(truth, said) if x is cls]
        if seen:
            rates.append(sum(s is cls for s in seen) / len(seen))
    return sum(rates) / len(rates) if rates else None
