"""``describe --format latex -c FOLDER`` prints the tokenizer's map Text → V* too: a
subsection before ``\\end{document}``, in ASCII, whose cells read back (undoing the
escapes) as the Markdown section's rows of the same folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from tests.interop.hf_cases import CASES, Case, make
from tests.tokenizer.family_files import write_family

from glassgpt.cli import main
from glassgpt.tokenizer.family import read_family

UNDO = [(r"\textbar{}\allowbreak{}", "|"), (r"\textbackslash{}", "\\"), (r"\textquotesingle{}", "'"),
        (r"\textless{}", "<"), (r"\textgreater{}", ">"), (r"$\to$", "→"), (r"\ldots{}", "…"),
        (r"\textvisiblespace{}", "▁"), (r"\^{}", "^"), (r"\~{}", "~"), (r"\{", "{"), (r"\}", "}"),
        (r"\_", "_"), (r"\%", "%"), (r"\&", "&"), (r"\#", "#"), (r"\$", "$")]  # fmt: skip


def untex(cell: str) -> str:
    out, i = [], 0
    while i < len(cell):
        for tex, ch in UNDO:
            if cell.startswith(tex, i):
                out.append(ch)
                i += len(tex)
                break
        else:
            m = re.match(r"\[U\+([0-9A-F]{4,6})\]", cell[i:])
            out.append(chr(int(m.group(1), 16)) if m else cell[i])
            i += m.end() if m else 1
    return "".join(out)


@pytest.mark.parametrize("kind", ["llama3", "fallback"])
def test_latex_describes_the_tokenizer(kind: str, tmp_path: Path, capsys: Any) -> None:
    folder = write_family(kind, tmp_path / kind)
    base = CASES["llama-gqa2-llama3-untied"]
    kwargs = {**base.kwargs, "vocab_size": read_family(folder).n_vocab}
    make(Case(base.config, base.model, kwargs)).save_pretrained(folder)
    assert main(["describe", "-c", str(folder), "--format", "latex"]) == 0
    tex = capsys.readouterr().out
    assert tex.isascii() and tex.rstrip().endswith(r"\end{document}")
    section = tex.split(r"\subsection*{Tokenizer: Text $\to V^*$")[1]
    assert section.index(r"\end{tabular}") < section.index(r"\end{document}")
    cells = [line.removesuffix(r" \\").split(" & ", 1) for line in section.splitlines()
             if line.endswith(r" \\") and not line.startswith("stage")]  # fmt: skip
    assert main(["describe", "-c", str(folder)]) == 0
    md = capsys.readouterr().out.split("## Tokenizer: Text → V*")[1]
    rows = [r[2:-2].split(" | ", 1) for r in md.splitlines() if r.startswith("| ")]
    rows = [r for r in rows if r[0] not in ("stage |", "---")]
    assert [[untex(a), untex(b)] for a, b in cells] == [[a, b.replace("\\|", "|")] for a, b in rows]
    assert any("▁" in b or "\\p{L}" in b for _, b in rows)  # escapes were exercised
