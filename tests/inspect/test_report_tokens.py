"""How tokens and labels read in the inspect report and the figures of ``patch``: byte-level
tokens that split a character as ``<0xE2>``, whitespace made visible on one line, one display
(``glassgpt.tokenizer.display.visible``) for chips, headers, cells and titles, and tick labels
large enough to read (9 pt at the PNGs' 90 dpi, measured on the drawn text)."""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from matplotlib.figure import Figure

from glassgpt.checkpoint import Run
from glassgpt.cli import main
from glassgpt.cli import patch as cli_patch
from glassgpt.inspect import figures, patch_figures
from glassgpt.inspect.report import build_report
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import Tokenizer

# "—" is in the training text: BPE learns its first two bytes as one token (<0xE2><0x80>);
# "€" is not: it stays three byte tokens, none of them a whole character.
TRAIN = ("def f():\n   return 1\n" * 20) + ("a — b — c " * 20)
PROMPT = "a — b €\n   return"
INDENT = "\n  "  # one token: the prediction every lens cell is made to show
DPI = 90  # the PNGs' resolution (figures.to_png)
MIN_PX = 9 * DPI / 72  # a 9 pt label's size in pixels


def bpe_model(tok: Tokenizer, favourite: int | None) -> GPT:
    """A random model; its unembedding bias makes ``favourite`` the top prediction."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=32, d_model=16, n_layers=2, n_heads=2,
                    unembed_bias=True)  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if name.endswith(".w") else 0.0, 0.4)
        if favourite is not None:
            model.unembed.b_U[favourite] = 50.0
    return model


@contextlib.contextmanager
def drawn() -> Iterator[list[Figure]]:
    """Every Figure rendered inside the block (``to_png`` wrapped where it is called)."""
    out: list[Figure] = []
    original = figures.to_png

    def keep(fig: Figure) -> bytes:
        out.append(fig)
        return original(fig)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "to_png", keep)
        mp.setattr(patch_figures, "to_png", keep)
        yield out


@pytest.fixture(scope="module")
def report() -> SimpleNamespace:
    tok = Tokenizer.train(TRAIN, 256 + 30)
    (indent,) = tok.encode(INDENT)
    model = bpe_model(tok, indent)
    with drawn() as figs:
        page = build_report(model, tok, PROMPT)
    return SimpleNamespace(html=page, figures=figs, tokenizer=tok)


def chips(page: str) -> list[str]:
    """The prompt's tokens as the overview shows them."""
    line = re.search(r"<p>Prompt \(\d+ tokens\): (.*?)</p>", page)
    assert line is not None
    return [html.unescape(t) for t in re.findall(r'<span class="tok">(.*?)</span>', line[1])]


def lens_table(page: str) -> tuple[list[str], list[str]]:
    """The logit-lens table: its header's tokens and the text of every cell."""
    table = re.search(r'<table class="heat">(.*?)</table>', page, re.S)
    assert table is not None
    head = re.search(r"<tr>(.*?)</tr>", table[1], re.S)
    assert head is not None
    header = [html.unescape(t) for t in re.findall(r'<span class="tok">(.*?)</span>', head[1])]
    cells = [html.unescape(t) for t in re.findall(r"<td [^>]*>(.*?)<small>", table[1], re.S)]
    return header, cells


def test_bytes_that_split_a_character_show_as_bytes_never_as_replacement(report) -> None:
    shown = chips(report.html)
    assert "\ufffd" not in report.html
    assert "<0xE2><0x82><0xAC>" in "".join(shown)  # "€", three byte tokens
    for fig in report.figures:  # the figures' labels too
        for text in fig.findobj(lambda a: hasattr(a, "get_text")):
            assert "\ufffd" not in text.get_text()


def test_lens_header_is_the_chips_and_whitespace_cells_are_visible_on_one_line(report) -> None:
    header, cells = lens_table(report.html)
    assert header == chips(report.html)  # "␣m" in both, not "m" in one
    assert "␣return" in header
    assert cells and set(cells) == {"\\n␣␣"}  # the favoured "\n  ", on one line, visible
    assert not any(re.search(r"\s", c) for c in cells)


def test_attribution_title_has_one_backslash(report) -> None:
    text = html.unescape(report.html)
    assert "parts of the logit of '\\n␣␣' (top prediction)" in text
    assert "\\\\n" not in text


def tick_labels(fig: Figure) -> Iterator[tuple[str, float, float]]:
    """(text, font size in pt, drawn height in px at DPI) of each visible tick label."""
    fig.set_dpi(DPI)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for label in [*ax.get_xticklabels(), *ax.get_yticklabels()]:
            if label.get_visible() and label.get_text():
                box = label.get_window_extent(renderer)
                across = box.width if label.get_rotation() % 180 else box.height
                yield label.get_text(), label.get_fontsize(), across


def test_every_tick_label_of_the_report_is_at_least_9_pt(report) -> None:
    assert len(report.figures) >= 10
    checked = 0
    for fig in report.figures:
        for text, size, px in tick_labels(fig):
            assert size >= 9 and px >= MIN_PX, (text, size, px)
            checked += 1
    assert checked > 100


def test_patch_figures_and_json_show_byte_tokens_and_readable_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = Tokenizer.train(TRAIN, 256 + 30)
    model = bpe_model(tok, None)

    def opened(path: object, **options: object) -> Run:
        return Run(Path(str(path)), "checkpoint", {"model": model.config.to_dict()},
                   model=model, tokenizer=tok)  # fmt: skip

    monkeypatch.setattr(cli_patch, "open_run", opened)
    out = tmp_path / "o"
    args = ["patch", "-c", str(tmp_path), "--clean", "a € b", "--corrupt", "a → b"]
    with drawn() as figs:
        code = main([*args, "--answer", " c", "--wrong", " b", "--what", "resid", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "patch.json").read_text(encoding="utf-8"))
    assert doc["clean_tokens"][2:5] == ["<0xE2>", "<0x82>", "<0xAC>"]
    assert "\ufffd" not in json.dumps(doc, ensure_ascii=False)
    (fig,) = figs
    labels = [text for text, _, _ in tick_labels(fig)]
    assert "<0x82>/<0x86>" in labels, labels
    for text, size, px in tick_labels(fig):
        assert size >= 9 and px >= MIN_PX, (text, size, px)
    title = fig.axes[0].get_title()
    assert "'␣c' − '␣b'" in title  # the tokens as shown everywhere, not repr's "' c'"
