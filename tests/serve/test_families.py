"""``glassgpt serve`` on a tiny HF folder of each family, through the official ``openai``
client against the app the command builds, on a live server: greedy completions equal
transformers' greedy continuation of the folder. A config of n_ctx 131072 (Llama 3.2's) is
served with KV slots of the server's context (``--max-context``, default 4096), not n_ctx: a
longer prompt is a 400 naming that limit. ``serve --sae`` with a transcoder on NeoX's MLP
serves its activations."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai", reason="the openai client is a dev dependency")

import uvicorn  # noqa: E402
from tests.families import FAMILIES, family_folder, tokenizer  # noqa: E402
from tests.features.test_training import FAST  # noqa: E402
from tests.serve.conftest import request, start_server  # noqa: E402

from glassgpt.cli import main  # noqa: E402
from glassgpt.features.sae import SAE  # noqa: E402
from glassgpt.features.sites import read, resolve_site  # noqa: E402

PROMPT = "the cat in the hat"


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch, *argv: str) -> Iterator[tuple[Any, Any]]:
    """(the app ``glassgpt serve ARGV`` builds, an openai client of it on a live server)."""
    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    monkeypatch.setattr(sys, "setswitchinterval", lambda _: None)
    threads = torch.get_num_threads()
    try:
        assert main(["serve", *argv]) == 0
    finally:
        torch.set_num_threads(threads)
    server, thread, url = start_server(apps[0])
    try:
        yield apps[0], openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)  # fmt: skip
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_a_completion_is_transformers_greedy_continuation(family, tmp_path: Path, monkeypatch):
    folder = family_folder(tmp_path / family, family)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = tokenizer()
    ids = torch.tensor([tok.encode(PROMPT)])
    greedy = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]  # fmt: skip
    with serving(monkeypatch, "-c", str(folder), "--name", family, "--max-batch", "4") as (_, c):
        r = c.completions.create(model=family, prompt=PROMPT, max_tokens=12, temperature=0)
        assert r.choices[0].text == tok.decode_bytes(greedy.tolist()).decode("utf-8", "replace")
        assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == ids.shape[1]
        pieces = c.completions.create(model=family, prompt=PROMPT, max_tokens=12, temperature=0,
                                      stream=True)  # fmt: skip
        assert "".join(p.choices[0].text for p in pieces) == r.choices[0].text
        batch = c.completions.create(model=family, prompt=[PROMPT, "an"], max_tokens=6, seed=3,
                                     temperature=1.0)  # fmt: skip
        assert len(batch.choices) == 2 and all(ch.text for ch in batch.choices)


def test_slots_hold_the_servers_context_not_n_ctx(tmp_path: Path, monkeypatch, capsys) -> None:
    folder = family_folder(tmp_path / "long", "llama", n_ctx=131072)
    slot = lambda app: app.state.glassgpt.scheduler.cache.layers[0].k  # noqa: E731
    with serving(monkeypatch, "-c", str(folder), "--name", "long", "--max-batch", "2") as (app, c):
        assert slot(app).shape[2] <= 4096  # [slots, G, C, d_head]: not 131072 positions
        assert c.models.retrieve("long").model_extra["context_length"] == slot(app).shape[2]
    err = capsys.readouterr().err
    assert f"serving a context of {slot(app).shape[2]} positions of the model's n_ctx=131072" in err
    with serving(monkeypatch, "-c", str(folder), "--name", "long", "--max-context", "24") as (
        app,
        c,
    ):
        assert tuple(slot(app).shape) == (16, 2, 24, 8)
        prompt = "the " * 30  # 30 tokens (" the" merges), longer than 24
        assert len(tokenizer().encode(prompt)) > 24
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="long", prompt=prompt, max_tokens=2)
        assert e.value.status_code == 400 and "24" in str(e.value)
        assert e.value.code == "context_length_exceeded"
        # a sequence past the context slides its window, as generate does
        r = c.completions.create(model="long", prompt="the cat", max_tokens=40, temperature=0)
        assert r.usage.completion_tokens == 40


@pytest.mark.parametrize(("flag", "message"), [("131073", "longer than the model's n_ctx=64"),
                                               ("0", "--max-context: must be ≥ 1")])  # fmt: skip
def test_a_bad_max_context_is_one_line(tmp_path: Path, flag, message, capsys) -> None:
    folder = family_folder(tmp_path / "f", "qwen3")
    capsys.readouterr()
    assert main(["serve", "-c", str(folder), "--max-context", flag]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_serve_sae_on_a_parallel_block_transcoder(tmp_path: Path, monkeypatch, capsys) -> None:
    """``serve --sae`` with a transcoder on NeoX's MLP (it reads N₂(resid_pre): the block has
    no resid_mid): per-token activations are the transcoder's on that input."""

    folder = family_folder(tmp_path / "neox", "neox")
    (tmp_path / "t.txt").write_text(("the cat in the hat then the thin tan cat " * 80).strip())
    assert main(["sae", "train", "-c", str(folder), "--hook", "blocks.1.mlp_out", "--width", "32",
                 "--arch", "transcoder", "-k", "4", "-o", str(tmp_path / "tc"), "--tokens", "2560",
                 "--data", str(tmp_path / "t.txt"), "--no-progress", "--set", *FAST]) == 0  # fmt: skip
    assert main(["sae", "features", "-c", str(tmp_path / "tc"), "--tokens", "300", "--seq-len", "16"]) == 0  # fmt: skip
    with serving(monkeypatch, "-c", str(folder), "--sae", str(tmp_path / "tc"), "--max-batch", "2") as (app, c):  # fmt: skip
        url = str(c.base_url).removesuffix("/v1/")
        status, info = request(url, "/api/features/info", method="GET")
        assert status == 200 and info["pages"] and info["hook"] == "blocks.1.mlp.in"
        prompt = "the cat in the hat"
        status, d = request(url, "/api/features/tokens", {"prompt": prompt, "top": 4, "feature": 3})
        assert status == 200
        model, tok = app.state.glassgpt.model, app.state.glassgpt.tokenizer
        ids = tok.encode(prompt)
        u, _ = read(model, torch.tensor([ids]), resolve_site(model, "blocks.1.mlp_out", transcoder=True))  # fmt: skip
        acts = SAE.load(tmp_path / "tc" / "sae").encode(u)[0].detach()
        assert d["feature"]["acts"] == pytest.approx(acts[:, 3].tolist(), abs=1e-4)
