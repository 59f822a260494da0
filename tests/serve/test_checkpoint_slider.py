"""The explorer's checkpoint slider: /api/checkpoints lists a run's kept steps, and an analysis
with ``step`` is that checkpoint's (its patterns and head scores against glassgpt.inspect on
the same weights), not the served model's."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.runs import write_run
from tests.serve.conftest import CHARS, Server, request, start_server

from glassgpt.inspect import head_scores, run_with_cache
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

STEPS = (100, 200, 300)


def models() -> dict[int, GPT]:
    cfg = GPTConfig(n_vocab=len(CHARS) + 1, n_ctx=32, d_model=16, n_layers=2, n_heads=2)
    out = {}
    for step in STEPS:
        torch.manual_seed(step)
        model = GPT(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.4)
        out[step] = model
    return out


@pytest.fixture(scope="module")
def slider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[int, GPT]]]:
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    run = tmp_path_factory.mktemp("slider") / "run"
    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    weights = models()
    for step, model in weights.items():  # every step kept (keep_last=0)
        write_run(run, model, tok, steps=(step,), keep_last=0)
    served, tok = load(run)
    app = create_app(served, tok, name="run", slots=2, source=run)
    server, thread, url = start_server(app)
    yield Server(url, app, run), weights
    server.should_exit = True
    thread.join(timeout=10)


def patterns(d: dict[str, Any]) -> np.ndarray:
    L, H, T, _ = d["shape"]
    raw = np.frombuffer(base64.b64decode(d["patterns"]), dtype=np.uint8)
    return raw.reshape(L, H, T, T) / 255


def test_checkpoints_lists_the_kept_steps(slider: tuple[Server, dict[int, GPT]]) -> None:
    live, _ = slider
    assert request(live.url, "/api/checkpoints", method="GET") == (200, {"steps": list(STEPS)})


def test_an_analysis_at_a_step_is_that_checkpoints(slider: tuple[Server, dict[int, GPT]]) -> None:
    live, weights = slider
    prompt = "abc abd abc ab"
    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    ids = tok.encode(prompt)
    seen = {}
    for step in (100, 200, None):
        body = {"prompt": prompt} if step is None else {"prompt": prompt, "step": step}
        status, d = request(live.url, "/api/analyze", body)
        assert status == 200 and d["step"] == step
        model = weights[300 if step is None else step]  # the run serves its latest
        _, cache = run_with_cache(model, ids, "pattern")
        want = cache.stack("pattern")[:, 0].numpy()  # [L, H, T, T]
        np.testing.assert_allclose(patterns(d), want, atol=0.5 / 255 + 1e-6)
        scores = head_scores(model, batch=4)
        for name, table in scores.as_dict().items():
            np.testing.assert_allclose(d["head_scores"][name], table.numpy(), atol=1e-6)
        seen[step] = patterns(d)
    assert not np.array_equal(seen[100], seen[200])  # the slider moves the patterns
    status, d = request(live.url, "/api/logits", {"prompt": prompt, "pos": 2, "step": 200})
    with torch.no_grad():
        want_z = weights[200](torch.tensor([ids]))[0, 2]
    got = np.frombuffer(base64.b64decode(d["logits"]), dtype=np.float32)
    assert status == 200 and np.allclose(got, want_z[: len(got)].numpy(), atol=1e-4)


def test_an_unknown_step_is_a_400_naming_the_kept_ones(
    slider: tuple[Server, dict[int, GPT]],
) -> None:
    live, _ = slider
    status, d = request(live.url, "/api/analyze", {"prompt": "ab", "step": 150})
    assert status == 400
    assert d["error"]["message"] == "no checkpoint of step 150; kept: 100, 200, 300"


def test_the_page_has_the_slider(slider: tuple[Server, dict[int, GPT]]) -> None:
    live, _ = slider
    status, page = request(live.url, "/static/index.html", method="GET")
    assert status == 200 and 'id="ckpt"' in page and 'id="ckpt-row"' in page
    status, js = request(live.url, "/static/app.js", method="GET")
    assert status == 200 and '"/api/checkpoints"' in js and "...at()" in js


def test_a_checkpoint_that_is_not_a_run_has_no_steps(tmp_path: Path) -> None:
    from glassgpt.serve.checkpoints import Checkpoints

    assert Checkpoints(None).steps() == [] and Checkpoints(tmp_path).steps() == []


@pytest.mark.slow
def test_moving_the_slider_redraws_the_heads(slider: tuple[Server, dict[int, GPT]]) -> None:
    """In headless Chromium: each stop of the slider shows its step's head (each heatmap is
    drawn once and kept: per prompt, size and checkpoint), and the served model's again at the
    last stop."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("no /usr/bin/chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev dependency")
    live, _ = slider
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 1200})
        page.goto(live.url + "/")
        page.wait_for_function("() => S.steps.length === 3 && !$('ckpt-row').hidden")
        page.fill("#prompt", "abc abd abc ab")
        page.wait_for_function("() => S.data && S.prompt === 'abc abd abc ab'")
        shown = {}
        for stop, step in ((0, 100), (1, 200), (0, 100), (3, None)):
            page.eval_on_selector(
                "#ckpt", f"s => {{ s.value = {stop}; s.dispatchEvent(new Event('input')); }}"
            )
            want = "null" if step is None else str(step)
            page.wait_for_function(f"() => S.data.step === {want}")
            page.evaluate("selectHead(1, 1)")
            label = page.text_content("#ckpt-out")
            assert label == ("served" if step is None else f"step {step}")
            shown.setdefault(step, []).append(page.eval_on_selector("#big", "c => c.toDataURL()"))
        browser.close()
    assert shown[100][0] == shown[100][1]  # the same step: the same picture
    assert len({shown[100][0], shown[200][0], shown[None][0]}) == 3
