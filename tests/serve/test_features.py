"""The explorer's feature endpoints on a live server with a random TopK SAE and its pages: the
page JSON, search, per-token activations against ``sae.encode`` on the run's activations,
and steering by a feature against hooks written by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tests.serve.conftest import Server, request, start_server, tiny_run

from glassgpt.errors import GlassError
from glassgpt.features.pages import compute_pages, save_pages, windows
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.sites import read, resolve_site
from glassgpt.serve.errors import APIError
from glassgpt.train.evaluate import ArrayStream

HOOK = "blocks.1.resid_post"
TEXT = ("the cat sat on the mat. the dog ran far, and then it slept. " * 40).strip()


def make_sae(folder: Path, model: Any, tok: Any) -> Path:
    """A random TopK SAE (k = 4 of 64) on ``HOOK`` and its pages over ``TEXT``, in ``folder``."""
    sae = SAE(SAEConfig(d_in=model.config.d_model, d_sae=64, arch="topk", k=4, hook=HOOK), seed=3)
    sae.save(folder)
    stream = ArrayStream(np.array(tok.encode(TEXT), dtype=np.int64))
    pages = compute_pages(model, sae.eval(), windows(stream, seq_len=32, batch=8, tokens=10_000),
                          top=6, before=6, after=2)  # fmt: skip
    save_pages(folder / "features.safetensors", pages)
    return folder


@pytest.fixture(scope="module")
def fserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app
    from glassgpt.serve.features import load_sae

    root = tmp_path_factory.mktemp("featserve")
    run = tiny_run(root / "tiny")
    model, tok = load(run)
    sae, pages = load_sae(str(make_sae(root / "sae", model, tok)), model)
    torch.set_num_threads(1)
    app = create_app(model, tok, name="tiny", slots=4, sae=sae, pages=pages)
    server, thread, url = start_server(app)
    yield Server(url, app, run)
    server.should_exit = True
    thread.join(timeout=10)


def features_of(live: Server) -> Any:
    for r in live.app.routes:
        router = getattr(r, "original_router", r)
        if hasattr(router, "features"):
            return router.features
    raise AssertionError("no feature routes")


def test_info_page_and_search(fserve: Server) -> None:
    f = features_of(fserve)
    status, info = request(fserve.url, "/api/features/info", method="GET")
    assert status == 200 and info["d_sae"] == 64 and info["hook"] == HOOK and info["pages"]
    live = int(f.pages.count.argmax())
    status, page = request(fserve.url, f"/api/features/page/{live}", method="GET")
    assert status == 200 and page == f.pages.page(live, f.texts())
    c = page["contexts"][0]
    assert c["value"] == page["max"] and c["acts"][c["at"]] == pytest.approx(c["value"], rel=1e-4)
    assert request(fserve.url, "/api/features/page/64", method="GET")[0] == 404

    _, hits = request(fserve.url, "/api/features/search", {"query": "#12"})
    assert [h["id"] for h in hits["results"]] == [12]
    top = c["tokens"][c["at"]]  # the live latent's top token: found by it
    _, hits = request(fserve.url, "/api/features/search", {"query": top, "limit": 500})
    assert live in [h["id"] for h in hits["results"] if h["why"] == "token"]
    for h in hits["results"]:
        if h["why"] == "token":
            ctx = f.pages.page(h["id"], f.texts())["contexts"]
            assert sum(x["tokens"][x["at"]] == top for x in ctx) == h["matches"] > 0
    text = "".join(c["tokens"])[1:5]  # a piece of the live latent's top context, any case
    _, hits = request(fserve.url, "/api/features/search", {"query": text.upper(), "limit": 500})
    found = [h["id"] for h in hits["results"]]
    assert live in found and all(h["why"] == "context" for h in hits["results"])
    for i in range(64):  # exactly the latents with a context containing it
        ctx = f.pages.page(i, f.texts())["contexts"]
        assert (i in found) == any(text.lower() in "".join(x["tokens"]).lower() for x in ctx)


def test_per_token_activations_are_the_sae_on_the_run(fserve: Server) -> None:
    f = features_of(fserve)
    prompt = "the dog sat on the cat"
    status, d = request(
        fserve.url, "/api/features/tokens", {"prompt": prompt, "top": 4, "feature": 5}
    )
    assert status == 200
    ids = [t["id"] for t in d["tokens"]]
    assert ids == f.tok.encode(prompt)
    model = f.model
    x, _ = read(model, torch.tensor([ids]), resolve_site(model, HOOK))
    acts = f.sae.encode(x)[0].detach()  # [T, 64]
    for t, row in enumerate(d["top"]):
        nz = acts[t].nonzero().squeeze(-1).tolist()
        assert sorted(i for i, _ in row) == sorted(nz)  # TopK: exactly the k = 4 active
        for i, v in row:
            assert v == pytest.approx(float(acts[t, i]), abs=1e-4)
    assert d["feature"]["acts"] == pytest.approx(acts[:, 5].tolist(), abs=1e-4)
    assert request(fserve.url, "/api/features/tokens", {"prompt": "x" * 65})[0] == 400


@pytest.mark.parametrize("mode,value", [("add", 6.0), ("clamp", 9.0)])
def test_steering_by_a_feature_is_the_hook_by_hand(fserve: Server, mode: str, value: float) -> None:  # fmt: skip
    from glassgpt.sample import generate

    f = features_of(fserve)
    model, sae, i = f.model, f.sae, 7
    prompt = "the cat sat on"
    body = {"prompt": prompt, "feature": i, "mode": mode, "value": value, "max_tokens": 12,
            "temperature": 0.8, "seed": 4}  # fmt: skip
    status, d = request(fserve.url, "/api/features/steer", body)
    assert status == 200
    w = sae.W_dec[i].detach()

    def by_hand(a: torch.Tensor, _name: str) -> torch.Tensor:
        if mode == "add":
            return a + value * w
        return a + (value - sae.encode(a)[..., i : i + 1]) * w

    ids = f.tok.encode(prompt)
    with torch.no_grad(), model.hooks({HOOK: by_hand}):
        p = torch.softmax(model(torch.tensor([ids]))[0, -1], -1)
        new = generate(model, ids, max_new_tokens=12, temperature=0.8, seed=4)
    with torch.no_grad():
        p0 = torch.softmax(model(torch.tensor([ids]))[0, -1], -1)
        new0 = generate(model, ids, max_new_tokens=12, temperature=0.8, seed=4)
    for r in d["rows"]:
        assert r["p"] == pytest.approx(float(p[r["id"]]), abs=1e-5)
        assert r["clean"] == pytest.approx(float(p0[r["id"]]), abs=1e-5)
    assert [r["id"] for r in d["rows"]][:3] == p.topk(3).indices.tolist()
    assert d["sample"] == f.tok.decode(new) and d["clean_sample"] == f.tok.decode(new0)
    assert d["kl"] > 0


def test_clamping_at_the_current_value_changes_nothing(fserve: Server) -> None:
    """x' = x + (c − f_i(x)) W_dec[i] with c = f_i(x) is x: a latent never active, clamped to
    0, leaves the distribution as it was (the error term kept)."""
    f = features_of(fserve)
    dead = int(f.pages.count.argmin())
    assert int(f.pages.count[dead]) == 0  # 64 latents, k = 4: some never fire on TEXT
    body = {"prompt": "the cat", "feature": dead, "mode": "clamp", "value": 0, "max_tokens": 4}
    _, d = request(fserve.url, "/api/features/steer", body)
    assert all(r["p"] == pytest.approx(r["clean"], abs=1e-6) for r in d["rows"])
    assert d["sample"] == d["clean_sample"]


def test_a_server_without_an_sae_says_so(live: Server) -> None:
    assert request(live.url, "/api/features/info", method="GET") == (200, {"sae": False})
    assert request(live.url, "/api/features/steer", {"prompt": "a", "feature": 0})[0] == 404


def test_bad_input(fserve: Server, tmp_path: Path) -> None:
    from glassgpt.serve.features import Features, load_sae

    for bad in ({"prompt": "ab", "feature": 64}, {"prompt": "ab", "feature": 1, "mode": "zero"},
                {"prompt": "ab", "feature": -1}):  # fmt: skip
        status, body = request(fserve.url, "/api/features/steer", bad)
        assert status in (400, 422), body
    status, body = request(fserve.url, "/api/features/steer", {"prompt": "ab", "feature": 64})
    assert "feature 64: out of range (this SAE has 64 latents)" in body["error"]["message"]
    f = features_of(fserve)
    bare = Features(fserve.app.state.glassgpt, f.sae, None)
    with pytest.raises(APIError, match="glassgpt sae features"):
        bare.page(0)
    other = SAE(SAEConfig(d_in=16, d_sae=8, arch="relu", hook=HOOK))
    other.save(tmp_path / "other")
    with pytest.raises(GlassError, match=r"d_in=16.*\[32\]"):
        load_sae(str(tmp_path / "other"), f.model)
    f.sae.save(tmp_path / "nopages")
    assert load_sae(str(tmp_path / "nopages"), f.model)[1] is None


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)")
def test_feature_page_and_steering_in_the_browser(
    fserve: Server, browser: Any, tmp_path: Path
) -> None:
    """(On the session's browser: a second Playwright in the same worker cannot start.)"""
    f = features_of(fserve)
    live = int(f.pages.count.argmax())
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(fserve.url + "/")
    page.wait_for_selector("#tab-features:not([hidden])")
    page.click("#tab-features")

    # search by id opens the page: its contexts, histogram and logit effect as the JSON says
    page.fill("#feat-query", f"#{live}")
    page.wait_for_selector(f'#feat-results .result[data-id="{live}"]')
    page.click(f'#feat-results .result[data-id="{live}"]')
    page.wait_for_function(f"() => document.querySelector('#feat-title').textContent === '#{live}'")
    want = f.pages.page(live, f.texts())
    page.wait_for_function("n => document.querySelectorAll('#feat-contexts .ctx').length === n",
                           arg=len(want["contexts"]))  # fmt: skip
    first = page.locator("#feat-contexts .ctx").first
    assert first.inner_text().replace("·", " ").replace("↵", "\n") == "".join(want["contexts"][0]["tokens"])  # fmt: skip
    assert page.locator("#feat-contexts .ctx").first.locator(".ct.at").count() == 1
    assert page.locator("#feat-hist .hbar").count() == len(want["histogram"])
    assert page.locator("#feat-logits tr").count() == 2 * len(want["logit_top"])

    # the prompt's chips carry this feature's activation at each token
    page.fill("#feat-prompt", "the dog sat")
    page.wait_for_function("() => document.querySelectorAll('#feat-chips .chip').length === 11")
    titles = page.eval_on_selector_all("#feat-chips .chip", "cs => cs.map(c => c.title)")
    _, d = request(fserve.url, "/api/features/tokens", {"prompt": "the dog sat", "feature": live})
    assert [float(t.rsplit("= ", 1)[1]) for t in titles] == pytest.approx(
        d["feature"]["acts"], abs=1e-4
    )
    page.locator("#feat-chips .chip").nth(4).click()
    page.wait_for_selector("#feat-token-top .label")
    assert "#4" in page.inner_text("#feat-token-where")

    # steering: moving the slider redraws the distribution and the sample from the server
    before = page.inner_text("#feat-dist")
    page.eval_on_selector("#feat-value", "e => { e.value = e.max; e.dispatchEvent(new Event('input')); }")  # fmt: skip
    page.wait_for_function("b => document.querySelector('#feat-dist').innerText !== b", arg=before)
    value = float(page.eval_on_selector("#feat-value", "e => e.value"))
    body = {"prompt": "the dog sat", "feature": live, "mode": "add", "value": value,
            "max_tokens": 48, "temperature": 0.8, "seed": 0}  # fmt: skip
    page.wait_for_function("() => document.querySelector('#feat-sample').textContent.length > 0")
    _, s = request(fserve.url, "/api/features/steer", body)
    page.wait_for_function(
        "t => document.querySelector('#feat-sample').textContent === t", arg=s["sample"]
    )
    assert page.locator("#feat-dist .label").first.inner_text() == s["rows"][0]["text"].replace(" ", "·")  # fmt: skip
    page.screenshot(path=str(tmp_path / "features.png"))
    page.close()
    assert problems == []


def open_features(fserve: Server, browser: Any, problems: list[str]) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("console", lambda m: m.type == "error" and "status of 400" not in m.text
            and problems.append(m.text))  # fmt: skip
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(fserve.url + "/")
    page.wait_for_selector("#tab-features:not([hidden])")
    page.click("#tab-features")
    return page


@pytest.mark.slow
def test_a_bad_features_prompt_marks_the_old_results_stale(fserve: Server, browser: Any) -> None:
    """An empty, too-long or unreadable prompt says why, and the previous prompt's chips, bars,
    KL and samples stay on show dimmed and marked stale (as on the Explore tab), until a good
    prompt clears them."""
    problems: list[str] = []
    page = open_features(fserve, browser, problems)
    page.fill("#feat-prompt", "the dog sat")
    page.wait_for_function("() => $('feat-chips').children.length === 11 && $('feat-kl').textContent")  # fmt: skip
    kl, sample = page.inner_text("#feat-kl"), page.inner_text("#feat-sample")
    assert kl.startswith("KL") and not page.eval_on_selector("body", "b => b.className")
    for bad, says in (
        ("", "Type a prompt"),
        ("x" * 65, "longer than"),
        ("the caf\u00e9", "U+00E9"),
    ):
        page.fill("#feat-prompt", bad)
        page.wait_for_function("s => $('feat-prompt-status').textContent.includes(s)", arg=says)
        status = page.inner_text("#feat-prompt-status")
        assert "previous prompt, “the dog sat”" in status, status
        assert page.eval_on_selector("#feat-prompt-status", "e => e.classList.contains('error')")
        assert page.eval_on_selector("body", "b => b.classList.contains('stale-features')")
        for sel in ("#feat-chips", "#feat-token-top", "#feat-dist", "#feat-kl", "#feat-sample"):
            opacity = page.eval_on_selector(
                sel, "e => { let o = 1; for (; e; e = e.parentElement) o *= +getComputedStyle(e).opacity; return o; }"
            )  # fmt: skip
            assert opacity < 0.5, sel
        label = page.eval_on_selector("#feat-steer-card", "c => getComputedStyle(c, '::before').content")  # fmt: skip
        assert "stale" in label
        # the old results are kept, not cleared
        assert page.locator("#feat-chips .chip").count() == 11
        assert page.inner_text("#feat-kl") == kl and page.inner_text("#feat-sample") == sample
    page.fill("#feat-prompt", "the cat")
    page.wait_for_function("() => !document.body.classList.contains('stale-features')")
    page.wait_for_function("() => $('feat-chips').children.length === 7")
    assert page.inner_text("#feat-prompt-status") == ""
    assert page.eval_on_selector("#feat-dist", "e => +getComputedStyle(e).opacity") == 1
    page.close()
    assert problems == []


def _rgb(css: str) -> tuple[list[float], float]:
    """([r, g, b], alpha) of a computed CSS colour ``rgb(…)`` or ``rgba(…)``."""
    parts = [float(x) for x in css[css.index("(") + 1 : -1].split(",")]
    return parts[:3], parts[3] if len(parts) == 4 else 1.0


def contrast(fg: str, bg: str) -> float:
    """WCAG 2's contrast ratio of text ``fg`` on ``bg``, each composited over the white card."""

    def lum(css: str) -> float:
        rgb, a = _rgb(css)
        lin = []
        for c in rgb:
            v = (255 + (c - 255) * a) / 255
            lin.append(v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4)
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_oracle() -> None:  # WCAG's own examples
    assert contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)") == pytest.approx(21.0)
    assert contrast("rgb(118, 118, 118)", "rgb(255, 255, 255)") == pytest.approx(4.54, abs=0.01)
    assert contrast("rgb(31, 36, 48)", "rgb(234, 88, 12)") < 4.5  # the old ink on full orange


@pytest.mark.slow
def test_shaded_tokens_are_readable(fserve: Server, browser: Any) -> None:
    """Every shaded token of the feature page's contexts (the outlined top token, on the
    darkest orange, included) and of the prompt's chips has text at WCAG AA contrast
    (4.5:1), computed from Chromium's own colours."""
    f = features_of(fserve)
    live = int(f.pages.count.argmax())
    problems: list[str] = []
    page = open_features(fserve, browser, problems)
    page.fill("#feat-id", str(live))
    page.dispatch_event("#feat-id", "change")
    page.wait_for_function(f"() => $('feat-title').textContent === '#{live}' && document.querySelector('#feat-contexts .ct.at')")  # fmt: skip
    page.fill("#feat-prompt", TEXT[:60])
    page.wait_for_function("() => $('feat-chips').children.length === 60")
    colours = page.eval_on_selector_all(
        "#feat-contexts .ct, #feat-chips .chip",
        "es => es.filter(e => e.style.background).map(e => [getComputedStyle(e).color,"
        " getComputedStyle(e).backgroundColor, e.classList.contains('at')])",
    )
    tops = [c for c in colours if c[2]]
    assert tops and any(_rgb(bg)[1] == 1.0 for _, bg, _ in tops)  # the darkest shade is there
    for fg, bg, _ in colours:
        assert contrast(fg, bg) >= 4.5, (fg, bg)
    page.close()
    assert problems == []
