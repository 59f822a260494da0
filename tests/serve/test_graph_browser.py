"""The Graph tab in real headless Chromium against a live server with per-layer transcoders
(layer 1's with feature pages and labels): the graph draws, hovering a feature shows its label
and top activations, clicking opens its page, and an intervention changes the next-token bars.
Skipped without Playwright or /usr/bin/chromium."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.serve.conftest import CHROMIUM, Server, open_page, start_server, tiny_run
from tests.serve.test_graph import transcoder_folders

from glassgpt.features.pages import compute_pages, save_pages, windows
from glassgpt.features.replacement import open_transcoders
from glassgpt.features.sae import SAE
from glassgpt.train.evaluate import ArrayStream

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"
    ),
    pytest.mark.slow,
]
TEXT = ("the cat sat on the mat. the dog ran far, and then it slept. " * 20).strip()
PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def gserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    root = tmp_path_factory.mktemp("graphbrowser")
    run = tiny_run(root / "tiny")
    model, tok = load(run)
    folder = transcoder_folders(root / "tc", model.config.d_model)
    sae = SAE.load(folder / "L1").float().eval()
    stream = ArrayStream(np.array(tok.encode(TEXT), dtype=np.int64))
    pages = compute_pages(model, sae, windows(stream, seq_len=32, batch=8, tokens=2048), top=4, before=5, after=1)  # fmt: skip
    save_pages(folder / "L1" / "features.safetensors", pages)
    torch.set_num_threads(1)
    app = create_app(model, tok, name="tiny", slots=2, transcoders=open_transcoders(folder))
    server, thread, url = start_server(app)
    yield Server(url, app, run)
    server.should_exit = True
    thread.join(timeout=10)


def bars(page: Any) -> list[str]:
    return page.eval_on_selector_all("#graph-dist .num", "ns => ns.map(n => n.textContent)")


def test_graph_tab(gserve: Server, browser: Any) -> None:
    problems: list[str] = []
    page = open_page(gserve.url, browser, problems)
    page.wait_for_selector("#tab-graph:not([hidden])")
    for sel, value in (("#graph-prompt", PROMPT), ("#graph-node-t", "1"), ("#graph-edge-t", "1")):
        page.eval_on_selector(sel, "(e, v) => { e.value = v; }", value)
    page.click("#tab-graph")  # the first visit traces the prompt
    page.wait_for_selector("#graph-svg .node.feature")
    assert page.locator("#graph-svg .node").count() > page.locator("#graph-svg .node.feature").count() > 0  # fmt: skip
    assert page.locator("#graph-svg text.tok").count() == len(PROMPT)  # the tokens along the bottom
    assert page.locator("#graph-svg .node.logit").count() >= 1
    assert "replacement score" in page.inner_text("#graph-stats")

    # hover a layer-1 feature at the last position: its label and top activations; click: its page
    node = page.locator(
        f"#graph-svg .node.feature[data-id^='1_'][data-id$='_{len(PROMPT) - 1}']"
    ).first
    node_id = node.get_attribute("data-id")
    node.hover()
    page.wait_for_function("() => document.querySelector('#graph-tip').textContent.includes('top activations')")  # fmt: skip
    _, index, _ = node_id.split("_")
    assert f"feature one-{index}" in page.inner_text("#graph-tip")
    node.click()
    page.wait_for_selector("#graph-page .contexts .ctx")
    assert page.inner_text("#graph-node-title").startswith(f"feature L1 #{index}")
    assert "promotes" in page.inner_text("#graph-page")

    # select it, scale by 1 (no change), then clamp it high: the bars move
    page.click("#graph-select-one")
    page.select_option("#graph-mode", "scale")
    page.fill("#graph-value", "1")
    page.click("#graph-run")
    page.wait_for_selector("#graph-dist[data-runs='1']")
    same = bars(page)
    for text in same:
        now, was = re.fullmatch(r"([\d.]+)% \(was ([\d.]+)%\)", text).groups()
        assert now == was
    page.select_option("#graph-mode", "clamp")
    page.fill("#graph-value", "40")
    page.click("#graph-run")
    page.wait_for_selector("#graph-dist[data-runs='2']")
    moved = bars(page)
    assert any(a != b for a, b in (re.fullmatch(r"([\d.]+)% \(was ([\d.]+)%\)", t).groups() for t in moved))  # fmt: skip
    assert float(page.inner_text("#graph-kl").split("=")[1].split()[0]) > 0
    assert f"sel={node_id}" in page.evaluate("location.hash")

    # pin it, group it into a supernode: the downloaded view and the URL both carry them
    page.click("#graph-pin")
    page.fill("#graph-super-name", "the end")
    page.click("#graph-group")
    assert page.text_content("#graph-svg .super-name") == "the end"
    with page.expect_download() as got:
        page.click("#graph-download")
    saved = Path(got.value.path())
    view = json.loads(saved.read_text())
    assert view["qParams"]["pinnedIds"] == [node_id] and view["qParams"]["supernodes"] == [["the end", node_id]]  # fmt: skip
    assert len(view["nodes"]) == page.locator("#graph-svg .node").count()
    shared = page.url
    page.goto("about:blank")
    page.goto(shared)  # the same view from its URL alone
    page.wait_for_selector(f"#graph-svg .node.pinned.selected[data-id='{node_id}']")
    assert page.text_content("#graph-svg .super-name") == "the end"
    # and from the downloaded file, uploaded
    page.set_input_files("#graph-upload", str(saved))
    page.wait_for_function("() => document.querySelector('#graph-title').textContent.startsWith('upload:')")  # fmt: skip
    page.wait_for_selector(f"#graph-svg .node.pinned[data-id='{node_id}']")
    assert page.text_content("#graph-svg .super-name") == "the end"
    assert problems == []
