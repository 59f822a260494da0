"""The explorer's checkpoint slider: /api/checkpoints lists a run's kept steps, and an analysis
with ``step`` is that checkpoint's (its patterns and head scores against glassgpt.inspect on
the same weights), not the served model's."""

from __future__ import annotations

import base64
import copy
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
def test_moving_the_slider_redraws_the_heads(
    slider: tuple[Server, dict[int, GPT]], browser: Any
) -> None:
    """In headless Chromium: each stop of the slider shows its step's head (each heatmap is
    drawn once and kept: per prompt, size and checkpoint), and the served model's again at the
    last stop."""
    live, _ = slider
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    page.goto(live.url + "/")
    page.wait_for_function("() => S.steps.length === 3 && !$('ckpt-row').hidden")
    page.fill("#prompt", "abc abd abc ab")
    page.wait_for_function("() => S.data && S.prompt === 'abc abd abc ab'")
    shown = {}
    for stop, step in ((0, 100), (1, 200), (0, 100), (3, None)):
        move(page, stop, step)
        page.evaluate("selectHead(1, 1)")
        label = page.text_content("#ckpt-out")
        assert label == ("served" if step is None else f"step {step}")
        shown.setdefault(step, []).append(page.eval_on_selector("#big", "c => c.toDataURL()"))
    page.close()
    assert shown[100][0] == shown[100][1]  # the same step: the same picture
    assert len({shown[100][0], shown[200][0], shown[None][0]}) == 3


def move(page: Any, stop: int, step: int | None) -> None:
    """The slider to ``stop``, then wait for that step's analysis."""
    page.eval_on_selector("#ckpt", f"s => {{ s.value = {stop}; s.dispatchEvent(new Event('input')); }}")  # fmt: skip
    want = "null" if step is None else str(step)
    page.wait_for_function(f"() => S.data && S.data.step === {want}")


def ablated(model: GPT, ids: list[int], heads: list[list[int]]) -> torch.Tensor:
    """The last position's logits with ``heads`` zeroed, as a copy of the model with their rows
    of W_O set to 0 (b_O stays)."""
    cut = copy.deepcopy(model)
    with torch.no_grad():
        for layer, head in heads:
            cut.blocks[layer].attn.W_O[head] = 0.0
        return cut(torch.tensor([ids]))[0, -1]


def test_ablation_at_a_step_is_that_checkpoints(slider: tuple[Server, dict[int, GPT]]) -> None:
    live, weights = slider
    prompt, heads = "abc abd abc ab", [[1, 0], [0, 1]]
    ids = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"]).encode(prompt)
    got = {}
    for step in (100, 200, None):
        body = {"prompt": prompt, "heads": heads, **({} if step is None else {"step": step})}
        status, d = request(live.url, "/api/ablate", body)
        assert status == 200 and d["step"] == step, d
        got[step] = np.frombuffer(base64.b64decode(d["logits"]), dtype=np.float32)
        want = ablated(weights[300 if step is None else step], ids, heads)
        np.testing.assert_allclose(got[step], want[: len(got[step])].numpy(), atol=1e-4)
    assert np.abs(got[100] - got[None]).max() > 1e-2  # the step matters
    status, d = request(live.url, "/api/ablate", {"prompt": prompt, "heads": heads, "step": 150})
    assert status == 400 and d["error"]["param"] == "step"
    assert d["error"]["message"] == "no checkpoint of step 150; kept: 100, 200, 300"


def shown_rows(page: Any) -> list[tuple[int, float, float]]:
    """The next-token rows on show: (id, p %, was %) of each."""
    rows = page.eval_on_selector_all(
        "#dist .track",
        "ts => ts.map(t => [t.previousElementSibling.textContent, t.nextElementSibling.textContent])",
    )
    out = []
    for label, num in rows:
        text = label.replace("·", " ").replace("↵", "\n")
        p, was = num.rstrip("%)").split("% (was ")
        out.append((CHARS.index(text), float(p), float(was)))
    return out


@pytest.mark.slow
def test_ablating_at_a_past_step_compares_that_steps_model(
    slider: tuple[Server, dict[int, GPT]], browser: Any
) -> None:
    """With the slider at step 100, ⊘ shows step 100's ablated distribution beside step 100's
    own (both against a copy of that checkpoint with W_O[h] = 0), and every panel's title
    names step 100."""
    live, weights = slider
    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(live.url + "/")
    page.wait_for_function("() => S.steps.length === 3")  # (the default prompt is too long)
    prompt = "abc abd abc ab"
    page.fill("#prompt", prompt)
    page.wait_for_function(f"() => S.data && S.prompt === {prompt!r}")
    move(page, 0, 100)
    page.click('#grid .ablate[data-head="1.0"]')
    page.wait_for_function("() => $('dist-where').textContent.includes('ablated')")
    ids = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"]).encode(prompt)
    model = weights[100]
    with torch.no_grad():
        was = torch.softmax(model(torch.tensor([ids]))[0, -1], -1)
    now = torch.softmax(ablated(model, ids, [[1, 0]]), -1)
    rows = shown_rows(page)
    assert len(rows) == 12
    for i, p, before in rows:
        assert p == pytest.approx(100 * float(now[i]), abs=0.051)
        assert before == pytest.approx(100 * float(was[i]), abs=0.051)
    page.wait_for_function("() => $('dla-where').textContent.includes('unablated')")
    page.wait_for_function("() => $('circuits-step').textContent && $('dla-step').textContent")
    for tag in ("dist", "dla", "attn", "lens", "scores", "circuits"):
        assert page.inner_text(f"#{tag}-step") == "step 100", tag
    served = page.eval_on_selector_all(".step-tag.served", "ts => ts.map(t => !t.hidden)")
    assert served and all(served)
    move(page, 3, None)  # the served model: its own ablation, and titles that say so
    page.wait_for_function("() => $('dist-step').textContent === 'served model'")
    assert page.inner_text("#attn-step") == "served model"
    page.close()
    assert problems == []


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A run that kept one checkpoint."""
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    run = tmp_path_factory.mktemp("single") / "run"
    write_run(run, models()[100], CharTokenizer(CHARS, special_tokens=["<|endoftext|>"]),
              steps=(100,), keep_last=0)  # fmt: skip
    served, tok = load(run)
    server, thread, url = start_server(create_app(served, tok, name="run", slots=2, source=run))
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.slow
def test_a_run_with_one_checkpoint_has_no_slider(single: str, browser: Any) -> None:
    """Nothing to slide between: the slider and the panels' step titles stay hidden (the
    ``hidden`` attribute wins over ``.controls{display:flex}``)."""
    assert request(single, "/api/checkpoints", method="GET") == (200, {"steps": [100]})
    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(single + "/")
    page.wait_for_function("() => S.steps.length === 1")
    page.fill("#prompt", "abc abd")
    page.wait_for_function("() => $('status').textContent.includes('analysed')")
    assert page.eval_on_selector("#ckpt-row", "e => e.hidden && getComputedStyle(e).display") == "none"  # fmt: skip
    assert not page.is_visible("#ckpt-row") and not page.is_visible("#ckpt")
    assert page.eval_on_selector_all(".step-tag", "ts => ts.filter(t => t.offsetParent).length") == 0  # fmt: skip
    page.close()
    assert problems == []
