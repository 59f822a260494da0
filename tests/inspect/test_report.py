"""The HTML report: self-contained, every figure a decodable PNG, numbers from the model."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser
from types import SimpleNamespace

import matplotlib.image
import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.inspect import per_token_loss
from glassgpt.inspect.report import build_report, encode_prompt, write_report
from glassgpt.tokenizer import CharTokenizer


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, dict(attrs)))


@pytest.mark.slow
def test_report_is_self_contained_and_every_figure_decodes(report_html: SimpleNamespace) -> None:
    parser = Collect()
    parser.feed(report_html.html)
    tags = [t for t, _ in parser.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    for _, attrs in parser.tags:
        for key in ("src", "href"):
            assert not str(attrs.get(key, "")).startswith(("http:", "https:", "//", "file:"))
    images = [a["src"] for t, a in parser.tags if t == "img"]
    # loss, lens, attribution, 2 layers of patterns, 3 head scores, copying, 3 compositions,
    # QK and OV circuits
    assert len(images) == report_html.n_figures == 14
    for src in images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(src[len(prefix) :])))
        assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50
        assert pixels.std() > 0.01  # not a blank canvas
    ids = ["overview", "predictions", "lens", "attribution", "patterns", "heads", "circuits"]
    for anchor in ids:
        assert f'id="{anchor}"' in report_html.html


@pytest.mark.slow
def test_report_numbers_and_text_come_from_the_model(report_html: SimpleNamespace) -> None:
    html = report_html.html
    ids = encode_prompt(report_html.model, report_html.tokenizer, report_html.prompt)
    mean = float(per_token_loss(report_html.model, ids).mean())
    assert f"mean loss over {len(ids) - 1} predictions: {mean:.4f} nats" in html
    assert "&lt;" in html and "<sat>" not in html  # prompt text is escaped
    assert re.search(r"<td>blocks\.0\.attn\.z</td><td>\(1, 38, 2, 8\)</td>", html)
    assert "<td>ln_final.scale</td>" in html
    with torch.no_grad():
        logits = report_html.model(torch.tensor([ids]))[0, -1]
    assert f'<td>sum of all parts</td><td class="num">{float(logits.max()):.4g}</td>' in html


def _tiny(tiny: SimpleNamespace) -> tuple:
    tok = CharTokenizer.train(["abcdefgh "])
    model = tiny.model(tiny.config(n_vocab=tok.n_vocab, n_ctx=8), dtype=torch.float32)
    return model, tok


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 2}, r"layer 2 is out of range: the model has 2 layers \(0\.\.1\)"),
        ({"layer": -1}, r"layer -1 is out of range"),
        ({"layer": 0, "head": 3}, r"head 3 is out of range: each layer has 3 heads \(0\.\.2\)"),
        ({"head": 1}, r"--head needs --layer"),
        ({"names": ["blocks.0.attn.zz"]}, r"unknown activation 'blocks\.0\.attn\.zz'"),
        (
            {"prompt": "abcdefghab"},
            r"the prompt is 10 tokens, longer than the model's context n_ctx=8",
        ),
        ({"prompt": ""}, r"the prompt is empty"),
        ({"prompt": "xyz"}, r"character 'x'"),
    ],
)
def test_bad_input_is_refused_before_any_work(
    kwargs: dict, message: str, tiny: SimpleNamespace
) -> None:
    model, tok = _tiny(tiny)
    prompt = kwargs.pop("prompt", "abc")
    with pytest.raises(GlassError, match=message):
        build_report(model, tok, prompt, **kwargs)


def test_write_report_is_atomic_and_names_the_file_on_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = write_report(tmp_path / "sub" / "r.html", "<p>x</p>")
    assert out.read_text() == "<p>x</p>"
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]  # no temp file left
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(GlassError, match=r"file/r\.html: cannot write the report"):
        write_report(blocker / "r.html", "x")
