"""A self-contained HTML page: text escaped, tables, and PNG figures as base64 data URIs.

The page loads nothing from elsewhere (no scripts, no fonts, no stylesheets by URL), so it
opens the same from a file, an e-mail attachment or a web server.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 1.5em auto; padding: 0 1em;
       color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.85em; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .tok { font-family: ui-monospace, monospace; white-space: pre; }
.tok { background: #eef; border-radius: 3px; padding: 0 2px; }
figure { margin: 0.8em 0; overflow-x: auto; }
figure img { max-width: none; }  /* at its own size: shrunk, 9 pt labels would be unreadable */
figcaption { font-size: 0.85em; color: #555; }
p.note { color: #555; font-size: 0.9em; }
.scroll { overflow-x: auto; }
table.heat td, table.heat th { text-align: center; border-color: #fff; padding: 2px 4px; }
table.heat td { font-family: ui-monospace, monospace; white-space: pre; }
table.heat td small { display: block; font-size: 0.75em; opacity: 0.8; }
"""


def esc(text: object) -> str:
    """HTML-escaped ``str(text)``.

    >>> esc("<b> & 'x'")
    '&lt;b&gt; &amp; &#x27;x&#x27;'
    """
    return html.escape(str(text), quote=True)


def tok(text: str) -> str:
    """A token's text in a visible box (whitespace kept)."""
    return f'<span class="tok">{esc(text)}</span>'


def figure(png: bytes, caption: str) -> str:
    """An <img> with the PNG inline as a data URI, and its caption."""
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(caption)}">'
        f"<figcaption>{esc(caption)}</figcaption></figure>"
    )


def cell(value: object) -> str:
    """One <td>: numbers right-aligned with 4 significant digits; raw HTML if given as Raw."""
    if isinstance(value, Raw):
        return f"<td>{value.html}</td>"
    if isinstance(value, float):
        return f'<td class="num">{value:.4g}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{esc(value)}</td>"


class Raw:
    """Already-built HTML for a table cell."""

    def __init__(self, html_text: str) -> None:
        self.html = html_text


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A table with a header row; each value rendered by :func:`cell`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heat_table(
    rows: Sequence[str], cols: Sequence[str], cells: Sequence[Sequence[tuple[str, float]]]
) -> str:
    """A table of (text, p) cells, each shaded by p in [0, 1] (white → blue), p shown below.

    >>> heat_table(["L0"], ["a"], [[("b", 0.5)]]).count("<td")
    1
    """
    head = "<th></th>" + "".join(f"<th>{tok(c)}</th>" for c in cols)
    body = []
    for name, row in zip(rows, cells):
        tds = []
        for text, p in row:
            shade = ",".join(str(round(255 + (b - 255) * p)) for b in (30, 64, 175))
            ink = "#fff" if p > 0.55 else "#111"
            tds.append(f'<td style="background:rgb({shade});color:{ink}">{esc(text)}'
                       f"<small>{100 * p:.0f}%</small></td>")  # fmt: skip
        body.append(f"<tr><th>{esc(name)}</th>{''.join(tds)}</tr>")
    rows_html = "".join(body)
    return f'<div class="scroll"><table class="heat"><tr>{head}</tr>{rows_html}</table></div>'


def section(title: str, *parts: str, anchor: str = "") -> str:
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{''.join(parts)}</section>"


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def page(title: str, body: Sequence[str]) -> str:
    """The whole document."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{esc(title)}</h1>{''.join(body)}</body></html>\n"
    )
