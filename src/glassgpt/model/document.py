"""A document of equations, prose and tables, rendered as Markdown or as LaTeX.

Each formula is a :class:`Math` carrying both a Unicode form (read in a terminal) and a
LaTeX form; a :class:`Section` holds a title, a paragraph, equations and a table.
``glassgpt.model.describe`` builds the sections of a config's function; this module only
renders them. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Math:
    """One formula in two notations; ``tex`` may hold ``&`` alignment points."""

    text: str
    tex: str


Cell = str | Math


@dataclass
class Section:
    """A titled part: a paragraph (text and inline formulas), equations, a table."""

    title: str
    prose: list[Cell] = field(default_factory=list)  # a paragraph: text and inline formulas
    equations: list[Math] = field(default_factory=list)
    header: tuple[str, ...] = ()
    rows: list[tuple[Cell, ...]] = field(default_factory=list)


def markdown(sections: list[Section]) -> str:
    """The sections as Markdown: Unicode equations in ``text`` blocks, tables as pipes."""
    out: list[str] = []
    for i, s in enumerate(sections):
        out += ["#" * (1 if i == 0 else 2) + " " + s.title, ""]
        if s.prose:
            out += ["".join(f"`{p.text}`" if isinstance(p, Math) else p for p in s.prose), ""]
        if s.equations:
            out += ["```text", *(e.text for e in s.equations), "```", ""]
        if s.header:
            out.append("| " + " | ".join(s.header) + " |")
            out.append("|" + "|".join(" --- " for _ in s.header) + "|")
            for row in s.rows:
                out.append(
                    "| "
                    + " | ".join(f"`{c.text}`" if isinstance(c, Math) else c for c in row)
                    + " |"
                )
            out.append("")
    return "\n".join(out)


_TEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "_": r"\_",
    "%": r"\%",
    "&": r"\&",
    "#": r"\#",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "^": r"\^{}",
    "~": r"\~{}",
}


_TEX_SYMBOLS = {"×": r"$\times$", "·": r"$\cdot$", "…": r"\ldots{}", "≈": r"$\approx$"}


def tex_escape(text: str) -> str:
    r"""Text for LaTeX's text mode.

    >>> tex_escape("blocks.{l}.attn.W_Q: 10%")
    'blocks.\\{l\\}.attn.W\\_Q: 10\\%'
    """
    return "".join(_TEX_ESCAPES.get(ch, _TEX_SYMBOLS.get(ch, ch)) for ch in text)


def latex(sections: list[Section]) -> str:
    """The sections as a standalone LaTeX document (equations in ``align*``)."""
    out = [r"\documentclass{article}", r"\usepackage{amsmath,amssymb}", r"\begin{document}", ""]
    for i, s in enumerate(sections):
        out += [(r"\section*{" if i == 0 else r"\subsection*{") + tex_escape(s.title) + "}", ""]
        if s.prose:
            out += [
                "".join(f"${p.tex}$" if isinstance(p, Math) else tex_escape(p) for p in s.prose),
                "",
            ]
        if s.equations:
            out += [
                r"\begin{align*}",
                " \\\\\n".join(e.tex for e in s.equations),
                r"\end{align*}",
                "",
            ]
        if s.header:
            out += [
                r"\begin{tabular}{l" + "r" * (len(s.header) - 1) + "}",
                " & ".join(tex_escape(h) for h in s.header) + r" \\ \hline",
            ]
            for row in s.rows:
                out.append(
                    " & ".join(f"${c.tex}$" if isinstance(c, Math) else tex_escape(c) for c in row)
                    + r" \\"
                )
            out += [r"\end{tabular}", ""]
    out.append(r"\end{document}")
    return "\n".join(out) + "\n"
