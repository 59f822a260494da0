"""The explorer page in real headless Chromium, driven by Playwright, against a live server.

Skipped when Playwright for Python or Debian's ``/usr/bin/chromium`` is absent (browser
downloads are not possible in CI; ``apt-get install chromium`` provides it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.serve.conftest import Server, request

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"
    ),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield b
        b.close()


def chip_styles(page: Any) -> list[str]:
    return page.eval_on_selector_all("#chips .chip", "cs => cs.map(c => c.style.cssText)")


def test_explorer(live: Server, browser: Any, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(live.url + "/")
    page.wait_for_function(
        "() => document.querySelector('#status').textContent.includes('analysed')"
    )

    prompt = "abc abc abc"
    page.fill("#prompt", prompt)
    page.wait_for_function(
        "n => document.querySelectorAll('#chips .chip').length === n "
        "&& document.querySelector('#status').textContent.includes('analysed')",
        arg=len(prompt),
    )
    chips = page.locator("#chips .chip")
    assert chips.nth(4).get_attribute("title").startswith("#4 · id ")  # id and bytes on hover
    assert "bytes 61" in chips.nth(4).get_attribute("title")  # "a"

    # hovering a token colours what it attends to (and what attends to it)
    before = chip_styles(page)
    chips.nth(6).hover()
    page.wait_for_function("() => document.querySelector('#chips .chip.hovered') !== null")
    first = chip_styles(page)
    assert first != before and any("background" in s for s in first)
    page.locator("#chips .chip").nth(9).hover()
    page.wait_for_function(
        "() => document.querySelectorAll('#chips .chip')[9].classList.contains('hovered')"
    )
    assert chip_styles(page) != first

    # the temperature control redraws the distribution client-side
    dist = page.inner_text("#dist")
    page.eval_on_selector(
        "#temperature", "e => { e.value = 0.3; e.dispatchEvent(new Event('input')); }"
    )
    page.wait_for_function("d => document.querySelector('#dist').innerText !== d", arg=dist)
    assert page.inner_text("#temperature-out").startswith("0.30")

    # the lens is a table, attention is a grid of canvases, the DLA bars arrive
    cfg = live.app.state.glassgpt.model.config
    assert page.locator("#lens tr").count() == cfg.n_layers + 2  # header + embed + each layer
    assert page.locator("#grid canvas").count() == cfg.n_layers * cfg.n_heads
    page.wait_for_selector("#dla .label.total")
    page.wait_for_selector("#qk tr td")

    # generate streams a continuation over the API: the same text the API gives
    page.fill("#max-tokens", "20")
    page.fill("#seed", "5")
    page.click("#generate")
    page.wait_for_function("() => !document.querySelector('#generate').disabled "
                           "&& document.querySelector('#out-new').textContent.length > 0")  # fmt: skip
    shown = page.text_content("#out-new")
    status, body = request(live.url, "/v1/completions", {"model": "tiny", "prompt": prompt,
                           "max_tokens": 20, "temperature": 0.3, "top_p": 1.0, "seed": 5})  # fmt: skip
    assert status == 200 and shown == body["choices"][0]["text"]

    page.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)
    assert os.path.getsize(tmp_path / "explorer.png") > 10_000
    assert problems == []
