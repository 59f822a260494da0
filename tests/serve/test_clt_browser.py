"""Both tabs of the explorer on a CLT in real headless Chromium: the Features tab (a layer
selector, "l/i" ids, the label, the decoder norms, search, steering by clamping or adding) and the Graph
tab's node (its writes in the hover tip, its page with a decoder norm per target layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.features.conftest import write_run
from tests.features.test_clt_everywhere import copy
from tests.features.test_clt_train import clt_train
from tests.serve.conftest import start_server

from glassgpt.checkpoint import load
from glassgpt.cli import main
from glassgpt.features.labels import write_labels
from glassgpt.features.replacement import open_transcoders
from glassgpt.serve.app import create_app
from glassgpt.serve.features import load_sae


@pytest.fixture(scope="module")
def clt_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny run, its topk CLT trained for 10 steps, with pages)."""
    root = tmp_path_factory.mktemp("cltbrowser")
    run = write_run(root / "run")
    assert clt_train(run, root / "c", tokens=2560) == 0
    assert main(["sae", "features", "-c", str(root / "c"), "--tokens", "2000", "--seq-len", "32",
                 "--top", "8", "--context", "4", "2"]) == 0  # fmt: skip
    return run, root / "c"


def test_both_tabs_show_a_clt_in_chromium(
    clt_run: tuple[Path, Path],
    browser: Any,
    tmp_path: Path,
) -> None:
    tiny_run, clt_dir = clt_run
    folder = copy(clt_dir, tmp_path)
    write_labels(folder, {"1/3": {"label": "Layer One Three", "detection": 0.7}}, model="m")
    model, tok = load(tiny_run)
    clt, pages = load_sae(str(folder), model)
    app = create_app(model, tok, name="tiny", slots=2, sae=clt, pages=pages, transcoders=open_transcoders(folder))  # fmt: skip
    server, thread, url = start_server(app)
    problems: list[str] = []
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: m.type == "error" and "status of 400" not in m.text and problems.append(m.text))  # fmt: skip
        page.on("pageerror", lambda e: problems.append(str(e)))
        # a 400 for a prompt longer than this n_ctx of 32 is not ours: the Inspect tab's default
        # prompt, and the Features tab's first one (the Explore tab's, before ours is typed)
        page.on("response", lambda r: r.status >= 400 and ("/api/features" in r.url or "/api/graph" in r.url)
                and "longer than the model's context" not in r.text()
                and problems.append(f"{r.status} {r.url} {r.text()[:200]}"))  # fmt: skip
        page.goto(url + "/")
        page.wait_for_selector("#tab-features:not([hidden])")
        # a prompt within this run's n_ctx of 32 (the tab otherwise starts from the Explore
        # tab's prompt, which may be longer: a 400 on the status line, not this test's subject)
        page.eval_on_selector("#feat-prompt", "e => { e.value = 'To be, or not'; }")
        page.click("#tab-features")
        page.wait_for_selector("#feat-layer")
        page.select_option("#feat-layer", "1")
        page.fill("#feat-id", "3")
        page.dispatch_event("#feat-id", "change")
        page.wait_for_function("() => document.querySelector('#feat-title').textContent === '#1/3'")
        page.wait_for_selector("#feat-norms")
        assert "Layer One Three" in page.inner_text("#feat-label")
        assert page.locator("#feat-norms tr").count() == 1  # layer 1 writes to layer 1 only
        assert sorted(page.eval_on_selector_all("#feat-mode option", "os => os.map(o => o.value)")) == ["add", "clamp"]  # fmt: skip
        page.select_option("#feat-mode", "add")
        page.wait_for_function("() => document.querySelector('#feat-eq').textContent.includes('f1/3 ← f1/3 +')")  # fmt: skip
        page.fill("#feat-query", "1/3")
        page.wait_for_selector("#feat-results .result")
        assert page.inner_text("#feat-results .result b") == "#1/3"
        page.screenshot(path=str(tmp_path / "features-clt.png"), full_page=True)
        # the Graph tab: a layer-0 feature's page has its decoder norm on both layers
        for sel, value in (("#graph-prompt", "To be, or not"), ("#graph-node-t", "1"), ("#graph-edge-t", "1")):  # fmt: skip
            page.eval_on_selector(sel, "(e, v) => { e.value = v; }", value)
        page.click("#tab-graph")
        page.wait_for_selector("#graph-svg .node.feature[data-id^='0_']")
        node = page.locator("#graph-svg .node.feature[data-id^='0_']").first
        node.hover()
        page.wait_for_function("() => document.querySelector('#graph-tip').textContent.includes('top activations')")  # fmt: skip
        assert page.inner_text("#graph-tip").count("top activations") == 1
        assert "writes ‖W_dec‖: L0 " in page.inner_text("#graph-tip") and " · L1 " in page.inner_text("#graph-tip")  # fmt: skip
        node.click()
        page.wait_for_selector("#graph-page .norms")
        assert page.locator("#graph-page .norms tr").count() == 2
        assert "decoder norm per target layer" in page.inner_text("#graph-page")
        page.screenshot(path=str(tmp_path / "graph-clt.png"), full_page=True)
        assert problems == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)
