"""The explorer page in real headless Chromium, driven by Playwright, against a live server.

Skipped when Playwright for Python or Debian's ``/usr/bin/chromium`` is absent (browser
downloads are not possible in CI; ``apt-get install chromium`` provides it).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.serve.conftest import CHROMIUM, Server, open_page, request

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)"
    ),
    pytest.mark.slow,
]


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


def test_attention_labels_readout_bars_and_stale_panels(live: Server, browser: Any) -> None:
    problems: list[str] = []
    page = open_page(live.url, browser, problems)
    prompt = ("abcdefgh" * 8)[:64]  # n_ctx = 64: every row and column of the big head
    page.fill("#prompt", prompt)
    page.wait_for_function("() => document.querySelectorAll('#big-rows .lab').length === 64")
    assert page.locator("#big-cols .lab").count() == 64

    # hovering the head's own labels and cells highlights the token there, with a readout
    page.locator("#big-rows .lab").nth(20).hover()
    page.wait_for_function("() => document.querySelector('#chips .chip.hovered') !== null")
    assert page.get_attribute("#chips .chip.hovered", "data-i") == "20"
    box = page.locator("#big").bounding_box()
    cell = box["width"] / 64
    page.mouse.move(box["x"] + 9.5 * cell, box["y"] + 30.5 * cell)  # query 30, key 9
    page.wait_for_function(
        "() => document.querySelector('#big-readout').textContent.includes('#30')"
    )
    text = page.inner_text("#big-readout")
    _, d = request(live.url, "/api/analyze", {"prompt": prompt})
    L, H, T, _ = d["shape"]
    p = np.frombuffer(base64.b64decode(d["patterns"]), dtype=np.uint8).reshape(L, H, T, T)
    assert "→ key #9" in text and abs(float(text.rsplit(": ", 1)[1]) - p[0, 0, 30, 9] / 255) < 1e-3

    # the next-token bars: width / track = p, on a scale of 0 to 1
    ratios = page.eval_on_selector_all(
        "#dist .track",
        "ts => ts.map(t => [t.querySelector('.fill').getBoundingClientRect()"
        ".width / t.getBoundingClientRect().width, t.nextElementSibling.textContent])",
    )
    for ratio, shown in ratios:
        assert abs(ratio - float(shown.split("%")[0]) / 100) < 0.005

    # ablating a head redraws the distribution beside the unablated one
    page.click('#grid .ablate[data-head="1.2"]')
    page.wait_for_function(
        "() => document.querySelector('#dist-where').textContent.includes('ablated')"
    )
    assert "was" in page.inner_text("#dist")
    # direct logit attribution is of the model without the ablation, and says so
    page.wait_for_function("() => $('dla-where').textContent.includes('unablated')")
    page.click('#grid .ablate[data-head="1.2"]')  # restored: no ablation to speak of
    page.wait_for_function("() => !$('dla-where').textContent.includes('unablated')")
    assert "was" not in page.inner_text("#dist")
    page.click('#grid .ablate[data-head="1.2"]')

    # a prompt that cannot be analysed leaves the panels marked stale, until a good one
    for bad in ("x" * 65, ""):
        page.fill("#prompt", bad)
        page.wait_for_function("() => document.body.classList.contains('stale-explore')")
        assert page.eval_on_selector("#dist", "e => +getComputedStyle(e).opacity") < 1
        assert "previous" in page.inner_text("#status") or bad == ""
        page.fill("#prompt", "abc")
        page.wait_for_function("() => !document.body.classList.contains('stale-explore')")
    assert problems == []


def test_patching_view(live: Server, browser: Any) -> None:
    problems: list[str] = []
    page = open_page(live.url, browser, problems)
    page.click("#tab-patch")
    clean, corrupted = "ab ab ab ab", "ab ab cd ab"
    page.fill("#clean", clean)
    page.fill("#corrupted", corrupted)
    page.click("#patch-run")
    cfg = live.app.state.glassgpt.model.config
    n = cfg.n_layers * len(clean)
    page.wait_for_function(
        "n => document.querySelectorAll('#patch-resid td.pcell').length === n "
        "&& document.querySelector('#patch-status').textContent.includes('tokens each')", arg=n
    )  # fmt: skip
    assert page.locator("#patch-heads td.pcell").count() == cfg.n_layers * cfg.n_heads
    _, d = request(live.url, "/api/patch", {"clean": clean, "corrupted": corrupted})
    shown = page.eval_on_selector_all("#patch-heads td.pcell", "cs => cs.map(c => +c.textContent)")
    assert np.allclose(shown, np.round(np.array(d["heads"]).ravel(), 2), atol=0.006)

    page.click('#patch-heads td.pcell[data-layer="1"][data-index="2"]')
    page.wait_for_function(
        "() => document.querySelector('#effect-where').textContent.includes('L1H2')"
    )
    assert page.locator("#patch-effect .label").count() >= 2

    page.fill("#corrupted", corrupted + "d")
    page.click("#patch-run")
    page.wait_for_function("() => document.body.classList.contains('stale-patch')")
    msg = page.inner_text("#patch-status")
    assert "11 tokens" in msg and "12" in msg
    assert problems == []
