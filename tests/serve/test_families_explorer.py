"""The explorer (``glassgpt serve``'s page) on a tiny HF folder of each family, in headless
Chromium: the Explore view draws the lens, the DLA, the QK table and one attention map per
query head (H of them, also where H/G query heads share a key/value head), and the Patching
view its head grid; no script errors. Screenshots in ``GLASSGPT_SCREENSHOTS`` when set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.families import FAMILIES, family_folder  # (skips without transformers)
from tests.serve.conftest import CHROMIUM, open_page, start_server

import glassgpt
from glassgpt.serve.app import create_app

NO_CHROMIUM = "no /usr/bin/chromium (apt-get install chromium)"
pytestmark = [pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM), pytest.mark.slow]


@pytest.mark.parametrize("family", FAMILIES)
def test_explore_and_patching_views_on_each_family(family, browser: Any, tmp_path: Path) -> None:
    folder = family_folder(tmp_path / family, family)
    model, tok = glassgpt.load(folder)
    cfg = model.config
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    server, thread, url = start_server(create_app(model, tok, name=family, slots=2))
    try:
        problems: list[str] = []
        page = open_page(url, browser, problems)
        prompt = "the cat in the hat then the cat"
        n = len(tok.encode(prompt))
        page.fill("#prompt", prompt)
        page.wait_for_function(
            "n => document.querySelectorAll('#chips .chip').length === n "
            "&& document.querySelector('#status').textContent.includes('analysed')", arg=n
        )  # fmt: skip
        heads = f"{cfg.n_heads} heads" + (f" ({cfg.kv_heads} K/V)" if cfg.kv_heads < cfg.n_heads else "")  # fmt: skip
        assert f"{cfg.n_layers} layers × {heads} · " in page.text_content("#model-info")
        assert page.locator("#lens tr").count() == cfg.n_layers + 2  # header, embed, each layer
        assert page.locator("#grid canvas").count() == cfg.n_layers * cfg.n_heads  # H, not G
        page.wait_for_selector("#dla .label.total")
        page.wait_for_selector("#qk tr td")
        shots = Path(os.environ.get("GLASSGPT_SCREENSHOTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / f"explore-{family}.png"), full_page=True)
        assert (shots / f"explore-{family}.png").stat().st_size > 10_000

        page.click("#tab-patch")
        page.wait_for_function(  # the page's own example first: its effect shown
            "() => document.querySelector('#effect-where').textContent.includes('m̂')"
        )
        before = page.text_content("#effect-where")
        page.fill("#clean", "the cat in the hat")
        page.fill("#corrupted", "the cat in an hat")
        page.click("#patch-run")
        page.wait_for_function(
            "b => document.querySelector('#patch-status').textContent.includes('tokens each') "
            "&& document.querySelector('#effect-where').textContent !== b", arg=before
        )  # fmt: skip
        assert page.locator("#patch-heads td.pcell").count() == cfg.n_layers * cfg.n_heads
        page.screenshot(path=str(shots / f"patch-{family}.png"), full_page=True)
        assert problems == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        torch.set_num_threads(threads)
