"""The map Text → V* a tokenizer computes, stage by stage, for a reader (``tokenizer stats``,
``describe -c``):

    normalizer → pre-tokenizer (its pattern) → model (BPE merges, byte fallback) → specials

glassgpt's own tokenizers have no normalizer and add nothing to a prompt; a model family's
(:class:`~glassgpt.tokenizer.family.FamilyTokenizer`) says what its file does.
"""

from __future__ import annotations

from typing import Any

from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer


def _specials(tok: Any) -> str:
    names = sorted(getattr(tok, "special_tokens", {}) or {}, key=tok.special_tokens.get)
    more = f" … (+{len(names) - 8})" if len(names) > 8 else ""
    return f"{len(names)}: " + (", ".join(names[:8]) + more if names else "none")


def pipeline(tok: Any) -> list[tuple[str, str]]:
    """``(stage, what it does)`` in order.

    >>> pipeline(Tokenizer.bytes_only(special_tokens=["<|endoftext|>"]))[1:3]
    [('pre-tokenizer', 'Split(/gpt2/) then UTF-8 bytes'), ('model', 'byte-level BPE: 256 bytes, 0 merges')]
    >>> pipeline(CharTokenizer(["a", "b"]))[2]
    ('model', 'characters: 2, one id each')
    """
    if hasattr(tok, "pipeline"):
        return list(tok.pipeline())
    if isinstance(tok, CharTokenizer):
        model = f"characters: {len(tok.chars)}, one id each"
        pre = "none"
    elif isinstance(tok, Tokenizer):
        shown = tok.pattern_name or tok.pattern
        pre = "UTF-8 bytes" if tok.pattern is None else f"Split(/{shown}/) then UTF-8 bytes"
        model = f"byte-level BPE: 256 bytes, {len(tok.merges)} merges"
    else:
        return [("tokenizer", repr(tok))]
    return [
        ("normalizer", "none"),
        ("pre-tokenizer", pre),
        ("model", model),
        ("special tokens", _specials(tok)),
        ("added to prompts", "nothing"),
    ]


def pipeline_markdown(tok: Any) -> str:
    """:func:`pipeline` as a Markdown section.

    >>> print(pipeline_markdown(CharTokenizer(["a"])).splitlines()[0])
    ## Tokenizer: Text → V*, |V| = 1
    """
    bar = "\\|"  # a | inside a cell (a regex alternation)
    rows = "".join(f"| {stage} | {what.replace('|', bar)} |\n" for stage, what in pipeline(tok))
    head = f"## Tokenizer: Text → V*, |V| = {tok.n_vocab:,}\n\n| stage | |\n| --- | --- |\n"
    return head + rows


# LaTeX text mode, in ASCII (as ``describe --format latex`` is): the characters a pipeline's
# rows hold beyond ASCII by name, any other as its code point
_TEX = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "%": r"\%", "&": r"\&",
        "#": r"\#", "$": r"\$", "^": r"\^{}", "~": r"\~{}", "|": r"\textbar{}\allowbreak{}",
        "<": r"\textless{}", ">": r"\textgreater{}", "→": r"$\to$", "▁": r"\textvisiblespace{}",
        "…": r"\ldots{}", "'": r"\textquotesingle{}", "\n": r"\textbackslash{}n",
        "\r": r"\textbackslash{}r", "\t": r"\textbackslash{}t"}  # fmt: skip


def tex_text(text: str) -> str:
    r"""``text`` for LaTeX's text mode, in ASCII.

    >>> tex_text(r"Split(/\p{N}{1,3}|x/) → ▁é")
    'Split(/\\textbackslash{}p\\{N\\}\\{1,3\\}\\textbar{}\\allowbreak{}x/) $\\to$ \\textvisiblespace{}[U+00E9]'
    """
    return "".join(_TEX.get(ch, ch if ch.isascii() else f"[U+{ord(ch):04X}]") for ch in text)


def pipeline_latex(tok: Any) -> str:
    r""":func:`pipeline` as a LaTeX subsection (a two-column table), for ``describe --format
    latex``.

    >>> print(pipeline_latex(CharTokenizer(["a"])).splitlines()[0])
    \subsection*{Tokenizer: Text $\to V^*$, $|V| = 1$}
    """
    rows = [f"{tex_text(stage)} & {tex_text(what)} \\\\" for stage, what in pipeline(tok)]
    return "\n".join([
        rf"\subsection*{{Tokenizer: Text $\to V^*$, $|V| = {tok.n_vocab:,}$}}", "",
        r"\begin{tabular}{lp{0.7\linewidth}}", r"stage & \\ \hline", *rows, r"\end{tabular}", "",
    ])  # fmt: skip
